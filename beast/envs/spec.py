"""What the rest of beast needs to know about an environment, and the one error type for envs.

Buffers, models and actors are built from an `EnvSpec` (observation shape and dtype,
number of actions) rather than from gymnasium spaces, so the space checks live here
once: anything beast cannot handle yet is refused with a one-line `EnvError` before
any process or buffer is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["EnvError", "EnvSpec", "env_spec"]


class EnvError(ValueError):
    """An environment cannot be created or used by beast.

    The message is one user-facing line: what is wrong and how to fix it. Entry points
    print it without a traceback; it is never chained to a long gymnasium traceback for
    user mistakes (unknown id, bad import path, unsupported space).
    """


@dataclass(frozen=True)
class EnvSpec:
    """Shape of one observation and size of the action set, as rollout buffers need them.

    Attributes:
        obs_shape: shape of one observation, e.g. `(4, 84, 84)` for Atari, `(4,)` for
            CartPole. No batch or time axis.
        obs_dtype: `uint8` for Atari frames (and other integer Box observations),
            `float32` for vector observations (`make` casts other float dtypes).
        num_actions: number of discrete actions; actions are `0 .. num_actions - 1`.
    """

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int


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
    spaces.Box: "continuous (Box) action spaces are not supported yet; "
    "beast needs a Discrete action space (discretize it, e.g. "
    "gymnasium.wrappers.DiscretizeAction)",
    spaces.MultiDiscrete: "MultiDiscrete action spaces are not supported yet; "
    "beast needs a single Discrete action space",
}


def env_spec(env: gymnasium.Env) -> EnvSpec:
    """Read the `EnvSpec` of an env, refusing spaces beast cannot handle yet.

    Float observation dtypes are reported as float32: `make` casts them, and buffers
    are allocated from this spec.

    Raises:
        EnvError: non-Discrete action space (or a Discrete one not starting at 0), or an
            observation space that is not a Box.
    """
    action_space = env.action_space
    if not isinstance(action_space, spaces.Discrete):
        hint = _ACTION_HINTS.get(
            type(action_space),
            f"action space {action_space} is not supported; beast needs a Discrete action space",
        )
        raise EnvError(hint)
    if int(action_space.start) != 0:
        raise EnvError(
            f"Discrete action space {action_space} starts at {int(action_space.start)}; "
            "beast samples actions 0..n-1, so shift it with a gymnasium ActionWrapper"
        )

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
    return EnvSpec(
        obs_shape=tuple(int(d) for d in obs_space.shape),
        obs_dtype=dtype,
        num_actions=int(action_space.n),
    )
