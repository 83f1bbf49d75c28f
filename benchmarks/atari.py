"""Time to score on Atari: one algorithm on one game for a wall-clock budget per seed, timed
from launch.

    python -m benchmarks.atari                                  # IMPALA, Pong, seed 1, 20 min
    python -m benchmarks.atari --seeds 1 2 3 --budget 20m --threshold 18
    python -m benchmarks.atari --algo r2d2 --budget 2h        # scored by its evaluations
    python -m benchmarks.atari --budget 5m --stop_at_threshold -- --num_actors auto
    python -m benchmarks.atari --budget 90 --threshold -20.5 --warmup 30   # smoke test

Each seed is one run of `monobeast.py --algo A --env E --seed S` (flags after `--` are
added), the seeds one after the other, never two at once. Nothing else is set: the run
keeps its config's --total_steps, which sets the learning-rate schedule a user's run
gets, and its own thread count. A run is stopped as Ctrl-C stops it (SIGINT to its
process group: a final checkpoint, exit 0) at the budget, or with --stop_at_threshold as
soon as this script sees the score (below) reach the threshold; it is killed if it has
not exited `--exit_timeout` seconds later.

Score. With `--score episodes` the threshold is judged on the mean return of the last
`--window` finished training episodes, every env's. Where the run's envs act with
different parameters (Ape-X and R2D2: each env its own epsilon, 0.4 down to 0.0007 over
16 envs), that mean mixes them all and stays below what the policy scores, so `--score
auto` (the default) judges those runs on their evaluations (`--score evaluation`) and
every other run on its episodes. With evaluations the run gets `--eval_interval`
(`--eval_interval` here, 100,000 agent steps unless one is given after `--`), and the
threshold is judged on each evaluation's mean return over its `--eval_episodes` episodes
(monobeast.py's default 10) with the greedy policy (`--mode test`'s), at the time its
logs.csv row was written and the step of the weights it evaluated. The evaluator is a
process of the run: its CPU counts in the wall-clock. Whether the envs act alike is
asked of the acting rule the run builds from its flags and config file, so the benchmark
names no algorithm.

Clock. Every time is from launch (the subprocess's start), so the interpreter's start,
imports, the fork server and compilation all count. episodes.csv stamps each episode
with logs.csv's `time` (seconds from the run log's start) of the update that consumed
it. The run log starts after launch; the gap is measured while the run goes: at each
poll, the poll's time from launch minus the newest logs.csv row's time is never less
than the gap (the row was written before the poll), and the smallest such difference is
taken. With updates every fraction of a second and a poll a second, it is within
milliseconds of the truth and never below it.

Per run:
- the wall-clock and agent steps at which the score first reached the threshold, the
  best score and when, the last score; with --score evaluation also the training
  episodes' best mean of `--window`;
- steady SPS: agent steps per second between the first logs.csv row after `--warmup`
  seconds from launch and the last row (benchmarks.monobeast_sps.steady_sps);
- peak RSS of every process of the run (the kernel's VmHWM, exact), found by sampling
  /proc each `--sample_interval` seconds: the run's process tree and every process of
  its session (actors, the fork server, compile workers, the resource tracker; an
  orphan keeps its session), and the peak of their summed RSS (an upper bound of the
  run's memory: pages they share, shared memory and copy-on-write after fork, count once
  per process);
- shared memory: the peak of what the run's processes map (/dev/shm files, unlinked
  ones included, and memfds; each segment once; every DIR_SNAPSHOT_SECONDS), and
  /dev/shm's use (the whole machine's tmpfs: other users' segments count too) before, at
  its peak and after the run, and the entries the run left there;
- the run directory's size at its first update, at the end of warm-up, at the stop and
  after the exit (the final checkpoint), per file;
- growth that the replay's fill does not explain (issue 41, item 5), judged between the
  end of warm-up, or the time the replay first reached its final fill (logs.csv's
  `replay_fill`) if later, and the stop: the run's private memory (its processes'
  summed RssAnon: not the shared memory they map, whose RSS grows as each process
  touches more of a full replay: an R2D2 actor's went from 1.7 to 3.1 GB as it wrote
  into rows the other actor had filled) or the shared memory the run maps (each segment
  once) growing by more than max(MEMORY_GROWTH_MIB, MEMORY_GROWTH_SHARE of its start),
  open files by more than FD_GROWTH, logs and TensorBoard files growing faster than
  LOG_GROWTH_MIB_PER_HOUR, a checkpoint file growing, any other file appearing or
  growing, entries left in /dev/shm, processes left after the run's exit (killed, then
  reported);
- a PNG: the return against wall-clock and against agent steps, SPS and summed RSS
  against wall-clock.

Across seeds: per figure the median and the interquartile mean with 95% confidence
intervals from a stratified bootstrap (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"; `aggregate_iqm` and `get_interval_estimates` of rliable 1.2.0:
runs resampled with replacement within each task, 50,000 resamples, percentile
intervals); a PNG of every seed's curve. rliable itself is not used: 1.2.0 needs
arch < 8, and arch 7.2 fails to import with pandas 3 (`deprecate_kwarg() missing 1
required positional argument`), so rliable installs and then fails on import unless
pandas is held below 3. What differs from rliable: its `aggregate_median` is the median
over tasks of each task's mean over runs (with one task, the mean of the runs); here
the median is over runs, as the issue's "median of 3 seeds" means. A time to the
threshold that was not reached counts as infinite (slower than any reached), so a
median or IQM that includes one is "not reached".

Output, in `--out` (default a new temporary directory): runs/XPID (the run directories),
XPID.log (each run's console), XPID.png, curves.png, summary.json and summary.md.

Errors (bad flags, a run that fails) are one line on stderr and exit code 2; Ctrl-C or
SIGTERM stops the run under way as a user's Ctrl-C does (a second one kills it), kills
whatever of it is left after `--exit_timeout`, reports it as far as it got, and exits
130.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beast.util.parent_death import signal_when_parent_dies
from benchmarks.env_throughput import machine_description
from benchmarks.monobeast_sps import _CLEAN_ENVIRON, learner_threads, steady_sps

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m benchmarks.atari"

DEFAULT_ALGO, DEFAULT_ENV = "impala", "PongNoFrameskip-v4"
DEFAULT_THRESHOLD = 18.0  # Pong's "solved" bar (issue 41)
DEFAULT_WINDOW = 100  # episodes in the mean
# What the threshold is judged on (the module docstring's "Score").
EPISODES, EVALUATION, AUTO = "episodes", "evaluation", "auto"
DEFAULT_EVAL_INTERVAL = 100_000  # agent steps between evaluations, with --score evaluation
ENVS_PROBED = 16  # envs whose acting parameters --score auto compares
DEFAULT_BUDGET = 20 * 60.0  # seconds per seed, from launch
# Seconds from launch before SPS and growth count: start-up, the fork server, the first
# compilations, the thread tuner.
DEFAULT_WARMUP = 60.0
DEFAULT_SAMPLE_INTERVAL = 1.0  # seconds between samples of /proc and the run's files
# Seconds a run gets to checkpoint and exit after SIGINT: a replay's checkpoint
# (--checkpoint_replay) writes gigabytes.
DEFAULT_EXIT_TIMEOUT = 300.0
# Seconds after the run's main process exits for the rest of its session to go.
LEFTOVER_SECONDS = 10.0
DIR_SNAPSHOT_SECONDS = 10.0  # seconds between snapshots of the run directory

# rliable's defaults (library.get_interval_estimates).
BOOTSTRAP_REPS = 50_000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0  # the intervals are reproducible

# The growth rules of the module docstring.
MEMORY_GROWTH_MIB = 128.0
MEMORY_GROWTH_SHARE = 0.05
FD_GROWTH = 32
LOG_GROWTH_MIB_PER_HOUR = 50.0
CHECKPOINT_GROWTH_SHARE = 0.01  # model.tar holds fixed-size state: 1% is slack
# A judgment needs this many seconds between the start of the window and the stop.
MIN_GROWTH_WINDOW = 60.0
# Run-directory files that grow by design, one row or event at a time.
LOG_FILES = re.compile(r"^(logs\.csv|episodes\.csv|events\.out\.tfevents\..*)$")
CHECKPOINTS = re.compile(r"^(model|model\.prev|model_best|replay)\.tar$")
MIB = 2**20


class BenchError(Exception):
    """What stops the benchmark: printed as one line, exit code 2."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run: the run was stopped; `run` holds its figures."""

    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.run = run


# --- Returns: the threshold crossing ---------------------------------------------------


def trailing_means(returns: Sequence[float], window: int) -> np.ndarray:
    """float64 [len(returns)]: the mean of the `window` returns ending at each episode;
    nan until `window` episodes have finished."""
    values = np.asarray(returns, dtype=np.float64)
    means = np.full(len(values), np.nan)
    if window > 0 and len(values) >= window:
        cumulative = np.concatenate([[0.0], np.cumsum(values)])
        means[window - 1 :] = (cumulative[window:] - cumulative[:-window]) / window
    return means


@dataclass(frozen=True)
class Crossing:
    """Where the mean of `window` episodes first reached a threshold, and its best."""

    index: int | None  # the episode that completed the first window at the threshold
    best_index: int | None  # the episode that completed the best window
    best: float  # the best mean; nan with fewer than `window` episodes


def first_crossing(returns: Sequence[float], threshold: float, window: int) -> Crossing:
    """The first episode at which the mean of the last `window` returns is >= threshold."""
    return crossing_of(trailing_means(returns, window), threshold)


def crossing_of(scores: np.ndarray, threshold: float) -> Crossing:
    """The first of `scores` (nan: none yet) that is >= threshold, and the best of them."""
    if not np.isfinite(scores).any():
        return Crossing(None, None, math.nan)
    reached = np.flatnonzero(scores >= threshold)
    best_index = int(np.nanargmax(scores))
    return Crossing(
        int(reached[0]) if len(reached) else None, best_index, float(scores[best_index])
    )


@dataclass(frozen=True)
class Episodes:
    """A run's episodes.csv: float64 [num_episodes] each; `seconds` from launch."""

    steps: np.ndarray
    returns: np.ndarray
    seconds: np.ndarray


def read_episodes(path: Path, launch_offset: float) -> Episodes:
    """episodes.csv, its `time` (from the run log's start) moved to launch."""
    steps, returns, seconds = [], [], []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames and "time" not in reader.fieldnames:
                raise BenchError(
                    f"{path} has no time column: written by a beast older than this"
                    " benchmark (beast/outputs/logs.py)"
                )
            for row in reader:
                if row.get("return") and row.get("time"):
                    steps.append(float(row["step"]))
                    returns.append(float(row["return"]))
                    seconds.append(float(row["time"]) + launch_offset)
    except FileNotFoundError:
        pass
    return Episodes(*(np.array(v, dtype=np.float64) for v in (steps, returns, seconds)))


@dataclass(frozen=True)
class ScoreCurve:
    """What the threshold is judged on: float64 [n] each, one point per finished episode
    (`scores` the mean of the last `window` returns, nan before `window` episodes) or per
    evaluation (`scores` its mean return; `steps` the step of the weights evaluated);
    `seconds` from launch."""

    steps: np.ndarray
    seconds: np.ndarray
    scores: np.ndarray


def read_evaluations(path: Path, launch_offset: float) -> ScoreCurve:
    """logs.csv's evaluation rows (--eval_interval; beast/outputs/logs.py's record_eval):
    each at the time it was written, moved to launch."""
    steps, seconds, scores = [], [], []
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("eval_mean_return") and row.get("time"):
                    steps.append(float(row["eval_step"]))
                    seconds.append(float(row["time"]) + launch_offset)
                    scores.append(float(row["eval_mean_return"]))
    except FileNotFoundError:
        pass
    return ScoreCurve(*(np.array(v, dtype=np.float64) for v in (steps, seconds, scores)))


def score_curve(
    episodes: Episodes, run_dir: Path, launch_offset: float, settings: Settings
) -> ScoreCurve:
    """The run's curve under `settings.score` (see the module docstring's "Score"), from
    its episodes (read_episodes with the same `launch_offset`) or its logs.csv."""
    if settings.score == EVALUATION:
        return read_evaluations(run_dir / "logs.csv", launch_offset)
    return ScoreCurve(
        episodes.steps, episodes.seconds, trailing_means(episodes.returns, settings.window)
    )


# --- Across seeds: median, IQM and the stratified bootstrap ----------------------------


def _runs_last(scores: np.ndarray) -> np.ndarray:
    """[..., num_runs, num_tasks] -> [..., num_runs * num_tasks], sorted."""
    return np.sort(scores.reshape(*scores.shape[:-2], -1), axis=-1)


def median_score(scores: np.ndarray) -> np.ndarray:
    """The median over every run of every task: [..., num_runs, num_tasks] -> [...]."""
    return np.median(_runs_last(scores), axis=-1)


def interquartile_mean(scores: np.ndarray) -> np.ndarray:
    """The interquartile mean over every run of every task, as rliable's aggregate_iqm
    (scipy.stats.trim_mean(scores, 0.25, axis=None)): the mean of what is left after
    int(0.25 * n) of the n scores are cut from each end, so with fewer than 4 scores
    nothing is cut. [..., num_runs, num_tasks] -> [...]."""
    pooled = _runs_last(scores)
    cut = int(0.25 * pooled.shape[-1])
    kept = pooled[..., cut : pooled.shape[-1] - cut]
    # An infinite score among the kept ones makes the mean infinite (never nan: only +inf
    # appears, for a threshold not reached).
    with np.errstate(invalid="ignore"):
        return kept.mean(axis=-1)


def percentile(values: np.ndarray, q: float) -> float:
    """numpy's default (linear) percentile of 1-D `values`, q in [0, 100], but where the
    two neighbours are equal (both infinite included) their value, and where the upper
    one is infinite, infinity (numpy gives nan there)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    position = q / 100.0 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    a, b = float(ordered[low]), float(ordered[high])
    if fraction == 0.0 or a == b:
        return a
    return a + fraction * (b - a)


def stratified_bootstrap(
    scores: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """The percentile interval of `statistic` over bootstrap resamples of `scores`
    [num_runs, num_tasks]: each resample draws num_runs runs with replacement within
    each task (rliable's StratifiedBootstrap: the tasks are fixed, the runs resampled;
    Agarwal et al. 2021, section 4); `statistic` maps [reps, num_runs, num_tasks] to
    [reps]. Returns the (1 - confidence) / 2 and (1 + confidence) / 2 percentiles."""
    scores = np.asarray(scores, dtype=np.float64)
    num_runs, num_tasks = scores.shape
    rng = np.random.default_rng(seed)
    runs = rng.integers(0, num_runs, size=(reps, num_runs, num_tasks))
    resampled = scores[runs, np.arange(num_tasks)]
    values = statistic(resampled)
    tail = 100.0 * (1.0 - confidence) / 2.0
    return percentile(values, tail), percentile(values, 100.0 - tail)


@dataclass(frozen=True)
class Aggregate:
    """A figure across seeds: the values, and the median and IQM with their intervals."""

    values: list[float]
    median: float
    median_ci: tuple[float, float]
    iqm: float
    iqm_ci: tuple[float, float]


def aggregate(values: Sequence[float], reps: int = BOOTSTRAP_REPS) -> Aggregate:
    """One task's per-seed values (inf: not reached) to their Aggregate."""
    scores = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    return Aggregate(
        [float(v) for v in values],
        float(median_score(scores)),
        stratified_bootstrap(scores, median_score, reps),
        float(interquartile_mean(scores)),
        stratified_bootstrap(scores, interquartile_mean, reps),
    )


# --- The run's processes, from /proc ---------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat used here."""

    pid: int
    state: str  # R, S, D, Z (a zombie: dead, not yet reaped), ...
    ppid: int
    session: int
    start: int  # clock ticks after boot: with the pid, a process's identity
    comm: str


def read_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # comm is in parentheses and may hold spaces or parentheses: split at the last ")".
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    # After comm: state, ppid, pgrp, session, ... starttime is the stat file's 22nd field.
    comm = head.partition("(")[2]
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[3]), int(fields[19]), comm)


def all_stats() -> dict[int, ProcStat]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                stats[stat.pid] = stat
    return stats


def run_members(root: int, session: int, stats: dict[int, ProcStat]) -> dict[int, ProcStat]:
    """The processes of a run: `root`'s descendants (and itself) and every process of
    `session` (its orphans included, whose parent is no longer in the tree); zombies
    (dead, not yet reaped) are not."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    members = {pid: stat for pid, stat in stats.items() if stat.session == session}
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        members[pid] = stats[pid]
        todo.extend(child for child in children.get(pid, ()) if child not in members)
    return {pid: stat for pid, stat in members.items() if stat.state != "Z"}


class Memory(NamedTuple):
    """A process's memory in KiB (/proc/PID/status): resident (VmRSS), its peak (VmHWM),
    and the private part of it (RssAnon: neither files nor shared memory)."""

    rss: int
    hwm: int
    private: int


def memory_kib(pid: int) -> Memory | None:
    """A process's `Memory`; None when it is gone or has none (a kernel thread). A kernel
    without RssAnon (before 4.5) gives VmRSS for it."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM", "RssAnon"):
                    fields[name] = int(value.split()[0])
    except OSError:
        return None
    if "VmRSS" not in fields or "VmHWM" not in fields:
        return None
    return Memory(fields["VmRSS"], fields["VmHWM"], fields.get("RssAnon", fields["VmRSS"]))


def shared_segments(pid: int) -> dict[tuple[str, str], int]:
    """The shared-memory segments a process maps (/dev/shm files, unlinked ones
    included, and memfds), by (device, inode): their mapped bytes."""
    segments: dict[tuple[str, str], int] = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith(("/dev/shm/", "/memfd:")):
                    start, end = (int(address, 16) for address in parts[0].split("-"))
                    key = (parts[3], parts[4])
                    segments[key] = max(segments.get(key, 0), end - start)
    except OSError:
        pass
    return segments


def run_shared_memory(pids: Sequence[int]) -> int:
    """Bytes of shared memory the processes map, each segment once."""
    segments: dict[tuple[str, str], int] = {}
    for pid in pids:
        for key, size in shared_segments(pid).items():
            segments[key] = max(segments.get(key, 0), size)
    return sum(segments.values())


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_role(pid: int, root: int, cmdline: str, comm: str, parent_role: str | None) -> str:
    """What a process of the run is, from its command line and its parent's role."""
    if pid == root:
        return "main"
    if parent_role == "fork server":
        return "actor"  # or the evaluator: every process the fork server forks
    if "forkserver" in cmdline:
        return "fork server"
    if "resource_tracker" in cmdline:
        return "resource tracker"
    if "compile_worker" in cmdline or "_inductor" in cmdline:
        return "compile worker"
    child = re.search(r"beast\.util\.parent_death \d+ \w+ (\S+)", cmdline)
    if child:  # a child tied to the run (beast/util/parent_death.py), by its function
        return child.group(1)
    if parent_role not in (None, "main"):
        return parent_role  # what it started: compilers, linkers
    return f"{comm} -c" if " -c " in cmdline else comm


@dataclass
class ProcessRecord:
    """One process of the run as sampled."""

    pid: int
    role: str
    command: str
    first_seen: float  # seconds from launch
    last_seen: float
    peak_rss_kib: int = 0  # the kernel's VmHWM: exact, whatever the sampling
    last_rss_kib: int = 0
    max_fds: int = 0


@dataclass(frozen=True)
class Sample:
    """The run's processes at one time: their summed RSS, private memory (`Memory`) and
    open files."""

    seconds: float  # from launch
    rss_kib: int
    private_kib: int
    fds: int
    processes: int


class TreeSampler:
    """Samples the processes of a run (run_members) from /proc: each one's peak RSS and
    open files, and the sum of their RSS over time."""

    def __init__(self, root: int, session: int) -> None:
        self.root, self.session = root, session
        self.records: dict[tuple[int, int], ProcessRecord] = {}  # by (pid, start)
        self.samples: list[Sample] = []
        self.pids: list[int] = []  # the processes of the latest sample

    def members(self) -> dict[int, ProcStat]:
        return run_members(self.root, self.session, all_stats())

    def sample(self, seconds: float) -> Sample:
        members = self.members()
        roles = {key[0]: record.role for key, record in self.records.items()}
        total_rss = total_private = total_fds = 0
        # Parents first, so that a child's role can follow its parent's.
        for pid, stat in sorted(members.items(), key=lambda item: item[1].start):
            memory = memory_kib(pid)
            if memory is None:
                continue
            key = (pid, stat.start)
            record = self.records.get(key)
            if record is None:
                cmdline = command_line(pid)
                role = process_role(pid, self.root, cmdline, stat.comm, roles.get(stat.ppid))
                record = ProcessRecord(pid, role, cmdline[:200], seconds, seconds)
                self.records[key] = record
                roles[pid] = role
            fds = open_files(pid)
            record.last_seen = seconds
            record.peak_rss_kib = max(record.peak_rss_kib, memory.hwm)
            record.last_rss_kib = memory.rss
            record.max_fds = max(record.max_fds, fds)
            total_rss += memory.rss
            total_private += memory.private
            total_fds += fds
        sample = Sample(seconds, total_rss, total_private, total_fds, len(members))
        self.samples.append(sample)
        self.pids = list(members)
        return sample


def kill_members(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- Files: /dev/shm, the run directory, CSVs being written ----------------------------


@dataclass(frozen=True)
class ShmState:
    used: int  # bytes in use on /dev/shm (the whole machine's, unlinked segments included)
    entries: frozenset[str]


def shm_state(path: str = "/dev/shm") -> ShmState:
    try:
        stat = os.statvfs(path)
        entries = frozenset(os.listdir(path))
    except OSError:
        return ShmState(0, frozenset())
    return ShmState((stat.f_blocks - stat.f_bfree) * stat.f_frsize, entries)


def dir_sizes(path: Path) -> dict[str, int]:
    """Every file under `path` (relative name -> bytes); {} before it exists."""
    sizes = {}
    for parent, _, files in os.walk(path):
        for name in files:
            full = os.path.join(parent, name)
            # OSError: replaced (an atomic checkpoint) between the listing and the stat.
            with contextlib.suppress(OSError):
                sizes[os.path.relpath(full, path)] = os.path.getsize(full)
    return sizes


class CsvTail:
    """The whole rows appended to a CSV file since the last call (a run appends and
    flushes row by row; a half-written last line waits for the next call)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.header: list[str] | None = None

    def rows(self) -> list[dict[str, str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        lines = data[:end].decode().splitlines()
        if self.header is None and lines:
            self.header = next(csv.reader(lines[:1]))
            lines = lines[1:]
        return [dict(zip(self.header or [], row, strict=False)) for row in csv.reader(lines)]


# --- One run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    algo: str
    env: str
    seeds: tuple[int, ...]
    budget: float
    threshold: float
    window: int
    warmup: float
    stop_at_threshold: bool
    flags: tuple[str, ...]
    out: Path
    score: str = EPISODES  # EPISODES or EVALUATION (AUTO is resolved by parse_args)
    eval_interval: int = DEFAULT_EVAL_INTERVAL
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT
    bootstrap_reps: int = BOOTSTRAP_REPS


def xpid_for(algo: str, env: str, seed: int) -> str:
    game = re.sub(r"[^A-Za-z0-9._-]", "_", env.rpartition(":")[2])
    return f"{algo}-{game}-seed{seed}"


def _tie_to_parent() -> None:
    """In the run's process before it execs: SIGINT (a clean stop) if this script dies."""
    signal_when_parent_dies(signal.SIGINT)


@dataclass
class Watch:
    """A launched run, watched until it exits: samples, the run's rows as they come,
    and how and when it was stopped."""

    proc: subprocess.Popen
    launched: float  # time.monotonic() just before the launch
    run_dir: Path
    settings: Settings
    sampler: TreeSampler
    launch_offset: float = math.inf  # see the module docstring's "Clock"
    log_series: list[tuple[float, int, float | None]] = field(default_factory=list)
    last_log_time: float = -math.inf
    dir_snapshots: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    shm_peak: int = 0  # /dev/shm's use, the whole machine's
    # Shared memory the run's processes map (run_shared_memory): (seconds, bytes).
    run_shm_series: list[tuple[float, int]] = field(default_factory=list)
    stop_reason: str | None = None  # "budget", "threshold", "interrupted"
    signalled_at: float | None = None  # seconds from launch of the SIGINT
    killed: bool = False
    threshold_seen_at: float | None = None
    leftover: list[str] = field(default_factory=list)  # processes left after the exit
    last_step: int = 0  # the newest logs.csv row's step

    def now(self) -> float:
        return time.monotonic() - self.launched

    def poll_files(self, logs: CsvTail, episodes: CsvTail, window: deque[float]) -> None:
        rows = logs.rows()
        # After the read: every row read was written before now, so now minus its time
        # is never less than the start-up.
        now = self.now()
        for row in rows:
            if not row.get("time") or not row.get("step"):
                continue
            seconds, step = float(row["time"]), int(float(row["step"]))
            self.last_step = max(self.last_step, step)
            # Kept at most every half second (a DQN logs hundreds of rows a second).
            if seconds - self.last_log_time >= 0.5:
                fill = row.get("replay_fill")
                self.log_series.append((seconds, step, float(fill) if fill else None))
                self.last_log_time = seconds
        if rows and rows[-1].get("time"):
            self.launch_offset = min(self.launch_offset, now - float(rows[-1]["time"]))
        for row in episodes.rows():
            if row.get("return"):
                window.append(float(row["return"]))
        if self.settings.score == EVALUATION:
            reached = any(
                float(row["eval_mean_return"]) >= self.settings.threshold
                for row in rows
                if row.get("eval_mean_return")
            )
        else:
            reached = (
                len(window) == window.maxlen
                and sum(window) / len(window) >= self.settings.threshold
            )
        if self.threshold_seen_at is None and reached:
            self.threshold_seen_at = self.now()

    def signal_stop(self, reason: str) -> None:
        if self.signalled_at is None and self.proc.poll() is None:
            self.stop_reason = reason
            self.signalled_at = self.now()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C

    def kill(self) -> None:
        """SIGKILL the run and every process of it that is left."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_members(list(self.sampler.members()))

    def watch(self) -> None:
        """Sample until the run exits, stopping it at the budget (or the threshold)."""
        settings = self.settings
        logs, episodes = CsvTail(self.run_dir / "logs.csv"), CsvTail(self.run_dir / "episodes.csv")
        window: deque[float] = deque(maxlen=settings.window)
        next_snapshot = 0.0
        while True:
            started = self.now()
            self.sampler.sample(started)
            self.shm_peak = max(self.shm_peak, shm_state().used)
            self.poll_files(logs, episodes, window)
            if started >= next_snapshot and self.log_series:  # from the first update on
                self.dir_snapshots.append((started, dir_sizes(self.run_dir)))
                shared = run_shared_memory(self.sampler.pids)  # maps take a while: not each second
                self.run_shm_series.append((started, shared))
                next_snapshot = started + DIR_SNAPSHOT_SECONDS
            if self.proc.poll() is not None:
                break
            if settings.stop_at_threshold and self.threshold_seen_at is not None:
                self.signal_stop("threshold")
            if started >= settings.budget:
                self.signal_stop("budget")
            if (
                self.signalled_at is not None
                and not self.killed
                and started - self.signalled_at > settings.exit_timeout
            ):
                self.kill()
            time.sleep(max(0.0, settings.sample_interval - (self.now() - started)))
        self.proc.wait()
        self.poll_files(logs, episodes, window)

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM of this script: stop the run as a user's Ctrl-C does, wait
        for it (a second one kills it), and leave nothing of it running."""
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.signal_stop("interrupted")
            try:
                self.proc.wait(self.settings.exit_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        except KeyboardInterrupt:
            self.kill()
        finally:
            self.proc.wait()
            self.leftover += leftovers(self.sampler)
            signal.signal(signal.SIGTERM, previous)


def leftovers(sampler: TreeSampler, seconds: float = LEFTOVER_SECONDS) -> list[str]:
    """Processes of the run still there `seconds` after its main process exited: killed,
    and described."""
    deadline = time.monotonic() + seconds
    members = sampler.members()
    while members and time.monotonic() < deadline:
        time.sleep(0.2)
        members = sampler.members()
    described = [f"{stat.comm} {pid}: {command_line(pid)[:120]}" for pid, stat in members.items()]
    kill_members(list(members))
    return described


def run_seed(settings: Settings, seed: int) -> dict[str, Any]:
    """Launch, watch and stop one run; its figures as a JSON-able dict."""
    xpid = xpid_for(settings.algo, settings.env, seed)
    runs_dir = settings.out / "runs"
    run_dir = runs_dir / xpid
    if run_dir.exists():
        raise BenchError(f"{run_dir} exists: the run would resume it, not start at launch")
    runs_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        str(ROOT / "monobeast.py"),
        *("--algo", settings.algo, "--env", settings.env, "--seed", str(seed)),
        *("--savedir", str(runs_dir), "--xpid", xpid),
        # parse_args took an --eval_interval among the flags into settings.eval_interval.
        *(("--eval_interval", str(settings.eval_interval)) if settings.score == EVALUATION else ()),
        *settings.flags,
    ]
    log_path = settings.out / f"{xpid}.log"
    shm_before = shm_state()
    with open(log_path, "w") as log:
        launched = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**_CLEAN_ENVIRON, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # its own process group and session: see TreeSampler
            preexec_fn=_tie_to_parent,
        )
    watch = Watch(proc, launched, run_dir, settings, TreeSampler(proc.pid, proc.pid))
    interrupted = False
    try:
        watch.watch()
    except KeyboardInterrupt:
        interrupted = True
        watch.interrupt()
    wall_clock = watch.now()
    watch.leftover += leftovers(watch.sampler)
    shm_after = shm_state()
    end_sizes = dir_sizes(run_dir)
    console = log_path.read_text(errors="replace")
    if proc.returncode not in (0, 130) and not watch.killed and not interrupted:
        last = console.strip().splitlines()[-1] if console.strip() else "no output"
        raise BenchError(
            f"seed {seed}: monobeast.py exited with {proc.returncode} after"
            f" {wall_clock:.0f} s: {last} (console: {log_path})"
        )
    run = summarize_run(
        watch,
        seed=seed,
        xpid=xpid,
        argv=argv,
        log_path=log_path,
        console=console,
        wall_clock=wall_clock,
        leftover=watch.leftover,
        shm=(shm_before, shm_after),
        end_sizes=end_sizes,
    )
    if interrupted:
        raise Interrupted(run)
    return run


# --- A run's figures ------------------------------------------------------------------


def _median_in(samples: Sequence[Sample], start: float, end: float, key: str) -> float:
    values = [getattr(s, key) for s in samples if start <= s.seconds <= end]
    return float(np.median(values)) if values else math.nan


def growth_window(
    warmup: float,
    stop: float,
    fill: Sequence[tuple[float, float]],
) -> tuple[float, float, str]:
    """(start, end, why) of the stretch where nothing should grow: from the end of
    warm-up, or from the first time the replay's fill (`fill`: (seconds from launch,
    fill) pairs) reached its final value if later, to the stop."""
    start, why = warmup, "after warm-up"
    if fill:
        final = max(value for _, value in fill)
        full = next(seconds for seconds, value in fill if value >= final - 1e-6)
        if full > start:
            start, why = full, f"after the replay reached its fill of {final:.3f}"
        else:
            why = f"after warm-up (the replay at its fill of {final:.3f})"
    return start, stop, why


def growth_findings(
    samples: Sequence[Sample],
    snapshots: Sequence[tuple[float, dict[str, int]]],
    window: tuple[float, float, str],
    shared: Sequence[tuple[float, int]] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The growth between `window`'s ends (its figures) and what of it is unexplained
    (the module docstring's rules), as lines. `shared`: (seconds, bytes) of the shared
    memory the run maps."""
    start, end, why = window
    figures: dict[str, Any] = {"from": start, "to": end, "why": why}
    if end - start < MIN_GROWTH_WINDOW:
        figures["judged"] = False
        return figures, []
    figures["judged"] = True
    edge = min(30.0, (end - start) / 5)  # medians over each end: one sample is noisy
    ends = ((start, start + edge), (end - edge, end))
    private = [_median_in(samples, a, b, "private_kib") / 1024 for a, b in ends]
    fds = [_median_in(samples, a, b, "fds") for a, b in ends]
    inside = [(t, size / MIB) for t, size in shared if start <= t <= end]
    mapped = [inside[0][1], inside[-1][1]] if len(inside) > 1 else [math.nan, math.nan]
    figures.update(private_mib=private, shared_mib=mapped, fds=fds)
    found = []
    for name, (first, last) in (
        ("private memory (summed RssAnon)", private),
        ("shared memory (each segment once)", mapped),
    ):
        if math.isfinite(first) and last - first > max(
            MEMORY_GROWTH_MIB, MEMORY_GROWTH_SHARE * first
        ):
            found.append(
                f"memory: the run's {name} grew {last - first:,.0f} MiB"
                f" ({first:,.0f} -> {last:,.0f}) between {start:.0f} and {end:.0f} s, {why}"
            )
    if math.isfinite(fds[0]) and fds[1] - fds[0] > FD_GROWTH:
        found.append(
            f"open files: {fds[0]:.0f} -> {fds[1]:.0f} between {start:.0f} and {end:.0f} s, {why}"
        )
    before = next(((t, sizes) for t, sizes in snapshots if t >= start), None)
    after = next(((t, sizes) for t, sizes in reversed(snapshots) if t <= end), None)
    if before is None or after is None or after[0] <= before[0]:
        return figures, found
    hours = (after[0] - before[0]) / 3600
    old, new = before[1], after[1]
    grown = {name: size - old.get(name, 0) for name, size in new.items() if size != old.get(name)}
    logs = sum(size for name, size in grown.items() if LOG_FILES.match(os.path.basename(name)))
    figures["logs_mib_per_hour"] = logs / MIB / hours
    if logs / MIB / hours > LOG_GROWTH_MIB_PER_HOUR:
        found.append(
            f"logs: logs.csv, episodes.csv and TensorBoard files grew {logs / MIB / hours:,.1f}"
            f" MiB/h, {why}"
        )
    for name, growth in sorted(grown.items()):
        base = os.path.basename(name)
        if LOG_FILES.match(base):
            continue
        if CHECKPOINTS.match(base):
            # From its first rewrite in the window: the file on disk when the window opens
            # was written up to a --checkpoint_interval earlier, with the replay not yet full.
            first = next(
                (
                    sizes[name]
                    for t, sizes in snapshots
                    if before[0] < t <= after[0] and sizes.get(name) != old.get(name)
                ),
                None,
            )
            if old.get(name) and first and new[name] - first > CHECKPOINT_GROWTH_SHARE * first:
                found.append(f"checkpoint: {name} grew {first:,} -> {new[name]:,} B, {why}")
        elif name not in old:
            found.append(f"files: {name} appeared ({new[name]:,} B), {why}")
        elif growth > 0:
            found.append(f"files: {name} grew {old[name]:,} -> {new[name]:,} B, {why}")
    return figures, found


def _sizes_mib(sizes: dict[str, int] | None) -> float | None:
    return None if sizes is None else sum(sizes.values()) / MIB


def summarize_run(
    watch: Watch,
    *,
    seed: int,
    xpid: str,
    argv: list[str],
    log_path: Path,
    console: str,
    wall_clock: float,
    leftover: list[str],
    shm: tuple[ShmState, ShmState],
    end_sizes: dict[str, int],
) -> dict[str, Any]:
    settings = watch.settings
    offset = watch.launch_offset if math.isfinite(watch.launch_offset) else None
    episodes = read_episodes(watch.run_dir / "episodes.csv", offset or 0.0)
    curve = score_curve(episodes, watch.run_dir, offset or 0.0, settings)
    crossing = crossing_of(curve.scores, settings.threshold)

    def at(index: int | None) -> dict[str, float] | None:
        if index is None or offset is None:
            return None
        return {"seconds": float(curve.seconds[index]), "step": int(curve.steps[index])}

    sps, sps_error = None, None
    if offset is not None:
        try:
            sps = steady_sps(watch.run_dir / "logs.csv", settings.warmup - offset)
        except (RuntimeError, ZeroDivisionError):
            sps_error = f"fewer than two updates after {settings.warmup:g} s"
    series = [(t + (offset or 0.0), step, fill) for t, step, fill in watch.log_series]
    stop = watch.signalled_at if watch.signalled_at is not None else wall_clock
    fill = [(t, f) for t, _, f in series if f is not None]
    window = growth_window(settings.warmup, stop, fill)
    growth, findings = growth_findings(
        watch.sampler.samples, watch.dir_snapshots, window, watch.run_shm_series
    )
    shm_before, shm_after = shm
    left_in_shm = sorted(shm_after.entries - shm_before.entries)
    if left_in_shm:
        findings.append(f"/dev/shm: the run left {', '.join(left_in_shm)}")
    if leftover:
        findings.append(f"processes left after the run's exit (killed): {'; '.join(leftover)}")
    if watch.killed:
        findings.append(
            f"the run did not exit within {settings.exit_timeout:.0f} s of SIGINT: killed"
        )
    snapshots = watch.dir_snapshots
    at_warmup = next((s for t, s in snapshots if t >= settings.warmup), None)
    peak_sample = max(watch.sampler.samples, key=lambda s: s.rss_kib, default=None)
    processes = sorted(watch.sampler.records.values(), key=lambda r: (r.first_seen, r.pid))
    reason = watch.stop_reason or ("finished" if watch.proc.returncode == 0 else "failed")
    return {
        "seed": seed,
        "xpid": xpid,
        "run_dir": str(watch.run_dir),
        "console": str(log_path),
        "argv": argv[1:],
        "exit_code": watch.proc.returncode,
        "stopped": reason,
        "stop_signalled_at": watch.signalled_at,
        "wall_clock": wall_clock,
        "launch_offset": offset,
        "threshold": settings.threshold,
        "window": settings.window,
        "score": settings.score,
        "reached": at(crossing.index),
        "threshold_seen_at": watch.threshold_seen_at,
        "best_mean": crossing.best,
        "best_at": at(crossing.best_index),
        "final_mean": float(curve.scores[-1]) if len(curve.scores) else math.nan,
        # The training episodes' best mean of `window`, whatever the score: with
        # --score evaluation it shows what exploration costs the training returns.
        "episodes_best_mean": first_crossing(episodes.returns, math.inf, settings.window).best,
        "evaluations": len(curve.scores) if settings.score == EVALUATION else None,
        "episodes": len(episodes.returns),
        "agent_steps": watch.last_step,
        "steady_sps": sps,
        "steady_sps_error": sps_error,
        "learner_threads": learner_threads(console),
        "start_line": next(
            (line for line in console.splitlines() if line.startswith("[beast] run ")), None
        ),
        "processes": [dataclasses.asdict(record) for record in processes],
        "peak_summed_rss_mib": peak_sample.rss_kib / 1024 if peak_sample else None,
        "peak_summed_rss_at": peak_sample.seconds if peak_sample else None,
        "samples": [dataclasses.astuple(s) for s in watch.sampler.samples],
        "log_series": series,
        "shm_mib": {
            "before": shm_before.used / MIB,
            "peak": max(watch.shm_peak, shm_before.used) / MIB,
            "after": shm_after.used / MIB,
            "mapped_by_the_run_peak": max((b for _, b in watch.run_shm_series), default=0) / MIB,
            "left": left_in_shm,
        },
        "run_dir_mib": {
            "first_update": _sizes_mib(snapshots[0][1]) if snapshots else None,
            "warmup_end": _sizes_mib(at_warmup),
            "last_running": _sizes_mib(
                next((sizes for t, sizes in reversed(snapshots) if t <= stop), None)
            ),
            "end": _sizes_mib(end_sizes),
        },
        "run_dir_files": {
            "first_update": snapshots[0][1] if snapshots else {},
            "end": end_sizes,
        },
        "growth": growth,
        "findings": findings,
    }


# --- Reports -------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "not reached"
    return f"{value:,.0f} s ({value / 60:.1f} min)"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def process_lines(run: dict[str, Any]) -> list[str]:
    """Peak RSS by role: each role's processes and their peaks (MiB)."""
    by_role: dict[str, list[dict[str, Any]]] = {}
    for record in run["processes"]:
        by_role.setdefault(record["role"], []).append(record)
    lines = []
    for role, records in by_role.items():
        peaks = ", ".join(f"{r['peak_rss_kib'] / 1024:,.0f}" for r in records)
        lines.append(f"{role} x{len(records)}: {peaks}")
    return lines


def score_words(settings: Settings) -> str:
    """What a score is, for reports and plots."""
    if settings.score == EVALUATION:
        return (
            f"an evaluation's mean return, the greedy policy, every"
            f" {settings.eval_interval:,} agent steps"
        )
    return f"mean of the last {settings.window} episodes"


def run_report(run: dict[str, Any], settings: Settings) -> list[str]:
    reached = run["reached"]
    to = (
        f"{_seconds(reached['seconds'])}, {reached['step']:,} agent steps"
        if reached
        else "not reached"
    )
    sps_note = f" ({run['steady_sps_error']})" if run["steady_sps_error"] else ""
    best = run["best_at"]
    best_text = f"{_num(run['best_mean'], 2)}"
    if best:
        best_text += f" at {best['seconds']:,.0f} s ({best['step']:,} steps)"
    lines = [
        f"## seed {run['seed']}: {settings.algo} on {settings.env}, stopped: {run['stopped']},"
        f" exit {run['exit_code']} after {run['wall_clock']:,.1f} s from launch",
        f"- to {settings.threshold:g} ({score_words(settings)}): {to}",
        f"- best score: {best_text}; last: {_num(run['final_mean'], 2)};"
        f" {run['episodes']:,} training episodes"
        + (
            f" (best mean of {settings.window}: {_num(run['episodes_best_mean'], 2)}),"
            f" {run['evaluations']} evaluations"
            if settings.score == EVALUATION
            else ""
        )
        + f", {run['agent_steps']:,} agent steps",
        f"- steady SPS: {_num(run['steady_sps'], 0)} agent steps/s (from {settings.warmup:g} s"
        f" after launch to the last update){sps_note}; learner threads"
        f" {run['learner_threads'] or '?'}",
        f"- launch to the run's clock: {_num(run['launch_offset'], 2)} s",
        f"- peak RSS (MiB), summed over the run's processes:"
        f" {_num(run['peak_summed_rss_mib'], 0)}; per process: {'; '.join(process_lines(run))}",
        f"- shared memory (MiB): the run's processes mapped"
        f" {run['shm_mib']['mapped_by_the_run_peak']:,.0f} at the peak (each segment once);"
        f" /dev/shm, the whole machine's: {run['shm_mib']['before']:,.0f} before,"
        f" {run['shm_mib']['peak']:,.0f} at the peak, {run['shm_mib']['after']:,.0f} after;"
        f" left there: {', '.join(run['shm_mib']['left']) or 'nothing'}",
        "- run directory (MiB): "
        + ", ".join(
            f"{_num(run['run_dir_mib'][key], 2)} {label}"
            for key, label in (
                ("first_update", "at the first update"),
                ("warmup_end", "at the end of warm-up"),
                ("last_running", "at the stop"),
                ("end", "after the exit"),
            )
        ),
        "- growth the replay's fill does not explain: "
        + (
            "; ".join(f"**{line}**" for line in run["findings"])
            if run["findings"]
            else (
                "none"
                + (
                    f" ({run['growth']['why']}, {run['growth']['from']:.0f}-"
                    f"{run['growth']['to']:.0f} s)"
                    if run["growth"].get("judged")
                    else " found, but the run was too short to judge memory and files"
                )
            )
        ),
    ]
    if run.get("png"):
        lines.append(f"- curve: {run['png']}")
    return lines


FIGURES = (
    ("seconds_to_threshold", "wall-clock to the threshold (s)"),
    ("steps_to_threshold", "agent steps to the threshold"),
    ("best_mean", "best score"),
    ("steady_sps", "steady SPS"),
    ("peak_summed_rss_mib", "peak summed RSS (MiB)"),
)


def figure_values(run: dict[str, Any]) -> dict[str, float]:
    reached = run["reached"]
    return {
        "seconds_to_threshold": reached["seconds"] if reached else math.inf,
        "steps_to_threshold": reached["step"] if reached else math.inf,
        "best_mean": run["best_mean"],
        "steady_sps": run["steady_sps"] if run["steady_sps"] is not None else math.nan,
        "peak_summed_rss_mib": run["peak_summed_rss_mib"] or math.nan,
    }


def across_seeds(runs: Sequence[dict[str, Any]], reps: int) -> dict[str, Aggregate]:
    """Each figure's Aggregate over the runs that have it (nan: a run without one)."""
    result = {}
    for key, _ in FIGURES:
        values = [figure_values(run)[key] for run in runs]
        values = [v for v in values if not math.isnan(v)]
        if values:
            result[key] = aggregate(values, reps)
    return result


def _value(value: float, key: str) -> str:
    if math.isinf(value):
        return "not reached"
    digits = 2 if key == "best_mean" else 0
    return f"{value:,.{digits}f}"


def across_report(aggregates: dict[str, Aggregate], seeds: int, reps: int) -> list[str]:
    lines = [
        f"## across {seeds} seed(s): median and interquartile mean, 95% intervals from a"
        f" stratified bootstrap ({reps:,} resamples; rliable's definitions)",
        "",
        "| figure | per seed | median [95% CI] | IQM [95% CI] |",
        "|---|---|---|---|",
    ]
    for key, label in FIGURES:
        if key not in aggregates:
            continue
        a = aggregates[key]
        lines.append(
            f"| {label} | {', '.join(_value(v, key) for v in a.values)} |"
            f" {_value(a.median, key)} [{_value(a.median_ci[0], key)},"
            f" {_value(a.median_ci[1], key)}] | {_value(a.iqm, key)}"
            f" [{_value(a.iqm_ci[0], key)}, {_value(a.iqm_ci[1], key)}] |"
        )
    if seeds < 4:
        lines.append("")
        lines.append(
            f"With {seeds} seed(s) the IQM cuts nothing (rliable cuts int(n / 4) scores from"
            " each end): it is the mean."
        )
    return lines


# --- Plots ----------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run: dict[str, Any], settings: Settings, path: Path) -> None:
    """Return against wall-clock and agent steps, SPS and summed RSS against wall-clock."""
    plt = _pyplot()
    offset = run["launch_offset"] or 0.0
    episodes = read_episodes(Path(run["run_dir"]) / "episodes.csv", offset)
    curve = score_curve(episodes, Path(run["run_dir"]), offset, settings)
    marker = "o" if settings.score == EVALUATION else None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, x, x_curve, label in (
        (axes[0, 0], episodes.seconds / 60, curve.seconds / 60, "minutes from launch"),
        (axes[0, 1], episodes.steps, curve.steps, "agent steps"),
    ):
        ax.scatter(x, episodes.returns, s=3, alpha=0.25, color="gray", label="training episode")
        ax.plot(x_curve, curve.scores, color="C0", marker=marker, label=score_words(settings))
        ax.axhline(settings.threshold, color="C3", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.set_xlim(left=0)
    reached = run["reached"]
    if reached:
        axes[0, 0].axvline(reached["seconds"] / 60, color="C3", linewidth=1)
        axes[0, 1].axvline(reached["step"], color="C3", linewidth=1)
    axes[0, 0].legend(loc="best")
    series = run["log_series"]
    if len(series) > 1:
        times = np.array([s[0] for s in series])
        steps = np.array([s[1] for s in series], dtype=np.float64)
        # SPS over about 30 s: rows are kept every half second or more.
        lag = max(1, int(np.searchsorted(times, times[0] + 30.0)))
        if lag < len(times):
            rates = (steps[lag:] - steps[:-lag]) / (times[lag:] - times[:-lag])
            axes[1, 0].plot(times[lag:] / 60, rates)
    if run["steady_sps"]:
        axes[1, 0].axhline(run["steady_sps"], color="C3", linestyle="--", linewidth=1)
    axes[1, 0].set_xlim(left=0)
    axes[1, 0].set_xlabel("minutes from launch")
    axes[1, 0].set_ylabel("agent steps/s (30 s windows)")
    samples = np.array(run["samples"], dtype=np.float64).reshape(-1, 4)
    axes[1, 1].plot(samples[:, 0] / 60, samples[:, 1] / 2**20)
    axes[1, 1].set_xlabel("minutes from launch")
    axes[1, 1].set_ylabel("summed RSS of the run's processes (GiB)")
    fig.suptitle(
        f"{settings.algo} {settings.env} seed {run['seed']}: to {settings.threshold:g}"
        f" {_seconds(reached['seconds']) if reached else 'not reached'}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_seeds(runs: Sequence[dict[str, Any]], settings: Settings, path: Path) -> None:
    """Every seed's score against wall-clock and agent steps."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        run_dir, offset = Path(run["run_dir"]), run["launch_offset"] or 0.0
        episodes = read_episodes(run_dir / "episodes.csv", offset)
        curve = score_curve(episodes, run_dir, offset, settings)
        axes[0].plot(curve.seconds / 60, curve.scores, label=f"seed {run['seed']}")
        axes[1].plot(curve.steps, curve.scores, label=f"seed {run['seed']}")
    for ax, label in zip(axes, ("minutes from launch", "agent steps"), strict=True):
        ax.axhline(settings.threshold, color="C3", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.set_xlim(left=0)
        ax.set_ylabel(score_words(settings))
    axes[0].legend(loc="best")
    fig.suptitle(f"{settings.algo} {settings.env}, {len(runs)} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- Command line ----------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds from "90", "90s", "20m" or "2h"."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90, 90s, 20m or 2h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


# Flags the benchmark sets on every run.
OWN_FLAGS = ("--seed", "--savedir", "--xpid", "--algo", "--env")


def flag_value(flags: Sequence[str], name: str) -> str | None:
    """The value of monobeast.py flag `name` among `flags` (`--name V` or `--name=V`), the
    last one given; None if it is not there."""
    value = None
    for index, flag in enumerate(flags):
        if flag.startswith(name + "="):
            value = flag.partition("=")[2]
        elif flag == name and index + 1 < len(flags):
            value = flags[index + 1]
    return value


def envs_act_alike(algo: str, env: str, flags: Sequence[str]) -> bool:
    """Whether every env of the run acts with the same parameters. Ape-X's and R2D2's
    (`--exploration per_env`) give each env its own epsilon, 0.4 down to 0.0007: their
    training episodes mix those rates, and their mean stays below the policy's score.
    Read as the run reads its flags (its config file included) and asked of the acting
    rule it builds, so that the benchmark names no algorithm."""
    from beast.algos.build import build_algorithm
    from beast.envs import probe_spec
    from beast.run.parsing import parse_args as parse_run_args

    with contextlib.chdir(ROOT):  # where run_seed starts the run: a relative --config
        config = parse_run_args(["--algo", algo, "--env", env, *flags], prog="monobeast.py")
    rule = build_algorithm(config, probe_spec(env)).acting_rule()
    params = rule.env_params(ENVS_PROBED)
    return all(np.all(values == values[:1]) for values in params.values())


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default=DEFAULT_ALGO)
    parser.add_argument("--env", default=DEFAULT_ENV)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument(
        "--budget",
        type=parse_duration,
        default=DEFAULT_BUDGET,
        help="wall-clock per seed from launch: 90, 90s, 20m, 2h (default 20m)",
    )
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="episodes per mean")
    parser.add_argument(
        "--score",
        choices=(AUTO, EPISODES, EVALUATION),
        default=AUTO,
        help="what the threshold is judged on: the mean of the last --window training"
        " episodes, or each evaluation's mean return (the greedy policy, monobeast.py's"
        " --eval_interval); auto: evaluation for runs whose envs explore at different"
        " rates (--exploration per_env: Ape-X, R2D2), else episodes",
    )
    parser.add_argument(
        "--eval_interval",
        type=int,
        default=DEFAULT_EVAL_INTERVAL,
        help="agent steps between evaluations with --score evaluation (default 100000;"
        " an --eval_interval after -- wins)",
    )
    parser.add_argument(
        "--warmup",
        type=parse_duration,
        default=DEFAULT_WARMUP,
        help="seconds from launch before SPS and growth count (default 60)",
    )
    parser.add_argument(
        "--stop_at_threshold",
        action="store_true",
        help="stop a run once it reaches the threshold (default: run to the budget)",
    )
    parser.add_argument("--out", default=None, help="output directory (default: a new temp dir)")
    parser.add_argument("--sample_interval", type=parse_duration, default=DEFAULT_SAMPLE_INTERVAL)
    parser.add_argument("--exit_timeout", type=parse_duration, default=DEFAULT_EXIT_TIMEOUT)
    parser.add_argument("--bootstrap_reps", type=int, default=BOOTSTRAP_REPS)
    parser.add_argument("flags", nargs="*", help="monobeast.py flags for every run (after --)")
    args = parser.parse_args(argv)
    for flag in args.flags:
        if flag.split("=")[0] in OWN_FLAGS:
            parser.error(f"{flag.split('=')[0]} is the benchmark's own: use its option instead")
    if args.window < 1 or args.bootstrap_reps < 1 or args.eval_interval < 1:
        parser.error("--window, --bootstrap_reps and --eval_interval must be positive")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds repeats a seed: {args.seeds}")
    score = args.score
    if score == AUTO:
        try:
            alike = envs_act_alike(args.algo, args.env, args.flags)
        except (OSError, ValueError) as error:  # ConfigError, EnvError: as monobeast.py says
            print(f"{PROG}: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        score = EPISODES if alike else EVALUATION
    eval_interval = args.eval_interval
    given = flag_value(args.flags, "--eval_interval")
    if given is not None:
        if not given.isdigit() or int(given) < 1:
            parser.error(f"--eval_interval {given}: the benchmark needs a positive step count")
        eval_interval = int(given)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="beast-atari-"))
    return Settings(
        algo=args.algo,
        env=args.env,
        seeds=tuple(args.seeds),
        budget=args.budget,
        threshold=args.threshold,
        window=args.window,
        warmup=args.warmup,
        stop_at_threshold=args.stop_at_threshold,
        flags=tuple(args.flags),
        out=out.resolve(),
        sample_interval=args.sample_interval,
        exit_timeout=args.exit_timeout,
        bootstrap_reps=args.bootstrap_reps,
        score=score,
        eval_interval=eval_interval,
    )


def _json_safe(value: Any) -> Any:
    """inf and nan as strings (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_summary(
    settings: Settings, header: list[str], runs: list[dict[str, Any]], error: str | None
) -> list[str]:
    """summary.json, summary.md and curves.png in `settings.out`; the across-seeds lines."""
    aggregates = across_seeds(runs, settings.bootstrap_reps) if runs else {}
    lines = across_report(aggregates, len(runs), settings.bootstrap_reps) if runs else []
    if len(runs) > 1:
        plot_seeds(runs, settings, settings.out / "curves.png")
        lines.append(f"\ncurves: {settings.out / 'curves.png'}")
    settings_dict = {k: str(v) if isinstance(v, Path) else v for k, v in vars(settings).items()}
    summary = {
        "header": header,
        "settings": settings_dict,
        "runs": runs,
        "across_seeds": {key: dataclasses.asdict(a) for key, a in aggregates.items()},
        "error": error,
    }
    with open(settings.out / "summary.json", "w") as f:
        json.dump(_json_safe(summary), f, indent=1)
    markdown = [*header, ""]
    for run in runs:
        markdown += [*run_report(run, settings), ""]
    markdown += lines
    if error:
        markdown += ["", f"stopped by an error: {error}"]
    (settings.out / "summary.md").write_text("\n".join(markdown) + "\n")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    settings.out.mkdir(parents=True, exist_ok=True)
    extra = " ".join(settings.flags) or "(none)"
    header = [
        f"# {settings.algo} on {settings.env}: time to {settings.threshold:g}"
        f" ({score_words(settings)}) from launch, {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        f"machine: {machine_description()}",
        f"seeds {', '.join(map(str, settings.seeds))}, one after the other; budget"
        f" {settings.budget:g} s per seed"
        + (", stopped at the threshold" if settings.stop_at_threshold else "")
        + f"; warm-up {settings.warmup:g} s; extra monobeast.py flags: {extra};"
        f" output in {settings.out}",
    ]
    print("\n".join(header), flush=True)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Both set explicitly: a shell starts a background job with SIGINT ignored, and
    # `kill -INT` must still stop it and its run.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, terminate)
    runs: list[dict[str, Any]] = []
    error = None

    def report(run: dict[str, Any]) -> None:
        png = settings.out / f"{run['xpid']}.png"
        plot_run(run, settings, png)
        run["png"] = str(png)
        runs.append(run)
        print("\n" + "\n".join(run_report(run, settings)), flush=True)

    try:
        for seed in settings.seeds:
            report(run_seed(settings, seed))
    except BenchError as failure:
        error = str(failure)
    except (Interrupted, KeyboardInterrupt) as stop:
        if isinstance(stop, Interrupted):
            report(stop.run)  # the run stopped short: its figures so far
        write_summary(settings, header, runs, "interrupted")
        print(f"{PROG}: interrupted; the runs' figures are in {settings.out}", file=sys.stderr)
        raise SystemExit(130) from None
    lines = write_summary(settings, header, runs, error)
    if lines:
        print("\n" + "\n".join(lines), flush=True)
    print(f"\nsummary: {settings.out / 'summary.md'}, {settings.out / 'summary.json'}")
    if error:
        print(f"{PROG}: {error}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
