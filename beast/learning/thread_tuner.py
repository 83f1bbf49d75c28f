"""The learner's torch thread count: measured in the run, remembered for the next.

What a second intra-op thread is worth depends on everything else the run does on the
machine: it halves a large update's time on an idle core, and slows a small one whose
actor wakes up between its parallel regions (each preemption stalls the other thread at
the region's barrier). `ThreadTuner` therefore measures it in the run (beast/run/plan.py
starts it where `--num_threads` is unset on a CPU learner with several cores; the
learner's `step` calls it after each update, in the learner's threads and under
--serial alike).

Measuring costs: the windows at the losing count run slower (a DQN CartPole run went
from 1,600 to 750-900 agent steps/s in its 2-thread windows, about 3 s of a 25 s race).
So the choice is kept by setup (`setup_key`: the run's flags but its identity, the CPU,
the candidates, torch's version and beast's code) beside the compiled graphs
(beast/util/records.py), and a later run of the same setup starts at the remembered count
without measuring, as --compile auto starts from its records. A new version of beast
measures again: what it changed in the learner's or the actors' cost can move the
balance (a compiled step made DQN's learner 2x faster), and a choice measured once
would otherwise hold for every later version.

A remembered count is measured again, rather than kept for good, when its figures say
the measurement was unsound: when they are implausible (agent steps/s more than
PLAUSIBLE_RATIO apart between the counts: a start-up on a 2-core machine remembered "134
with 1, 2 with 2" and kept 1 thread for every later run), when they are older than
RECORD_MAX_AGE, and when other processes than the run's used more than BUSY_SHARE of
the machine while they were measured (`others_cpu_seconds`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from beast.config import RUN_NAMING_FLAGS, Config
from beast.util.records import read_record, record_path, source_digest, write_record

__all__ = [
    "BUSY_SHARE",
    "PLAUSIBLE_RATIO",
    "RECORD_FILE",
    "RECORD_MAX_AGE",
    "SMALL_MODEL_PARAMETERS",
    "ThreadTuner",
    "learner_threads",
    "others_cpu_seconds",
    "setup_key",
    "thread_tuner_for",
]

RECORD_FILE = "beast_threads.json"
# The widest gap between the candidates' agent steps/s a sound measurement shows: a second
# thread at most halves an update, and the worst it cost a run here was 1.35x (SAC
# HalfCheetah beside its actor, `learner_threads`); figures further apart mean a window
# was disturbed (another program, a stall).
PLAUSIBLE_RATIO = 4.0
# How long a remembered count holds: what else runs on the machine changes.
RECORD_MAX_AGE = 7 * 24 * 3600.0
# The share of the machine's CPU time that other processes may have used while the
# counts were measured (a quarter: on 2 cores half a core, about what a second thread
# stands to gain): above it, the windows measured the other work as much as the run.
BUSY_SHARE = 0.25
# Flags that name or bound a run but do not change what its learner and actors do per
# step: runs differing only in these share a remembered thread count.
_RUN_IDENTITY = RUN_NAMING_FLAGS | {"config", "total_steps", "stop_step", "max_nonfinite_updates"}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _proc_stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks used by the process and the children it waited for) of
    /proc/PID/stat, or None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    # state ppid ... utime(11) stime(12) cutime(13) cstime(14), counted from state.
    return int(fields[1]), sum(int(v) for v in fields[11:15])


def others_cpu_seconds(root: int | None = None) -> float:
    """CPU-seconds used since boot by the processes outside this run: the machine's busy
    time (/proc/stat: user, nice, system, irq, softirq, steal) less that of this process
    (or `root`) and its descendants (the fork server, its actors, evaluators). 0.0 where
    /proc cannot be read: the tuner then sees an idle machine, as before it looked."""
    try:
        with open("/proc/stat") as file:
            cpu = [int(v) for v in file.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    machine = sum(cpu[i] for i in (0, 1, 2, 5, 6, 7) if i < len(cpu))
    parents: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _proc_stat(name)) is not None:
            parents.setdefault(stat[0], []).append(int(name))
            ticks[int(name)] = stat[1]
    run, pending = 0, [os.getpid() if root is None else root]
    while pending:
        pid = pending.pop()
        run += ticks.get(pid, 0)
        pending += parents.get(pid, [])
    return max(0, machine - run) / os.sysconf("SC_CLK_TCK")


def setup_key(config: Any, candidates: Sequence[int]) -> str:
    """What identifies a setup whose best thread count carries over between runs: every
    flag of `config` (a dataclass) but the run's identity (`_RUN_IDENTITY`), the CPU's
    name, the candidate counts, torch's version and beast's code (`source_digest`)."""
    flags = sorted(
        (field.name, repr(getattr(config, field.name)))
        for field in dataclasses.fields(config)
        if field.name not in _RUN_IDENTITY
    )
    text = repr((flags, _cpu_name(), sorted(set(candidates)), torch.__version__))
    return hashlib.sha1(text.encode() + source_digest()).hexdigest()


class ThreadTuner:
    """Picks the learner's torch thread count (module docstring).

    After a warm-up (compilation done, replay filled), the tuner runs the learner at each
    candidate count in turn for `window_seconds`, `rounds` times (alternating, so that a
    drifting machine favours neither), compares the agent steps per second the run made
    in those windows (what a user waits for, actors and learner together), keeps the best
    (a larger count only if it is at least `margin` better), and says so once. With a
    `record_key` (`setup_key`), the choice is saved under it with its figures, its time
    and the share of the machine other processes used meanwhile (`others_cpu`: their
    cumulative CPU-seconds, over `machine_cores`), and a run that finds a sound one saved
    (module docstring) takes it at its first update instead of measuring.
    """

    def __init__(
        self,
        candidates: Sequence[int],
        log: Callable[[str], None],
        *,
        record_key: str | None = None,
        warmup_seconds: float = 10.0,
        window_seconds: float = 3.0,
        rounds: int = 2,
        margin: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        others_cpu: Callable[[], float] = others_cpu_seconds,
        machine_cores: int | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.candidates = sorted(set(candidates))
        self.log = log
        self.record_key = record_key
        self.window_seconds = window_seconds
        self.margin = margin
        self.clock = clock
        self.set_threads = set_threads
        self.others_cpu = others_cpu
        self.machine_cores = machine_cores or os.cpu_count() or 1
        self.wall_clock = wall_clock
        self._others_at: tuple[float, float] | None = None  # (clock, others_cpu) at the start
        self._unsound: str | None = None  # why a remembered count is measured again
        self._plan = [c for _ in range(rounds) for c in self.candidates]
        self._rates: dict[int, list[float]] = {c: [] for c in self.candidates}
        self._warmup_seconds = warmup_seconds
        self._started: float | None = None
        self._window: tuple[int, float, int] | None = None  # count, start time, start step
        self.chosen: int | None = None if len(self.candidates) > 1 else self.candidates[0]
        self._remembered = self._recall() if self.chosen is None else None

    def _recall(self) -> tuple[int, dict[int, float]] | None:
        """The saved choice for this setup, if it is one of the candidates and sound
        (module docstring); else None, with why in `_unsound` if there was one."""
        if self.record_key is None:
            return None
        saved = read_record(RECORD_FILE, self.record_key)
        count, rates = saved.get("threads"), saved.get("rates", {})
        if count not in self.candidates or not isinstance(rates, dict):
            return None
        try:
            rates = {int(c): float(r) for c, r in rates.items()}
        except (TypeError, ValueError):
            return None
        self._unsound = self._why_unsound(saved, rates)
        return None if self._unsound else (count, rates)

    def _why_unsound(self, saved: dict[str, Any], rates: dict[int, float]) -> str | None:
        """Why a remembered measurement is not to be kept, or None."""
        measured = ", ".join(f"{rates[c]:,.0f} with {c}" for c in sorted(rates))
        if sorted(rates) != self.candidates or not all(
            0 < r < float("inf") for r in rates.values()
        ):
            return f"its figures are incomplete ({measured or 'none'})"
        if max(rates.values()) > PLAUSIBLE_RATIO * min(rates.values()):
            return f"its figures are implausible ({measured} agent steps/s)"
        measured_at, share = saved.get("measured_at"), saved.get("others_share")
        if not isinstance(measured_at, int | float) or not isinstance(share, int | float):
            return "it was recorded without its time and the machine's load"
        age = self.wall_clock() - measured_at
        if age > RECORD_MAX_AGE:
            return f"it was measured {age / 86400:.0f} days ago"
        if share > BUSY_SHARE:
            return f"other processes used {share:.0%} of the machine while it was measured"
        return None

    def after_update(self, step: int, updates_ready: bool) -> None:
        """Called after each update with the run's agent step; `updates_ready`: the
        update takes its steady path (its compilation decided)."""
        if self.chosen is not None:
            return
        if self._remembered is not None:
            count, rates = self._remembered
            self._settle(
                count,
                rates,
                "measured in an earlier run of this setup; delete its entry in"
                f" {record_path(RECORD_FILE)} to measure again",
            )
            return
        now = self.clock()
        if self._started is None:
            if updates_ready:
                self._started = now
            return
        if self._window is None:
            if now - self._started < self._warmup_seconds:
                return
            self._others_at = (now, self.others_cpu())
            self._open(step, now)
            return
        count, opened, first_step = self._window
        if now - opened < self.window_seconds:
            return
        self._rates[count].append((step - first_step) / (now - opened))
        if self._plan:
            self._open(step, now)
        else:
            self._choose()

    def _open(self, step: int, now: float) -> None:
        count = self._plan.pop(0)
        self.set_threads(count)
        self._window = (count, now, step)

    def _choose(self) -> None:
        rates = {c: sum(r) / len(r) for c, r in self._rates.items()}
        best = self.candidates[0]
        for count in self.candidates[1:]:
            if rates[count] > rates[best] * (1.0 + self.margin):
                best = count
        assert self._others_at is not None
        opened, others = self._others_at
        seconds = max(self.clock() - opened, 1e-9)
        share = max(0.0, self.others_cpu() - others) / (seconds * self.machine_cores)
        if self.record_key is not None:
            saved = {
                "threads": best,
                "rates": {str(c): r for c, r in rates.items()},
                "measured_at": self.wall_clock(),
                "others_share": round(share, 3),
            }
            write_record(RECORD_FILE, self.record_key, saved)
        source = "measured in this run"
        if self._unsound:
            source += f" (the remembered count was not kept: {self._unsound})"
        if share > BUSY_SHARE:
            source += (
                f", while other processes used {share:.0%} of the machine: the next run"
                " measures again"
            )
        self._settle(best, rates, source)

    def _settle(self, count: int, rates: dict[int, float], source: str) -> None:
        self.chosen = count
        self.set_threads(count)
        measured = ", ".join(f"{rates[c]:,.0f} with {c}" for c in sorted(rates))
        self.log(
            f"learner threads: {count} (agent steps/s {measured}, {source}; --num_threads fixes it)"
        )


# Below this many parameters a CPU learner runs one torch thread (`learner_threads`).
SMALL_MODEL_PARAMETERS = 1_000_000


def learner_threads(
    config: Config, device: torch.device, precision: str, num_parameters: int
) -> int | None:
    """torch intra-op threads the learner starts with; None keeps torch's default (CPU
    count). Unless --num_threads fixes it, the run then measures one thread against all
    of them, beside its actors, and keeps the better (`ThreadTuner`): the
    figures below are why it starts where it does.

    A CPU bf16 learner gets 1 thread when the actors already fill the cores: its
    oneDNN kernels stall each time one of their threads is preempted. On 2 cores with
    2 actors, a 2-thread bf16 update went from 206 ms alone to 0.4-5.6 s beside the
    actors, a 1-thread one from 334 to 447 ms; end to end, 1 thread gave 1,339-1,381
    steps/s and 2 threads 1,118-1,231 (benchmarks/RESULTS.md).

    A small model (under SMALL_MODEL_PARAMETERS: the MLPs of classic control and MuJoCo)
    gets 1 thread too: its matrices are too small for a second thread to pay for the
    hand-off. PPO on CartPole-v1 took 30 s with 2 threads and 18 s with 1 on 2 cores. Even
    beside one actor that mostly waits (SAC on HalfCheetah, one actor with one env), a
    second thread lost: 55 env steps/s against 74 with 1, though alone a 2-thread update
    took 9.0 ms and a 1-thread one 12.5 (the actor's few wake-ups preempt the second
    thread, and the first waits for it at every parallel region). With the compiled
    update (2026-11-26, quiet machine, env steps 2,000-4,000): alone 4.9 ms at 2 threads
    against 8.6-9.0 at 1; end to end 108.7 steps/s at 1 thread, 89.8 at 2, 97.7 at 2 with
    the actor looking at the rate limit every 20 ms instead of 2; and 124.3 at 2 under
    --serial, where the actor steps between updates instead of beside them. A second
    thread pays only when nothing else runs during the update.
    """
    if config.num_threads:
        return config.num_threads
    if device.type != "cpu":
        return None
    cores = len(os.sched_getaffinity(0))
    if precision == "bf16" and config.num_actors >= cores:
        return 1
    if num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return None


def thread_tuner_for(
    config: Config, device: torch.device, log: Callable[[str], None]
) -> ThreadTuner | None:
    """The run's tuner, measuring 1 thread against every core (remembered by
    `setup_key`); None where --num_threads fixes the count, the learner is not on the
    CPU or there is one core."""
    if config.num_threads is not None or device.type != "cpu":
        return None
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return None
    return ThreadTuner([1, cores], log, record_key=setup_key(config, [1, cores]))
