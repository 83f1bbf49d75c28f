"""The IMPALA loss: V-trace actor-critic (Espeholt et al. 2018, section 4.2).

Batch layout (time-major, ``T + 1`` steps per rollout; step 0 repeats the
last step of the previous rollout). Index t of the batch holds:

    reward          float32 [T+1, B]     received on arriving at obs_t
    terminated      bool    [T+1, B]     the transition into obs_t ended an
                                         episode in a terminal state (obs_t is
                                         already the next episode's first): no
                                         bootstrap across it
    truncated       bool    [T+1, B]     obs_t is the final observation of an
                                         episode cut by a time limit: the
                                         transition into it bootstraps from
                                         V(obs_t); no action is taken from it
                                         (the env resets), so step t trains
                                         nothing (beast/envs/batch.py)
    action          int64   [T+1, B]     taken by the behaviour policy at obs_t
                                         (float32 [T+1, B, d] for continuous actions)
    policy_logits   float32 [T+1, B, A]  behaviour policy logits at obs_t (continuous
                                         actions: action_mean and action_log_std
                                         [T+1, B, d], beast/algos/distributions.py)

and the learner's forward pass over the same steps gives

    policy_logits   float32 [T+1, B, A]  target policy logits at obs_t (or the Gaussian's
                                         parameters)
    baseline        float32 [T+1, B]     V(obs_t)

The loss takes log pi and the entropy from the action distribution
(`beast.algos.distributions`), so V-trace runs on Gaussian log-probabilities for
continuous actions as on softmax ones.

Agent outputs are stored aligned with the observation they were computed
from (TorchBeast stores them shifted by one), so the transition out of
``obs_t`` pairs ``action[t]`` with ``reward[t + 1]`` and ``done[t + 1]``;
``impala_loss`` does that shift and the last step only supplies the
bootstrap value.

Losses are SUMS over time and batch, as in TorchBeast (and scalable_agent),
not means: TorchBeast's tuned learning rates, baseline and entropy costs
(lr 4.8e-4 for T=80, B=8 and so on) assume sums and stay meaningful here.
The price is that the effective step size scales with ``T * B``.

Dtypes (beast/algos/dtypes.py): the loss and its terms have the promoted dtype of
their float inputs (float32 in, float32 out; float64 in, float64 out).

The three terms are small pure functions with an optional ``[T, B]`` mask so
that other losses compose them: ``impala_loss`` itself takes a ``keep`` mask
of steps whose data may train the policy and baseline (LASER's trust region
computes one, beast/algos/laser.py).

Truncation (`step_discounts_and_valid`): the transition out of step t is
discounted by ``gamma * (1 - terminated[t+1])`` and is not a transition at
all when ``truncated[t]``: such a step gets importance weight 0 in V-trace
(``v_t = V(x_t)``, traces cut), so the step before it bootstraps from
``V(final observation)``, and it is left out of every loss term.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beast.algos import vtrace
from beast.algos.actor_critic import ActorCriticAlgorithm, float_forward
from beast.algos.base import LearnerContext, OptimizerUpdate, Update, UpdateInfo
from beast.algos.distributions import ActionDistribution, Categorical
from beast.algos.dtypes import compute_dtype
from beast.config import flag, require_fraction, require_nonnegative
from beast.experience.contract import Batch
from beast.experience.specs import Experience, Rollouts
from beast.fields import core_state, model_inputs
from beast.train_step import ParameterGroup, StepLoss
from beast.train_step.optim import build_optimizer

__all__ = [
    "REWARD_CLIPPING_MODES",
    "ActorCriticUpdate",
    "Impala",
    "ImpalaArgs",
    "LossOutput",
    "baseline_loss",
    "check_loss_inputs",
    "clip_rewards",
    "entropy_loss",
    "impala_loss",
    "policy_gradient_loss",
    "step_discounts_and_valid",
]

REWARD_CLIPPING_MODES = ("abs_one", "none")


class LossOutput(NamedTuple):
    """What a loss hands the learner.

    total_loss: differentiable scalar to minimise.
    stats: detached scalars for logging (see ``impala_loss``).
    """

    total_loss: Tensor
    stats: dict[str, Tensor]


def _apply_mask(per_step: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return per_step
    if mask.shape != per_step.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(per_step.shape)}")
    return per_step * mask.to(per_step.dtype)


def policy_gradient_loss(
    log_probs: Tensor, advantages: Tensor, mask: Tensor | None = None
) -> Tensor:
    """``-sum_{t,b} mask * log pi(a_t|x_t) * A_t``, gradient through ``log_probs`` only.

    Args:
        log_probs: float ``[T, B]``, ``log pi(a_t|x_t)`` of the target policy
            (differentiable).
        advantages: float ``[T, B]``; detached here, they are targets.
        mask: optional bool or float ``[T, B]``; 0 drops a step.

    Returns:
        Scalar.
    """
    return _apply_mask(-log_probs * advantages.detach(), mask).sum()


def baseline_loss(values: Tensor, targets: Tensor, mask: Tensor | None = None) -> Tensor:
    """``0.5 * sum_{t,b} mask * (targets - values)^2``, gradient through ``values`` only.

    Args:
        values: float ``[T, B]``, ``V(x_t)`` (differentiable).
        targets: float ``[T, B]``, e.g. the V-trace ``vs``; detached here.
        mask: optional bool or float ``[T, B]``.

    Returns:
        Scalar.
    """
    return 0.5 * _apply_mask((targets.detach() - values) ** 2, mask).sum()


def entropy_loss(entropy: Tensor, mask: Tensor | None = None) -> Tensor:
    """Negative entropy ``-sum_{t,b} mask * H(pi(.|x_t))``.

    Minimising it raises the policy's entropy (pushes a softmax towards uniform, a
    Gaussian towards a wider one).

    Args:
        entropy: float ``[T, B]``, per-step entropies (differentiable), e.g.
            ``ActionDistribution.entropy``.
        mask: optional bool or float ``[T, B]``.

    Returns:
        Scalar (``<= 0`` for a softmax, whose entropy is never negative).
    """
    return -_apply_mask(entropy, mask).sum()


def clip_rewards(rewards: Tensor, reward_clipping: str) -> Tensor:
    """``"abs_one"``: clamp to ``[-1, 1]`` (the IMPALA Atari setting); ``"none"``: unchanged."""
    if reward_clipping == "abs_one":
        return rewards.clamp(-1.0, 1.0)
    if reward_clipping == "none":
        return rewards
    raise ValueError(
        f"reward_clipping must be one of {REWARD_CLIPPING_MODES}, got {reward_clipping!r}"
    )


def check_loss_inputs(
    learner_outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    distribution: ActionDistribution,
) -> None:
    """Raise ValueError unless the learner outputs and the batch have the layout of
    the module docstring, ``[T+1, B, ...]`` with ``T >= 1``. Shared with LASER."""
    baseline = learner_outputs["baseline"]
    if baseline.dim() != 2 or baseline.shape[0] < 2:
        raise ValueError(f"need baseline [T+1 >= 2, B], got shape {tuple(baseline.shape)}")
    for key in ("reward", "terminated", "truncated"):
        if batch[key].shape != baseline.shape:
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(batch[key].shape)}, "
                f"expected {tuple(baseline.shape)}"
            )
    if batch["action"].shape[:2] != baseline.shape:
        raise ValueError(
            f"batch['action'] has shape {tuple(batch['action'].shape)}, expected"
            f" {tuple(baseline.shape)} first"
        )
    for key, shape in distribution.param_shapes().items():
        expected = (*baseline.shape, *shape)
        for name, source in (("learner_outputs", learner_outputs), ("batch", batch)):
            if tuple(source[key].shape) != expected:
                raise ValueError(
                    f"{name}[{key!r}] has shape {tuple(source[key].shape)}, expected {expected}"
                )


def policy_params(source: Mapping[str, Tensor], distribution: ActionDistribution) -> dict:
    """The distribution's parameters at steps 0..T-1 of `source` (learner outputs or a
    batch, ``[T+1, B, ...]``): the steps whose action the losses score."""
    return {key: source[key][:-1] for key in distribution.param_shapes()}


def step_discounts_and_valid(
    batch: Mapping[str, Tensor], discounting: float, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Per-transition discounts and the steps that train, from the episode-end flags.

    Args:
        batch: ``terminated`` and ``truncated``, bool ``[T+1, B]`` (module docstring).
        discounting: ``gamma``.
        dtype: the discounts' (float64 keeps all of gamma's digits).

    Returns:
        ``discounts`` ``dtype`` ``[T, B]``: ``gamma`` for the transition out of step t,
        0 where it ended the episode in a terminal state (``terminated[t+1]``) or is
        no transition (``truncated[t]``: the env reset instead); and ``valid`` bool
        ``[T, B]``: the steps whose action was taken, ``~truncated[t]``.
    """
    terminated = batch["terminated"][1:]
    valid = batch["truncated"][:-1].logical_not()
    discounts = discounting * (terminated.logical_not() & valid).to(dtype)
    return discounts, valid


def impala_loss(
    learner_outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    *,
    discounting: float,
    reward_clipping: str,
    baseline_cost: float,
    entropy_cost: float,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    keep: Tensor | None = None,
    distribution: ActionDistribution | None = None,
) -> LossOutput:
    """IMPALA's V-trace actor-critic loss over one learner batch.

    Args:
        learner_outputs: ``policy_logits`` float ``[T+1, B, A]`` (or the
            distribution's other parameters) and ``baseline`` float
            ``[T+1, B]``, from the learner's model over the batch
            (differentiable).
        batch: ``reward``, ``terminated``, ``truncated``, ``action``, and the
            behaviour policy's parameters (``policy_logits``...) laid out as in
            the module docstring, ``[T+1, ...]``; other keys ignored.
        discounting: ``gamma``.
        reward_clipping: ``"abs_one"`` or ``"none"``.
        baseline_cost: weight of the baseline loss.
        entropy_cost: weight of the entropy loss.
        clip_rho_threshold: V-trace ``rho_bar``; None for no clipping.
        clip_pg_rho_threshold: V-trace ``rho^pg_bar``; None for no clipping.
        keep: optional bool ``[T, B]``, the steps whose data may train (LASER's
            trust region); a step not kept gets importance weight 0 in V-trace
            (its TD error dropped, every trace through it cut) and is left out
            of the policy-gradient and baseline terms, not of the entropy term.
        distribution: the policy's action distribution; default a softmax over
            ``policy_logits``.

    Returns:
        ``LossOutput(total_loss, stats)``; ``total_loss = pg_loss +
        baseline_loss + entropy_loss``, each a sum over T and B. ``stats``
        holds detached scalars:

        - ``total_loss``, ``pg_loss``, ``baseline_loss``, ``entropy_loss``:
          the terms of the total, costs included.
        - ``mean_rho``: mean UNCLIPPED ratio ``pi(a|x) / mu(a|x)`` over the
          steps whose action was taken (those ``keep`` rejects included), a
          gauge of policy lag (the clipped mean is capped by the threshold and
          hides it).
        - ``rho_clipped_fraction``: fraction of those steps with ``rho >
          clip_rho_threshold`` (0 when the threshold is None).
        - ``mean_entropy``: mean per-step policy entropy in nats, unscaled.
    """
    if distribution is None:
        distribution = Categorical(learner_outputs["policy_logits"].shape[-1])
    check_loss_inputs(learner_outputs, batch, distribution)
    rewards = clip_rewards(batch["reward"][1:], reward_clipping)
    baseline = learner_outputs["baseline"]
    discounts, valid = step_discounts_and_valid(
        batch, discounting, compute_dtype(rewards, baseline)
    )
    target = policy_params(learner_outputs, distribution)
    actions = batch["action"][:-1]
    values = baseline[:-1]
    trained = valid if keep is None else valid & keep
    log_probs = distribution.log_prob(target, actions)

    with torch.no_grad():
        behaviour_log_probs = distribution.log_prob(policy_params(batch, distribution), actions)
        log_rhos = log_probs.detach() - behaviour_log_probs
        # A step that does not train has importance weight 0 (exp(-inf)): v_t = V(x_t).
        vtrace_log_rhos = log_rhos.masked_fill(trained.logical_not(), -torch.inf)
    vtrace_returns = vtrace.from_importance_weights(
        log_rhos=vtrace_log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=baseline[-1],
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )

    pg_loss = policy_gradient_loss(log_probs, vtrace_returns.pg_advantages, trained)
    value_loss = baseline_cost * baseline_loss(values, vtrace_returns.vs, trained)
    entropy = distribution.entropy(target)
    negentropy_loss = entropy_cost * entropy_loss(entropy, valid)
    total_loss = pg_loss + value_loss + negentropy_loss

    with torch.no_grad():
        # Sums over the valid steps by masks, not by indexing (a shape that depends on
        # the data, which no graph holds).
        rhos = torch.where(valid, log_rhos.exp(), 0.0)
        num_valid = valid.sum().clamp(min=1).to(rhos.dtype)
        if clip_rho_threshold is None:
            rho_clipped_fraction = torch.zeros((), dtype=rhos.dtype, device=rhos.device)
        else:
            rho_clipped_fraction = (rhos > clip_rho_threshold).to(rhos.dtype).sum() / num_valid
        stats = {
            "total_loss": total_loss.detach(),
            "pg_loss": pg_loss.detach(),
            "baseline_loss": value_loss.detach(),
            "entropy_loss": negentropy_loss.detach(),
            "mean_rho": rhos.sum() / num_valid,
            "rho_clipped_fraction": rho_clipped_fraction,
            "mean_entropy": -entropy_loss(entropy.detach(), valid) / num_valid,
        }
    return LossOutput(total_loss=total_loss, stats=stats)


# The plug-in: flags, model, acting, experience and update (beast/algos/base.py).


@dataclass(frozen=True)
class ImpalaArgs:
    """IMPALA's loss flags (Espeholt et al. 2018); LASER's add to them."""

    entropy_cost: float = flag(0.01, "Entropy regularisation weight.")
    baseline_cost: float = flag(0.5, "Baseline (value) loss weight.")
    discounting: float = flag(0.99, "Discount factor gamma.")
    reward_clipping: str = flag(
        "abs_one", "Reward clipping in the loss.", choices=REWARD_CLIPPING_MODES
    )

    @staticmethod
    def check(config: Any) -> None:
        require_nonnegative(config, "entropy_cost", "baseline_cost")
        require_fraction(config, "discounting")


class ActorCriticUpdate(OptimizerUpdate):
    """One optimizer step per batch of rollouts on `loss_fn(outputs, batch) -> LossOutput`
    (the IMPALA or LASER loss with its constants bound), through beast/train_step."""

    def __init__(
        self,
        model: nn.Module,
        context: LearnerContext,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], LossOutput],
    ) -> None:
        self.model, self.context, self.optimizer, self.loss_fn = model, context, optimizer, loss_fn
        self.train_step = context.train_step(
            self.loss, modules={"model": model}, groups=[ParameterGroup("model", optimizer)]
        )

    def loss(self, data: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        context = self.context
        outputs = float_forward(self.model, context, model_inputs(data), core_state(data))
        loss = self.loss_fn(outputs, {**data, "reward": context.scale_rewards(data)})
        return StepLoss(loss.total_loss, loss.stats)

    def __call__(self, batch: Batch) -> UpdateInfo:
        return UpdateInfo(stats=self.train_step(batch.data, train=("model",)).stats)


class Impala(ActorCriticAlgorithm):
    """IMPALA: V-trace actor-critic on rollouts from asynchronous actors."""

    name = "impala"
    summary = "V-trace actor-critic (Espeholt et al. 2018) on fixed-length rollouts."
    Args = ImpalaArgs

    @classmethod
    def validate(cls, config: Any) -> None:
        ImpalaArgs.check(config)

    def experience(self) -> Experience:
        return Rollouts(unroll_length=self.config.unroll_length)

    def loss_costs(self) -> dict[str, Any]:
        """The loss's constants from the flags: what IMPALA's and LASER's losses share."""
        config = self.config
        return {
            "discounting": config.discounting,
            "reward_clipping": config.reward_clipping,
            "baseline_cost": config.baseline_cost,
            "entropy_cost": config.entropy_cost,
            "distribution": self.distribution,
        }

    def loss_fn(self) -> Callable[..., LossOutput]:
        return functools.partial(impala_loss, **self.loss_costs())

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        return ActorCriticUpdate(
            model, context, build_optimizer(self.config, model), self.loss_fn()
        )
