"""Flag sweeps on this machine: a grid and/or seeded random search, run as monobeast runs.

    python -m beast.sweep configs/sweeps/cartpole_lr.yaml [--max_parallel N]
        [--cpus_per_run C] [--savedir DIR] [--dry_run]

A sweep file (YAML):

    name: cartpole_lr          # default: the file's name; runs go to SAVEDIR/NAME/RUN
    savedir: ~/logs/beast      # default: Config's savedir; --savedir overrides
    max_parallel: 2            # runs at once; --max_parallel overrides
    cpus_per_run: 1            # cores pinned to each run; --cpus_per_run overrides
    flags:                     # the same for every run (any monobeast flag, config too)
      env: CartPole-v1
      total_steps: 300000
    grid:                      # every combination of these values
      learning_rate: [0.001, 0.002]
      seed: [1, 2]
    random:                    # num_samples draws, the same ones for the same seed
      num_samples: 4
      seed: 0
      params:
        entropy_cost: {log_uniform: [0.001, 0.03]}
        unroll_length: {int_uniform: [10, 40]}   # inclusive
        optimizer: {choice: [adam, rmsprop]}
        baseline_cost: {uniform: [0.25, 0.5]}

With both a grid and a random search, each grid point is run with each random
draw. A run is named by the values that vary (`learning_rate=0.001,seed=1`), so
the same file always names the same runs: started again, a sweep skips the runs
whose logs reached their total_steps, and reruns the others (monobeast resumes a
run directory that holds a checkpoint).

Scheduling follows rlpyt's launch utilities: `max_parallel` slots, each with
its own `cpus_per_run` cores (set as the run's CPU affinity, OMP_NUM_THREADS and
--num_threads; no pinning when the slots would overlap) and, when GPUs are
present, one GPU through CUDA_VISIBLE_DEVICES (round-robin when there are more
slots than GPUs). Each run's console output goes to RUN_DIR/sweep.log.

At the end it prints a table (the varying flags, final mean return over the last
100 episodes, SPS, wall-clock, status), writes it to SAVEDIR/NAME/results.csv,
and plots every run's curve to SAVEDIR/NAME/returns.png (beast.plot).

Searches that tune themselves take the place of `grid` and `random`, with the same
`params` syntax: an `optuna:` section (TPE, pruned on the runs' evaluations, a storage
file that resumes; beast/tune/optuna_search.py) or a `pbt:` section (population-based
training, locally or on Ray with --ray_address; beast/tune/pbt.py). Their results go
to the same table, results.csv and returns.png.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from beast.algos.build import DEFAULT_ALGORITHM
from beast.config import Config, ConfigError
from beast.tune.sweep_runs import (
    Run,
    RunResult,
    SweepError,
    SweepSpec,
    check_distribution,
    check_flag,
    command,
    expand,
    failure_reason,
    is_finished,
    keep_sweep_file,
    launch,
    metrics,
    report,
    section_mapping,
    slot_resources,
    stop_runs,
    visible_gpus,
)

__all__ = [
    "Run",
    "RunResult",
    "SweepError",
    "SweepSpec",
    "expand",
    "load_sweep",
    "main",
    "run_sweep",
    "slot_resources",
]


def load_sweep(path: str) -> SweepSpec:
    """Read and check a sweep file; raises SweepError naming the file and key."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as error:
        raise SweepError(f"cannot read sweep file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SweepError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping, got {type(data).__name__}")
    known = {"name", "savedir", "max_parallel", "cpus_per_run", "flags", "grid", "random"}
    known |= {"optuna", "pbt"}  # the searches that tune themselves
    for key in data:
        if key not in known:
            raise SweepError(
                f"{path}: unknown key '{key}' (a sweep file has {', '.join(sorted(known))};"
                " flags go under 'flags' or 'grid')"
            )
    flags = section_mapping(data, "flags", path)
    random_spec = section_mapping(data, "random", path)
    # A grid and random draws combine; a search that tunes itself stands alone (beast/tune).
    searches = [key for key in ("grid", "random", "optuna", "pbt") if data.get(key)]
    if len(searches) > 1 and set(searches) != {"grid", "random"}:
        raise SweepError(f"{path}: '{searches[-1]}' cannot be combined with '{searches[0]}'")
    tuner = section_mapping(data, searches[0], path) if searches in (["optuna"], ["pbt"]) else {}
    # The runs' algorithm, when one is fixed (a grid over algorithms checks per flag).
    varied = set(section_mapping(data, "grid", path)) | set(random_spec.get("params") or {})
    varied |= set(section_mapping(tuner, "params", f"{path}: {searches[0]}") if tuner else {})
    algo = None if "algo" in varied else flags.get("algo", DEFAULT_ALGORITHM)
    flags = {key: check_flag(key, value, f"{path}: flags", algo) for key, value in flags.items()}
    grid: dict[str, list[Any]] = {}
    for key, values in section_mapping(data, "grid", path).items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid key '{key}' needs a non-empty list of values")
        grid[key] = [check_flag(key, value, f"{path}: grid", algo) for value in values]
    params: dict[str, dict[str, list[Any]]] = {}
    num_samples, random_seed = 0, 0
    if random_spec:
        unknown = set(random_spec) - {"num_samples", "seed", "params"}
        if unknown:
            raise SweepError(f"{path}: random: unknown key '{sorted(unknown)[0]}'")
        num_samples = random_spec.get("num_samples")
        random_seed = random_spec.get("seed", 0)
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise SweepError(f"{path}: random: num_samples must be a positive integer")
        if not isinstance(random_seed, int):
            raise SweepError(f"{path}: random: seed must be an integer")
        for key, dist in section_mapping(random_spec, "params", f"{path}: random").items():
            params[key] = check_distribution(key, dist, f"{path}: random", algo)
        if not params:
            raise SweepError(f"{path}: random: params is empty")
    overlap = (set(grid) & set(params)) | ((set(grid) | set(params)) & set(flags))
    if overlap:
        raise SweepError(f"{path}: '{sorted(overlap)[0]}' is set in more than one section")
    max_parallel = data.get("max_parallel")
    cpus_per_run = data.get("cpus_per_run", 1)
    for key, value in (("max_parallel", max_parallel), ("cpus_per_run", cpus_per_run)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise SweepError(f"{path}: {key} must be a positive integer, got {value!r}")
    optuna_spec = pbt_spec = None
    if searches == ["optuna"]:
        from beast.tune.optuna_search import parse_optuna

        optuna_spec = parse_optuna(tuner, f"{path}: optuna", algo, flags)
    elif searches == ["pbt"]:
        from beast.tune.pbt import parse_pbt

        pbt_spec = parse_pbt(tuner, f"{path}: pbt", algo, flags)
    name = data.get("name") or os.path.splitext(os.path.basename(path))[0]
    if not isinstance(name, str) or "/" in name:
        raise SweepError(f"{path}: name must be a string without '/', got {name!r}")
    return SweepSpec(
        name=name,
        path=path,
        savedir=str(data.get("savedir") or Config.savedir),
        flags=flags,
        grid=grid,
        random_params=params,
        num_samples=num_samples,
        random_seed=random_seed,
        max_parallel=max_parallel,
        cpus_per_run=cpus_per_run,
        optuna=optuna_spec,
        pbt=pbt_spec,
    )


def run_sweep(
    spec: SweepSpec,
    *,
    max_parallel: int | None = None,
    cpus_per_run: int | None = None,
    savedir: str | None = None,
    dry_run: bool = False,
    poll_seconds: float = 0.5,
    ray_address: str | None = None,
) -> list[RunResult]:
    """Run (or, with dry_run, print) every unfinished run; returns one result per run.

    ray_address: PBT's members run as tasks on this Ray cluster (`auto`, HOST:PORT)."""
    sweep_dir = os.path.join(os.path.expanduser(savedir or spec.savedir), spec.name)
    cpus = sorted(os.sched_getaffinity(0))
    gpus = visible_gpus()
    cpus_per_run = cpus_per_run or spec.cpus_per_run
    max_parallel = max_parallel or spec.max_parallel
    if max_parallel is None:
        max_parallel = len(gpus) if gpus else max(1, len(cpus) // cpus_per_run)
    slots = slot_resources(max_parallel, cpus_per_run, cpus, gpus)
    if ray_address is not None and spec.pbt is None:
        raise SweepError("--ray_address runs PBT's members on Ray; this sweep has no 'pbt'")
    if spec.optuna is not None or spec.pbt is not None:
        from beast.tune import run_tuner

        return run_tuner(
            spec,
            sweep_dir,
            slots=slots,
            cpus_per_run=cpus_per_run,
            dry_run=dry_run,
            poll_seconds=poll_seconds,
            ray_address=ray_address,
        )
    runs = expand(spec)
    pending = [run for run in runs if not is_finished(os.path.join(sweep_dir, run.name))]
    done_before = len(runs) - len(pending)
    print(
        f"[sweep] {spec.name}: {len(runs)} runs in {sweep_dir} ({done_before} finished before),"
        f" {max_parallel} at a time, {cpus_per_run} CPU(s) each"
        + (f", GPUs {','.join(gpus)}" if gpus else ""),
        flush=True,
    )
    if dry_run:
        for run in pending:
            print(shlex.join(command(run, sweep_dir, cpus_per_run)))
        return []
    keep_sweep_file(spec, sweep_dir)

    status: dict[str, str] = {}
    running: dict[int, tuple[Run, subprocess.Popen, Any, float]] = {}
    free = list(range(max_parallel))
    queue = list(pending)
    try:
        while queue or running:
            while queue and free:
                slot = free.pop(0)
                run = queue.pop(0)
                running[slot] = launch(run, sweep_dir, slots[slot], cpus_per_run)
                print(f"[sweep] started {run.name}", flush=True)
            time.sleep(poll_seconds)
            for slot, (run, proc, log_file, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                log_file.close()
                del running[slot]
                free.append(slot)
                finished = is_finished(os.path.join(sweep_dir, run.name))
                status[run.name] = (
                    "done" if finished and proc.returncode == 0 else failure_reason(proc.returncode)
                )
                print(
                    f"[sweep] {run.name}: {status[run.name]} after"
                    f" {time.monotonic() - started:.0f} s",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("[sweep] interrupted: stopping the runs (they checkpoint); rerun to resume")
        stop_runs(running)
        raise
    results = []
    for run in runs:
        run_dir = os.path.join(sweep_dir, run.name)
        state = status.get(run.name) or ("done" if is_finished(run_dir) else "unfinished")
        results.append(RunResult(run, state, *metrics(run_dir)))
    report(spec, sweep_dir, results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beast.sweep",
        description="Run a search of monobeast flags: each run a monobeast process, on this"
        " machine (population-based training also on a Ray cluster). The sweep file's"
        " section picks the mode: grid (every combination of the values listed), random"
        " (seeded draws from uniform, log_uniform, int_uniform or choice distributions;"
        " with a grid, each grid point with each draw), optuna (TPE proposes each trial's"
        " flags, trials pruned on the runs' evaluations, resumable from its storage file;"
        " pip install -e '.[tune]') or pbt (population-based training: every interval"
        " steps the worst members continue from perturbed copies of the best). Started"
        " again, a sweep resumes: finished runs are skipped, the others resume from their"
        " checkpoints. At the end: a table of the runs, results.csv and returns.png in"
        " SAVEDIR/NAME (docs/usage.md, docs/tuning.md; example files in configs/sweeps/).",
    )
    parser.add_argument(
        "sweep_file",
        help="YAML sweep file: name, savedir, max_parallel, cpus_per_run, flags (every"
        " run's), and grid and/or random, or optuna, or pbt (see configs/sweeps/).",
    )
    parser.add_argument(
        "--max_parallel",
        type=int,
        help="Runs at once. Default: the file's, else one per GPU, else cores // cpus_per_run.",
    )
    parser.add_argument("--cpus_per_run", type=int, help="Cores per run. Default: the file's, 1.")
    parser.add_argument("--savedir", help="Root for SAVEDIR/NAME/RUN. Default: the file's.")
    parser.add_argument(
        "--dry_run", action="store_true", help="Print the runs' commands; run nothing."
    )
    parser.add_argument(
        "--ray_address",
        help="PBT only: run the members as tasks on this Ray cluster (auto, or HOST:PORT).",
    )
    args = parser.parse_args(argv)
    for key in ("max_parallel", "cpus_per_run"):
        if getattr(args, key) is not None and getattr(args, key) <= 0:
            parser.error(f"--{key} must be positive, got {getattr(args, key)}")
    try:
        spec = load_sweep(args.sweep_file)
        results = run_sweep(
            spec,
            max_parallel=args.max_parallel,
            cpus_per_run=args.cpus_per_run,
            savedir=args.savedir,
            dry_run=args.dry_run,
            ray_address=args.ray_address,
        )
    except ConfigError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0 if all(r.status in ("done", "pruned") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
