"""Every shipped Atari config runs: `--algo A --env PongNoFrameskip-v4` picks
configs/A/atari.yaml, builds its network, replay and optimizer, trains and checkpoints.

A smoke test, not a learning check (docs/learning.md has those): the runs are shrunk to
seconds by the flags of the sizes only (envs, rollout and batch sizes, the replay's
capacity and fill), so that the config's model, optimizer, losses, precision and
preprocessing are the ones a user gets. Each config's replay is also checked to fit a
small machine as shipped (`test_the_shipped_replays_fit_a_small_machine`).
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest

from beast import envs
from beast.algos.build import build_algorithm, build_checked_model, config_for
from beast.config import CONFIGS_DIR
from beast.run.parsing import parse_args
from tests.support.in_process import run_monobeast
from tests.support.runs import read_csv

ATARI_CONFIGS = sorted(
    name for name in os.listdir(CONFIGS_DIR) if os.path.isfile(f"{CONFIGS_DIR}/{name}/atari.yaml")
)
ENV = "PongNoFrameskip-v4"
# A machine of this project's size: 24 GiB, of which the replay may take a third (the
# learner, the actors and the page cache need the rest).
SMALL_MACHINE_REPLAY_BYTES = 8 * 2**30


def shrunk(algo: str) -> list[str]:
    """Flags that make a run of `algo`'s Atari config take seconds: only sizes."""
    fields = {f.name for f in dataclasses.fields(config_for(algo))}
    common = ["--num_actors", "1", "--num_envs_per_actor", "2", "--num_threads", "1"]
    if "seq_len" in fields:  # a sequence replay
        sizes = ["--replay_size", "40", "--min_replay_size", "4", "--seq_len", "10"]
        sizes += ["--seq_overlap", "5", "--burn_in", "2", "--batch_size", "4"]
        sizes += ["--samples_per_insert", "1", "--total_steps", "200"]
    elif "learning_starts" in fields:  # a transition replay
        sizes = ["--replay_size", "2000", "--learning_starts", "100", "--batch_size", "8"]
        sizes += ["--total_steps", "160"]
    else:  # rollouts; a synchronous config's batch is one rollout of each env
        sizes = ["--unroll_length", "8", "--batch_size", "2", "--total_steps", "64"]
        if "replay_size" in fields:  # LASER's replay of rollouts
            sizes += ["--replay_size", "16"]
    return common + sizes


def test_every_algorithm_that_plays_atari_ships_an_atari_config():
    assert {"impala", "laser", "ppo", "dqn", "c51", "rainbow", "apex", "r2d2"} <= set(ATARI_CONFIGS)


@pytest.mark.parametrize("algo", ATARI_CONFIGS)
def test_the_atari_config_trains_and_checkpoints(algo, tmp_path):
    argv = ["--algo", algo, "--env", ENV, "--savedir", str(tmp_path), "--xpid", algo]
    done = run_monobeast(argv + ["--compile", "off", *shrunk(algo)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"defaults: configs/{algo}/atari.yaml" in done.stdout
    rows = [row for row in read_csv(tmp_path / algo / "logs.csv") if row.get("total_loss")]
    assert rows, "no update was logged"
    assert all(math.isfinite(float(row["total_loss"])) for row in rows)
    assert os.path.isfile(tmp_path / algo / "model.tar")


@pytest.mark.parametrize("algo", ATARI_CONFIGS)
def test_the_shipped_replays_fit_a_small_machine(algo):
    config = parse_args(["--algo", algo, "--env", ENV])
    probe = envs.make(ENV)
    try:
        spec = envs.env_spec(probe)
    finally:
        probe.close()
    algorithm = build_algorithm(config, spec)
    layout = algorithm.experience_layout(build_checked_model(algorithm))
    footprint = algorithm.experience().footprint(layout)
    if footprint is not None:
        assert footprint.nbytes <= SMALL_MACHINE_REPLAY_BYTES, footprint
