"""K environments stepped as one batch: what an actor steps, as batched numpy arrays.

    batch = make_env_batch("PongNoFrameskip-v4", num_envs=8, first_seed=0, episodic_life=False)
    batch.step(actions)        # int [K]; then read batch.obs, batch.reward, batch.done, ...
    batch.close()

Every backend exposes the same arrays, updated in place by `step` (actors keep
`torch.from_numpy` views of them, so they are never reallocated):

    obs             [K, *obs_shape]  obs_dtype (uint8 [K, 4, 84, 84] for Atari); None for
                                     a Dict or Tuple observation, whose leaves are in:
    obs_arrays      {field: [K, ...]} one array per observation leaf, by its field name
                                     (beast/fields.py): {"obs": obs} for a Box;
                                     {"obs.image": uint8 [K, 1, 16, 16], "obs.position":
                                     float32 [K, 2]} for DictGridTarget-v0
    reward          [K] float32      the step's raw reward (losses clip it)
    done            [K] bool         obs starts a new episode (recurrent state resets here);
                                     True for all K before the first step
    terminated      [K] bool         the step ended the agent's episode in a terminal state
                                     (a lost life too, with episodic life): nothing bootstraps
                                     across it; obs is already the next episode's first
    truncated       [K] bool         the step hit a time limit: obs is the episode's FINAL
                                     observation, which targets bootstrap from
    episode_end     [K] bool         the step ended a real episode (game over or truncation)
    episode_return  [K] float32      that episode's raw undiscounted return; kept until the
                                     next real episode end of the same env
    episode_step    [K] int32        that episode's length in agent steps; kept likewise
    discounted_return [K] float32    with `return_discount` gamma: each env's running
                                     G_t = reward_t + gamma * G_{t-1}, restarted after an
                                     episode end (--normalize_reward's statistic,
                                     beast/algos/normalize.py); zeros without

Auto-reset differs by how an episode ends, so that every target can do the right thing
at each end:

- termination, same step: the `obs` returned with `terminated=True` (and `done=True`) is
  already the first observation of the next episode; `reward` is the step's own. A
  terminal state has value 0, so its observation is not needed.
- truncation (a time limit), next step: the step returns the episode's final
  observation with `truncated=True` and `done=False`, so that V(final obs) or Q(final obs)
  is there to bootstrap from (bootstrapping from 0 would treat a time limit as a terminal
  state; from the reset observation, as the next episode's value). The following `step`
  ignores that env's action (no action is taken from a final observation), resets it and
  returns the first observation with `done=True`, `reward=0` and neither flag. Targets
  therefore skip the transition out of a truncated row (see beast/algos).

A truncation costs one extra row, counted as an agent step like any other.

Backends (`make_env_batch(..., backend=)`):

    "loop"        K envs from `beast.envs.make`, stepped one after the other in Python.
                  Any env beast supports.
    "ale_vector"  ale-py's `AtariVectorEnv`: the K Atari games and their DeepMind
                  preprocessing run in C++ worker threads, one call per batch step.
                  Registered pixel Atari ids only (see `ale_vector_supports`).
    "envpool"     EnvPool's C++ thread pool (`pip install envpool`): Atari ids as
                  "ale_vector" takes them, and the MuJoCo v5 locomotion tasks
                  (beast/envs/envpool_batch.py: how it matches "loop" and where not;
                  its Atari frames are identical, episodic life included).
    "auto"        `resolve_backend`: "envpool" for MuJoCo batches of 8 envs or more
                  when it is installed (`AUTO_ENVPOOL_MIN_ENVS`: faster per CPU-second
                  there; slower at fewer envs and on Atari), "ale_vector" where it is
                  supported if `AUTO_PREFERS_ALE_VECTOR` (off: it measured no faster
                  than "loop"), else "loop".

How "ale_vector" matches `beast.envs.atari` (frame skip 4 with max-pool of the last two
frames, ALE grayscale palette, INTER_AREA resize to 84x84, 4-frame stack, unclipped
rewards, the id's action set, sticky-action probability and frame limit, no FIRE on
reset, as beast's loop does none), and where it cannot:

- No-op starts: the ALE draws 0..noop_max-1 no-op frames, beast 1..noop_max; both give
  30 distinct starts, shifted by one frame.
- Seeds: both seed env i with `first_seed + i`, but through different generators, so
  the same seed does not give the same no-op count or sticky-action draws. With no-op
  starts and sticky actions off, both backends play identical frames
  (tests/envs/test_env_batch.py compares them pixel for pixel).
- Frame stack after a reset: the ALE pads with zero frames; this module overwrites the
  padding with copies of the first frame, as beast's `FrameStack` does, for the three
  steps the padding lasts. After a lost life (episodic life) the stack is refilled with
  copies of the current frame, as beast's soft reset does.
- Episodic life: beast's soft reset plays one 4-frame no-op after a lost life and
  returns its frame; the ALE batch cannot step one env alone, so here the obs returned
  with the life-loss `done` is the frame where the life was lost and the next agent
  action follows it directly. Life loss is decided as beast decides it (lives went down,
  some are left, the game is not over); the ALE's own `episodic_life` option is not
  used, because it restarts the whole game at every lost life.
- Truncation: both cut a game at the id's `max_num_frames_per_episode` (108000 frames);
  the ALE counts from after the no-op start, beast's ALE from before it (up to 30
  frames, i.e. 8 agent steps, later here). The ALE resets a truncated game in the same
  step (its `final_obs` info gives the final observation, returned here with
  `truncated=True`; its newest frame differed from the loop's in 29-41 of 7,056 pixels
  when measured, as if not max-pooled) and cannot hold one env back, so the row after a
  truncation is the new game one step in: the action chosen at the final observation
  was played there.
"""

from __future__ import annotations

import math
from typing import Any, Literal

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
from beast.envs.factory import make
from beast.envs.spec import EnvError, EnvSpec, env_spec

try:  # ale-py >= 0.11 ships the C++ vector env; older releases fall back to "loop"
    from ale_py.vector_env import AtariVectorEnv
except ImportError:  # pragma: no cover - depends on the installed ale-py
    AtariVectorEnv = None

__all__ = [
    "AUTO_PREFERS_ALE_VECTOR",
    "AUTO_ENVPOOL_MIN_ENVS",
    "AleVectorEnvBatch",
    "Backend",
    "BACKENDS",
    "DEFAULT_NATIVE_THREADS",
    "AtariSettings",
    "EpisodeTotals",
    "FrameStackAges",
    "atari_settings",
    "folded_seeds",
    "lost_a_life",
    "check_backend",
    "check_counts",
    "resolve_backend",
    "EnvBatch",
    "LoopEnvBatch",
    "ale_vector_supports",
    "make_env_batch",
]

Backend = Literal["auto", "loop", "ale_vector", "envpool"]
# Every value of `Backend`, for flags and messages.
BACKENDS: tuple[str, ...] = ("auto", "loop", "ale_vector", "envpool")

# Whether backend="auto" picks "ale_vector" for the Atari ids it supports: no, because it
# was not faster. `python -m benchmarks.env_batch --repeats 7 --seconds 3 --warmup 1
# --paired_rounds 40` (PongNoFrameskip-v4, K=8 envs per process, random actions, 2-core
# shared EPYC at load average 9-20, see benchmarks/RESULTS.md): CPU time per agent step,
# ale_vector / loop, 1.01 (1 process, 1 thread), 0.98 (2 processes, 1 thread each), 1.03
# (2 processes, 2 threads each); one process alternating 40 rounds between the two
# backends: 0.99 (2,801 vs 2,797 steps per CPU-second). Most of a step is the emulator
# (~255 us of ~330 us, timed alone), the same C++ in both; the Python the vector env
# saves is evidently matched by its own per-step costs (not profiled further). Wall-clock
# steps/s at that load swung 0.4-13x from run to run and decides nothing. Being no
# faster, it loses on fidelity: its no-op starts are one frame off and its episodic life
# has no soft-reset no-op (module docstring). Re-measure on a quiet machine before
# turning this on.
AUTO_PREFERS_ALE_VECTOR = False

# backend="auto" picks "envpool" for these env families (`factory.env_family`) from this
# many envs per batch, where EnvPool is installed and runs the id: where it measured
# faster per CPU-second than "loop", with the same preprocessing (benchmarks/RESULTS.md,
# "EnvPool"; docs/envs.md). MuJoCo, HalfCheetah-v5, envpool / loop steps per CPU-second
# on a shared 2-core EPYC (two runs; medians of repeats and paired rounds): 0.45 at K=1
# and 0.78-0.88 at K=4 (a thread hand-off per batch step outweighs the Python it saves),
# 1.03-1.11 at K=8, 1.21-1.40 at K=16, 1.25-1.32 at K=32. Not Atari: Pong 0.69 at K=1,
# 0.85-0.91 at K=8 and 16 (EnvPool's ALE build emulates more slowly than ale-py's; the
# frames are the same).
AUTO_ENVPOOL_MIN_ENVS: dict[str, int] = {"mujoco": 8}


class LoopEnvBatch(EnvBatch):
    """K envs from `beast.envs.make` stepped in a Python for-loop, with per-step checks.

    Env i is made with `seed=first_seed + i`. Observations of the wrong shape and
    non-finite rewards are refused with the env's name, since custom envs may return
    anything. Each env's episode statistics come from the `info["episode"]` that `make`'s
    wrappers put on the step that ends a real episode.
    """

    def __init__(
        self, env_name: str, num_envs: int, first_seed: int | None, episodic_life: bool
    ) -> None:
        check_counts(num_envs)
        self.envs: list[gymnasium.Env] = []
        try:
            for i in range(num_envs):
                seed = None if first_seed is None else first_seed + i
                self.envs.append(make(env_name, seed=seed, episodic_life=episodic_life))
            self._allocate(env_name, num_envs, env_spec(self.envs[0]))
            # Env i's row of each observation leaf, as one view object (0-d for a scalar
            # leaf): a frame stack that keeps its stack in it (Atari) returns this very
            # object, which then needs no copy.
            self._obs_rows = {
                key: [array[i, ...] for i in range(num_envs)]
                for key, array in self.obs_arrays.items()
            }
            self._box_rows = self._obs_rows.get("obs")  # None for a Dict or Tuple
            if not self.spec.nested:
                for env, row in zip(self.envs, self._obs_rows["obs"], strict=True):
                    try:
                        stack_into = env.get_wrapper_attr("stack_into")
                    except AttributeError:
                        continue
                    stack_into(row)
            for i, env in enumerate(self.envs):
                self._store_obs(i, env.reset()[0], "reset")
        except BaseException:
            self.close()
            raise

    def step(self, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        # Python ints for Discrete envs (as gymnasium's own vector envs pass them).
        actions = list(actions) if self.spec.continuous else actions.tolist()
        self.episode_end[:] = False
        for i, env in enumerate(self.envs):
            if self.truncated[i]:
                # The previous step returned a truncated episode's final observation: no
                # action is taken from it; the env starts its next episode.
                obs, _ = env.reset()
                self._store_obs(i, obs, "reset")
                self.reward[i] = 0.0
                self.done[i], self.terminated[i], self.truncated[i] = True, False, False
                continue
            obs, reward, terminated, truncated, info = env.step(actions[i])
            if not math.isfinite(reward):
                raise ValueError(f"env {self.env_name} returned a non-finite reward {reward}")
            if "episode" in info:
                self.episode_end[i] = True
                self.episode_return[i] = info["episode"]["r"]
                self.episode_step[i] = info["episode"]["l"]
            if terminated:
                obs, _ = env.reset()
            self._store_obs(i, obs, "step")
            self.reward[i] = reward
            self.done[i] = terminated
            self.terminated[i] = terminated
            self.truncated[i] = truncated and not terminated
        self._track_discounted_return()

    def _store_obs(self, i: int, obs: Any, call: str) -> None:
        if self._box_rows is not None:
            self._store_leaf(self._box_rows[i], obs, "obs", call)
            return
        for key, value in self.spec.split_obs(obs).items():
            self._store_leaf(self._obs_rows[key][i], value, key, call)

    def _store_leaf(self, row: np.ndarray, value: Any, key: str, call: str) -> None:
        """An observation leaf's value into its env's row (a float leaf cast to float32)."""
        if value is row:  # the env stacked it in place
            return
        shape = np.shape(value)
        if shape != row.shape:
            what = "an observation" if key == "obs" else f"an observation leaf {key}"
            raise ValueError(
                f"env {self.env_name} returned {what} of shape {shape} from {call}(),"
                f" but its observation_space has shape {row.shape}"
            )
        row[...] = value

    def close(self) -> None:
        envs, self.envs = self.envs, []
        for env in envs:
            env.close()


def _ale_vector_config(env_name: str) -> AtariSettings | str:
    """The id's settings for `AtariVectorEnv`, or a reason it cannot reproduce `make`."""
    if AtariVectorEnv is None:
        return "the installed ale-py has no AtariVectorEnv (needs ale-py >= 0.11)"
    return atari_settings(env_name, "AtariVectorEnv")


def ale_vector_supports(env_name: str) -> bool:
    """Whether the "ale_vector" backend can run `env_name` the way `make` preprocesses it.

    True for registered Gymnasium ids made by ale_py's `AtariEnv` with pixel
    observations and default game mode and difficulty (every `*NoFrameskip-v4`, `*-v4`
    and `ALE/*-v5` id), when the installed ale-py has `AtariVectorEnv`.
    """
    return isinstance(_ale_vector_config(env_name), AtariSettings)


class AleVectorEnvBatch(EnvBatch):
    """K Atari games in ale-py's `AtariVectorEnv`: C++ worker threads, DeepMind preprocessing.

    The vector env runs synchronously (every step steps all K) in same-step autoreset
    mode, with no reward clipping, no FIRE on reset and none of the ALE's own life-loss
    handling; episode statistics, life loss and the frame-stack padding are done here in
    numpy (see the module docstring for how this matches and differs from "loop").

    Args:
        env_name: a registered Atari id (`ale_vector_supports(env_name)`).
        num_envs: K.
        first_seed: env i is seeded with `first_seed + i` (mod 2**31 - 1); None draws
            seeds from the OS.
        episodic_life: a lost life sets `done` (not `episode_end`); the game goes on.
        num_threads: C++ worker threads stepping the K games.
        noop_max: no-op starts draw 0..noop_max-1 frames; 0 turns them off (tests use
            this to compare backends frame for frame).
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
        config = _ale_vector_config(env_name)
        if isinstance(config, str):
            raise EnvError(f"the ale_vector env backend cannot run this env: {config}")
        self._vector_env: Any = AtariVectorEnv(
            config.game,
            num_envs,
            num_threads=num_threads,
            thread_affinity_offset=-1,  # no pinning: cores are shared with other actors
            max_num_frames_per_episode=config.max_num_frames_per_episode,
            repeat_action_probability=config.repeat_action_probability,
            full_action_space=config.full_action_space,
            autoreset_mode="SameStep",
            img_height=factory.SCREEN_SIZE,
            img_width=factory.SCREEN_SIZE,
            grayscale=True,
            stack_num=factory.FRAME_STACK,
            frameskip=factory.FRAME_SKIP,
            maxpool=True,
            noop_max=factory.NOOP_MAX if noop_max is None else noop_max,
            episodic_life=False,
            life_loss_info=False,
            reward_clipping=False,
            use_fire_reset=False,
        )
        self._num_actions = int(self._vector_env.single_action_space.n)
        spec = EnvSpec(
            obs_shape=tuple(int(d) for d in self._vector_env.single_observation_space.shape),
            obs_dtype=np.dtype(np.uint8),
            num_actions=self._num_actions,
        )
        self._allocate(env_name, num_envs, spec)
        self._episodic_life = episodic_life
        self._totals = EpisodeTotals(num_envs)
        # Frames older than a stack's age are the ALE's zero padding (or, after a lost
        # life, the previous life's frames).
        self._stacks = FrameStackAges(num_envs, spec.obs_shape[0])

        obs, info = self._vector_env.reset(seed=folded_seeds(first_seed, num_envs))
        if obs.shape != self.obs.shape:
            self.close()
            raise EnvError(
                f"AtariVectorEnv returned observations of shape {obs.shape} for "
                f"{env_name}, expected {self.obs.shape}"
            )
        np.copyto(self.obs, obs)
        self._lives = info["lives"].copy()
        self._stacks.pad(self.obs)

    def step(self, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        obs, reward, terminated, truncated, info = self._vector_env.step(actions)
        # Envs whose previous row was a truncated game's final observation: the ALE
        # restarted them then, so this row is the new game's (module docstring).
        restarted = self.truncated.copy()
        np.copyto(self.obs, obs)
        self.reward[:] = reward
        # The ALE's own episodic life is off, so these are real episode ends (the game is
        # over or hit its frame limit), and `obs` is already the next game's first frame.
        game_over = terminated | truncated
        self._totals.count(reward)
        self._totals.finish(self, game_over)
        self._stacks.tick()
        self._stacks.restart(game_over)
        lives = info["lives"]
        ended = terminated.copy()
        if self._episodic_life:
            # After a game over `lives` is the new game's, so the comparison restarts.
            life_lost = lost_a_life(lives, self._lives, game_over)
            self._stacks.restart(life_lost)
            ended |= life_lost
        np.copyto(self.terminated, ended)
        np.logical_or(ended, restarted, out=self.done)
        np.logical_and(truncated, ~terminated, out=self.truncated)
        if self.truncated.any():
            self.obs[self.truncated] = info["final_obs"][self.truncated]
        self._lives[:] = lives
        # A truncated row holds the old game's final stack, not the new game's frames.
        self._stacks.pad(self.obs, skip=self.truncated)
        self._track_discounted_return()

    def close(self) -> None:
        vector_env, self._vector_env = getattr(self, "_vector_env", None), None
        if vector_env is not None:
            # The C++ threads stop when the interface is destroyed, not on close():
            # dropping the last reference is what releases them.
            vector_env.close()
            del vector_env


def check_backend(env_name: str, backend: Backend) -> None:
    """Refuse an explicit `backend` that cannot run `env_name`, in one line.

    Raises:
        EnvError: "ale_vector" or "envpool" that cannot run `env_name` (or, for
            "envpool", cannot be imported: the message says how to install it).
        ValueError: an unknown backend.
    """
    # envpool_batch builds on this module, so it is imported when used.
    from beast.envs.envpool_batch import envpool_support

    if backend == "ale_vector":
        config = _ale_vector_config(env_name)
        if isinstance(config, str):
            raise EnvError(f"the ale_vector env backend cannot run this env: {config}")
    elif backend == "envpool":
        reason = envpool_support(env_name)
        if reason is not None:
            raise EnvError(reason)
    elif backend not in BACKENDS:
        raise ValueError(f"unknown env batch backend {backend!r}; use one of {', '.join(BACKENDS)}")


def resolve_backend(env_name: str, backend: Backend, num_envs: int) -> str:
    """The backend `make_env_batch` uses for a batch of `num_envs` envs of `env_name`:
    `backend` itself (checked by `check_backend`), or for "auto" the measured choice:
    "envpool" for the families and batch sizes of `AUTO_ENVPOOL_MIN_ENVS` where it runs
    the id, "ale_vector" where `AUTO_PREFERS_ALE_VECTOR`, else "loop"."""
    from beast.envs.envpool_batch import envpool_support

    if backend != "auto":
        check_backend(env_name, backend)
        return backend
    fewest = AUTO_ENVPOOL_MIN_ENVS.get(factory.env_family(env_name) or "")
    if fewest is not None and num_envs >= fewest and envpool_support(env_name) is None:
        return "envpool"
    if AUTO_PREFERS_ALE_VECTOR and ale_vector_supports(env_name):
        return "ale_vector"
    return "loop"


def make_env_batch(
    env_name: str,
    num_envs: int,
    first_seed: int | None,
    episodic_life: bool,
    backend: Backend = "auto",
    *,
    num_threads: int = DEFAULT_NATIVE_THREADS,
    return_discount: float | None = None,
) -> EnvBatch:
    """K envs of `env_name` as one batch (see the module docstring for the contract).

    Args:
        env_name: anything `beast.envs.make` accepts.
        num_envs: K.
        first_seed: env i is seeded with `first_seed + i`; None leaves seeds to entropy.
        episodic_life: Atari only; a lost life ends the agent's episode (`done`) but not
            the game (`episode_end`).
        backend: "loop", "ale_vector", "envpool" or "auto" (`resolve_backend`: the
            backend measured fastest per CPU-second among those that preprocess the id
            as "loop" does; anything else always uses "loop").
        num_threads: C++ worker threads of the "ale_vector" and "envpool" backends.
        return_discount: gamma of the `discounted_return` the batch keeps; None: none.

    Raises:
        EnvError: the env cannot be made, or an explicit backend cannot run it.
        ValueError: unknown backend, num_envs < 1.
    """
    backend = resolve_backend(env_name, backend, num_envs)
    batch: EnvBatch
    if backend == "loop":
        batch = LoopEnvBatch(env_name, num_envs, first_seed, episodic_life)
    elif backend == "ale_vector":
        batch = AleVectorEnvBatch(
            env_name, num_envs, first_seed, episodic_life, num_threads=num_threads
        )
    else:
        from beast.envs.envpool_batch import EnvPoolEnvBatch

        batch = EnvPoolEnvBatch(
            env_name, num_envs, first_seed, episodic_life, num_threads=num_threads
        )
    batch.return_discount = return_discount
    return batch
