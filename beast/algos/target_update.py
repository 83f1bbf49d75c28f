"""The update every Q-learner builds on (R2D2's sequences, the DQN family's transitions):
an online network, a target network that follows it every `target_update_period`
applied updates, the optimizer step, and the checkpoint state of all three.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from beast.algos.base import LearnerContext, OptimizerUpdate, UpdateInfo, require_one_batch
from beast.experience.contract import Batch
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
    tau: float = 1.0  # how far each target update moves the target (1: a copy)

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

    @abc.abstractmethod
    def step_inputs(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The loss's inputs from `batch` (a block's too: `split_block` cuts them), and
        stats to report before each step's own."""

    def __call__(self, batch: Batch) -> UpdateInfo:
        require_one_batch(batch)
        return self.block(batch)[0]

    def block(self, batch: Batch) -> list[UpdateInfo]:
        """One optimizer step on each batch of `batch` (one, or a block's), in one call of
        the train step. The target network moves `tau` of the way to the online one
        (1: a copy) after every `target_update_period`-th applied step (a step skipped as
        non-finite inside a block counts as applied for the rest of that block:
        `TrainStep.steps` takes the block's taus before it runs)."""
        inputs, stats = self.step_inputs(batch)
        period = self.target_update_period
        taus = [
            self.tau if (self.num_updates + i + 1) % period == 0 else None
            for i in range(batch.parts)
        ]
        infos = []
        for result in self.train_step.steps(inputs, train=("model",), taus=taus):
            step_stats = {**stats, **result.stats}
            if result.applied:
                self.num_updates += 1
                infos.append(UpdateInfo(stats=step_stats, priorities=result.priorities))
            else:
                infos.append(UpdateInfo(stats=step_stats))
        return infos

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
