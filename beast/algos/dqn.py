"""The DQN family on a transition replay: DQN with its Rainbow ingredients, C51, Rainbow.

DQN: Mnih et al. 2015. Double Q-learning: van Hasselt et al. 2016. Dueling networks:
Wang et al. 2016. Prioritized replay: Schaul et al. 2016. n-step returns and Rainbow:
Hessel et al. 2018 (here without noisy nets). Categorical DQN (C51): Bellemare et al.
2017. Pure functions first (tensors in, tensors out, every constant an argument), then
the plug-ins (beast/algos/base.py).

A batch (beast/experience/transition_replay.py) holds B transitions, each as two rows, ``[2, B]``:
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

from beast.algos.base import LearnerContext, Update, as_outputs
from beast.algos.distributional import categorical_projection
from beast.algos.dtypes import compute_dtype
from beast.algos.nstep import NStepReturns, bootstrap_targets
from beast.algos.q_learning import (
    QLearningAlgorithm,
    QLossOutput,
    check_q_learning_args,
    double_q_values,
    q_values_taken,
    transformed_targets,
)
from beast.algos.replay_args import QLearningArgs, with_default
from beast.algos.target_update import TargetNetworkUpdate
from beast.algos.transitions import (
    ExplorationSchedule,
    check_transition_args,
    find_exploration_schedule,
    scaled_n_step_returns,
)
from beast.config import ConfigError, flag, require_fraction, require_nonnegative
from beast.experience.contract import Batch
from beast.experience.specs import Experience, TransitionReplay
from beast.fields import index_inputs, model_inputs
from beast.train_step import StepLoss

__all__ = [
    "C51",
    "DQN",
    "C51Args",
    "DQNArgs",
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
    chooser = next_target_q if next_online_q is None else next_online_q
    bootstrap = double_q_values(chooser, next_target_q)
    bootstrap = bootstrap.to(compute_dtype(bootstrap))
    return transformed_targets(
        bootstrap, lambda values: bootstrap_targets(returns, terminal, values), rescale_eps
    )


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


# The plug-ins: flags, model, acting, experience and update (beast/algos/base.py).


@dataclass(frozen=True)
class DQNArgs(QLearningArgs):
    """DQN and its ingredients (Double, Dueling, n-step, prioritized replay) on a replay of
    transitions; defaults as Stable-Baselines3's DQN where the papers leave a choice."""

    reward_clipping: str = with_default(QLearningArgs, "reward_clipping", "none")
    replay_size: int = with_default(QLearningArgs, "replay_size", 100_000)
    n_step: int = with_default(QLearningArgs, "n_step", 1)
    target_update_period: int = with_default(QLearningArgs, "target_update_period", 1000)
    priority_exponent: float = with_default(QLearningArgs, "priority_exponent", 0.6)
    importance_sampling_exponent: float = with_default(
        QLearningArgs, "importance_sampling_exponent", 0.4
    )
    # SB3's batch_size / train_freq.
    samples_per_insert: float = with_default(QLearningArgs, "samples_per_insert", 8.0)
    value_rescaling: bool = with_default(QLearningArgs, "value_rescaling", False)
    frame_dedup: bool = with_default(QLearningArgs, "frame_dedup", True)
    learning_starts: int = flag(1000, "Env steps in the replay before the learner samples.")
    double_q: bool = flag(True, "Double Q-learning: the online network picks the bootstrap action.")
    dueling: bool = flag(True, "The built-in network's dueling head (V + A - mean A).")
    loss: str = flag("huber", "The TD loss: Huber (delta 1) or squared error.", choices=LOSSES)
    prioritized_replay: bool = flag(
        False, "Sample transitions by priority |TD| (Schaul et al. 2016), else uniformly."
    )
    tau: float = flag(
        1.0,
        "Each target update moves the target network this far towards the online one:"
        " 1 copies it (DQN), < 1 is Polyak averaging.",
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

    @staticmethod
    def check(config: Any) -> None:
        check_transition_args(
            config, networks="a feed-forward Q-network (--algo r2d2 is the recurrent one)"
        )
        check_q_learning_args(config)
        require_nonnegative(config, "eps_decay_steps")
        require_fraction(config, "eps_start", "eps_end")


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
    priority_exponent: float = with_default(QLearningArgs, "priority_exponent", 0.5)


class TransitionQUpdate(TargetNetworkUpdate):
    """One update of the DQN family on a batch of transitions:

    1. the online network's forward pass over x_s (with gradient), and over x_{s+k}
       without (only for double Q's a*), and the target network's over x_{s+k}
       (`TransitionOutputs`); the n-step returns from the scaled, clipped rewards;
    2. the loss (`loss_fn(outputs, returns, data)`: Q-values or return distributions,
       targets, importance weights `data["weights"]`);
    3. the optimizer step (beast/train_step: eager or compiled; skipped when not
       finite), and every `target_update_period` applied updates the target network
       moved `tau` of the way to the online one;
    4. the exploration schedule (if any) set from the env steps.
    """

    def __init__(
        self,
        *args: Any,
        discounting: float,
        reward_clipping: str,
        tau: float,
        prioritized: bool,
        double_q: bool,
        epsilon: Callable[[int], float] | None = None,
        **kwargs: Any,
    ) -> None:
        """`TargetNetworkUpdate`'s arguments (`loss_fn` returns a `QLossOutput`), and the
        family's: the returns' discount and reward clipping, the targets' tau, whether
        the replay takes priorities, double Q, and the exploration schedule's epsilon at
        an env step."""
        self.discounting, self.reward_clipping, self.tau = discounting, reward_clipping, tau
        self.prioritized, self.double_q = prioritized, double_q
        self.epsilon = epsilon
        super().__init__(*args, **kwargs)
        self.schedule = find_exploration_schedule(self.model)

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
                next_target, _ = self.target_model(bootstrap, ())
        outputs = TransitionOutputs(as_outputs(online), next_online, as_outputs(next_target))
        returns = scaled_n_step_returns(data, self.context, self.discounting, self.reward_clipping)
        loss = self.loss_fn(outputs, returns, data)
        return StepLoss(loss.total_loss, loss.stats, loss.priorities if self.prioritized else None)

    def step_inputs(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The batch's tensors and importance weights (ones for a uniform replay); the
        exploration schedule (step 4) set first, its epsilon reported."""
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
        return inputs, stats


class TransitionOutputs(NamedTuple):
    """The networks' outputs on a batch of transitions, [1, B, ...] each: the online
    network's at x_s, its own at x_{s+k} (double Q; else None) and the target network's at
    x_{s+k}."""

    online: Mapping[str, Tensor]
    next_online: Mapping[str, Tensor] | None
    next_target: Mapping[str, Tensor]


def _q_values_loss(
    outputs: TransitionOutputs,
    returns: NStepReturns,
    data: Mapping[str, Tensor],
    *,
    rescale_eps: float | None,
    loss: str,
) -> QLossOutput:
    """The Q-value loss on the outputs' ``q_values``."""
    next_online = outputs.next_online
    targets = q_learning_targets(
        returns,
        data["terminal"],
        outputs.next_target["q_values"][0].float(),
        None if next_online is None else next_online["q_values"][0].float(),
        rescale_eps=rescale_eps,
    )
    q_taken = q_values_taken(outputs.online["q_values"][0].float(), data["action"][0])
    return q_loss(q_taken, targets, data["weights"], loss=loss)


def _distribution_loss(
    outputs: TransitionOutputs,
    returns: NStepReturns,
    data: Mapping[str, Tensor],
    *,
    support: Tensor,
) -> QLossOutput:
    """The distributional loss on the outputs' ``q_logits`` [1, B, A, N]."""
    logits = outputs.online["q_logits"][0].float()  # [B, A, N]
    support = support.to(logits.device)
    next_target_probs = outputs.next_target["q_logits"][0].float().softmax(dim=-1)
    next_online = outputs.next_online
    chooser = (
        next_target_probs
        if next_online is None
        else next_online["q_logits"][0].float().softmax(dim=-1)
    )
    best = (chooser @ support).argmax(dim=-1)  # [B]
    next_probs = next_target_probs[torch.arange(len(best), device=best.device), best]
    target_probs = categorical_projection(returns, data["terminal"], next_probs, support)
    actions = data["action"][0].long()
    logits_taken = logits[torch.arange(len(actions), device=actions.device), actions]
    return categorical_loss(logits_taken, target_probs, data["weights"], support)


class DQN(QLearningAlgorithm):
    """DQN with switches for Double Q, the dueling head, n-step returns and prioritized
    replay, on a transition replay."""

    name = "dqn"
    summary = (
        "DQN with Double Q, dueling head, n-step returns and uniform or prioritized"
        " transition replay (Mnih et al. 2015; Hessel et al. 2018)."
    )
    Args = DQNArgs
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

    def q_network(self) -> dict[str, Any]:
        return {"dueling": self.config.dueling, "num_atoms": self.num_atoms}

    def scheduled_exploration(self) -> bool:
        return self.config.exploration == "linear"

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if self.scheduled_exploration():
            return ExplorationSchedule(model, self.config.eps_start)
        return model

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

    def loss_fn(self) -> Callable[..., QLossOutput]:
        """The loss on a batch's `TransitionOutputs`, returns and data, its constants bound."""
        config = self.config
        return functools.partial(_q_values_loss, rescale_eps=self.rescale_eps(), loss=config.loss)

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        config = self.config
        return self.target_network_update(
            TransitionQUpdate,
            model,
            context,
            self.loss_fn(),
            discounting=config.discounting,
            reward_clipping=config.reward_clipping,
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

    def loss_fn(self) -> Callable[..., QLossOutput]:
        return functools.partial(_distribution_loss, support=torch.tensor(self.support()))


class Rainbow(C51):
    """Rainbow without noisy nets: C51 with double Q, dueling, n-step and prioritized replay."""

    name = "rainbow"
    summary = (
        "Rainbow (Hessel et al. 2018) without noisy nets: C51 + double Q, dueling, 3-step"
        " returns, prioritized replay."
    )
    Args = RainbowArgs
    core_defaults: Mapping[str, Any] = {**DQN.core_defaults, "learning_rate": 6.25e-5}
