"""The run directory's records: metadata, per-update CSV, console progress.

(Named `logs` rather than `logging` so it never shadows the standard
library module.)

`SAVEDIR/XPID/meta.json` holds the flags, the git commit (and whether the
tree was dirty), library versions and the start time; `logs.csv` gets one
row per learner update; `episodes.csv` one row per finished episode (the
learner step at which it was consumed, its return and length); the console
gets one progress line every `log_interval` seconds.
"""

from __future__ import annotations

import collections
import csv
import json
import math
import os
import platform
import sys
import threading
import time
from typing import Any, TextIO

import torch

from beast.learner import UpdateStats

__all__ = ["RunLog", "git_info", "format_duration"]

# Episodes the console's "mean return" averages over.
RETURN_WINDOW = 100


def git_info() -> dict[str, Any]:
    """Commit and dirty flag of the beast checkout, or why they are unknown."""
    try:
        import git

        repo = git.Repo(os.path.dirname(os.path.abspath(__file__)), search_parent_directories=True)
        return {"commit": repo.head.commit.hexsha, "dirty": repo.is_dirty()}
    except Exception as error:  # not a checkout, no commits, git missing: still run
        return {"commit": None, "reason": f"{type(error).__name__}: {error}".splitlines()[0]}


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunLog:
    def __init__(
        self, run_dir: str, config: dict[str, Any], total_steps: int, stream: TextIO = sys.stdout
    ) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.stream = stream
        os.makedirs(run_dir, exist_ok=True)
        meta = {
            "config": config,
            "git": git_info(),
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv,
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "host": platform.node(),
        }
        with open(os.path.join(run_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        # Guards the CSV writer and the counters below: learner threads call
        # record() while the main thread calls progress_line().
        self._lock = threading.Lock()
        self._csv_file = open(os.path.join(run_dir, "logs.csv"), "a", newline="")  # noqa: SIM115
        self._csv: csv.DictWriter | None = None
        episodes_path = os.path.join(run_dir, "episodes.csv")
        new_episodes_file = not os.path.exists(episodes_path)
        self._episodes_file = open(episodes_path, "a", newline="")  # noqa: SIM115
        self._episodes = csv.writer(self._episodes_file)
        if new_episodes_file:
            self._episodes.writerow(["step", "return", "length"])
        self._returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
        self.num_episodes = 0
        self.step = 0
        self.last_losses: dict[str, float] = {}
        self._start = time.monotonic()
        self._last_line = (self._start, 0)

    def start_from(self, step: int) -> None:
        """Count SPS from `step` (a resumed run does not count old steps)."""
        with self._lock:
            self.step = step
            self._last_line = (time.monotonic(), step)

    def record(self, stats: UpdateStats) -> None:
        with self._lock:
            self.step = stats.step
            self.last_losses = stats.losses
            self._returns.extend(stats.episode_returns)
            self.num_episodes += len(stats.episode_returns)
            row = {
                "step": stats.step,
                "num_updates": stats.num_updates,
                "time": round(time.monotonic() - self._start, 3),
                **stats.losses,
                "mean_episode_return": (
                    sum(stats.episode_returns) / len(stats.episode_returns)
                    if stats.episode_returns
                    else ""
                ),
                "num_episodes": len(stats.episode_returns),
            }
            if self._csv is None:
                self._csv = csv.DictWriter(self._csv_file, fieldnames=list(row))
                if self._csv_file.tell() == 0:
                    self._csv.writeheader()
            self._csv.writerow(row)
            self._csv_file.flush()
            for ret, length in zip(stats.episode_returns, stats.episode_steps, strict=True):
                self._episodes.writerow([stats.step, ret, length])
            self._episodes_file.flush()

    def mean_return(self) -> float:
        with self._lock:
            return sum(self._returns) / len(self._returns) if self._returns else float("nan")

    def progress_line(self) -> str:
        """The console line; also resets the SPS window."""
        with self._lock:
            now = time.monotonic()
            then, then_step = self._last_line
            sps = (self.step - then_step) / max(now - then, 1e-9)
            self._last_line = (now, self.step)
            remaining = (self.total_steps - self.step) / sps if sps > 0 else float("inf")
            returns = (
                f"return {sum(self._returns) / len(self._returns):.2f}"
                f" (last {len(self._returns)} of {self.num_episodes} eps)"
                if self._returns
                else "return - (no episode finished yet)"
            )
            loss = self.last_losses.get("total_loss")
            loss_text = f"loss {loss:.4g}" if loss is not None else "loss -"
        pct = 100.0 * self.step / self.total_steps
        return (
            f"step {self.step:,}/{self.total_steps:,} ({pct:.1f}%) | SPS {sps:,.0f} | {returns}"
            f" | {loss_text} | elapsed {format_duration(now - self._start)}"
            f" ETA {format_duration(remaining)}"
        )

    def print(self, message: str) -> None:
        print(f"[beast] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        with self._lock:
            self._csv_file.close()
            self._episodes_file.close()
