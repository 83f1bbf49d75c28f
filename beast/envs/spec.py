"""What the rest of beast needs to know about an environment, and the one error type for envs.

Buffers, models and actors are built from an `EnvSpec` (the observation's leaves, each a
shape and dtype; the action space: a number of discrete actions, or a bounded float
vector) rather than from gymnasium spaces, so the space checks live here once: anything
beast cannot handle yet is refused with a one-line `EnvError` before any process or
buffer is allocated.

Observations: a Box, or Dict and Tuple spaces (nested as deep as you like) whose leaves
are Boxes. Each leaf is one buffer field (beast/fields.py: "obs" for a Box,
"obs.position", "obs[0]", ... for the leaves of a Dict or a Tuple).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from beast.fields import (
    Field,
    ObsPath,
    box_obs,
    nest_obs,
    obs_key,
    obs_leaf,
    obs_path,
    torch_dtype,
)

__all__ = ["EnvError", "EnvSpec", "env_spec", "is_image", "images_not_stacked"]


class EnvError(ValueError):
    """An environment cannot be created or used by beast.

    The message is one user-facing line: what is wrong and how to fix it. Entry points
    print it without a traceback; it is never chained to a long gymnasium traceback for
    user mistakes (unknown id, bad import path, unsupported space).
    """


def is_image(shape: tuple[int, ...]) -> bool:
    """Whether an observation leaf of `shape` is an image, [C, H, W] (a frame stack for
    Atari): what conv torsos read and replays' frame deduplication stores once per frame."""
    return len(shape) == 3


@dataclass(frozen=True)
class EnvSpec:
    """The observation's leaves and the action space, as buffers and models need them.

    Attributes:
        obs_shape: a Box observation's shape, e.g. `(4, 84, 84)` for Atari, `(4,)` for
            CartPole (no batch or time axis); None for a Dict or Tuple observation.
        obs_dtype: a Box observation's dtype: `uint8` for Atari frames (and other integer
            Box observations), `float32` for vector observations (`make` casts other float
            dtypes); None for a Dict or Tuple observation.
        num_actions: a Discrete action space's size (actions `0 .. num_actions - 1`);
            0 for a continuous one.
        action_shape: a continuous (Box) action space's shape, `(d,)`; `()` for Discrete.
        action_low, action_high: a continuous action space's finite bounds, d floats
            each (env batches clip actions to them); `()` for Discrete.
        nested_obs: a Dict or Tuple observation's leaves, (field name, Field) in the
            space's order (float leaves as float32); `()` for a Box.
    """

    obs_shape: tuple[int, ...] | None
    obs_dtype: np.dtype | None
    num_actions: int
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    nested_obs: tuple[tuple[str, Field], ...] = ()

    @property
    def nested(self) -> bool:
        """Whether the observation is a Dict or Tuple (several fields) rather than a Box."""
        return bool(self.nested_obs)

    def obs_fields(self) -> dict[str, Field]:
        """One observation's fields as buffers store them: {"obs": Field} for a Box, one
        field per leaf for a Dict or Tuple."""
        if self.nested:
            return dict(self.nested_obs)
        return box_obs(self.obs_shape, self.obs_dtype)

    def model_obs_shape(self) -> tuple[int, ...] | dict | tuple:
        """What models are built with (`obs_shape=`): a Box's shape, or the leaves' shapes
        nested as `inputs["obs"]` is (a dict for a Dict, a tuple for a Tuple)."""
        if not self.nested:
            return tuple(self.obs_shape)
        return nest_obs({key: field.shape for key, field in self.nested_obs})

    def has_images(self) -> bool:
        """Whether some observation leaf is an image, [C, H, W] (`is_image`)."""
        return any(is_image(field.shape) for field in self.obs_fields().values())

    def split_obs(self, obs: object) -> dict[str, object]:
        """An observation as the env returns it -> its leaves by field name (a Box: the
        observation itself). EnvError, naming the leaf, for one the observation lacks."""
        if not self.nested:
            return {"obs": obs}
        return {key: _leaf(obs, key) for key, _ in self.nested_obs}

    def describe_obs(self) -> str:
        """For start-up lines: "(4,) float32", or "obs.image (1, 16, 16) uint8, obs.x (2,)
        float32" for a Dict."""
        if not self.nested:
            return f"{self.obs_shape} {self.obs_dtype}"
        return ", ".join(
            f"{key} {field.shape} {str(field.dtype).removeprefix('torch.')}"
            for key, field in self.nested_obs
        )

    @property
    def continuous(self) -> bool:
        """Whether actions are float vectors (a Box action space) rather than indices."""
        return bool(self.action_shape)

    @property
    def action_dim(self) -> int:
        """d of a continuous action space; 0 for Discrete."""
        return math.prod(self.action_shape) if self.continuous else 0

    def action_field(self) -> Field:
        """One env's action as buffers store it: int64 `()`, or float32 `(d,)`."""
        if self.continuous:
            return Field(self.action_shape, torch.float32)
        return Field((), torch.int64)

    def clip_actions(self, actions: np.ndarray) -> np.ndarray:
        """Continuous actions `[..., d]` clipped to the bounds, as float32: what an env is
        given (a Gaussian policy's draw can leave the box; the draw itself is what its
        log-probability is taken of, so policies store it unclipped)."""
        low = np.asarray(self.action_low, dtype=np.float32)
        high = np.asarray(self.action_high, dtype=np.float32)
        return np.clip(actions, low, high).astype(np.float32, copy=False)

    def describe_actions(self) -> str:
        """For start-up lines: "6 actions", or "Box(6) actions in [-1, 1]"."""
        if not self.continuous:
            return f"{self.num_actions} actions"
        low, high = min(self.action_low), max(self.action_high)
        return f"Box({self.action_dim}) actions in [{low:g}, {high:g}]"


# One hint per unsupported space type, so the error says how to get going today.
_OBS_HINTS: dict[type, str] = {
    spaces.Discrete: "Discrete observations are not supported yet; "
    "one-hot encode them into a Box with an ObservationWrapper",
    spaces.MultiDiscrete: "MultiDiscrete observations are not supported yet; "
    "cast them to a Box with gymnasium.wrappers.DtypeObservation",
    spaces.MultiBinary: "MultiBinary observations are not supported yet; "
    "cast them to a Box with gymnasium.wrappers.DtypeObservation",
}

_ACTION_HINTS: dict[type, str] = {
    spaces.MultiDiscrete: "MultiDiscrete action spaces are not supported yet; "
    "beast needs a single Discrete action space or a Box",
}


def env_spec(env: gymnasium.Env) -> EnvSpec:
    """Read the `EnvSpec` of an env, refusing spaces beast cannot handle yet.

    Float observation dtypes are reported as float32: `make` casts them, and buffers
    are allocated from this spec.

    Raises:
        EnvError: an action space that is neither Discrete (starting at 0) nor a 1-D
            float Box with finite bounds, or an observation space that is not a Box, or a
            Dict or Tuple of Boxes.
    """
    action_space = env.action_space
    if isinstance(action_space, spaces.Box):
        action = _box_action(action_space)
    elif isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise EnvError(
                f"Discrete action space {action_space} starts at {int(action_space.start)}; "
                "beast samples actions 0..n-1, so shift it with a gymnasium ActionWrapper"
            )
        action = {"num_actions": int(action_space.n)}
    else:
        hint = _ACTION_HINTS.get(
            type(action_space),
            f"action space {action_space} is not supported; beast needs a Discrete or a Box"
            " action space",
        )
        raise EnvError(hint)

    obs_space = env.observation_space
    if isinstance(obs_space, spaces.Dict | spaces.Tuple):
        leaves = tuple(_obs_leaves(obs_space, ()))
        return EnvSpec(obs_shape=None, obs_dtype=None, nested_obs=leaves, **action)
    if not isinstance(obs_space, spaces.Box):
        hint = _OBS_HINTS.get(
            type(obs_space),
            f"observation space {obs_space} is not supported; beast needs a Box, Dict or"
            " Tuple observation space",
        )
        raise EnvError(hint)
    return EnvSpec(
        obs_shape=tuple(int(d) for d in obs_space.shape), obs_dtype=_box_dtype(obs_space), **action
    )


def _box_dtype(space: spaces.Box) -> np.dtype:
    """A Box observation's dtype as buffers store it: floats as float32 (`make` casts a
    Box; env batches cast a Dict's leaves as they store them)."""
    dtype = np.dtype(space.dtype)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


def _obs_leaves(space: spaces.Space, path: ObsPath) -> list[tuple[str, Field]]:
    """The Box leaves of a Dict or Tuple observation space, depth first in the space's
    order, as (field name, Field); EnvError naming the first leaf beast cannot store."""
    key = obs_key(path)
    if isinstance(space, spaces.Box):
        if math.prod(space.shape) == 0:
            raise EnvError(f"observation leaf {key} is an empty Box {space.shape}; drop it")
        return [(key, Field(tuple(int(d) for d in space.shape), torch_dtype(_box_dtype(space))))]
    if isinstance(space, spaces.Dict | spaces.Tuple):
        children = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space)
        children = list(children)
        if not children:
            raise EnvError(f"observation {key} is an empty {type(space).__name__}; drop it")
        leaves: list[tuple[str, Field]] = []
        for name, child in children:
            if isinstance(space, spaces.Dict) and not _storable_key(name):
                raise EnvError(
                    f"observation {key} has the Dict key {name!r}; beast names each leaf by"
                    " its path (obs.key), so keys must be non-empty strings without '.', '['"
                    " or ']': rename it with an ObservationWrapper"
                )
            leaves += _obs_leaves(child, (*path, name))
        return leaves
    raise EnvError(f"observation leaf {key} is {space}: {_leaf_hint(space)}")


def _storable_key(name: object) -> bool:
    if not isinstance(name, str) or not name:
        return False
    try:
        return obs_path(obs_key((name,))) == (name,)
    except ValueError:
        return False


def _leaf_hint(space: spaces.Space) -> str:
    """Why a Dict or Tuple leaf cannot be stored, and what to do instead."""
    if isinstance(space, spaces.Discrete):
        return "beast stores Box leaves; one-hot encode it into a Box with an ObservationWrapper"
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        return "beast stores Box leaves; cast it to a Box with an ObservationWrapper"
    if isinstance(space, spaces.Text | spaces.Sequence | spaces.Graph):
        return (
            "its size varies from step to step, and beast stores every leaf in fixed-size"
            " shared-memory arrays; encode it as a fixed-size Box with an ObservationWrapper"
        )
    return "beast stores Box leaves only; make it a Box with an ObservationWrapper"


def _leaf(obs: object, key: str) -> object:
    """The value of the leaf `key` in an observation as the env returns it."""
    try:
        return obs_leaf(obs, obs_path(key))
    except (KeyError, IndexError, TypeError):
        raise EnvError(
            f"the env returned an observation without its leaf {key}"
            f" (a {type(obs).__name__} where the observation space has it)"
        ) from None


def images_not_stacked(env: gymnasium.Env, spec: EnvSpec, steps: int = 8) -> list[str]:
    """The image leaves of `env`'s observation that are not frame stacks, found by playing
    `steps` random steps from a reset: a stack [k, H, W] slides by one frame a step
    (obs_t[:-1] == obs_{t-1}[1:] within an episode), which replays' frame deduplication
    relies on. A camera's RGB channels do not: deduplicated, none of its steps could be
    rebuilt, and a replay would hold nothing to sample. (One-channel images always
    slide.)"""
    keys = [key for key, field in spec.obs_fields().items() if is_image(field.shape)]

    def images(obs: object) -> dict[str, np.ndarray]:
        leaves = spec.split_obs(obs)
        return {key: np.array(leaves[key]) for key in keys}  # copies: stacks change in place

    previous = images(env.reset()[0])
    not_stacked: set[str] = set()
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        current = images(env.reset()[0] if terminated or truncated else obs)
        if not (terminated or truncated):
            not_stacked |= {
                key for key in keys if not np.array_equal(current[key][:-1], previous[key][1:])
            }
        previous = current
    return [key for key in keys if key in not_stacked]


def _box_action(space: spaces.Box) -> dict[str, object]:
    """EnvSpec's action fields for a Box action space, or a one-line EnvError."""
    if len(space.shape) != 1 or space.shape[0] < 1:
        raise EnvError(
            f"Box action space {space} has shape {space.shape}; beast needs a 1-D vector of"
            " actions (flatten it with a gymnasium ActionWrapper)"
        )
    if np.dtype(space.dtype).kind != "f":
        raise EnvError(
            f"Box action space {space} has dtype {space.dtype}; beast's continuous actions are"
            " floats (use a Discrete space for integer actions)"
        )
    low = np.asarray(space.low, dtype=np.float64)
    high = np.asarray(space.high, dtype=np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise EnvError(
            f"Box action space {space} has infinite bounds; beast clips actions to the"
            " bounds and scales its policies to them, so give the env's action_space the"
            " finite low and high it accepts"
        )
    if not (low < high).all():
        raise EnvError(f"Box action space {space} has low >= high in some dimension")
    return {
        "num_actions": 0,
        "action_shape": (int(space.shape[0]),),
        "action_low": tuple(float(x) for x in low),
        "action_high": tuple(float(x) for x in high),
    }
