"""Masked CartPole: CartPole-v1 with its velocities hidden, a POMDP for recurrent agents.

CartPole's observation is (cart position, cart velocity, pole angle, pole angular
velocity). Without the two velocities no single observation tells which way the cart
and pole are moving, so a feed-forward Q-network cannot balance the pole for long,
while a recurrent one can infer the velocities from consecutive positions: the usual
small check that R2D2's LSTM and stored-state replay work (e.g. the "partially
observable CartPole" of recurrent-RL tutorials and papers).

    make("MaskedCartPole-v1")                                  # registered by beast.envs
    make("beast.envs.masked_cartpole:MaskedCartPole")          # the class, no arguments
    MaskedCartPole(mode="zero")                                # velocities zeroed, shape (4,)

Dynamics, rewards and the 500-step limit are CartPole-v1's.
"""

from __future__ import annotations

from typing import Literal

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["ENV_ID", "MaskedCartPole"]

ENV_ID = "MaskedCartPole-v1"
# Indices of the cart velocity and pole angular velocity in CartPole's observation.
VELOCITY_INDICES = (1, 3)
POSITION_INDICES = (0, 2)


class MaskedCartPole(gymnasium.ObservationWrapper):
    """CartPole-v1 observing only positions.

    Args:
        mode: "remove" drops the velocities (float32 [2]: cart position, pole angle);
            "zero" keeps the shape (float32 [4]) with both velocities always 0.
        render_mode: passed to CartPole-v1.
    """

    def __init__(
        self, mode: Literal["remove", "zero"] = "remove", render_mode: str | None = None
    ) -> None:
        if mode not in ("remove", "zero"):
            raise ValueError(f"mode must be 'remove' or 'zero', got {mode!r}")
        super().__init__(gymnasium.make("CartPole-v1", render_mode=render_mode))
        self.mode = mode
        inner = self.env.observation_space
        low, high = inner.low.copy(), inner.high.copy()
        if mode == "remove":
            keep = list(POSITION_INDICES)
            low, high = low[keep], high[keep]
        else:
            low[list(VELOCITY_INDICES)] = 0.0
            high[list(VELOCITY_INDICES)] = 0.0
        self.observation_space = spaces.Box(low=low, high=high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        observation = np.asarray(observation, dtype=np.float32)
        if self.mode == "remove":
            return observation[list(POSITION_INDICES)]
        masked = observation.copy()
        masked[list(VELOCITY_INDICES)] = 0.0
        return masked


if ENV_ID not in gymnasium.registry:
    # CartPole-v1 inside already has its TimeLimit, so the id adds none.
    gymnasium.register(id=ENV_ID, entry_point="beast.envs.masked_cartpole:MaskedCartPole")
