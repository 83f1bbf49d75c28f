"""Run environments written for the old gym API under the Gymnasium API.

Many research environments still implement gym's pre-0.26 interface (`reset() -> obs`,
`step(a) -> (obs, reward, done, info)`, `seed(s)`) and old gym `spaces` objects. gym
itself no longer installs next to NumPy 2, so the adapter never imports it: old spaces
are converted by duck typing (`.n` for Discrete, `.low/.high/.shape/.dtype` for Box).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from beast.envs.spec import EnvError

__all__ = ["OldGymAdapter", "convert_space"]


def convert_space(space: Any, what: str = "space") -> spaces.Space:
    """Return `space` as a gymnasium space; old gym Discrete/Box objects are rebuilt.

    Args:
        space: a gymnasium space (returned as is) or an old-gym-like space object.
        what: name used in the error message, e.g. "observation_space".

    Raises:
        EnvError: the object looks like neither a Discrete nor a Box space.
    """
    if isinstance(space, spaces.Space):
        return space
    # MultiBinary also has `.n` but a non-empty shape; MultiDiscrete has `.nvec`.
    if (
        hasattr(space, "n")
        and not hasattr(space, "nvec")
        and not tuple(getattr(space, "shape", ()) or ())
    ):
        return spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    if all(hasattr(space, attr) for attr in ("low", "high", "shape", "dtype")):
        dtype = np.dtype(space.dtype)
        shape = tuple(int(d) for d in space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype=dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=dtype), shape)
        return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    raise EnvError(
        f"cannot convert the old-gym {what} {space!r} to a gymnasium space: "
        "only Discrete (.n) and Box (.low/.high/.shape/.dtype) are understood; "
        "give the env gymnasium.spaces instead"
    )


class OldGymAdapter(gymnasium.Env):
    """Gymnasium `Env` around an env with the old gym API.

    Old API: `reset() -> obs`, `step(a) -> (obs, reward, done, info)`, optional
    `seed(s)`; `info["TimeLimit.truncated"]` marks a time-limit end. Envs that already
    speak the 0.26 API (`reset() -> (obs, info)`, 5-tuple `step`) are passed through,
    so the adapter is safe for any non-gymnasium env.

    `done` is split into `terminated = done and not truncated` and
    `truncated = done and info.get("TimeLimit.truncated", False)`, so value bootstrapping
    treats time-limit ends correctly. Box observations are returned as numpy arrays of
    the space's dtype (old envs often return lists or float64).
    """

    def __init__(self, env: Any) -> None:
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise EnvError(
                    f"{type(env).__name__} has no {method}() method: it is neither a "
                    "gymnasium.Env nor an old gym-API env"
                )
        for attr in ("observation_space", "action_space"):
            if not hasattr(env, attr):
                raise EnvError(
                    f"{type(env).__name__} has no {attr}: old gym-API envs must define "
                    "observation_space and action_space"
                )
        self.env = env
        self.observation_space = convert_space(env.observation_space, "observation_space")
        self.action_space = convert_space(env.action_space, "action_space")
        self.metadata = dict(getattr(env, "metadata", None) or {})
        self.render_mode = getattr(env, "render_mode", None)
        # Only Box observations are converted to arrays; a Tuple space's observations are
        # tuples, which also makes "(obs, info)" ambiguous, so new-API detection is off.
        self._box_obs = isinstance(self.observation_space, spaces.Box)
        self._tuple_obs = isinstance(self.observation_space, spaces.Tuple)

    def _obs(self, obs: Any) -> Any:
        if self._box_obs:
            return np.asarray(obs, dtype=self.observation_space.dtype)
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Seed the old env through `env.seed(seed)` when it has one, then reset it."""
        super().reset(seed=seed)
        if seed is not None:
            seed_fn = getattr(self.env, "seed", None)
            if callable(seed_fn):
                seed_fn(seed)
        result = self.env.reset()
        if (
            not self._tuple_obs
            and isinstance(result, tuple)
            and len(result) == 2
            and isinstance(result[1], dict)
        ):
            obs, info = result
        else:
            obs, info = result, {}
        return self._obs(obs), dict(info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        if len(result) == 5:
            obs, reward, terminated, truncated, info = result
            return self._obs(obs), float(reward), bool(terminated), bool(truncated), dict(info)
        obs, reward, done, info = result
        info = dict(info)
        truncated = bool(done) and bool(info.get("TimeLimit.truncated", False))
        terminated = bool(done) and not truncated
        return self._obs(obs), float(reward), terminated, truncated, info

    def render(self) -> Any:
        render_fn = getattr(self.env, "render", None)
        return render_fn() if callable(render_fn) else None

    def close(self) -> None:
        close_fn = getattr(self.env, "close", None)
        if callable(close_fn):
            close_fn()

    def __repr__(self) -> str:
        return f"<OldGymAdapter{self.env!r}>"
