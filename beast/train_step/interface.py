"""What an algorithm hands its `TrainStep` (beast/train_step/__init__.py), and what a
step hands back: the loss's outputs, the optimizers with what they train, and the
target networks."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

__all__ = [
    "Kind",
    "ParameterGroup",
    "StepLoss",
    "StepResult",
    "TargetNetwork",
    "Train",
    "kind_of",
    "per_step",
    "split_block",
    "step_trains",
]


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
# A call's kind: a `Train` where every step of the call trains the same groups; where a
# block's steps differ (TD3's delayed actor: the critic alone, then critic and actor),
# the tuple of its steps' Trains, one per step, each of them training some group.
Kind = Train | tuple[Train, ...]


def kind_of(trains: Sequence[Train]) -> Kind:
    """The kind of a call whose steps train `trains`, one `Train` per step: that Train
    where they are all the same, else the steps' Trains. ValueError for a step that
    trains nothing beside one that trains something."""
    first = trains[0]
    if all(train == first for train in trains):
        return first
    if not all(trains):
        raise ValueError(
            f"a block's steps train {list(trains)}: a step that trains nothing (a forward"
            " pass) is a call of its own"
        )
    return tuple(trains)


def per_step(kind: Kind | Sequence[Sequence[str]]) -> bool:
    """Whether `kind` names each step's groups (a sequence of them per step), not the
    groups every step trains."""
    return bool(kind) and not isinstance(kind[0], str)


def step_trains(kind: Kind, parts: int) -> tuple[Train, ...]:
    """What each of the `parts` steps of a call of `kind` trains."""
    if per_step(kind):
        if len(kind) != parts:
            raise ValueError(f"a kind of {len(kind)} steps called with {parts}")
        return kind  # type: ignore[return-value]
    return (kind,) * parts  # type: ignore[return-value]


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
