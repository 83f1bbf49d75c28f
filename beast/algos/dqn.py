"""The DQN family on a transition replay: DQN with its Rainbow ingredients, C51, Rainbow.

DQN: Mnih et al. 2015. Double Q-learning: van Hasselt et al. 2016. Dueling networks:
Wang et al. 2016. Prioritized replay: Schaul et al. 2016. n-step returns and Rainbow:
Hessel et al. 2018 (here without noisy nets). Categorical DQN (C51): Bellemare et al.
2017. Pure functions first (tensors in, tensors out, every constant an argument), then
the plug-ins (beast/algos/base.py).

A batch (beast/transition_replay.py) holds B transitions, each as two rows, ``[2, B]``:
the step s it starts at and its bootstrap step s + k, with

    n_step_rewards  float [n, B]  r_{s+1} ... r_{s+n}, 0 past the k rewards taken
    n_steps         int   [B]     k <= n: fewer than n where the episode ended
    terminal        bool  [B]     the window ended in a terminal state

The n-step return and its targets (Hessel et al. 2018, eq. 2, with double Q):

    G   = sum_{i<k} gamma^i r_{s+1+i}
    y   = G + gamma^k Q(x_{s+k}, a*; theta-)           (G alone when terminal)
    a*  = argmax_a Q(x_{s+k}, a; theta)   double Q
        = argmax_a Q(x_{s+k}, a; theta-)  otherwise (DQN's max)

and, for a distributional agent over the fixed support z_1 < ... < z_N (C51), the
target distribution is the return distribution at (x_{s+k}, a*) under theta-, shifted
and shrunk by ``G + gamma^k z_j`` (G alone when terminal), clipped to [z_1, z_N] and
projected back onto the support (Bellemare et al. 2017, algorithm 1: each atom's mass
split between its two neighbours in proportion to closeness).

Dtypes (beast/algos/dtypes.py): the pure functions return the promoted dtype of their
float inputs, at least float32: float32 in, float32 out; float64 in, float64 out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from beast.algos.base import (
    Algorithm,
    Batch,
    Experience,
    LearnerContext,
    Policy,
    TransitionReplay,
    Update,
    UpdateInfo,
    as_outputs,
)
from beast.algos.distributional import categorical_projection
from beast.algos.dtypes import compute_dtype
from beast.algos.impala import REWARD_CLIPPING_MODES, clip_rewards
from beast.algos.nstep import NStepReturns, bootstrap_targets, n_step_returns
from beast.algos.policies import EpsilonGreedyPolicy
from beast.algos.target_update import TargetNetworkUpdate
from beast.algos.value_rescaling import (
    DEFAULT_RESCALE_EPS,
    inverse_value_rescaling,
    value_rescaling,
)
from beast.config import ConfigError, flag, require_fraction, require_nonnegative, require_positive
from beast.fields import index_inputs, model_inputs
from beast.models import build_q_model
from beast.optim import build_optimizer
from beast.train_step import StepLoss

__all__ = [
    "C51",
    "DQN",
    "C51Args",
    "DQNArgs",
    "ExplorationSchedule",
    "QLossOutput",
    "Rainbow",
    "RainbowArgs",
    "TransitionQUpdate",
    "categorical_loss",
    "linear_epsilon",
    "q_learning_targets",
    "q_loss",
]

LOSSES = ("huber", "mse")
EXPLORATION = ("linear", "per_env")


def _greedy_actions(next_online: Tensor | None, next_target: Tensor) -> Tensor:
    """a* [B]: the online network's greedy action (double Q), else the target's."""
    chooser = next_target if next_online is None else next_online
    return chooser.detach().argmax(dim=-1)


@torch.no_grad()
def q_learning_targets(
    returns: NStepReturns,
    terminal: Tensor,
    next_target_q: Tensor,
    next_online_q: Tensor | None,
    *,
    rescale_eps: float | None = None,
) -> Tensor:
    """y = G + gamma^k Q(x_{s+k}, a*; theta-), G alone when terminal: float [B].

    Args:
        returns: `n_step_returns`.
        terminal: bool [B].
        next_target_q: float [B, A], Q(x_{s+k}, .; theta-).
        next_online_q: float [B, A], Q(x_{s+k}, .; theta) to pick a* (double Q), or None
            for DQN's max over the target network.
        rescale_eps: learn h(Q) (Pohlen et al. 2018; Ape-X): y = h(G + gamma^k
            h^-1(Q')), with Q' in h's space; None for none.

    Returns:
        y in the promoted dtype of the returns and next_target_q, at least float32.
    """
    best = _greedy_actions(next_online_q, next_target_q)
    bootstrap = next_target_q.gather(-1, best.unsqueeze(-1)).squeeze(-1)
    bootstrap = bootstrap.to(compute_dtype(bootstrap))
    if rescale_eps is not None:
        bootstrap = inverse_value_rescaling(bootstrap, rescale_eps)
    targets = bootstrap_targets(returns, terminal, bootstrap)
    if rescale_eps is not None:
        targets = value_rescaling(targets, rescale_eps)
    return targets


class QLossOutput(NamedTuple):
    """What a loss hands the learner: the scalar to minimise, detached stats, and each
    sample's new priority (before the replay's exponent), float [B]."""

    total_loss: Tensor
    stats: dict[str, Tensor]
    priorities: Tensor


def q_loss(
    q_taken: Tensor, targets: Tensor, weights: Tensor, *, loss: str = "huber"
) -> QLossOutput:
    """``mean_b w_b * l(y_b - Q(x_s, a_s))``, l the Huber loss (delta 1, DQN's gradient
    clipping) or 0.5 d^2; priority |y - Q|.

    Args:
        q_taken: float [B], Q(x_s, a_s; theta), differentiable.
        targets: float [B], y (no gradient).
        weights: float [B], importance weights (1 for a uniform replay, 0 to ignore).

    The TD errors are computed in the promoted dtype of q_taken and targets, at least
    float32.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    dtype = compute_dtype(q_taken, targets)
    q_taken, targets = q_taken.to(dtype), targets.detach().to(dtype)
    td = targets - q_taken
    if loss == "huber":
        per_sample = F.smooth_l1_loss(q_taken, targets, reduction="none")
    else:
        per_sample = 0.5 * td.pow(2)
    total = (weights * per_sample).mean()
    priorities = td.detach().abs()
    stats = {
        "total_loss": total.detach(),
        "mean_q": q_taken.detach().mean(),
        "mean_target": targets.mean(),
        "mean_abs_td": priorities.mean(),
    }
    return QLossOutput(total, stats, priorities)


def categorical_loss(
    logits_taken: Tensor, target_probs: Tensor, weights: Tensor, support: Tensor
) -> QLossOutput:
    """``mean_b w_b * -sum_j m_j log p_j(x_s, a_s)``: the cross-entropy to the projected
    target (C51); each sample's priority is its cross-entropy (Rainbow's KL up to the
    target's entropy, which does not depend on theta).

    Args:
        logits_taken: float [B, N], the online logits at (x_s, a_s), differentiable.
        target_probs: float [B, N], `categorical_projection`.
        weights: float [B].
        support: float [N].

    The cross-entropies are computed in the promoted dtype of logits_taken and
    target_probs, at least float32.
    """
    log_probs = F.log_softmax(logits_taken.to(compute_dtype(logits_taken, target_probs)), dim=-1)
    cross_entropy = -(target_probs.detach() * log_probs).sum(dim=-1)
    total = (weights * cross_entropy).mean()
    with torch.no_grad():
        q_taken = (log_probs.exp() * support).sum(dim=-1)
        stats = {
            "total_loss": total.detach(),
            "mean_q": q_taken.mean(),
            "mean_target": (target_probs * support).sum(dim=-1).mean(),
            "mean_cross_entropy": cross_entropy.detach().mean(),
        }
    return QLossOutput(total, stats, cross_entropy.detach())


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """epsilon at env step `step`: from `start` to `end` linearly over `decay_steps`, then
    `end` (DQN's schedule; Stable-Baselines3's exploration_fraction * total steps)."""
    if decay_steps <= 0:
        return end
    fraction = min(1.0, max(0, step) / decay_steps)
    return start + fraction * (end - start)


class ExplorationSchedule(nn.Module):
    """A Q-network with the exploration rate its actors act with: a buffer the learner sets
    from the run's env steps before publishing the weights, returned as an output
    ``epsilon [T, B]`` (`EpsilonGreedyPolicy(scheduled=True)` reads it). It travels with
    the weights to every actor, the central server and polybeast's env servers, and is in
    every checkpoint, so a resumed run explores as it would have."""

    def __init__(self, model: nn.Module, epsilon: float) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("epsilon", torch.tensor(float(epsilon)))

    def initial_state(self, batch_size: int, device: Any = None) -> tuple[Tensor, ...]:
        if device is None:
            return self.model.initial_state(batch_size)
        return self.model.initial_state(batch_size, device)

    def forward(self, inputs: Mapping[str, Tensor], core_state: Any = ()) -> Any:
        outputs, core_state = self.model(inputs, core_state)
        outputs = dict(as_outputs(outputs))
        outputs["epsilon"] = self.epsilon.expand(inputs["reward"].shape[:2])
        return outputs, core_state


def _schedule_of(model: nn.Module) -> ExplorationSchedule | None:
    return next((m for m in model.modules() if isinstance(m, ExplorationSchedule)), None)


# The plug-ins: flags, model, acting, experience and update (beast/algos/base.py).


@dataclass(frozen=True)
class DQNArgs:
    """DQN and its ingredients (Double, Dueling, n-step, prioritized replay) on a replay of
    transitions; defaults as Stable-Baselines3's DQN where the papers leave a choice."""

    discounting: float = flag(0.99, "Discount factor gamma.")
    reward_clipping: str = flag(
        "none", "Reward clipping in the targets.", choices=REWARD_CLIPPING_MODES
    )
    replay_size: int = flag(
        100_000,
        "Transitions the replay keeps (each env step once, in its env's ring, in shared"
        " memory); the startup line prints the total.",
    )
    learning_starts: int = flag(1000, "Env steps in the replay before the learner samples.")
    n_step: int = flag(1, "Rewards summed before bootstrapping from the target network.")
    double_q: bool = flag(True, "Double Q-learning: the online network picks the bootstrap action.")
    dueling: bool = flag(True, "The built-in network's dueling head (V + A - mean A).")
    loss: str = flag("huber", "The TD loss: Huber (delta 1) or squared error.", choices=LOSSES)
    prioritized_replay: bool = flag(
        False, "Sample transitions by priority |TD| (Schaul et al. 2016), else uniformly."
    )
    priority_exponent: float = flag(
        0.6, "Prioritized replay: a transition of priority p is drawn with probability ~ p**this."
    )
    importance_sampling_exponent: float = flag(
        0.4, "Prioritized replay: a sample's loss is weighted by (N*P)**-this / max."
    )
    target_update_period: int = flag(
        1000, "Learner updates between target-network updates (see --tau)."
    )
    tau: float = flag(
        1.0,
        "Each target update moves the target network this far towards the online one:"
        " 1 copies it (DQN), < 1 is Polyak averaging.",
    )
    samples_per_insert: float = flag(
        8.0,
        "Transitions the learner samples per env step (batch_size / train_freq in SB3's"
        " terms); actors wait when they run ahead, so the ratio holds whatever the"
        " machine's speed; 0: actors never wait.",
    )
    exploration: str = flag(
        "linear",
        "linear: every env's epsilon follows --eps_start -> --eps_end over"
        " --eps_decay_steps env steps; per_env: Ape-X's fixed spread (--eps_base, --eps_alpha).",
        choices=EXPLORATION,
    )
    eps_start: float = flag(1.0, "--exploration linear: epsilon at step 0.")
    eps_end: float = flag(0.05, "--exploration linear: epsilon after --eps_decay_steps.")
    eps_decay_steps: int = flag(10_000, "--exploration linear: env steps of the decay.")
    eps_base: float = flag(
        0.4,
        "--exploration per_env: env i of all N envs explores with epsilon"
        " eps_base**(1 + eps_alpha*i/(N-1)) (Ape-X).",
    )
    eps_alpha: float = flag(7.0, "--exploration per_env: the spread, see --eps_base.")
    test_epsilon: float = flag(0.001, "--mode test: the greedy policy's epsilon.")
    value_rescaling: bool = flag(
        False,
        "Learn h(Q), h(x) = sign(x)(sqrt(|x|+1)-1) + 0.001x (Pohlen et al. 2018), rather than Q.",
    )
    frame_dedup: bool = flag(
        True,
        "Frame-stacked image observations (Atari): store each frame once and rebuild the"
        " stacks when sampling, about a quarter of the memory; other observations are"
        " stored whole.",
    )

    @staticmethod
    def check(config: Any) -> None:
        require_positive(config, "n_step", "target_update_period", "replay_size", "batch_size")
        if config.n_step > 255:
            raise ConfigError(f"--n_step must be at most 255, got {config.n_step}")
        if config.learning_starts < 0 or config.eps_decay_steps < 0:
            raise ConfigError("--learning_starts and --eps_decay_steps must be >= 0")
        require_fraction(config, "discounting")
        if not 0.0 < config.tau <= 1.0:
            raise ConfigError(f"--tau must be in (0, 1], got {config.tau}")
        require_nonnegative(config, "priority_exponent", "eps_alpha", "samples_per_insert")
        require_fraction(
            config,
            "importance_sampling_exponent",
            "eps_base",
            "eps_start",
            "eps_end",
            "test_epsilon",
        )
        if config.learning_starts > config.replay_size:
            raise ConfigError(
                f"--learning_starts {config.learning_starts} exceeds --replay_size"
                f" {config.replay_size}: learning would never start"
            )
        if config.use_lstm:
            raise ConfigError(
                f"--algo {config.algo} trains a feed-forward Q-network on single transitions;"
                " drop --use_lstm (--algo r2d2 is the recurrent one)"
            )


@dataclass(frozen=True)
class C51Args(DQNArgs):
    """Categorical DQN (Bellemare et al. 2017): a return distribution on a fixed support;
    the paper's agent has no double Q, no dueling head, 1-step targets, a uniform replay."""

    double_q: bool = flag(
        False, "Double Q-learning: the online network picks the bootstrap action."
    )
    dueling: bool = flag(False, "The built-in network's dueling head (V + A - mean A), per atom.")
    num_atoms: int = flag(51, "Atoms of the support of the return distribution.")
    v_min: float = flag(-10.0, "The support's lowest return.")
    v_max: float = flag(10.0, "The support's highest return.")

    @staticmethod
    def check(config: Any) -> None:
        DQNArgs.check(config)
        if config.num_atoms < 2:
            raise ConfigError(f"--num_atoms must be at least 2, got {config.num_atoms}")
        if not config.v_min < config.v_max:
            raise ConfigError(
                f"--v_min {config.v_min} must be below --v_max {config.v_max}: the support"
                " runs from --v_min to --v_max"
            )
        if config.value_rescaling:
            raise ConfigError(f"--algo {config.algo} has no --value_rescaling; drop it")


@dataclass(frozen=True)
class RainbowArgs(C51Args):
    """Rainbow (Hessel et al. 2018) without noisy nets: C51 with double Q, a dueling head,
    3-step returns and prioritized replay (exponent 0.5, importance weights 0.4)."""

    double_q: bool = flag(True, "Double Q-learning: the online network picks the bootstrap action.")
    dueling: bool = flag(True, "The built-in network's dueling head (V + A - mean A), per atom.")
    n_step: int = flag(3, "Rewards summed before bootstrapping from the target network.")
    prioritized_replay: bool = flag(
        True, "Sample transitions by priority (Schaul et al. 2016), else uniformly."
    )
    priority_exponent: float = flag(
        0.5, "Prioritized replay: a transition of priority p is drawn with probability ~ p**this."
    )


class TransitionQUpdate(TargetNetworkUpdate):
    """One update of the DQN family on a batch of transitions:

    1. the online network's forward pass over x_s (with gradient), and over x_{s+k}
       without (only for double Q's a*), and the target network's over x_{s+k};
    2. the loss (`loss_fn`: Q-values or return distributions, targets, importance weights);
    3. the optimizer step (beast/train_step.py: eager or compiled; skipped when not
       finite), and every `target_update_period` applied updates the target network
       moved `tau` of the way to the online one;
    4. the exploration schedule (if any) set from the env steps.
    """

    def __init__(
        self,
        model: nn.Module,
        target_model: nn.Module,
        context: LearnerContext,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[..., QLossOutput],
        *,
        target_update_period: int,
        tau: float,
        prioritized: bool,
        double_q: bool,
        epsilon: Callable[[int], float] | None = None,
    ) -> None:
        self.tau = tau
        self.prioritized, self.double_q = prioritized, double_q
        self.epsilon = epsilon
        self.schedule = _schedule_of(model)
        self._start(model, target_model, context, optimizer, loss_fn, target_update_period)

    def loss(self, data: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        """The loss on a batch's tensors (steps 1-2 of the class docstring)."""
        inputs = model_inputs(data)
        step = index_inputs(inputs, slice(None, 1))
        bootstrap = index_inputs(inputs, slice(1, None))
        with self.context.autocast():
            online, _ = self.model(step, ())
            # Without gradient: the backward pass then covers the B rows the loss trains.
            with torch.no_grad():
                next_online = as_outputs(self.model(bootstrap, ())[0]) if self.double_q else None
                target, _ = self.target_model(bootstrap, ())
        loss = self.loss_fn(
            as_outputs(online), next_online, as_outputs(target), data, data["weights"]
        )
        return StepLoss(loss.total_loss, loss.stats, loss.priorities if self.prioritized else None)

    def __call__(self, batch: Batch) -> UpdateInfo:
        stats: dict[str, Any] = {}
        if self.schedule is not None and self.epsilon is not None:
            value = self.epsilon(self.context.progress.step)
            self.schedule.epsilon.fill_(value)
            stats["epsilon"] = value
        inputs = dict(batch.data)
        inputs["weights"] = (
            batch.weights
            if batch.weights is not None
            else torch.ones(inputs["n_steps"].shape, device=inputs["n_steps"].device)
        )
        return self._step(inputs, tau=self.tau, stats=stats)


def _scaled_returns(
    data: Mapping[str, Tensor], context: LearnerContext, reward_clipping: str, discounting: float
) -> NStepReturns:
    rewards = context.scale_rewards({**data, "reward": data["n_step_rewards"]})
    return n_step_returns(clip_rewards(rewards, reward_clipping), data["n_steps"], discounting)


def _q_values_loss(
    online: Mapping[str, Tensor],
    next_online: Mapping[str, Tensor] | None,
    target: Mapping[str, Tensor],
    data: Mapping[str, Tensor],
    weights: Tensor,
    *,
    context: LearnerContext,
    reward_clipping: str,
    discounting: float,
    rescale_eps: float | None,
    loss: str,
) -> QLossOutput:
    """The Q-value loss: outputs [1, B, ...] at x_s (online) and at x_{s+k} (the online
    network's for double Q, else None; the target network's)."""
    returns = _scaled_returns(data, context, reward_clipping, discounting)
    targets = q_learning_targets(
        returns,
        data["terminal"],
        target["q_values"][0].float(),
        None if next_online is None else next_online["q_values"][0].float(),
        rescale_eps=rescale_eps,
    )
    q = online["q_values"][0].float()  # [B, A]
    q_taken = q.gather(-1, data["action"][0].long().unsqueeze(-1)).squeeze(-1)
    return q_loss(q_taken, targets, weights, loss=loss)


def _distribution_loss(
    online: Mapping[str, Tensor],
    next_online: Mapping[str, Tensor] | None,
    target: Mapping[str, Tensor],
    data: Mapping[str, Tensor],
    weights: Tensor,
    *,
    context: LearnerContext,
    reward_clipping: str,
    discounting: float,
    support: Tensor,
) -> QLossOutput:
    """The distributional loss; the outputs as `_q_values_loss`'s."""
    logits = online["q_logits"][0].float()  # [B, A, N]
    support = support.to(logits.device)
    next_target_probs = target["q_logits"][0].float().softmax(dim=-1)  # [B, A, N]
    chooser = (
        next_target_probs
        if next_online is None
        else next_online["q_logits"][0].float().softmax(dim=-1)
    )
    best = (chooser @ support).argmax(dim=-1)  # [B]
    next_probs = next_target_probs[torch.arange(len(best), device=best.device), best]
    returns = _scaled_returns(data, context, reward_clipping, discounting)
    target_probs = categorical_projection(returns, data["terminal"], next_probs, support)
    actions = data["action"][0].long()
    logits_taken = logits[torch.arange(len(actions), device=actions.device), actions]
    return categorical_loss(logits_taken, target_probs, weights, support)


class DQN(Algorithm):
    """DQN with switches for Double Q, the dueling head, n-step returns and prioritized
    replay, on a transition replay."""

    name = "dqn"
    summary = (
        "DQN with Double Q, dueling head, n-step returns and uniform or prioritized"
        " transition replay (Mnih et al. 2015; Hessel et al. 2018)."
    )
    Args = DQNArgs
    # Q-values regress onto targets whose TD errors, late in training, are as small as
    # bf16's resolution near them (8 mantissa bits: 0.016 at Q = 3): bf16 runs the
    # built-in models' torsos only, their Q-values stay float32 (beast/models/q.py QNet).
    bf16_builtin_only = True
    core_defaults: Mapping[str, Any] = {
        "optimizer": "adam",
        "learning_rate": 1e-4,
        "epsilon": 1.5e-4,
        "lr_schedule": "constant",
        "grad_norm_clipping": 10.0,
        "batch_size": 32,
    }

    @classmethod
    def validate(cls, config: Any) -> None:
        cls.Args.check(config)

    @property
    def num_atoms(self) -> int:
        return 1

    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        return {"q_values": (self.spec.num_actions,)}

    def builtin_model(self) -> nn.Module:
        return build_q_model(
            self.config.model,
            self.spec.model_obs_shape(),
            self.spec.num_actions,
            hidden_size=self.config.hidden_size,
            dueling=self.config.dueling,
            num_atoms=self.num_atoms,
        )

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if self.config.exploration == "linear":
            return ExplorationSchedule(model, self.config.eps_start)
        return model

    def support(self) -> tuple[float, ...] | None:
        return None

    def policy(self, explore: bool = True) -> Policy:
        config = self.config
        return EpsilonGreedyPolicy(
            self.spec.num_actions,
            eps_base=config.eps_base,
            eps_alpha=config.eps_alpha,
            epsilon=None if explore else config.test_epsilon,
            scheduled=config.exploration == "linear",
            support=self.support(),
        )

    def experience(self) -> Experience:
        config = self.config
        return TransitionReplay(
            capacity=config.replay_size,
            min_size=config.learning_starts,
            n_step=config.n_step,
            prioritized=config.prioritized_replay,
            priority_exponent=config.priority_exponent,
            importance_sampling_exponent=config.importance_sampling_exponent,
            samples_per_insert=config.samples_per_insert,
            frame_dedup=config.frame_dedup and self.spec.has_images(),
        )

    def loss_fn(self, context: LearnerContext) -> Callable[..., QLossOutput]:
        config = self.config
        return functools.partial(
            _q_values_loss,
            context=context,
            reward_clipping=config.reward_clipping,
            discounting=config.discounting,
            rescale_eps=DEFAULT_RESCALE_EPS if config.value_rescaling else None,
            loss=config.loss,
        )

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        config = self.config
        return TransitionQUpdate(
            model,
            self.build_model().to(context.device),
            context,
            build_optimizer(config, model),
            self.loss_fn(context),
            target_update_period=config.target_update_period,
            tau=config.tau,
            prioritized=config.prioritized_replay,
            double_q=config.double_q,
            epsilon=functools.partial(
                linear_epsilon,
                start=config.eps_start,
                end=config.eps_end,
                decay_steps=config.eps_decay_steps,
            ),
        )

    def describe(self) -> str:
        config = self.config
        parts = [
            "double Q" if config.double_q else "max Q",
            "dueling" if config.dueling else "single-stream",
            f"{config.n_step}-step",
        ]
        if self.num_atoms > 1:
            parts.append(f"{self.num_atoms} atoms on [{config.v_min:g}, {config.v_max:g}]")
        else:
            parts.append(f"{config.loss} loss")
        if config.exploration == "linear":
            parts.append(
                f"epsilon linear {config.eps_start:g} -> {config.eps_end:g} over"
                f" {config.eps_decay_steps:,} steps"
            )
        else:
            parts.append(f"per-env epsilons {config.eps_base:g}**(1+{config.eps_alpha:g}i/(N-1))")
        target = "copied" if config.tau == 1.0 else f"Polyak tau {config.tau:g}"
        parts.append(f"target {target} every {config.target_update_period:,} updates")
        parts.append(f"{config.samples_per_insert:g} samples per env step")
        return ", ".join(parts)


class C51(DQN):
    """Categorical DQN: a distribution over returns on a fixed support, per action."""

    name = "c51"
    summary = "Categorical (distributional) DQN, C51 (Bellemare et al. 2017), on transition replay."
    Args = C51Args

    @property
    def num_atoms(self) -> int:
        return self.config.num_atoms

    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        return {"q_logits": (self.spec.num_actions, self.config.num_atoms)}

    def support(self) -> tuple[float, ...]:
        config = self.config
        return tuple(torch.linspace(config.v_min, config.v_max, config.num_atoms).tolist())

    def loss_fn(self, context: LearnerContext) -> Callable[..., QLossOutput]:
        config = self.config
        return functools.partial(
            _distribution_loss,
            context=context,
            reward_clipping=config.reward_clipping,
            discounting=config.discounting,
            support=torch.tensor(self.support()),
        )


class Rainbow(C51):
    """Rainbow without noisy nets: C51 with double Q, dueling, n-step and prioritized replay."""

    name = "rainbow"
    summary = (
        "Rainbow (Hessel et al. 2018) without noisy nets: C51 + double Q, dueling, 3-step"
        " returns, prioritized replay."
    )
    Args = RainbowArgs
    core_defaults: Mapping[str, Any] = {**DQN.core_defaults, "learning_rate": 6.25e-5}
