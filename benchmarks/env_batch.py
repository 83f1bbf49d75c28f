"""Env batch throughput: `loop` vs `ale_vector` backends, K envs per process, 1 and 2 processes.

    python -m benchmarks.env_batch --env PongNoFrameskip-v4 --num_envs 8 --repeats 5

Measures agent steps/s (4 emulator frames each on Atari) of `make_env_batch` with random
actions, as an actor steps it but without a model: the ceiling of acting throughput per
backend. Every variant (backend x ALE thread count x process count) runs once per
repeat, one after the other (the order rotated each repeat), so slow drift of the shared machine's
load hits all variants alike; the medians over repeats and the ratios ale_vector / loop
at the same process count are printed, with the load average before and after each
repeat.

Method, per variant: spawn the worker processes (OMP_NUM_THREADS=1, cv2.setNumThreads(1):
an actor's layout, where the loop backend's OpenCV must not start a thread pool of its
own), each builds its env batch and steps it for `warmup` seconds, all wait on a barrier,
then each counts K x batch steps for `seconds`. Two figures per variant:

- steps/s: the sum over processes of steps / wall-clock seconds;
- steps per CPU-second: all processes' steps / all their CPU time (every thread's,
  C++ workers included). On a machine shared with other jobs the wall-clock figure
  follows their load; CPU time per step much less so, and when actors and learner
  saturate the cores it is what sets acting throughput.

Then a paired figure, the least sensitive to other jobs: one process holds a loop batch
and a 1-thread ale_vector batch and alternates short bursts of steps between them
(`--paired_rounds` rounds, the order flipped every round), timing each burst's CPU and
wall-clock time; it prints the median over rounds of the per-round ratios.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `beast` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_throughput import machine_description

__all__ = ["Measurement", "PairedResult", "Variant", "measure_env_batch", "measure_paired"]

ROOT = Path(__file__).resolve().parents[1]
# Actions are drawn in blocks so the RNG is not called once per batch step.
_ACTION_BLOCK = 1024
# Seeds of worker p's envs start here; each worker gets its own range.
_SEED_STRIDE = 1000


@dataclass(frozen=True)
class Variant:
    """One configuration measured: backend, its C++ thread count, worker processes."""

    backend: str
    num_threads: int
    num_procs: int

    @property
    def label(self) -> str:
        threads = f", {self.num_threads} thread(s)" if self.backend == "ale_vector" else ""
        return f"{self.backend}{threads}, {self.num_procs} process(es)"


def _worker(
    env: str,
    variant: Variant,
    num_envs: int,
    seconds: float,
    warmup: float,
    seed: int,
    barrier: mp.synchronize.Barrier,
    results: mp.Queue,
) -> None:
    """Step one env batch with random actions; put (steps, elapsed, cpu) or ("error", msg)."""
    try:
        import cv2
        import numpy as np

        from beast.envs.batch import make_env_batch

        cv2.setNumThreads(1)
        batch = make_env_batch(
            env, num_envs, seed, False, variant.backend, num_threads=variant.num_threads
        )
        rng = np.random.default_rng(seed)
        num_actions = batch.spec.num_actions

        def run(duration: float) -> tuple[int, float, float]:
            # process_time: CPU time of all the process's threads (CLOCK_PROCESS_CPUTIME_ID).
            steps, start, cpu_start = 0, time.perf_counter(), time.process_time()
            while True:
                for actions in rng.integers(num_actions, size=(_ACTION_BLOCK, num_envs)):
                    batch.step(actions)
                    steps += num_envs
                    elapsed = time.perf_counter() - start
                    if elapsed >= duration:
                        return steps, elapsed, time.process_time() - cpu_start

        run(warmup)
        barrier.wait()
        results.put(run(seconds))
        batch.close()
    except Exception as err:  # reported to the parent, which raises it
        barrier.abort()
        results.put(("error", f"{type(err).__name__}: {err}"))


@dataclass(frozen=True)
class Measurement:
    """One run of one variant, summed over its processes."""

    steps_per_second: float
    steps_per_cpu_second: float


def measure_env_batch(
    env: str, variant: Variant, num_envs: int, seconds: float, warmup: float = 1.5
) -> Measurement:
    """Agent steps/s and steps per CPU-second of `variant.num_procs` processes.

    Each process steps one batch of `num_envs` envs with random actions.

    Raises:
        RuntimeError: a worker failed or did not report in time.
    """
    # Spawned workers inherit the environment: OpenMP reads it at import time.
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(variant.num_procs, timeout=warmup + 120.0)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            name=f"env-batch-bench-{p}",
            args=(env, variant, num_envs, seconds, warmup, p * _SEED_STRIDE, barrier, results),
            daemon=True,
        )
        for p in range(variant.num_procs)
    ]
    for proc in procs:
        proc.start()
    rates: list[float] = []
    total_steps, total_cpu = 0, 0.0
    errors: list[str] = []
    try:
        for _ in procs:
            result = results.get(timeout=warmup + seconds + 180.0)
            if result[0] == "error":
                errors.append(result[1])
            else:
                steps, elapsed, cpu = result
                rates.append(steps / elapsed)
                total_steps += steps
                total_cpu += cpu
    except Exception as err:
        raise RuntimeError(f"env batch benchmark workers did not report: {err!r}") from err
    finally:
        for proc in procs:
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
    if errors:
        raise RuntimeError(f"env batch benchmark worker failed: {errors[0]}")
    return Measurement(sum(rates), total_steps / total_cpu)


@dataclass(frozen=True)
class PairedResult:
    """Per-round ratios ale_vector / loop from one process alternating between the two."""

    cpu_ratios: list[float]
    wall_ratios: list[float]
    loop_steps_per_cpu_second: float
    ale_steps_per_cpu_second: float


def _paired_worker(env: str, num_envs: int, rounds: int, burst: int) -> PairedResult:
    """Alternate `burst` batch steps of a loop batch and a 1-thread ale_vector batch."""
    import cv2
    import numpy as np

    from beast.envs.batch import make_env_batch

    cv2.setNumThreads(1)
    batches = {
        "loop": make_env_batch(env, num_envs, 0, False, "loop"),
        "ale_vector": make_env_batch(env, num_envs, 0, False, "ale_vector", num_threads=1),
    }
    rng = np.random.default_rng(0)
    num_actions = batches["loop"].spec.num_actions
    cpu: dict[str, list[float]] = {name: [] for name in batches}
    wall: dict[str, list[float]] = {name: [] for name in batches}
    for batch in batches.values():  # warm-up
        for actions in rng.integers(num_actions, size=(2 * burst, num_envs)):
            batch.step(actions)
    for round_index in range(rounds):
        order = list(batches) if round_index % 2 == 0 else list(batches)[::-1]
        for name in order:
            actions_block = rng.integers(num_actions, size=(burst, num_envs))
            cpu_start, start = time.process_time(), time.perf_counter()
            for actions in actions_block:
                batches[name].step(actions)
            cpu[name].append(burst * num_envs / (time.process_time() - cpu_start))
            wall[name].append(burst * num_envs / (time.perf_counter() - start))
    for batch in batches.values():
        batch.close()
    return PairedResult(
        cpu_ratios=[a / b for a, b in zip(cpu["ale_vector"], cpu["loop"], strict=True)],
        wall_ratios=[a / b for a, b in zip(wall["ale_vector"], wall["loop"], strict=True)],
        loop_steps_per_cpu_second=statistics.median(cpu["loop"]),
        ale_steps_per_cpu_second=statistics.median(cpu["ale_vector"]),
    )


def measure_paired(env: str, num_envs: int, rounds: int, burst: int = 50) -> PairedResult:
    """Run `_paired_worker` in a fresh spawned process (OMP_NUM_THREADS=1)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_paired_worker, env, num_envs, rounds, burst).result()


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _variants(procs: Sequence[int], threads: Sequence[int]) -> list[Variant]:
    variants = []
    for num_procs in procs:
        variants.append(Variant("loop", 1, num_procs))
        variants += [Variant("ale_vector", t, num_procs) for t in threads]
    return variants


def run(args: argparse.Namespace) -> list[str]:
    """Measure every variant `args.repeats` times, interleaved; return the report lines."""
    from beast.envs.batch import ale_vector_supports

    if not ale_vector_supports(args.env):
        raise SystemExit(f"the ale_vector backend cannot run {args.env}; pick an Atari id")
    variants = _variants(args.procs, args.threads)
    runs: dict[Variant, list[Measurement]] = {v: [] for v in variants}
    lines = [
        f"machine: {machine_description()}",
        f"env {args.env}, K={args.num_envs} envs per process, random actions, "
        f"{args.seconds:g} s measured after {args.warmup:g} s warm-up, {args.repeats} "
        "repeats interleaved; workers: OMP_NUM_THREADS=1, cv2.setNumThreads(1)",
    ]
    for line in lines:
        print(line, flush=True)
    for repeat in range(args.repeats):
        before = _load()
        figures = []
        # Rotate the order each repeat so no variant always runs first (after a spawn
        # burst) or last.
        shift = repeat % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            result = measure_env_batch(args.env, variant, args.num_envs, args.seconds, args.warmup)
            runs[variant].append(result)
            figures.append(
                f"{variant.label}: {result.steps_per_second:,.0f} "
                f"({result.steps_per_cpu_second:,.0f}/cpu-s)"
            )
        line = f"repeat {repeat + 1}: " + "; ".join(figures) + f" (load {before} -> {_load()})"
        print(line, flush=True)
        lines.append(line)
    summary = _summary(args, variants, runs)
    if args.paired_rounds > 0:
        before = _load()
        paired = measure_paired(args.env, args.num_envs, args.paired_rounds)
        summary.append(
            f"- paired, one process alternating {args.paired_rounds} rounds of 50 batch steps "
            f"(load {before} -> {_load()}): ale_vector (1 thread) / loop steps per CPU-s "
            f"**{statistics.median(paired.cpu_ratios):.2f}** (range "
            f"{min(paired.cpu_ratios):.2f}-{max(paired.cpu_ratios):.2f}; medians "
            f"{paired.ale_steps_per_cpu_second:,.0f} vs {paired.loop_steps_per_cpu_second:,.0f}), "
            f"steps/s {statistics.median(paired.wall_ratios):.2f}"
        )
    for line in summary:
        print(line)
    return lines + summary


def _summary(
    args: argparse.Namespace, variants: list[Variant], runs: dict[Variant, list[Measurement]]
) -> list[str]:
    """A table of medians, then ale_vector / loop ratios at equal process counts."""
    wall = {v: [m.steps_per_second for m in runs[v]] for v in variants}
    cpu = {v: [m.steps_per_cpu_second for m in runs[v]] for v in variants}
    lines = [
        "",
        "| variant | median steps/s | median steps/CPU-s | steps/s runs | steps/CPU-s runs |",
        "|---|---|---|---|---|",
    ]
    for v in variants:
        lines.append(
            f"| {v.label} | {statistics.median(wall[v]):,.0f} | {statistics.median(cpu[v]):,.0f} "
            f"| {', '.join(f'{r:,.0f}' for r in wall[v])} "
            f"| {', '.join(f'{r:,.0f}' for r in cpu[v])} |"
        )
    lines.append("")
    for num_procs, num_threads in itertools.product(args.procs, args.threads):
        loop, ale = Variant("loop", 1, num_procs), Variant("ale_vector", num_threads, num_procs)
        parts = []
        for name, figures in (("steps/s", wall), ("steps/CPU-s", cpu)):
            # Per-repeat ratios too: each pair ran seconds apart, under the same load.
            paired = [a / b for a, b in zip(figures[ale], figures[loop], strict=True)]
            ratio = statistics.median(figures[ale]) / statistics.median(figures[loop])
            parts.append(
                f"{name} **{ratio:.2f}** (ratio of medians; per-repeat median "
                f"{statistics.median(paired):.2f}, range {min(paired):.2f}-{max(paired):.2f})"
            )
        lines.append(
            f"- ale_vector ({num_threads} thread(s)) / loop, {num_procs} process(es): "
            + "; ".join(parts)
        )
    return lines


def _write_results(path: Path, command: str, lines: list[str]) -> None:
    """Append the report to RESULTS.md under a dated heading."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header, body = lines[:2], lines[2:]
    with open(path, "a") as f:
        f.write(f"\n## {stamp}: env batch backends\n\nCommand: `{command}`\n\n")
        f.write("\n\n".join(header) + "\n\n")
        f.write("\n".join(f"- {line}" if line.startswith("repeat") else line for line in body))
        f.write("\n")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="PongNoFrameskip-v4", help="An Atari id.")
    p.add_argument("--num_envs", type=int, default=8, help="K envs per process.")
    p.add_argument("--procs", type=_ints, default=[1, 2], help="Process counts, e.g. 1,2.")
    p.add_argument("--threads", type=_ints, default=[1, 2], help="ALE thread counts, e.g. 1,2.")
    p.add_argument("--seconds", type=float, default=4.0, help="Measured seconds per run.")
    p.add_argument("--warmup", type=float, default=1.5, help="Unmeasured seconds per run.")
    p.add_argument("--repeats", type=int, default=5, help="Interleaved repeats.")
    p.add_argument(
        "--paired_rounds", type=int, default=20, help="Rounds of the paired figure; 0: skip."
    )
    p.add_argument("--write_results", action="store_true", help="append to RESULTS.md")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    lines = run(args)
    if args.write_results:
        command = "python -m benchmarks.env_batch " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        _write_results(args.results, command.strip(), lines)


if __name__ == "__main__":
    main()
