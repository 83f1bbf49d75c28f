"""What an algorithm's actors produce, as a spec that builds it: `Rollouts`,
`SequenceReplay` or `TransitionReplay` (an algorithm's `experience()`).

Each spec knows what the engine asks of an experience, so that the engine never asks
which kind it holds: its sink and source (`build`), the memory its replay will take
(`footprint`), how many optimizer steps a run makes (`optimizer_steps`), whether it can
run --serial, whether it deduplicates frames, and the synthetic batch that measures the
update's cost per agent step (`measured_item`, for --num_actors auto).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from beast.experience.contract import Sink, Source
from beast.experience.replay_sink import SequenceSink
from beast.experience.replay_source import ReplaySource
from beast.experience.rollout_replay import RolloutReplay
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.experience.rollout_source import RolloutSource
from beast.experience.sequence_replay import (
    PrioritizedReplay,
    image_keys,
    replay_footprint,
    sequence_spec,
)
from beast.experience.transition_replay import RingReplay, TransitionSink, ring_footprint, step_spec
from beast.fields import Field

__all__ = [
    "Experience",
    "ExperienceError",
    "ExperienceLayout",
    "ExperienceSetup",
    "Footprint",
    "Rollouts",
    "SequenceReplay",
    "TransitionReplay",
]


class ExperienceError(ValueError):
    """An experience that cannot be built for the run's env or model (a one-line
    message the engine turns into a ConfigError)."""


@dataclass(frozen=True)
class ExperienceLayout:
    """What one env step stores: the observation's fields (`EnvSpec.obs_fields()`), the
    policy's record (`ActingRule.record_spec()`, plus the engine's own per-step fields) and the
    per-env shapes of the model's recurrent state (`fields.core_state_shapes`)."""

    obs: Mapping[str, Field]
    record: Mapping[str, Field]
    core_state_shapes: Sequence[tuple[int, ...]] = ()


@dataclass(frozen=True)
class ExperienceSetup:
    """Who writes and who reads: `num_writers` processes (actors, or a learner's env
    servers) of `envs_per_writer` envs in `lanes_per_writer` lanes; the learner's
    `batch_size`, blocks of `updates_per_sample` batches, `num_learner_threads`, `device`
    and `seed`; `num_buffers` rollout slots; `serial`: the learner and one actor take
    turns in one process. `algo` and `env` name the run in messages."""

    num_writers: int
    envs_per_writer: int
    lanes_per_writer: int
    num_buffers: int
    batch_size: int
    updates_per_sample: int
    num_learner_threads: int
    device: torch.device
    seed: int
    serial: bool
    algo: str
    env: str


@dataclass(frozen=True)
class Footprint:
    """The memory a replay will take: `per_item` bytes for each of `capacity` `unit`s."""

    per_item: float
    capacity: int
    unit: str
    frame_dedup: bool

    @property
    def nbytes(self) -> float:
        return self.per_item * self.capacity


class Experience(abc.ABC):
    """What an algorithm's actors produce and its learner samples (module docstring)."""

    frame_dedup: bool = False

    @abc.abstractmethod
    def build(self, layout: ExperienceLayout, setup: ExperienceSetup) -> tuple[Sink, Source]:
        """The sink the writers fill and the source the learner reads. Raises
        ExperienceError when it cannot hold the env's steps or the model's state."""

    def footprint(self, layout: ExperienceLayout) -> Footprint | None:
        """The replay's memory, checked against the machine's before anything is built;
        None for experience without a replay of its own size."""
        return None

    @abc.abstractmethod
    def optimizer_steps(self, total_steps: int, batch_size: int) -> int | None:
        """About how many batches a run of `total_steps` agent steps trains on; None when
        unknown."""

    def serial_refusal(self) -> str | None:
        """Why --serial cannot run this experience, or None."""
        return None

    def measured_item(self, layout: ExperienceLayout) -> tuple[dict[str, Field], int] | None:
        """The layout of one item of a synthetic batch that measures the update's cost,
        and the agent steps the item accounts for; None when the cost per agent step is
        not the update's on a batch (a replay's, set by its rate limit)."""
        return None


@dataclass(frozen=True)
class Rollouts(Experience):
    """Actors write fixed-length rollouts of `unroll_length` + 1 steps into the rollout
    slots (beast/experience/rollout_slots.py) and the learner takes `--batch_size` of them
    per batch. With `replay_size` > 0, a FIFO of whole rollouts (rollout_replay.py)
    replaces `num_replayed` of each batch's rollouts with replayed ones. `synchronous`:
    actors wait for the weights of each update before their next rollouts, and a batch is
    one rollout of every env (`--batch_size` must be the number of envs;
    `RolloutSource`)."""

    unroll_length: int
    replay_size: int = 0
    num_replayed: int = 0
    synchronous: bool = False

    def layout_of(self, layout: ExperienceLayout) -> dict[str, Field]:
        return rollout_spec(
            unroll_length=self.unroll_length,
            obs=layout.obs,
            record=layout.record,
            core_state_shapes=layout.core_state_shapes,
        )

    def build(self, layout: ExperienceLayout, setup: ExperienceSetup) -> tuple[Sink, Source]:
        num_buffers, num_lanes = setup.num_buffers, 0
        if self.synchronous:
            # As many slots as the writers fill at once, split among their lanes: a lane's
            # next rollouts wait for the update that frees its slots (RolloutSource).
            # --serial's one process cannot wait on itself: its actor fills the next
            # rollouts while the learner waits.
            num_lanes = setup.num_writers * setup.lanes_per_writer
            num_buffers = setup.num_writers * setup.envs_per_writer * (2 if setup.serial else 1)
        buffers = RolloutBuffers(self.layout_of(layout), num_buffers, num_lanes)
        replay = None
        if self.replay_size:
            replay = RolloutReplay(buffers.spec, self.replay_size, seed=setup.seed)
        source = RolloutSource(
            buffers,
            batch_size=setup.batch_size,
            device=setup.device,
            replay=replay,
            num_replayed=self.num_replayed,
            num_threads=setup.num_learner_threads,
            synchronous=self.synchronous,
        )
        return buffers, source

    def optimizer_steps(self, total_steps: int, batch_size: int) -> int | None:
        return total_steps // (self.unroll_length * batch_size)

    def measured_item(self, layout: ExperienceLayout) -> tuple[dict[str, Field], int] | None:
        return self.layout_of(layout), self.unroll_length


@dataclass(frozen=True, kw_only=True)
class _Replay(Experience):
    """What both replays share: the learner samples `--batch_size` items once `min_size`
    are in, by priority with PER's exponents; with `samples_per_insert` > 0, actors pause
    when they insert faster than the learner samples that many per insert."""

    capacity: int
    min_size: int
    priority_exponent: float
    importance_sampling_exponent: float
    samples_per_insert: float
    frame_dedup: bool

    def source_for(self, sink: SequenceSink | TransitionSink, setup: ExperienceSetup) -> Source:
        return ReplaySource(
            sink,
            batch_size=setup.batch_size,
            parts=setup.updates_per_sample,
            device=setup.device,
            seed=setup.seed,
        )

    def optimizer_steps(self, total_steps: int, batch_size: int) -> int | None:
        """One batch per `batch_size` items inserted after `min_size`, at the rate limit."""
        if self.samples_per_insert <= 0:
            return None
        inserted = max(0, total_steps // self.steps_per_item() - self.min_size)
        return int(inserted * self.samples_per_insert / batch_size)

    @abc.abstractmethod
    def steps_per_item(self) -> int:
        """Agent steps that one inserted item accounts for."""

    def serial_refusal(self) -> str | None:
        if self.samples_per_insert:
            return None
        return (
            "--serial with a replay needs --samples_per_insert > 0: the learner's updates"
            " per insert, which the actor and learner keep by taking turns"
        )


@dataclass(frozen=True, kw_only=True)
class SequenceReplay(_Replay):
    """Actors cut their envs' steps into sequences of `seq_len` + 1 rows (overlapping by
    `seq_overlap`) and add them to a shared prioritized replay of `capacity` sequences
    (beast/experience/sequence_replay.py)."""

    seq_len: int
    seq_overlap: int

    def layout_of(self, layout: ExperienceLayout) -> dict[str, Field]:
        return sequence_spec(
            seq_len=self.seq_len,
            obs=layout.obs,
            record=layout.record,
            core_state_shapes=layout.core_state_shapes,
        )

    def build(self, layout: ExperienceLayout, setup: ExperienceSetup) -> tuple[Sink, Source]:
        try:
            replay = PrioritizedReplay(
                self.layout_of(layout),
                self.capacity,
                alpha=self.priority_exponent,
                beta=self.importance_sampling_exponent,
                frame_dedup=self.frame_dedup,
            )
        except ValueError as error:  # frame dedup of observations that are not frame stacks
            raise ExperienceError(f"--frame_dedup does not fit {setup.env}: {error}") from error
        sink = SequenceSink(
            replay,
            num_actors=setup.num_writers,
            seq_len=self.seq_len,
            seq_overlap=self.seq_overlap,
            samples_per_insert=self.samples_per_insert,
            min_replay_size=self.min_size,
            batch_size=setup.batch_size * setup.updates_per_sample,
        )
        return sink, self.source_for(sink, setup)

    def footprint(self, layout: ExperienceLayout) -> Footprint:
        dedup = self.frame_dedup and bool(image_keys(layout.obs, leading=0))
        per_item = replay_footprint(self.layout_of(layout), frame_dedup=dedup).per_sequence
        return Footprint(per_item, self.capacity, "sequences", dedup)

    def steps_per_item(self) -> int:
        return max(1, self.seq_len - self.seq_overlap)


@dataclass(frozen=True, kw_only=True)
class TransitionReplay(_Replay):
    """Actors append every env step to their env's ring in a shared replay of `capacity`
    transitions (beast/experience/transition_replay.py), with their `n_step` windows and
    frame stacks built at sampling. `prioritized`: by priority (PER's exponents), else
    uniformly. Feed-forward models only."""

    n_step: int
    prioritized: bool

    def build(self, layout: ExperienceLayout, setup: ExperienceSetup) -> tuple[Sink, Source]:
        if layout.core_state_shapes:
            raise ExperienceError(
                f"--algo {setup.algo} trains on single transitions: it needs a feed-forward"
                " model (drop --use_lstm)"
            )
        try:
            replay = RingReplay(
                step_spec(layout.obs, layout.record),
                num_envs=setup.num_writers * setup.envs_per_writer,
                capacity=self.capacity,
                n_step=self.n_step,
                prioritized=self.prioritized,
                alpha=self.priority_exponent,
                beta=self.importance_sampling_exponent,
                frame_dedup=self.frame_dedup,
            )
        except ValueError as error:
            raise ExperienceError(f"the replay does not fit --env {setup.env}: {error}") from error
        sink = TransitionSink(
            replay,
            num_actors=setup.num_writers,
            samples_per_insert=self.samples_per_insert,
            min_replay_size=self.min_size,
            batch_size=setup.batch_size * setup.updates_per_sample,
        )
        return sink, self.source_for(sink, setup)

    def footprint(self, layout: ExperienceLayout) -> Footprint:
        per_item = ring_footprint(step_spec(layout.obs, layout.record), self.frame_dedup)
        return Footprint(per_item, self.capacity, "transitions", self.frame_dedup)

    def steps_per_item(self) -> int:
        return 1
