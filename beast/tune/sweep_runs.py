"""A sweep's runs (beast/tune/sweep.py): what a run is and its monobeast command, the slots it
gets (cores, GPU), launching and stopping its process, reading its results, and the
table, CSV and plot at the end. The searches that tune themselves (beast/tune/) build on
these as the grid and the random search do, so they live below both.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from beast.algos import ALGORITHMS
from beast.algos.build import DEFAULT_ALGORITHM, algorithms_of, config_for
from beast.config import ConfigError, check_value
from beast.util.parent_death import signal_when_parent_dies

__all__ = [
    "MONOBEAST",
    "ROOT",
    "Run",
    "RunResult",
    "SweepError",
    "SweepSpec",
    "check_distribution",
    "check_flag",
    "check_section_keys",
    "command",
    "draw_value",
    "expand",
    "failure_reason",
    "format_value",
    "is_finished",
    "keep_sweep_file",
    "launch",
    "metrics",
    "report",
    "section_mapping",
    "slot_resources",
    "stop_runs",
    "visible_gpus",
]

# The checkout: beast/tune/sweep_runs.py's third parent, where monobeast.py is.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONOBEAST = os.path.join(ROOT, "monobeast.py")
# Flags the sweep sets itself for every run.
_RESERVED = frozenset({"xpid", "savedir", "mode"})
_DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform", "choice")
# Episodes in the table's "mean return", as on the console.
_RETURN_WINDOW = 100
# Seconds runs get to checkpoint and exit after an interrupt before they are killed.
_STOP_SECONDS = 30.0


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


def check_flag(key: str, value: Any, source: str, algo: str | None) -> Any:
    """`value` checked against the flag `key` of `algo`'s runs (None: the algorithm varies
    across runs, so against the algorithm that has the flag)."""
    if key in _RESERVED:
        raise SweepError(f"{source}: '{key}' is set by the sweep for each run; remove it")
    if key == "config":  # a file to start every run from: a path, checked by monobeast
        if not isinstance(value, str):
            raise SweepError(f"{source}: key 'config' must be a string, got {value!r}")
        return value
    if algo is None or algo not in ALGORITHMS:
        algo = (*algorithms_of(key), DEFAULT_ALGORITHM)[0]
    return check_value(key, value, source, config_for(algo))


def check_section_keys(section: dict[str, Any], known: set[str], source: str) -> None:
    """SweepError naming the file and the first of `section`'s keys that is not `known`
    (a search's section: `optuna:`, `pbt:`)."""
    unknown = set(section) - known
    if unknown:
        raise SweepError(
            f"{source}: unknown key '{sorted(unknown)[0]}' (it has {', '.join(sorted(known))})"
        )


def section_mapping(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
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
        return {kind: [check_flag(key, value, source, algo) for value in args]}
    if len(args) != 2 or not all(isinstance(a, int | float) for a in args) or args[0] > args[1]:
        raise SweepError(f"{source}: '{key}': {kind} needs [low, high] numbers, got {args!r}")
    if kind == "log_uniform" and args[0] <= 0:
        raise SweepError(f"{source}: '{key}': log_uniform needs low > 0, got {args[0]}")
    # The bounds must be values the flag accepts (int flags need int_uniform or choice).
    sample = int(args[0]) if kind == "int_uniform" else float(args[0])
    check_flag(key, sample, source, algo)
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


def keep_sweep_file(spec: SweepSpec, sweep_dir: str) -> None:
    """The sweep file as run, next to its runs."""
    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, "sweep.yaml"), "w") as f, open(spec.path) as source:
        f.write(source.read())


def failure_reason(returncode: int) -> str:
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
    signal_when_parent_dies(signal.SIGINT)


def stop_runs(running: dict[int, tuple[Run, subprocess.Popen, Any, float]]) -> None:
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
    from beast.outputs.plot import plot_runs

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
