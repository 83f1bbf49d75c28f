"""Action distributions of stochastic policies: one per kind of action space.

An actor-critic algorithm (IMPALA, LASER, PPO, A2C) does not care whether its actions are
indices or float vectors: it needs log pi(a|x), the entropy, and what to store with each
step so that the learner can recompute the behaviour policy mu. Each distribution says
which model outputs parametrise it (`param_shapes`, also stored per step by the acting
policy) and computes those from them:

    Categorical   policy_logits [A]                 discrete actions (an index)
    DiagGaussian  action_mean [d], action_log_std [d]  continuous actions (a float vector)

`action_distribution(spec)` picks by the env's action space. Tensors are time-major,
`[T, B, ...]`, and results `[T, B]`, in the promoted dtype of the parameters, at least
float32 (beast/algos/dtypes.py); actions are taken in the parameters' dtype.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from beast.algos.base import ActingRule
from beast.algos.dtypes import compute_dtype
from beast.algos.policies import CategoricalPolicy, GaussianPolicy

__all__ = ["ActionDistribution", "Categorical", "DiagGaussian", "action_distribution"]

# Samples per step of the Monte-Carlo KL between a Gaussian pi and its implied policy.
IMPLIED_KL_SAMPLES = 32
_LOG_2PI = math.log(2.0 * math.pi)


def _float(x: Tensor) -> Tensor:
    return x.to(compute_dtype(x))


class ActionDistribution(abc.ABC):
    """pi(.|x) from a model's outputs (module docstring)."""

    @abc.abstractmethod
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Model outputs that parametrise the distribution: name -> per-env shape."""

    @abc.abstractmethod
    def log_prob(self, params: Mapping[str, Tensor], actions: Tensor) -> Tensor:
        """log pi(a_t|x_t), [T, B]; differentiable in `params`."""

    @abc.abstractmethod
    def entropy(self, params: Mapping[str, Tensor]) -> Tensor:
        """H(pi(.|x_t)) in nats, [T, B]; differentiable in `params`."""

    @abc.abstractmethod
    def implied_kl(
        self, behaviour: Mapping[str, Tensor], target: Mapping[str, Tensor], rho_bar: float
    ) -> Tensor:
        """KL(pi || pi~) per step, [T, B], detached: pi~(a) is proportional to
        min(rho_bar mu(a), pi(a)), the policy V-trace with clipping rho_bar evaluates
        (LASER's behaviour relevance, beast/algos/laser.py)."""

    @abc.abstractmethod
    def acting_rule(self, explore: bool = True) -> ActingRule:
        """The acting rule: draw from pi (or act with its mode, deterministically, with
        `explore=False`) and store `param_shapes` and the baseline."""


class Categorical(ActionDistribution):
    """softmax(policy_logits) over `num_actions` actions."""

    def __init__(self, num_actions: int) -> None:
        self.num_actions = num_actions

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"policy_logits": (self.num_actions,)}

    def log_prob(self, params: Mapping[str, Tensor], actions: Tensor) -> Tensor:
        log_policy = F.log_softmax(_float(params["policy_logits"]), dim=-1)
        return log_policy.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: Mapping[str, Tensor]) -> Tensor:
        log_policy = F.log_softmax(_float(params["policy_logits"]), dim=-1)
        return -(log_policy.exp() * log_policy).sum(-1)

    @torch.no_grad()
    def implied_kl(
        self, behaviour: Mapping[str, Tensor], target: Mapping[str, Tensor], rho_bar: float
    ) -> Tensor:
        """Exact, in log space: ``log min(rho_bar mu, pi) = min(log rho_bar + log mu, log
        pi)`` stays finite where the probabilities underflow."""
        dtype = compute_dtype(target["policy_logits"], behaviour["policy_logits"])
        log_pi = F.log_softmax(target["policy_logits"].to(dtype), dim=-1)
        log_mu = F.log_softmax(behaviour["policy_logits"].to(dtype), dim=-1)
        log_min = torch.minimum(log_mu + math.log(rho_bar), log_pi)
        log_implied = log_min - torch.logsumexp(log_min, dim=-1, keepdim=True)
        # log pi >= log min and the normaliser is <= 1, so every term is >= 0 up to
        # rounding; the clamp removes rounding's -1e-8s.
        return (log_pi.exp() * (log_pi - log_implied)).sum(-1).clamp(min=0.0)

    def acting_rule(self, explore: bool = True) -> ActingRule:
        return CategoricalPolicy(self.num_actions, explore=explore)


class DiagGaussian(ActionDistribution):
    """N(action_mean, diag(exp(action_log_std))^2) over `dim`-dimensional actions.

    log pi(a|x) = sum_i [-(a_i - m_i)^2 / (2 s_i^2) - log s_i - log(2 pi) / 2]
    H(pi(.|x))  = sum_i [log s_i + (1 + log(2 pi)) / 2]
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"action_mean": (self.dim,), "action_log_std": (self.dim,)}

    def _mean_log_std(self, params: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        return _float(params["action_mean"]), _float(params["action_log_std"])

    def log_prob(self, params: Mapping[str, Tensor], actions: Tensor) -> Tensor:
        mean, log_std = self._mean_log_std(params)
        z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: Mapping[str, Tensor]) -> Tensor:
        _, log_std = self._mean_log_std(params)
        return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)

    @torch.no_grad()
    def implied_kl(
        self, behaviour: Mapping[str, Tensor], target: Mapping[str, Tensor], rho_bar: float
    ) -> Tensor:
        """Monte Carlo over `IMPLIED_KL_SAMPLES` draws a ~ pi per step (no closed form).

        With w(a) = min(rho_bar mu(a) / pi(a), 1), pi~ = pi w / E_pi[w], so
        KL(pi || pi~) = E_pi[-log w] + log E_pi[w], estimated with the same draws (>= 0
        by Jensen's inequality, like the true value). The draws are pi's, not the
        sampled action: the relevance must not depend on the action taken.
        """
        mean, log_std = self._mean_log_std(target)
        draws = mean + log_std.exp() * torch.randn(
            (IMPLIED_KL_SAMPLES, *mean.shape), dtype=mean.dtype, device=mean.device
        )
        log_pi = self.log_prob(target, draws)
        log_mu = self.log_prob(behaviour, draws)
        log_w = torch.clamp(math.log(rho_bar) + log_mu - log_pi, max=0.0)
        mean_w = torch.logsumexp(log_w, dim=0) - math.log(IMPLIED_KL_SAMPLES)
        return (-log_w.mean(0) + mean_w).clamp(min=0.0)

    def acting_rule(self, explore: bool = True) -> ActingRule:
        return GaussianPolicy(self.dim, explore=explore)


def action_distribution(spec: object) -> ActionDistribution:
    """The distribution for an env's action space (`beast.envs.EnvSpec`)."""
    if spec.continuous:
        return DiagGaussian(spec.action_dim)
    return Categorical(spec.num_actions)
