"""The numerics of Q-function policy gradients: pure functions, tensors in, tensors out.

Actions here are in the unit box [-1, 1]^d (`to_unit_actions` maps the env's bounds onto
it, `from_unit_actions` back); critics see them there, as Stable-Baselines3's do. For a
batch of B transitions (beast/experience/transition_replay.py: the step x_s, the bootstrap step
x_{s+k}, the n-step return G and its discount gamma^k, `beast.algos.dqn.n_step_returns`):

DDPG (Lillicrap et al. 2016, eq. 5-6), with one critic:

    y = G + gamma^k Q'(x_{s+k}, mu'(x_{s+k}))
    actor:  maximise Q(x_s, mu(x_s))

TD3 (Fujimoto et al. 2018, eq. 10 and 15, algorithm 1), with twin critics:

    a~ = clip(mu'(x_{s+k}) + clip(eps, -c, c), -1, 1),   eps ~ N(0, sigma~^2)
    y  = G + gamma^k min_i Q'_i(x_{s+k}, a~)
    actor (every d critic updates):  maximise Q_1(x_s, mu(x_s))

SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications", eq. 3, 7,
11, 18), with twin critics and a tanh-squashed Gaussian policy:

    a = tanh(u),  u ~ N(m(x), s(x)^2)
    log pi(a|x) = sum_i [log N(u_i; m_i, s_i) - log(1 - tanh(u_i)^2)]
    y  = G + gamma^k (min_i Q'_i(x_{s+k}, a') - alpha log pi(a'|x_{s+k})),  a' ~ pi(.|x_{s+k})
    actor: minimise  alpha log pi(a~|x_s) - min_i Q_i(x_s, a~),  a~ ~ pi(.|x_s) (reparametrised)
    temperature: minimise  -log(alpha) (log pi(a~|x_s) + H~),  H~ = -dim(A) by default

Every bootstrap is dropped when the window ended in a terminal state. The critics regress
on y with ``0.5 sum_i mean_b (Q_i(x_s, a_s) - y)^2``.

Dtypes (beast/algos/dtypes.py): results have the promoted dtype of the float inputs
(float32 in, float32 out; float64 in, float64 out); a 0-dim ``alpha`` or ``log_alpha``
counts as a Python number does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from beast.algos.dtypes import compute_dtype
from beast.algos.nstep import NStepReturns, bootstrap_targets

__all__ = [
    "critic_loss",
    "from_unit_actions",
    "sample_tanh_gaussian",
    "smoothed_target_actions",
    "soft_q_targets",
    "tanh_gaussian_log_prob",
    "td3_targets",
    "temperature_loss",
    "to_unit_actions",
]

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def to_unit_actions(actions: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """Env actions [..., d] in [low, high] -> the unit box: ``2 (a - low) / (high - low) - 1``."""
    return 2.0 * (actions - low) / (high - low) - 1.0


def from_unit_actions(actions: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """Unit-box actions [..., d] -> env actions: ``low + (a + 1) (high - low) / 2``."""
    return low + 0.5 * (actions + 1.0) * (high - low)


def tanh_gaussian_log_prob(pre_tanh: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """log pi(tanh(u)|x) of a tanh-squashed diagonal Gaussian: float [...] (summed over d).

    The change of variables a = tanh(u) subtracts ``log |da/du| = log(1 - tanh(u)^2)``
    per dimension (SAC, appendix C, eq. 21), computed as ``2 (log 2 - u - softplus(-2u))``,
    exact where tanh(u) rounds to +-1 and 1 - tanh(u)^2 to 0.

    Args:
        pre_tanh: u [..., d].
        mean, log_std: the Gaussian's, [..., d].
    """
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z.square() - log_std - 0.5 * _LOG_2PI
    log_det = 2.0 * (_LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))
    return (gaussian - log_det).sum(-1)


def sample_tanh_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """A reparametrised draw ``a = tanh(m + s * noise)`` and its log pi: ([..., d], [...]).

    Differentiable in mean and log_std (the actor's loss flows through the draw); `noise`
    is standard normal [..., d].
    """
    pre_tanh = mean + torch.exp(log_std) * noise
    return torch.tanh(pre_tanh), tanh_gaussian_log_prob(pre_tanh, mean, log_std)


@torch.no_grad()
def soft_q_targets(
    returns: NStepReturns,
    terminal: Tensor,
    next_q: Tensor,
    next_log_prob: Tensor,
    alpha: float | Tensor,
) -> Tensor:
    """SAC's ``y = G + gamma^k (min_i Q'_i(x', a') - alpha log pi(a'|x'))``: float [B].

    Args:
        returns: `n_step_returns` ([B] each).
        terminal: bool [B].
        next_q: float [C, B], the target critics at (x_{s+k}, a'), a' ~ pi(.|x_{s+k}).
        next_log_prob: float [B], log pi(a'|x_{s+k}).
        alpha: the temperature.
    """
    soft_value = next_q.min(dim=0).values - alpha * next_log_prob
    return bootstrap_targets(returns, terminal, soft_value)


@torch.no_grad()
def smoothed_target_actions(
    target_actions: Tensor, noise: Tensor, target_noise: float, noise_clip: float
) -> Tensor:
    """TD3's target policy smoothing: ``clip(a + clip(sigma~ eps, -c, c), -1, 1)`` [B, d].

    Args:
        target_actions: mu'(x_{s+k}) in the unit box, [B, d].
        noise: eps, standard normal [B, d].
        target_noise: sigma~ (0 for DDPG: no smoothing).
        noise_clip: c.
    """
    smoothing = (target_noise * noise).clamp(-noise_clip, noise_clip)
    return (target_actions + smoothing).clamp(-1.0, 1.0)


@torch.no_grad()
def td3_targets(returns: NStepReturns, terminal: Tensor, next_q: Tensor) -> Tensor:
    """``y = G + gamma^k min_i Q'_i(x_{s+k}, a~)``: float [B] (DDPG's with one critic).

    Args:
        next_q: float [C, B], the target critics at the (smoothed) target actions.
    """
    return bootstrap_targets(returns, terminal, next_q.min(dim=0).values)


def critic_loss(q: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
    """``0.5 sum_i mean_b w_b (Q_i(x_s, a_s) - y_b)^2``: the critics' scalar loss.

    Args:
        q: float [C, B], every critic at the stored actions, differentiable.
        targets: float [B], y (no gradient).
        weights: float [B] importance weights, or None for 1.

    Computed in the promoted dtype of q and targets, at least float32.
    """
    squared = (q.to(compute_dtype(q, targets)) - targets.detach().unsqueeze(0)).square()
    if weights is not None:
        squared = squared * weights.unsqueeze(0)
    return 0.5 * squared.mean(dim=1).sum()


def temperature_loss(log_alpha: Tensor, log_probs: Tensor, target_entropy: float) -> Tensor:
    """``-mean_b log(alpha) (log pi(a_b|x_b) + H~)`` (SAC, eq. 18, in log alpha as is usual):
    its gradient in log alpha is ``-(mean log pi + H~)``, so alpha rises while the policy's
    entropy ``-mean log pi`` is below the target H~ and falls while it is above.

    Args:
        log_alpha: the scalar parameter, differentiable.
        log_probs: float [B], log pi of the actor's fresh draws (no gradient taken).
        target_entropy: H~.
    """
    return -(log_alpha * (log_probs.detach() + target_entropy)).mean()
