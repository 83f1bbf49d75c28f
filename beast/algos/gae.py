"""Generalized advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
Control Using Generalized Advantage Estimation", eq. 16), with beast's episode ends.

For the transition out of x_t (action a_t, reward r_t, next observation x_{t+1}):

    delta_t = r_t + gamma * (1 - terminated_t) * V(x_{t+1}) - V(x_t)
    A_t     = delta_t + gamma * lambda * (1 - terminated_t) * A_{t+1}

with A_T = 0 past the last transition, so the last one bootstraps from V(x_T) alone.

Episode ends, as rollouts carry them (beast/envs/batch.py):

- termination (terminated_t): x_{t+1} is already the next episode's first observation;
  a terminal state has value 0, so nothing bootstraps across it and the trace stops.
- truncation (a time limit): x_{t+1} is the episode's FINAL observation, flagged
  truncated_{t+1}; delta_t bootstraps from V(final observation), as the episode would
  have gone on. No action is taken from a final observation (the env resets instead), so
  step t+1 is no transition: its advantage is 0, which also stops the trace of A_t.

Shapes are time-major: T transitions of B envs. Dtypes (beast/algos/dtypes.py): the
promoted dtype of rewards and values, at least float32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from beast.algos.backward_scan import discounted_backward_scan
from beast.algos.dtypes import compute_dtype

__all__ = ["GAE", "generalized_advantages"]


class GAE(NamedTuple):
    """advantages: float [T, B], A_t (0 where step t is no transition); returns: float
    [T, B], A_t + V(x_t), the value targets (V(x_t) where step t is no transition)."""

    advantages: Tensor
    returns: Tensor


@torch.no_grad()
def generalized_advantages(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    *,
    discount: float,
    lambda_: float,
) -> GAE:
    """GAE(gamma, lambda) over a time-major batch (module docstring).

    Args:
        rewards: float [T, B], r_t, the reward of the transition out of x_t.
        values: float [T+1, B], V(x_t) for t = 0..T (V(x_T) bootstraps the last one).
        terminated: bool [T, B], the transition out of x_t ended its episode in a
            terminal state.
        truncated: bool [T+1, B], x_t is a time-limited episode's final observation (no
            transition leaves it).
        discount: gamma in [0, 1].
        lambda_: lambda in [0, 1]; 0 gives one-step TD errors, 1 Monte-Carlo returns
            minus values.

    Returns:
        `GAE(advantages, returns)`, float [T, B] each, detached, in at least float32.
    """
    T = rewards.shape[0]
    if values.shape[0] != T + 1 or truncated.shape[0] != T + 1:
        raise ValueError(
            f"values and truncated need T+1 = {T + 1} rows, got {values.shape[0]} and"
            f" {truncated.shape[0]}"
        )
    if not (0.0 <= discount <= 1.0 and 0.0 <= lambda_ <= 1.0):
        raise ValueError(f"discount and lambda_ must be in [0, 1], got {discount}, {lambda_}")
    dtype = compute_dtype(rewards, values)
    rewards, values = rewards.to(dtype), values.to(dtype)
    continues = terminated.logical_not().to(dtype)  # [T, B]
    valid = truncated[:-1].logical_not().to(dtype)  # step t is a transition
    deltas = (rewards + discount * continues * values[1:] - values[:-1]) * valid
    # A_t = delta_t + (gamma lambda (1 - terminated_t) valid_t) A_{t+1}: the trace is cut
    # where the episode ended and where step t is no transition.
    advantages = discounted_backward_scan(discount * lambda_ * continues * valid, deltas)
    return GAE(advantages=advantages, returns=advantages + values[:-1])
