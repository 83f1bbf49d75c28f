"""Stable-Baselines3 and SBX, beast's peers in the side-by-side benchmarks: each run in a
process of its own, timed from that process's launch, as beast's monobeast.py is.

    python -m benchmarks.peers MODULE:FUNCTION JSON    # what run_peer starts

A peer's run is a function of a benchmark module (`sb3_dqn_side_by_side.peer_dqn`, ...)
that takes `library` ("sb3" or "sbx": SBX, `sbx-rl`, is SB3's API over jax-jitted
updates, with the same class names and SB3's arguments), `launched` and its own
arguments, all as JSON, and returns a JSON-able dict; this module's `main` calls it in
the child and prints the dict as the child's last line.

Clocks: `launched` is the parent's time.monotonic() just before the launch, and the
child measures its times against its own time.monotonic(). On Linux that is
CLOCK_MONOTONIC, one clock for every process of the machine (seconds since boot), so a
child's times include its interpreter's start and its imports (torch and SB3, or jax,
flax and SBX) as beast's include monobeast.py's. The whole run's wall-clock is the
parent's, launch to exit.

Threads: SB3 runs its updates in torch, with `threads` intra-op threads
(torch.set_num_threads; 0 keeps torch's default, the CPU count). SBX runs them in XLA,
with JAX_PLATFORMS=cpu (no probing for an accelerator). XLA's CPU client starts its own
thread pools the first time jax builds an array: on the 2-core machine this was written
on, 15 threads and an Eigen pool of nproc threads ("tf_XLAEigen") that XLA may split a
matrix product over. jax has no switch like torch.set_num_threads to cap them;
`xla_flags` passes XLA_FLAGS, and "--xla_cpu_multi_thread_eigen=false" keeps those
products on the calling thread. Torch in SBX's process only converts SB3's replay and
rollout buffers to NumPy: it gets 1 thread. Every run reports the threads its process
held at its end.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.monobeast_sps import _CLEAN_ENVIRON

ROOT = Path(__file__).resolve().parents[1]
# The Python package of each peer, and its name on PyPI (for its version).
MODULES = {"sb3": "stable_baselines3", "sbx": "sbx"}
DISTRIBUTIONS = {"sb3": "stable-baselines3", "sbx": "sbx-rl"}
NAMES = {"sb3": "SB3", "sbx": "SBX"}


def peer_environ(library: str, xla_flags: str = "") -> dict[str, str]:
    """The environment of a peer's process: the benchmark's own (monobeast_sps's copy,
    taken before anything set thread variables), with jax on the CPU for SBX."""
    if library not in MODULES:
        raise ValueError(f"unknown peer {library!r}; peers: {', '.join(MODULES)}")
    environ = dict(_CLEAN_ENVIRON)
    if library == "sbx":
        environ["JAX_PLATFORMS"] = "cpu"
        if xla_flags:
            environ["XLA_FLAGS"] = xla_flags
    return environ


def _module_name(worker: Callable[..., Any]) -> str:
    """The importable name of `worker`'s module, also when that module runs as __main__
    (`python -m benchmarks.x` or `python benchmarks/x.py`)."""
    if worker.__module__ != "__main__":
        return worker.__module__
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else f"benchmarks.{Path(main.__file__).stem}"


def run_peer(
    worker: Callable[..., dict[str, Any]],
    library: str,
    xla_flags: str = "",
    timeout: float = 7200,
    **kwargs: Any,
) -> dict[str, Any]:
    """`worker(library=library, launched=..., **kwargs)` in a fresh Python process, as a
    user runs it; its dict plus `wall_clock`, launch to exit. Raises RuntimeError with the
    tail of the child's stderr if it fails."""
    environ = peer_environ(library, xla_flags)
    target = f"{_module_name(worker)}:{worker.__name__}"
    launched = time.monotonic()
    arguments = json.dumps({"library": library, "launched": launched, **kwargs})
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", target, arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
    )
    wall_clock = time.monotonic() - launched
    if result.returncode != 0:
        raise RuntimeError(
            f"{NAMES[library]} {worker.__name__} failed: {result.stderr.strip()[-2000:]}"
        )
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "wall_clock": wall_clock}


def algorithm(library: str, name: str) -> type:
    """The class `name` (DQN, PPO, SAC, TD3, DDPG) of `library`, imported here (in the
    peer's process: jax and its threads never enter the parent)."""
    return getattr(importlib.import_module(MODULES[library]), name)


def set_threads(library: str, threads: int) -> None:
    """Torch's intra-op threads in a peer's process: `threads` for SB3 (0: torch's
    default), 1 for SBX (torch only holds its buffers)."""
    import torch

    if library == "sbx":
        torch.set_num_threads(1)
    elif threads:
        torch.set_num_threads(threads)


def threads_held() -> str:
    """Torch's intra-op threads and the threads this process holds (Linux's /proc)."""
    import torch

    task = "/proc/self/task"
    held = len(os.listdir(task)) if os.path.isdir(task) else "?"
    return f"torch {torch.get_num_threads()}, {held} in process"


def main(argv: list[str] | None = None) -> None:
    target, arguments = sys.argv[1:] if argv is None else argv
    module, _, function = target.partition(":")
    worker = getattr(importlib.import_module(module), function)
    print(json.dumps(worker(**json.loads(arguments))), flush=True)


if __name__ == "__main__":
    main()
