"""`make`: one call from a name to a ready env, with the same stats and seeding for all.

Names:
    - a Gymnasium id (`CartPole-v1`, `PongNoFrameskip-v4`, `ALE/Breakout-v5`, ...);
    - `package.module:ClassName` or `package.module:factory_function`, called with no
      arguments; a result that is not a `gymnasium.Env` is taken to speak the old gym
      API and wrapped in `OldGymAdapter`. (`package.module:EnvId-v0`, Gymnasium's own
      "import this module, then make this id" form, works too.) The running script's
      own module name finds the running script (`beast.util.references.import_module`).

Atari: a Gymnasium id whose entry point is ale_py's `AtariEnv` gets the DeepMind
preprocessing (see `beast.envs.atari`). Its AtariEnv is always created with
`frameskip=1` so the preprocessing's skip of 4 (with max-pooling) is the only one:
`*NoFrameskip-v4` ids already are; `ALE/*-v5` (skip 4) and `*-v4` (random skip 2..4)
ids are overridden. Everything else the id defines is kept, notably
`repeat_action_probability` (0.25 for v5, "sticky actions", applied per frame by the
ALE; 0 for v4). A custom factory returning a bare `AtariEnv` (with `frameskip=1`) is
preprocessed too; one returning a wrapped Atari env is used as is, on the view that its
author has preprocessed it. An AtariEnv with `obs_type="ram"` (ale-py registers no RAM
ids, but a factory or a user-registered id can make one) is used as defined: uint8
[128] RAM, its own frame skip, no episodic life; pixel preprocessing does not apply.

Wrapper order, innermost first:
    Atari:  AtariEnv -> AtariPreprocessing -> [TimeLimit] -> EpisodeStatistics
            -> [EpisodicLife] -> FrameStack(4) -> SeedFirstReset
    other:  env -> [Float32Observation] -> EpisodeStatistics -> SeedFirstReset
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from typing import Any, NoReturn

import ale_py
import gymnasium
import numpy as np
from ale_py.env import AtariEnv
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator
from gymnasium.wrappers import TimeLimit

from beast.envs.adapters import OldGymAdapter
from beast.envs.atari import (
    AtariPreprocessing,
    EpisodicLife,
    FrameStack,
    wants_pixel_preprocessing,
)
from beast.envs.spec import EnvError, EnvSpec, env_spec, is_image
from beast.envs.wrappers import EpisodeStatistics, Float32Observation, SeedFirstReset
from beast.util.references import import_module

__all__ = ["env_family", "make", "probe_spec", "refuse_episodic_life", "spaces_family"]

# Importing ale_py registers the ALE ids; this call documents that dependency.
gymnasium.register_envs(ale_py)
# The emulator's welcome banner goes to stderr on every env made: errors only, so that a
# bad flag stays one line and actors' logs stay clean.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)

# DeepMind preprocessing constants (Mnih et al. 2015, "Methods").
NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4


def make(name: str, *, seed: int | None = None, episodic_life: bool = False) -> gymnasium.Env:
    """Create an environment by name, wrapped for beast.

    Every returned env puts `info["episode"] = {"r": float, "l": int}` (raw undiscounted
    return, length in agent steps) in the info of the step that ends a real episode,
    returns vector observations as float32 and Atari observations as uint8 [4, 84, 84].

    Args:
        name: Gymnasium id or `package.module:ClassName` (see module docstring).
        seed: seeds the first `reset()` (used when it is called without a seed) and the
            action space; None leaves both to fresh entropy.
        episodic_life: Atari only. A lost life returns `terminated=True` and the next
            `reset()` continues the game; `info["episode"]` still covers whole games.

    Raises:
        EnvError: unknown id, bad import path, missing dependency, or episodic_life for
            a non-Atari env.
    """
    if ":" in name:
        env, max_episode_steps = _make_from_path(name)
    else:
        env, max_episode_steps = _make_registered(name)

    if wants_pixel_preprocessing(env):
        env = _wrap_atari(env, episodic_life, max_episode_steps)
    else:
        if episodic_life:
            env.close()
            refuse_episodic_life(name)
        env = _wrap_generic(env)
    return SeedFirstReset(env, seed)


def refuse_episodic_life(name: str) -> NoReturn:
    """Raise the EnvError for episodic_life=True on `name`, which is not an Atari game."""
    raise EnvError(
        f"episodic_life=True only applies to Atari games, and '{name}' is not one; "
        "set episodic_life to false"
    )


# Entry points of the "classic" and "mujoco" families' envs.
_CLASSIC_ENTRY_POINTS = (
    "gymnasium.envs.classic_control.",
    "beast.envs.masked_cartpole:",
    "beast.envs.dict_classic:",
)
_MUJOCO_ENTRY_POINTS = ("gymnasium.envs.mujoco.",)


def env_family(name: str) -> str | None:
    """The config family of an env name: "atari", "classic", "mujoco" or None, without
    creating it.

    `configs/<algo>/<family>.yaml` holds the hyperparameters tuned for a family, so
    this decides which defaults a run starts from. "atari" is a Gymnasium id whose entry
    point is ale_py's `AtariEnv` with pixel observations (the ids `make` preprocesses);
    "classic" is Gymnasium's classic control, beast's MaskedCartPole-v1 (CartPole with
    hidden velocities, beast.envs.masked_cartpole) and its Dict-observation CartPole and
    Pendulum (beast.envs.dict_classic); "mujoco" is Gymnasium's MuJoCo
    locomotion (HalfCheetah, Hopper, Walker2d, Ant, Humanoid...: `pip install -e
    ".[mujoco]"`). Anything else, custom `module:Class` envs and unknown ids included,
    has no tuned family: None.
    """
    if ":" in name:
        return None
    try:
        spec = gymnasium.spec(name)
    except gymnasium.error.Error:
        return None
    entry_point = spec.entry_point
    if isinstance(entry_point, str) and entry_point.startswith(_CLASSIC_ENTRY_POINTS):
        return "classic"
    if isinstance(entry_point, str) and entry_point.startswith(_MUJOCO_ENTRY_POINTS):
        return "mujoco"
    try:
        atari = _is_atari_entry_point(entry_point)
    except Exception:  # an entry point that fails to import is make()'s error to report
        return None
    return "atari" if atari and spec.kwargs.get("obs_type") != "ram" else None


def spaces_family(spec: EnvSpec) -> tuple[str | None, str]:
    """The config family an env's spaces suggest, for an env whose name gives none
    (`env_family` is None), and the spaces in words (for the start-up line).

    An image observation ([C, H, W], a single Box) gets "atari"; vector observations (a
    1-D Box, or a Dict or Tuple of 1-D Boxes) get "classic" with Discrete actions and
    "mujoco", the continuous-control settings, with Box actions. Other observations (a
    Dict or Tuple with image leaves, a Box of 2 or 4+ dimensions) fit no family's tuned
    model and settings: None, and the run starts from the algorithm's built-in defaults.

    Returns (family or None, e.g. "vector observations, Discrete actions").
    """
    actions = "Box actions" if spec.continuous else "Discrete actions"
    shapes = [field.shape for field in spec.obs_fields().values()]
    if not spec.nested and is_image(shapes[0]):
        return "atari", f"image observations, {actions}"
    if all(len(shape) == 1 for shape in shapes):
        family = "mujoco" if spec.continuous else "classic"
        return family, f"{'nested ' if spec.nested else ''}vector observations, {actions}"
    return None, f"observations ({spec.describe_obs()}), {actions}"


def probe_spec(name: str) -> EnvSpec:
    """The spec of the env `name`, read from one instance made for it and closed at once.

    For `spaces_family` when `env_family(name)` is None (custom `module:Class` envs,
    ids of no tuned family): an env sets its spaces in its constructor, and neither its
    class nor Gymnasium's registry holds them, so reading them takes one construction,
    in the process that parses the flags, before the run's own envs exist. Envs whose
    name gives their family are never made here, nor any env of a run given --config or
    --family (for an env whose constructor is costly). The start-up line reads the family
    again from the spec that start-up's own probe made (beast.run.plan.plan_run), without a
    third construction.
    """
    env = make(name)
    try:
        return env_spec(env)
    finally:
        env.close()


def _make_registered(name: str) -> tuple[gymnasium.Env, int | None]:
    """Create a Gymnasium id; pixel Atari ids come back as a bare `AtariEnv`, frameskip=1.

    Returns the env and, for Atari, the id's `max_episode_steps` still to be applied
    (in agent steps) on top of the preprocessing; None otherwise.
    """
    try:
        spec = gymnasium.spec(name)
    except gymnasium.error.Error:
        raise EnvError(_unknown_id_message(name)) from None

    try:
        atari = _is_atari_entry_point(spec.entry_point) and spec.kwargs.get("obs_type") != "ram"
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith(_MUJOCO_ENTRY_POINTS):
            _quiet_known_mujoco_warnings()
        env = gymnasium.make(spec, **({"frameskip": 1} if atari else {}))
    except (gymnasium.error.DependencyNotInstalled, ImportError) as err:
        hint = ' (pip install -e ".[mujoco]")' if "mujoco" in str(err).lower() else ""
        raise EnvError(f"cannot create '{name}': {_first_line(err)}{hint}") from None
    if atari:
        # Drop gymnasium's checker/order/time-limit wrappers: the preprocessing drives
        # the ALE directly. (The registered ALE ids set no max_episode_steps; they
        # truncate through the ALE's max_num_frames_per_episode instead.)
        return env.unwrapped, spec.max_episode_steps
    return env, None


# MuJoCo warnings about Gymnasium's own model files, not the user's: printed once per env
# created (16 envs, 16 lines) with nothing the user can do about them.
_KNOWN_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


@functools.cache
def _quiet_known_mujoco_warnings() -> None:
    """Drop `_KNOWN_MUJOCO_WARNINGS`; print any other MuJoCo warning as MuJoCo would."""
    try:
        import mujoco
    except ImportError:
        return  # gymnasium.make reports the missing dependency

    def warn(message: str) -> None:
        if not message.startswith(_KNOWN_MUJOCO_WARNINGS):
            print(f"WARNING: {message}", file=sys.stderr, flush=True)

    mujoco.set_mju_user_warning(warn)


def _is_atari_entry_point(entry_point: Any) -> bool:
    """Whether an id's entry point is (a subclass of) ale_py's AtariEnv; may import it."""
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    return isinstance(creator, type) and issubclass(creator, AtariEnv)


def _make_from_path(name: str) -> tuple[gymnasium.Env, int | None]:
    """Import `package.module:attr`, call it with no arguments, adapt old-API results."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise EnvError(f"'{name}' is not a valid custom env path; write 'package.module:ClassName'")
    try:
        module = import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise EnvError(
                f"cannot import module '{module_name}' for environment '{name}': "
                "check the path, and that the package is installed or on PYTHONPATH"
            ) from None
        # The module exists but failed inside: keep its traceback, it is the user's bug.
        raise EnvError(
            f"importing module '{module_name}' for environment '{name}' failed: {_first_line(err)}"
        ) from err

    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if obj is None:
        if attr in gymnasium.registry:
            # Gymnasium's "module:EnvId" form: importing the module registered the id.
            return _make_registered(attr)
        raise EnvError(f"module '{module_name}' has no attribute '{attr}' (environment '{name}')")
    if not callable(obj):
        raise EnvError(f"'{name}' is not callable; point it at an env class or factory function")
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise EnvError(
            f"'{name}' must be callable with no arguments, but its signature is "
            f"{inspect.signature(obj)}; wrap it in a factory function"
        ) from None
    except ValueError:
        pass  # no introspectable signature (builtins); just try the call
    env = obj()
    if isinstance(env, gymnasium.Env):
        return env, None
    return OldGymAdapter(env), None


def _wrap_atari(
    atari_env: AtariEnv, episodic_life: bool, max_episode_steps: int | None
) -> gymnasium.Env:
    env: gymnasium.Env = AtariPreprocessing(
        atari_env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE
    )
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    # Statistics below episodic life, so a lost life does not cut the reported episode.
    env = EpisodeStatistics(env)
    if episodic_life:
        env = EpisodicLife(env)
    return FrameStack(env, FRAME_STACK)


def _wrap_generic(env: gymnasium.Env) -> gymnasium.Env:
    obs_space = env.observation_space
    if (
        isinstance(obs_space, spaces.Box)
        and obs_space.dtype.kind == "f"
        and obs_space.dtype != np.float32
    ):
        env = Float32Observation(env)
    return EpisodeStatistics(env)


def _unknown_id_message(name: str) -> str:
    by_lower = {env_id.lower(): env_id for env_id in gymnasium.registry}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?"
    else:
        hint = "list them with gymnasium.pprint_registry(); custom envs are 'package.module:Class'"
    return f"unknown environment '{name}': not a registered Gymnasium id ({hint})"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
