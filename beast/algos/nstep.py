"""n-step returns and their bootstrapped targets, for a transition's window of k <= n
rewards (the DQN family, DDPG/TD3/SAC; Hessel et al. 2018, eq. 2):

    G = sum_{i<k} gamma^i r_{s+1+i}        y = G + gamma^k v(x_{s+k})   (G alone when terminal)

Pure functions; dtypes as beast/algos/dtypes.py says (float32 in, float32 out).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from beast.algos.dtypes import compute_dtype

__all__ = [
    "NStepReturns",
    "bootstrap_targets",
    "n_step_returns",
]


class NStepReturns(NamedTuple):
    """``G`` and ``gamma^k`` per transition, float [B] each, of one dtype."""

    returns: Tensor
    discounts: Tensor


def n_step_returns(rewards: Tensor, n_steps: Tensor, discounting: float) -> NStepReturns:
    """``G = sum_{i<k} gamma^i r_{s+1+i}`` and ``gamma^k`` (module docstring).

    Args:
        rewards: float [n, B], the window's rewards (those past k are ignored).
        n_steps: int [B], k in [1, n].
        discounting: gamma in [0, 1].

    Returns:
        `NStepReturns`, [B] each, in rewards' dtype and at least float32; summed in
        float64 whatever that is, so a float32 G is the float64 sum rounded once.
    """
    if not 0.0 <= discounting <= 1.0:
        raise ValueError(f"discounting must be in [0, 1], got {discounting}")
    n = rewards.shape[0]
    steps = torch.arange(n, device=rewards.device).unsqueeze(1)  # [n, 1]
    taken = steps < n_steps.unsqueeze(0)
    powers = torch.pow(torch.full_like(rewards, discounting, dtype=torch.float64), steps)
    returns = torch.where(taken, powers * rewards.double(), 0.0).sum(dim=0)
    discounts = torch.pow(
        torch.tensor(discounting, dtype=torch.float64, device=n_steps.device), n_steps.double()
    )
    dtype = compute_dtype(rewards)
    return NStepReturns(returns.to(dtype), discounts.to(dtype))


def bootstrap_targets(returns: NStepReturns, terminal: Tensor, values: Tensor) -> Tensor:
    """``y = G + gamma^k v`` per transition, ``G`` alone when the window ended in a terminal
    state: float [B]. `values` [B] is what the target bootstraps from at x_{s+k}: Q of the
    greedy action (DQN), the clipped double-Q of the next action (TD3), with SAC's entropy
    bonus (beast/algos/qpg)."""
    continuing = returns.discounts * values
    return returns.returns + torch.where(terminal, torch.zeros_like(continuing), continuing)
