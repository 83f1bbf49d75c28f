"""The run directory's records: metadata, per-update CSV, TensorBoard, console progress.

(Named `logs` rather than `logging` so it never shadows the standard
library module.)

SAVEDIR/XPID holds, besides the checkpoint:
    meta.json         flags, git commit and dirty flag, library versions, start time
    config.yaml       the merged config; `--config config.yaml` reruns it
    git_diff.patch    `git diff HEAD` of the beast checkout when it was dirty
    requirements.txt  the installed distributions, in `pip freeze` format
    logs.csv          one row per learner update (step, time, losses, returns)
    episodes.csv      one row per finished episode (the learner step at which it was
                      consumed, its return and length)
    events.out.tfevents.*  TensorBoard: the logs.csv columns against step, plus SPS

On a terminal the console shows a live progress bar (rich) and the messages
scroll above it; anywhere else (a log file, a pipe, a cluster's stdout) it
gets plain lines only, so logs hold no redraw escape codes.
"""

from __future__ import annotations

import collections
import csv
import importlib.metadata
import json
import math
import os
import platform
import sys
import threading
import time
from typing import Any, TextIO

import torch
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from beast.learner import UpdateStats

__all__ = ["RunLog", "git_info", "git_diff", "pip_freeze", "format_duration"]

# Episodes the console's "mean return" averages over.
RETURN_WINDOW = 100
# Seconds between the update rows written to TensorBoard (logs.csv keeps every one).
TENSORBOARD_INTERVAL = 1.0


def git_info() -> dict[str, Any]:
    """Commit and dirty flag of the beast checkout, or why they are unknown."""
    try:
        import git

        repo = git.Repo(os.path.dirname(os.path.abspath(__file__)), search_parent_directories=True)
        return {"commit": repo.head.commit.hexsha, "dirty": repo.is_dirty()}
    except Exception as error:  # not a checkout, no commits, git missing: still run
        return {"commit": None, "reason": f"{type(error).__name__}: {error}".splitlines()[0]}


def git_diff() -> str | None:
    """`git diff HEAD` of the beast checkout (tracked files), or None when unknown.

    With the commit, this is what reproduces a run made from a dirty tree.
    """
    try:
        import git

        repo = git.Repo(os.path.dirname(os.path.abspath(__file__)), search_parent_directories=True)
        return repo.git.diff("HEAD")
    except Exception:  # not a checkout, no commits, git missing: git_info says why
        return None


def pip_freeze() -> str:
    """Installed distributions as `name==version` lines, the format of `pip freeze`.

    Read from the interpreter's metadata rather than by running pip: no subprocess at
    start-up, and it works where pip is absent (uv, conda environments).
    """
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "".join(line + "\n" for _, line in sorted(seen.items()))


def _tensorboard_writer(run_dir: str) -> Any:
    """A SummaryWriter on run_dir; imported here because the import costs ~2 s."""
    from torch.utils.tensorboard import SummaryWriter

    # flush_secs: events reach the disk (and a running TensorBoard) within 30 s.
    return SummaryWriter(log_dir=run_dir, flush_secs=30)


class _StepsPerSecondColumn(ProgressColumn):
    """rich's own speed estimate (its recent samples of `completed`) as SPS."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} SPS" if speed else "- SPS")


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunLog:
    """Everything a run records: its directory's files, TensorBoard and the console.

    Args:
        run_dir: SAVEDIR/XPID; created if missing.
        config: the merged config as a dict (Config.to_dict()).
        total_steps: for the progress percentage and ETA.
        stream: where console output goes.
        live: show a live progress bar; default: whether `stream` is a terminal.
        tensorboard: write TensorBoard event files into run_dir.
    """

    def __init__(
        self,
        run_dir: str,
        config: dict[str, Any],
        total_steps: int,
        stream: TextIO = sys.stdout,
        *,
        live: bool | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.stream = stream
        os.makedirs(run_dir, exist_ok=True)
        self._write_run_files(config)
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
        self._writer = _tensorboard_writer(run_dir) if tensorboard else None
        self._last_tensorboard_row = -float("inf")
        if live is None:
            live = bool(getattr(stream, "isatty", lambda: False)())
        self._progress: Progress | None = None
        if live:
            self._progress = Progress(
                TextColumn("[bold]beast[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                _StepsPerSecondColumn(),
                TextColumn("return {task.fields[mean_return]}"),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=stream),
                # rich's speed estimate (SPS, ETA) averages over this many seconds.
                speed_estimate_period=30.0,
            )
            self._task = self._progress.add_task(
                "train", total=total_steps, mean_return="-", loss="-"
            )
            self._progress.start()

    def _write_run_files(self, config: dict[str, Any]) -> None:
        """config.yaml, git_diff.patch and requirements.txt: what reproduces the run."""
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        diff = git_diff()
        diff_path = os.path.join(self.run_dir, "git_diff.patch")
        if diff:
            with open(diff_path, "w") as f:
                f.write(diff + "\n")
        elif os.path.exists(diff_path):
            os.remove(diff_path)  # a resumed run from a clean tree: the old diff is stale
        with open(os.path.join(self.run_dir, "requirements.txt"), "w") as f:
            f.write(pip_freeze())

    def start_from(self, step: int) -> None:
        """Count SPS from `step` (a resumed run does not count old steps)."""
        with self._lock:
            self.step = step
            self._last_line = (time.monotonic(), step)
            if self._progress is not None:
                # reset() drops rich's speed samples: old steps must not count as SPS.
                self._progress.reset(self._task, completed=step)

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
            if self._writer is not None:
                # The same stats as logs.csv, one tag per column, against the step, at most
                # one row per TENSORBOARD_INTERVAL: a row of 20 scalars costs ~1.3 ms, a
                # tenth of a SAC update and more than half a DQN one. Every episode's return
                # is written.
                now = time.monotonic()
                if now - self._last_tensorboard_row >= TENSORBOARD_INTERVAL:
                    self._last_tensorboard_row = now
                    for key, value in row.items():
                        if key != "step" and value != "":
                            self._writer.add_scalar(key, value, stats.step)
                for ret in stats.episode_returns:
                    self._writer.add_scalar("episode_return", ret, stats.step)
            if self._progress is not None:
                loss = stats.losses.get("total_loss")
                self._progress.update(
                    self._task,
                    completed=stats.step,
                    mean_return=(
                        f"{sum(self._returns) / len(self._returns):.2f}" if self._returns else "-"
                    ),
                    loss=f"{loss:.4g}" if loss is not None else "-",
                )

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
            remaining = max(0, self.total_steps - self.step) / sps if sps > 0 else float("inf")
            returns = (
                f"return {sum(self._returns) / len(self._returns):.2f}"
                f" (last {len(self._returns)} of {self.num_episodes} eps)"
                if self._returns
                else "return - (no episode finished yet)"
            )
            loss = self.last_losses.get("total_loss")
            loss_text = f"loss {loss:.4g}" if loss is not None else "loss -"
            if self._writer is not None:
                self._writer.add_scalar("sps", sps, self.step)
        pct = 100.0 * self.step / self.total_steps
        return (
            f"step {self.step:,}/{self.total_steps:,} ({pct:.1f}%) | SPS {sps:,.0f} | {returns}"
            f" | {loss_text} | elapsed {format_duration(now - self._start)}"
            f" ETA {format_duration(remaining)}"
        )

    def report_progress(self) -> None:
        """The periodic progress report: a plain line, unless the live bar shows it."""
        line = self.progress_line()
        if self._progress is None:
            self.print(line)

    def print(self, message: str) -> None:
        """A message; on a terminal it scrolls above the live progress bar."""
        if self._progress is not None:
            self._progress.console.print(
                f"[beast] {message}", markup=False, highlight=False, soft_wrap=True
            )
        else:
            print(f"[beast] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        with self._lock:
            self._csv_file.close()
            self._episodes_file.close()
            if self._writer is not None:
                self._writer.close()
