"""One evaluation during training (--eval_interval): what the evaluator (beast/run/evaluator.py)
reports and the run log (beast/outputs/logs.py) records.

Its own module so that the log can name it without importing the evaluator, which
writes to the log. (`--mode test`'s result is `beast.trained.play.EvalResult`.)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

__all__ = ["EvalReport"]


@dataclass(frozen=True)
class EvalReport:
    """One evaluation: the snapshot's step, each episode's return and length, the seconds
    it took, and whether its mean return is the best so far (model_best.tar holds it)."""

    step: int
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    seconds: float
    best: bool

    def summary(self) -> dict[str, float]:
        """The statistics the run log records (as eval_* columns and eval/ scalars)."""
        return {
            "mean_return": statistics.fmean(self.returns),
            "median_return": statistics.median(self.returns),
            "std_return": statistics.pstdev(self.returns),
            "min_return": min(self.returns),
            "max_return": max(self.returns),
            "mean_length": statistics.fmean(self.lengths),
            "episodes": len(self.returns),
        }
