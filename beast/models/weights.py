"""Copying and averaging weights between two networks of one architecture: weight
publishing (learner -> actors) and target networks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "BufferAverager",
    "PolyakAverager",
    "WeightCopier",
    "copy_weights",
    "polyak_update",
]


def copy_weights(destination: nn.Module, source: nn.Module) -> None:
    """Copy `source`'s weights into `destination` in place (shared memory stays shared)."""
    with torch.no_grad():
        for shared, own in zip(
            destination.state_dict().values(), source.state_dict().values(), strict=True
        ):
            shared.copy_(own)


class WeightCopier:
    """`copy_weights(destination, source)` as a call with both models' tensors listed once:
    the learner publishes after every update, and walking two state dicts cost about as
    much as copying a small MLP's weights (0.13 ms of a DQN CartPole update's 1.7).
    Valid while both models keep their tensors (updates, `load_state_dict` and
    `share_memory` all write in place)."""

    def __init__(self, destination: nn.Module, source: nn.Module) -> None:
        self.destination = list(destination.state_dict().values())
        self.source = list(source.state_dict().values())
        if len(self.destination) != len(self.source):
            raise ValueError("the two models have different state dicts")
        self.same_device = all(
            d.device == s.device for d, s in zip(self.destination, self.source, strict=True)
        )

    @torch.no_grad()
    def __call__(self) -> None:
        if self.same_device:
            torch._foreach_copy_(self.destination, self.source)
            return
        for shared, own in zip(self.destination, self.source, strict=True):
            shared.copy_(own)


class PolyakAverager:
    """``theta- <- tau * theta + (1 - tau) * theta-`` for every floating-point parameter and
    buffer of `target` (Lillicrap et al. 2016, DDPG section 7); other buffers (counters)
    are copied. tau = 1 is a hard copy (DQN's periodic target update).

    Both models' tensors are listed once and averaged by one foreach call: SAC and TD3
    average after every update, where walking the state dicts cost as much as the
    arithmetic. Valid while both models keep their tensors (as `WeightCopier`)."""

    def __init__(self, target: nn.Module, online: nn.Module) -> None:
        pairs = list(zip(target.state_dict().values(), online.state_dict().values(), strict=True))
        averaged = [t.is_floating_point() and t.dtype == o.dtype for t, o in pairs]
        self.targets = [t for (t, _), a in zip(pairs, averaged, strict=True) if a]
        self.onlines = [o for (_, o), a in zip(pairs, averaged, strict=True) if a]
        self.other = [pair for pair, a in zip(pairs, averaged, strict=True) if not a]

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        if tau == 1.0:
            torch._foreach_copy_(self.targets, self.onlines)
        elif self.targets:
            torch._foreach_lerp_(self.targets, self.onlines, tau)
        for theirs, mine in self.other:
            if tau == 1.0 or not theirs.is_floating_point():
                theirs.copy_(mine)
            else:
                theirs.lerp_(mine.to(theirs.dtype), tau)


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """One `PolyakAverager` step: `target` moves `tau` of the way to `online`."""
    PolyakAverager(target, online)(tau)


class BufferAverager:
    """Target networks' buffers moved towards their online ones' (floating point: by
    tau; counters: copied), for `targets` that each pair a `target` and an `online`
    module (beast/train_step `TargetNetwork`). Parameters are averaged elsewhere (a
    compiled step's graph, or the eager `PolyakAverager`)."""

    def __init__(self, targets: Sequence[Any]) -> None:
        self.pairs = [
            (mine, theirs)
            for pair in targets
            for mine, theirs in zip(pair.target.buffers(), pair.online.buffers(), strict=True)
        ]

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        for mine, theirs in self.pairs:
            if tau == 1.0 or not mine.is_floating_point():
                mine.copy_(theirs)
            else:
                mine.lerp_(theirs.to(mine.dtype), tau)
