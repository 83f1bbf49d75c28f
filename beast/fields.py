"""The shared-memory layout vocabulary: fields, shared tensors, recurrent-state keys,
observation leaves.

Every buffer in beast (rollout slots, replays, the central request table) is declared
as a spec, field name -> `Field(shape, dtype)` for one slot, step or env, and allocated
as one shared-memory block per field with `shared_zeros`.

Observations are fields too, one per leaf of the observation space. A Box observation
is the one field "obs". A Dict or Tuple observation is one field per Box leaf, named by
its path: "obs.position" for a Dict key, "obs[0]" for a Tuple index, "obs.arm[1].joints"
nested. So buffers, env batches and the request table stay flat (one shared block per
leaf, the same code as for any field), and only the model boundary puts the leaves back
together: `model_inputs(fields)` gives `inputs["obs"]` as the observation's structure, a
dict for a Dict, a tuple for a Tuple, the tensor itself for a Box.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "OBS_KEY",
    "Field",
    "box_obs",
    "core_state",
    "core_state_key",
    "core_state_shapes",
    "is_core_state",
    "is_obs_key",
    "leading_rows",
    "map_inputs",
    "model_inputs",
    "nest_obs",
    "flatten_obs",
    "numpy_dtype",
    "obs_key",
    "obs_leaf",
    "obs_path",
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


def leading_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor[:rows]` (a contiguous tensor) on a storage that holds those rows alone: a
    view, no copy. torch.save writes a view's whole storage, so a replay that is still
    filling saved its full capacity, or (cloned, as it was) held a second copy of what
    it had written while the checkpoint ran: 6.8 GB more for Rainbow's 1M replay."""
    if not tensor.is_contiguous():
        raise ValueError("leading_rows needs a contiguous tensor")
    if rows == tensor.shape[0]:
        return tensor
    part = tensor[:rows]
    start = tensor.storage_offset() * tensor.element_size()
    storage = tensor.untyped_storage()[start : start + part.numel() * part.element_size()]
    return torch.empty(0, dtype=tensor.dtype).set_(storage, 0, part.shape, part.stride())


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


# Observation leaves (module docstring).

OBS_KEY = "obs"
# What the model reads besides the observation, per step (beast/models/__init__.py's contract).
_STEP_INPUT_KEYS = ("reward", "done", "last_action")
# One step of a leaf's path in its field name: ".key" (a Dict key) or "[index]" (a Tuple).
_PATH_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")

ObsPath = tuple[str | int, ...]


def box_obs(shape: Sequence[int], dtype: np.dtype | torch.dtype) -> dict[str, Field]:
    """A Box observation's fields, what buffer specs take as `obs`: {"obs": Field}."""
    return {OBS_KEY: Field(tuple(int(d) for d in shape), torch_dtype(dtype))}


def obs_key(path: ObsPath) -> str:
    """The field name of the observation leaf at `path` (Dict keys, Tuple indices):
    () -> "obs", ("arm", 1, "joints") -> "obs.arm[1].joints"."""
    return OBS_KEY + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)


@functools.lru_cache(maxsize=4096)
def obs_path(key: str) -> ObsPath:
    """The inverse of `obs_key`; ValueError for a name that is no observation leaf's."""
    rest = key[len(OBS_KEY) :] if key.startswith(OBS_KEY) else None
    path: list[str | int] = []
    position = 0
    for match in _PATH_STEP.finditer(rest or ""):
        if match.start() != position:
            break
        name, index = match.groups()
        path.append(name if name is not None else int(index))
        position = match.end()
    if rest is None or position != len(rest):
        raise ValueError(f"{key!r} names no observation leaf")
    return tuple(path)


def is_obs_key(key: str) -> bool:
    """Whether the field `key` is an observation leaf ("obs", "obs.x", "obs[0]", ...)."""
    return key == OBS_KEY or key.startswith((OBS_KEY + ".", OBS_KEY + "["))


def nest_obs(fields: Mapping[str, Any]) -> Any:
    """The observation leaves among `fields` (any mapping holding them: a batch, a row
    of a table, an env batch's arrays) put back into the observation's structure: the
    "obs" value itself for a Box, else nested dicts (Dict) and tuples (Tuple) of the
    leaves' values, in the fields' order."""
    if OBS_KEY in fields:
        return fields[OBS_KEY]
    leaves = [(obs_path(key), value) for key, value in fields.items() if is_obs_key(key)]
    if not leaves:
        raise KeyError(f"no observation field among {sorted(fields)}")
    return _nest(leaves)


def _nest(leaves: list[tuple[ObsPath, Any]]) -> Any:
    if len(leaves) == 1 and not leaves[0][0]:
        return leaves[0][1]
    children: dict[str | int, list[tuple[ObsPath, Any]]] = {}
    for path, value in leaves:
        children.setdefault(path[0], []).append((path[1:], value))
    nested = {step: _nest(below) for step, below in children.items()}
    if all(isinstance(step, int) for step in nested):
        return tuple(nested[i] for i in range(len(nested)))
    return nested


def flatten_obs(obs: Any, is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """The inverse of `nest_obs`: an observation's structure (dicts, tuples) -> its
    leaves by field name. `is_leaf`: what ends the walk besides a non-container (a shape
    tuple, when flattening a structure of shapes)."""
    leaves: dict[str, Any] = {}

    def walk(node: Any, path: ObsPath) -> None:
        if is_leaf is not None and is_leaf(node):
            leaves[obs_key(path)] = node
        elif isinstance(node, Mapping):
            for name, child in node.items():
                walk(child, (*path, name))
        elif isinstance(node, tuple | list):
            for index, child in enumerate(node):
                walk(child, (*path, index))
        else:
            leaves[obs_key(path)] = node

    walk(obs, ())
    return leaves


def model_inputs(fields: Mapping[str, Any]) -> dict[str, Any]:
    """What a model reads from a batch, a table's rows or an actor's arrays (the contract
    of beast/models/__init__.py): `obs` (its leaves nested, `nest_obs`), `reward`, `done`,
    `last_action`."""
    return {OBS_KEY: nest_obs(fields), **{key: fields[key] for key in _STEP_INPUT_KEYS}}


def obs_leaf(obs: Any, path: ObsPath) -> Any:
    """The leaf at `path` of an observation's structure (`obs_path`): a model's fast way
    to its leaves, with the paths found once."""
    for step in path:
        obs = obs[step]
    return obs


def index_inputs(inputs: Any, index: Any) -> Any:
    """Every tensor of model inputs indexed by `index` (time rows, batch columns), the
    structure kept. A plain function rather than `operator.itemgetter`, which
    torch.compile cannot trace (beast/train_step compiles losses that call this)."""
    return map_inputs(lambda value: value[index], inputs)


def map_inputs(fn: Callable[[Any], Any], inputs: Any) -> Any:
    """`fn` applied to every tensor of model inputs (nested observations included), the
    structure kept: slicing time steps, picking columns, moving to a device."""
    if isinstance(inputs, torch.Tensor):  # first: the common case, and a cheap check
        return fn(inputs)
    if isinstance(inputs, Mapping):
        return {key: map_inputs(fn, value) for key, value in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(map_inputs(fn, value) for value in inputs)
    return fn(inputs)
