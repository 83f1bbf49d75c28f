"""The `EnvBatch` contract (beast/envs/batch.py describes its arrays and auto-reset rules)
and the parts every backend builds on: episode totals, frame-stack padding, seeds, the
life-loss rule, and what a C++ Atari batch reads from a Gymnasium id.

Its own module so that the backends in beast/envs/batch.py and
beast/envs/envpool_batch.py build on it without importing each other.
"""

from __future__ import annotations

import abc
import inspect
import math
from dataclasses import dataclass
from typing import Any, Self

import gymnasium
import numpy as np
from ale_py.env import AtariEnv
from gymnasium.envs.registration import load_env_creator

from beast.envs import factory
from beast.envs.spec import EnvSpec
from beast.fields import numpy_dtype

__all__ = [
    "DEFAULT_NATIVE_THREADS",
    "AtariSettings",
    "EnvBatch",
    "EpisodeTotals",
    "FrameStackAges",
    "atari_settings",
    "check_counts",
    "folded_seeds",
    "lost_a_life",
]

# C++ worker threads per AtariVectorEnv or EnvPool. One: with one actor process per core,
# a second thread adds no core (AtariVectorEnv, 2 processes x 2 threads: 1.03x the loop's
# CPU time per step, the same as 1 thread). A second thread only pays for a lone process
# with an idle core, where it steps the K envs in parallel.
DEFAULT_NATIVE_THREADS = 1

# The ALE and EnvPool read seeds as C int; larger seeds are folded into range.
_SEED_MODULUS = 2**31 - 1
# Frame limit passed when an id sets none: effectively unlimited, and `limit + 1`
# (the ALE's initial step count) still fits a C int.
_NO_FRAME_LIMIT = 2**30
# AtariEnv keyword arguments whose values the C++ Atari batches (ale_vector, envpool) can
# reproduce: each name maps to the values allowed (None: any value).
_SUPPORTED_ATARI_KWARGS: dict[str, tuple[Any, ...] | None] = {
    "game": None,
    "obs_type": ("rgb", "grayscale"),  # beast reads the ALE's grayscale screen for both
    "frameskip": None,  # beast replaces it with its own skip of 4
    "repeat_action_probability": None,
    "full_action_space": None,
    "max_num_frames_per_episode": None,
    "mode": (None,),
    "difficulty": (None,),
    "continuous": (False,),
    "continuous_action_threshold": None,  # only read by continuous action spaces
    "render_mode": (None,),
    "sound_obs": (False,),
}


class EnvBatch(abc.ABC):
    """K environments and their latest outputs as batched numpy arrays (see module doc).

    Attributes:
        env_name: the name the batch was made from, for error messages.
        num_envs: K.
        spec: observation leaves and action space of each env.
        obs_shape: `spec.obs_shape`, one Box observation without the batch axis (None for
            a Dict or Tuple observation).
        obs_arrays, obs, reward, done, terminated, truncated, episode_end, episode_return,
            episode_step, discounted_return: the arrays of the module docstring,
            overwritten in place by every `step`.
    """

    env_name: str
    num_envs: int
    spec: EnvSpec
    obs_shape: tuple[int, ...] | None
    obs_arrays: dict[str, np.ndarray]
    obs: np.ndarray | None
    reward: np.ndarray
    done: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_end: np.ndarray
    episode_return: np.ndarray
    episode_step: np.ndarray
    discounted_return: np.ndarray
    return_discount: float | None = None

    def _allocate(self, env_name: str, num_envs: int, spec: EnvSpec) -> None:
        """Create the output arrays; `done` starts True: the first obs starts an episode."""
        self.env_name = env_name
        self.num_envs = num_envs
        self.spec = spec
        self.obs_shape = spec.obs_shape
        self.obs_arrays = {
            key: np.zeros((num_envs, *f.shape), dtype=numpy_dtype(f.dtype))
            for key, f in spec.obs_fields().items()
        }
        self.obs = self.obs_arrays.get("obs")
        self.reward = np.zeros(num_envs, dtype=np.float32)
        self.done = np.ones(num_envs, dtype=bool)
        self.terminated = np.zeros(num_envs, dtype=bool)
        self.truncated = np.zeros(num_envs, dtype=bool)
        self.episode_end = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float32)
        self.episode_step = np.zeros(num_envs, dtype=np.int32)
        self.discounted_return = np.zeros(num_envs, dtype=np.float32)
        # Whether each env's next row continues the episode of its current one.
        self._continues = np.zeros(num_envs, dtype=bool)

    def _track_discounted_return(self) -> None:
        """After a step: G = reward + gamma * G where the row continues the previous
        one's episode (not after a termination, a truncation's final row, or a reset)."""
        if self.return_discount is None:
            return
        G = self.discounted_return
        # A reward so large that the return overflows float32 becomes inf here, quietly:
        # the learner's non-finite guard stops the run on it in one line, which a NumPy
        # warning from the actor would only precede.
        with np.errstate(over="ignore", invalid="ignore"):
            G *= self.return_discount * self._continues
            G += self.reward
        np.logical_not(self.terminated | self.truncated, out=self._continues)

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> None:
        """Step all K envs with `actions` (int [K], 0..num_actions-1; or float [K, d] for a
        continuous action space, clipped to its bounds); update the arrays."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the envs (and threads); idempotent."""

    def _actions(self, actions: np.ndarray) -> np.ndarray:
        """`actions` as int64 [K], or for a continuous action space as float32 [K, d]
        clipped to the space's bounds (policies store the action they drew, the env gets
        the clipped one); a time-major [1, K, ...] array is accepted too."""
        actions = np.asarray(actions)
        spec = self.spec
        if spec.continuous:
            shape = (self.num_envs, *spec.action_shape)
            if actions.size != math.prod(shape) or actions.dtype.kind != "f":
                raise ValueError(
                    f"expected {self.num_envs} float action vectors of shape"
                    f" {spec.action_shape} for {self.env_name}, got an array of shape"
                    f" {actions.shape} and dtype {actions.dtype}"
                )
            actions = actions.reshape(shape)
            if not np.isfinite(actions).all():
                raise ValueError(f"non-finite actions for {self.env_name}: {actions.tolist()}")
            return spec.clip_actions(actions)
        if actions.size != self.num_envs or actions.dtype.kind not in "iu":
            raise ValueError(
                f"expected {self.num_envs} integer actions for {self.env_name}, "
                f"got an array of shape {actions.shape} and dtype {actions.dtype}"
            )
        # The C++ backends index their action sets with it unchecked: the ALE vector env's
        # worker skips a bad action and never answers (a hang), EnvPool's reads past the
        # end. Refused here, for every backend alike.
        if actions.min() < 0 or actions.max() >= spec.num_actions:
            raise ValueError(
                f"actions for {self.env_name} must be in 0..{spec.num_actions - 1}, "
                f"got {actions.reshape(-1).tolist()}"
            )
        return actions.reshape(self.num_envs).astype(np.int64, copy=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EpisodeTotals:
    """Each env's running return and length of its current real episode, for the backends
    whose envs do not report them (what `EpisodeStatistics` does in `make`'s stack).

    Returns are summed in float64, so a long game's sum of small rewards is exact, as in
    EpisodeStatistics' Python float.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def count(self, reward: np.ndarray, steps: np.ndarray | int = 1) -> None:
        """Add a step's rewards [K] and its agent steps (1, or int/bool [K] per env)."""
        self.returns += reward
        self.lengths += steps

    def finish(self, batch: EnvBatch, ended: np.ndarray) -> None:
        """Report the episodes that `ended` (bool [K]) in the batch's `episode_end`,
        `episode_return` and `episode_step`, and restart their totals."""
        np.copyto(batch.episode_end, ended)
        if ended.any():
            batch.episode_return[ended] = self.returns[ended]
            batch.episode_step[ended] = self.lengths[ended]
            self.restart(ended)

    def restart(self, rows: np.ndarray) -> None:
        """Start new totals for `rows` (bool [K]) without reporting the old ones."""
        self.returns[rows] = 0.0
        self.lengths[rows] = 0


class FrameStackAges:
    """Steps since each env's frame stack (re)started, for the C++ backends whose stacks
    hold older frames there: beast's `FrameStack` holds copies of the first frame after a
    reset (and after `EpisodicLife`'s soft reset), which `pad` writes over them.

    At age a the newest a + 1 frames of a stack are this episode's; the older slots
    become copies of the oldest of those. Ages start at 0: every stack has just started.
    """

    def __init__(self, num_envs: int, num_frames: int) -> None:
        self.ages = np.zeros(num_envs, dtype=np.int64)
        self._last = num_frames - 1

    def tick(self) -> None:
        self.ages += 1

    def restart(self, rows: np.ndarray) -> None:
        """The stacks of `rows` (bool [K]) start again from their newest frame."""
        self.ages[rows] = 0

    def pad(self, obs: np.ndarray, skip: np.ndarray | None = None) -> None:
        """Overwrite the slots of `obs` [K, num_frames, H, W] older than each stack's age
        with its oldest frame of this episode; rows in `skip` (bool [K]) are left as
        they are."""
        young = self.ages < self._last
        if skip is not None:
            young &= ~skip
        for i in np.flatnonzero(young).tolist():
            first = self._last - int(self.ages[i])
            obs[i, :first] = obs[i, first]


def check_counts(num_envs: int, num_threads: int = 1) -> None:
    """Refuse a batch of no envs, or a C++ backend with no worker thread (ValueError)."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")


def folded_seeds(first_seed: int | None, num_envs: int) -> np.ndarray | None:
    """Env i's seed `first_seed + i`, folded into the C int range the ALE and EnvPool
    read (int64 [K]); None for None."""
    if first_seed is None:
        return None
    return (first_seed + np.arange(num_envs, dtype=np.int64)) % _SEED_MODULUS


def lost_a_life(lives: np.ndarray, previous: np.ndarray, game_over: np.ndarray) -> np.ndarray:
    """beast's `EpisodicLife` rule, per env (int [K], int [K], bool [K] -> bool [K]): the
    lives went down, some are left, and the game is not over."""
    return ~game_over & (lives > 0) & (lives < previous)


@dataclass(frozen=True)
class AtariSettings:
    """What a C++ Atari batch (ale-py's AtariVectorEnv, EnvPool) needs from a Gymnasium
    Atari id to play it as `make` does, read from its registration.

    Attributes:
        game: the ALE's ROM name ("pong").
        repeat_action_probability: sticky actions, per frame (0.25 for v5 ids).
        full_action_space: all 18 actions rather than the game's minimal set.
        max_num_frames_per_episode: the tighter of the id's frame limit and its
            TimeLimit (in agent steps of FRAME_SKIP frames), in frames.
    """

    game: str
    repeat_action_probability: float
    full_action_space: bool
    max_num_frames_per_episode: int


def atari_settings(env_name: str, batch: str) -> AtariSettings | str:
    """The id's `AtariSettings`, or why `batch` (named in the reason) cannot reproduce
    `make` for it: an id that is not a pixel Atari id made by ale_py's `AtariEnv` itself
    with a game mode, difficulty or option a C++ batch does not take."""
    if ":" in env_name or factory.env_family(env_name) != "atari":
        return f"'{env_name}' is not a registered Gymnasium Atari id with pixel observations"
    spec = gymnasium.spec(env_name)
    entry_point = spec.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    if creator is not AtariEnv:  # a subclass may change what a step does
        return f"'{env_name}' is made by {creator!r}, not ale_py's AtariEnv itself"
    defaults = {
        name: param.default
        for name, param in inspect.signature(AtariEnv.__init__).parameters.items()
        if param.default is not inspect.Parameter.empty
    }
    kwargs = {**defaults, **spec.kwargs}
    for name, value in kwargs.items():
        if name not in _SUPPORTED_ATARI_KWARGS:
            return f"'{env_name}' sets {name}={value!r}, which {batch} does not take"
        allowed = _SUPPORTED_ATARI_KWARGS[name]
        if allowed is not None and value not in allowed:
            return f"'{env_name}' sets {name}={value!r}, which {batch} cannot reproduce"
    # The id's frame limit, and its TimeLimit (agent steps of FRAME_SKIP frames) if any:
    # `make` applies both, so the tighter one ends the game.
    limits = [kwargs["max_num_frames_per_episode"]]
    if spec.max_episode_steps is not None:
        limits.append(spec.max_episode_steps * factory.FRAME_SKIP)
    limits = [int(limit) for limit in limits if limit is not None and limit > 0]
    return AtariSettings(
        game=kwargs["game"],
        repeat_action_probability=float(kwargs["repeat_action_probability"]),
        full_action_space=bool(kwargs["full_action_space"]),
        max_num_frames_per_episode=min(limits, default=_NO_FRAME_LIMIT),
    )
