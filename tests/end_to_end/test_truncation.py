"""A time limit, end to end, for every algorithm's target: a tiny env with a time limit
runs through the real env batch, actor, policy and sink of each algorithm; the value
targets its learner computes on the batch it gets are checked against values worked
out by hand. At the truncated step they must bootstrap from the value of the final
observation: not from 0 (a terminal state), not from the next episode's first
observation.

The env (`ChainEnv`): observation [t], t = 0 at reset; reward 1 per step; the episode
is cut by a time limit after 3 steps, so its final observation is [3] (never a
terminal state). The network's values are known functions of the observation:
V(x) = 10 x + 1 for the actor-critics, Q(x, a) = 10 x + a for the Q-learners (greedy
action 1, so max_a Q = V), both on-policy (uniform logits for the actor-critics).
With gamma = 0.9 the targets of the episode's steps x = 2, 1, 0 are

    x = 2:  1 + 0.9 * V(3)              = 1 + 0.9 * 31       = 28.9
    x = 1:  1 + 0.9 * 28.9              = 27.01
    x = 0:  1 + 0.9 * 27.01             = 25.309

(V-trace with rho = c = 1 on policy; R2D2's 3-step double-Q target and the DQN family's
on its transition replay, without value rescaling, are the same sum). Treating the time
limit as terminal would give 1, 1.9, 2.71; bootstrapping from the next episode's first
observation 1.9, ...
"""

from __future__ import annotations

import os

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from beast.acting.actor import Actor, ActorSettings
from beast.algos.base import as_outputs
from beast.algos.build import build_algorithm
from beast.algos.dqn import q_learning_targets
from beast.algos.nstep import n_step_returns
from beast.algos.r2d2 import n_step_double_q_targets
from beast.envs import env_spec, make
from beast.run.build import build_experience
from beast.run.parsing import parse_args
from beast.run.plan import RunPlan
from beast.util.profile import ACTOR_PHASES, PhaseClock

LIMIT, GAMMA = 3, 0.9
EXPECTED = {2: 28.9, 1: 27.01, 0: 25.309}


class ChainEnv(gymnasium.Env):
    """obs [t]; reward 1; truncated (a time limit, not a terminal state) after LIMIT steps."""

    observation_space = spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, self.t >= LIMIT, {}


class KnownValues(nn.Module):
    """Uniform logits, V(x) = 10x + 1, Q(x, a) = 10x + a; feed-forward."""

    def __init__(self, obs_shape=(1,), num_actions=2):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(10.0))  # a parameter, so models have one

    def initial_state(self, batch_size):
        return ()

    def forward(self, inputs, core_state=()):
        x = inputs["obs"][..., 0].float() * self.scale
        actions = torch.arange(2, dtype=x.dtype)
        return {
            "policy_logits": torch.zeros((*x.shape, 2)),
            "baseline": x + 1.0,
            "q_values": x.unsqueeze(-1) + actions,
        }, ()


ENV = "tests.end_to_end.test_truncation:ChainEnv"
FLAGS = {
    "impala": ["--entropy_cost", "0", "--baseline_cost", "1"],
    "laser": ["--entropy_cost", "0", "--baseline_cost", "1", "--replay_size", "8"],
    "r2d2": ["--seq_len", "10", "--seq_overlap", "5", "--burn_in", "0", "--n_step", "3"]
    + ["--no-value_rescaling", "--replay_size", "64", "--min_replay_size", "1"],
    "apex": ["--n_step", "3", "--replay_size", "64", "--learning_starts", "1"],
    "dqn": ["--n_step", "3", "--replay_size", "64", "--learning_starts", "1"]
    + ["--exploration", "per_env", "--samples_per_insert", "0"],  # no schedule, no learner
}


def run_actor(algo: str):
    """The algorithm's real actor, sink and source on ChainEnv; returns (config, source)."""
    # The built-in defaults (--config none), not the classic file ChainEnv's spaces pick:
    # the flags below are all the test sets.
    config = parse_args(
        ["--algo", algo, "--env", ENV, "--config", "none", "--discounting", str(GAMMA)]
        + ["--reward_clipping", "none"]
        + ["--num_actors", "1", "--num_envs_per_actor", "2", "--unroll_length", "10"]
        + ["--batch_size", "4", *FLAGS[algo]]
    )
    probe = make(ENV)
    spec = env_spec(probe)
    probe.close()
    algorithm = build_algorithm(config, spec)
    model = KnownValues()
    plan = RunPlan(config, spec, algorithm, model, torch.device("cpu"), "fp32", "local")
    sink, source = build_experience(plan, model, 1)
    settings = ActorSettings(
        env=ENV,
        seed=0,
        num_actors=1,
        num_envs=2,
        episodic_life=False,
        policy=algorithm.acting_rule(),
    )
    clock = PhaseClock(torch.zeros(len(ACTOR_PHASES), dtype=torch.float64), ACTOR_PHASES)
    actor = Actor(0, 0, settings, sink, model, os.getpid(), clock)
    return algorithm, model, actor, source


def rollout_batch(actor, source):
    """Step the actor until the source has a batch (two, for LASER's replay to mix in)."""
    batches = []
    with torch.no_grad():
        while len(batches) < 3:
            actor.step()
            batch = source.poll()
            if batch is not None:
                batches.append(batch)
    actor.close()
    return batches[-1]


def check_targets(obs, targets, valid, truncated):
    """Every trained step of an episode that the batch holds up to its truncation has the
    hand-worked target; returns how many were checked."""
    checked = 0
    steps, columns = obs.shape
    for b in range(columns):
        for t in range(steps):
            if not truncated[t, b]:
                continue
            for back, x in ((1, 2), (2, 1), (3, 0)):
                row = t - back
                if row >= 0 and valid[row, b]:
                    assert obs[row, b] == x
                    assert targets[row, b] == pytest.approx(EXPECTED[x], rel=1e-6)
                    checked += 1
    return checked


@pytest.mark.parametrize("algo", ["impala", "laser"])
def test_vtrace_targets_bootstrap_from_the_final_observation(algo):
    algorithm, model, actor, source = run_actor(algo)
    batch = rollout_batch(actor, source)
    data = batch.data
    assert data["truncated"].any(), "the batch should hold a time limit"
    outputs = {key: value.detach() for key, value in as_outputs(model(data)[0]).items()}
    baseline = outputs["baseline"].clone().requires_grad_()
    loss = algorithm.loss_fn()(
        {"policy_logits": outputs["policy_logits"], "baseline": baseline}, data
    )
    loss.total_loss.backward()
    # baseline_cost 1: d/dV_t 0.5 (vs_t - V_t)^2 = V_t - vs_t, so vs_t = V_t - grad_t.
    vs = (baseline - baseline.grad).detach()[:-1]
    valid = ~data["truncated"][:-1]
    obs = data["obs"][:-1, :, 0]
    assert check_targets(obs, vs, valid, data["truncated"][:-1]) > 0
    # The truncated step itself trains nothing: no gradient reaches V(final obs) there.
    assert (baseline.grad[:-1][data["truncated"][:-1]] == 0).all()


@pytest.mark.parametrize("algo", ["r2d2"])
def test_n_step_double_q_targets_bootstrap_from_the_final_observation(algo):
    algorithm, model, actor, source = run_actor(algo)
    with torch.no_grad():
        for _ in range(40):
            actor.step()
    actor.close()
    replay = source.replay
    sample = replay.sample(len(replay))
    data = sample.batch
    assert data["truncated"].any(), "the replay should hold a time limit"
    q = as_outputs(model(data)[0])["q_values"].detach()
    targets = n_step_double_q_targets(
        q,
        q,
        data["reward"],
        data["terminated"],
        data["truncated"],
        data["mask"],
        n_step=algorithm.config.n_step,
        discounting=GAMMA,
        rescale_eps=None,
        truncate_at_end=True,
    )
    obs = data["obs"][..., 0]
    assert check_targets(obs, targets.targets, targets.valid, data["truncated"]) > 0
    assert not (targets.valid & data["truncated"]).any()  # a final observation trains nothing


@pytest.mark.parametrize("algo", ["apex", "dqn"])
def test_transition_targets_bootstrap_from_the_final_observation(algo):
    """The transition replay (beast/experience/transition_replay.py): a window that reaches the
    truncated row stops there (k = 3, 2, 1 from x = 0, 1, 2), and its bootstrap row is the
    final observation [3]; no transition starts at it."""
    algorithm, model, actor, source = run_actor(algo)
    with torch.no_grad():
        for _ in range(40):
            actor.step()
    actor.close()
    replay = source.replay
    data = replay.sample(4 * replay.capacity).batch
    obs = data["obs"][..., 0]  # [2, B]: x_s and x_{s+k}
    q = as_outputs(model(data)[0])["q_values"].detach()
    returns = n_step_returns(data["n_step_rewards"], data["n_steps"], GAMMA)
    targets = q_learning_targets(returns, data["terminal"], q[1], q[1])
    assert (obs[0] != LIMIT).all()  # a final observation starts nothing
    assert (obs[1] == LIMIT).all() and not data["terminal"].any()
    for x, expected in EXPECTED.items():
        assert (data["n_steps"][obs[0] == x] == LIMIT - x).all()
        assert torch.allclose(targets[obs[0] == x], torch.tensor(expected), rtol=1e-6)
    assert set(obs[0].tolist()) == set(EXPECTED)
