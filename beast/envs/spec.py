"""What the rest of beast needs to know about an environment, and the one error type for envs.

Buffers, models and actors are built from an `EnvSpec` (observation shape and dtype,
the action space: a number of discrete actions, or a bounded float vector) rather than
from gymnasium spaces, so the space checks live here once: anything beast cannot handle
yet is refused with a one-line `EnvError` before any process or buffer is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from beast.fields import Field

__all__ = ["EnvError", "EnvSpec", "env_spec"]


class EnvError(ValueError):
    """An environment cannot be created or used by beast.

    The message is one user-facing line: what is wrong and how to fix it. Entry points
    print it without a traceback; it is never chained to a long gymnasium traceback for
    user mistakes (unknown id, bad import path, unsupported space).
    """


@dataclass(frozen=True)
class EnvSpec:
    """Shape of one observation and the action space, as buffers and models need them.

    Attributes:
        obs_shape: shape of one observation, e.g. `(4, 84, 84)` for Atari, `(4,)` for
            CartPole. No batch or time axis.
        obs_dtype: `uint8` for Atari frames (and other integer Box observations),
            `float32` for vector observations (`make` casts other float dtypes).
        num_actions: a Discrete action space's size (actions `0 .. num_actions - 1`);
            0 for a continuous one.
        action_shape: a continuous (Box) action space's shape, `(d,)`; `()` for Discrete.
        action_low, action_high: a continuous action space's finite bounds, d floats
            each (env batches clip actions to them); `()` for Discrete.
    """

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

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
    spaces.Dict: "Dict observations are not supported yet; "
    "flatten them with gymnasium.wrappers.FlattenObservation",
    spaces.Tuple: "Tuple observations are not supported yet; "
    "flatten them with gymnasium.wrappers.FlattenObservation",
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
            float Box with finite bounds, or an observation space that is not a Box.
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
    if not isinstance(obs_space, spaces.Box):
        hint = _OBS_HINTS.get(
            type(obs_space),
            f"observation space {obs_space} is not supported; beast needs a Box observation space",
        )
        raise EnvError(hint)
    dtype = np.dtype(obs_space.dtype)
    if dtype.kind == "f":
        dtype = np.dtype(np.float32)
    return EnvSpec(obs_shape=tuple(int(d) for d in obs_space.shape), obs_dtype=dtype, **action)


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
