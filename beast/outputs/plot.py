"""Learning curves: mean episode return against env steps and against wall-clock.

    python -m beast.plot RUN_DIR [RUN_DIR ...] [--out returns.png] [--window 100]

One line per run, labelled by its directory name. Each point is the mean return
of the last `window` finished episodes (the console's "mean return"), so curves
from runs with different numbers of actors or envs compare on the same footing.
Returns come from the run's episodes.csv (the learner step at which each episode
was consumed); the wall-clock axis maps those steps to seconds of training
through logs.csv's (step, time) columns, interpolated.

A resumed run appends to the same CSVs: its clock restarts at 0, so each later
process's time is added to the time the earlier ones ran; and a process that
resumed from a checkpoint older than the last step logged (the newest one was
lost with a crash) rolled the run back, so the rows it undid are dropped (their
time still counts).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Curve", "load_curve", "plot_runs", "main"]

# Episodes averaged per point: the console's and the sweep table's "mean return".
DEFAULT_WINDOW = 100


@dataclass(frozen=True)
class Curve:
    """A run's smoothed learning curve; all arrays float64 [num_episodes]."""

    label: str
    steps: np.ndarray
    seconds: np.ndarray
    mean_returns: np.ndarray


def _read_columns(path: str, columns: Sequence[str]) -> list[np.ndarray]:
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if all(row.get(c) for c in columns)]
    return [np.array([float(row[c]) for row in rows], dtype=np.float64) for c in columns]


def _not_rolled_back(steps: np.ndarray) -> np.ndarray:
    """Mask of the rows a rollback did not undo (see the module docstring).

    Each drop in the step column starts a new process's rows; a row is undone when
    a later process logged a step at or below it.
    """
    if not len(steps):
        return np.zeros(0, dtype=bool)
    segment = np.concatenate([[0], np.cumsum(np.diff(steps) < 0)])
    count = int(segment[-1]) + 1
    segment_min = np.full(count, np.inf)
    np.minimum.at(segment_min, segment, steps)
    # The smallest step of any later segment, per segment.
    later_min = np.append(np.minimum.accumulate(segment_min[::-1])[::-1][1:], np.inf)
    return steps < later_min[segment]


def _training_seconds(seconds: np.ndarray) -> np.ndarray:
    """Seconds since the run started, summed over the processes of a resumed run."""
    restarts = np.flatnonzero(np.diff(seconds) < 0) + 1
    offsets = np.zeros_like(seconds)
    for restart in restarts:
        offsets[restart:] += seconds[restart - 1]
    return seconds + offsets


def load_curve(run_dir: str, window: int = DEFAULT_WINDOW, label: str | None = None) -> Curve:
    """Read a run directory into a Curve.

    The mean over the last `window` episodes uses fewer episodes at the start (a
    trailing mean over what has finished), so early points are noisier, as on the
    console. Raises FileNotFoundError when the run has no episodes.csv.
    """
    steps, returns = _read_columns(os.path.join(run_dir, "episodes.csv"), ("step", "return"))
    kept = _not_rolled_back(steps)
    steps, returns = steps[kept], returns[kept]
    cumulative = np.concatenate([[0.0], np.cumsum(returns)])
    index = np.arange(1, len(returns) + 1)
    first = np.maximum(index - window, 0)
    mean_returns = (cumulative[index] - cumulative[first]) / (index - first)
    logs = os.path.join(run_dir, "logs.csv")
    if os.path.exists(logs):
        log_steps, log_seconds = _read_columns(logs, ("step", "time"))
    else:
        log_steps = log_seconds = np.zeros(0)
    if len(log_steps):
        log_seconds = _training_seconds(log_seconds)
        kept = _not_rolled_back(log_steps)
        log_steps, log_seconds = log_steps[kept], log_seconds[kept]
        seconds = np.interp(steps, log_steps, log_seconds)
    else:
        seconds = np.full_like(steps, np.nan)
    return Curve(
        label=label or os.path.basename(os.path.normpath(run_dir)),
        steps=steps,
        seconds=seconds,
        mean_returns=mean_returns,
    )


def plot_runs(
    run_dirs: Sequence[str],
    out: str,
    window: int = DEFAULT_WINDOW,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> str:
    """Write a PNG with two panels (return vs steps, return vs wall-clock); returns `out`.

    Runs without any finished episode are listed in the legend with "(no episodes)"
    rather than dropped, so a sweep plot shows every run.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none is assumed
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(13, 4.8))
    max_seconds = 0.0
    curves = []
    for i, run_dir in enumerate(run_dirs):
        label = labels[i] if labels else None
        try:
            curves.append(load_curve(run_dir, window, label))
        except FileNotFoundError:
            curves.append(None)
        if curves[-1] is not None and len(curves[-1].seconds):
            max_seconds = max(max_seconds, float(np.nanmax(curves[-1].seconds, initial=0.0)))
    # The unit that keeps the axis numbers readable for the longest run.
    unit, scale = ("seconds", 1.0)
    if max_seconds > 3 * 3600:
        unit, scale = ("hours", 3600.0)
    elif max_seconds > 120:
        unit, scale = ("minutes", 60.0)
    for i, (run_dir, curve) in enumerate(zip(run_dirs, curves, strict=True)):
        color = f"C{i % 10}"
        if curve is None or len(curve.steps) == 0:
            name = labels[i] if labels else os.path.basename(os.path.normpath(run_dir))
            by_steps.plot([], [], color=color, label=f"{name} (no episodes)")
            continue
        by_steps.plot(curve.steps, curve.mean_returns, color=color, label=curve.label)
        by_time.plot(curve.seconds / scale, curve.mean_returns, color=color)
    by_steps.set_xlabel("env steps")
    by_time.set_xlabel(f"wall-clock ({unit})")
    for ax in (by_steps, by_time):
        ax.set_ylabel(f"mean return (last {window} episodes)")
        ax.grid(alpha=0.3)
    by_steps.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beast.plot",
        description="Plot mean episode return against env steps and wall-clock, one line per run.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="SAVEDIR/XPID of a run.")
    parser.add_argument(
        "--out",
        help="PNG to write. Default: RUN_DIR/returns.png for one run, ./returns.png for more.",
    )
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help="Episodes per mean (smoothing)."
    )
    parser.add_argument("--title", help="Figure title.")
    args = parser.parse_args(argv)
    if args.window <= 0:
        parser.error(f"--window must be positive, got {args.window}")
    missing = [d for d in args.run_dirs if not os.path.isfile(os.path.join(d, "episodes.csv"))]
    if len(missing) == len(args.run_dirs):
        parser.error(f"no episodes.csv in {', '.join(missing)}: not beast run directories?")
    out = args.out or (
        os.path.join(args.run_dirs[0], "returns.png") if len(args.run_dirs) == 1 else "returns.png"
    )
    plot_runs(args.run_dirs, out, window=args.window, title=args.title)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
