"""An algorithm from a run's flags: the config class of a run of it (the core flags,
beast/config, composed with the algorithm's own `Args`: `config_for`), a saved run's
config as that class (`config_from_dict`), the algorithm for an env (`build_algorithm`)
and its network checked against what the algorithm needs (`build_checked_model`).

Above the algorithms and below everything that runs one: the command line
(beast/run/parsing.py), a run's start-up (beast/run/plan.py), --mode test and export
(beast/trained/), polybeast's env servers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from torch import nn

from beast import envs
from beast.algos import ALGORITHMS, algorithm_class
from beast.algos.actor_critic import ActorCriticAlgorithm
from beast.algos.base import Algorithm
from beast.config import Config, ConfigError
from beast.models import ModelError, check_model

__all__ = [
    "DEFAULT_ALGORITHM",
    "algorithms_of",
    "build_algorithm",
    "build_checked_model",
    "config_for",
    "config_from_dict",
    "flag_of_another_algorithm",
]

# --algo's default: the registry's first.
DEFAULT_ALGORITHM = next(iter(ALGORITHMS))


@functools.cache
def config_for(algo: str, base: type[Config] = Config) -> type[Config]:
    """`base` (Config, or polybeast's subclass) with the fields of `algo`'s `Args` added:
    the config class of a run of that algorithm. Its `validate` runs `base`'s checks, then
    the algorithm's. KeyError for an unknown algorithm."""
    algorithm = algorithm_class(algo)
    own = [
        (f.name, f.type, field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(algorithm.Args)
    ]
    # Core flags whose defaults the algorithm replaces (`Algorithm.core_defaults`).
    core = {f.name: f for f in dataclasses.fields(base)}
    unknown = set(algorithm.core_defaults) - set(core)
    if unknown:
        raise KeyError(f"{algo}'s core_defaults name no core flag: {sorted(unknown)}")
    replaced = [
        (name, core[name].type, field(default=value, metadata=core[name].metadata))
        for name, value in algorithm.core_defaults.items()
    ]
    algo_field = next(f for f in dataclasses.fields(base) if f.name == "algo")
    algo_metadata = {**algo_field.metadata, "choices": tuple(ALGORITHMS)}

    def validate(self: Config) -> None:
        base.validate(self)
        algorithm.validate(self)

    return dataclasses.make_dataclass(
        f"{algorithm.__name__}{base.__name__}",
        [
            *own,
            *replaced,
            ("algo", algo_field.type, field(default=algo, metadata=algo_metadata)),
        ],
        bases=(base,),
        frozen=True,
        namespace={
            "validate": validate,
            "flag_elsewhere": classmethod(lambda cls, key: flag_of_another_algorithm(key, algo)),
            "algorithm_fields": tuple(name for name, _, _ in own),
            "__module__": __name__,
        },
    )


def algorithms_of(key: str) -> tuple[str, ...]:
    """The algorithms that have a flag `key` of their own (an `Args` field), in the
    registry's order; () for a core flag or no flag at all."""
    return tuple(
        name
        for name in ALGORITHMS
        if any(f.name == key for f in dataclasses.fields(algorithm_class(name).Args))
    )


def flag_of_another_algorithm(key: str, algo: str) -> str | None:
    """ "a flag of --algo laser, not of impala" when `key` is a flag of other algorithms
    than `algo` (all of them named), else None."""
    owners = algorithms_of(key)
    if not owners or algo in owners:
        return None
    names = ", ".join(owners[:-1]) + " and " + owners[-1] if len(owners) > 1 else owners[0]
    return f"a flag of --algo {names}, not of {algo}"


def config_from_dict(values: Mapping[str, Any], base: type[Config] = Config) -> Config:
    """A saved run's config (a checkpoint's, a run's config.yaml) as its algorithm's class.

    Keys that are no fields (any more) are dropped and missing ones take their defaults,
    so a run saved by an older beast still loads for --mode test, except where the default
    changed what the run built: a run saved before --use_last_action_reward existed had an
    actor-critic's built-in mlp read the reward and last action (as every built-in
    actor-critic network did then; "auto" resolves to the image models, which still do,
    or to that mlp). ConfigError for an unknown algorithm.
    """
    algo = values.get("algo", DEFAULT_ALGORITHM)
    if algo not in ALGORITHMS:
        raise ConfigError(f"the saved run's --algo {algo!r} is not one of {', '.join(ALGORITHMS)}")
    run_class = config_for(algo, base)
    names = {f.name for f in dataclasses.fields(run_class)}
    saved = {key: value for key, value in values.items() if key in names}
    if (
        "use_last_action_reward" not in values
        and "use_last_action_reward" in names
        and issubclass(algorithm_class(algo), ActorCriticAlgorithm)
        and values.get("model", "auto") in ("auto", "mlp")
    ):
        saved["use_last_action_reward"] = True
    return run_class(**saved)


def build_algorithm(config: Config, spec: envs.EnvSpec) -> Algorithm:
    """The run's algorithm for the env; a one-line ConfigError when it cannot act in the
    env's action space or normalise its observations."""
    algorithm = algorithm_class(config.algo)
    if spec.continuous and not algorithm.continuous_actions:
        able = [name for name in ALGORITHMS if algorithm_class(name).continuous_actions]
        raise ConfigError(
            f"--algo {config.algo} needs a Discrete action space, and {config.env} has"
            f" {spec.describe_actions()}; for continuous actions use --algo"
            f" {', '.join(able)}"
        )
    if not spec.continuous and not algorithm.discrete_actions:
        able = [name for name in ALGORITHMS if algorithm_class(name).discrete_actions]
        raise ConfigError(
            f"--algo {config.algo} needs a continuous (Box) action space, and {config.env}"
            f" has {spec.describe_actions()} (Discrete); for discrete actions use --algo"
            f" {', '.join(able)}"
        )
    if config.normalize_obs and not any(
        f.dtype.is_floating_point for f in spec.obs_fields().values()
    ):
        raise ConfigError(
            f"--normalize_obs is for float vector observations, and {config.env}'s are"
            f" {spec.describe_obs()} (image models scale pixels themselves); drop"
            " --normalize_obs"
        )
    return algorithm(config, spec)


def build_checked_model(algorithm: Algorithm) -> nn.Module:
    """The algorithm's network, or a one-line ConfigError when it cannot be built for the
    env or does not return what the algorithm needs (checked on a dummy batch)."""
    config, spec = algorithm.config, algorithm.spec
    try:
        model = algorithm.build_model()
        check_model(model, spec, algorithm.model_outputs(), config.model)
    except ModelError as error:
        raise ConfigError(str(error)) from None
    except ValueError as error:  # a built-in model that does not fit the observations
        raise ConfigError(
            f"--model {config.model} does not fit --env {config.env}: {error}"
        ) from None
    return model
