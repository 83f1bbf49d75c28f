"""R2D2 / Ape-X actors: epsilon-greedy acting, sequences into the prioritized replay.

An actor process steps K environments in a for-loop, as an IMPALA actor does
(beast/actor.py starts it and handles signals, seeds and error reports), but
instead of filling rollout slots for the learner it cuts each env's steps
into replay sequences (`beast.replay.SequenceBuilder`, one per env) and adds
them to the shared `PrioritizedReplay` itself: nothing travels through the
learner, which only samples.

Acting: ONE forward pass of a CPU copy of the Q-network over the K
observations. Its weights live in shared memory and the learner overwrites
them in place after every update (the local policy of beast/inference.py,
with Q-values instead of logits). Env k of actor i explores with its own
fixed epsilon, ``eps_j = eps_base ** (1 + alpha * j / (N - 1))`` for j = i*K
+ k of all N = num_actors * K envs (Ape-X section 4.1; R2D2).

`SequenceSink` is the data contract between these actors and the learner
(beast/replay_learner.py), picklable to actor processes:

    replay            the PrioritizedReplay sequences go into
    env_steps         int64 [num_actors], env steps each actor took
    inserted          int64 [num_actors], sequences each actor added
    sampled           int64 [1], sequences the learner trained on
    episode ring      per actor: the returns and lengths of its finished
                      episodes, one writer (the actor) and one reader (the
                      learner), so no lock is needed
    stop flag         set by `close()` at shutdown; actors exit at their
                      next step

Each counter row has one writer (an actor, or the learner for `sampled`),
and a replacement actor keeps its predecessor's row, so counts survive
restarts. With ``samples_per_insert > 0`` actors pause before an insert
that would put them more than one batch of slack ahead of the learner
(a rate limiter, as Acme's SampleToInsertRatio, one-sided): how much the
learner trains per env step then does not depend on how the two share the
machine's cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from beast.algos.r2d2 import actor_epsilons, epsilon_greedy
from beast.buffers import shared_zeros
from beast.envs.batch import EnvBatch
from beast.profile import PhaseClock
from beast.replay import PrioritizedReplay, SequenceBuilder

__all__ = ["EpsilonGreedyPolicy", "SequenceSink", "run_sequence_actor"]

# How often an actor checks that the learner still exists.
_PARENT_CHECK_SECONDS = 1.0
# How long a rate-limited actor sleeps between looks at the learner's progress.
_RATE_LIMIT_POLL_SECONDS = 0.002
# Finished episodes each actor's ring holds. The learner drains it at every update;
# one that falls further behind than half of it loses the oldest (counted), so a
# reader never reads a row the writer is overwriting.
EPISODE_RING_SIZE = 4096


class SequenceSink:
    """Where sequence actors put their experience; the learner's view of the actors.

    Args:
        replay: the shared prioritized replay.
        num_actors, num_envs: actor processes and envs per actor (K).
        seq_len, seq_overlap: how `SequenceBuilder` cuts each env's steps.
        eps_base, eps_alpha: the actors' epsilons (`actor_epsilons` over all
            num_actors * K envs).
        samples_per_insert: rate limit, learner samples per inserted sequence;
            0 turns it off.
        min_replay_size: inserts allowed before the learner samples at all.
        batch_size: the learner's batch; the slack of the rate limit is one
            batch's worth of inserts.
    """

    def __init__(
        self,
        replay: PrioritizedReplay,
        *,
        num_actors: int,
        num_envs: int,
        seq_len: int,
        seq_overlap: int,
        eps_base: float,
        eps_alpha: float,
        samples_per_insert: float = 0.0,
        min_replay_size: int = 0,
        batch_size: int = 1,
    ) -> None:
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert must be >= 0, got {samples_per_insert}")
        self.replay = replay
        self.num_actors, self.num_envs = num_actors, num_envs
        self.seq_len, self.seq_overlap = seq_len, seq_overlap
        epsilons = actor_epsilons(num_actors * num_envs, eps_base, eps_alpha)
        self.epsilons = torch.tensor(epsilons, dtype=torch.float32).view(num_actors, num_envs)
        self.samples_per_insert = samples_per_insert
        self.min_replay_size = min_replay_size
        self.insert_slack = max(1.0, batch_size / samples_per_insert) if samples_per_insert else 0
        self.env_steps = shared_zeros((num_actors,), torch.int64)
        self.inserted = shared_zeros((num_actors,), torch.int64)
        self.sampled = shared_zeros((1,), torch.int64)
        self.episode_returns = shared_zeros((num_actors, EPISODE_RING_SIZE), torch.float32)
        self.episode_lengths = shared_zeros((num_actors, EPISODE_RING_SIZE), torch.int32)
        self.episode_count = shared_zeros((num_actors,), torch.int64)
        self._stop = shared_zeros((1,), torch.bool)

    # Shutdown and supervision (the protocol of beast.buffers.RolloutBuffers that
    # runner and supervisor use).

    def close(self) -> None:
        """Tell every actor to stop at its next step."""
        self._stop[0] = True

    @property
    def closed(self) -> bool:
        return bool(self._stop[0])

    def reclaim(self, owner: int) -> int:
        """Nothing to reclaim from a dead actor: a sequence it was writing keeps
        priority 0 (never sampled) until the ring overwrites its slot. Returns 0."""
        return 0

    def nbytes(self) -> int:
        return self.replay.nbytes()

    # The actor's side.

    def insert_allowed(self) -> bool:
        """False while the actors are more than the slack ahead of the learner's sampling."""
        if not self.samples_per_insert:
            return True
        inserted = int(self.inserted.sum())
        allowed = self.min_replay_size + self.insert_slack
        allowed += int(self.sampled[0]) / self.samples_per_insert
        return inserted < allowed

    def record_episode(self, actor_index: int, episode_return: float, length: int) -> None:
        """Append a finished episode to the actor's ring (the actor's own row only)."""
        count = int(self.episode_count[actor_index])
        slot = count % EPISODE_RING_SIZE
        self.episode_returns[actor_index, slot] = episode_return
        self.episode_lengths[actor_index, slot] = length
        # Published after the row is written: the reader reads rows below the count.
        self.episode_count[actor_index] = count + 1

    # The learner's side.

    def total_env_steps(self) -> int:
        return int(self.env_steps.sum())

    def total_inserted(self) -> int:
        return int(self.inserted.sum())

    def new_episodes(self, cursor: np.ndarray) -> tuple[list[float], list[int], int]:
        """Episodes finished since `cursor` (int64 [num_actors], advanced in place).

        Returns (returns, lengths, dropped): dropped counts episodes lost because the
        reader fell more than half a ring behind.
        """
        counts = self.episode_count.numpy().copy()
        returns: list[float] = []
        lengths: list[int] = []
        dropped = 0
        for actor in range(self.num_actors):
            start, end = int(cursor[actor]), int(counts[actor])
            if end - start > EPISODE_RING_SIZE // 2:
                dropped += end - EPISODE_RING_SIZE // 2 - start
                start = end - EPISODE_RING_SIZE // 2
            slots = np.arange(start, end) % EPISODE_RING_SIZE
            returns += self.episode_returns[actor].numpy()[slots].tolist()
            lengths += self.episode_lengths[actor].numpy()[slots].tolist()
            cursor[actor] = end
        return returns, lengths, dropped


class EpsilonGreedyPolicy:
    """Epsilon-greedy actions from a CPU Q-network over an actor's K envs.

    `state` is the recurrent state per env ([K, d0, ...] per tensor) that the
    latest `act` started from: what `SequenceBuilder` stores with a row.
    """

    def __init__(self, model: nn.Module, epsilons: torch.Tensor) -> None:
        self.model = model
        self.epsilons = epsilons  # float32 [K]
        self._state_next = model.initial_state(len(epsilons))  # tensors [d0, K, ...]
        self.state: tuple[torch.Tensor, ...] = ()

    def act(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """inputs: obs [K, ...], reward [K], done [K], last_action [K]; int64 [K] actions."""
        state_in = self._state_next
        with torch.no_grad():
            output, self._state_next = self.model(
                {key: value.unsqueeze(0) for key, value in inputs.items()}, state_in
            )
        self.state = tuple(s.transpose(0, 1) for s in state_in)
        return epsilon_greedy(output.q_values[0], self.epsilons)


def run_sequence_actor(
    actor_index: int,
    sink: SequenceSink,
    model: nn.Module,
    make_env_batch: Callable[[], EnvBatch],
    learner_alive: Callable[[], bool],
    clock: PhaseClock,
) -> None:
    """The actor loop; returns when the sink is closed or the learner is gone.

    Phases (beast/profile.py): wait_slots is time paused by the rate limit,
    inference the forward pass and epsilon-greedy choice, env_step the K env
    steps, slot_write cutting sequences and adding them to the replay.
    """
    env_batch = make_env_batch()
    try:
        _act(actor_index, sink, model, env_batch, learner_alive, clock)
    finally:
        env_batch.close()


def _act(
    actor_index: int,
    sink: SequenceSink,
    model: nn.Module,
    env_batch: EnvBatch,
    learner_alive: Callable[[], bool],
    clock: PhaseClock,
) -> None:
    k = sink.num_envs
    policy = EpsilonGreedyPolicy(model, sink.epsilons[actor_index])
    builders = [SequenceBuilder(sink.replay.spec, sink.seq_len, sink.seq_overlap) for _ in range(k)]
    # Tensor views of the env batch's arrays: no copies when building inputs.
    inputs = {
        "obs": torch.from_numpy(env_batch.obs),
        "reward": torch.from_numpy(env_batch.reward),
        "done": torch.from_numpy(env_batch.done),
        "last_action": torch.zeros(k, dtype=torch.int64),
    }
    env_steps = sink.env_steps.numpy()
    inserted = sink.inserted.numpy()
    last_check = time.monotonic()
    clock.restart()
    while not sink.closed:
        actions = policy.act(inputs)
        clock.mark("inference")
        finished = []
        for i, builder in enumerate(builders):
            row = {key: value[i] for key, value in inputs.items()}
            row["action"] = actions[i]
            sequence = builder.append(row, [s[i] for s in policy.state])
            if sequence is not None:
                finished.append(sequence)
        clock.mark("slot_write")
        for sequence in finished:
            while not sink.insert_allowed():
                if sink.closed or not learner_alive():
                    return
                time.sleep(_RATE_LIMIT_POLL_SECONDS)
            clock.mark("wait_slots")
            sink.replay.add(sequence)
            inserted[actor_index] += 1
            clock.mark("slot_write")
        inputs["last_action"].copy_(actions)
        env_batch.step(actions.numpy())
        env_steps[actor_index] += k
        for i in np.flatnonzero(env_batch.episode_end):
            sink.record_episode(
                actor_index, float(env_batch.episode_return[i]), int(env_batch.episode_step[i])
            )
        clock.mark("env_step")
        now = time.monotonic()
        if now - last_check >= _PARENT_CHECK_SECONDS:
            if not learner_alive():
                return
            last_check = now
