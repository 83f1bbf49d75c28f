"""The shared-memory layout vocabulary: fields, shared tensors, recurrent-state keys.

Every buffer in beast (rollout slots, replays, the central request table) is declared
as a spec, field name -> `Field(shape, dtype)` for one slot, step or env, and allocated
as one shared-memory block per field with `shared_zeros`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "Field",
    "core_state",
    "core_state_key",
    "core_state_shapes",
    "is_core_state",
    "numpy_dtype",
    "shared_zeros",
    "torch_dtype",
]


@dataclass(frozen=True)
class Field:
    """Shape of one field for ONE slot, step or env (without the leading batch dim)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


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


def torch_dtype(dtype: np.dtype | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


def core_state_key(i: int) -> str:
    return f"core_state_{i}"


def is_core_state(key: str) -> bool:
    return key.startswith("core_state_")


def core_state_shapes(initial_state: Sequence[torch.Tensor]) -> list[tuple[int, ...]]:
    """Per-env shapes of a model's recurrent state, for the specs that store it.

    `initial_state` is the model's `initial_state(batch_size)`; each tensor has
    its batch dim at index 1, which a slot (one env) does not store.
    """
    return [tuple(s.shape[:1] + s.shape[2:]) for s in initial_state]


def core_state(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The recurrent state stored with a batch: its `core_state_i` fields, in order."""
    count = sum(1 for key in batch if is_core_state(key))
    return tuple(batch[core_state_key(i)] for i in range(count))
