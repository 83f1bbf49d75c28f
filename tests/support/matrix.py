"""The algorithm x entry point x policy matrix's settings (tests/end_to_end/test_matrix.py),
shared with the tests that run the same small configurations (evaluation runs, Dict
observations, export): each algorithm's smoke flags, its env, the two entry points'
layouts, and one Ray cluster for every polybeast run of a module."""

from __future__ import annotations

import subprocess

import pytest

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
