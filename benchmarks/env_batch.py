"""Env batch throughput per backend (loop, ale_vector, envpool), K envs per process.

    python -m benchmarks.env_batch --env PongNoFrameskip-v4,HalfCheetah-v5 --num_envs 8,16 \\
        --backends loop,ale_vector,envpool --procs 1 --threads 1 --repeats 3

Measures agent steps/s (4 emulator frames each on Atari) of `make_env_batch` with random
actions (uniform in the bounds for continuous actions), as an actor steps it but without
a model: the ceiling of acting throughput per backend. Every variant (env x K x backend
x C++ thread count x process count; a backend that cannot run an env is left out for
it) runs once per repeat, one after the other (the order rotated each repeat), so slow
drift of the shared machine's load hits all variants alike; the medians over repeats
and the ratios backend / loop at the same env, K and process count are printed, with the
load average before and after each repeat.

Method, per variant: spawn the worker processes (OMP_NUM_THREADS=1, cv2.setNumThreads(1):
an actor's layout, where the loop backend's OpenCV must not start a thread pool of its
own), each builds its env batch and steps it for `warmup` seconds, all wait on a barrier,
then each counts K x batch steps for `seconds`. Two figures per variant:

- steps/s: the sum over processes of steps / wall-clock seconds;
- steps per CPU-second: all processes' steps / all their CPU time (every thread's,
  C++ workers included). On a machine shared with other jobs the wall-clock figure
  follows their load; CPU time per step much less so, and when actors and learner
  saturate the cores it is what sets acting throughput.

Then, per env and K, a paired figure, the least sensitive to other jobs: one process
holds one batch of each backend (1 C++ thread) and alternates short bursts of steps
between them (`--paired_rounds` rounds, the order reversed every round), timing each
burst's CPU and wall-clock time; it prints the median over rounds of the per-round
ratios backend / loop.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
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
# Backends that step their envs in C++ worker threads (`--threads` applies to them).
_NATIVE_BACKENDS = ("ale_vector", "envpool")


@dataclass(frozen=True)
class Variant:
    """One configuration measured: env, K, backend, its C++ thread count, processes."""

    env: str
    num_envs: int
    backend: str
    num_threads: int
    num_procs: int

    @property
    def label(self) -> str:
        threads = f", {self.num_threads} thread(s)" if self.backend in _NATIVE_BACKENDS else ""
        return f"{self.env} K={self.num_envs}: {self.backend}{threads}, {self.num_procs} proc(s)"


def _action_blocks(batch, rng, rows: int):
    """Random actions for `rows` batch steps: int [rows, K], or float [rows, K, d] uniform
    in a continuous action space's bounds."""
    spec = batch.spec
    if spec.continuous:
        return rng.uniform(
            spec.action_low, spec.action_high, size=(rows, batch.num_envs, *spec.action_shape)
        ).astype("float32")
    return rng.integers(spec.num_actions, size=(rows, batch.num_envs))


def _worker(
    variant: Variant,
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
            variant.env,
            variant.num_envs,
            seed,
            False,
            variant.backend,
            num_threads=variant.num_threads,
        )
        rng = np.random.default_rng(seed)

        def run(duration: float) -> tuple[int, float, float]:
            # process_time: CPU time of all the process's threads (CLOCK_PROCESS_CPUTIME_ID).
            steps, start, cpu_start = 0, time.perf_counter(), time.process_time()
            while True:
                for actions in _action_blocks(batch, rng, _ACTION_BLOCK):
                    batch.step(actions)
                    steps += variant.num_envs
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


def measure_env_batch(variant: Variant, seconds: float, warmup: float = 1.5) -> Measurement:
    """Agent steps/s and steps per CPU-second of `variant.num_procs` processes.

    Each process steps one batch of `variant.num_envs` envs with random actions.

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
            args=(variant, seconds, warmup, p * _SEED_STRIDE, barrier, results),
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
    """Per-round figures of one process alternating between the backends' batches."""

    cpu_ratios: dict[str, list[float]]  # backend -> per-round steps/CPU-s over loop's
    wall_ratios: dict[str, list[float]]  # backend -> per-round steps/s over loop's
    steps_per_cpu_second: dict[str, float]  # backend -> median over rounds


def _paired_worker(
    env: str, num_envs: int, backends: Sequence[str], rounds: int, burst: int
) -> PairedResult:
    """Alternate `burst` batch steps between one batch per backend (1 C++ thread)."""
    import cv2
    import numpy as np

    from beast.envs.batch import make_env_batch

    cv2.setNumThreads(1)
    batches = {name: make_env_batch(env, num_envs, 0, False, name) for name in backends}
    rng = np.random.default_rng(0)
    cpu: dict[str, list[float]] = {name: [] for name in batches}
    wall: dict[str, list[float]] = {name: [] for name in batches}
    for batch in batches.values():  # warm-up
        for actions in _action_blocks(batch, rng, 2 * burst):
            batch.step(actions)
    for round_index in range(rounds):
        order = list(batches) if round_index % 2 == 0 else list(batches)[::-1]
        for name in order:
            actions_block = _action_blocks(batches[name], rng, burst)
            cpu_start, start = time.process_time(), time.perf_counter()
            for actions in actions_block:
                batches[name].step(actions)
            cpu[name].append(burst * num_envs / (time.process_time() - cpu_start))
            wall[name].append(burst * num_envs / (time.perf_counter() - start))
    for batch in batches.values():
        batch.close()
    others = [name for name in batches if name != "loop"]
    return PairedResult(
        cpu_ratios={n: [a / b for a, b in zip(cpu[n], cpu["loop"], strict=True)] for n in others},
        wall_ratios={
            n: [a / b for a, b in zip(wall[n], wall["loop"], strict=True)] for n in others
        },
        steps_per_cpu_second={name: statistics.median(cpu[name]) for name in batches},
    )


def measure_paired(
    env: str, num_envs: int, backends: Sequence[str], rounds: int, burst: int = 50
) -> PairedResult:
    """Run `_paired_worker` in a fresh spawned process (OMP_NUM_THREADS=1); `backends`
    must include "loop", the reference of the ratios."""
    os.environ["OMP_NUM_THREADS"] = "1"
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_paired_worker, env, num_envs, backends, rounds, burst).result()


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _backends_for(env: str, backends: Sequence[str]) -> list[str]:
    """The requested backends that can run `env` (the loop runs everything)."""
    from beast.envs.batch import ale_vector_supports
    from beast.envs.envpool_batch import envpool_supports

    supports = {"loop": lambda _: True, "ale_vector": ale_vector_supports}
    supports["envpool"] = envpool_supports
    return [name for name in backends if supports[name](env)]


def _variants(args: argparse.Namespace) -> list[Variant]:
    variants = []
    for env in args.env:
        backends = _backends_for(env, args.backends)
        for num_envs in args.num_envs:
            for num_procs in args.procs:
                for backend in backends:
                    threads = args.threads if backend in _NATIVE_BACKENDS else [1]
                    variants += [Variant(env, num_envs, backend, t, num_procs) for t in threads]
    return variants


def _versions() -> str:
    """Versions of the packages the backends bring (machine_description has the rest)."""
    found = []
    for package in ("envpool", "mujoco", "torch"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def run(args: argparse.Namespace) -> list[str]:
    """Measure every variant `args.repeats` times, interleaved; return the report lines."""
    if "loop" not in args.backends:
        raise SystemExit("--backends must include loop: the other backends are compared to it")
    variants = _variants(args)
    runs: dict[Variant, list[Measurement]] = {v: [] for v in variants}
    lines = [
        f"machine: {machine_description()}, {_versions()}",
        f"envs {', '.join(args.env)}, K in {args.num_envs} envs per process, random actions,"
        f" {args.seconds:g} s measured after {args.warmup:g} s warm-up, {args.repeats} "
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
            result = measure_env_batch(variant, args.seconds, args.warmup)
            runs[variant].append(result)
            figures.append(
                f"{variant.label}: {result.steps_per_second:,.0f} "
                f"({result.steps_per_cpu_second:,.0f}/cpu-s)"
            )
        line = f"repeat {repeat + 1}: " + "; ".join(figures) + f" (load {before} -> {_load()})"
        print(line, flush=True)
        lines.append(line)
    summary = _summary(variants, runs)
    if args.paired_rounds > 0:
        for env in args.env:
            backends = _backends_for(env, args.backends)
            for num_envs in args.num_envs:
                before = _load()
                paired = measure_paired(env, num_envs, backends, args.paired_rounds)
                parts = [
                    f"{name} / loop steps per CPU-s **{statistics.median(ratios):.2f}** (range"
                    f" {min(ratios):.2f}-{max(ratios):.2f}), steps/s"
                    f" {statistics.median(paired.wall_ratios[name]):.2f}"
                    for name, ratios in paired.cpu_ratios.items()
                ]
                medians = ", ".join(
                    f"{name} {rate:,.0f}" for name, rate in paired.steps_per_cpu_second.items()
                )
                summary.append(
                    f"- paired, {env} K={num_envs}, one process alternating"
                    f" {args.paired_rounds} rounds of 50 batch steps (load {before} ->"
                    f" {_load()}): {'; '.join(parts)}; median steps per CPU-s {medians}"
                )
    for line in summary:
        print(line)
    return lines + summary


def _summary(variants: list[Variant], runs: dict[Variant, list[Measurement]]) -> list[str]:
    """A table of medians, with each variant's ratio to the loop at equal env, K, procs."""
    wall = {v: [m.steps_per_second for m in runs[v]] for v in variants}
    cpu = {v: [m.steps_per_cpu_second for m in runs[v]] for v in variants}
    lines = [
        "",
        "| variant | median steps/CPU-s | / loop | median steps/s | steps/CPU-s runs"
        " | steps/s runs |",
        "|---|---|---|---|---|---|",
    ]
    for v in variants:
        loop = Variant(v.env, v.num_envs, "loop", 1, v.num_procs)
        ratio = statistics.median(cpu[v]) / statistics.median(cpu[loop])
        lines.append(
            f"| {v.label} | {statistics.median(cpu[v]):,.0f} | **{ratio:.2f}**"
            f" | {statistics.median(wall[v]):,.0f}"
            f" | {', '.join(f'{r:,.0f}' for r in cpu[v])}"
            f" | {', '.join(f'{r:,.0f}' for r in wall[v])} |"
        )
    lines.append("")
    for v in variants:
        if v.backend == "loop":
            continue
        loop = Variant(v.env, v.num_envs, "loop", 1, v.num_procs)
        # Per-repeat ratios too: each pair ran seconds apart, under the same load.
        paired = [a / b for a, b in zip(cpu[v], cpu[loop], strict=True)]
        lines.append(
            f"- {v.label} / loop, steps per CPU-s: per-repeat median"
            f" {statistics.median(paired):.2f}, range {min(paired):.2f}-{max(paired):.2f}"
        )
    return lines


def _write_results(path: Path, command: str, lines: list[str], title: str) -> None:
    """Append the report to RESULTS.md under a dated heading."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header, body = lines[:2], lines[2:]
    with open(path, "a") as f:
        f.write(f"\n## {stamp}: {title}\n\nCommand: `{command}`\n\n")
        f.write("\n\n".join(header) + "\n\n")
        f.write("\n".join(f"- {line}" if line.startswith("repeat") else line for line in body))
        f.write("\n")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _names(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", type=_names, default=["PongNoFrameskip-v4"], help="Env ids, e.g. a,b.")
    p.add_argument("--num_envs", type=_ints, default=[8], help="K envs per process, e.g. 8,16.")
    p.add_argument(
        "--backends",
        type=_names,
        default=["loop", "ale_vector"],
        help="Backends, e.g. loop,ale_vector,envpool (loop is the reference).",
    )
    p.add_argument("--procs", type=_ints, default=[1, 2], help="Process counts, e.g. 1,2.")
    p.add_argument(
        "--threads", type=_ints, default=[1, 2], help="C++ thread counts (ale_vector, envpool)."
    )
    p.add_argument("--seconds", type=float, default=4.0, help="Measured seconds per run.")
    p.add_argument("--warmup", type=float, default=1.5, help="Unmeasured seconds per run.")
    p.add_argument("--repeats", type=int, default=5, help="Interleaved repeats.")
    p.add_argument(
        "--paired_rounds", type=int, default=20, help="Rounds of the paired figure; 0: skip."
    )
    p.add_argument("--write_results", action="store_true", help="append to RESULTS.md")
    p.add_argument("--title", default="env batch backends", help="RESULTS.md heading.")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    lines = run(args)
    if args.write_results:
        command = "python -m benchmarks.env_batch " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        _write_results(args.results, command.strip(), lines, args.title)


if __name__ == "__main__":
    main()
