"""Box actions through the entry points, as a user runs them: PPO on Pendulum-v1 with
observation and reward normalisation (trained, checkpointed, resumed, tested), IMPALA's
Gaussian head, and the bad inputs a Box action space can bring."""

from __future__ import annotations

import json
import math

import pytest

from beast.outputs.checkpoint import CHECKPOINT_NAME, load_checkpoint
from tests.support.in_process import run_monobeast
from tests.support.runs import (
    assert_refused_in_one_line,
    read_csv,
    shm_entries,
)

PENDULUM = ["--env", "Pendulum-v1", "--num_actors", "2", "--num_envs_per_actor", "2"]
PENDULUM += ["--batch_size", "4", "--unroll_length", "16", "--num_threads", "1"]
PENDULUM += ["--log_interval", "1"]


def normaliser_count(checkpoint: dict) -> float:
    return float(checkpoint["model_state_dict"]["obs_rms.count"])


@pytest.mark.parametrize("policy", ["local", "central"])
def test_ppo_on_pendulum_normalises_checkpoints_resumes_and_tests(tmp_path, policy):
    before = shm_entries()
    argv = ["--algo", "ppo", *PENDULUM, "--policy", policy, "--num_minibatches", "4"]
    argv += ["--num_epochs", "2", "--normalize_obs", "--normalize_reward"]
    argv += ["--savedir", str(tmp_path), "--xpid", "pendulum"]
    result = run_monobeast([*argv, "--total_steps", "2000"])
    assert result.returncode == 0, result.stderr
    assert "Box(1) actions in [-2, 2]" in result.stdout
    first = load_checkpoint(str(tmp_path / "pendulum" / CHECKPOINT_NAME))
    config = first["config"]
    assert config["normalize_obs"] and config["normalize_reward"] and config["synchronous"]
    # Both statistics saw the batches: ~2000 observations, and as many returns.
    assert normaliser_count(first) > 1000
    assert float(first["reward_scaler"]["count"]) > 1000
    # The Gaussian head's state-independent log-std is a trained parameter.
    assert first["model_state_dict"]["model.log_std"].shape == (1,)

    resumed = run_monobeast([*argv, "--total_steps", "4000"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {first['progress']['step']:,}" in resumed.stdout
    final = load_checkpoint(str(tmp_path / "pendulum" / CHECKPOINT_NAME))
    assert final["progress"]["step"] >= 4000
    # The statistics went on from the checkpoint's, not from scratch.
    assert normaliser_count(final) > normaliser_count(first) + 1000
    assert float(final["reward_scaler"]["count"]) > float(first["reward_scaler"]["count"])
    steps = [int(row["step"]) for row in read_csv(tmp_path / "pendulum" / "logs.csv")]
    assert steps == sorted(steps)
    assert shm_entries() - before == set()

    tested = run_monobeast(
        ["--mode", "test", "--savedir", str(tmp_path), "--xpid", "pendulum"]
        + ["--num_test_episodes", "2"]
    )
    assert tested.returncode == 0, tested.stderr
    summary = json.loads((tmp_path / "pendulum" / "test.json").read_text())
    # Pendulum's returns are negative (a cost); 200 steps of at most 16.3 each.
    assert summary["episodes"] == 2 and -3300 < summary["mean_return"] <= 0


@pytest.mark.parametrize("algo", ["impala", "laser", "a2c"])
def test_gaussian_head_trains_with_other_actor_critics(tmp_path, algo):
    argv = ["--algo", algo, *PENDULUM, "--total_steps", "1500"]
    if algo == "laser":
        argv += ["--replay_size", "20"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", algo])
    assert result.returncode == 0, result.stderr
    rows = read_csv(tmp_path / algo / "logs.csv")
    assert int(rows[-1]["step"]) >= 1500
    assert all(math.isfinite(float(row["total_loss"])) for row in rows if row["total_loss"])


def test_ppo_on_halfcheetah_picks_the_mujoco_config(tmp_path):
    pytest.importorskip("mujoco")
    argv = ["--algo", "ppo", "--env", "HalfCheetah-v5", "--unroll_length", "64"]
    argv += ["--total_steps", "640", "--num_epochs", "1", "--num_threads", "1"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", "cheetah"])
    assert result.returncode == 0, result.stderr
    assert "Box(6) actions in [-1, 1]" in result.stdout
    checkpoint = load_checkpoint(str(tmp_path / "cheetah" / CHECKPOINT_NAME))
    config = checkpoint["config"]
    # configs/ppo/mujoco.yaml, with the command line's overrides on top.
    assert config["model"] == "separate_mlp" and config["hidden_size"] == 256
    assert config["normalize_obs"] and config["normalize_reward"]
    assert config["unroll_length"] == 64 and checkpoint["progress"]["step"] >= 640


def test_a_user_model_with_a_gaussian_head_trains_on_pendulum(tmp_path):
    argv = ["--algo", "ppo", *PENDULUM, "--num_minibatches", "4", "--total_steps", "1000"]
    argv += ["--model", "tests.support.user_models:TinyGaussianActorCritic"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", "user"])
    assert result.returncode == 0, result.stderr
    assert int(read_csv(tmp_path / "user" / "logs.csv")[-1]["step"]) >= 1000


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--env", "tests.envs.test_envs:InfiniteBoxActionEnv"], "has infinite bounds"),
        (["--algo", "r2d2", "--env", "Pendulum-v1"], "needs a Discrete action space"),
        (["--algo", "apex", "--env", "Pendulum-v1"], "needs a Discrete action space"),
        (
            ["--env", "Pendulum-v1", "--model", "tests.support.user_models:TinyActorCritic"],
            "must accept (obs_shape, action_dim) as keyword arguments for Box(1) actions",
        ),
        (
            ["--algo", "ppo", "--env", "CartPole-v1", "--num_minibatches", "7"],
            "--num_minibatches 7 does not divide",
        ),
        (
            ["--algo", "ppo", "--env", "CartPole-v1", "--batch_size", "16"],
            "--batch_size must be 8",
        ),
        (
            ["--algo", "ppo", "--env", "PongNoFrameskip-v4", "--normalize_obs"],
            "--normalize_obs is for float vector observations",
        ),
    ],
)
def test_bad_continuous_and_ppo_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, argv, fragment)
