"""What an algorithm hands its `TrainStep` (beast/train_step/__init__.py), and what a
step hands back: the loss's outputs, the optimizers with what they train, and the
target networks."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ParameterGroup", "StepLoss", "StepResult", "TargetNetwork", "Train", "split_block"]


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


def split_block(
    inputs: Mapping[str, Any], parts: int, cut: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """A block of `parts` batches (a replay's --updates_per_sample, laid one after another
    along the batch axis) as that many batches of views: the batch axis is dim 0 of a
    1-D tensor ([B]: weights, step counts, terminal flags) and dim 1 of every other
    ([L, B, ...] rows, [n, B] reward windows, [d0, B, ...] recurrent states). Only the
    inputs named in `cut` are cut (None: every one); every part reads the others whole
    (PPO's batch, which each minibatch's `index` picks from). One part: `inputs` whole."""
    if parts == 1:
        return [dict(inputs)]
    pieces = {
        key: value.chunk(parts, dim=0 if value.dim() == 1 else 1)
        if cut is None or key in cut
        else (value,) * parts
        for key, value in inputs.items()
    }
    return [{key: value[i] for key, value in pieces.items()} for i in range(parts)]
