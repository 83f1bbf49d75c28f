"""What an algorithm hands its `TrainStep` (beast/train_step/__init__.py), and what a
step hands back: the loss's outputs, the optimizers with what they train, and the
target networks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ParameterGroup", "StepLoss", "StepResult", "TargetNetwork", "Train"]


class StepLoss(NamedTuple):
    """What a loss returns.

    total: the scalar to minimise (the sum of every trained group's loss: one backward
        pass serves all the optimizers).
    stats: detached scalars for the run log.
    priorities: float [B] new priorities of a prioritized replay's samples, or None.
    proceed: a bool scalar; False skips this step without counting it as non-finite
        (PPO's KL early stop), or None.
    """

    total: Tensor
    stats: dict[str, Tensor]
    priorities: Tensor | None = None
    proceed: Tensor | None = None


class StepResult(NamedTuple):
    """What a step did: `applied` (False: skipped, non-finite or not `proceed`),
    `stopped` (the loss said not to proceed), the loss's stats and priorities."""

    applied: bool
    stopped: bool
    stats: dict[str, Tensor]
    priorities: Tensor | None


@dataclass(frozen=True)
class ParameterGroup:
    """An optimizer and the parameters it trains (its single param group's)."""

    name: str
    optimizer: torch.optim.Optimizer

    @property
    def parameters(self) -> list[nn.Parameter]:
        return list(self.optimizer.param_groups[0]["params"])


@dataclass(frozen=True)
class TargetNetwork:
    """A target network whose parameters follow `online`'s, pairwise in
    `parameters()` order: moved `tau` of the way at each averaging step (1: copied).
    Floating-point buffers are averaged too (a normaliser's statistics), others copied."""

    target: nn.Module
    online: nn.Module


# A kind of step: the names of the groups it trains (its graph's one static choice).
Train = tuple[str, ...]
