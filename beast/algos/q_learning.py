"""What the Q-learners share: R2D2 on replayed sequences (beast/algos/r2d2.py), the DQN
family and Ape-X on replayed transitions (beast/algos/dqn.py).

Their targets bootstrap from the target network theta- at the action the online network
theta picks (double Q, van Hasselt et al. 2016), optionally in the space of the value
rescaling h (Pohlen et al. 2018, the transformed Bellman operator; Ape-X, R2D2):

    y = h( G + gamma^k h^-1( Q(x_{s+k}, a*; theta-) ) ),   a* = argmax_a Q(x_{s+k}, a; theta)

with G the discounted rewards of the k steps taken. Their losses hand the learner each
sample's new priority, and their actors explore epsilon-greedily: each env at its own
fixed rate (Ape-X), or all at a scheduled one (DQN).

Dtypes (beast/algos/dtypes.py): float32 in, float32 out; float64 in, float64 out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from torch import Tensor, nn

from beast.algos.base import ActingRule, Algorithm, LearnerContext, Update
from beast.algos.policies import EpsilonGreedyPolicy
from beast.algos.target_update import TargetNetworkUpdate
from beast.algos.value_rescaling import (
    DEFAULT_RESCALE_EPS,
    inverse_value_rescaling,
    value_rescaling,
)
from beast.config import require_fraction, require_nonnegative, require_positive
from beast.models import build_q_model
from beast.train_step.optim import build_optimizer

__all__ = [
    "QLearningAlgorithm",
    "QLossOutput",
    "check_q_learning_args",
    "double_q_values",
    "q_values_taken",
    "transformed_targets",
]


class QLossOutput(NamedTuple):
    """What a Q-learner's loss hands the learner.

    total_loss: differentiable scalar to minimise.
    stats: detached scalars for logging.
    priorities: float [B], detached, each sample's new priority (before the replay's
        priority exponent).
    """

    total_loss: Tensor
    stats: dict[str, Tensor]
    priorities: Tensor


def double_q_values(online_q: Tensor, target_q: Tensor) -> Tensor:
    """``Q(x, argmax_a Q(x, a; theta); theta-)`` for every row: float [...].

    The online network picks the action and the target network values it
    (van Hasselt et al. 2016), which removes Q-learning's max bias. Given the target
    network's Q-values as ``online_q`` too, it is DQN's max over the target network.

    Args:
        online_q: float [..., A], the online network's Q-values (only its
            argmax is used; no gradient flows through it).
        target_q: float [..., A], the target network's Q-values.
    """
    if online_q.shape != target_q.shape:
        raise ValueError(
            f"online_q {tuple(online_q.shape)} and target_q {tuple(target_q.shape)} differ"
        )
    best = online_q.detach().argmax(dim=-1, keepdim=True)
    return target_q.detach().gather(-1, best).squeeze(-1)


def q_values_taken(q_values: Tensor, actions: Tensor) -> Tensor:
    """``Q(x, a)`` of the actions taken: float [..., A] at int [...] -> float [...],
    differentiable in `q_values`."""
    return q_values.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def transformed_targets(
    bootstrap: Tensor, targets_from: Callable[[Tensor], Tensor], rescale_eps: float | None
) -> Tensor:
    """``h(targets_from(h^-1(bootstrap)))`` (module docstring): `targets_from` builds the
    targets (G + gamma^k v, v alone dropped at a terminal state) from the bootstrap values
    v in the space of returns; with `rescale_eps` None, h is the identity."""
    if rescale_eps is None:
        return targets_from(bootstrap)
    targets = targets_from(inverse_value_rescaling(bootstrap, rescale_eps))
    return value_rescaling(targets, rescale_eps)


def check_q_learning_args(config: Any) -> None:
    """The checks of the flags every Q-learner has: its replay's priorities, its target
    network's period and its actors' epsilons."""
    require_positive(config, "n_step", "target_update_period", "replay_size")
    require_fraction(config, "discounting")
    require_nonnegative(config, "priority_exponent", "eps_alpha", "samples_per_insert")
    require_fraction(config, "importance_sampling_exponent", "eps_base", "test_epsilon")


class QLearningAlgorithm(Algorithm):
    """An algorithm whose network returns Q-values (`build_q_model`'s built-in ones) and
    whose actors act epsilon-greedily on them."""

    # Q-values regress onto targets whose TD errors, late in training, are as small as
    # bf16's resolution near them (8 mantissa bits: 0.016 at Q = 3): bf16 runs the
    # built-in models' torsos only, their Q-values stay float32 (beast/models/q.py QNet).
    bf16_builtin_only = True

    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        return {"q_values": (self.spec.num_actions,)}

    def q_network(self) -> dict[str, Any]:
        """`build_q_model`'s options besides the model, shapes and width: the core or the
        head the algorithm asks for."""
        return {}

    def builtin_model(self) -> nn.Module:
        return build_q_model(
            self.config.model,
            self.spec.model_obs_shape(),
            self.spec.num_actions,
            hidden_size=self.config.hidden_size,
            use_last_action_reward=self.config.use_last_action_reward,
            **self.q_network(),
        )

    def scheduled_exploration(self) -> bool:
        """Whether the actors' epsilon is the network's `ExplorationSchedule`, rather than
        each env's fixed rate (`EpsilonGreedyPolicy`)."""
        return False

    def support(self) -> tuple[float, ...] | None:
        """The atoms' returns of a distributional network, or None for Q-values."""
        return None

    def rescale_eps(self) -> float | None:
        """The value rescaling's eps with --value_rescaling, else None (`transformed_targets`)."""
        return DEFAULT_RESCALE_EPS if self.config.value_rescaling else None

    def target_network_update(
        self,
        update: type[TargetNetworkUpdate],
        model: nn.Module,
        context: LearnerContext,
        loss_fn: Callable[..., QLossOutput],
        **options: Any,
    ) -> Update:
        """The learner's `update` (a `TargetNetworkUpdate`) of `model` on `loss_fn`: a new
        network for its target (the update copies the weights in), the run's optimizer over
        the model, --target_update_period, and the algorithm's own `options`."""
        return update(
            model,
            self.build_model().to(context.device),
            context,
            build_optimizer(self.config, model),
            loss_fn,
            target_update_period=self.config.target_update_period,
            **options,
        )

    def acting_rule(self, explore: bool = True) -> ActingRule:
        config = self.config
        return EpsilonGreedyPolicy(
            self.spec.num_actions,
            eps_base=config.eps_base,
            eps_alpha=config.eps_alpha,
            epsilon=None if explore else config.test_epsilon,
            scheduled=self.scheduled_exploration(),
            support=self.support(),
        )
