"""Compiled steps as ahead-of-time packages (beast/train_step/__init__.py), the CPU path.

torch.compile re-traces a step's Python with dynamo in every run, cached graphs or not:
loading a PPO CartPole step from inductor's caches took 5 s of a 16 s race, and a DQN
step's as long. Here the step is traced once per run at the operator level instead
(`make_fx` over fake tensors: 0.3 s, no kernel runs), the trace's code names the
package, and a package already built is a shared library loaded in milliseconds
(AOTInductor). A new one is exported and compiled by inductor into the same fused C++
kernels torch.compile makes, in a child process while the learner goes on eagerly, then
kept in `compile_cache_dir()/steps` for every later run whose step traces the same.

The package's name is a hash of everything its code depends on: the traced graph's
code, the values of the constants the trace kept, every input's shape, dtype and
strides, torch's version and the CPU's instruction set. So a changed loss, model,
hyperparameter (they are constants of the graph) or batch shape is a new package, never
a stale one. What the trace treats as constant is documented in `StepGraph`: every
parameter and buffer of the modules is an input, read at each step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_loads

from beast.graph_capture import capturing_graph
from beast.records import compile_cache_dir
from beast.threads import signal_when_parent_dies
from beast.train_step import compiler
from beast.train_step.compiler import inductor_patch
from beast.train_step.graph import copied

__all__ = ["BuildStopped", "PackagedStep", "Trace", "loads_only", "trace"]

# Bumped when what a package holds or how it is called changes.
_FORMAT = 1
# How often a build's wait looks whether the run is stopping.
_POLL_SECONDS = 0.1


class Trace:
    """A step traced at the operator level, and where its package is (or will be)."""

    def __init__(self, graph: torch.fx.GraphModule, arguments: tuple[Any, ...]) -> None:
        self.graph = graph
        self.arguments = arguments
        self.path = os.path.join(compile_cache_dir(), "steps", f"{_key(graph, arguments)}.pt2")

    @property
    def built(self) -> bool:
        """Whether an earlier run (or this one) built this step's package."""
        return os.path.exists(self.path)

    def export(self) -> Any:
        """The trace as an ExportedProgram, what a package is built from (an
        operator-level re-trace: under a second; it patches torch.nn.Module for the
        whole process while it runs)."""
        return torch.export.export(self.graph, self.arguments, strict=False)

    def build(self, exported: Any, stopping: threading.Event | None = None) -> None:
        """Compile `exported` into this trace's package (inductor's kernels and their C++
        wrapper in one shared library: tens of seconds) in a process of its own, so that
        nothing in this one waits for it but what needs the package (the learner's steps
        go on eagerly meanwhile). RuntimeError, with the child's last line, if it failed;
        `BuildStopped` if `stopping` was set first (the child is stopped too, as it is
        when the thread that started it ends: the kernel signals it)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        # Removed by whichever of the two ends last (a stopped run exits at once).
        scratch = tempfile.mkdtemp(prefix="beast-step-")
        try:
            program = os.path.join(scratch, "program.pt2")
            torch.export.save(exported, program)
            with open(os.path.join(scratch, "stderr"), "w+") as stderr:
                child = subprocess.Popen(
                    [sys.executable, "-m", __name__, program, self.path, str(os.getpid())],
                    env=dict(os.environ, PYTHONPATH=path),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
                try:
                    while not _exited(child):
                        if stopping is not None and stopping.is_set():
                            raise BuildStopped("the run stopped before the step's package")
                finally:
                    if child.poll() is None:
                        child.terminate()
                        child.wait()
                stderr.seek(0)
                lines = stderr.read().strip().splitlines()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if child.returncode != 0:
            last = lines[-1] if lines else f"exit code {child.returncode}"
            raise RuntimeError(f"building the step's package failed: {last}")

    def load(self) -> Runner:
        """The built package, called with the step's arguments and their tensors
        (`Runner`). Loading compares the machine with the one that built the package (a
        warning, never a refusal; the package's name already holds the instruction set),
        and inductor's way of knowing which vector instructions it may use is to compile
        and load a probe for each, in child processes (1.2 s on this project's machine):
        told they are usable, it skips that. One caller at a time (a step holds the
        lock), so no locking around each call."""
        with inductor_patch(**{"cpp.vec_isa_ok": True}):
            model = torch._inductor.aoti_load_package(self.path, run_single_threaded=True)
        loader = model.loader
        out_spec = treespec_loads(loader.get_call_spec()[1])
        return lambda arguments, tensors: tree_unflatten(loader.boxed_run(tensors), out_spec)


def loads_only(traced: Trace | None) -> bool:
    """Whether compiling `traced` is only loading its package: an earlier run built it,
    and the backend is inductor's (the tests' eager backend runs the trace itself)."""
    return traced is not None and compiler.BACKEND != "aot_eager" and traced.built


def _tanh(x: Tensor) -> Tensor:
    """tanh as the trace computes it: 2 sigmoid(2x) - 1, and near 0 (where that form
    loses the relative precision of a result smaller than its rounding at 1) the Taylor
    series to x^7 (the next term, 62/2835 x^9, is under 1e-9 x there). Inductor's tanh
    kernel is the accurate vector tanh, 26 us on 256x64 on this project's machine against
    11.5 us for this fused form (PPO CartPole's step calls it 4 times); this form is
    within 2e-7 of tanh, 8e-7 relative (`tests/test_train_step.py`)."""
    x2 = x * x
    series = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    return torch.where(x.abs() < 0.125, series, 2.0 * torch.sigmoid(2.0 * x) - 1.0)


# Operators the trace writes in other operators (make_fx's decompositions).
_DECOMPOSITIONS = {torch.ops.aten.tanh.default: _tanh}


def trace(function: Callable[..., Any], arguments: tuple[Any, ...]) -> Trace:
    """`function(*arguments)` traced over fake tensors of the same shapes (no kernel
    runs, nothing is written), with `capturing()` set for the models it calls. While it
    runs, the modules the function calls through torch.func.functional_call hold fake
    tensors in place of their own: call it where no other thread reads them (the
    learner's thread, in its step, holding the lock a checkpoint takes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with capturing_graph():
        # Tensors the loss holds outside its modules (an action space's bounds) are
        # constants of the graph, as torch.compile makes them.
        graph = make_fx(
            function,
            decomposition_table=_DECOMPOSITIONS,
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*arguments)
    return Trace(graph, arguments)


# A loaded step: called with the step's arguments and the tensors among their leaves,
# flattened once by the caller. The package's own `__call__` parses its call specs from
# JSON and flattens the arguments again at every call, after the caller flattened them to
# find the package for their shapes: 38-40 us a call, of PPO CartPole's 0.5 ms kernels.
Runner = Callable[[tuple[Any, ...], list[Tensor]], Any]


class PackagedStep:
    """A step compiled ahead of time, called with the step's arguments. Each package
    holds one shape of batch: a batch of another shape gets its own (traced, and loaded
    or built, in the calling thread, as torch.compile recompiles), never one read past
    its end.

    Args:
        function: the step's function.
        traced: its trace for the first shape of batch (`trace`).
        holding: held while the trace is exported (which patches torch.nn.Module for
            the whole process).
        stopping: set when the run stops: a build under way then stops (`BuildStopped`).
    """

    def __init__(
        self,
        function: Callable[..., Any],
        traced: Trace,
        holding: Callable[[], AbstractContextManager[Any]],
        stopping: threading.Event | None = None,
    ) -> None:
        self.function = function
        self.holding = holding
        self.stopping = stopping
        # Spent exporting and building packages: what a later run, loading them, skips.
        self.build_seconds = 0.0
        self._runners = {_tensors_and_shapes(traced.arguments)[1]: self._runner(traced)}

    def __call__(self, *arguments: Any) -> Any:
        tensors, shapes = _tensors_and_shapes(arguments)
        runner = self._runners.get(shapes)
        if runner is None:
            runner = self._runners[shapes] = self._runner(trace(self.function, copied(arguments)))
        return runner(arguments, tensors)

    def _runner(self, traced: Trace) -> Runner:
        """The trace's package, built first where no run built it before."""
        if compiler.BACKEND == "aot_eager":
            # torch's backend that runs the captured graph on eager kernels, with no code
            # generated (the tests' parity checks): here, the trace itself.
            return _GraphRunner(traced.graph)
        if not traced.built:
            started = time.perf_counter()
            with self.holding():
                exported = traced.export()
            traced.build(exported, self.stopping)  # steps go on meanwhile
            self.build_seconds += time.perf_counter() - started
        return traced.load()


class _GraphRunner:
    """A trace run as it is, on eager kernels (`Runner`)."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        self.graph = graph

    def __call__(self, arguments: tuple[Any, ...], tensors: list[Tensor]) -> Any:
        return self.graph(*arguments)


class BuildStopped(Exception):
    """The run stopped while a package was being built; the build was stopped too."""


def _exited(child: subprocess.Popen) -> bool:
    """Whether `child` ended, after waiting up to `_POLL_SECONDS` for it."""
    try:
        child.wait(timeout=_POLL_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return True


def _tensors_and_shapes(arguments: tuple[Any, ...]) -> tuple[list[Tensor], tuple[Any, ...]]:
    """The tensors among the arguments' leaves, in the order a package takes them, and
    what picks the package: the arguments' structure, and each tensor's shape and dtype."""
    leaves, spec = tree_flatten(arguments)
    tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
    return tensors, (spec, *((tensor.shape, tensor.dtype) for tensor in tensors))


def _key(graph: torch.fx.GraphModule, arguments: tuple[Any, ...]) -> str:
    digest = hashlib.sha256()
    digest.update(repr((_FORMAT, torch.__version__, _instruction_set())).encode())
    digest.update(graph.code.encode())
    for node in graph.graph.nodes:
        if node.op == "get_attr":  # a constant the trace kept: its value is code too
            value = getattr(graph, node.target)
            if isinstance(value, Tensor):
                digest.update(repr((node.target, value.shape, value.dtype)).encode())
                digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    leaves, spec = tree_flatten(arguments)
    digest.update(repr(spec).encode())
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            digest.update(repr((leaf.shape, leaf.dtype, leaf.stride(), leaf.device)).encode())
        else:
            digest.update(repr(leaf).encode())
    return digest.hexdigest()[:32]


def _instruction_set() -> str:
    """The vector instructions inductor's C++ kernels were built for."""
    return torch.backends.cpu.get_cpu_capability()


def _build(program: str, destination: str, parent: int) -> None:
    """The child process of `Trace.build`: the exported `program` compiled into the
    package at `destination`, written under another name and renamed (runs building the
    same step at once never read half a file; a stopped build leaves none), and the
    program's scratch directory removed."""
    signal_when_parent_dies(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # through the `finally`s below
    temporary = None
    try:
        if os.getppid() != parent:  # the run ended before the kernel knew to tell
            return
        compiler.configure_compiler()
        exported = torch.export.load(program)
        handle, temporary = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(destination))
        os.close(handle)
        with warnings.catch_warnings():  # torch's own deprecations, said while pickling
            warnings.simplefilter("ignore", FutureWarning)
            torch._inductor.aoti_compile_and_package(exported, package_path=temporary)
        os.replace(temporary, destination)
    finally:
        if temporary is not None and os.path.exists(temporary):
            os.remove(temporary)
        shutil.rmtree(os.path.dirname(program), ignore_errors=True)


if __name__ == "__main__":
    _build(sys.argv[1], sys.argv[2], int(sys.argv[3]))
