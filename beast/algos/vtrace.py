"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA", section 4.1).

Pure functions: tensors in, tensors out, every constant an argument. All
tensors are time-major, ``[T, B]`` for per-step quantities and ``[B]`` for the
bootstrap value; any trailing batch shape ``[T, *batch]`` works the same way.

Shapes, as DeepMind's scalable_agent and TorchBeast take them (code and tests
ported from either work here): ``values`` ``[T, *batch]`` and ``bootstrap_value``
``[*batch]`` set the shape of the targets; ``log_rhos``, ``discounts`` and
``rewards`` have the same rank as ``values`` and broadcast against it, so
importance weights ``[T, B, 1]`` serve value heads ``[T, B, C]``. A rank that
does not fit is a `VTraceShapeError` saying which input "must have rank" what.

Dtypes (beast/algos/dtypes.py): the targets have the promoted dtype of the five
inputs, at least float32.

The n-step V-trace target for ``V(x_s)`` (paper eq. 1, with the per-step
discounts ``gamma_t`` that make episode ends possible inside a rollout):

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))
    c_i = lambda * min(c_bar, pi(a_i|x_i) / mu(a_i|x_i))

with ``V(x_T)`` the bootstrap value. The policy-gradient advantage (paper
section 4.2) is ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))`` with ``v_T =
V(x_T)`` and its own clipping threshold ``rho^pg_bar``.

Ratios arrive as ``log_rhos`` because the policies' log-probabilities are
what we have, and their difference is exact where the ratio of two tiny
probabilities would not be.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from beast.algos.backward_scan import discounted_backward_scan
from beast.algos.dtypes import compute_dtype

__all__ = [
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "VTraceShapeError",
    "action_log_probs",
    "from_importance_weights",
    "from_logits",
]


class VTraceReturns(NamedTuple):
    """V-trace targets, both ``[T, B]``, detached.

    vs: the value targets ``v_s``.
    pg_advantages: ``rho^pg_s (r_s + gamma_s v_{s+1} - V(x_s))``.
    """

    vs: Tensor
    pg_advantages: Tensor


class VTraceFromLogitsReturns(NamedTuple):
    """``VTraceReturns`` plus the log-probabilities they came from, all ``[T, B]``, detached.

    log_rhos: ``log pi(a_t|x_t) - log mu(a_t|x_t)`` (unclipped).
    behavior_action_log_probs: ``log mu(a_t|x_t)``.
    target_action_log_probs: ``log pi(a_t|x_t)``.
    """

    vs: Tensor
    pg_advantages: Tensor
    log_rhos: Tensor
    behavior_action_log_probs: Tensor
    target_action_log_probs: Tensor


class VTraceShapeError(ValueError, RuntimeError):
    """Inputs whose shapes do not fit together (module docstring).

    A ValueError, as scalable_agent raises for a wrong rank ("must have rank"),
    and a RuntimeError, as TorchBeast's ``torch.cat`` raises for the same mistake
    ("same number of dimensions"), so that tests ported from either still hold.
    """


def _check_shapes(
    log_rhos: Tensor, discounts: Tensor, rewards: Tensor, values: Tensor, bootstrap_value: Tensor
) -> None:
    """Raise `VTraceShapeError` unless the shapes fit (module docstring)."""
    rank = log_rhos.dim()
    if rank < 1:
        raise VTraceShapeError("log_rhos must have rank >= 1 ([T, ...]), got a scalar")
    per_step = (("values", values), ("discounts", discounts), ("rewards", rewards))
    for name, tensor in per_step:
        if tensor.dim() != rank:
            raise VTraceShapeError(
                f"{name} must have rank {rank}, as log_rhos {tuple(log_rhos.shape)} has,"
                f" got shape {tuple(tensor.shape)}"
            )
    if bootstrap_value.dim() != rank - 1:
        raise VTraceShapeError(
            f"bootstrap_value must have rank {rank - 1} (values' shape without the time"
            f" axis), got shape {tuple(bootstrap_value.shape)}: values and"
            f" bootstrap_value[None] need the same number of dimensions: got {rank} and"
            f" {bootstrap_value.dim() + 1}"
        )
    if bootstrap_value.shape != values.shape[1:]:
        raise VTraceShapeError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected"
            f" {tuple(values.shape[1:])} (values {tuple(values.shape)} without the time axis)"
        )
    for name, tensor in (("log_rhos", log_rhos), *per_step[1:]):
        fits = all(n in (1, v) for n, v in zip(tensor.shape[1:], values.shape[1:], strict=True))
        if tensor.shape[0] != values.shape[0] or not fits:
            raise VTraceShapeError(
                f"{name} has shape {tuple(tensor.shape)}, which does not fit values"
                f" {tuple(values.shape)}: the same T, and each later dimension equal to"
                " values' or 1"
            )


def action_log_probs(policy_logits: Tensor, actions: Tensor) -> Tensor:
    """``log softmax(policy_logits)[actions]``, differentiable in the logits.

    Args:
        policy_logits: float ``[T, B, A]`` unnormalised log-probabilities.
        actions: integer ``[T, B]`` action indices in ``[0, A)``.

    Returns:
        ``[T, B]`` log-probabilities, in at least float32.
    """
    if policy_logits.shape[:-1] != actions.shape:
        raise ValueError(
            f"policy_logits {tuple(policy_logits.shape)} and actions "
            f"{tuple(actions.shape)} disagree on the leading dimensions"
        )
    log_probs = F.log_softmax(policy_logits.to(compute_dtype(policy_logits)), dim=-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def from_importance_weights(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance ratios (paper eq. 1 and section 4.2).

    Args:
        log_rhos: float32 ``[T, B]``, ``log pi(a_t|x_t) - log mu(a_t|x_t)``
            (or ``[T, B, 1]`` etc.: see the shapes in the module docstring).
        discounts: float32 ``[T, B]``, ``gamma_t``, the discount applied to
            what follows step t; 0 where the transition out of ``x_t`` ended
            the episode.
        rewards: float32 ``[T, B]``, ``r_t``, received on the transition
            ``x_t -> x_{t+1}``.
        values: float32 ``[T, B]``, ``V(x_t)``.
        bootstrap_value: float32 ``[B]``, ``V(x_T)``.
        clip_rho_threshold: ``rho_bar`` for ``delta_t V``; None for no clipping.
        clip_pg_rho_threshold: ``rho^pg_bar`` for the advantages; None for no
            clipping.
        lambda_: the trace-cutting factor in ``c_i`` (paper remark 2); 1 is
            plain V-trace, 0 the one-step target.
        clip_c_threshold: ``c_bar``; None for no clipping. The paper assumes
            ``c_bar <= rho_bar``; 1.0 is what the paper's experiments,
            scalable_agent and TorchBeast use.

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, each of ``values``' shape,
        detached, in at least float32 (float64 if any input is float64).

    Raises:
        VTraceShapeError: shapes that do not fit (module docstring).

    The sum over t runs as a doubling scan (``ceil(log2 T)`` rounds). With
    ``c_bar <= 1``, ``lambda <= 1`` and ``gamma <= 1`` every trace product is
    at most 1, so nothing can overflow. Without clipping (``clip_c_threshold=None``)
    products of large ratios can overflow float32, as they would in the
    reverse loop.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    dtype = compute_dtype(log_rhos, discounts, rewards, values, bootstrap_value)
    log_rhos, discounts, rewards, values, bootstrap_value = (
        t.to(dtype) for t in (log_rhos, discounts, rewards, values, bootstrap_value)
    )

    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = lambda_ * (rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold))

    # V(x_{t+1}) for t = 0..T-1.
    values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    vs = values + discounted_backward_scan(discounts * cs, deltas)

    # v_{s+1} for s = 0..T-1, with v_T = V(x_T).
    vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
    pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


@torch.no_grad()
def from_logits(
    behavior_policy_logits: Tensor,
    target_policy_logits: Tensor,
    actions: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace targets for softmax policies given as logits.

    Args:
        behavior_policy_logits: float32 ``[T, B, A]``, ``mu``'s logits at
            ``x_t``, as the actor computed them.
        target_policy_logits: float32 ``[T, B, A]``, ``pi``'s logits at
            ``x_t``, as the learner computes them.
        actions: int64 ``[T, B]``, ``a_t``, sampled from ``mu``.
        discounts, rewards, values, bootstrap_value, clip_rho_threshold,
        clip_pg_rho_threshold, lambda_, clip_c_threshold: as in
            ``from_importance_weights``.

    Returns:
        ``VTraceFromLogitsReturns``, every field ``[T, B]`` and detached:
        these are targets; the policy-gradient loss takes its gradient from
        the logits itself.
    """
    if behavior_policy_logits.shape != target_policy_logits.shape:
        raise ValueError(
            f"behavior_policy_logits {tuple(behavior_policy_logits.shape)} and "
            f"target_policy_logits {tuple(target_policy_logits.shape)} differ"
        )
    target_log_probs = action_log_probs(target_policy_logits, actions)
    behavior_log_probs = action_log_probs(behavior_policy_logits, actions)
    log_rhos = target_log_probs - behavior_log_probs
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
        clip_c_threshold=clip_c_threshold,
    )
    return VTraceFromLogitsReturns(
        vs=vtrace_returns.vs,
        pg_advantages=vtrace_returns.pg_advantages,
        log_rhos=log_rhos,
        behavior_action_log_probs=behavior_log_probs,
        target_action_log_probs=target_log_probs,
    )
