"""Classic control with Dict observations: CartPole and Pendulum, their observations split.

Small checks that Dict observations work end to end (env specs, buffers, replays, the
multi-input model) on tasks whose Box versions every algorithm here is known to learn:
the same dynamics, rewards and time limits, only the observation is a Dict.

    make("DictCartPole-v1")    # {"position": [x, theta], "velocity": [x_dot, theta_dot]}
    make("DictPendulum-v1")    # {"angle": [cos theta, sin theta], "velocity": [theta_dot]}

Both are registered by `beast.envs` and belong to the "classic" config family, so they
start from the tuned configs/<algo>/classic.yaml as CartPole-v1 and Pendulum-v1 do.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["CARTPOLE_ID", "PENDULUM_ID", "SplitObservation", "dict_cartpole", "dict_pendulum"]

CARTPOLE_ID = "DictCartPole-v1"
PENDULUM_ID = "DictPendulum-v1"


class SplitObservation(gymnasium.ObservationWrapper):
    """A vector-observation env whose observation is a Dict of named slices of the vector.

    Args:
        env: an env with a 1-D float Box observation.
        parts: Dict key -> indices of the vector that make up that leaf (float32).
    """

    def __init__(self, env: gymnasium.Env, parts: dict[str, tuple[int, ...]]) -> None:
        super().__init__(env)
        inner = env.observation_space
        self.parts = {key: list(indices) for key, indices in parts.items()}
        self.observation_space = spaces.Dict(
            {
                key: spaces.Box(
                    low=inner.low[indices].astype(np.float32),
                    high=inner.high[indices].astype(np.float32),
                    dtype=np.float32,
                )
                for key, indices in self.parts.items()
            }
        )

    def observation(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        observation = np.asarray(observation, dtype=np.float32)
        return {key: observation[indices] for key, indices in self.parts.items()}


def dict_cartpole(render_mode: str | None = None) -> SplitObservation:
    """CartPole-v1 observing {"position": [x, theta], "velocity": [x_dot, theta_dot]}."""
    env = gymnasium.make("CartPole-v1", render_mode=render_mode)
    return SplitObservation(env, {"position": (0, 2), "velocity": (1, 3)})


def dict_pendulum(render_mode: str | None = None) -> SplitObservation:
    """Pendulum-v1 observing {"angle": [cos theta, sin theta], "velocity": [theta_dot]}."""
    env = gymnasium.make("Pendulum-v1", render_mode=render_mode)
    return SplitObservation(env, {"angle": (0, 1), "velocity": (2,)})


# The inner envs carry their own TimeLimit (500 and 200 steps), so the ids add none.
for _id, _entry in ((CARTPOLE_ID, "dict_cartpole"), (PENDULUM_ID, "dict_pendulum")):
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=f"beast.envs.dict_classic:{_entry}")
