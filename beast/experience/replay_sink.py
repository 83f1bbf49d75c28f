"""Replays that actors fill themselves, and the learner samples.

For an algorithm whose experience is a replay (`SequenceReplay` or `TransitionReplay`,
beast/algos/base.py), each actor writes its envs' steps into the shared replay itself:
nothing travels through the learner, which only samples. Two layouts:

    sequences    each actor cuts its envs' steps into replay sequences
                 (`beast.experience.sequence_replay.SequenceBuilder`, one per env) and
                 adds them to the shared `PrioritizedReplay` (R2D2): `SequenceSink`, here.
    transitions  each env step is stored once in its env's ring, n-step windows and
                 frame stacks are built when sampling (DQN family, Ape-X):
                 `beast.experience.transition_replay.TransitionSink`.

`ReplaySink` is the data contract between those actors and the learner, picklable to
actor processes:

    replay            the replay the steps go into
    env_steps         int64 [rows], env steps each actor took
    inserted          int64 [rows], items (sequences, transitions) each actor added
    sampled           int64 [1], items the learner trained on
    episode ring      per actor: the returns and lengths of its finished
                      episodes, one writer (the actor) and one reader (the
                      learner), so no lock is needed
    stop flag         set by `close()` at shutdown; actors exit at their
                      next step

Each counter row has one writer (an actor, or the learner for `sampled`), and a
replacement actor keeps its predecessor's row, so counts survive restarts. With
``samples_per_insert > 0`` actors pause before an insert that would put them more than
two batches of slack ahead of the learner, and the learner pauses before a batch that
would put it more than one batch (plus one actor write) ahead of them (a rate limiter, as
Acme's SampleToInsertRatio): how much the learner trains per env step then does not
depend on how the two share the machine's cores, nor on which of them is faster.

The learner's side, prioritized (or uniform) batches, new priorities back and the
actors' step counts and episodes, is `ReplaySource` (beast/experience/replay_source.py).

polybeast keeps the replay in the learner process: an env server (or the learner's
central-inference thread) stages its steps (sequences cut with the same writer, or raw
steps), and the learner `commit`s them.
"""

from __future__ import annotations

import abc
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from beast.experience.sequence_replay import PrioritizedReplay, SequenceBuilder, replay_footprint
from beast.experience.staging import StagedSteps, StagingRecipe, StepTally
from beast.fields import Field, shared_zeros
from beast.util.profile import PhaseClock
from beast.util.threads import process_alive

__all__ = [
    "EPISODE_RING_SIZE",
    "ReplayRow",
    "ReplaySink",
    "SequenceSink",
    "SequenceStaging",
    "SequenceStagingRecipe",
    "SequenceWriter",
]

# How often an actor checks that the learner still exists.
_PARENT_CHECK_SECONDS = 1.0
# How long a rate-limited writer sleeps between looks at the learner's progress.
_RATE_LIMIT_POLL_SECONDS = 0.002
# Finished episodes each actor's ring holds. The learner drains it at every update;
# one that falls further behind than half of it loses the oldest (counted), so a
# reader never reads a row the writer is overwriting.
EPISODE_RING_SIZE = 4096


class ReplaySink(abc.ABC):
    """Where actors put their steps; the learner's view of the actors (module docstring).

    Args:
        replay: the shared replay (`unit` names what it holds, for messages).
        num_actors: actor processes (or env servers): one counter row each.
        samples_per_insert: rate limit, learner samples per inserted item;
            0 turns it off.
        min_replay_size: inserts allowed before the learner samples at all.
        batch_size: the learner's batch; the actors' slack is two batches' worth of
            inserts (at least 4), the learner's one batch.
    """

    def __init__(
        self,
        replay: Any,
        *,
        num_actors: int,
        samples_per_insert: float = 0.0,
        min_replay_size: int = 0,
        batch_size: int = 1,
    ) -> None:
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert must be >= 0, got {samples_per_insert}")
        self.replay = replay
        self.num_actors = num_actors
        self.samples_per_insert = samples_per_insert
        self.min_replay_size = min_replay_size
        self.batch_size = batch_size
        # Two batches' worth of inserts (at least 4): the actors keep the next batch's
        # steps ready while the learner updates, rather than stepping in lock-step with it
        # (with one batch, a SAC learner at one update per step waited ~3 ms of each 15 for
        # the actor to wake up and step).
        self.insert_slack = (
            max(4.0, 2 * batch_size / samples_per_insert) if samples_per_insert else 0
        )
        # The most items one actor write inserts at once (its envs' steps): the learner's
        # slack covers it, so that neither side can wait for the other forever.
        self.largest_insert = 1
        # Writers wait for the learner (the rate limit) unless it runs in their own thread,
        # taking turns with them (--serial, where `ReplaySource.poll` keeps the ratio).
        self.writers_wait = True
        self.env_steps = shared_zeros((num_actors,), torch.int64)
        self.inserted = shared_zeros((num_actors,), torch.int64)
        self.sampled = shared_zeros((1,), torch.int64)
        self.episode_returns = shared_zeros((num_actors, EPISODE_RING_SIZE), torch.float32)
        self.episode_lengths = shared_zeros((num_actors, EPISODE_RING_SIZE), torch.int32)
        self.episode_count = shared_zeros((num_actors,), torch.int64)
        self._stop = shared_zeros((1,), torch.bool)

    # Shutdown and supervision (what the runner and the supervisor call on any sink).

    def close(self) -> None:
        """Tell every actor to stop at its next step."""
        self._stop[0] = True

    @property
    def closed(self) -> bool:
        return bool(self._stop[0])

    def reclaim(self, owner: int, incarnation: int = 0) -> int:
        """Nothing to reclaim from a dead actor: a sequence it was writing keeps priority 0
        (never sampled) and its slot is free for the next claim, as the sum tree sees its
        writer's process gone (beast/native/sum_tree.h); a transition ring's steps past
        its last complete window keep priority 0 until its replacement overwrites them
        (beast/experience/transition_replay.py). Returns 0."""
        return 0

    def nbytes(self) -> int:
        return self.replay.nbytes()

    def lane_has_room(self, lane: int, num_envs: int) -> bool:
        """A replay has no lanes: its writers wait in `wait_for_room` instead."""
        return True

    def take_turns(self) -> None:
        """--serial: the learner runs in the writer's thread, and `ReplaySource.poll` keeps
        the ratio; a writer waiting for it would wait forever."""
        self.writers_wait = False

    @abc.abstractmethod
    def describe(self) -> str:
        """The replay, for the start-up line."""

    # The actors' side.

    def writer(
        self,
        owner: int,
        sources: Mapping[str, np.ndarray],
        *,
        first_id: int = 0,
        id_stride: int = 0,
        learner_pid: int,
        clock: PhaseClock | None = None,
        lane: int = 0,
        incarnation: int = 0,
    ) -> Any:
        """Actor `owner`'s writer for the n envs of `sources`, the envs of writer lane
        `lane` (`first_id`, `id_stride`, `incarnation`: the rollout writer's, unused by a
        replay); `write(state) -> bool`. It counts through the actor's `ReplayRow`."""
        return self._writer(ReplayRow(self, owner, learner_pid), sources, lane, clock)

    @abc.abstractmethod
    def _writer(
        self,
        row: ReplayRow,
        sources: Mapping[str, np.ndarray],
        lane: int,
        clock: PhaseClock | None,
    ) -> Any:
        """`writer`'s writer, counting through `row`."""

    def insert_allowed(self, count: int = 1) -> bool:
        """False while `count` more inserts would put the actors more than the slack
        ahead of the learner's sampling."""
        if not self.samples_per_insert:
            return True
        allowed = self.min_replay_size + self.insert_slack
        allowed += int(self.sampled[0]) / self.samples_per_insert
        return int(self.inserted.sum()) + count - 1 < allowed

    def sample_allowed(self) -> bool:
        """False while one more batch would put the learner more than one batch and one
        actor write ahead of `samples_per_insert` samples per item inserted beyond
        `min_replay_size` (the other side of the rate limit)."""
        if not self.samples_per_insert or not self.writers_wait:
            return True
        inserted = self.total_inserted() - self.min_replay_size + self.largest_insert
        return int(self.sampled[0]) < self.samples_per_insert * inserted + self.batch_size

    def record_episode(self, row: int, episode_return: float, length: int) -> None:
        """Append a finished episode to row `row`'s ring (its one writer only)."""
        count = int(self.episode_count[row])
        slot = count % EPISODE_RING_SIZE
        self.episode_returns[row, slot] = episode_return
        self.episode_lengths[row, slot] = length
        # Published after the row is written: the reader reads rows below the count.
        self.episode_count[row] = count + 1

    # polybeast: steps staged outside the learner process, committed here.

    @abc.abstractmethod
    def staging_recipe(self) -> Any:
        """What an env server needs to stage steps for this replay (picklable to Ray):
        `writer(sources, publish_every=, first_id=, id_stride=) -> (writer, staging)`."""

    @abc.abstractmethod
    def commit(self, payload: Mapping, stop: threading.Event, row: int) -> bool:
        """Add a staged payload (rate-limited), its steps and episodes, as row `row`; False
        when `stop` was set while waiting."""

    def record_payload(self, payload: Mapping, row: int) -> None:
        """Count a staged payload's env steps and record its finished episodes, as row
        `row` (the end of every `commit`)."""
        self.env_steps[row] += int(payload["env_steps"])
        for episode_return, length in zip(
            payload["episode_returns"], payload["episode_steps"], strict=True
        ):
            self.record_episode(row, episode_return, length)

    def wait_for_room(self, count: int, give_up: Callable[[], bool]) -> bool:
        """Wait until `count` more inserts are allowed (the rate limit); False when the
        sink was closed, or `give_up()` said so, meanwhile."""
        while self.writers_wait and not self.insert_allowed(count):
            if self.closed or give_up():
                return False
            time.sleep(_RATE_LIMIT_POLL_SECONDS)
        return True

    # The learner's side.

    def total_env_steps(self) -> int:
        return int(self.env_steps.sum())

    def total_inserted(self) -> int:
        return int(self.inserted.sum())

    def new_episodes(self, cursor: np.ndarray) -> tuple[list[float], list[int], int]:
        """Episodes finished since `cursor` (int64 [rows], advanced in place).

        Returns (returns, lengths, dropped): dropped counts episodes lost because the
        reader fell more than half a ring behind.
        """
        counts = self.episode_count.numpy().copy()
        returns: list[float] = []
        lengths: list[int] = []
        dropped = 0
        if np.array_equal(counts, cursor):  # most calls: a DQN learner asks every 16 steps
            return returns, lengths, dropped
        for row in range(self.num_actors):
            start, end = int(cursor[row]), int(counts[row])
            if end - start > EPISODE_RING_SIZE // 2:
                dropped += end - EPISODE_RING_SIZE // 2 - start
                start = end - EPISODE_RING_SIZE // 2
            slots = np.arange(start, end) % EPISODE_RING_SIZE
            returns += self.episode_returns[row].numpy()[slots].tolist()
            lengths += self.episode_lengths[row].numpy()[slots].tolist()
            cursor[row] = end
        return returns, lengths, dropped


class SequenceSink(ReplaySink):
    """A `ReplaySink` of sequences: each actor cuts its envs' steps with `SequenceBuilder`
    (seq_len, seq_overlap) and adds them to the shared `PrioritizedReplay`."""

    def __init__(
        self, replay: PrioritizedReplay, *, seq_len: int, seq_overlap: int, **kwargs: Any
    ) -> None:
        super().__init__(replay, **kwargs)
        self.seq_len, self.seq_overlap = seq_len, seq_overlap
        # Sequences that `commit` gets from Ray are read-only views of its object store;
        # torch warns that writing through a tensor on one is undefined. The replay only
        # copies from them. One filter for this module's calls, set here in the run's
        # main thread before any feeder starts (a catch_warnings per sequence would
        # rewrite the process's filters from every feeder thread; one at import would
        # not outlive a harness, such as pytest, that restores filters after each test).
        warnings.filterwarnings(
            "ignore", message="The given NumPy array is not writable", module=__name__
        )

    def describe(self) -> str:
        footprint = replay_footprint(
            self.replay.spec, frame_dedup=self.replay.frame_dedup, seq_overlap=self.seq_overlap
        )
        return (
            f"prioritized replay of {self.replay.capacity:,} sequences of {self.seq_len} steps"
            f" ({self.nbytes() / 2**20:,.0f} MiB, {footprint.per_env_step:,.0f} B per env"
            f" step{', frame dedup' if self.replay.frame_dedup else ''}), learning from"
            f" {self.min_replay_size:,}"
        )

    def _writer(
        self,
        row: ReplayRow,
        sources: Mapping[str, np.ndarray],
        lane: int,
        clock: PhaseClock | None,
    ) -> SequenceWriter:
        """Cuts sequences of the n envs of `sources` into the shared replay (`lane`: unused,
        a sequence writer needs no envs of its own)."""
        return SequenceWriter(
            self.replay.spec, self.seq_len, self.seq_overlap, sources, row, clock=clock
        )

    def staging_recipe(self) -> SequenceStagingRecipe:
        """What an env server needs to cut sequences for this replay (picklable to Ray)."""
        return SequenceStagingRecipe(self.replay.spec, self.seq_len, self.seq_overlap)

    def commit(self, payload: Mapping, stop: threading.Event, row: int) -> bool:
        """Add a staged payload's sequences (rate-limited), steps and episodes, as row `row`;
        False when `stop` was set while waiting."""
        sequences = payload["sequences"]
        count = len(next(iter(sequences.values()))) if sequences else 0
        for i in range(count):
            if not self.wait_for_room(1, stop.is_set):
                return False
            self.replay.add({key: torch.from_numpy(value[i]) for key, value in sequences.items()})
            self.inserted[row] += 1
        self.record_payload(payload, row)
        return True


class ReplayRow:
    """An actor's row of a `ReplaySink`: its inserts (rate-limited), env steps and
    episodes, and the checks that end its loop (the run closing, the learner gone). The
    destination of a `SequenceWriter` in an actor, and what a transition writer counts
    through."""

    def __init__(self, sink: ReplaySink, owner: int, learner_pid: int) -> None:
        self.sink, self.owner, self.learner_pid = sink, owner, learner_pid
        self._env_steps = sink.env_steps.numpy()
        self._inserted = sink.inserted.numpy()
        self._last_check = time.monotonic()

    def _learner_gone(self) -> bool:
        return not process_alive(self.learner_pid)

    def wait_for_room(self, count: int, clock: PhaseClock | None) -> bool:
        """Wait until `count` more inserts are allowed; False when the run is ending."""
        if not self.sink.wait_for_room(count, self._learner_gone):
            return False
        if clock is not None:
            clock.mark("wait_slots")
        return True

    def count_inserts(self, count: int) -> None:
        self._inserted[self.owner] += count

    def add(self, sequence: dict[str, torch.Tensor], clock: PhaseClock | None) -> bool:
        if not self.wait_for_room(1, clock):
            return False
        self.sink.replay.add(sequence)
        self.count_inserts(1)
        return True

    def step(self, num_envs: int, episodes: Sequence[tuple[float, int]]) -> bool:
        self._env_steps[self.owner] += num_envs
        for episode_return, length in episodes:
            self.sink.record_episode(self.owner, episode_return, length)
        if self.sink.closed:
            return False
        now = time.monotonic()
        if now - self._last_check >= _PARENT_CHECK_SECONDS:
            self._last_check = now
            return process_alive(self.learner_pid)
        return True


@dataclass(frozen=True)
class SequenceStagingRecipe(StagingRecipe):
    """How to cut sequences for a learner's replay outside its process (polybeast)."""

    spec: dict[str, Field]
    seq_len: int
    seq_overlap: int

    def _writer(
        self, sources: Mapping[str, np.ndarray], publish_every: int
    ) -> tuple[SequenceWriter, SequenceStaging]:
        """A `SequenceWriter` that collects its sequences, episodes and step counts in a
        `SequenceStaging`, for `SequenceSink.commit`."""
        staging = SequenceStaging(publish_every)
        writer = SequenceWriter(self.spec, self.seq_len, self.seq_overlap, sources, staging)
        return writer, staging


class SequenceStaging(StagedSteps):
    """A `SequenceWriter`'s destination outside the learner process (polybeast): the
    finished sequences, as "sequences" (each field stacked, [count, ...])."""

    def __init__(self, publish_every: int) -> None:
        super().__init__(publish_every)
        self._sequences: list[dict[str, torch.Tensor]] = []

    def add(self, sequence: dict[str, torch.Tensor], clock: PhaseClock | None) -> bool:
        self._sequences.append(sequence)
        return True

    def _take_items(self) -> dict:
        sequences = (
            {key: np.stack([s[key].numpy() for s in self._sequences]) for key in self._sequences[0]}
            if self._sequences
            else {}
        )
        self._sequences = []
        return {"sequences": sequences}


class SequenceWriter:
    """Cuts n envs' steps into sequences, one `SequenceBuilder` per env, and hands each
    finished one to its destination (the shared replay, or polybeast's staging).

    `sources` maps the replay's per-step fields and the env batch's episode statistics to
    `[n, ...]` arrays at fixed addresses, updated in place between writes. `write(state)`
    reads the current step, with the recurrent state (`[n, d0, ...]` per tensor) that
    produced its policy output, which a sequence starting there stores.
    """

    def __init__(
        self,
        spec: Mapping,
        seq_len: int,
        seq_overlap: int,
        sources: Mapping[str, np.ndarray],
        destination: ReplayRow | SequenceStaging,
        clock: PhaseClock | None = None,
    ) -> None:
        self.destination = destination
        self.clock = clock
        self.num_envs = n = len(sources["reward"])
        self.builders = [SequenceBuilder(spec, seq_len, seq_overlap) for _ in range(n)]
        keys = self.builders[0].step_keys
        # Env i's row of each source as a view (0-d for per-env scalars): made once.
        self._rows = [
            {key: sources[key][i : i + 1].reshape(sources[key].shape[1:]) for key in keys}
            for i in range(n)
        ]
        self._tally = StepTally(sources)

    def write(self, state: Sequence[torch.Tensor]) -> bool:
        """Write the current step; False when the run is shutting down."""
        finished = []
        for i, builder in enumerate(self.builders):
            sequence = builder.append(self._rows[i], [s[i] for s in state])
            if sequence is not None:
                finished.append(sequence)
        if self.clock is not None:
            self.clock.mark("slot_write")
        for sequence in finished:
            if not self.destination.add(sequence, self.clock):
                return False
            if self.clock is not None:
                self.clock.mark("slot_write")
        return self.destination.step(*self._tally.take())
