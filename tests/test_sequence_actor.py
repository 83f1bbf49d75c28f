"""Contract of beast.sequence_actor: the sink's counters, episode rings, rate limit,
the actors' epsilons, and the acting loop's output (sequences, steps, episodes).

The loop runs in-process against a scripted env batch whose observations name
their (env, step), so every stored row can be checked against what the env saw
and the action it was sent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beast.algos.r2d2 import actor_epsilons
from beast.buffers import core_state_shapes
from beast.models import build_q_model
from beast.profile import ACTOR_PHASES, PhaseClock
from beast.replay import PrioritizedReplay, sequence_spec
from beast.sequence_actor import (
    EPISODE_RING_SIZE,
    EpsilonGreedyPolicy,
    SequenceSink,
    run_sequence_actor,
)

pytestmark = pytest.mark.usefixtures("watchdog")

EPISODE_LENGTH = 7


def make_sink(*, num_actors=1, num_envs=2, seq_len=5, seq_overlap=2, model=None, **kwargs):
    shapes = core_state_shapes(model.initial_state(1)) if model is not None else ()
    spec = sequence_spec(
        seq_len=seq_len, obs_shape=(3,), obs_dtype=np.float32, core_state_shapes=shapes
    )
    return SequenceSink(
        PrioritizedReplay(spec, 1000),
        num_actors=num_actors,
        num_envs=num_envs,
        seq_len=seq_len,
        seq_overlap=seq_overlap,
        eps_base=0.4,
        eps_alpha=7.0,
        **kwargs,
    )


def test_epsilons_spread_over_every_env_of_every_actor():
    sink = make_sink(num_actors=3, num_envs=2)
    expected = torch.tensor(actor_epsilons(6, 0.4, 7.0), dtype=torch.float32)
    # Env k of actor i is env i*K + k of all N = 6.
    assert torch.equal(sink.epsilons.flatten(), expected)


def test_episode_rings_deliver_each_episode_once_in_order():
    sink = make_sink(num_actors=2)
    cursor = np.zeros(2, dtype=np.int64)
    sink.record_episode(0, 1.5, 10)
    sink.record_episode(1, 2.5, 20)
    sink.record_episode(0, 3.5, 30)
    returns, lengths, dropped = sink.new_episodes(cursor)
    assert (returns, lengths, dropped) == ([1.5, 3.5, 2.5], [10, 30, 20], 0)
    assert sink.new_episodes(cursor) == ([], [], 0)


def test_a_reader_more_than_half_a_ring_behind_drops_the_oldest():
    sink = make_sink()
    cursor = np.zeros(1, dtype=np.int64)
    total = EPISODE_RING_SIZE + 10
    for i in range(total):
        sink.record_episode(0, float(i), i)
    returns, _, dropped = sink.new_episodes(cursor)
    half = EPISODE_RING_SIZE // 2
    assert dropped == total - half
    assert returns == [float(i) for i in range(total - half, total)]


def test_rate_limit_keeps_inserts_within_a_batch_of_the_learner():
    # 2 samples per insert, batch 4: a slack of 4 / 2 = 2 inserts beyond 10 + sampled / 2.
    sink = make_sink(num_actors=2, samples_per_insert=2.0, min_replay_size=10, batch_size=4)
    sink.inserted[:] = torch.tensor([6, 5])
    assert sink.insert_allowed()  # 11 < 12
    sink.inserted[1] = 6
    assert not sink.insert_allowed()  # 12 inserted, nothing sampled
    sink.sampled[0] = 4
    assert sink.insert_allowed()  # 12 < 12 + 4 / 2
    assert make_sink().insert_allowed()  # samples_per_insert 0: never limited


def test_close_and_reclaim_follow_the_buffers_protocol():
    sink = make_sink()
    assert not sink.closed
    sink.close()
    assert sink.closed
    assert sink.reclaim(owner=0) == 0
    assert sink.nbytes() == sink.replay.nbytes()


class ScriptedEnvBatch:
    """K envs whose episodes last EPISODE_LENGTH steps with reward 1 per step.

    obs = (env, global step, step within the episode); the actions each env was
    sent are kept by global step. Closes the sink after `num_steps` steps."""

    def __init__(self, num_envs: int, sink: SequenceSink, num_steps: int) -> None:
        self.k, self.sink, self.num_steps = num_envs, sink, num_steps
        self.t = 0
        self.obs = np.zeros((num_envs, 3), dtype=np.float32)
        self.obs[:, 0] = np.arange(num_envs)
        self.reward = np.zeros(num_envs, dtype=np.float32)
        self.done = np.ones(num_envs, dtype=bool)
        self.episode_end = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float32)
        self.episode_step = np.zeros(num_envs, dtype=np.int32)
        self.actions: dict[tuple[int, int], int] = {}
        self.closed = False

    def step(self, actions: np.ndarray) -> None:
        for i in range(self.k):
            self.actions[(i, self.t)] = int(actions[i])
        self.t += 1
        ended = self.t % EPISODE_LENGTH == 0
        self.reward[:] = 1.0
        self.done[:] = ended
        self.episode_end[:] = ended
        self.episode_return[:] = EPISODE_LENGTH
        self.episode_step[:] = EPISODE_LENGTH
        self.obs[:, 1] = self.t
        self.obs[:, 2] = 0 if ended else self.t % EPISODE_LENGTH
        if self.t >= self.num_steps:
            self.sink.close()

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("use_lstm", [False, True])
def test_actor_loop_stores_what_the_envs_saw_and_did(use_lstm):
    model = build_q_model("mlp", (3,), 3, use_lstm=use_lstm, hidden_size=8)
    sink = make_sink(num_envs=2, seq_len=5, seq_overlap=2, model=model)
    envs = ScriptedEnvBatch(2, sink, num_steps=60)
    clock = PhaseClock(torch.zeros(len(ACTOR_PHASES), dtype=torch.float64), ACTOR_PHASES)
    run_sequence_actor(0, sink, model, lambda: envs, lambda: True, clock)
    assert envs.closed
    assert int(sink.env_steps[0]) == 60 * 2
    # 60 steps of 7-step episodes: 8 whole episodes per env, every one reported.
    returns, lengths, _ = sink.new_episodes(np.zeros(1, dtype=np.int64))
    assert returns == [7.0] * 16 and lengths == [7] * 16
    assert int(sink.inserted[0]) == len(sink.replay) > 0
    batch = sink.replay.sample(len(sink.replay)).batch
    mask = batch["mask"]
    obs = batch["obs"]
    for t, b in mask.nonzero().tolist():
        env, step = int(obs[t, b, 0]), int(obs[t, b, 1])
        assert int(batch["action"][t, b]) == envs.actions[(env, step)]
        assert bool(batch["done"][t, b]) == (step % EPISODE_LENGTH == 0)
        if step > 0:
            assert int(batch["last_action"][t, b]) == envs.actions[(env, step - 1)]
            assert float(batch["reward"][t, b]) == 1.0
    # No sequence crosses an episode: its real rows share one episode.
    episodes = torch.where(mask, obs[..., 1] - obs[..., 2], torch.nan)
    for b in range(episodes.shape[1]):
        real = episodes[:, b][mask[:, b]]
        assert torch.all(real == real[0])
    if use_lstm:
        assert batch["core_state_0"].shape == (1, len(sink.replay), 8)
    assert clock._seconds.sum() > 0  # every phase is timed


def test_policy_reports_the_state_each_action_started_from():
    model = build_q_model("mlp", (3,), 2, use_lstm=True, hidden_size=4)
    policy = EpsilonGreedyPolicy(model, torch.zeros(2))
    inputs = {
        "obs": torch.randn(2, 3),
        "reward": torch.zeros(2),
        "done": torch.tensor([True, True]),
        "last_action": torch.zeros(2, dtype=torch.int64),
    }
    policy.act(inputs)
    assert all(torch.equal(s, torch.zeros_like(s)) for s in policy.state)
    _, state_after = model({k: v.unsqueeze(0) for k, v in inputs.items()}, model.initial_state(2))
    inputs["done"][:] = False
    actions = policy.act(inputs)
    for reported, expected in zip(policy.state, state_after, strict=True):
        assert torch.allclose(reported, expected.transpose(0, 1))  # [K, d0, ...]
    # epsilon 0: greedy.
    q, _ = model({k: v.unsqueeze(0) for k, v in inputs.items()}, state_after)
    assert torch.equal(actions, q.q_values[0].argmax(-1))
