"""A user's own environment: a gymnasium.Env class of yours, trained by beast.

    python examples/custom_env.py
    python monobeast.py --env examples.custom_env:Corridor --total_steps 50000

From Python the class itself is the env; on the command line, its import path. beast
picks its defaults from the env's spaces (vector observations and Discrete actions:
the classic-control config) and names them in its start-up line (docs/envs.md).
"""

import os

import gymnasium
import numpy as np
from gymnasium import spaces

import beast

# BEAST_EXAMPLE_STEPS shortens the run (the test suite runs every example so).
STEPS = int(os.environ.get("BEAST_EXAMPLE_STEPS", 50_000))


class Corridor(gymnasium.Env):
    """Walk a corridor of `length` cells from its first to its last: each step costs
    0.01, the last cell pays 1 and ends the episode; episodes are cut at 100 steps.

    Observation: the position, one-hot, float32 [length]. Actions: 0 left, 1 right.
    """

    def __init__(self, length: int = 10) -> None:
        self.length = length
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.position = self.steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.steps = 0
        return self._obs(), {}

    def step(self, action):
        move = 1 if action == 1 else -1
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.steps += 1
        arrived = self.position == self.length - 1
        reward = 1.0 if arrived else -0.01
        return self._obs(), reward, arrived, self.steps >= 100, {}


if __name__ == "__main__":  # actor processes import this script too
    result = beast.train(env=Corridor, total_steps=STEPS, xpid="corridor")
    print(f"trained {result.step:,} steps: mean return {result.mean_return:.2f}")
    evaluation = beast.evaluate(result, episodes=10)
    print(f"evaluated: {evaluation.mean_return:.2f} (at best 0.92, in 9 steps)")
