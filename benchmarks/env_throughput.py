"""Env-only throughput of `beast.envs.make`: agent steps/s with random actions, N processes.

This is the ceiling for actor throughput: no model, no buffers, just the env with its
full wrapper stack (for Atari: frame skip 4, max-pool, 84x84 grayscale, frame stack).
Steps are agent steps (4 emulator frames each for Atari).

    python -m benchmarks.env_throughput --env PongNoFrameskip-v4 --num_procs 2 --seconds 10

Method: each worker process builds one env, steps it for `warmup_seconds` (ROM load,
first-touch allocations, CPU frequency ramp), waits on a barrier so all workers measure
the same interval, then counts steps for `seconds`; episodes are reset inside the
measured window as an actor would. The figure is the sum over workers of
steps / elapsed. Workers run with OMP_NUM_THREADS=1 and cv2.setNumThreads(1): one env
per core is the actor layout, and OpenCV's or BLAS's own thread pools would only fight
the other workers for the same cores.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `beast` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["machine_description", "measure_env_throughput"]

# Actions are drawn in blocks so the RNG call is not timed once per step.
_ACTION_BLOCK = 4096
# Check the clock every this many steps; perf_counter is cheap but not free.
_CLOCK_EVERY = 32


def _worker(
    name: str,
    seconds: float,
    warmup_seconds: float,
    seed: int,
    barrier: mp.synchronize.Barrier,
    results: mp.Queue,
) -> None:
    """Step one env with random actions; put (steps, elapsed) or ("error", message)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import cv2
        import numpy as np

        from beast.envs import make

        cv2.setNumThreads(1)
        env = make(name, seed=seed)
        env.reset()
        rng = np.random.default_rng(seed)
        num_actions = int(env.action_space.n)

        def run(duration: float) -> tuple[int, float]:
            steps, start = 0, time.perf_counter()
            while True:
                for action in rng.integers(num_actions, size=_ACTION_BLOCK).tolist():
                    _, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        env.reset()
                    steps += 1
                    if steps % _CLOCK_EVERY == 0:
                        elapsed = time.perf_counter() - start
                        if elapsed >= duration:
                            return steps, elapsed

        run(warmup_seconds)
        barrier.wait()
        results.put(run(seconds))
        env.close()
    except Exception as err:  # reported to the parent, which raises it
        barrier.abort()
        results.put(("error", f"{type(err).__name__}: {err}"))


def measure_env_throughput(
    name: str, num_procs: int, seconds: float, warmup_seconds: float = 2.0
) -> float:
    """Total agent steps per second of `num_procs` processes, one env each.

    Args:
        name: anything `beast.envs.make` accepts.
        num_procs: worker processes (one env each); use at most the number of cores.
        seconds: measured interval per worker, after warm-up.
        warmup_seconds: unmeasured stepping before the barrier.

    Raises:
        EnvError: `name` cannot be made (checked in this process first).
        RuntimeError: a worker failed or did not report in time.
    """
    from beast.envs import make

    make(name).close()  # fail fast, with the one-line EnvError, before any process
    # Spawned workers inherit the environment: OpenMP reads it at import time.
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(num_procs, timeout=warmup_seconds + 120.0)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            name=f"env-bench-{i}",
            args=(name, seconds, warmup_seconds, 1000 + i, barrier, results),
            daemon=True,
        )
        for i in range(num_procs)
    ]
    for proc in procs:
        proc.start()
    rates: list[float] = []
    errors: list[str] = []
    try:
        for _ in procs:
            result = results.get(timeout=warmup_seconds + seconds + 180.0)
            if result[0] == "error":
                errors.append(result[1])
            else:
                steps, elapsed = result
                rates.append(steps / elapsed)
    except Exception as err:
        raise RuntimeError(f"env benchmark workers did not report: {err!r}") from err
    finally:
        for proc in procs:
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
    if errors:
        raise RuntimeError(f"env benchmark worker failed: {errors[0]}")
    return sum(rates)


def machine_description() -> str:
    """One line naming the CPU, core counts and library versions the figure depends on."""
    import ale_py
    import cv2
    import gymnasium
    import numpy as np

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # Load before the run: on a shared machine other work takes cores from the workers.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}; nproc={usable} (cpu_count={os.cpu_count()}), load average {load:.2f}; "
        f"python {platform.python_version()}, "
        f"numpy {np.__version__}, gymnasium {gymnasium.__version__}, ale-py {ale_py.__version__}, "
        f"opencv {cv2.__version__}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4", help="Name passed to make().")
    parser.add_argument("--num_procs", type=int, default=2, help="Worker processes, one env each.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Measured seconds per worker.")
    parser.add_argument(
        "--warmup_seconds", type=float, default=2.0, help="Unmeasured steps before counting."
    )
    args = parser.parse_args(argv)
    print(f"machine: {machine_description()}")
    print("workers: OMP_NUM_THREADS=1, cv2.setNumThreads(1), one env per process, random actions")
    rate = measure_env_throughput(args.env, args.num_procs, args.seconds, args.warmup_seconds)
    print(
        f"{args.env}: {rate:,.0f} agent steps/s with {args.num_procs} "
        f"process{'es' if args.num_procs != 1 else ''} "
        f"({rate / args.num_procs:,.0f} per process, {args.seconds:g} s measured "
        f"after {args.warmup_seconds:g} s warm-up)"
    )


if __name__ == "__main__":
    main()
