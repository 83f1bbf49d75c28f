"""What every actor-critic plug-in shares: its network, its action distribution, its acting.

IMPALA, LASER, PPO and A2C all learn a policy pi(a|x) and a value V(x) from one network
with a policy head and a baseline head (beast/models/actor_critic.py). Which head, and how actions
are drawn and stored, follows from the env's action space alone
(`beast.algos.distributions.action_distribution`): a softmax for Discrete actions, a
diagonal Gaussian for Box actions. So they all run in both kinds of action space.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import ClassVar

from torch import Tensor, nn

from beast.algos.base import ActingRule, Algorithm, LearnerContext, as_outputs
from beast.algos.distributions import ActionDistribution, action_distribution
from beast.models import build_model

__all__ = ["ActorCriticAlgorithm", "float_forward"]


def float_forward(
    model: nn.Module,
    context: LearnerContext,
    inputs: Mapping[str, Tensor],
    core_state: tuple[Tensor, ...],
) -> dict[str, Tensor]:
    """The learner's forward pass: `model`'s outputs over `inputs` ([T, B, ...]) from
    `core_state`, run under the run's autocast (bf16 with --precision bf16) and returned
    as float32, the precision the losses are computed in."""
    with context.autocast():
        outputs, _ = model(inputs, core_state)
    return {key: value.float() for key, value in as_outputs(outputs).items()}


class ActorCriticAlgorithm(Algorithm):
    """An algorithm whose network returns the action distribution's parameters and a
    baseline, and whose policy draws from that distribution."""

    continuous_actions: ClassVar[bool] = True

    @functools.cached_property
    def distribution(self) -> ActionDistribution:
        return action_distribution(self.spec)

    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        return {**self.distribution.param_shapes(), "baseline": ()}

    def builtin_model(self) -> nn.Module:
        config, spec = self.config, self.spec
        return build_model(
            config.model,
            spec.model_obs_shape(),
            spec.num_actions,
            use_lstm=config.use_lstm,
            hidden_size=config.hidden_size,
            activation=config.activation,
            action_dim=spec.action_dim,
            log_std_init=config.log_std_init,
            use_last_action_reward=config.use_last_action_reward,
        )

    def acting_rule(self, explore: bool = True) -> ActingRule:
        return self.distribution.acting_rule(explore)
