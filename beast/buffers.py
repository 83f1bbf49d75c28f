"""Rollout slots in shared memory and the free/full protocol that moves them.

The layout is declared once as a spec (field -> per-slot shape, dtype). Each
field is ONE contiguous shared-memory block shaped `[num_buffers, T+1, ...]`
(core-state fields: `[num_buffers, ...]`), never one tensor per slot:
thousands of small shared tensors exhaust file descriptors.

Protocol: every slot index is in exactly one place at a time, the free
queue, an actor, the full queue, or the learner's batch gatherer. An actor
takes a free index, records itself in `slot_owner`, writes a whole rollout,
clears `slot_owner` and puts the index on the full queue; the learner
gathers a batch from full slots (copying it out) and puts the indices back
on the free queue. Only indices cross processes. When an actor dies, the
slots it still owns are reclaimed onto the free queue. The ownership mark is
set after taking a slot and cleared before handing it on, so a death between
the two statements can lose a slot (a few microseconds per rollout) but can
never put one index in two places.

Every step of a rollout carries the rollout's id (`rollout_id`); a slot
whose steps disagree is torn (written by two rollouts) and is never used.

Alignment (index t of a slot): `obs` is the observation at step t; `reward`
was received on arriving there; `done` says the transition into it ended an
episode (so obs is a reset observation); `last_action` is the action taken
before it; `action`, `policy_logits` and `baseline` are the actor's output
computed FROM that observation. Step 0 repeats step T of the previous rollout
so the learner can bootstrap and, with `done`, reset recurrent state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from beast.native import IndexQueue

__all__ = [
    "Field",
    "rollout_spec",
    "RolloutBuffers",
    "core_state_key",
    "core_state_shapes",
    "shared_zeros",
]


def shared_zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor allocated in shared memory directly.

    `torch.zeros(...).share_memory_()` fills private pages, then copies them into a
    new shared segment: a replay briefly needed twice its size (6.2 GB at the peak
    for Pong's 3 GB R2D2 replay). A new segment reads as zeros already, and its pages
    take memory only once written.
    """
    shape = tuple(shape)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


@dataclass(frozen=True)
class Field:
    """Shape of one field for ONE slot (without the leading num_buffers dim)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def core_state_key(i: int) -> str:
    return f"core_state_{i}"


def core_state_shapes(initial_state: Sequence[torch.Tensor]) -> list[tuple[int, ...]]:
    """Per-env shapes of a model's recurrent state, for `rollout_spec`.

    `initial_state` is the model's `initial_state(batch_size)`; each tensor has
    its batch dim at index 1, which a slot (one env) does not store.
    """
    return [tuple(s.shape[:1] + s.shape[2:]) for s in initial_state]


def rollout_spec(
    *,
    unroll_length: int,
    obs_shape: Sequence[int],
    obs_dtype: np.dtype | torch.dtype,
    num_actions: int,
    core_state_shapes: Sequence[Sequence[int]] = (),
) -> dict[str, Field]:
    """The rollout layout for one env's unroll of T+1 steps.

    `core_state_shapes` are the per-env shapes of the recurrent state tensors
    (the model's initial_state(1) without its batch dim, which is dim 1), so
    that the state at the start of a rollout is stored with it.
    """
    steps = unroll_length + 1
    if not isinstance(obs_dtype, torch.dtype):
        obs_dtype = torch.from_numpy(np.zeros((), dtype=obs_dtype)).dtype
    spec = {
        "obs": Field((steps, *obs_shape), obs_dtype),
        "reward": Field((steps,), torch.float32),
        "done": Field((steps,), torch.bool),
        "last_action": Field((steps,), torch.int64),
        "action": Field((steps,), torch.int64),
        "policy_logits": Field((steps, num_actions), torch.float32),
        "baseline": Field((steps,), torch.float32),
        # Set on the step that ends a real episode (not a life loss), with the
        # episode's undiscounted return and length: the learner's statistics.
        "episode_end": Field((steps,), torch.bool),
        "episode_return": Field((steps,), torch.float32),
        "episode_step": Field((steps,), torch.int32),
        # Unique per rollout, written with every step: see is_torn().
        "rollout_id": Field((steps,), torch.int64),
    }
    for i, shape in enumerate(core_state_shapes):
        spec[core_state_key(i)] = Field(tuple(shape), torch.float32)
    return spec


class RolloutBuffers:
    """Shared rollout slots plus their free and full index queues.

    Picklable: passing it to a child process (any start method) shares the
    same memory and queues.
    """

    def __init__(self, spec: Mapping[str, Field], num_buffers: int) -> None:
        self.spec = dict(spec)
        self.num_buffers = num_buffers
        self.tensors = {
            key: shared_zeros((num_buffers, *f.shape), f.dtype) for key, f in self.spec.items()
        }
        self.num_core_state = sum(key.startswith("core_state_") for key in self.spec)
        # Index of the actor writing each slot, -1 when no actor holds it.
        self.slot_owner = torch.full((num_buffers,), -1, dtype=torch.int32).share_memory_()
        self.free_queue = IndexQueue(num_buffers)
        self.full_queue = IndexQueue(num_buffers)
        for index in range(num_buffers):
            self.free_queue.put(index)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def gather(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Copy slots out into a time-major batch.

        Rollout fields become `[T+1, B, ...]`; core-state fields, stored per
        slot without a batch dim, become `[d0, B, ...]` (batch at dim 1, as
        the model's state tensors have it). One copy per field.
        """
        batch = {}
        for key, tensor in self.tensors.items():
            slots = [tensor[i] for i in indices]
            batch[key] = torch.stack(slots, dim=1)
        return batch

    def is_torn(self, index: int) -> bool:
        """True when slot `index` holds steps of more than one rollout."""
        ids = self.tensors["rollout_id"][index]
        return not bool(torch.all(ids == ids[0]))

    def reclaim(self, owner: int) -> int:
        """Return the slots that actor `owner` holds to the free queue; the actor
        must be dead. Returns how many."""
        indices = torch.nonzero(self.slot_owner == owner).flatten().tolist()
        for index in indices:
            self.slot_owner[index] = -1
            self.free_queue.put(index)
        return len(indices)

    def core_state(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(batch[core_state_key(i)] for i in range(self.num_core_state))

    def close(self) -> None:
        """Wake and stop everyone blocked on either queue (shutdown)."""
        self.free_queue.close()
        self.full_queue.close()
