"""Seconds a compiled step's first build takes, with an empty compile cache, and where
they go (beast/train_step/package.py).

    python -m benchmarks.cold_build                         # dqn, ppo_cartpole, sac_pendulum
    python -m benchmarks.cold_build --only sac_pendulum --repeats 3

Each build is its own process (`--one`: a first build in a fresh interpreter, as a run's
first), with `BEAST_COMPILE_CACHE` a new empty folder: the case's update (its shipped
config, benchmarks/learner_step.py's synthetic batch) runs with `--compile on` until a
kind of step decides to compile; the process then takes no more steps and waits for the
build, so that nothing of its own competes with it, and reports, for every kind built:

- wall: from the decision to the compiled step's proof run done (the trace, the build,
  the package's load and first call; the run's log says it as "compiled (N s ...)");
- cpu: this process's CPU seconds meanwhile (the trace, the graph written) and its
  children's (the build's child and its C++ compilers);
- the child's phases (wall, its own CPU, its compilers' CPU): imports, the instruction
  set probes, waiting for the program (while this process traces), compiling (inductor's
  Python, then the C++ wrapper beside the kernels, and the link).

Wall-clock figures depend on the machine's load: the script prints /proc/loadavg before
and after each build; CPU seconds depend on it far less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

CASES = ("dqn", "ppo_cartpole", "sac_pendulum")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_build(case: str, threads: int) -> list[dict[str, Any]]:
    """Every first build of `case`'s update in this process (a fresh cache)."""
    import torch

    from beast.train_step import background, build_child, step
    from benchmarks.learner_step import CASES as STEP_CASES
    from benchmarks.learner_step import Timed

    torch.set_num_threads(threads)
    builds: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    finish = build_child.BuildChild.finish

    def finish_and_keep(self: Any, *args: Any, **kwargs: Any) -> None:
        finish(self, *args, **kwargs)
        phases.append(self.phases)

    build_child.BuildChild.finish = finish_and_keep  # type: ignore[method-assign]
    decide = step.TrainStep._decide

    def timed_decide(self: Any, kind: Any, inputs: Any, parts: int) -> None:
        started = (time.perf_counter(), time.process_time(), _children_cpu())
        decide(self, kind, inputs, parts)
        builds.append({"kind": repr(kind), "parts": parts, "started": started})

    step.TrainStep._decide = timed_decide  # type: ignore[method-assign]
    run = Timed(STEP_CASES[case], "on", torch.device("cpu"), False)
    train_step = run.update.train_step
    # As a run's learner has it: compiled in the background, the step's identity known
    # (beast/run/build.py `step_identity`; here any: the cache is empty), so the build's
    # child starts before the trace.
    train_step.background = True
    train_step.known_packages.identity = f"benchmarks.cold_build {case}"
    for _ in range(40):
        run()
        if background.compilations_under_way():
            for thread in threading.enumerate():
                if thread.name.startswith("compile-"):
                    thread.join()
            end = (time.perf_counter(), time.process_time(), _children_cpu())
            wall0, cpu0, children0 = builds[-1].pop("started")
            builds[-1].update(
                wall=round(end[0] - wall0, 2),
                cpu=round(end[1] - cpu0, 2),
                children_cpu=round(end[2] - children0, 2),
                phases=phases[-1] if phases else {},
            )
        if train_step.settled and len(builds) == len(train_step._decided) and builds:
            break
    run()  # adopts the last build
    for line in run.lines:
        print(f"  log: {line}", file=sys.stderr)
    return [b for b in builds if "wall" in b]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--repeats", type=int, default=1, help="cold builds per case")
    parser.add_argument("--threads", type=int, default=1, help="the learner's torch threads")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one case, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_build(args.one, args.threads)))
        return
    import torch

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, learner {args.threads} thread(s);"
        " each build: a fresh process and an empty BEAST_COMPILE_CACHE",
        flush=True,
    )
    for case in args.only.split(","):
        walls: dict[str, list[float]] = {}
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="beast-cold-") as cache:
                load = _loadavg()
                result = subprocess.run(
                    [sys.executable, "-m", "benchmarks.cold_build", "--one", case]
                    + ["--threads", str(args.threads)],
                    env=dict(os.environ, BEAST_COMPILE_CACHE=cache),
                    capture_output=True,
                    text=True,
                )
            if result.returncode != 0:
                print(f"{case}: failed\n{result.stderr[-3000:]}", flush=True)
                break
            builds = json.loads(result.stdout.strip().splitlines()[-1])
            for build in builds:
                walls.setdefault(build["kind"], []).append(build["wall"])
                cpu, children = build["cpu"], build["children_cpu"]
                print(
                    f"{case} #{repeat + 1} {build['kind']} x{build['parts']}: {build['wall']:.1f} s"
                    f" (this process {cpu:.1f} CPU s, children {children:.1f});"
                    f" child: {_phases(build['phases'])}; load {load} -> {_loadavg()}",
                    flush=True,
                )
        for kind, values in walls.items():
            print(
                f"{case} {kind}: median {statistics.median(values):.1f} s"
                f" ({min(values):.1f}-{max(values):.1f}) of {len(values)}",
                flush=True,
            )


def _phases(phases: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{name} {p['wall']:.1f} s (cpu {p['cpu']:.1f} + compilers {p['compilers_cpu']:.1f})"
        for name, p in phases.items()
    )


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as file:
            return file.read().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
