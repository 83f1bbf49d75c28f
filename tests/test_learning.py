"""Real learning checks through the entry points: IMPALA on CartPole-v1 by default, every
algorithm in every mode with -m slow (benchmarks/learning_checks.py's table).

Runs are seeded, but actors and learner run asynchronously, so the exact
trajectory is not reproducible; the floors leave room for that.
"""

import csv
import os
import subprocess
import sys

import pytest

from benchmarks.learning_checks import CHECKS, run_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tuned flags live in configs/impala/classic.yaml, which --env CartPole-v1
# picks: this checks that the shipped config learns, as a user runs it.
CARTPOLE_FLAGS = ["--env", "CartPole-v1", "--num_threads", "1", "--log_interval", "10"]


def best_mean_of_100(run_dir) -> float:
    """Highest mean return over any 100 consecutive finished episodes."""
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        returns = [float(row["return"]) for row in csv.DictReader(f)]
    assert len(returns) >= 100, f"only {len(returns)} episodes finished"
    window = sum(returns[:100])
    best = window
    for i in range(100, len(returns)):
        window += returns[i] - returns[i - 100]
        best = max(best, window)
    return best / 100


def train_cartpole(tmp_path, total_steps: int, seed: int = 1, policy: str = "local") -> float:
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "monobeast.py"),
            *CARTPOLE_FLAGS,
            "--total_steps",
            str(total_steps),
            "--seed",
            str(seed),
            "--policy",
            policy,
            "--savedir",
            str(tmp_path),
            "--xpid",
            "cartpole",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return best_mean_of_100(tmp_path / "cartpole")


def test_cartpole_reaches_450_within_500k_steps(tmp_path):
    # IMPALA's bar from the MonoBeast issue, the one learning check of the default run:
    # about 20 s on 2 cores; seeds 1-11 reached best means of 486-500
    # (configs/impala/classic.yaml). Every other algorithm and mode: the slow checks.
    assert train_cartpole(tmp_path, 500_000) >= 450


@pytest.mark.slow
@pytest.mark.parametrize(
    "check", [c for c in CHECKS if c.name != "impala-monobeast-local"], ids=lambda c: c.name
)
def test_every_algorithm_reaches_its_bar_in_every_mode(tmp_path, check):
    """The issue's bars (benchmarks/learning_checks.py prints the same runs as a table:
    steps to the bar, best and last means, wall-clock), seed 1."""
    outcome = run_check(check, seed=1, savedir=str(tmp_path))
    assert outcome.best >= check.bar, outcome
