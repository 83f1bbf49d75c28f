"""The LASER loss: V-trace with a trust region (Schmitt, Hessel & Simonyan 2019,
"Off-Policy Actor-Critic with Shared Experience Replay", arXiv:1909.11583).

LASER is IMPALA whose batches mix fresh rollouts with rollouts replayed from a
FIFO (beast/experience/rollout_replay.py, which the `Laser` plug-in below asks for through
its experience; the mixing is the paper's section 3, Proposition 3), plus this
loss. The loss does not know which
rollouts were replayed: it reads the behaviour logits stored with every step,
as IMPALA's loss does. Batch layout, shift and sums: beast/algos/impala.py.

The trust region (section 4) rejects the steps whose data would bias V-trace
too much. Per step, the behaviour relevance function of section 4.3 is

    beta_KL(x_t) = KL(pi(.|x_t) || pi~(.|x_t))
                 = sum_a pi(a|x_t) log(pi(a|x_t) / pi~(a|x_t))
    pi~(a|x)     = min(rho_bar mu(a|x), pi(a|x)) / sum_b min(rho_bar mu(b|x), pi(b|x))

with pi the learner's (target) policy, mu the behaviour policy stored with the
step and pi~ the "implied policy" (eq. 3, Proposition 1; IMPALA's Theorem 1):
V-trace with clipping rho_bar estimates the value of pi~, not of pi. So the KL
is taken from pi to pi~, not between mu and pi: it measures the bias V-trace
brings in at x_t. mu far from pi where pi has little mass costs little (pi~
stays close to pi); mu short of pi on pi's likely actions costs a lot. It is 0
on policy, and always 0 without clipping (rho_bar None: pi~ = pi, V-trace is
then plain importance sampling, unbiased, and nothing is rejected).

A step with beta_KL > `trust_region_threshold` (the paper's b) is rejected
"entirely for all estimates" (section 4.3), which here means:

- policy gradient: the step's term is masked out (impala.policy_gradient_loss's
  mask); its logits get no policy-gradient gradient.
- baseline: the step's term is masked out as well.
- V-trace targets: the step gets importance weight 0, so its TD error is
  dropped and every trace through it is cut: v_t = V(x_t) there, and the step
  before it bootstraps from V(x_t). This is eq. 8's lambda_{pi,mu}(s_t) =
  1[beta(s_t) < b], which "stop[s] the Monte-Carlo bootstraps once they reach
  undesirable state-behaviour pairs".
- entropy: not masked. It regularises pi at x_t and uses no behaviour data.
  (The paper computes the entropy on online data only; our loss does not know
  which steps are online, and keeps IMPALA's entropy over every step.)

Relevance depends on the state and the two policies, never on the sampled
action, so the rejection adds no bias of its own (section 4.3). A threshold of
None or 0 turns the trust region off: the loss is then exactly impala_loss's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from beast.algos import impala
from beast.algos.distributions import ActionDistribution, Categorical
from beast.algos.dtypes import compute_dtype
from beast.algos.impala import Impala, ImpalaArgs, LossOutput
from beast.config import ConfigError, flag
from beast.experience.specs import Experience, Rollouts

__all__ = [
    "Laser",
    "LaserArgs",
    "laser_loss",
    "num_replayed",
    "trust_region_kl",
    "trust_region_mask",
]


@torch.no_grad()
def trust_region_kl(
    behaviour: Mapping[str, Tensor],
    target: Mapping[str, Tensor],
    clip_rho_threshold: float | None = 1.0,
    distribution: ActionDistribution | None = None,
) -> Tensor:
    """``KL(pi || pi~)`` per step, the behaviour relevance of section 4.3.

    Args:
        behaviour: ``mu``'s parameters, ``[T, B, ...]`` each (``policy_logits``
            ``[T, B, A]``; a Gaussian's mean and log-std).
        target: ``pi``'s, likewise.
        clip_rho_threshold: V-trace's ``rho_bar``, which defines ``pi~``; None
            for no clipping (``pi~ = pi``, the KL is 0).
        distribution: the action distribution; default a softmax over
            ``policy_logits``.

    Returns:
        float ``[T, B]``, ``>= 0``, detached, in at least float32: exact for a
        softmax (in log space, finite where probabilities underflow), a Monte
        Carlo estimate for a Gaussian (`ActionDistribution.implied_kl`).
    """
    if distribution is None:
        distribution = Categorical(target["policy_logits"].shape[-1])
    for key in distribution.param_shapes():
        if behaviour[key].shape != target[key].shape:
            raise ValueError(
                f"behaviour {key} {tuple(behaviour[key].shape)} and target"
                f" {tuple(target[key].shape)} differ"
            )
    if clip_rho_threshold is None:
        params = [*target.values(), *behaviour.values()]  # [T, B, ...] each
        dtype = compute_dtype(*params)
        return torch.zeros(params[0].shape[:2], dtype=dtype, device=params[0].device)
    return distribution.implied_kl(behaviour, target, clip_rho_threshold)


def trust_region_mask(kl: Tensor, threshold: float | None) -> Tensor | None:
    """Bool ``[T, B]``, True for the steps kept (``kl <= threshold``); None when
    the trust region is off (threshold None or 0). A NaN KL is rejected."""
    if not threshold:
        return None
    return kl <= threshold


def laser_loss(
    learner_outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    *,
    discounting: float,
    reward_clipping: str,
    baseline_cost: float,
    entropy_cost: float,
    trust_region_threshold: float | None,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    distribution: ActionDistribution | None = None,
) -> LossOutput:
    """IMPALA's loss with LASER's trust region over one learner batch.

    Args:
        learner_outputs, batch, discounting, reward_clipping, baseline_cost,
        entropy_cost, clip_rho_threshold, clip_pg_rho_threshold, distribution: as in
            ``impala.impala_loss``; ``clip_rho_threshold`` also defines the
            implied policy of the trust region.
        trust_region_threshold: the KL bound b; steps above it are rejected as
            the module docstring says (``impala_loss``'s ``keep``). None or 0:
            no step is rejected, and the loss is exactly ``impala_loss``'s.

    Returns:
        ``LossOutput(total_loss, stats)`` with impala_loss's stats (costs
        included; ``mean_rho`` is the mean unclipped importance ratio over all
        steps, rejected ones included) plus detached scalars over the steps
        whose action was taken (a truncated episode's final step is not one):

        - ``mean_kl``: mean per-step ``KL(pi || pi~)`` in nats (computed with
          the trust region off too, as a gauge of how off-policy the batch is).
        - ``masked_fraction``: fraction of steps rejected (0 when off).
    """
    if distribution is None:
        distribution = Categorical(learner_outputs["policy_logits"].shape[-1])
    impala.check_loss_inputs(learner_outputs, batch, distribution)
    _, valid = impala.step_discounts_and_valid(batch, discounting)
    kl = trust_region_kl(
        impala.policy_params(batch, distribution),
        impala.policy_params(learner_outputs, distribution),
        clip_rho_threshold,
        distribution,
    )
    keep = trust_region_mask(kl, trust_region_threshold)
    loss = impala.impala_loss(
        learner_outputs,
        batch,
        discounting=discounting,
        reward_clipping=reward_clipping,
        baseline_cost=baseline_cost,
        entropy_cost=entropy_cost,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        keep=keep,
        distribution=distribution,
    )
    with torch.no_grad():
        # Masked sums, not indexing or a host read: no graph holds a shape or a count
        # that depends on the data.
        num_valid = valid.sum().clamp(min=1).to(kl.dtype)
        rejected = torch.zeros_like(valid) if keep is None else valid & keep.logical_not()
        stats = {
            **loss.stats,
            "mean_kl": torch.where(valid, kl, 0.0).sum() / num_valid,
            "masked_fraction": rejected.to(kl.dtype).sum() / num_valid,
        }
    return LossOutput(total_loss=loss.total_loss, stats=stats)


# The plug-in: IMPALA's, plus the replay of whole rollouts and the trust region.


@dataclass(frozen=True)
class LaserArgs(ImpalaArgs):
    """LASER (Schmitt et al. 2019): IMPALA plus a FIFO replay of whole rollouts mixed into
    every batch (beast/experience/rollout_replay.py) and this module's trust region."""

    replay_ratio: float = flag(
        1.0,
        "Replayed rollouts per fresh rollout in a batch; --batch_size is the total: a batch"
        " replays the nearest integer to batch_size*r/(1+r) rollouts (8 and r=1: 4 fresh + 4"
        " replayed). Batches are all fresh until the replay holds that many. 0: no replay.",
    )
    replay_size: int = flag(
        1000,
        "Rollouts the replay keeps (FIFO), in shared memory: about (unroll_length+1)*obs"
        " bytes each, 2.3 MB for Atari with T=80; the startup line prints the total.",
    )
    trust_region_threshold: float = flag(
        0.5,
        "Trust region: a step whose KL(pi || implied policy) exceeds this is left out of the"
        " policy-gradient and baseline terms and cuts V-trace's traces; 0: off.",
    )


def num_replayed(batch_size: int, replay_ratio: float) -> int:
    """Replayed rollouts per batch (see --replay_ratio); Python's round(), so a tie goes to
    the even count (batch 6 at r=1: 3 + 3; batch 5: 3 fresh + 2)."""
    return round(batch_size * replay_ratio / (1.0 + replay_ratio))


class Laser(Impala):
    """LASER: IMPALA with shared experience replay and a trust region."""

    name = "laser"
    summary = (
        "IMPALA with a FIFO replay of whole rollouts mixed into every batch and a trust"
        " region (Schmitt et al. 2019)."
    )
    Args = LaserArgs

    @classmethod
    def validate(cls, config: Any) -> None:
        ImpalaArgs.check(config)
        ratio, batch_size = config.replay_ratio, config.batch_size
        if ratio < 0:
            raise ConfigError(f"--replay_ratio must be >= 0, got {ratio}")
        if config.trust_region_threshold < 0:
            raise ConfigError(
                f"--trust_region_threshold must be >= 0 (0: off), got"
                f" {config.trust_region_threshold}"
            )
        if config.replay_size <= 0:
            raise ConfigError(f"--replay_size must be positive, got {config.replay_size}")
        if ratio > 0:
            replayed = num_replayed(batch_size, ratio)
            if replayed == 0:
                raise ConfigError(
                    f"--replay_ratio {ratio} replays no rollout of a --batch_size"
                    f" {batch_size} batch ({batch_size}*r/(1+r) rounds to 0);"
                    " raise --batch_size or --replay_ratio"
                )
            if replayed == batch_size:
                raise ConfigError(
                    f"--replay_ratio {ratio} leaves no fresh rollout in a --batch_size"
                    f" {batch_size} batch; lower --replay_ratio or raise --batch_size"
                )
            if config.replay_size < replayed:
                raise ConfigError(
                    f"--replay_size {config.replay_size} is too small: each batch replays"
                    f" {replayed} rollouts, so use --replay_size >= {replayed}"
                )

    def experience(self) -> Experience:
        config = self.config
        replayed = num_replayed(config.batch_size, config.replay_ratio)
        return Rollouts(
            unroll_length=config.unroll_length,
            replay_size=config.replay_size if replayed else 0,
            num_replayed=replayed,
        )

    def loss_fn(self) -> Callable[..., LossOutput]:
        threshold = self.config.trust_region_threshold
        return functools.partial(laser_loss, **self.loss_costs(), trust_region_threshold=threshold)

    def describe(self) -> str:
        threshold = self.config.trust_region_threshold
        return f"trust region {threshold}" if threshold else "no trust region"
