"""Reliability: killed actors, resumed runs, corrupt checkpoints, bad envs.

End-to-end tests run monobeast.py as a user would, with a unique marker in
the environment so that leftover processes can be found afterwards.
"""

import contextlib
import errno
import os
import random
import signal
import subprocess
import time
import uuid

import gymnasium
import numpy as np
import pytest
import torch

from beast.algos.policies import CategoricalPolicy
from beast.experience.rollout_slots import RolloutBuffers, owner_id, rollout_spec
from beast.fields import box_obs
from beast.outputs.checkpoint import (
    CHECKPOINT_NAME,
    PREVIOUS_CHECKPOINT_NAME,
    CheckpointError,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from tests.support.in_process import run_monobeast
from tests.support.runs import (
    CARTPOLE_FLAGS,
    CARTPOLE_SMALL,
    LineReader,
    actor_pids,
    best_mean_of_100,
    live,
    read_csv,
    run,
    shm_entries,
    start,
    wait_for_rows,
    wait_until_gone,
)

# --- Environments that misbehave ---------------------------------------------------


class WrongShapeEnv(gymnasium.Env):
    """Declares 4-dim observations, returns 3-dim ones from step()."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


class NanRewardEnv(gymnasium.Env):
    """Every reward is NaN: an env bug the actor must name."""

    reward = float("nan")

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), self.reward, False, False, {}


class HugeRewardEnv(NanRewardEnv):
    """Finite rewards whose discounted sums overflow float32: non-finite losses."""

    reward = 3e38


# --- Helpers ----------------------------------------------------------------------


# --- Units ------------------------------------------------------------------------


def test_torn_slot_is_detected_and_reclaim_returns_owned_slots():
    record = CategoricalPolicy(2).record_spec()
    spec = rollout_spec(unroll_length=4, obs=box_obs((2,), np.float32), record=record)
    buffers = RolloutBuffers(spec, 4)
    indices = [buffers.free_queue.get(timeout=1) for _ in range(3)]
    buffers.tensors["rollout_id"][indices[0]] = 7  # one rollout wrote every step
    buffers.tensors["rollout_id"][indices[1]] = 7
    buffers.tensors["rollout_id"][indices[1], 3] = 8  # a second rollout wrote step 3
    assert not buffers.is_torn(indices[0])
    assert buffers.is_torn(indices[1])
    holder = owner_id(1, 0)
    buffers.slot_owner.tensor[[indices[0], indices[2]]] = holder
    assert buffers.reclaim(1, 0) == 2
    assert buffers.free_queue.qsize() == 3
    assert buffers.slot_owner.held() == {}


def test_checkpoint_keeps_previous_and_falls_back(tmp_path):
    save_checkpoint(str(tmp_path), {"model_state_dict": {"w": torch.ones(2)}, "step": 1})
    save_checkpoint(str(tmp_path), {"model_state_dict": {"w": torch.ones(2)}, "step": 2})
    assert load_latest_checkpoint(str(tmp_path))[0]["step"] == 2
    newest = tmp_path / CHECKPOINT_NAME
    newest.write_bytes(newest.read_bytes()[:100])  # a crash mid-write of the newest file
    payload, path, skipped = load_latest_checkpoint(str(tmp_path))
    assert payload["step"] == 1 and path.endswith(PREVIOUS_CHECKPOINT_NAME) and skipped
    (tmp_path / PREVIOUS_CHECKPOINT_NAME).write_bytes(b"garbage")
    with pytest.raises(CheckpointError):
        load_latest_checkpoint(str(tmp_path))


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    save_checkpoint(str(tmp_path), {"model_state_dict": {}, "step": 1})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint(str(tmp_path), {"model_state_dict": {}, "step": 2})
    assert load_latest_checkpoint(str(tmp_path))[0]["step"] == 1
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_NAME]  # no temp file left behind


class _Payload:
    """Unpickling this would run code; a safe loader must refuse it."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"model_state_dict": {}, "evil": _Payload()}, path)
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        load_checkpoint(str(path))


# --- End to end ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kills, steps_between, floor",
    [
        # The default run: 10 kills, one every 2,000 agent steps of the run's own progress.
        pytest.param(10, 2_000, None, id="survives"),
        # And learning goes on through them: 20 kills, one every 25,000 steps, the run
        # stopped past 525k steps, with the floor of the default learning check
        # (test_learning.py), whose unkilled runs of this config spread from 383 to 493. A
        # run with kills reached 432 on CI, and random play averages 22.
        pytest.param(20, 25_000, 300, id="learns", marks=pytest.mark.slow),
    ],
)
def test_cartpole_run_survives_actor_kills(tmp_path, kills, steps_between, floor):
    """Actors SIGKILLed on a schedule of the run's progress (one each time the logged step
    passes the next multiple of `steps_between`): each is replaced, every batch slot still
    holds exactly one rollout, and the run, stopped by the test once every kill was
    replaced and it went on for as long again, ends as a Ctrl-C ends it and leaves
    nothing behind. Counted in events, not seconds: a machine of any speed kills as often
    per step, and the run lasts until the kills are done."""
    marker = uuid.uuid4().hex
    before = shm_entries()
    argv = [*CARTPOLE_FLAGS, "--total_steps", "100000000", "--max_actor_restarts", "1000"]
    argv += ["--savedir", str(tmp_path), "--xpid", "kills", "--log_interval", "0.5"]
    proc = start(argv, marker, stderr=subprocess.STDOUT)
    output = LineReader(proc.stdout)
    log = tmp_path / "kills" / "logs.csv"
    rng = random.Random(0)
    killed: list[int] = []

    def logged_step() -> int:
        rows = read_csv(log) if log.exists() else []
        return int(rows[-1]["step"]) if rows else 0

    try:
        # A bound on a stalled run, not on speed: it must log progress every 120 s.
        step, stalled_at = 0, time.monotonic() + 120
        while True:
            assert proc.poll() is None, output.text()
            if logged_step() > step:
                step, stalled_at = logged_step(), time.monotonic() + 120
            assert time.monotonic() < stalled_at, f"no progress past step {step}"
            replaced = output.text_so_far().count("killed by SIGKILL")
            if len(killed) == kills and replaced == kills:
                if step >= (kills + 1) * steps_between:  # the replacements acted too
                    break
            elif len(killed) < kills and step >= (len(killed) + 1) * steps_between:
                pids = [pid for pid in actor_pids(proc.pid) if pid not in killed and live(pid)]
                if pids:
                    pid = rng.choice(pids)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = output.text()
    # Stopped as Ctrl-C stops a run: a final checkpoint, exit 0.
    assert proc.returncode == 0, out
    assert "interrupted: stopping actors and learner" in out and "Traceback" not in out, out
    # Every kill was seen and its actor replaced, once.
    assert out.count("killed by SIGKILL") == len(killed) == kills, out
    rows = read_csv(log)
    assert int(rows[-1]["step"]) >= (kills + 1) * steps_between
    # The invariant: every slot of every batch held exactly one rollout.
    assert int(rows[-1]["torn_rollouts"]) == 0
    if floor is not None:
        assert best_mean_of_100(tmp_path / "kills") >= floor
    print(f"survived {kills} actor kills")
    # As long as polybeast's checks allow: CI once found one process of this run still
    # there 5 s after its exit, which no run here has left for an instant (what it was is
    # unknown: the check named only its pid then; it names state, parent and command now).
    assert wait_until_gone(marker, timeout=15) == []
    assert shm_entries() - before == set()


def test_sigterm_then_resume_continues_counters_and_optimizer(tmp_path):
    marker = uuid.uuid4().hex
    argv = [*CARTPOLE_SMALL, "--optimizer", "adam", "--savedir", str(tmp_path)]
    argv += ["--xpid", "resume"]
    proc = start([*argv, "--total_steps", "100000000"], marker)
    try:
        wait_for_rows(tmp_path / "resume" / "logs.csv", 6, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    first = load_checkpoint(str(tmp_path / "resume" / CHECKPOINT_NAME))
    stopped_at = first["progress"]["step"]
    assert stopped_at > 0
    assert wait_until_gone(marker) == []

    result = run_monobeast([*argv, "--total_steps", str(stopped_at + 5000)])
    assert result.returncode == 0, result.stderr
    assert f"at step {stopped_at:,}" in result.stdout and "resuming resume" in result.stdout
    final = load_checkpoint(str(tmp_path / "resume" / CHECKPOINT_NAME))
    assert final["progress"]["step"] >= stopped_at + 5000
    # Adam's per-parameter step count went on from where it stopped: the
    # optimizer state was restored, not rebuilt.
    adam_steps = final["algorithm_state"]["optimizer"]["state"][0]["step"]
    assert int(adam_steps) == final["progress"]["num_updates"] > first["progress"]["num_updates"]
    steps = [int(row["step"]) for row in read_csv(tmp_path / "resume" / "logs.csv")]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # counters never restart


def test_resume_falls_back_from_a_corrupt_checkpoint(tmp_path):
    argv = [
        *CARTPOLE_SMALL,
        "--checkpoint_interval",
        "0.5",
        "--savedir",
        str(tmp_path),
        "--xpid",
        "corrupt",
    ]
    assert run_monobeast([*argv, "--total_steps", "6000"]).returncode == 0
    newest = tmp_path / "corrupt" / CHECKPOINT_NAME
    assert (tmp_path / "corrupt" / PREVIOUS_CHECKPOINT_NAME).is_file()
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    result = run_monobeast([*argv, "--total_steps", "9000"])
    assert result.returncode == 0, result.stderr
    assert "the newest checkpoint is unusable" in result.stdout
    assert f"from {tmp_path / 'corrupt' / PREVIOUS_CHECKPOINT_NAME}" in result.stdout

    for name in (CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME):
        (tmp_path / "corrupt" / name).write_bytes(b"not a checkpoint")
    result = run_monobeast([*argv, "--total_steps", "12000"])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "cannot load checkpoint" in result.stderr


def test_resume_with_a_different_model_names_the_mismatch(tmp_path):
    argv = [*CARTPOLE_SMALL, "--total_steps", "2000", "--savedir", str(tmp_path), "--xpid", "m"]
    assert run_monobeast(argv).returncode == 0
    result = run_monobeast([*argv, "--use_lstm"])
    assert result.returncode == 2
    assert "--use_lstm False in the checkpoint, True now" in result.stderr.strip()


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (
            [
                "--env",
                "tests.end_to_end.test_reliability:WrongShapeEnv",
                "--max_actor_restarts",
                "0",
            ],
            1,
            "observation of shape (3,) from step(), but its observation_space has shape (4,)",
        ),
        (
            [
                "--env",
                "tests.end_to_end.test_reliability:NanRewardEnv",
                "--max_actor_restarts",
                "0",
            ],
            1,
            "returned a non-finite reward nan",
        ),
        (
            [
                "--env",
                "tests.end_to_end.test_reliability:HugeRewardEnv",
                "--reward_clipping",
                "none",
            ]
            + ["--max_nonfinite_updates", "3"],
            1,
            "3 consecutive updates had a non-finite loss or gradient",
        ),
    ],
)
def test_bad_envs_stop_with_one_line(tmp_path, argv, code, fragment):
    marker = uuid.uuid4().hex
    before = shm_entries()
    result = run(
        [*CARTPOLE_SMALL, "--total_steps", "100000", *argv, "--savedir", str(tmp_path)],
        marker=marker,
    )
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()


def test_unwritable_savedir_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    marker = uuid.uuid4().hex
    result = run([*CARTPOLE_SMALL, "--savedir", str(blocker / "runs")], marker=marker)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the run directory" in lines[0], result.stderr
    assert wait_until_gone(marker) == []
