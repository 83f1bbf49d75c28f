"""A package build's child process (beast/train_step/package.py): `BuildChild`, the run's
handle on it, `SpareChild`, one started ahead of its build, and `build_in_child`, what
it runs. The child is started as
`python -m beast.util.parent_death PID SIGTERM beast.train_step.build_child:build_in_child
SCRATCH` (the kernel stops it if the thread that started it ends); it imports the
compiler at once, then waits for the program to build.
"""

from __future__ import annotations

import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from contextlib import suppress
from typing import Any

import torch

from beast.train_step import compiler, graph_file
from beast.util.records import compile_cache_dir

__all__ = ["BuildChild", "BuildStopped", "SpareChild", "build_in_child"]

# How often a build's wait looks whether the run is stopping.
_POLL_SECONDS = 0.1
# inductor leaves a build's own files in its cache: the generated C++, and the library the
# package holds a copy of (108 MB beside 101 MB of 42 packages on one machine). A build
# removes those of builds that ended long ago (`_remove_build_leftovers`): nothing in them
# written for this long, far longer than a build takes, so no build under way reads them.
_LEFTOVER_SECONDS = 3600.0
# What inductor calls such a directory: "c" and 51 more characters of a base-32 hash.
_BUILD_DIRECTORY = re.compile(r"c[a-z0-9]{51}")
# A build's scratch directory: this, the run's pid, a dash (`BuildChild`).
_SCRATCH_PREFIX = "beast-step-"
# How long a build's child waits for its program before it exits (`build_in_child`).
_PROGRAM_WAIT_SECONDS = 900.0
# A build's child ends its stderr with this and its phases' seconds (`BuildChild.phases`).
_PHASES_LINE = "beast build phases: "


class BuildChild:
    """A build's child process (`build_in_child`), started before it has a program to
    build: its imports (torch and inductor, 2.3-2.7 CPU s on the 2-core VM) run while the
    learner traces the step, on the other core. `finish` hands it the program and waits
    for the package; `stop` ends it, used or not.

    The child leads a process group of its own, which the C++ compilers it runs join:
    stopped, it stops them with it (`build_in_child`). A compiler it only killed would
    leave its own children (cc1plus, the assembler) compiling on for seconds after the
    run's exit, orphans of the run. The kernel stops the child when the thread that
    started it ends (`beast.util.parent_death`): start it in a thread that outlives the
    build (the learner's)."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        # Each phase's wall and CPU seconds, once it built (`_Phases`): what
        # benchmarks/cold_build.py reports.
        self.phases: dict[str, dict[str, float]] = {}
        # Removed by whichever of the two ends last (a stopped run exits at once); one
        # whose run and child were both killed outright, by the next build's start.
        _remove_orphaned_scratch()
        self.scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
        self._stderr = open(os.path.join(self.scratch, "stderr"), "w+")  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "beast.util.parent_death",
                    str(os.getpid()),
                    "SIGTERM",
                    f"{__name__}:build_in_child",
                    self.scratch,
                ],
                env=dict(os.environ, PYTHONPATH=path),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                start_new_session=True,
                text=True,
            )
        except BaseException:
            self._stderr.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise

    def waiting(self) -> bool:
        """Whether the child still runs, waiting for its program (or importing)."""
        return self._process.poll() is None

    def finish(self, program: str, destination: str, stopping: threading.Event | None) -> None:
        """Build `program` (a file in `scratch`) into the package at `destination`; as
        `Trace.build`."""
        child = self._process
        try:
            assert child.stdin is not None
            child.stdin.write(f"{program}\t{destination}\n")
            child.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it ended already: its exit code and last line say why
        while not _exited(child):
            if stopping is not None and stopping.is_set():
                raise BuildStopped("the run stopped before the step's package")
        self._stderr.seek(0)
        lines = self._stderr.read().strip().splitlines()
        if child.returncode != 0:
            last = lines[-1] if lines else f"exit code {child.returncode}"
            raise RuntimeError(f"building the step's package failed: {last}")
        if lines and lines[-1].startswith(_PHASES_LINE):
            with suppress(ValueError):
                self.phases = json.loads(lines[-1].removeprefix(_PHASES_LINE))

    def stop(self) -> None:
        """End the child if it still runs (a build not needed, or stopped), and remove its
        scratch directory."""
        child = self._process
        if child.poll() is None:
            child.terminate()
            child.wait()
        if child.stdin is not None and not child.stdin.closed:
            with suppress(OSError):
                child.stdin.close()
        self._stderr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class SpareChild:
    """A build's child started before a build needs it, so that its imports run beside
    other work: with the run, where a first build is as good as certain, or before a
    trace (beast/train_step/step.py). The next build takes it (`take`); a decision that
    builds nothing stops it (`stop`)."""

    def __init__(self) -> None:
        self.child: BuildChild | None = None  # kept for the next build

    def start(self, owner: object) -> None:
        """Start one now and keep it for the next build, stopped when `owner` is collected
        if no build took it; none where no process can be spared."""
        try:
            child = BuildChild()
        except OSError:
            return
        weakref.finalize(owner, child.stop)
        self.child = child

    def take(self, start: bool) -> BuildChild | None:
        """The child for a build: the one kept, if it still waits for its program; else,
        where `start`, one started now; else None."""
        spare, self.child = self.child, None
        if spare is not None and spare.waiting():
            return spare
        if spare is not None:
            spare.stop()
        if not start:
            return None
        try:
            return BuildChild()
        except OSError:  # no process to spare: the build starts its own
            return None

    def stop(self) -> None:
        """Stop the one kept, if any."""
        if self.child is not None:
            self.child.stop()
            self.child = None


class BuildStopped(Exception):
    """The run stopped while a package was being built; the build was stopped too."""


def _exited(child: subprocess.Popen) -> bool:
    """Whether `child` ended, after waiting up to `_POLL_SECONDS` for it."""
    try:
        child.wait(timeout=_POLL_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return True


def build_in_child(scratch: str) -> None:
    """The child process of a build (`BuildChild`, whose directory `scratch` holds the
    program): imports the compiler, then reads one
    line, the program to build and the package to write, tab-separated (none: the build
    was not needed, and it exits). The program (a graph file, graph_file.py, or an
    exported program) is compiled into the package, written under another name and
    renamed (runs building the same step at once never read half a file; a stopped build
    leaves none), and its scratch directory removed. SIGTERM (the run stopped the build,
    or ended) stops the compilers it runs too, all of its process group; the child then
    removes what it wrote and exits at once."""
    if os.getpgrp() == os.getpid():  # the group is the build's own (not a caller's)
        signal.signal(signal.SIGTERM, _stop_build)
    _written.append(scratch)
    temporary = None
    program = None
    phases = _Phases()  # the imports: from the interpreter's start
    try:
        # The compiler imported before the program comes: while the learner traces.
        compiler.import_compiler()
        compiler.configure_compiler()
        compiler.configure_build()
        phases.mark("imports")
        compiler.probe_instruction_sets()
        phases.mark("probes")
        # A child started with the run may never get its program (a run that stops,
        # or stays eager, in a process that goes on: the Python API): not forever.
        if not select.select([sys.stdin], [], [], _PROGRAM_WAIT_SECONDS)[0]:
            return
        line = sys.stdin.readline().rstrip("\n")
        phases.mark("waiting")
        if not line:
            return
        program, destination = line.split("\t")
        handle, temporary = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(destination))
        os.close(handle)
        _written.append(temporary)
        with warnings.catch_warnings():  # torch's own deprecations, said while pickling
            warnings.simplefilter("ignore", FutureWarning)
            _compile_and_package(program, temporary)
        phases.mark("compiling")
        os.replace(temporary, destination)
        print(f"{_PHASES_LINE}{json.dumps(phases.seconds)}", file=sys.stderr, flush=True)
        if os.path.abspath(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == os.path.abspath(
            compile_cache_dir()
        ):  # beast's own cache (not one a user shares with other programs)
            _remove_build_leftovers(compile_cache_dir(), time.time())
    finally:
        if temporary is not None and os.path.exists(temporary):
            os.remove(temporary)
        if program is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _remove_orphaned_scratch() -> None:
    """Remove the scratch directories of builds whose run is gone: a run and its build's
    child both killed outright (SIGKILL, the machine's OOM killer) leave theirs."""
    pattern = re.compile(re.escape(_SCRATCH_PREFIX) + r"(\d+)-")
    root = tempfile.gettempdir()
    with suppress(OSError):
        for entry in os.scandir(root):
            found = pattern.match(entry.name)
            if found is None or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.kill(int(found.group(1)), 0)
            except ProcessLookupError:
                shutil.rmtree(entry.path, ignore_errors=True)
            except PermissionError:  # another user's live process
                pass


class _Phases:
    """A build child's phases, each its wall seconds and the CPU seconds of the child
    itself (Python: imports, inductor's lowering and code generation) and of the
    processes it waited for (the C++ compilers, the probes), from the interpreter's
    start."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        self._last = (_process_start(), 0.0, 0.0)

    def mark(self, name: str) -> None:
        now = time.time()
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = own.ru_utime + own.ru_stime
        compilers = waited.ru_utime + waited.ru_stime
        then, then_cpu, then_compilers = self._last
        self.seconds[name] = {
            "wall": round(now - then, 3),
            "cpu": round(cpu - then_cpu, 3),
            "compilers_cpu": round(compilers - then_compilers, 3),
        }
        self._last = (now, cpu, compilers)


def _process_start() -> float:
    """When this process started (the epoch's seconds), from /proc; now elsewhere."""
    try:
        with open("/proc/self/stat") as file:
            ticks = int(file.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as file:
            uptime = float(file.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def _compile_and_package(program: str, package: str) -> None:
    """inductor's ahead-of-time compilation of `program` into `package`: a graph file
    compiled as the GraphModule it holds (`torch._inductor.aot_compile`, what
    `aoti_compile_and_package` does with an ExportedProgram's module), else the exported
    program."""
    if not program.endswith(".graph"):
        torch._inductor.aoti_compile_and_package(torch.export.load(program), package_path=package)
        return
    from torch._inductor.package import package_aoti

    with open(program, "rb") as file:
        module, arguments = graph_file.loads(file.read())
    files = torch._inductor.aot_compile(module, arguments, options={"aot_inductor.package": True})
    package_aoti(package, files)


def _remove_build_leftovers(cache: str, now: float) -> int:
    """Remove from inductor's cache `cache` the directories earlier builds left
    (`_BUILD_DIRECTORY`s holding a wrapper's C++) where nothing was written within
    `_LEFTOVER_SECONDS` of `now`; returns how many. A package holds what a run needs of
    them, and a build of a step whose package exists does not happen."""
    removed = 0
    for entry in os.scandir(cache):
        if not (entry.is_dir(follow_symlinks=False) and _BUILD_DIRECTORY.fullmatch(entry.name)):
            continue
        paths = [
            os.path.join(root, name)
            for root, directories, files in os.walk(entry.path)
            for name in [*directories, *files]
        ]
        if not any(path.endswith(".wrapper.cpp") for path in paths):
            continue
        try:
            newest = max(os.stat(path).st_mtime for path in [entry.path, *paths])
        except OSError:  # a build under way renamed or removed one: it is in use
            continue
        if now - newest >= _LEFTOVER_SECONDS:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


# What a build's child would leave behind (its scratch directory, the package's temporary
# file): what `_stop_build` removes.
_written: list[str] = []


def _stop_build(*_: Any) -> None:
    """SIGTERM in a build's child: every other process of its group (the compilers and
    their own children) gets it too, the child removes what it wrote and exits there and
    then, not by unwinding through the compiler's frames and the interpreter's exit (a
    second or more on a busy machine, in a process that imported inductor)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    for path in _written:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
    os._exit(1)
