"""The Python API: `beast.train(...)` and `beast.evaluate(...)`, for notebooks, scripts and
tuners (docs/api.md); `beast.export(...)` and `beast.load_policy(...)` for a trained policy
outside the engine (beast/trained/export.py, beast/trained/policy.py, docs/export.md).

`train` takes the flags as keyword arguments, under the command line's names, checked and
layered as the command line's are (beast.config.config_from_flags: defaults < the tuned
configs/<algo>/<family>.yaml for `env` < the arguments), so `beast.train(env="CartPole-v1")`
is `python monobeast.py --env CartPole-v1`; or a Config (`beast.config.parse_args`, a
result's `.config`), a dict of flags, or a YAML file, as `--config`. `env` and `model`
may also be the objects themselves, an env factory or class and a model class or
factory: they become `module:qualname` strings (beast.util.references) that every process of
the run imports, that the run's files record, and that `evaluate` and a resume read
back.

Errors are the entry points' one-line messages as exceptions: ConfigError and EnvError
for bad input, TrainingError and CheckpointError for a run that had to stop. Ctrl-C (a
notebook's interrupt) or SIGTERM stops a run as on the command line, every process
within seconds and a final checkpoint written, and `train` returns what the run reached,
with `finished` False; the same xpid resumes it.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import yaml

from beast.algos.build import config_from_dict
from beast.config import AUTO, Config, ConfigError
from beast.outputs.checkpoint import load_latest_checkpoint
from beast.outputs.logs import RETURN_WINDOW
from beast.poly.config import PolyConfig
from beast.run.parsing import config_from_flags
from beast.trained.export import export, load_policy
from beast.trained.play import EvalResult, test
from beast.trained.policy import Policy
from beast.util.references import reference

__all__ = ["Policy", "TrainResult", "evaluate", "export", "load_policy", "train"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Where a run is and what it reached, read back from its directory when it ended."""

    run_dir: str  # SAVEDIR/XPID: logs, checkpoint, config.yaml; `evaluate(run_dir)` plays it
    step: int  # agent steps trained (the final checkpoint's)
    num_updates: int  # learner updates
    episodes: int  # training episodes finished (episodes.csv, resumes included)
    mean_return: float  # over the last 100 of them; nan before the first
    seconds: float  # wall-clock of this call
    finished: bool  # reached total_steps; False after Ctrl-C or SIGTERM
    # The run's config as it ran (auto actor layouts resolved); left out of the repr.
    config: Config = dataclasses.field(repr=False)

    @property
    def xpid(self) -> str:
        return str(self.config.xpid)


def _flag_value(key: str, value: Any) -> Any:
    """A keyword argument as the flag's value: an env or model object becomes its import
    path (beast.util.references), a path object its string."""
    if key in ("env", "model") and not isinstance(value, str):
        return reference(value, key)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _train_config(
    config: Config | Mapping[str, Any] | str | os.PathLike | None,
    base: type[Config],
    flags: Mapping[str, Any],
) -> Config:
    """The finalized config of `train`'s arguments (module docstring)."""
    values: dict[str, Any] = {}
    if isinstance(config, Config):
        # Its values are complete: they replace the defaults, and no file is read.
        values = {**config.to_dict(), "config": "none", "family": AUTO}
    elif isinstance(config, Mapping):
        values = dict(config)
    elif isinstance(config, str | os.PathLike):
        values = {"config": os.fspath(config)}
    elif config is not None:
        raise ConfigError(
            f"beast.train(): config must be a Config, a dict of flags or a YAML file, got"
            f" {type(config).__name__}"
        )
    values.update(flags)
    values = {key: _flag_value(key, value) for key, value in values.items()}
    finalized = config_from_flags(values, base, source="beast.train()")
    if finalized.mode != "train":
        raise ConfigError("beast.train() trains; play a saved run with beast.evaluate()")
    return finalized


def _refuse_in_worker() -> None:
    """ConfigError when an actor process is importing the script that called us: forkserver
    runs the running script again in each actor (as `__mp_main__`) before the actor starts,
    and a run started there would write over the real one's files."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError(
            "beast.train() ran while an actor process imported the script that calls it;"
            ' put the script\'s training code under `if __name__ == "__main__":`'
        )


def _is_main_guard(test: ast.expr) -> bool:
    names = {node.id for node in ast.walk(test) if isinstance(node, ast.Name)}
    constants = {node.value for node in ast.walk(test) if isinstance(node, ast.Constant)}
    return "__name__" in names and "__main__" in constants


def _check_main_guard() -> None:
    """ConfigError, in the calling process and before anything starts, when `train` was
    reached from the top level of the running script outside `if __name__ == "__main__":`
    (what `_refuse_in_worker` would otherwise find in every actor)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return  # an interactive session, python -c: actors do not run it again
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return  # not reached from the script's top level (another thread, say)
    line = frame.f_lineno
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return  # not Python source (IPython syntax, say): actors will tell
    guarded = any(
        isinstance(node, ast.If)
        and _is_main_guard(node.test)
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        for node in ast.walk(tree)
    )
    if guarded:
        return
    raise ConfigError(
        f'{path}:{line} starts beast.train() outside `if __name__ == "__main__":`; actor'
        " processes import this script when they start, so put the training code under that"
        " guard"
    )


def _episode_returns(run_dir: str) -> list[float]:
    """The returns in RUN_DIR/episodes.csv, oldest first ([] before the first episode)."""
    try:
        with open(os.path.join(run_dir, "episodes.csv"), newline="") as f:
            return [float(row["return"]) for row in csv.DictReader(f)]
    except FileNotFoundError:
        return []


def _train_result(run_dir: str, base: type[Config], seconds: float) -> TrainResult:
    checkpoint, _, _ = load_latest_checkpoint(run_dir)
    config = config_from_dict(checkpoint["config"], base)
    step = int(checkpoint["step"])
    returns = _episode_returns(run_dir)
    recent = returns[-RETURN_WINDOW:]
    # polybeast's learners each train total_steps // num_learners steps.
    learners = getattr(config, "num_learners", 1)
    return TrainResult(
        run_dir=run_dir,
        step=step,
        num_updates=int(checkpoint["progress"]["num_updates"]),
        episodes=len(returns),
        mean_return=sum(recent) / len(recent) if recent else math.nan,
        seconds=seconds,
        finished=step >= config.total_steps // learners * learners,
        config=config,
    )


def train(
    config: Config | Mapping[str, Any] | str | os.PathLike | None = None,
    *,
    polybeast: bool = False,
    **flags: Any,
) -> TrainResult:
    """Train one run, as `python monobeast.py` (or `polybeast.py`) with these flags.

    Args:
        config: a Config (flags replace its values), a dict of flags, or a YAML file of
            them (`--config`); None: the defaults and the tuned file for `env`.
        polybeast: run on Ray (polybeast.py's flags; a PolyConfig implies it).
        **flags: any flag by its name, `total_steps=100_000`; `env` may be an env class
            or a function returning a gymnasium.Env, `model` an nn.Module class or
            factory, each defined at module level of an importable module or of the
            running script (docs/api.md).

    Raises:
        ConfigError, EnvError: bad flags, env or model (one line). TrainingError,
        CheckpointError: a run that had to stop.
    """
    _refuse_in_worker()
    base = PolyConfig if polybeast or isinstance(config, PolyConfig) else Config
    run_config = _train_config(config, base, flags)
    _check_main_guard()
    if base is PolyConfig:
        from beast.poly.trainer import train as run
    else:
        from beast.run.runner import train as run
    start = time.monotonic()
    run(run_config)
    return _train_result(run_config.run_dir, base, time.monotonic() - start)


def _saved_flags(run_dir: str) -> dict[str, Any]:
    """The algo and env of the run in `run_dir` (its config.yaml), so that its algorithm's
    flags (`test_epsilon`) are accepted and its env's tuned file is read; {} without one."""
    try:
        with open(os.path.join(run_dir, "config.yaml")) as f:
            saved = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(saved, dict):
        return {}
    return {key: saved[key] for key in ("algo", "env") if isinstance(saved.get(key), str)}


def evaluate(
    run: str | os.PathLike | TrainResult | None = None,
    *,
    xpid: str | None = None,
    savedir: str | os.PathLike | None = None,
    episodes: int = 10,
    seed: int = 0,
    **flags: Any,
) -> EvalResult:
    """Play a saved run's checkpoint for `episodes` episodes, as `--mode test`: the run's
    own env, algorithm and network, its evaluation policy; writes RUN_DIR/test.json.

    Args:
        run: the run directory, or `train`'s result; or give `xpid` (and `savedir`).
        episodes: `--num_test_episodes`.
        seed: seeds the env and torch.
        **flags: `--mode test`'s other flags (`checkpoint="best"`, `record_video=True`,
            `test_epsilon=0.01`).

    Raises:
        ConfigError: no such run, bad flags; EnvError: the run's env cannot be made.
    """
    if isinstance(run, TrainResult):
        run = run.run_dir
    if run is not None:
        if xpid is not None or savedir is not None:
            raise ConfigError(
                "beast.evaluate(): give the run as a directory, or as xpid= (and savedir=),"
                " not both"
            )
        run_dir = os.path.abspath(os.path.expanduser(os.fspath(run)))
        savedir, xpid = os.path.split(run_dir.rstrip(os.sep))
    elif xpid is None:
        raise ConfigError(
            "beast.evaluate(): which run? pass its directory, or xpid= (and savedir=)"
        )
    savedir = os.fspath(savedir) if savedir is not None else Config.savedir
    run_dir = os.path.join(os.path.expanduser(savedir), xpid)
    values = {
        **_saved_flags(run_dir),
        "mode": "test",
        "savedir": savedir,
        "xpid": xpid,
        "num_test_episodes": episodes,
        "seed": seed,
        **flags,
    }
    values = {key: _flag_value(key, value) for key, value in values.items()}
    return test(config_from_flags(values, source="beast.evaluate()"))
