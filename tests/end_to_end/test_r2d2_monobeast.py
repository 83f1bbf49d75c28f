"""monobeast.py with --algo r2d2 / apex end to end: subprocess runs on real envs.

Smoke runs (tiny replays, a few thousand steps) check that a run trains,
logs, checkpoints the target network and the replay, resumes, and that --mode
test loads the checkpoint and acts with the Q-network; nothing may outlive a
run. The learning checks are tests/end_to_end/test_learning.py's (-m slow).
"""

import dataclasses
import json
import uuid

import numpy as np
import pytest
import torch

from beast import envs
from beast.algos.build import build_algorithm, build_checked_model
from beast.run.build import build_experience
from beast.run.parsing import parse_args
from beast.run.plan import RunPlan, cpu_bf16_native, select_policy, select_precision
from tests.support.runs import (
    APEX_SMALL,
    R2D2_SMALL,
    assert_refused_in_one_line,
    read_csv,
    run,
    shm_entries,
    wait_until_gone,
)


def shm_segments() -> set[str]:
    """/dev/shm entries other than POSIX semaphores, which beast never creates (others'
    multiprocessing locks come and go there on a shared machine)."""
    return {name for name in shm_entries() if not name.startswith("sem.")}


def train_and_test(tmp_path, argv, xpid, total_steps=3000):
    """Train, check the run's records and checkpoint, then --mode test it."""
    marker = uuid.uuid4().hex
    before = shm_segments()
    result = run(
        [*argv, "--total_steps", str(total_steps), "--savedir", str(tmp_path), "--xpid", xpid],
        marker=marker,
    )
    assert result.returncode == 0, result.stderr
    unit = "sequences" if argv[1] == "r2d2" else "transitions"
    assert f"prioritized replay of 200 {unit}" in result.stdout
    run_dir = tmp_path / xpid
    rows = read_csv(run_dir / "logs.csv")
    checkpoint = torch.load(run_dir / "model.tar", weights_only=True)
    # The run ends when the actors have taken total_steps env steps, which can fall
    # between two updates: the checkpoint has the final count, logs.csv the last update's.
    assert checkpoint["step"] >= total_steps
    assert 0 < int(rows[-1]["step"]) <= checkpoint["step"]
    assert {"total_loss", "mean_q", "grad_norm", f"inserted_{unit}", "replay_fill"} <= set(rows[0])
    # Env steps (the step column) come from the actors, not from the batches.
    assert int(rows[-1][f"inserted_{unit}"]) > 0 and int(rows[-1]["num_updates"]) > 0
    assert len(read_csv(run_dir / "episodes.csv")) > 0
    assert checkpoint["config"]["algo"] == argv[1]
    target = checkpoint["algorithm_state"]["target_model"]
    assert target.keys() == checkpoint["model_state_dict"].keys()
    assert checkpoint["replay"]["tree"]["priorities"].sum() > 0
    assert (run_dir / "replay.tar").is_file()
    assert wait_until_gone(marker) == []
    assert shm_segments() - before == set()

    tested = run(
        ["--mode", "test", "--savedir", str(tmp_path), "--xpid", xpid, "--num_test_episodes", "2"]
    )
    assert tested.returncode == 0, tested.stderr
    summary = json.loads((run_dir / "test.json").read_text())
    assert summary["episodes"] == 2 and summary["mean_return"] > 0
    return result


def test_r2d2_trains_checkpoints_and_tests(tmp_path):
    # Resuming, replay included: tests/experience/test_replay_resume.py.
    train_and_test(tmp_path, R2D2_SMALL, "r2d2")
    # A Q-network checkpoint does not fit another algorithm.
    argv = [*APEX_SMALL, "--total_steps", "5000", "--xpid", "r2d2"]
    assert_refused_in_one_line(tmp_path, argv, "--algo 'r2d2' in the checkpoint, 'apex' now")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--algo", "r2d2", "--num_actors", "auto"], "give numbers with --algo r2d2"),
        (["--algo", "apex", "--use_lstm"], "--algo apex trains a feed-forward Q-network"),
        (
            ["--algo", "r2d2", "--seq_len", "30", "--burn_in", "30"],
            "--burn_in must be in [0, --seq_len 30)",
        ),
        (
            ["--algo", "apex", "--replay_size", "100", "--learning_starts", "200"],
            "--learning_starts 200 exceeds --replay_size 100",
        ),
        (["--algo", "r2d2", "--frame_dedup"], "--frame_dedup does not fit CartPole-v1"),
    ],
)
def test_bad_r2d2_flags_are_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, [*argv, "--env", "CartPole-v1"], fragment)


def test_run_pieces_follow_the_algo():
    # In-process: the engine's builders for r2d2 and apex, no subprocess.
    atari = envs.EnvSpec(obs_shape=(4, 84, 84), obs_dtype=np.uint8, num_actions=6)
    r2d2 = build_algorithm(parse_args(["--algo", "r2d2", "--env", "PongNoFrameskip-v4"]), atari)
    apex_config = parse_args(["--algo", "apex", "--env", "PongNoFrameskip-v4", "--n_step", "3"])
    apex = build_algorithm(apex_config, atari)
    assert r2d2.sequence_layout() == (80, 40, 40)
    assert apex.experience().n_step == 3  # an n-step transition from every step
    assert build_checked_model(r2d2).core is not None  # R2D2 is recurrent
    assert build_checked_model(apex).core is None
    for algorithm in (r2d2, apex):
        # Central inference on a GPU, as for every algorithm; a Q-network learns in bf16
        # where the CPU has it (its built-in model keeps the Q-values in float32), and a
        # user's Q-network in fp32.
        assert select_policy(algorithm.config, torch.device("cuda")) == "central"
        cpu = torch.device("cpu")
        native = "bf16" if cpu_bf16_native() else "fp32"
        assert select_precision(algorithm.config, cpu, atari, type(algorithm)) == native
        user = dataclasses.replace(algorithm.config, model="tests.support.user_models:TinyQNetwork")
        assert select_precision(user, cpu, atari, type(algorithm)) == "fp32"
    small = build_algorithm(
        dataclasses.replace(apex_config, replay_size=160, learning_starts=5), atari
    )
    model = build_checked_model(small)
    plan = RunPlan(small.config, atari, small, model, torch.device("cpu"), "fp32", "local")
    sink, _ = build_experience(plan, model, 1)
    assert sink.replay.spec["obs"].shape == (4, 84, 84)  # each step once, in its env's ring
    # Frame dedup (configs/apex/atari.yaml): the newest frame of each step's stack.
    assert sink.replay.tensors["frames"].shape == (8, 20, 84, 84)
