"""Contract of beast.experience.replay_sink: the sink's counters, episode rings, rate limit, and
what the actor loop (beast.acting.actor) writes through it: sequences, steps, episodes.

The actor runs in-process against a scripted env batch whose observations name
their (env, step), so every stored row can be checked against what the env saw
and the action it was sent; its episodes end by termination and by truncation
in turn.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from beast.acting import actor as actor_module
from beast.acting.actor import Actor, ActorSettings
from beast.acting.inference import LocalInference
from beast.algos.policies import EpsilonGreedyPolicy
from beast.experience.replay_sink import EPISODE_RING_SIZE, SequenceSink
from beast.experience.sequence_replay import PrioritizedReplay, sequence_spec
from beast.fields import box_obs, core_state_shapes
from beast.models import build_q_model
from beast.util.profile import ACTOR_PHASES, PhaseClock

pytestmark = pytest.mark.usefixtures("watchdog")

EPISODE_LENGTH = 7


def make_sink(*, num_actors=1, seq_len=5, seq_overlap=2, model=None, **kwargs):
    shapes = core_state_shapes(model.initial_state(1)) if model is not None else ()
    spec = sequence_spec(
        seq_len=seq_len,
        obs=box_obs((3,), np.float32),
        record=EpsilonGreedyPolicy(3).record_spec(),
        core_state_shapes=shapes,
    )
    return SequenceSink(
        PrioritizedReplay(spec, 1000),
        num_actors=num_actors,
        seq_len=seq_len,
        seq_overlap=seq_overlap,
        **kwargs,
    )


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


def test_rate_limit_keeps_both_sides_within_their_slack():
    # 2 samples per insert, batch 4: the actors' slack is max(4, 2 * 4 / 2) = 4 inserts
    # beyond 10 + sampled / 2; the learner's one batch beyond 2 * (inserted - 10 + 1).
    sink = make_sink(num_actors=2, samples_per_insert=2.0, min_replay_size=10, batch_size=4)
    sink.inserted[:] = torch.tensor([7, 6])
    assert sink.insert_allowed()  # 13 < 14
    sink.inserted[1] = 7
    assert not sink.insert_allowed()  # 14 inserted, nothing sampled
    sink.sampled[0] = 4
    assert sink.insert_allowed()  # 14 < 14 + 4 / 2
    # The learner: 4 sampled < 2 * (14 - 10 + 1) + 4 = 14; 14 sampled is not.
    assert sink.sample_allowed()
    sink.sampled[0] = 14
    assert not sink.sample_allowed()
    sink.inserted[0] = 8  # one more env step: 14 < 16
    assert sink.sample_allowed()
    assert make_sink().insert_allowed()  # samples_per_insert 0: never limited
    assert make_sink().sample_allowed()


def test_close_and_reclaim_follow_the_buffers_protocol():
    sink = make_sink()
    assert not sink.closed
    sink.close()
    assert sink.closed
    assert sink.reclaim(owner=0) == 0
    assert sink.nbytes() == sink.replay.nbytes()


class ScriptedEnvBatch:
    """K envs whose episodes last EPISODE_LENGTH steps with reward 1 per step; even
    episodes terminate (same-step reset), odd ones are truncated (the final observation,
    then a reset at the next step that ignores the action, reward 0; beast/envs/batch.py).

    obs = (env, global step, step within the episode); the actions each env was
    sent are kept by global step. Closes the sink after `num_steps` steps."""

    def __init__(self, num_envs: int, sink: SequenceSink, num_steps: int) -> None:
        self.num_envs = self.k = num_envs
        self.sink, self.num_steps = sink, num_steps
        self.t = 0
        self.episode = self.in_episode = 0
        self.obs = np.zeros((num_envs, 3), dtype=np.float32)
        self.obs[:, 0] = np.arange(num_envs)
        self.obs_arrays = {"obs": self.obs}  # the observation's one leaf (a Box)
        self.reward = np.zeros(num_envs, dtype=np.float32)
        self.done = np.ones(num_envs, dtype=bool)
        self.terminated = np.zeros(num_envs, dtype=bool)
        self.truncated = np.zeros(num_envs, dtype=bool)
        self.episode_end = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float32)
        self.episode_step = np.zeros(num_envs, dtype=np.int32)
        self.discounted_return = np.zeros(num_envs, dtype=np.float32)
        self.actions: dict[tuple[int, int], int] = {}  # taken, by the step taken from
        self.sent: dict[tuple[int, int], int] = {}  # all sent (a reset ignores its)
        self.episodes_ended = 0
        self.closed = False

    def step(self, actions: np.ndarray) -> None:
        for i in range(self.k):
            self.sent[(i, self.t)] = int(actions[i])
        self.t += 1
        self.episode_end[:] = False
        if self.truncated[0]:  # the reset after a truncation: no action taken
            self.episode, self.in_episode = self.episode + 1, 0
            self.reward[:], self.done[:], self.truncated[:] = 0.0, True, False
        else:
            for i in range(self.k):
                self.actions[(i, self.t - 1)] = int(actions[i])
            self.in_episode += 1
            ended = self.in_episode == EPISODE_LENGTH
            terminated = ended and self.episode % 2 == 0
            self.reward[:] = 1.0
            self.episode_end[:] = ended
            self.episode_return[:] = EPISODE_LENGTH
            self.episode_step[:] = EPISODE_LENGTH
            self.episodes_ended += ended
            self.done[:] = self.terminated[:] = terminated
            self.truncated[:] = ended and not terminated
            if terminated:
                self.episode, self.in_episode = self.episode + 1, 0
        self.obs[:, 1] = self.t
        self.obs[:, 2] = self.in_episode
        if self.t >= self.num_steps:
            self.sink.close()

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("use_lstm", [False, True])
def test_actor_loop_stores_what_the_envs_saw_and_did(use_lstm, monkeypatch):
    model = build_q_model("mlp", (3,), 3, use_lstm=use_lstm, hidden_size=8)
    sink = make_sink(seq_len=5, seq_overlap=2, model=model)
    envs = ScriptedEnvBatch(2, sink, num_steps=60)
    monkeypatch.setattr(actor_module, "_env_batch", lambda *args: envs)
    clock = PhaseClock(torch.zeros(len(ACTOR_PHASES), dtype=torch.float64), ACTOR_PHASES)
    settings = ActorSettings(
        env="scripted",
        seed=0,
        num_actors=1,
        num_envs=2,
        episodic_life=False,
        policy=EpsilonGreedyPolicy(3, eps_base=0.4),
    )
    actor = Actor(0, 0, settings, sink, model, os.getpid(), clock)
    while actor.step():
        pass
    actor.close()
    assert envs.closed
    assert int(sink.env_steps[0]) == 60 * 2
    # Every episode each env finished is reported, once.
    returns, lengths, _ = sink.new_episodes(np.zeros(1, dtype=np.int64))
    assert returns == [7.0] * 2 * envs.episodes_ended and lengths == [7] * 2 * envs.episodes_ended
    assert int(sink.inserted[0]) == len(sink.replay) > 0
    batch = sink.replay.sample(len(sink.replay)).batch
    mask = batch["mask"]
    obs = batch["obs"]
    for t, b in mask.nonzero().tolist():
        env, step = int(obs[t, b, 0]), int(obs[t, b, 1])
        assert int(batch["action"][t, b]) == envs.actions[(env, step)]
        # A real row is never a truncated episode's final observation (no action).
        assert not batch["truncated"][t, b]
        if step > 0:
            assert int(batch["last_action"][t, b]) == envs.sent[(env, step - 1)]
    # Every truncated episode's final row is stored, unmasked, as its sequence's end.
    final = batch["truncated"] & ~mask
    assert final.any() and torch.all(obs[..., 2][final] == EPISODE_LENGTH)
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
    policy = LocalInference(model, EpsilonGreedyPolicy(2, epsilon=0.0), 2)
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
    actions = policy.act(inputs)["action"]
    for reported, expected in zip(policy.state, state_after, strict=True):
        assert torch.allclose(reported, expected.transpose(0, 1))  # [K, d0, ...]
    # epsilon 0: greedy.
    q, _ = model({k: v.unsqueeze(0) for k, v in inputs.items()}, state_after)
    assert np.array_equal(actions, q.q_values[0].argmax(-1).numpy())
