"""The seam between acting and learning: what actors write through, and what the learner
reads.

    actor processes, env servers           the learner
      Sink.writer(...) -> StepWriter         Source.next(timeout) -> Batch
      StepWriter.write(state) per step       Source.feedback(batch, priorities)
      Sink.commit(payload) (polybeast)       Source.pending_steps / pending_episodes

An experience spec (beast/experience/specs.py) builds one pair of them for a run: the
rollout slots and `RolloutSource` (beast/experience/rollout_slots.py and
rollout_source.py), or a replay's sink and `ReplaySource` (replay_sink.py, replay_source.py,
transition_replay.py). The engine, the actors, the supervisor, polybeast's feeders and the
learner hold them by these protocols only, and never ask which kind they hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from beast.train_step.interface import split_block

if TYPE_CHECKING:
    from beast.experience.staging import StagingRecipe
    from beast.util.profile import PhaseClock

__all__ = ["Batch", "Sink", "Source", "StepWriter"]


class Batch(NamedTuple):
    """A learner batch, on the learning device.

    data: the experience's fields time-major, `[L, B, ...]` (rollouts: L = T + 1;
        sequences: seq_len + 1 rows; transitions: 2 rows, the step and its bootstrap
        step, plus n_step_rewards [n, B], n_steps [B] and terminal [B],
        beast/experience/transition_replay.py); recurrent-state fields `core_state_i`
        `[d0, B, ...]`, the state at row 0.
    weights: float32 [B] importance weights of a prioritized replay (normalised by their
        max; 0 for a sample to ignore), else None.
    The rest is the source's bookkeeping (beast/learning/learner.py): slots and
    generations to send priorities back to (or a synchronous source's rollout slots,
    freed after the update), the agent steps and finished episodes the batch accounts for.
    parts: a replay's block of that many batches, one after another along the batch
        axis (--updates_per_sample): the learner takes one update on each (`split`).
    """

    data: dict[str, Tensor]
    weights: Tensor | None = None
    indices: Tensor | None = None
    generations: Tensor | None = None
    new_steps: int = 0
    episode_returns: tuple[float, ...] = ()
    episode_steps: tuple[int, ...] = ()
    stats: Mapping[str, float] = {}
    parts: int = 1

    def split(self) -> list[Batch]:
        """The batches of a block, as views (`beast.train_step.split_block`); the
        bookkeeping stays with the block."""
        if self.parts == 1:
            return [self]
        data = split_block(self.data, self.parts)
        weights = None if self.weights is None else self.weights.chunk(self.parts)
        return [
            Batch(data=part, weights=None if weights is None else weights[i])
            for i, part in enumerate(data)
        ]


class StepWriter(Protocol):
    """An actor's writer for its envs (one per lane): `write` reads the current step from
    the arrays it was made with (the env batch's, updated in place) and stores it."""

    def write(self, state: Sequence[Tensor]) -> bool:
        """Store the current step; `state`: the recurrent state (`[n, d0, ...]` per
        tensor) that produced its policy output. False when the run is shutting down."""
        ...


class Sink(Protocol):
    """Where actors (and polybeast's feeders) put experience; picklable to actor
    processes, which share its memory."""

    def writer(
        self,
        owner: int,
        sources: Mapping[str, np.ndarray],
        *,
        first_id: int,
        id_stride: int,
        learner_pid: int,
        clock: PhaseClock | None = None,
        lane: int = 0,
        incarnation: int = 0,
    ) -> StepWriter:
        """Actor `owner`'s writer for the n envs of `sources` (`[n, ...]` arrays at fixed
        addresses), in writer lane `lane`; `first_id`, `id_stride` number its rollouts,
        `incarnation` tells its processes apart after a restart."""
        ...

    def take_turns(self) -> None:
        """The learner runs in the writers' own thread, taking turns with them (--serial):
        writers must never wait for it."""
        ...

    def reclaim(self, owner: int, incarnation: int = 0) -> int:
        """What a dead actor held goes back (rollout slots); how many items."""
        ...

    def lane_has_room(self, lane: int, num_envs: int) -> bool:
        """Whether writer lane `lane` can take `num_envs` envs' next writes now."""
        ...

    def staging_recipe(self) -> StagingRecipe:
        """What an env server needs to stage its steps outside this process (polybeast)."""
        ...

    def commit(self, payload: Mapping, stop: threading.Event, row: int) -> bool:
        """Add steps staged elsewhere, as writer `row`; False when `stop` was set while
        waiting for room."""
        ...

    def nbytes(self) -> int: ...

    def describe(self) -> str:
        """The sink, for the start-up line."""
        ...

    def close(self) -> None:
        """Tell every writer to stop at its next write."""
        ...


class Source(Protocol):
    """The learner's side (beast/learning/learner.py): batches on the learning device,
    priorities back, and the agent steps and episodes no batch carries (replay actors
    count their own)."""

    failed: threading.Event  # set when the source's own threads failed
    error: BaseException | None  # what they failed with

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def next(self, timeout: float) -> Batch | None:
        """A batch, or None after `timeout` seconds without one."""
        ...

    def poll(self) -> Batch | None:
        """--serial: a batch if one is due now, without waiting."""
        ...

    def pending_steps(self) -> int:
        """Agent steps taken since the last call that no batch carries."""
        ...

    def pending_episodes(self) -> tuple[list[float], list[int]]:
        """Finished episodes' returns and lengths since the last call that no batch
        carries."""
        ...

    def feedback(self, batch: Batch, priorities: Tensor | None) -> None:
        """The update on `batch` is done: its new priorities (None: none)."""
        ...

    def release(self, batch: Batch) -> None:
        """The update's weights are published: what `batch` held can be reused."""
        ...

    def stats(self) -> dict[str, float]: ...

    def status_line(self) -> str | None:
        """Progress before the first batch (a replay filling up), else None."""
        ...

    def describe(self) -> str: ...

    def close(self) -> None: ...

    def save_replay(self, write: Callable[[dict[str, Tensor]], None]) -> dict | None:
        """Checkpoint a replay: `write` its contents, return its small state (None: no
        replay). Called outside the learner's lock (`Run.save`): updates may run
        meanwhile."""
        ...

    def restore_replay(self, tensors: Mapping[str, torch.Tensor], state: Mapping) -> str:
        """Load a checkpointed replay; what was restored, for the start-up line."""
        ...
