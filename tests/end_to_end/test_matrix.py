"""Every algorithm in every mode: {impala, laser, r2d2, apex, ppo, a2c, dqn, c51, rainbow,
sac, td3, ddpg} x {monobeast local, monobeast central, polybeast local, polybeast
central}. Each runs a short CartPole training (Pendulum for the continuous-action
algorithms) through its entry point's main with the user's flags (in this process:
tests/support/in_process.py), writes a checkpoint, and `--mode test` loads that checkpoint and
plays an episode with the algorithm's evaluation policy. Algorithms that share another's
acting and experience run one cell (ONE_CELL); cells that other default cells cover run
with `-m slow` (SLOW_CELLS).

The runs are small (a few thousand steps, tiny replays) but real: the algorithm's own
actors, sink, learner and checkpoint; learning itself is checked elsewhere
(tests/end_to_end/test_learning.py, slow runs)."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest
import torch

import monobeast
from beast.algos import ALGORITHMS
from tests.support.in_process import run_monobeast, run_polybeast

TOTAL_STEPS = 2000
# Small enough for smoke runs: replays learn from their 20th sequence.
ALGO_FLAGS = {
    "impala": [],
    "laser": ["--replay_size", "20"],
    "r2d2": ["--replay_size", "200", "--min_replay_size", "20", "--samples_per_insert", "0.5"]
    + ["--seq_len", "10", "--seq_overlap", "5", "--burn_in", "5"],
    "apex": ["--replay_size", "400", "--learning_starts", "20", "--samples_per_insert", "0.5"]
    + ["--n_step", "3"],
    "dqn": ["--replay_size", "400", "--learning_starts", "20", "--samples_per_insert", "0.5"],
    "c51": ["--replay_size", "400", "--learning_starts", "20", "--samples_per_insert", "0.5"],
    "rainbow": ["--replay_size", "400", "--learning_starts", "20", "--samples_per_insert", "0.5"],
    # --batch_size 4 is one rollout of each of the 2x2 envs: PPO/A2C's synchronous batch.
    "ppo": ["--num_epochs", "2", "--num_minibatches", "4"],
    "a2c": [],
    # Continuous actions: Pendulum (ENVS), tiny networks, an update per 4 env steps.
    **{
        algo: ["--replay_size", "400", "--learning_starts", "20", "--net_arch", "32,32"]
        + ["--utd_ratio", "0.25"]
        for algo in ("sac", "td3", "ddpg")
    },
}
# CartPole-v1 unless the algorithm needs continuous actions.
ENVS = {"sac": "Pendulum-v1", "td3": "Pendulum-v1", "ddpg": "Pendulum-v1"}
# Algorithms whose acting and experience are another's, with only their loss differing:
# they run one cell, and the other runs them all.
ONE_CELL = {"c51": "rainbow", "dqn": "rainbow", "td3": "sac", "ddpg": "sac", "a2c": "ppo"}
# Cells whose code paths other default cells already run, kept for `-m slow`: Rainbow on
# polybeast is Ape-X's transition replay on the env servers with Rainbow's acting, which
# its monobeast cells run.
SLOW_CELLS = {("rainbow", "polybeast.py", "local"), ("rainbow", "polybeast.py", "central")}
LAYOUT = {
    "monobeast.py": ["--num_actors", "2", "--num_envs_per_actor", "2"],
    "polybeast.py": ["--num_env_servers", "2", "--num_envs_per_server", "2"],
}
COMMON = ["--unroll_length", "10", "--batch_size", "4"]
COMMON += ["--num_threads", "1", "--log_interval", "1", "--total_steps", str(TOTAL_STEPS)]


def entry(script: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Run `script`'s main with `argv` in this process (tests/support/in_process.py): polybeast.py
    joins the module's Ray cluster."""
    return run_monobeast(argv) if script == "monobeast.py" else run_polybeast(argv)


@pytest.fixture(scope="module")
def ray_address():
    """One Ray head for every polybeast cell, which joins it with --ray_address: a private
    instance per run would cost each its start-up (the private path has its own tests in
    tests/poly/test_polybeast.py)."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False}
    )
    yield cluster.address
    cluster.shutdown()


def test_the_matrix_covers_every_registered_algorithm():
    assert set(ALGO_FLAGS) == set(ALGORITHMS)


CELLS = [
    pytest.param(
        algo,
        script,
        policy,
        marks=[pytest.mark.slow] if (algo, script, policy) in SLOW_CELLS else [],
        id=f"{algo}-{script}-{policy}",
    )
    for algo in ALGO_FLAGS
    for script in ("monobeast.py", "polybeast.py")
    for policy in ("local", "central")
]


@pytest.mark.parametrize("algo, script, policy", CELLS)
def test_every_algorithm_trains_checkpoints_and_tests_in_every_mode(
    tmp_path, request, algo, script, policy
):
    if algo in ONE_CELL and (script, policy) != ("monobeast.py", "local"):
        pytest.skip(f"{algo} shares every mode's code with {ONE_CELL[algo]}, which runs here")
    xpid = f"{algo}-{script[:4]}-{policy}"
    env = ENVS.get(algo, "CartPole-v1")
    argv = ["--algo", algo, "--env", env, *COMMON, *LAYOUT[script], *ALGO_FLAGS[algo]]
    argv += ["--policy", policy]
    if script == "polybeast.py":
        argv += ["--ray_address", request.getfixturevalue("ray_address")]
    trained = entry(script, [*argv, "--savedir", str(tmp_path), "--xpid", xpid])
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-3000:]
    assert f"reached total_steps {TOTAL_STEPS:,}" in output
    checkpoint = torch.load(tmp_path / xpid / "model.tar", weights_only=True)
    assert checkpoint["config"]["algo"] == algo and checkpoint["step"] >= TOTAL_STEPS
    assert checkpoint["progress"]["num_updates"] > 0  # the learner did learn
    with open(tmp_path / xpid / "logs.csv") as f:
        last = list(csv.DictReader(f))[-1]
    assert last.get("torn_rollouts", "0") == "0"  # rollouts arrive whole, however made
    # --mode test through the same entry point, in this process (no start-up to pay).
    argv = ["--mode", "test", "--savedir", str(tmp_path), "--xpid", xpid]
    assert monobeast.main([*argv, "--num_test_episodes", "1"]) == 0
    summary = json.loads((tmp_path / xpid / "test.json").read_text())
    assert summary["episodes"] == 1
    # CartPole pays +1 a step; Pendulum's costs are negative, never below -16.3 a step.
    assert summary["mean_return"] > 0 if env == "CartPole-v1" else summary["mean_return"] > -3300
