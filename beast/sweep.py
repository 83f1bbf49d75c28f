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
import csv
import ctypes
import itertools
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from beast.algos import ALGORITHMS
from beast.config import Config, ConfigError, algorithms_of, check_value, config_for

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONOBEAST = os.path.join(ROOT, "monobeast.py")
# Flags the sweep sets itself for every run.
_RESERVED = frozenset({"xpid", "savedir", "mode"})
_DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform", "choice")
# Episodes in the table's "mean return", as on the console.
_RETURN_WINDOW = 100
# Seconds runs get to checkpoint and exit after an interrupt before they are killed.
_STOP_SECONDS = 30.0
# prctl's option (linux/prctl.h): the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


class SweepError(ConfigError):
    """A sweep file or option that cannot work; the message is one line."""


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file. Values in flags/grid are already checked against Config."""

    name: str
    path: str
    savedir: str
    flags: dict[str, Any]
    grid: dict[str, list[Any]]
    random_params: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    num_samples: int = 0
    random_seed: int = 0
    max_parallel: int | None = None
    cpus_per_run: int = 1
    # A search that tunes itself instead of the grid and random draws (beast/tune).
    optuna: Any = None  # beast.tune.optuna_search.OptunaSpec
    pbt: Any = None  # beast.tune.pbt.PBTSpec


@dataclass(frozen=True)
class Run:
    """One run of a sweep: its name (directory), every flag it gets, those that vary."""

    name: str
    flags: dict[str, Any]
    varying: dict[str, Any]


@dataclass
class RunResult:
    run: Run
    status: str  # done, failed (exit N), unfinished, skipped
    mean_return: float = math.nan
    sps: float = math.nan
    wall_clock: float = math.nan
    # Columns of the tuners' own (Optuna's objective, PBT's lineage), after the flags.
    extra: dict[str, Any] = field(default_factory=dict)


def _check(key: str, value: Any, source: str, algo: str | None) -> Any:
    """`value` checked against the flag `key` of `algo`'s runs (None: the algorithm varies
    across runs, so against the algorithm that has the flag)."""
    if key in _RESERVED:
        raise SweepError(f"{source}: '{key}' is set by the sweep for each run; remove it")
    if key == "config":  # a file to start every run from: a path, checked by monobeast
        if not isinstance(value, str):
            raise SweepError(f"{source}: key 'config' must be a string, got {value!r}")
        return value
    if algo is None or algo not in ALGORITHMS:
        algo = (*algorithms_of(key), Config.algo)[0]
    return check_value(key, value, source, config_for(algo))


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
    flags = _mapping(data, "flags", path)
    random_spec = _mapping(data, "random", path)
    # A grid and random draws combine; a search that tunes itself stands alone (beast/tune).
    searches = [key for key in ("grid", "random", "optuna", "pbt") if data.get(key)]
    if len(searches) > 1 and set(searches) != {"grid", "random"}:
        raise SweepError(f"{path}: '{searches[-1]}' cannot be combined with '{searches[0]}'")
    tuner = _mapping(data, searches[0], path) if searches in (["optuna"], ["pbt"]) else {}
    # The runs' algorithm, when one is fixed (a grid over algorithms checks per flag).
    varied = set(_mapping(data, "grid", path)) | set(random_spec.get("params") or {})
    varied |= set(_mapping(tuner, "params", f"{path}: {searches[0]}") if tuner else {})
    algo = None if "algo" in varied else flags.get("algo", Config.algo)
    flags = {key: _check(key, value, f"{path}: flags", algo) for key, value in flags.items()}
    grid: dict[str, list[Any]] = {}
    for key, values in _mapping(data, "grid", path).items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid key '{key}' needs a non-empty list of values")
        grid[key] = [_check(key, value, f"{path}: grid", algo) for value in values]
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
        for key, dist in _mapping(random_spec, "params", f"{path}: random").items():
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


def _mapping(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise SweepError(f"{source}: '{key}' must be a mapping, got {type(value).__name__}")
    return value


def check_distribution(key: str, dist: Any, source: str, algo: str | None) -> dict[str, list[Any]]:
    if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in _DISTRIBUTIONS:
        raise SweepError(
            f"{source}: '{key}' needs one of {{{', '.join(_DISTRIBUTIONS)}}}: [...], got {dist!r}"
        )
    kind, args = next(iter(dist.items()))
    if not isinstance(args, list) or not args:
        raise SweepError(f"{source}: '{key}': {kind} needs a list, got {args!r}")
    if kind == "choice":
        return {kind: [_check(key, value, source, algo) for value in args]}
    if len(args) != 2 or not all(isinstance(a, int | float) for a in args) or args[0] > args[1]:
        raise SweepError(f"{source}: '{key}': {kind} needs [low, high] numbers, got {args!r}")
    if kind == "log_uniform" and args[0] <= 0:
        raise SweepError(f"{source}: '{key}': log_uniform needs low > 0, got {args[0]}")
    # The bounds must be values the flag accepts (int flags need int_uniform or choice).
    sample = int(args[0]) if kind == "int_uniform" else float(args[0])
    _check(key, sample, source, algo)
    return {kind: [float(a) for a in args]}


def draw_value(dist: dict[str, list[Any]], rng: random.Random) -> Any:
    kind, args = next(iter(dist.items()))
    if kind == "choice":
        return rng.choice(args)
    low, high = args
    if kind == "int_uniform":
        return rng.randint(int(low), int(high))
    if kind == "log_uniform":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("/", "_")


def expand(spec: SweepSpec) -> list[Run]:
    """The sweep's runs, in a fixed order; the same file always gives the same runs."""
    grid_points = [
        dict(zip(spec.grid, values, strict=True))
        for values in itertools.product(*spec.grid.values())
    ]
    rng = random.Random(spec.random_seed)
    draws = [
        {key: draw_value(dist, rng) for key, dist in spec.random_params.items()}
        for _ in range(spec.num_samples)
    ] or [{}]
    runs: list[Run] = []
    seen: dict[str, int] = {}
    for point in grid_points:
        for draw in draws:
            varying = {**point, **draw}
            name = ",".join(f"{k}={format_value(v)}" for k, v in varying.items()) or "run"
            # Two draws that print alike (4 significant digits) still get their own run.
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name},draw={seen[name]}"
            runs.append(Run(name=name, flags={**spec.flags, **varying}, varying=varying))
    return runs


def command(run: Run, sweep_dir: str, num_threads: int | None = None) -> list[str]:
    """The monobeast.py command line of one run."""
    argv = [sys.executable, MONOBEAST]
    flags = dict(run.flags)
    if num_threads is not None and "num_threads" not in flags:
        flags["num_threads"] = num_threads
    for key, value in flags.items():
        if value is None:  # the default; there is no flag spelling for "unset"
            continue
        if isinstance(value, bool):
            argv.append(f"--{key}" if value else f"--no-{key}")
        else:
            argv += [f"--{key}", repr(value) if isinstance(value, float) else str(value)]
    return [*argv, "--savedir", sweep_dir, "--xpid", run.name]


def slot_resources(
    max_parallel: int, cpus_per_run: int, cpus: Sequence[int], gpus: Sequence[str]
) -> list[tuple[list[int] | None, str | None]]:
    """(cores to pin or None, GPU id or None) for each of the `max_parallel` slots.

    Cores are pinned only when every slot gets its own `cpus_per_run` of them;
    overlapping pins would be worse than letting the OS schedule. GPUs go one per
    slot, round-robin when slots outnumber them.
    """
    pin = max_parallel * cpus_per_run <= len(cpus)
    return [
        (
            list(cpus[i * cpus_per_run : (i + 1) * cpus_per_run]) if pin else None,
            gpus[i % len(gpus)] if gpus else None,
        )
        for i in range(max_parallel)
    ]


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES's entries, else all devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no CUDA build, no driver: no GPUs
        return []


def is_finished(run_dir: str) -> bool:
    """Whether a run's logs reached its configured total_steps."""
    try:
        with open(os.path.join(run_dir, "config.yaml")) as f:
            total_steps = int(yaml.safe_load(f)["total_steps"])
        return _last_row(run_dir, "logs.csv").get("step", -1) >= total_steps
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return False


def _last_row(run_dir: str, name: str) -> dict[str, float]:
    with open(os.path.join(run_dir, name), newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    return {key: float(value) for key, value in rows[-1].items() if value not in ("", None)}


def metrics(run_dir: str) -> tuple[float, float, float]:
    """(mean return of the last 100 episodes, SPS, seconds) from the run's CSVs."""
    mean_return = sps = seconds = math.nan
    try:
        with open(os.path.join(run_dir, "episodes.csv"), newline="") as f:
            returns = [float(row["return"]) for row in csv.DictReader(f)]
        if returns:
            window = returns[-_RETURN_WINDOW:]
            mean_return = sum(window) / len(window)
        last = _last_row(run_dir, "logs.csv")
        seconds = last.get("time", math.nan)
        if seconds > 0:
            sps = last["step"] / seconds
    except (OSError, KeyError, ValueError):
        pass
    return mean_return, sps, seconds


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
                    "done" if finished and proc.returncode == 0 else _failure(proc.returncode)
                )
                print(
                    f"[sweep] {run.name}: {status[run.name]} after"
                    f" {time.monotonic() - started:.0f} s",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("[sweep] interrupted: stopping the runs (they checkpoint); rerun to resume")
        _stop(running)
        raise
    results = []
    for run in runs:
        run_dir = os.path.join(sweep_dir, run.name)
        state = status.get(run.name) or ("done" if is_finished(run_dir) else "unfinished")
        results.append(RunResult(run, state, *metrics(run_dir)))
    report(spec, sweep_dir, results)
    return results


def keep_sweep_file(spec: SweepSpec, sweep_dir: str) -> None:
    """The sweep file as run, next to its runs."""
    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, "sweep.yaml"), "w") as f, open(spec.path) as source:
        f.write(source.read())


def _failure(returncode: int) -> str:
    # monobeast exits 0 after a clean stop short of total_steps (Ctrl-C, SIGTERM).
    return "unfinished" if returncode == 0 else f"failed (exit {returncode})"


def launch(
    run: Run, sweep_dir: str, slot: tuple[list[int] | None, str | None], cpus_per_run: int
) -> tuple[Run, subprocess.Popen, Any, float]:
    cores, gpu = slot
    run_dir = os.path.join(sweep_dir, run.name)
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(cpus_per_run), PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log_file = open(os.path.join(run_dir, "sweep.log"), "a")  # noqa: SIM115 (closed on exit)
    proc = subprocess.Popen(
        command(run, sweep_dir, cpus_per_run),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: _prepare_child(cores),
    )
    return run, proc, log_file, time.monotonic()


def _prepare_child(cores: list[int] | None) -> None:
    """In the run's process before it execs monobeast: pin it to `cores` (its actors and
    forkserver inherit the affinity), and have the kernel send it SIGINT, a clean stop
    with a checkpoint, when the thread that started it dies: a killed sweep leaves no run
    writing on behind a restarted one."""
    if cores:
        os.sched_setaffinity(0, cores)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)


def _stop(running: dict[int, tuple[Run, subprocess.Popen, Any, float]]) -> None:
    """SIGINT every run (a terminal's Ctrl-C already did; runs ignore a second one)."""
    for _, proc, _, _ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + _STOP_SECONDS
    for _, proc, log_file, _ in running.values():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()


def report(spec: SweepSpec, sweep_dir: str, results: list[RunResult]) -> None:
    """Print the table, write results.csv and returns.png into the sweep directory."""
    keys = list(dict.fromkeys(key for r in results for key in r.run.varying))
    extra = list(dict.fromkeys(key for r in results for key in r.extra))
    header = [*keys, *extra, "mean_return", "SPS", "wall_clock", "status"]
    rows = [
        [
            *(format_value(r.run.varying.get(key, "")) for key in keys),
            *(format_value(r.extra.get(key, "")) for key in extra),
            f"{r.mean_return:.2f}",
            f"{r.sps:,.0f}" if math.isfinite(r.sps) else "nan",
            _duration(r.wall_clock),
            r.status,
        ]
        for r in results
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)))
    with open(os.path.join(sweep_dir, "results.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", *keys, *extra, "mean_return", "sps", "wall_clock_s", "status"])
        for r in results:
            writer.writerow(
                [
                    r.run.name,
                    *(r.run.varying.get(key, "") for key in keys),
                    *(r.extra.get(key, "") for key in extra),
                    r.mean_return,
                    r.sps,
                    r.wall_clock,
                    r.status,
                ]
            )
    from beast.plot import plot_runs

    out = plot_runs(
        [os.path.join(sweep_dir, r.run.name) for r in results],
        os.path.join(sweep_dir, "returns.png"),
        labels=[r.run.name for r in results],
        title=spec.name,
    )
    print(f"[sweep] wrote {os.path.join(sweep_dir, 'results.csv')} and {out}", flush=True)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beast.sweep",
        description="Run a grid / random search of monobeast flags on this machine.",
    )
    parser.add_argument("sweep_file", help="YAML sweep file (see configs/sweeps/).")
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
