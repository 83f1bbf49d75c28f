"""`--mode test`: run a saved policy for N episodes and report its returns.

The checkpoint's own flags decide the environment, the algorithm and the
network, so `--mode test --xpid RUN` evaluates RUN as it was trained, whatever
the other defaults are now. It acts with the algorithm's evaluation policy
(`Algorithm.policy(explore=False)`): an actor-critic samples from its policy; a
Q-network acts greedily, with a small epsilon of random actions (`--test_epsilon`)
so that a deterministic policy cannot stall an episode forever.
`--record_video` writes the first episode as an mp4 with imageio-ffmpeg,
which bundles its own ffmpeg (no system package): Atari frames come straight
from the emulator's RGB screen, other envs need to render `rgb_array` frames.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics

import numpy as np
import torch

from beast import envs
from beast.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    has_checkpoint,
    load_latest_checkpoint,
)
from beast.config import Config, ConfigError, config_from_dict
from beast.engine import build_algorithm, build_checked_model
from beast.inference import LocalPolicy

__all__ = ["test", "VIDEO_NAME"]

VIDEO_NAME = "episode.mp4"
# An agent step is 4 emulator frames at 60 Hz for Atari: 15 agent steps a second.
_VIDEO_FPS = 15


class _VideoRecorder:
    """Appends one RGB frame per agent step to an mp4 until closed."""

    def __init__(self, env, path: str) -> None:
        unwrapped = env.unwrapped
        if hasattr(unwrapped, "ale"):
            self._frame = unwrapped.ale.getScreenRGB
        elif getattr(unwrapped, "render_mode", None) == "rgb_array":
            self._frame = env.render
        else:
            raise ConfigError(
                "--record_video needs an Atari env or one that renders rgb_array frames"
            )
        try:
            import imageio.v2 as imageio
        except ImportError as error:
            raise ConfigError(
                "--record_video needs imageio and imageio-ffmpeg: pip install -e '.[video]'"
            ) from error
        self.path = path
        self._writer = imageio.get_writer(path, fps=_VIDEO_FPS, macro_block_size=1)

    def capture(self) -> None:
        self._writer.append_data(self._frame())

    def close(self) -> None:
        self._writer.close()


def test(config: Config) -> list[float]:
    """Returns the episode returns; prints each one and a summary."""
    if not has_checkpoint(config.run_dir):
        raise ConfigError(
            f"no checkpoint at {os.path.join(config.run_dir, CHECKPOINT_NAME)}: train first,"
            " or pass the --savedir and --xpid of a run"
        )
    try:
        checkpoint, path, _ = load_latest_checkpoint(config.run_dir)
        trained = config_from_dict(checkpoint["config"])
    except (CheckpointError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot test {config.run_dir}: {error}") from error
    if hasattr(config, "test_epsilon"):  # the flag of this run's algorithm, if it has one
        trained = dataclasses.replace(trained, test_epsilon=config.test_epsilon)

    env = envs.make(trained.env, seed=config.seed, episodic_life=False)
    spec = envs.env_spec(env)
    algorithm = build_algorithm(trained, spec)
    model = build_checked_model(algorithm)
    model.load_state_dict(checkpoint["model_state_dict"])
    model.eval()
    torch.manual_seed(config.seed)
    policy = LocalPolicy(model, algorithm.policy(explore=False), num_envs=1)
    print(
        f"[beast] testing {trained.xpid} (step {checkpoint['step']:,}) on {trained.env}"
        f" for {config.num_test_episodes} episodes",
        flush=True,
    )

    returns: list[float] = []
    obs, _ = env.reset()
    video = (
        _VideoRecorder(env, os.path.join(config.run_dir, VIDEO_NAME))
        if config.record_video
        else None
    )
    if video is not None:
        video.capture()
    inputs = {
        **{key: torch.zeros((1, *f.shape), dtype=f.dtype) for key, f in spec.obs_fields().items()},
        "reward": torch.zeros(1),
        "done": torch.ones(1, dtype=torch.bool),
        "last_action": torch.from_numpy(np.zeros_like(policy.record["action"])),
    }
    with torch.no_grad():
        while len(returns) < config.num_test_episodes:
            for key, value in spec.split_obs(obs).items():
                inputs[key][0] = torch.from_numpy(np.asarray(value))
            drawn = policy.act(inputs)["action"][0]
            action = spec.clip_actions(drawn) if spec.continuous else int(drawn)
            obs, reward, terminated, truncated, info = env.step(action)
            inputs["last_action"][0] = torch.from_numpy(np.asarray(drawn))
            inputs["reward"][0] = reward
            inputs["done"][0] = terminated or truncated
            if video is not None:
                video.capture()
            if "episode" in info:
                returns.append(float(info["episode"]["r"]))
                if video is not None:
                    video.close()
                    print(f"[beast] wrote {video.path}", flush=True)
                    video = None
                print(
                    f"[beast] episode {len(returns)}/{config.num_test_episodes}: return"
                    f" {returns[-1]:.2f}, {int(info['episode']['l'])} steps",
                    flush=True,
                )
            if terminated or truncated:
                obs, _ = env.reset()
    env.close()
    summary = {
        "episodes": len(returns),
        "mean_return": statistics.fmean(returns),
        "median_return": statistics.median(returns),
        "returns": returns,
    }
    with open(os.path.join(config.run_dir, "test.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        f"[beast] mean return {summary['mean_return']:.2f}, median"
        f" {summary['median_return']:.2f} over {len(returns)} episodes",
        flush=True,
    )
    return returns
