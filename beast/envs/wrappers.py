"""Wrappers every env from `make` gets: episode statistics and a stored first-reset seed."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["EpisodeStatistics", "Float32Observation", "SeedFirstReset"]


class EpisodeStatistics(gymnasium.Wrapper):
    """Report `info["episode"] = {"r": float, "l": int}` on the step that ends an episode.

    `r` is the total undiscounted raw reward and `l` the number of steps of the wrapped
    env (agent steps for Atari, since this sits above frame skipping). An episode ends
    when the wrapped env returns `terminated` or `truncated`; `make` places this wrapper
    below the episodic-life wrapper, so a lost life does not end the reported episode.

    Why our own and not `gymnasium.wrappers.RecordEpisodeStatistics`: that one adds a
    wall-clock `t` and keeps deques; actors log exactly `r` and `l`, and episodic life
    needs `step_uncounted` below.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self._return = 0.0
        self._length = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._return = 0.0
        self._length = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._step(action, count=True)

    def step_uncounted(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step without adding to the episode length; the reward still counts.

        Used by episodic life's soft reset: its no-op step is game time (its reward is
        part of the score) but not an agent step.
        """
        return self._step(action, count=False)

    def _step(self, action: Any, count: bool) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += int(count)
        if terminated or truncated:
            info = dict(info)
            info["episode"] = {"r": self._return, "l": self._length}
        return obs, reward, terminated, truncated, info


class SeedFirstReset(gymnasium.Wrapper):
    """Use `seed` for the first `reset()` that is not given one, and seed the action space.

    Actors call `reset()` without arguments; storing the seed here makes `make(name,
    seed=s)` reproducible without every caller threading the seed through. Later resets
    continue the env's own RNG stream, as Gymnasium intends.
    """

    def __init__(self, env: gymnasium.Env, seed: int | None) -> None:
        super().__init__(env)
        self._pending_seed = seed
        if seed is not None:
            self.action_space.seed(seed)
            self.observation_space.seed(seed)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


class Float32Observation(gymnasium.ObservationWrapper):
    """Cast float Box observations (float64, float16) to float32 numpy arrays.

    Models and buffers are float32. Unlike `gymnasium.wrappers.DtypeObservation`, the
    bounds are cast explicitly (bounds beyond float32's range become +-inf), so no
    "precision lowered" warning is logged for every env created.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        inner = env.observation_space
        with np.errstate(over="ignore"):
            low = np.asarray(inner.low).astype(np.float32)
            high = np.asarray(inner.high).astype(np.float32)
        self.observation_space = spaces.Box(low=low, high=high, dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)
