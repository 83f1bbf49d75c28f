"""`--mode test`: run a saved policy for N episodes and report its returns.

The checkpoint's own flags decide the environment, the algorithm and the
network, so `--mode test --xpid RUN` evaluates RUN as it was trained, whatever
the other defaults are now. `--checkpoint best` loads RUN_DIR/model_best.tar, the
weights with the best evaluation return of a run trained with --eval_interval,
instead of the latest model.tar. It acts with the algorithm's evaluation policy
(`Algorithm.acting_rule(explore=False)`), deterministic but for the Q-networks' epsilon:
an actor-critic takes its most probable action (discrete) or its mean action
(continuous), SAC, TD3 and DDPG the squashed mean action, and a Q-network the
greedy action, replaced by a random one with probability `--test_epsilon` (0.001 by
default, the R2D2 and Ape-X evaluation epsilon) so that it cannot stall an episode
forever. `play_episodes` is the episode loop, shared with the evaluator that runs
during training (beast/run/evaluator.py).
`--record_video` writes the first episode as an mp4 with imageio-ffmpeg,
which bundles its own ffmpeg (no system package): Atari frames come straight
from the emulator's RGB screen, other envs need to render `rgb_array` frames.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch

from beast import envs
from beast.acting.inference import LocalInference
from beast.algos.build import build_algorithm, build_checked_model, config_from_dict
from beast.config import Config, ConfigError
from beast.outputs.checkpoint import (
    BEST_CHECKPOINT_NAME,
    CHECKPOINT_NAME,
    CheckpointError,
    has_checkpoint,
    load_checkpoint,
    load_latest_checkpoint,
)

__all__ = ["EvalResult", "Episode", "VIDEO_NAME", "play_episodes", "test"]

VIDEO_NAME = "episode.mp4"
# An agent step is 4 emulator frames at 60 Hz for Atari: 15 agent steps a second.
_VIDEO_FPS = 15


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """What `test` measured: one entry per episode, in the order they ended."""

    run_dir: str
    step: int  # agent steps the evaluated checkpoint had trained for
    returns: list[float]  # undiscounted, unclipped episode returns
    lengths: list[int]  # agent steps per episode

    @property
    def mean_return(self) -> float:
        return statistics.fmean(self.returns)

    @property
    def median_return(self) -> float:
        return statistics.median(self.returns)


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


@dataclass(frozen=True)
class Episode:
    """A finished episode: its raw undiscounted return and its length in agent steps."""

    ret: float
    length: int


def play_episodes(
    env: gymnasium.Env,
    spec: envs.EnvSpec,
    policy: LocalInference,
    num_episodes: int,
    *,
    seed: int | None = None,
    on_step: Callable[[], None] | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Play `num_episodes` whole episodes of `env` (one env, made by `beast.envs.make`)
    with `policy` (a LocalInference over one env), one after the other; --mode test and the
    evaluator (beast/run/evaluator.py) both play through here.

    The env is reset first, with `seed` if given (the same seed gives the same episodes
    to the same deterministic policy). A recurrent policy carries its state through each
    episode and starts the next from the initial state (`done` resets it in the model).
    `on_step` is called after that first reset and after every env step (a video grabs
    the frame), `on_episode` with each finished episode.
    """
    episodes: list[Episode] = []
    obs, _ = env.reset(seed=seed)
    if on_step is not None:
        on_step()
    inputs = {
        **{key: torch.zeros((1, *f.shape), dtype=f.dtype) for key, f in spec.obs_fields().items()},
        "reward": torch.zeros(1),
        "done": torch.ones(1, dtype=torch.bool),
        "last_action": torch.from_numpy(np.zeros_like(policy.record["action"])),
    }
    with torch.no_grad():
        while len(episodes) < num_episodes:
            for key, value in spec.split_obs(obs).items():
                inputs[key][0] = torch.from_numpy(np.asarray(value))
            drawn = policy.act(inputs)["action"][0]
            action = spec.clip_actions(drawn) if spec.continuous else int(drawn)
            obs, reward, terminated, truncated, info = env.step(action)
            inputs["last_action"][0] = torch.from_numpy(np.asarray(drawn))
            inputs["reward"][0] = reward
            inputs["done"][0] = terminated or truncated
            if on_step is not None:
                on_step()
            if "episode" in info:
                episodes.append(Episode(float(info["episode"]["r"]), int(info["episode"]["l"])))
                if on_episode is not None:
                    on_episode(episodes[-1])
            if terminated or truncated:
                obs, _ = env.reset()
    return episodes


def load_test_checkpoint(config: Config) -> tuple[dict[str, Any], str]:
    """The checkpoint --checkpoint names in the run directory, and its path; a one-line
    ConfigError when it is missing or unreadable."""
    if config.checkpoint == "best":
        path = os.path.join(config.run_dir, BEST_CHECKPOINT_NAME)
        if not os.path.isfile(path):
            raise ConfigError(
                f"no best checkpoint at {path}: it is kept by runs trained with"
                " --eval_interval > 0; use --checkpoint latest"
            )
        try:
            return load_checkpoint(path), path
        except CheckpointError as error:
            raise ConfigError(
                f"cannot test {config.run_dir}: {error}; restore the file from a copy, or use"
                " --checkpoint latest"
            ) from error
    if not has_checkpoint(config.run_dir):
        raise ConfigError(
            f"no checkpoint at {os.path.join(config.run_dir, CHECKPOINT_NAME)}: train first,"
            " or pass the --savedir and --xpid of a run"
        )
    try:
        checkpoint, path, _ = load_latest_checkpoint(config.run_dir)
    except CheckpointError as error:
        raise ConfigError(
            f"cannot test {config.run_dir}: {error}; restore the file from a copy, or train"
            " the run again"
        ) from error
    return checkpoint, path


def test(config: Config) -> EvalResult:
    """Play the run's checkpoint (--checkpoint latest or best); prints each episode's return
    and a summary, writes test.json, and returns the episodes' returns and lengths."""
    checkpoint, path = load_test_checkpoint(config)
    try:
        trained = config_from_dict(checkpoint["config"])
    except (KeyError, TypeError) as error:
        raise ConfigError(f"cannot test {path}: {error}") from error
    if hasattr(config, "test_epsilon"):  # the flag of this run's algorithm, if it has one
        trained = dataclasses.replace(trained, test_epsilon=config.test_epsilon)

    env = envs.make(trained.env, seed=config.seed, episodic_life=False)
    spec = envs.env_spec(env)
    algorithm = build_algorithm(trained, spec)
    model = build_checked_model(algorithm)
    model.load_state_dict(checkpoint["model_state_dict"])
    model.eval()
    torch.manual_seed(config.seed)
    policy = LocalInference(model, algorithm.acting_rule(explore=False), num_envs=1)
    print(
        f"[beast] testing {trained.xpid} ({os.path.basename(path)}, step"
        f" {checkpoint['step']:,}) on {trained.env} for {config.num_test_episodes} episodes",
        flush=True,
    )

    video = (
        _VideoRecorder(env, os.path.join(config.run_dir, VIDEO_NAME))
        if config.record_video
        else None
    )

    def capture() -> None:
        if video is not None:
            video.capture()

    finished: list[Episode] = []

    def report(episode: Episode) -> None:
        nonlocal video
        finished.append(episode)
        if video is not None:
            video.close()
            print(f"[beast] wrote {video.path}", flush=True)
            video = None
        print(
            f"[beast] episode {len(finished)}/{config.num_test_episodes}: return"
            f" {episode.ret:.2f}, {episode.length} steps",
            flush=True,
        )

    episodes = play_episodes(
        env, spec, policy, config.num_test_episodes, on_step=capture, on_episode=report
    )
    env.close()
    returns = [episode.ret for episode in episodes]
    result = EvalResult(
        config.run_dir, int(checkpoint["step"]), returns, [e.length for e in episodes]
    )
    summary = {
        "episodes": len(returns),
        "mean_return": result.mean_return,
        "median_return": result.median_return,
        "returns": returns,
    }
    with open(os.path.join(config.run_dir, "test.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        f"[beast] mean return {summary['mean_return']:.2f}, median"
        f" {summary['median_return']:.2f} over {len(returns)} episodes",
        flush=True,
    )
    return result
