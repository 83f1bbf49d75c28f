"""Optimizers from the core flags, and the learning-rate schedule every algorithm shares.

`--optimizer rmsprop|adam`, `--learning_rate`, `--alpha`, `--momentum`, `--epsilon`
build one optimizer over the parameters an algorithm passes (several for algorithms
with several, each with its own base rate). `--lr_schedule linear` decays every
optimizer's rate linearly to 0 at `--total_steps` agent steps; the learner's `Stepper`
(beast/learner.py) sets it from the run's step count before every step, so that the
schedule follows experience, not updates, whatever the algorithm's updates per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["INITIAL_LR", "build_optimizer", "lr_multiplier"]

# The param-group key holding a group's base learning rate (the rate at step 0).
INITIAL_LR = "initial_lr"


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
