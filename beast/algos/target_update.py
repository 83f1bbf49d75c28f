"""The update every Q-learner builds on (R2D2's sequences, the DQN family's transitions):
an online network, a target network that follows it every `target_update_period`
applied updates, the optimizer step, and the checkpoint state of all three.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from beast.algos.base import LearnerContext, OptimizerUpdate, UpdateInfo
from beast.models import copy_weights
from beast.train_step import ParameterGroup, TargetNetwork, TrainStep

__all__ = [
    "TargetNetworkUpdate",
]


class TargetNetworkUpdate(OptimizerUpdate):
    """What a Q-learner's checkpoint keeps: its optimizer, its target network and the count
    of applied updates that times the target's updates (R2D2, the DQN family)."""

    optimizer: torch.optim.Optimizer
    target_model: nn.Module
    num_updates: int
    train_step: TrainStep

    def __init__(
        self,
        model: nn.Module,
        target_model: nn.Module,
        context: LearnerContext,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[..., Any],
        *,
        target_update_period: int,
    ) -> None:
        """The state every Q-learner starts from: the target network a frozen copy of the
        online one, no applied update yet, and the optimizer step over `self.loss` (a
        subclass sets what its `loss` reads before calling this)."""
        self.model, self.context, self.optimizer, self.loss_fn = model, context, optimizer, loss_fn
        self.target_model = target_model.requires_grad_(False)
        copy_weights(self.target_model, model)
        self.target_update_period = target_update_period
        self.num_updates = 0  # applied updates, for the target updates
        self.train_step = context.train_step(
            self.loss,
            modules={"model": model, "target": self.target_model},
            groups=[ParameterGroup("model", optimizer)],
            targets=[TargetNetwork(self.target_model, model)],
        )

    def _step(self, inputs: dict[str, Tensor], tau: float, stats: dict[str, Any]) -> UpdateInfo:
        """One optimizer step on `inputs`; every `target_update_period` applied updates the
        target network moves `tau` of the way to the online one (1: a copy). `stats` are
        reported before the step's own."""
        due = (self.num_updates + 1) % self.target_update_period == 0
        result = self.train_step(inputs, train=("model",), tau=tau if due else None)
        stats = {**stats, **result.stats}
        if not result.applied:
            return UpdateInfo(stats=stats)
        self.num_updates += 1
        return UpdateInfo(stats=stats, priorities=result.priorities)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "target_model": self.target_model.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.target_model.load_state_dict(state["target_model"])
        self.num_updates = int(state["num_updates"])
        super().load_state_dict(state)
