"""How the tuners drive a run: start it, read its progress while it runs, stop it cleanly.

Both tuners (beast/tune/optuna_search.py, beast/tune/pbt.py) run monobeast runs in
processes of their own, as the sweep does (beast/tune/sweep.py: the same command line, slot
pinning and RUN_DIR/sweep.log), and read a run's progress from the files it writes:

    logs.csv      one row per update (`step`), one per evaluation (`eval_step`,
                  `eval_mean_return`: the pruner's values)
    episodes.csv  one row per finished training episode (`return`: PBT's scores)

The run flushes every row as it writes it (beast/outputs/logs.py) and a reader keeps only whole
lines, so a row caught half-written is read whole on the next poll. Reading files rather
than calling back into the run keeps the run a plain monobeast run (it may be on a Ray
worker, or survive the tuner) and loses nothing: whatever the run recorded is on disk.

A run is stopped with SIGINT, what Ctrl-C sends: it stops its actors and learner, writes
its final checkpoint and exits 0 (beast/run/runner.py), so a pruned trial or the end of a PBT
round leaves a checkpoint that resumes exactly.
"""

from __future__ import annotations

import csv
import io
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from beast.tune.sweep_runs import Run, launch

__all__ = [
    "Evaluation",
    "drive",
    "episode_returns",
    "evaluations",
    "last_step",
    "read_rows",
    "wait_for_threads",
]

# Seconds a run gets to checkpoint and exit after SIGINT before it is killed.
_STOP_SECONDS = 60.0


@dataclass(frozen=True)
class Evaluation:
    """One --eval_interval evaluation: the step of the weights evaluated, its mean return."""

    step: int
    mean_return: float


def read_rows(path: str) -> list[dict[str, str]]:
    """The whole rows of a CSV file that a run may be appending to ([] before it exists)."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return list(csv.DictReader(io.StringIO(text[: text.rfind("\n") + 1])))


def evaluations(run_dir: str) -> list[Evaluation]:
    """The run's evaluations so far, oldest first (a resumed run's earlier ones included)."""
    return [
        Evaluation(int(float(row["eval_step"])), float(row["eval_mean_return"]))
        for row in read_rows(os.path.join(run_dir, "logs.csv"))
        if row.get("eval_step") and row.get("eval_mean_return")
    ]


def last_step(run_dir: str) -> int:
    """The step of the run's newest update row (-1 before the first)."""
    for row in reversed(read_rows(os.path.join(run_dir, "logs.csv"))):
        if row.get("step") and not row.get("eval_step"):
            return int(float(row["step"]))
    return -1


def episode_returns(run_dir: str) -> list[float]:
    """The returns of the run's finished training episodes, oldest first."""
    return [
        float(row["return"])
        for row in read_rows(os.path.join(run_dir, "episodes.csv"))
        if row.get("return") and math.isfinite(float(row["return"]))
    ]


def drive(
    run: Run,
    sweep_dir: str,
    *,
    slot: tuple[list[int] | None, str | None] = (None, None),
    cpus_per_run: int = 1,
    should_stop: Callable[[], bool] = lambda: False,
    poll_seconds: float = 0.5,
) -> int:
    """Run `run` (monobeast, in SWEEP_DIR/RUN) until it exits or `should_stop()`, asked
    every `poll_seconds`, says to stop it; returns its exit code: 0 when it reached
    total_steps or stopped cleanly."""
    _, proc, log_file, _ = launch(run, sweep_dir, slot, cpus_per_run)
    try:
        while proc.poll() is None:
            if should_stop():
                break
            time.sleep(poll_seconds)
    finally:
        returncode = interrupt(proc)
        log_file.close()
    return returncode


def interrupt(proc: subprocess.Popen) -> int:
    """SIGINT `proc` if it still runs, wait for its checkpoint and exit (kill it after
    _STOP_SECONDS); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_for_threads(threads: Sequence[threading.Thread], stop: threading.Event) -> None:
    """Wait until every thread has ended; on Ctrl-C or SIGTERM (KeyboardInterrupt, from
    beast.util.interrupts.stop_on_signals) set `stop`, wait for them with further signals ignored
    (each thread stops its run cleanly), and raise KeyboardInterrupt.

    Polled rather than joined: in Python 3.11 a KeyboardInterrupt that lands inside
    `Thread.join` marks the thread ended while it still runs, and the interpreter then
    exits without waiting for it (a trial left RUNNING in the storage)."""
    try:
        while any(thread.is_alive() for thread in threads):
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop.set()
        previous = {
            signum: signal.signal(signum, signal.SIG_IGN)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            while any(thread.is_alive() for thread in threads):
                time.sleep(0.2)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        raise
