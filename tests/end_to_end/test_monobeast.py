"""monobeast.py end to end, as a user runs it: subprocesses on real envs.

Every run gets a unique marker in its environment; after it exits, no
process on the machine may still carry that marker (actors, forkserver),
and /dev/shm must hold no new segment.
"""

import json
import os
import signal
import time
import uuid

import gymnasium
import numpy as np
import pytest

from tests.support.in_process import run_monobeast
from tests.support.runs import (
    CARTPOLE_SMALL,
    assert_refused_in_one_line,
    read_csv,
    run,
    shm_entries,
    start,
    wait_until_gone,
)


class CrashingEnv(gymnasium.Env):
    """Raises from step() after a few steps: an env bug inside an actor."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t > 30:
            raise RuntimeError("boom: the environment broke")
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_train_then_test_on_cartpole(tmp_path):
    marker = uuid.uuid4().hex
    before = shm_entries()
    result = run(
        [*CARTPOLE_SMALL, "--total_steps", "4000", "--savedir", str(tmp_path), "--xpid", "smoke"],
        marker=marker,
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "smoke"
    rows = read_csv(run_dir / "logs.csv")
    assert int(rows[-1]["step"]) >= 4000
    assert {"total_loss", "pg_loss", "baseline_loss", "entropy_loss"} <= set(rows[0])
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["config"]["env"] == "CartPole-v1" and "git" in meta
    assert (run_dir / "model.tar").is_file()
    assert "SPS" in result.stdout and "return" in result.stdout
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()

    tested = run(
        [
            "--mode",
            "test",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "smoke",
            "--num_test_episodes",
            "3",
        ]
    )
    assert tested.returncode == 0, tested.stderr
    summary = json.loads((run_dir / "test.json").read_text())
    assert summary["episodes"] == 3 and summary["mean_return"] > 0


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--env", "CartPole-v1", "--num_actors", "0"], "--num_actors must be positive"),
        (["--env", "CartPole-v1", "--unroll_length", "-3"], "--unroll_length must be positive"),
        (
            ["--env", "CartPole-v1", "--batch_size", "64", "--num_buffers", "32"],
            "--num_buffers 32 is too small",
        ),
        (["--mode", "test", "--xpid", "never-trained"], "no checkpoint at"),
        (
            ["--env", "CartPole-v1", "--replay_ratio", "1"],
            "--replay_ratio is a flag of --algo laser, not of impala",
        ),
        # Networks that read the observation alone, whatever the flag says.
        (
            ["--algo", "sac", "--env", "Pendulum-v1", "--use_last_action_reward"],
            "--algo sac's built-in network reads the observation alone",
        ),
        (
            ["--algo", "ppo", "--env", "CartPole-v1", "--use_last_action_reward"],
            "the separate_mlp model reads the observation alone",
        ),
        (
            [
                *("--env", "CartPole-v1", "--use_last_action_reward"),
                *("--model", "tests.support.user_models:TinyActorCritic"),
            ],
            "--use_last_action_reward chooses the built-in networks' inputs",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, argv, fragment)


def test_bad_input_from_a_shell_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    assert_refused_in_one_line(tmp_path, ["--env", "NoSuchEnv-v0"], "NoSuchEnv-v0", process=True)


# PPO with a central policy: synchronous actors, two lanes each, waiting on their slots.
SYNCHRONOUS_CENTRAL = ["--algo", "ppo", "--batch_size", "4", "--num_minibatches", "1"]
SYNCHRONOUS_CENTRAL += ["--policy", "central"]


@pytest.mark.parametrize("algo_flags", [[], SYNCHRONOUS_CENTRAL], ids=["impala", "ppo-central"])
def test_ctrl_c_stops_everything(tmp_path, algo_flags):
    """Ctrl-C on a 100M-step run: it stops (a few seconds unloaded; 60 s tells a stop from
    a hang on a loaded machine) with a checkpoint and no traceback, and leaves nothing."""
    marker = uuid.uuid4().hex
    before = shm_entries()
    argv = [
        *CARTPOLE_SMALL,
        *algo_flags,
        "--num_actors",
        "2",
        "--total_steps",
        "100000000",
        "--savedir",
        str(tmp_path),
        "--xpid",
        "ctrlc",
    ]
    proc = start(argv, marker)
    try:
        log = tmp_path / "ctrlc" / "logs.csv"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (log.exists() and len(read_csv(log)) > 2):
            time.sleep(0.2)
        assert log.exists(), "training never started"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert (tmp_path / "ctrlc" / "model.tar").is_file()
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()


@pytest.mark.parametrize("seconds", [0.5, 2.0, 4.0])
def test_ctrl_c_during_start_up_is_one_line(tmp_path, seconds):
    """Ctrl-C to the process group at a moment of start-up (beast's imports, the fork
    server's, the env's probe, the model's build; which one depends on the machine's
    load): exit 130 and one line, or once the run has started its own stop; never a
    traceback, from any of the run's processes."""
    marker = uuid.uuid4().hex
    argv = [*CARTPOLE_SMALL, "--total_steps", "100000000", "--savedir", str(tmp_path)]
    proc = start([*argv, "--xpid", "early"], marker)
    try:
        time.sleep(seconds)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode == 130:
        assert err == "monobeast.py: interrupted\n"
    else:
        assert (proc.returncode, err) == (0, ""), err
        assert "[beast] interrupted: stopping actors and learner" in out
    assert wait_until_gone(marker) == []


@pytest.mark.slow  # about a minute on 2 cores (51 s with -n 2)
@pytest.mark.parametrize("seconds", [round(0.1 + 0.1 * i, 1) for i in range(25)])
def test_ctrl_c_at_every_moment_of_start_up(tmp_path, seconds):
    """The test above at 25 moments, 0.1-2.5 s, which cover beast's and torch's imports,
    the fork server's start and the run's first updates on this 2-core machine. Before
    start-up held Ctrl-C (beast/util/interrupts.py), 1 run in 80 at random moments
    aborted inside torch's import (pybind11, exit -6), and CI saw a run train on."""
    test_ctrl_c_during_start_up_is_one_line(tmp_path, seconds)


def test_old_gym_api_env_learns_through_the_adapter(tmp_path):
    # OldStyleEnv (tests/envs/test_envs.py): old gym API, reward = action, 5 steps.
    # Always choosing action 1 scores 5; a uniform policy scores 2.5.
    result = run_monobeast(
        [
            *CARTPOLE_SMALL,
            "--env",
            "tests.envs.test_envs:OldStyleEnv",
            "--total_steps",
            "20000",
            "--learning_rate",
            "0.01",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "old",
        ]
    )
    assert result.returncode == 0, result.stderr
    # No family by name: its spaces pick the tuned file, and the start-up line says so.
    defaults = "defaults: configs/impala/classic.yaml (vector observations, Discrete actions)"
    assert defaults in result.stdout
    tested = run_monobeast(
        ["--mode", "test", "--savedir", str(tmp_path), "--xpid", "old", "--num_test_episodes", "20"]
    )
    assert tested.returncode == 0, tested.stderr
    assert json.loads((tmp_path / "old" / "test.json").read_text())["mean_return"] >= 4.5


def test_env_error_in_an_actor_stops_the_run_with_one_report(tmp_path):
    marker = uuid.uuid4().hex
    before = shm_entries()
    result = run(
        [
            *CARTPOLE_SMALL,
            "--env",
            "tests.end_to_end.test_monobeast:CrashingEnv",
            "--total_steps",
            "100000",
            "--max_actor_restarts",
            "2",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "crash",
        ],
        marker=marker,
    )
    assert result.returncode == 1
    # Three actors die with the same error; its traceback is printed once.
    assert result.stdout.count("Traceback (most recent call last)") == 1, result.stdout
    assert "tests.end_to_end.test_monobeast:CrashingEnv" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "monobeast.py: error: actor-0 raised RuntimeError: boom: the environment broke; 2 actors"
    ), lines[0]
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()
