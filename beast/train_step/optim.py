"""Optimizers from the core flags, and the learning-rate schedule every algorithm shares.

`--optimizer rmsprop|adam`, `--learning_rate`, `--alpha`, `--momentum`, `--epsilon`
build one optimizer over the parameters an algorithm passes (several for algorithms
with several, each with its own base rate). `--lr_schedule linear` decays every
optimizer's rate linearly to 0 at `--total_steps` agent steps; the learner's `Stepper`
(beast/learning/learner.py) sets it from the run's step count before every step, so that the
schedule follows experience, not updates, whatever the algorithm's updates per step.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["INITIAL_LR", "build_optimizer", "lr_multiplier"]

# The param-group key holding a group's base learning rate (the rate at step 0).
INITIAL_LR = "initial_lr"


class _DynamoDisabledOnceImported:
    """What one of torch.optim's `torch._disable_dynamo` functions runs: the function
    itself while torch._dynamo is not imported, and torch._dynamo.disable's wrapper of it
    from then on.

    torch imports dynamo at the first call of such a function (every optimizer's
    construction, `zero_grad`, `state_dict`), only to run the function with dynamo's
    frame evaluation turned off. Where dynamo is not imported, no frame can be under it,
    and the import costs 1.0 s of the learner's thread on this project's machine (a PPO
    CartPole race is 11 s). An eager optimizer step or a compiled step's trace imports it
    where one is made; from then on the function runs as torch would run it."""

    def __init__(self, function: Callable[..., Any], recursive: bool) -> None:
        self.function = function
        self.recursive = recursive

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or getattr(dynamo.__spec__, "_initializing", False):
            return self.function(*args, **kwargs)
        disabled = dynamo.disable(self.function, self.recursive, wrapping=False)
        # torch's own cache from now on (setattr: no name mangling inside a class).
        setattr(self.function, "__dynamo_disable", disabled)  # noqa: B010
        return disabled(*args, **kwargs)


# The code of torch's `_disable_dynamo` wrappers (functools.wraps gives each the name of
# what it wraps; the code is theirs alone).
_DISABLE_DYNAMO_CODE = getattr(torch._disable_dynamo(lambda: None), "__code__", None)


def _dynamo_disabled_functions(value: Any, depth: int = 3) -> Iterator[Callable[..., Any]]:
    """The `torch._disable_dynamo` wrappers in `value`: itself, what it wraps, and the
    functions its closure holds (torch.optim's functional `adam` holds one), `depth`
    levels down."""
    if not callable(value) or depth < 0:
        return
    if getattr(value, "__code__", None) is _DISABLE_DYNAMO_CODE:
        yield value
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None:
        yield from _dynamo_disabled_functions(wrapped, depth - 1)
    for cell in getattr(value, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield from _dynamo_disabled_functions(content, depth - 1)


def _defer_dynamo_import() -> None:
    """torch.optim's dynamo-disabled functions run without importing dynamo until
    something else has (`_DynamoDisabledOnceImported`). A torch whose wrappers are made
    otherwise is left as it is: it imports dynamo at the first optimizer, as before."""
    candidates: list[Any] = [
        importlib.import_module(f"torch.optim.{name}").__dict__.get(name)
        for name in ("adam", "rmsprop")
    ]
    for cls in (torch.optim.Optimizer, torch.optim.Adam, torch.optim.RMSprop):
        candidates.extend(vars(cls).values())
    for candidate in candidates:
        for inner in _dynamo_disabled_functions(candidate):
            free = dict(zip(inner.__code__.co_freevars, inner.__closure__ or (), strict=False))
            function, recursive = free.get("fn"), free.get("recursive")
            if function is None or recursive is None:
                continue
            function, recursive = function.cell_contents, recursive.cell_contents
            if getattr(function, "__dynamo_disable", None) is None:
                function.__dynamo_disable = _DynamoDisabledOnceImported(function, recursive)


_defer_dynamo_import()


def build_optimizer(
    config: Any, parameters: nn.Module | Iterable[torch.Tensor], learning_rate: float | None = None
) -> torch.optim.Optimizer:
    """`--optimizer` over `parameters` (a module's, or a list), at `learning_rate` (default
    --learning_rate)."""
    if isinstance(parameters, nn.Module):
        parameters = parameters.parameters()
    lr = config.learning_rate if learning_rate is None else learning_rate
    if config.optimizer == "adam":
        # fused: one kernel for every parameter's update, a fifth of the per-tensor loop's
        # time on the small networks of classic control and MuJoCo (CPU and CUDA alike).
        optimizer: torch.optim.Optimizer = torch.optim.Adam(
            parameters, lr=lr, eps=config.epsilon, fused=True
        )
    else:
        optimizer = torch.optim.RMSprop(
            parameters, lr=lr, alpha=config.alpha, momentum=config.momentum, eps=config.epsilon
        )
    for group in optimizer.param_groups:
        group[INITIAL_LR] = lr
    return optimizer


def lr_multiplier(schedule: str, step: int, total_steps: int) -> float:
    """The schedule's factor at agent step `step`: 1 (constant), or 1 - step/total (linear,
    0 from total_steps on)."""
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - min(step, total_steps) / total_steps
    raise ValueError(f"lr_schedule must be linear or constant, got {schedule!r}")
