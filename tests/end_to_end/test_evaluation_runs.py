"""--eval_interval through the entry points, as a user runs them: the eval rows of logs.csv
and their steps, TensorBoard's eval/ scalars, model_best.tar and `--mode test --checkpoint
best`, every family of algorithm, --serial, polybeast, shutdown, bad input.
(The evaluator's parts without the entry points: tests/run/test_evaluator.py.)"""

from __future__ import annotations

import glob
import importlib.util
import os
import signal
import statistics
import subprocess
import time
import uuid

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import monobeast
from beast.outputs.logs import EVAL_COLUMNS
from tests.support.in_process import run_monobeast
from tests.support.matrix import ALGO_FLAGS, COMMON, ENVS, LAYOUT
from tests.support.runs import (
    CARTPOLE_SMALL,
    ROOT,
    assert_refused_in_one_line,
    read_csv,
    run,
    shm_entries,
    start,
    wait_until_gone,
)
from tests.support.wandb_files import history_rows, wandb_records

# CARTPOLE_SMALL's batches: 2 rollouts of 10 steps, so each update adds 20 agent steps.
STEPS_PER_UPDATE = 20


def split_rows(run_dir):
    """logs.csv's (update rows, eval rows): eval rows are those with eval columns filled.
    Every row's step is the training step when it was written: the column only grows."""
    rows = read_csv(run_dir / "logs.csv")
    written = [int(row["step"]) for row in rows]
    assert written == sorted(written)
    evals = [row for row in rows if row["eval_step"] != ""]
    updates = [row for row in rows if row["eval_step"] == ""]
    assert all(int(row["step"]) >= int(row["eval_step"]) for row in evals)
    return updates, evals


def assert_steps_follow_the_interval(steps, interval, slack):
    """Each step is the first update at or past a multiple of `interval` (within `slack`
    agent steps of it), one per multiple, in order."""
    multiples = [step // interval for step in steps]
    assert all(k >= 1 for k in multiples), steps
    assert all(step - k * interval < slack for step, k in zip(steps, multiples, strict=True)), steps
    assert multiples == sorted(set(multiples)), steps


def test_cartpole_eval_rows_at_the_right_steps_and_the_best_checkpoint_loads(tmp_path):
    marker, before = uuid.uuid4().hex, shm_entries()
    argv = [*CARTPOLE_SMALL, "--total_steps", "4000", "--eval_interval", "1000"]
    argv += ["--eval_episodes", "3", "--savedir", str(tmp_path), "--xpid", "e"]
    result = run(argv, marker=marker)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "e"
    updates, evals = split_rows(run_dir)
    steps = [int(row["eval_step"]) for row in evals]
    # The evaluator takes the newest snapshot when it is free (it may start after the
    # first multiples): at least the last, at total_steps, which the run waits for.
    assert_steps_follow_the_interval(steps, 1000, STEPS_PER_UPDATE)
    assert steps[-1] == 4000
    assert set(steps) <= {int(row["step"]) for row in updates}  # snapshots of updates
    for row in evals:
        assert row["eval_episodes"] == "3" and row["total_loss"] == ""
        low, mean, high = (float(row[f"eval_{k}_return"]) for k in ("min", "mean", "max"))
        assert low <= mean <= high
        # CartPole pays 1 a step: the mean return is the mean length.
        assert float(row["eval_mean_length"]) == pytest.approx(mean)
    assert all(row[column] == "" for row in updates for column in EVAL_COLUMNS)
    lines = [line for line in result.stdout.splitlines() if "evaluation at step" in line]
    assert len(lines) == len(evals)
    # TensorBoard: the same evaluations under eval/.
    events = EventAccumulator(str(run_dir))
    events.Reload()
    scalars = events.Scalars("eval/mean_return")
    assert [s.step for s in scalars] == steps
    means = [float(row["eval_mean_return"]) for row in evals]
    assert [s.value for s in scalars] == pytest.approx(means)
    # model_best.tar: the first evaluation with the highest mean return.
    best = torch.load(run_dir / "model_best.tar", weights_only=True)
    assert best["step"] == steps[means.index(max(means))]
    assert best["eval"]["mean_return"] == pytest.approx(max(means))
    assert wait_until_gone(marker) == []  # the evaluator too
    assert shm_entries() - before == set()
    # --mode test plays it (through the entry point, in this process).
    argv = ["--mode", "test", "--savedir", str(tmp_path), "--xpid", "e", "--checkpoint", "best"]
    assert monobeast.main([*argv, "--num_test_episodes", "2"]) == 0
    assert (run_dir / "test.json").is_file()


def test_serial_evaluates_inline_at_every_multiple(tmp_path):
    argv = [*CARTPOLE_SMALL, "--serial", "--total_steps", "3000", "--eval_interval", "1000"]
    result = run_monobeast(
        [*argv, "--eval_episodes", "2", "--savedir", str(tmp_path), "--xpid", "s"]
    )
    assert result.returncode == 0, result.stderr
    assert "2 episodes between updates" in result.stdout
    _, evals = split_rows(tmp_path / "s")
    steps = [int(row["eval_step"]) for row in evals]
    assert len(steps) == 3  # inline: none is skipped
    assert_steps_follow_the_interval(steps, 1000, STEPS_PER_UPDATE)


# One algorithm of each family, across both policies: actor-critic, Q-learning on a
# transition replay, continuous control, recurrent Q-learning on sequences.
FAMILIES = [("ppo", "local"), ("dqn", "central"), ("sac", "local"), ("r2d2", "central")]


@pytest.mark.parametrize("algo, policy", FAMILIES, ids=[algo for algo, _ in FAMILIES])
def test_every_family_evaluates_and_its_best_checkpoint_tests(tmp_path, algo, policy):
    argv = ["--algo", algo, "--env", ENVS.get(algo, "CartPole-v1"), *COMMON]
    argv += [*LAYOUT["monobeast.py"], *ALGO_FLAGS[algo], "--policy", policy]
    argv += ["--eval_interval", "1000", "--eval_episodes", "2"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", algo])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _, evals = split_rows(tmp_path / algo)
    steps = [int(row["eval_step"]) for row in evals]
    # Replay actors add steps between updates: a multiple may be passed by many steps.
    assert_steps_follow_the_interval(steps, 1000, 1000)
    assert steps[-1] >= 2000  # the final evaluation, at total_steps
    best = torch.load(tmp_path / algo / "model_best.tar", weights_only=True)
    assert best["config"]["algo"] == algo and best["step"] in steps
    argv = ["--mode", "test", "--savedir", str(tmp_path), "--xpid", algo, "--checkpoint", "best"]
    assert monobeast.main([*argv, "--num_test_episodes", "1"]) == 0


def test_polybeast_evaluates_and_logs_to_wandb_on_its_learner_and_leaves_nothing(tmp_path):
    pytest.importorskip("ray")
    wandb = importlib.util.find_spec("wandb") is not None
    marker = uuid.uuid4().hex
    argv = [*COMMON, *LAYOUT["polybeast.py"], "--env", "CartPole-v1", "--eval_interval", "1000"]
    argv += ["--eval_episodes", "2", "--savedir", str(tmp_path), "--xpid", "p"]
    argv += ["--wandb", "--wandb_mode", "offline"] if wandb else []
    proc = start(argv, marker, script=os.path.join(ROOT, "polybeast.py"), stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    _, evals = split_rows(tmp_path / "p")
    steps = [int(row["eval_step"]) for row in evals]
    assert_steps_follow_the_interval(steps, 1000, 1000)
    assert steps[-1] >= 2000
    assert (tmp_path / "p" / "model_best.tar").is_file()
    assert wait_until_gone(marker, timeout=15) == []
    if wandb:
        (path,) = glob.glob(str(tmp_path / "p" / "wandb" / "offline-run-*" / "*.wandb"))
        rows = history_rows(wandb_records(path))
        assert [row["eval/step"] for row in rows if "eval/step" in row] == steps
        assert any("total_loss" in row for row in rows)


def wait_for_an_evaluation(run_dir, proc, timeout=120):
    """Until the running `proc` has logged an evaluation in run_dir's logs.csv."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        logs = run_dir / "logs.csv"  # read while written: a last row may be partial
        if logs.exists() and any((row.get("eval_step") or "").isdigit() for row in read_csv(logs)):
            return
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    raise AssertionError(f"no evaluation within {timeout} s")


def test_ctrl_c_stops_the_evaluator_with_the_run(tmp_path):
    marker, before = uuid.uuid4().hex, shm_entries()
    argv = [*CARTPOLE_SMALL, "--total_steps", "100000000", "--eval_interval", "200"]
    proc = start([*argv, "--savedir", str(tmp_path), "--xpid", "c"], marker)
    wait_for_an_evaluation(tmp_path / "c", proc)
    os.killpg(proc.pid, signal.SIGINT)
    # Stopped, not run out: the run's 100M steps would take hours. 60 s tells a stop
    # from a hang on a loaded machine (a few seconds unloaded).
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted" in out
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()


def test_the_evaluator_exits_when_the_learner_dies_hard(tmp_path):
    marker = uuid.uuid4().hex
    argv = [*CARTPOLE_SMALL, "--total_steps", "100000000", "--eval_interval", "200"]
    proc = start([*argv, "--savedir", str(tmp_path), "--xpid", "hard"], marker)
    try:
        wait_for_an_evaluation(tmp_path / "hard", proc)
        os.kill(proc.pid, signal.SIGKILL)  # the learner process only
        proc.communicate(timeout=10)
        assert wait_until_gone(marker, timeout=10) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--env", "CartPole-v1", "--eval_interval", "-5"], "--eval_interval must be >= 0"),
        (["--env", "CartPole-v1", "--eval_episodes", "0"], "--eval_episodes must be positive"),
        (["--env", "CartPole-v1", "--checkpoint", "worst"], "invalid choice: 'worst'"),
        (
            ["--mode", "test", "--xpid", "never-trained", "--checkpoint", "best"],
            "no best checkpoint at",
        ),
    ],
)
def test_bad_evaluation_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, argv, fragment)


def test_eval_statistics_in_logs_csv_match_the_episodes(tmp_path):
    """The eval columns are the statistics of the returns the console line lists."""
    argv = [*CARTPOLE_SMALL, "--serial", "--total_steps", "1000", "--eval_interval", "1000"]
    result = run_monobeast(
        [*argv, "--eval_episodes", "4", "--savedir", str(tmp_path), "--xpid", "x"]
    )
    assert result.returncode == 0, result.stderr
    (row,) = split_rows(tmp_path / "x")[1]
    best = torch.load(tmp_path / "x" / "model_best.tar", weights_only=True)
    returns = best["eval"]["returns"]
    assert len(returns) == 4
    assert float(row["eval_mean_return"]) == pytest.approx(statistics.fmean(returns))
    assert float(row["eval_median_return"]) == pytest.approx(statistics.median(returns))
    assert float(row["eval_std_return"]) == pytest.approx(statistics.pstdev(returns))
    assert float(row["eval_min_return"]) == min(returns)
    assert float(row["eval_max_return"]) == max(returns)
