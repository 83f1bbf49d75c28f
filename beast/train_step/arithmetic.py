"""The optimizers' arithmetic inside the compiled step: torch.optim's Adam and RMSprop
steps written out on flat tensors, in torch's order of operations, so that the graph
takes the same step as the eager optimizer (to float tolerance) with no host
synchronisation. Only the hyperparameters beast.train_step.optim builds are implemented; any other
optimizer or setting keeps a run's update eager."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

__all__ = ["Adam", "OptimizerRule", "RMSprop", "rule_for"]


class OptimizerRule(abc.ABC):
    """One optimizer's step on flat tensors, with the hyperparameters of its param group."""

    @property
    @abc.abstractmethod
    def state_names(self) -> tuple[str, ...]:
        """Its state entries besides the step count, each laid out as the parameters."""

    # The settings of torch's optimizer this arithmetic assumes (beast.train_step.optim sets no
    # other): a param group with another value has no compiled step.
    fixed: ClassVar[Mapping[str, Any]]
    # Whether torch keeps the (non-capturable) step count on the CPU whatever the
    # parameter's device (RMSprop), rather than with the parameter (Adam).
    step_count_on_cpu: ClassVar[bool] = False

    @abc.abstractmethod
    def step(
        self, param: Tensor, grad: Tensor, state: Mapping[str, Tensor], count: Tensor, lr: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The new parameters and state entries (by `state_names`) after step `count`
        (a float scalar, counting this one) at learning rate `lr` (a scalar tensor);
        `param`, `grad` and the entries are float [N], one group's slice of the flat
        buffers."""


@dataclass(frozen=True)
class Adam(OptimizerRule):
    """torch.optim.Adam's step (Kingma & Ba 2015, algorithm 1): the new parameters
    and moments."""

    beta1: float
    beta2: float
    eps: float

    fixed: ClassVar[Mapping[str, Any]] = {"weight_decay": 0.0, "amsgrad": False, "maximize": False}

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def step(
        self, param: Tensor, grad: Tensor, state: Mapping[str, Tensor], count: Tensor, lr: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        beta1, beta2 = self.beta1, self.beta2
        # Realised as a pair of scalars that the element loop reads, rather than the powers
        # recomputed for every element.
        step_size, correction2 = torch.stack(
            [lr / (1.0 - beta1**count), torch.sqrt(1.0 - beta2**count)]
        ).to(param.dtype)
        exp_avg = torch.lerp(state["exp_avg"], grad, 1.0 - beta1)
        exp_avg_sq = state["exp_avg_sq"] * beta2 + grad * grad * (1.0 - beta2)
        new_param = param - step_size * (exp_avg / (exp_avg_sq.sqrt() / correction2 + self.eps))
        return new_param, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


@dataclass(frozen=True)
class RMSprop(OptimizerRule):
    """torch.optim.RMSprop's step, uncentered (Hinton's lecture 6e): the new parameters
    and averages (and momentum buffer, with momentum)."""

    alpha: float
    eps: float
    momentum: float

    fixed: ClassVar[Mapping[str, Any]] = {"weight_decay": 0.0, "centered": False, "maximize": False}
    step_count_on_cpu: ClassVar[bool] = True

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("square_avg",) + (("momentum_buffer",) if self.momentum else ())

    def step(
        self, param: Tensor, grad: Tensor, state: Mapping[str, Tensor], count: Tensor, lr: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        square_avg = state["square_avg"] * self.alpha + grad * grad * (1.0 - self.alpha)
        average = square_avg.sqrt() + self.eps
        if self.momentum > 0:
            buffer = state["momentum_buffer"] * self.momentum + grad / average
            return param - lr * buffer, {"square_avg": square_avg, "momentum_buffer": buffer}
        return param - lr * (grad / average), {"square_avg": square_avg}


def rule_for(optimizer: torch.optim.Optimizer) -> OptimizerRule:
    """The compiled arithmetic of `optimizer`'s (single) param group; ValueError saying
    why where there is none."""
    settings: dict[str, Any] = optimizer.param_groups[0]
    rule: OptimizerRule
    if isinstance(optimizer, torch.optim.Adam):
        beta1, beta2 = settings["betas"]
        rule = Adam(beta1=beta1, beta2=beta2, eps=settings["eps"])
    elif isinstance(optimizer, torch.optim.RMSprop):
        rule = RMSprop(alpha=settings["alpha"], eps=settings["eps"], momentum=settings["momentum"])
    else:
        raise ValueError(f"there is no compiled step for {type(optimizer).__name__}")
    for key, value in rule.fixed.items():
        if settings.get(key, value) != value:
            raise ValueError(f"there is no compiled step for {key}={settings[key]}")
    return rule
