"""The run directory's records: metadata, per-update CSV, TensorBoard, console progress.

(Named `logs` rather than `logging` so it never shadows the standard
library module.)

SAVEDIR/XPID holds, besides the checkpoint:
    meta.json         flags, git commit and dirty flag, library versions, start time
    config.yaml       the merged config; `--config config.yaml` reruns it
    git_diff.patch    `git diff HEAD` of the beast checkout when it was dirty
    requirements.txt  the installed distributions, in `pip freeze` format
    logs.csv          one row per learner update (step, time, losses, returns); with
                      --eval_interval also one per evaluation, and eval_* columns
                      (`EVAL_COLUMNS`), empty in update rows (`record_eval`)
    episodes.csv      one row per finished episode (the learner step at which it was
                      consumed, its return and length, and `time`: logs.csv's time of
                      that update, so an episode's wall-clock needs no join on step)
    events.out.tfevents.*  TensorBoard: the logs.csv columns against step, plus SPS,
                      every episode's return and the evaluations (eval/ tags)
    wandb/, wandb_id  with --wandb: the W&B run's files and id (beast/outputs/wandb_log.py)

Every scalar goes through one writer, `ScalarWriter`, which feeds TensorBoard and, with
--wandb, W&B.

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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

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

from beast.learning.learner import UpdateStats

if TYPE_CHECKING:
    from beast.outputs.eval_report import EvalReport
    from beast.outputs.wandb_log import WandbSettings

__all__ = [
    "EVAL_COLUMNS",
    "RunLog",
    "ScalarWriter",
    "format_duration",
    "git_diff",
    "git_info",
    "pip_freeze",
]

# Episodes the console's "mean return" averages over.
RETURN_WINDOW = 100
# episodes.csv's columns; `time` is the logs.csv time of the update that consumed the
# episode (seconds from the run log's start), as benchmarks/atari.py times a run from launch.
EPISODE_COLUMNS = ["step", "return", "length", "time"]
# Seconds between the update rows written to TensorBoard and W&B (logs.csv keeps every one).
TENSORBOARD_INTERVAL = 1.0
# logs.csv's columns for evaluations (--eval_interval): the step of the weights evaluated
# and `EvalReport.summary()`'s statistics.
EVAL_COLUMNS = tuple(
    f"eval_{name}"
    for name in (
        "step",
        "mean_return",
        "median_return",
        "std_return",
        "min_return",
        "max_return",
        "mean_length",
        "episodes",
    )
)
# W&B's x-axis of each kind of scalar (its own step must only grow, and an evaluation
# arrives after the updates of later steps).
WANDB_STEP, WANDB_EVAL_STEP = "step", "eval/step"


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


class ScalarWriter:
    """The one place the run's scalars go: TensorBoard and, with --wandb, W&B.

    `write(values, step)` writes a row of scalars at an agent step: a point per value in
    TensorBoard, one history row in W&B, plotted there against `step` (the eval/ scalars
    against `eval/step`). `episode_returns(returns, step)` gives TensorBoard every
    episode's return as a point of `episode_return`; W&B gets the mean of the episodes
    since its last row in the next row instead: a W&B row cost 0.2-0.3 ms of CPU here,
    in the learner thread, and CartPole finishes dozens of episodes per update early on.

    tensorboard: a SummaryWriter or None; wandb_run: a `wandb.Run` or None.
    """

    def __init__(self, tensorboard: Any, wandb_run: Any) -> None:
        self.tensorboard = tensorboard
        self.wandb_run = wandb_run
        self._defined: set[str] = set()  # W&B metrics given their x-axis
        self._pending_returns: list[float] = []  # episodes W&B has not seen yet

    def write(self, values: Mapping[str, float], step: int) -> None:
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb_run is None:
            return
        row = dict(values)
        evaluation = any(key.startswith("eval/") for key in row)  # a row is one or the other
        if self._pending_returns and not evaluation:
            row["episode_return"] = sum(self._pending_returns) / len(self._pending_returns)
            self._pending_returns.clear()
        axis = WANDB_EVAL_STEP if evaluation else WANDB_STEP
        for key in row.keys() - self._defined:
            self.wandb_run.define_metric(key, step_metric=axis)
            self._defined.add(key)
        self.wandb_run.log({**row, axis: step})

    def episode_returns(self, returns: Sequence[float], step: int) -> None:
        if self.tensorboard is not None:
            for ret in returns:
                self.tensorboard.add_scalar("episode_return", ret, step)
        if self.wandb_run is not None:
            self._pending_returns.extend(returns)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _csv_header(path: str) -> list[str] | None:
    """The header row of the CSV file at `path`, or None when it is missing or empty."""
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), None)
    except FileNotFoundError:
        return None


def _widen_csv(path: str, fieldnames: list[str]) -> None:
    """Rewrite the CSV file at `path` with `fieldnames`, a superset of its header: old
    rows keep their values, new columns stay empty (a resumed run that logs more, such as
    eval columns). Written to a temporary file and renamed over the old one."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    tmp_path = path + ".tmp"
    with open(tmp_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames, restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp_path, path)


def _episode_returns(path: str, step: int) -> list[float]:
    """The returns in episodes.csv of the episodes finished by `step`, oldest first. Rows
    past it were written after the checkpoint a resume starts from (one from model.prev.tar,
    say), and the run plays them again; a row cut by a crash is skipped."""
    if not os.path.isfile(path):
        return []
    returns = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                if int(row["step"]) <= step:
                    returns.append(float(row["return"]))
            except (KeyError, TypeError, ValueError):
                continue
    return returns


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
        stream: where console output goes; sys.stdout at construction by default.
        live: show a live progress bar; default: whether `stream` is a terminal.
        tensorboard: write TensorBoard event files into run_dir.
        evaluation: the run evaluates (--eval_interval): logs.csv has the eval columns.
        wandb: log to W&B too (--wandb), with these settings.
    """

    def __init__(
        self,
        run_dir: str,
        config: dict[str, Any],
        total_steps: int,
        stream: TextIO | None = None,
        *,
        live: bool | None = None,
        tensorboard: bool = True,
        evaluation: bool = False,
        wandb: WandbSettings | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps
        # sys.stdout as it is now (a notebook, or a caller's redirect_stdout, may have
        # replaced it since import).
        self.stream = stream if stream is not None else sys.stdout
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
        wandb_run = None
        if wandb is not None:
            from beast.outputs.wandb_log import start_wandb_run

            wandb_run = start_wandb_run(wandb, run_dir, config, meta["git"])
        # Guards the CSV writer, the scalar writer and the counters below: learner threads
        # call record() while the main thread calls progress_line() and record_eval().
        self._lock = threading.Lock()
        self._csv_path = os.path.join(run_dir, "logs.csv")
        self._csv_file = open(self._csv_path, "a", newline="")  # noqa: SIM115
        self._csv: csv.DictWriter | None = None
        self._eval_columns = dict.fromkeys(EVAL_COLUMNS, "") if evaluation else {}
        episodes_path = self._episodes_path = os.path.join(run_dir, "episodes.csv")
        episodes_header = _csv_header(episodes_path)
        if episodes_header and episodes_header != EPISODE_COLUMNS:
            # A run from before the time column, resumed: its rows get an empty time.
            _widen_csv(episodes_path, EPISODE_COLUMNS)
        self._episodes_file = open(episodes_path, "a", newline="")  # noqa: SIM115
        self._episodes = csv.writer(self._episodes_file)
        if not episodes_header:
            self._episodes.writerow(EPISODE_COLUMNS)
        self._returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
        self.num_episodes = 0
        self.step = 0
        self.last_losses: dict[str, float] = {}
        self._start = time.monotonic()
        self._last_line = (self._start, 0)
        self._scalars = ScalarWriter(
            _tensorboard_writer(run_dir) if tensorboard else None, wandb_run
        )
        self._last_scalar_row = -float("inf")
        if live is None:
            live = bool(getattr(self.stream, "isatty", lambda: False)())
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
                console=Console(file=self.stream),
                # rich's speed estimate (SPS, ETA) averages over this many seconds.
                speed_estimate_period=30.0,
            )
            self._task = self._progress.add_task(
                "train", total=total_steps, mean_return="-", loss="-"
            )
            self._progress.start()
        if wandb_run is not None:
            where = wandb_run.settings.sync_dir if wandb_run.offline else wandb_run.url
            self.print(f"W&B run {wandb_run.id} ({wandb_run.settings.mode}): {where}")

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
        """Count SPS from `step` (a resumed run does not count old steps), and start the
        returns' window from the episodes finished by then (episodes.csv): a resumed run
        shows its last known return before a new episode ends."""
        returns = _episode_returns(self._episodes_path, step)
        with self._lock:
            self.step = step
            self._last_line = (time.monotonic(), step)
            self._returns.clear()
            self._returns.extend(returns)
            self.num_episodes = len(returns)
            if self._progress is not None:
                # reset() drops rich's speed samples: old steps must not count as SPS.
                self._progress.reset(self._task, completed=step)
                if self._returns:
                    mean = sum(self._returns) / len(self._returns)
                    self._progress.update(self._task, mean_return=f"{mean:.2f}")

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
                **self._eval_columns,
            }
            self._write_csv_row(row)
            if stats.episode_returns:
                for ret, length in zip(stats.episode_returns, stats.episode_steps, strict=True):
                    self._episodes.writerow([stats.step, ret, length, row["time"]])
                self._episodes_file.flush()
            # The same stats as logs.csv, one scalar per column, against the step, at most
            # one row per TENSORBOARD_INTERVAL: a TensorBoard row of 20 scalars costs ~1.3 ms,
            # a tenth of a SAC update and more than half a DQN one.
            now = time.monotonic()
            if now - self._last_scalar_row >= TENSORBOARD_INTERVAL:
                self._last_scalar_row = now
                self._scalars.write(
                    {k: v for k, v in row.items() if k != "step" and v != ""}, stats.step
                )
            self._scalars.episode_returns(stats.episode_returns, stats.step)
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

    def record_eval(self, result: EvalReport) -> None:
        """An evaluation (beast/run/evaluator.py): eval/ scalars at the step of the weights
        evaluated, a console line, and a logs.csv row of its own: `step` and `time` when it
        is written, like every row (so the step column only grows: an evaluation arrives
        after the updates of later steps), `eval_step` the step of the weights evaluated,
        the eval columns; the others empty."""
        summary = result.summary()
        with self._lock:
            self._write_csv_row(
                {
                    "step": max(self.step, result.step),
                    "time": round(time.monotonic() - self._start, 3),
                    "eval_step": result.step,
                    **{f"eval_{key}": value for key, value in summary.items()},
                }
            )
            self._scalars.write(
                {f"eval/{key}": value for key, value in summary.items()}, result.step
            )
        self.print(
            f"evaluation at step {result.step:,}: mean return {summary['mean_return']:.2f}"
            f" (median {summary['median_return']:.2f}, min {summary['min_return']:.2f},"
            f" max {summary['max_return']:.2f}) over {len(result.returns)} episodes of"
            f" {summary['mean_length']:.1f} steps, in {result.seconds:.1f} s"
            + ("; the best so far" if result.best else "")
        )

    def _write_csv_row(self, row: dict[str, Any]) -> None:
        """A logs.csv row; the first one fixes the columns (an existing file's header,
        widened if this run logs more). Missing keys are written empty. Holds no lock:
        the caller holds the run log's."""
        if self._csv is None:
            fieldnames = list(row)
            header = _csv_header(self._csv_path)
            if header:
                fieldnames = header + [key for key in fieldnames if key not in header]
                if fieldnames != header:
                    self._csv_file.close()
                    _widen_csv(self._csv_path, fieldnames)
                    self._csv_file = open(self._csv_path, "a", newline="")  # noqa: SIM115
            self._csv = csv.DictWriter(self._csv_file, fieldnames=fieldnames, restval="")
            if not header:
                self._csv.writeheader()
        self._csv.writerow(row)
        self._csv_file.flush()

    def mean_return(self) -> float:
        with self._lock:
            return sum(self._returns) / len(self._returns) if self._returns else float("nan")

    def progress_line(self, note: str | None = None) -> str:
        """The console line, `note` at its end (the update's compilation, beast/run/
        lifecycle.py `report`); also resets the SPS window."""
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
            self._scalars.write({"sps": sps}, self.step)
        pct = 100.0 * self.step / self.total_steps
        return (
            f"step {self.step:,}/{self.total_steps:,} ({pct:.1f}%) | SPS {sps:,.0f} | {returns}"
            f" | {loss_text} | elapsed {format_duration(now - self._start)}"
            f" ETA {format_duration(remaining)}" + (f" | {note}" if note else "")
        )

    def report_progress(self, note: str | None = None) -> None:
        """The periodic progress report: a plain line, unless the live bar shows it (then
        `note`, if any, is a message above the bar)."""
        line = self.progress_line(note)
        if self._progress is None:
            self.print(line)
        elif note:
            self.print(note)

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
            self._scalars.close()
