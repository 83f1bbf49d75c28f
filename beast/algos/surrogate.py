"""PPO's and A2C's per-step losses (beast/algos/ppo.py): the clipped surrogate of the policy
(Schulman et al. 2017, eq. 7), the optionally clipped value loss, and a mean over the
valid steps. Pure functions, each checked against a hand computation
(tests/algos/test_ppo.py)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clipped_surrogate", "masked_mean", "value_loss"]


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over the entries where `mask` (same shape, bool) is set; 0 if none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def clipped_surrogate(log_ratio: Tensor, advantages: Tensor, clip_range: float | None) -> Tensor:
    """Per-step policy loss, to be minimised: ``-min(r A, clip(r, 1 - eps, 1 + eps) A)``
    with ``r = exp(log_ratio)`` (PPO's eq. 7, negated); with ``clip_range`` None, A2C's
    ``-log pi(a|x) A``, whose gradient is the surrogate's at ``r = 1``.

    Args:
        log_ratio: float [N], log pi_theta(a|x) - log mu(a|x) (differentiable).
        advantages: float [N], detached here.
        clip_range: eps, or None for the unclipped policy gradient.

    Returns:
        float [N]. Where the clipped term is the smaller (the ratio has left
        [1 - eps, 1 + eps] in the direction the advantage favours), it is constant in
        theta: that step's gradient is 0.
    """
    advantages = advantages.detach()
    if clip_range is None:
        return -log_ratio * advantages
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def value_loss(
    values: Tensor, returns: Tensor, old_values: Tensor, clip_range_vf: float | None
) -> Tensor:
    """Per-step value loss ``(V - R)^2``, or with ``clip_range_vf`` the larger of that and
    ``(V_old + clip(V - V_old, -eps_V, eps_V) - R)^2``. float [N]."""
    returns = returns.detach()
    loss = (values - returns).square()
    if clip_range_vf is None:
        return loss
    clipped = old_values + (values - old_values).clamp(-clip_range_vf, clip_range_vf)
    return torch.maximum(loss, (clipped - returns).square())
