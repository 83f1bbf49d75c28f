"""Flags for monobeast: one dataclass of core flags, and the files that set them.

Every hyperparameter is a field with its help text next to it. The core flags (what to
run, acting, inference, rollouts and batches, learner, model, optimizer, logging,
reliability) are `Config`'s fields; each algorithm adds its own (beast/algos: its
`Args` dataclass). This package is a leaf: it imports no algorithm. Above the
algorithms, beast/algos/build.py composes the two: `config_for(algo)` is `Config` with
the algorithm's fields added,
so a run's config is one flat, frozen dataclass, and a flag of another algorithm is an
error that names the algorithm it belongs to. The command-line parser is generated from
the fields, so a flag cannot be documented in one place and defined in another: --help
lists the core flags, then the chosen --algo's under its own heading. Derived values
(the run's xpid, the number of rollout buffers) are filled in once by `finalize()`;
nothing mutates a config after that.

Values come from three places, later ones winning: the field defaults, a YAML file of
field values (`--config FILE`, or when none is given the tuned
`configs/<algo>/<family>.yaml` of `--family`, or else of the family `--env` belongs to:
Atari ids get atari.yaml, classic control classic.yaml, MuJoCo mujoco.yaml, and an env
whose id names no family the file its spaces suggest, `tuned_config`), then the
command-line flags. The start-up line says which file and why (`describe_defaults`). A
file's unknown keys and mistyped values are ConfigErrors naming the key and the file.
`--print_config` prints the merged config as YAML and exits. The Python API's keyword
arguments (`beast.train(env=...)`) go through `config_from_flags`: the same layers and
checks, for values that arrive typed.

The package: flags.py (`Config`, `flag`, `ConfigError`), files.py (config files) and
families.py (the tuned file of --family or --env's family); every name is importable
from `beast.config`. The command line and the layering: beast/run/parsing.py.
"""

from beast.config.families import TunedConfig, describe_defaults, tuned_config
from beast.config.files import CONFIGS_DIR, check_value, config_to_yaml, load_config_file
from beast.config.flags import (
    AUTO,
    FAMILIES,
    RUN_NAMING_FLAGS,
    WANDB_MISSING,
    Config,
    ConfigError,
    flag,
    int_or_auto,
    require_fraction,
    require_nonnegative,
    require_positive,
)

__all__ = [
    "AUTO",
    "FAMILIES",
    "RUN_NAMING_FLAGS",
    "Config",
    "ConfigError",
    "TunedConfig",
    "check_value",
    "config_to_yaml",
    "describe_defaults",
    "flag",
    "int_or_auto",
    "load_config_file",
    "require_fraction",
    "require_nonnegative",
    "require_positive",
    "tuned_config",
    "CONFIGS_DIR",
    "WANDB_MISSING",
]
