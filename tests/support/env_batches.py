"""Driving env batches in tests (tests/envs/test_env_batch.py, test_envpool_batch.py):
Atari ids registered with overrides, random actions, a copy of a batch's outputs, two
batches stepped side by side, and games played to their real ends."""

from __future__ import annotations

import numpy as np

from beast.envs.batch import EnvBatch


def register_atari(register, env_id: str, game: str, **kwargs) -> str:
    """A NoFrameskip-v4-style id (no sticky actions, 108000-frame limit) with overrides."""
    defaults = dict(
        game=game,
        repeat_action_probability=0.0,
        full_action_space=False,
        frameskip=1,
        max_num_frames_per_episode=108000,
    )
    max_episode_steps = kwargs.pop("max_episode_steps", None)
    return register(
        env_id,
        entry_point="ale_py.env:AtariEnv",
        kwargs={**defaults, **kwargs},
        max_episode_steps=max_episode_steps,
    )


def random_actions(num_actions: int, num_envs: int, steps: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(num_actions, size=(steps, num_envs))


def outputs(batch: EnvBatch) -> dict[str, np.ndarray]:
    """A copy of every output array of `batch`."""
    names = ("obs", "reward", "done", "terminated", "truncated", "episode_end")
    names += ("episode_return", "episode_step")
    return {name: getattr(batch, name).copy() for name in names}


def step_both(
    loop: EnvBatch, ale: EnvBatch, actions: np.ndarray
) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Step both batches with each row of `actions`; the outputs after every step."""
    history = []
    for row in actions:
        loop.step(row)
        ale.step(row)
        history.append((outputs(loop), outputs(ale)))
    return history


def play_games(batch: EnvBatch, games: int, seed: int = 3) -> list[dict[str, float]]:
    """Step `batch` with random actions until env 0 finishes `games` real episodes.

    Returns one record per game of env 0: its reported return and length, the sum of the
    step rewards, the number of steps and of `done` flags seen during it.
    """
    rng = np.random.default_rng(seed)
    records, reward_sum, steps, dones = [], 0.0, 0, 0
    while len(records) < games:
        batch.step(rng.integers(batch.spec.num_actions, size=batch.num_envs))
        reward_sum += float(batch.reward[0])
        steps += 1
        dones += int(batch.done[0])
        if batch.episode_end[0]:
            assert batch.done[0], "a real episode end is also the end of the agent's episode"
            records.append(
                dict(
                    episode_return=float(batch.episode_return[0]),
                    episode_step=int(batch.episode_step[0]),
                    reward_sum=reward_sum,
                    steps=steps,
                    dones=dones,
                )
            )
            reward_sum, steps, dones = 0.0, 0, 0
    return records
