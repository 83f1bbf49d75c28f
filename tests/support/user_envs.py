"""Environments as a user writes them and runs them with `--env package.module:Class`, for
tests: classes with no Gymnasium id, so no config family by name."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.acrobot import AcrobotEnv
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.wrappers import TimeLimit

# CartPole-v1's episode limit (its registration's max_episode_steps).
MAX_EPISODE_STEPS = 500


class CustomCartPole(gymnasium.Wrapper):
    """CartPole-v1 as a user's own class: Gymnasium's CartPoleEnv with the 500-step time
    limit its registration adds, made by `--env tests.support.user_envs:CustomCartPole`. Its
    vector observations and Discrete actions should pick CartPole-v1's tuned config."""

    def __init__(self) -> None:
        super().__init__(TimeLimit(CartPoleEnv(), max_episode_steps=MAX_EPISODE_STEPS))


class CustomAcrobot(gymnasium.Wrapper):
    """Acrobot-v1 as a user's own class: Gymnasium's AcrobotEnv with the 500-step time limit
    of its registration (-1 a step until the tip swings above the bar), made by `--env
    tests.support.user_envs:CustomAcrobot`. Like CustomCartPole, its vector observations
    and Discrete actions pick configs/<algo>/classic.yaml, so one file must serve both."""

    def __init__(self) -> None:
        super().__init__(TimeLimit(AcrobotEnv(), max_episode_steps=MAX_EPISODE_STEPS))


class CustomPendulum(gymnasium.Wrapper):
    """Pendulum-v1 as a user's own class (vector observations, Box actions)."""

    def __init__(self) -> None:
        super().__init__(TimeLimit(PendulumEnv(), max_episode_steps=200))


class CustomImages(gymnasium.Env):
    """Image observations, uint8 [4, 84, 84] as Atari's frame stacks, and 6 actions; a
    constant frame and no reward (for config choices and spec checks, not for learning)."""

    observation_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = spaces.Discrete(6)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((4, 84, 84), np.uint8), {}

    def step(self, action):
        return np.zeros((4, 84, 84), np.uint8), 0.0, False, False, {}
