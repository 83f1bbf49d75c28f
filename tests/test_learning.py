"""Real learning checks: IMPALA on CartPole-v1 through monobeast.py.

Runs are seeded, but actors and learner run asynchronously, so the exact
trajectory is not reproducible; the floors leave room for that.
"""

import csv
import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("policy", ["local", pytest.param("central", marks=pytest.mark.slow)])
def test_cartpole_reaches_450_within_500k_steps(tmp_path, policy):
    # IMPALA's bar from the MonoBeast issue, with either policy mode (learning must not
    # depend on where actions are computed). About 20 s (local) and 30 s (central) on 2
    # cores: local runs by default; with local inference seeds 1-11 reached best means
    # of 486-500 (configs/impala/classic.yaml).
    assert train_cartpole(tmp_path, 500_000, policy=policy) >= 450
