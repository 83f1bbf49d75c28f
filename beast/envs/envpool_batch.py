"""The "envpool" env batch backend: EnvPool's C++ thread pool, for Atari and MuJoCo ids.

    pip install envpool        # or, in a beast checkout: pip install -e ".[envpool]"
    batch = make_env_batch("PongNoFrameskip-v4", 8, 0, False, backend="envpool")

EnvPool (sail-sg/envpool; Weng et al. 2022) steps the K envs of a batch in C++ worker
threads, one call per batch step; its Atari envs do the DeepMind preprocessing in C++
too. This module configures it to play the ids as `beast.envs.make` does and maps its
outputs onto the `EnvBatch` contract (beast/envs/batch.py).

Ids it runs (`envpool_supports`):
- Atari: the registered pixel Atari ids the "ale_vector" backend takes (`*NoFrameskip-v4`,
  `*-v4`, `ALE/*-v5`: `batch.atari_settings`), as EnvPool's task of the same game with
  frame skip 4, max-pool of the last two frames, the ALE's grayscale palette, INTER_AREA
  resize to 84x84, a 4-frame stack, 1..30 no-op starts, the id's sticky-action
  probability, action set and frame limit, no FIRE on reset, unclipped rewards, and
  EnvPool's own episodic life off (this module does beast's, below).
- MuJoCo: ids made by Gymnasium's v5 HalfCheetah, Hopper, Walker2d, Ant or Humanoid env
  with their default arguments (`MUJOCO_TASKS`), as EnvPool's v5 task of the same name,
  with the id's own time limit. EnvPool loads the same model files as Gymnasium's
  (comments aside) and computes the same observations, rewards and terminations:
  from one state, the same actions give the same trajectory up to rounding (1e-12 over
  40 steps, then the usual chaotic growth; tests/envs/test_envpool_batch.py).

EnvPool's auto-reset is "next step": the step after an episode ends resets that env,
ignores its action and returns its first observation with reward 0. On beast's contract:
- truncation: exactly beast's. The final observation comes with `truncated`, and the next
  step is the reset row (`done`, reward 0, the action ignored), counted in no episode.
- termination: EnvPool would return the terminal observation now and reset next step;
  this module resets those envs at once (one more call into the pool, for them alone),
  so the obs returned with `terminated` is the next episode's first, as beast's.

Atari, where it matches beast's loop and where it cannot:
- Frames: identical. With one no-op start (EnvPool cannot have none: `noop_max=0` crashes
  it), both backends play the same games pixel for pixel, game overs and resets included
  (tests/envs/test_envpool_batch.py). Both draw 1..noop_max no-ops.
- Seeds: env i is seeded with `first_seed + i` (mod 2**31 - 1) in both, through
  different generators: the same seed draws different no-op counts and sticky actions.
- Episodic life: as beast's. A lost life ends the agent's episode (`terminated`); the
  soft reset, one 4-frame no-op step whose reward counts in the game's return but not as
  an agent step, is played through EnvPool for those envs alone, and the stack restarts
  from its frame (older slots shown as copies of it, as beast's FrameStack does).
- Truncation: EnvPool counts the frame limit in agent steps from after the no-op start
  (ceil(frames / 4)); beast's ALE counts frames from before it, up to 30 frames (8 agent
  steps) earlier, and may cut the last step short. EnvPool sets its truncation flag
  whenever the step count is reached; a game over at that step is read from the ALE's
  and reported as a termination, as beast does.

MuJoCo, where it cannot match:
- Reset noise: the same distributions as Gymnasium's, from a different generator.
- A termination on the very step that reaches the time limit reads as a truncation:
  EnvPool then sets its truncation flag and says nothing else (beast's loop reports a
  termination). Rare: a Hopper must fall on its 1000th step.
"""

from __future__ import annotations

import functools
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

from beast.envs import factory
from beast.envs.batch_base import (
    DEFAULT_NATIVE_THREADS,
    AtariSettings,
    EnvBatch,
    EpisodeTotals,
    FrameStackAges,
    atari_settings,
    check_counts,
    folded_seeds,
    lost_a_life,
)
from beast.envs.spec import EnvError, env_spec

__all__ = [
    "ENVPOOL_INSTALL",
    "EnvPoolEnvBatch",
    "MUJOCO_TASKS",
    "envpool_support",
    "envpool_supports",
]

ENVPOOL_INSTALL = 'pip install envpool (in a beast checkout: pip install -e ".[envpool]")'

# Gymnasium MuJoCo envs that EnvPool has as a task of the same name and version, checked
# to step as Gymnasium's do (tests/envs/test_envpool_batch.py): entry point -> EnvPool task id.
MUJOCO_TASKS = {
    "gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv": "HalfCheetah-v5",
    "gymnasium.envs.mujoco.hopper_v5:HopperEnv": "Hopper-v5",
    "gymnasium.envs.mujoco.walker2d_v5:Walker2dEnv": "Walker2d-v5",
    "gymnasium.envs.mujoco.ant_v5:AntEnv": "Ant-v5",
    "gymnasium.envs.mujoco.humanoid_v5:HumanoidEnv": "Humanoid-v5",
}
# Step limit passed when an id has none: effectively unlimited, within EnvPool's C int.
_NO_STEP_LIMIT = 2**30


@dataclass(frozen=True)
class _Task:
    """An EnvPool task that plays a beast env id, and its settings for `envpool.make`."""

    task_id: str
    atari: bool
    settings: dict[str, Any] = field(default_factory=dict)


def _atari_task(settings: AtariSettings) -> _Task:
    # EnvPool names its Atari tasks after the ALE's ROM names: "ms_pacman" -> "MsPacman-v5".
    task_id = "".join(part.capitalize() for part in settings.game.split("_")) + "-v5"
    return _Task(
        task_id,
        atari=True,
        settings=dict(
            stack_num=factory.FRAME_STACK,
            frame_skip=factory.FRAME_SKIP,
            img_height=factory.SCREEN_SIZE,
            img_width=factory.SCREEN_SIZE,
            gray_scale=True,
            use_inter_area_resize=True,
            repeat_action_probability=settings.repeat_action_probability,
            full_action_space=settings.full_action_space,
            max_episode_steps=math.ceil(settings.max_num_frames_per_episode / factory.FRAME_SKIP),
            use_fire_reset=False,
            reward_clip=False,
            episodic_life=False,
            zero_discount_on_life_loss=False,
        ),
    )


def _task(env_name: str) -> _Task | str:
    """The EnvPool task that plays `env_name` as `make` does, or why there is none."""
    family = factory.env_family(env_name)
    if family == "atari":
        settings = atari_settings(env_name, "EnvPool")
        return settings if isinstance(settings, str) else _atari_task(settings)
    if family == "mujoco":
        spec = gymnasium.spec(env_name)
        task_id = MUJOCO_TASKS.get(spec.entry_point) if isinstance(spec.entry_point, str) else None
        if task_id is None:
            tasks = ", ".join(MUJOCO_TASKS.values())
            return f"'{env_name}' is not made as one of EnvPool's MuJoCo tasks ({tasks})"
        if spec.kwargs:
            return f"'{env_name}' sets {spec.kwargs}, which EnvPool's {task_id} does not take"
        return _Task(
            task_id,
            atari=False,
            settings=dict(max_episode_steps=spec.max_episode_steps or _NO_STEP_LIMIT),
        )
    return f"'{env_name}' is neither a registered Gymnasium Atari id nor one of its MuJoCo v5 ids"


def envpool_support(env_name: str) -> str | None:
    """None if the "envpool" backend can run `env_name` as `make` does; else a one-line
    message saying why not (and, when EnvPool cannot be imported, how to install it).

    Imports EnvPool (about 1.5 s, once per process) for the ids it would run."""
    task = _task(env_name)
    if isinstance(task, str):
        return f"the envpool env backend cannot run this env: {task}"
    envpool = _import_envpool()
    return envpool if isinstance(envpool, str) else None


def envpool_supports(env_name: str) -> bool:
    """Whether the "envpool" backend can run `env_name` (see the module docstring)."""
    return envpool_support(env_name) is None


@functools.cache
def _import_envpool() -> Any:
    """The envpool module, or the one-line message of why it cannot be imported."""
    try:
        import envpool
    except ImportError as err:
        return (
            f"the envpool env backend needs EnvPool, which cannot be imported ({err}):"
            f" {ENVPOOL_INSTALL}"
        )
    return envpool


class EnvPoolEnvBatch(EnvBatch):
    """K Atari or MuJoCo envs in one EnvPool, stepped synchronously by C++ worker threads.

    Args:
        env_name: an id `envpool_supports`.
        num_envs: K.
        first_seed: env i is seeded with `first_seed + i` (mod 2**31 - 1); None draws
            the first seed from the OS.
        episodic_life: Atari only; a lost life sets `done` and `terminated` (not
            `episode_end`); the game goes on after beast's soft reset.
        num_threads: C++ worker threads stepping the K envs.
        noop_max: Atari no-op starts draw 1..noop_max frames; None: beast's 30. At least
            1 (EnvPool crashes on 0).
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int,
        first_seed: int | None,
        episodic_life: bool,
        *,
        num_threads: int = DEFAULT_NATIVE_THREADS,
        noop_max: int | None = None,
    ) -> None:
        check_counts(num_envs, num_threads)
        noop_max = factory.NOOP_MAX if noop_max is None else noop_max
        if noop_max < 1:
            raise ValueError(f"EnvPool needs noop_max >= 1 (it crashes on 0), got {noop_max}")
        reason = envpool_support(env_name)
        if reason is not None:
            raise EnvError(reason)
        task = _task(env_name)
        assert isinstance(task, _Task)  # envpool_support said so
        if episodic_life and not task.atari:
            factory.refuse_episodic_life(env_name)
        envpool = _import_envpool()
        if first_seed is None:
            first_seed = secrets.randbits(31)
        seeds = folded_seeds(first_seed, num_envs)
        settings = dict(task.settings, noop_max=noop_max) if task.atari else task.settings
        try:
            self._pool: Any = envpool.make_gymnasium(
                task.task_id,
                num_envs=num_envs,
                batch_size=num_envs,  # synchronous: every step steps all K
                num_threads=num_threads,
                thread_affinity_offset=-1,  # no pinning: cores are shared with other actors
                seed=int(seeds[0]),
                env_seed=seeds.tolist(),
                **settings,
            )
        except Exception as err:  # another EnvPool release may lack a task or a setting
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise EnvError(
                f"EnvPool cannot make {task.task_id} for '{env_name}': {first_line}"
                f" (beast is checked against envpool 1.2.5)"
            ) from None
        try:
            self._allocate(env_name, num_envs, env_spec(self._pool))
            self._atari = task.atari
            self._episodic_life = episodic_life
            self._totals = EpisodeTotals(num_envs)
            self._env_ids = np.arange(num_envs, dtype=np.int32)
            if self._atari:
                self._lives = np.zeros(num_envs, dtype=np.int64)
                self._stacks = FrameStackAges(num_envs, self.obs_shape[0])
            self._reset(np.ones(num_envs, dtype=bool))
        except BaseException:
            self.close()
            raise

    def step(self, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        lives = info["lives"] if self._atari else None
        if self._atari:
            # The ALE's game over, not EnvPool's `terminated`, which is False whenever its
            # step limit is reached, even at a game over (beast reports a termination).
            terminated = info["terminated"].astype(bool)
            truncated = truncated & ~terminated
        # A synchronous pool answers in env order (measured); any other is put back in it.
        order = info["env_id"]
        if not np.array_equal(order, self._env_ids):
            by_env = np.argsort(order)
            obs, reward = obs[by_env], reward[by_env]
            terminated, truncated = terminated[by_env], truncated[by_env]
            if lives is not None:
                lives = lives[by_env]
        # Envs whose previous row was a truncated episode's final observation: EnvPool
        # reset them in this step (action ignored, reward 0), as beast's contract has it.
        restarted = self.truncated.copy()
        np.copyto(self.obs, obs, casting="same_kind")
        np.copyto(self.reward, reward)
        self._totals.count(self.reward, ~restarted)
        self._totals.finish(self, terminated | truncated)
        ended = terminated.copy()
        if self._atari:
            self._stacks.tick()
            self._stacks.restart(restarted)
            life_lost = lost_a_life(lives, self._lives, terminated | truncated)
            self._lives[:] = lives
            if self._episodic_life and life_lost.any():
                self._soft_reset(life_lost)
                ended |= life_lost
        if terminated.any():
            self._reset(terminated)
        np.copyto(self.terminated, ended)
        np.logical_or(ended, restarted, out=self.done)
        np.copyto(self.truncated, truncated)
        if self._atari:
            self._stacks.pad(self.obs)
        self._track_discounted_return()

    def _reset(self, rows: np.ndarray) -> None:
        """Start the next episode of the envs in `rows` (bool [K]) now: their rows of
        `obs` become its first observation (EnvPool fills a reset stack with copies of
        the first frame, as beast's FrameStack does)."""
        obs, info = self._pool.reset(np.flatnonzero(rows).astype(np.int32))
        order = info["env_id"]
        self.obs[order] = obs
        if self._atari:
            self._lives[order] = info["lives"]
            self._stacks.restart(rows)

    def _soft_reset(self, rows: np.ndarray) -> None:
        """beast's `EpisodicLife` soft reset of the envs in `rows` (bool [K]), which lost
        a life: one no-op agent step whose frame starts their next agent episode, whose
        reward counts in the game's return (not in `reward`) and which is not counted as
        an agent step. A game that ends in that no-op (by its frame limit; rare) restarts,
        its statistics unreported, as EpisodicLife's do."""
        ids = np.flatnonzero(rows).astype(np.int32)
        obs, reward, _, truncated, info = self._pool.step(np.zeros(len(ids), np.int32), ids)
        order = info["env_id"]
        self.obs[order] = obs
        score = np.zeros(self.num_envs, dtype=np.float64)
        score[order] = reward
        self._totals.count(score, 0)
        self._lives[order] = info["lives"]
        self._stacks.restart(rows)
        over = np.zeros(self.num_envs, dtype=bool)
        over[order] = info["terminated"].astype(bool) | truncated
        if over.any():
            self._totals.restart(over)
            self._reset(over)

    def close(self) -> None:
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.close()  # stops and joins EnvPool's worker threads
