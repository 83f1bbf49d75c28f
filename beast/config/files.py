"""Config files: reading a YAML file of flag values with a one-line error for each
unknown key or mistyped value (`load_config_file`, `check_value`), and writing a config
back as YAML (`config_to_yaml`, --print_config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
from typing import Any

import yaml

from beast.config.flags import AUTO, Config, ConfigError, _arg_type

__all__ = [
    "CONFIGS_DIR",
    "check_value",
    "config_to_yaml",
    "load_config_file",
]


# configs/ at the root of the beast checkout (an editable install, as the README says).
CONFIGS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)


def _resolve_config_path(path: str) -> str:
    """`path` as given, or inside the checkout when it is a relative path found only there.

    So `--config configs/impala/atari.yaml` works from any working directory.
    """
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded) or os.path.exists(expanded):
        return expanded
    in_checkout = os.path.join(os.path.dirname(CONFIGS_DIR), expanded)
    return in_checkout if os.path.exists(in_checkout) else expanded


# Keys a config file may not set: a file naming another file (or family of files) would
# hide where values come from.
_NOT_IN_FILES = frozenset({"config", "family"})
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_value(
    key: str,
    value: Any,
    source: str,
    config_class: type[Config] = Config,
    noun: str = "key",
) -> Any:
    """`value` for the Config field `key`, in the field's type, or a one-line ConfigError.

    Used for config files, sweep files and the Python API's keyword arguments, whose
    values arrive typed (by YAML, by Python) rather than parsed by argparse. `source` (a
    file name, `beast.train()`) starts every message, which calls `key` a `noun` ("key"
    in a file, "argument" in a call). Ints are accepted for float fields; strings that
    parse as floats too, because YAML 1.1 reads `6e-4` (no dot) as a string.
    """
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    if key not in fields or key in _NOT_IN_FILES:
        elsewhere = config_class.flag_elsewhere(str(key))
        if elsewhere is not None:
            raise ConfigError(f"{source}: '{key}' is {elsewhere}")
        names = [name for name in fields if name not in _NOT_IN_FILES]
        close = difflib.get_close_matches(str(key), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{source}: unknown {noun} '{key}'{hint}")
    f = fields[key]
    if value is None and "None" in f.type:
        return None
    if isinstance(value, bool) and {"on", "off"} <= set(f.metadata.get("choices", ())):
        # YAML 1.1 reads on, off, true and false as booleans.
        value = "on" if value else "off"
    if f.type == "int | str":
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ConfigError(
            f"{source}: {noun} '{key}' must be an integer or auto, got {value!r}"
            f" ({type(value).__name__})"
        )
    kind = _arg_type(f.type)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and not ok and not isinstance(value, bool):
        if isinstance(value, int):
            value, ok = float(value), True
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                value, ok = float(value), True
    if not ok:
        raise ConfigError(
            f"{source}: {noun} '{key}' must be {_TYPE_NAMES[kind]}, got {value!r}"
            f" ({type(value).__name__})"
        )
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{source}: {noun} '{key}' must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


def load_config_file(path: str, config_class: type[Config] = Config) -> dict[str, Any]:
    """Read a YAML mapping of Config field names to values, each checked by check_value.

    Raises ConfigError (one line naming the file, and the key where there is one) for
    a missing file, invalid YAML, a key that is not a field, or a mistyped value.
    """
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of flag names to values, got {type(data).__name__}"
        )
    return {key: check_value(key, value, path, config_class) for key, value in data.items()}


def config_to_yaml(config: Config) -> str:
    """The config as a YAML file that `--config` reads back to the same values."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
