"""A run's config from the command line: the parser generated from the fields of the
chosen algorithm's config class (beast/algos/build.py `config_for`: the core flags, then
the --algo's under its own heading), and the layering of defaults < config file < flags
for the command line (`parse_args`) and the Python API (`config_from_flags`).

It sits above the algorithms, which declare their flags as an `Args` dataclass: beast.config
stays a leaf that imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from beast.algos import ALGORITHMS, algorithm_class
from beast.algos.build import DEFAULT_ALGORITHM, config_for, flag_of_another_algorithm
from beast.config.families import tuned_config
from beast.config.files import _resolve_config_path, check_value, config_to_yaml, load_config_file
from beast.config.flags import AUTO, FAMILIES, Config, ConfigError, _arg_type

__all__ = ["build_parser", "config_from_flags", "parse_args"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports an error as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_flag(parser: Any, f: dataclasses.Field) -> None:
    kind = _arg_type(f.type)
    # argparse formats help with %-interpolation: a literal "20%" must reach it as "20%%".
    help_text = f.metadata["help"].replace("%", "%%")
    if kind is bool:
        parser.add_argument(
            f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default, help=help_text
        )
        return
    default_text = "" if f.default is None else f" (default: {f.default})"
    parser.add_argument(
        f"--{f.name}",
        type=kind,
        default=f.default,
        choices=f.metadata.get("choices"),
        help=help_text + default_text,
        metavar=f.name.upper() if "choices" not in f.metadata else None,
    )


def build_parser(
    prog: str | None = None, config_class: type[Config] = Config
) -> argparse.ArgumentParser:
    """One flag per field of `config_class` (a `config_for` class, or Config itself): the
    core flags, then the algorithm's under its own heading."""
    parser = _Parser(
        prog=prog,
        description=getattr(
            config_class, "parser_description", "beast: deep RL on one machine (MonoBeast)."
        )
        + " Defaults shown are the"
        " built-in ones; the --config file (by default the tuned one for --env's family)"
        " replaces them, and flags replace both. --print_config shows the result.",
        epilog=f"Algorithms: {', '.join(ALGORITHMS)}; `--algo NAME --help` lists NAME's flags.",
    )
    own = set(getattr(config_class, "algorithm_fields", ()))
    algo_fields = [f for f in dataclasses.fields(config_class) if f.name in own]
    for f in dataclasses.fields(config_class):
        if f.name not in own:
            _add_flag(parser, f)
    if algo_fields:
        algo = next(f for f in dataclasses.fields(config_class) if f.name == "algo").default
        algorithm = algorithm_class(algo)  # the config_for class's own algorithm
        group = parser.add_argument_group(f"--algo {algo}", algorithm.summary)
        for f in algo_fields:
            _add_flag(group, f)
    # Not a Config field: it asks for output, it does not configure the run.
    parser.add_argument(
        "--print_config",
        action="store_true",
        help="Print the merged config (defaults < config file < flags) as YAML and exit.",
    )
    return parser


def _algo_named(algo: Any, config_file: str | None) -> Any:
    """The run's --algo: `algo` when given, else an explicit config file's `algo` key, else
    the default. A name that is not registered is returned as it is (the parser, or
    check_value, then reports it as an invalid choice)."""
    if algo is not None:
        return algo
    if config_file is not None and config_file.lower() != "none":
        with contextlib.suppress(OSError, yaml.YAMLError):
            with open(_resolve_config_path(config_file)) as f:
                data = yaml.safe_load(f)
            if isinstance(data, dict) and isinstance(data.get("algo"), str):
                return data["algo"]
    return DEFAULT_ALGORITHM


def _chosen_algo(argv: Sequence[str]) -> str:
    """_algo_named for the command line's --algo and --config."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--algo")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    return _algo_named(known.algo, known.config)


def _config_file(config_file: str | None, family: str, env: str, algo: str) -> str | None:
    """The YAML file a run's values start from: --config's (None for "none"), else the tuned
    file of --family, or of `env`'s family, for `algo`, if any (`tuned_config`)."""
    if config_file is not None and family != AUTO:
        raise ConfigError(
            f"--config {config_file} and --family {family} both choose the file to start"
            " from; give one of them"
        )
    if config_file is not None and config_file.lower() == "none":
        return None
    if config_file is not None:
        return _resolve_config_path(config_file)
    return tuned_config(env, algo, family).path


def _validated(
    config: Config, path: str | None, file_values: Mapping[str, Any], given: set[str]
) -> Config:
    """`config` after validate(); an error about a value that came from the file at `path`
    rather than from the `given` flags names the file."""
    try:
        config.validate()
    except ConfigError as error:
        bad = str(error).split()[0].removeprefix("--")
        if path is not None and bad in file_values and bad not in given:
            raise ConfigError(f"{error} (set in {path})") from None
        raise
    return config


def _serial_fits(run_class: type[Config], values: Mapping[str, Any]) -> bool:
    """Whether a config file's `serial: true` holds for a run: it is the file's choice for
    its own setting (one actor with one env, acting with the learner's model, as the SAC
    configs have it: taking turns there is faster, benchmarks/RESULTS.md), and gives way
    to flags asking for more actors or envs, central inference, or polybeast. --serial
    or --no-serial on the command line decides instead."""
    return (
        run_class.serial_capable
        and values["num_actors"] == 1
        and values["num_envs_per_actor"] == 1
        and values["policy"] != "central"
    )


def parse_args(
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    config_class: type[Config] = Config,
) -> Config:
    """Parse flags (over a config file, over defaults) into a finalized config of the chosen
    algorithm: `config_for(algo, config_class)`.

    Raises ConfigError on a bad config file or bad combinations; argparse exits with
    status 2 on malformed flags, and `--print_config` prints the merged config and
    exits with status 0, as `--help` does.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    algo = _chosen_algo(argv)
    run_class = config_for(algo if algo in ALGORITHMS else DEFAULT_ALGORITHM, config_class)
    parser = build_parser(prog or os.path.basename(sys.argv[0]), run_class)
    # A first pass finds --config, --family and --env (and reports malformed flags before
    # any file is read or env made); the second lets the file's values replace the
    # defaults while the flags given still win.
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown_flags(parser, unknown, run_class.algo)
    path = _config_file(namespace.config, namespace.family, namespace.env, namespace.algo)
    file_values: dict[str, Any] = {}
    if path is not None:
        file_values = load_config_file(path, run_class)
        parser.set_defaults(**file_values)
        namespace = parser.parse_args(argv)
    values = vars(namespace)
    print_config = values.pop("print_config")
    values["config"] = path
    given = {arg[2:].split("=")[0] for arg in argv if arg.startswith("--")}
    if file_values.get("serial") and not {"serial", "no-serial"} & given:
        values["serial"] = _serial_fits(run_class, values)
    config = _validated(run_class(**values), path, file_values, given)
    if print_config:
        # Before finalize(): derived values stay unset, so the output works as a
        # --config file for new runs (no timestamp xpid pinned into it).
        sys.stdout.write(config_to_yaml(config))
        raise SystemExit(0)
    return config.finalize()


def _refuse_unknown_flags(parser: argparse.ArgumentParser, unknown: list[str], algo: str) -> None:
    """Exit 2 with one line on the arguments `parser` did not know: for a flag of other
    algorithms, whose it is ("--replay_ratio is a flag of --algo laser, not of impala");
    else argparse's own "unrecognized arguments"."""
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0]
        # A boolean flag's negative form, --no-NAME, belongs where NAME does.
        for key in (name, name.removeprefix("no-")):
            elsewhere = flag_of_another_algorithm(key, algo)
            if elsewhere is not None:
                parser.error(f"--{key} is {elsewhere}")
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def config_from_flags(
    flags: Mapping[str, Any], config_class: type[Config] = Config, source: str = "beast.train()"
) -> Config:
    """`parse_args` for typed values, the Python API's keyword arguments: the same layers
    (defaults < the `config` file, or the tuned family file for `env` and `algo` < `flags`),
    the same validation, a finalized config of the chosen algorithm. Each value is checked
    as a config file's is (check_value): a wrong name or type is a one-line ConfigError
    that starts with `source` and names the argument."""
    flags = dict(flags)
    config_file = flags.pop("config", None)
    if config_file is not None and not isinstance(config_file, str):
        raise ConfigError(
            f"{source}: argument 'config' must be a YAML file name or 'none', got {config_file!r}"
        )
    family = flags.pop("family", AUTO)
    if family not in (AUTO, *FAMILIES):
        raise ConfigError(
            f"{source}: argument 'family' must be one of {', '.join((AUTO, *FAMILIES))},"
            f" got {family!r}"
        )
    algo = _algo_named(flags.get("algo"), config_file)
    run_class = config_for(algo if algo in ALGORITHMS else DEFAULT_ALGORITHM, config_class)
    values = {
        key: check_value(key, value, source, run_class, noun="argument")
        for key, value in flags.items()
    }
    path = _config_file(config_file, family, values.get("env", run_class.env), run_class.algo)
    file_values = load_config_file(path, run_class) if path is not None else {}
    config = run_class(**{**file_values, **values, "config": path, "family": family})
    return _validated(config, path, file_values, set(values)).finalize()
