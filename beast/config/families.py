"""Family selection: which tuned file, configs/<algo>/<family>.yaml, a run's defaults
come from (--family, else the family --env's id names, else the one its spaces
suggest), and the start-up line that says which and why.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from beast.envs import EnvSpec
from beast.config.files import CONFIGS_DIR
from beast.config.flags import AUTO, FAMILIES, Config, ConfigError

__all__ = [
    "TunedConfig",
    "describe_defaults",
    "tuned_config",
]


@dataclass(frozen=True)
class TunedConfig:
    """The tuned file a run starts from when no --config is given (`tuned_config`)."""

    path: str | None  # configs/<algo>/<family>.yaml; None: the algorithm's built-in defaults
    reason: str  # why, for the start-up line: "vector observations, Discrete actions"


# How the start-up line names the families that --env's id gives.
_FAMILY_WORDS = {"atari": "an Atari game", "classic": "classic control", "mujoco": "a MuJoCo task"}

# Tasks whose reward the tuned defaults do not find, and what does: data measured per
# task, kept beside the configs (configs/notes.yaml says why each is there).
_NOTES_FILE = os.path.join(CONFIGS_DIR, "notes.yaml")


@functools.cache
def _task_notes() -> dict[str, dict[str, str]]:
    with open(_NOTES_FILE) as f:
        return yaml.safe_load(f) or {}


def tuned_config(
    env: str, algo: str, family: str = AUTO, spec: EnvSpec | None = None
) -> TunedConfig:
    """`algo`'s tuned configs/<algo>/<family>.yaml for a run of `env` with no --config.

    The family is `family` when it is not auto (--family); else the one `env`'s id
    belongs to (`beast.envs.env_family`: Atari, classic control, MuJoCo); else, for custom
    `module:Class` envs and ids of no tuned family, the one the env's spaces suggest
    (`beast.envs.spaces_family`: image observations atari, vector observations classic
    with Discrete actions, mujoco with Box actions). A user's own CartPole so starts from
    the settings CartPole-v1 does, not from the core defaults (IMPALA's Atari settings).
    Reading the spaces makes the env once (`beast.envs.probe_spec` says why) unless `spec`
    is given. `path` is None when `algo` has no file for the family (then its built-in
    defaults apply, `Algorithm.core_defaults` over Config's).

    Raises ConfigError for a --family that `algo` has no file for, EnvError for an env
    that cannot be made.
    """
    from beast import envs  # imports gymnasium and ale_py; only needed here

    if family != AUTO:
        path = _family_file(algo, family)
        if not os.path.isfile(path):
            have = [name for name in FAMILIES if os.path.isfile(_family_file(algo, name))]
            raise ConfigError(
                f"--family {family}: there is no configs/{algo}/{family}.yaml; --algo {algo}"
                f" has {', '.join(have) or 'no tuned files'} (or give --config FILE)"
            )
        return TunedConfig(path, f"--family {family}")
    family = envs.env_family(env)
    if family is not None:
        reason = f"{env} is {_FAMILY_WORDS[family]}"
    else:
        family, reason = envs.spaces_family(spec or envs.probe_spec(env))
    if family is None:
        return TunedConfig(None, f"{reason}: no tuned family")
    path = _family_file(algo, family)
    if not os.path.isfile(path):
        return TunedConfig(None, f"{reason}; no configs/{algo}/{family}.yaml")
    return TunedConfig(path, reason)


def _family_file(algo: str, family: str) -> str:
    return os.path.join(CONFIGS_DIR, algo, f"{family}.yaml")


def describe_defaults(config: Config, spec: EnvSpec) -> str:
    """For the start-up line: the file the run's values started from, and why, e.g.
    "defaults: configs/impala/classic.yaml (vector observations, Discrete actions)"; for
    an id whose reward those defaults do not find (configs/notes.yaml), what does.

    Worked out again from the run's config and its env's `spec` (so no env is made): the
    tuned file `tuned_config` picks when the run's file is that one, else --config's.
    """
    tuned = tuned_config(config.env, config.algo, config.family, spec)
    if config.config == tuned.path:
        path, reason = tuned.path, tuned.reason
    else:
        path, reason = config.config, "--config none" if config.config is None else "--config"
    if path is None:
        line = f"defaults: --algo {config.algo}'s built-in ({reason})"
    else:
        in_checkout = os.path.relpath(path, os.path.dirname(CONFIGS_DIR))
        line = f"defaults: {path if in_checkout.startswith('..') else in_checkout} ({reason})"
    note = _task_notes().get(config.env)
    if note and config.algo != note["learned_by"] and config.config == tuned.path:
        line += f"; {note['note']}"
    return line
