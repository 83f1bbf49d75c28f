"""Replays survive a resume: a run stopped with SIGTERM saves its replay with its final
checkpoint (RUN_DIR/replay.tar, and the rest in model.tar), and the resumed run starts
from exactly that replay: its fill, its contents and (prioritized replay) its priorities
and generations; the rate limiter's counters too. With --no-checkpoint_replay the
resumed run starts cold and says so."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
import torch

from beast.run.parsing import parse_args
from beast.run.runner import start_run
from tests.support.in_process import run_monobeast
from tests.support.runs import CARTPOLE_SMALL, R2D2_SMALL, read_csv, start, wait_until_gone

LASER_SMALL = ["--algo", "laser", *CARTPOLE_SMALL, "--replay_size", "50", "--batch_size", "4"]
RAINBOW_SMALL = ["--algo", "rainbow", *CARTPOLE_SMALL, "--replay_size", "400"]
RAINBOW_SMALL += ["--learning_starts", "20", "--samples_per_insert", "0.5"]
# SAC: its replay, and its learner's state (temperature, three optimizers, targets).
SAC_SMALL = ["--algo", "sac", "--env", "Pendulum-v1", "--num_actors", "1"]
SAC_SMALL += ["--num_envs_per_actor", "2", "--batch_size", "16", "--net_arch", "32,32"]
SAC_SMALL += ["--replay_size", "4000", "--learning_starts", "50", "--num_threads", "1"]
RUNS = {"r2d2": R2D2_SMALL, "laser": LASER_SMALL, "rainbow": RAINBOW_SMALL, "sac": SAC_SMALL}
RUNS = {algo: [*argv, "--log_interval", "0.2"] for algo, argv in RUNS.items()}
RING_REPLAYS = ("rainbow", "sac")


def train_then_sigterm(tmp_path, argv, xpid):
    marker = uuid.uuid4().hex
    proc = start(
        [*argv, "--total_steps", "10000000", "--savedir", str(tmp_path), "--xpid", xpid], marker
    )
    log = tmp_path / xpid / "logs.csv"
    try:
        while proc.poll() is None and not (log.exists() and len(read_csv(log)) >= 10):
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "interrupted" in out and wait_until_gone(marker) == []
    return out


@pytest.mark.parametrize("algo", list(RUNS))
def test_sigterm_then_resume_restores_the_replay_as_saved(tmp_path, algo):
    argv = RUNS[algo]
    train_then_sigterm(tmp_path, argv, algo)
    checkpoint = torch.load(tmp_path / algo / "model.tar", weights_only=True)
    saved_meta = checkpoint["replay"]
    saved = torch.load(tmp_path / algo / "replay.tar", weights_only=True)
    assert saved["token"] == saved_meta["token"]

    # What a resumed run holds before it starts its actors and learner.
    config = parse_args([*argv, "--savedir", str(tmp_path), "--xpid", algo])
    run_, log = start_run(config)
    try:
        replay = run_.source.replay
        if algo in RING_REPLAYS:  # per-env rings, saved whole, with their write counts
            assert torch.equal(replay.written, saved["tensors"]["written"])
            assert len(replay) > 0
            size = min(replay.ring, int(replay.written.max()))
            for key, tensor in replay.tensors.items():
                assert torch.equal(tensor[:, :size], torch.stack(saved["tensors"][key])), key
        else:
            assert len(replay) == saved_meta["size"] > 0
            for key, tensor in saved["tensors"].items():
                assert torch.equal(replay.tensors[key][: saved_meta["size"]], tensor), key
        if algo in ("r2d2", *RING_REPLAYS):
            tree = replay.tree.state_dict()
            assert torch.equal(tree["priorities"], saved_meta["tree"]["priorities"])
            assert torch.equal(tree["generations"], saved_meta["tree"]["generations"])
            assert tree["claims"] == saved_meta["tree"]["claims"]
            assert replay.tree.total() > 0  # sampleable at once
            assert run_.source.sink.total_inserted() == saved_meta["inserted"]
            assert int(run_.source.sink.sampled[0]) == saved_meta["sampled"]
        else:
            assert replay._next == saved_meta["next"]
        if algo == "sac":  # the temperature, every optimizer and the targets, as saved
            saved_state = checkpoint["algorithm_state"]
            state = run_.update.state_dict()
            assert torch.equal(state["log_alpha"], saved_state["log_alpha"])
            assert state["num_updates"] == saved_state["num_updates"] > 0
            for name in ("actor_optimizer", "critic_optimizer", "alpha_optimizer"):
                mine, theirs = state[name]["state"], saved_state[name]["state"]
                assert mine.keys() == theirs.keys() and mine
                for key, values in mine.items():
                    for field, value in values.items():
                        assert torch.equal(value, theirs[key][field]), (name, key, field)
            for key, value in state["target"].items():
                assert torch.equal(value, saved_state["target"][key]), key
            assert float(run_.model.epsilon) == 0.0  # the warm-up stays over
    finally:
        log.close()
        run_.source.close()

    # And the resumed run goes on from it.
    resumed = run_monobeast(
        [*argv, "--total_steps", str(checkpoint["step"] + 2000)]
        + ["--savedir", str(tmp_path), "--xpid", algo]
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "restored replay of" in resumed.stdout
    if algo == "laser":  # and a user who prefers a cold replay can have one
        step = torch.load(tmp_path / algo / "model.tar", weights_only=True)["step"]
        cold = run_monobeast(
            [*argv, "--no-checkpoint_replay", "--total_steps", str(step + 500)]
            + ["--savedir", str(tmp_path), "--xpid", algo]
        )
        assert cold.returncode == 0, cold.stderr
        assert "replay not restored (--no-checkpoint_replay)" in cold.stdout


def test_a_checkpoint_writes_the_replay_while_the_learner_goes_on(tmp_path, monkeypatch):
    """The learner's lock is held only while the model's and the algorithm's state are
    copied: an Atari replay takes tens of seconds to write (Ape-X's 7 GB), and a learner
    waiting for it held the actors back too (SPS fell to 400-800 from 1,300 at each
    checkpoint). What an update changes while the files are written does not reach
    model.tar, whose replay token still names the replay.tar written beside it."""
    run, log = start_run(parse_args([*RUNS["rainbow"], "--savedir", str(tmp_path), "--xpid", "x"]))
    try:
        before = {key: value.clone() for key, value in run.model.state_dict().items()}
        save_replay = run.source.save_replay
        lock_held = []

        def save_replay_while_updating(write):
            lock_held.append(run.learner.lock.locked())
            with torch.no_grad():  # as an update in the learner's thread would, meanwhile
                for parameter in run.model.parameters():
                    parameter.add_(1.0)
            return save_replay(write)

        monkeypatch.setattr(run.source, "save_replay", save_replay_while_updating)
        assert run.save() is True
        assert lock_held == [False]
        saved = torch.load(tmp_path / "x" / "model.tar", weights_only=True)
        for key, value in before.items():
            assert torch.equal(saved["model_state_dict"][key], value), key
        replay = torch.load(tmp_path / "x" / "replay.tar", weights_only=True)
        assert saved["replay"]["token"] == replay["token"]
    finally:
        log.close()
        run.source.close()
