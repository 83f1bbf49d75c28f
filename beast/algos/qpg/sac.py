"""SAC (Haarnoja et al. 2018) as a plug-in: DDPG's (beast/algos/qpg/ddpg.py) with a
tanh-Gaussian actor, soft twin-Q targets and a learned temperature."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from beast.algos.base import (
    LearnerContext,
    Update,
)
from beast.algos.qpg.ddpg import DDPG, DDPGArgs, auto_or_float
from beast.algos.qpg.functions import (
    critic_loss,
    sample_tanh_gaussian,
    soft_q_targets,
    temperature_loss,
)
from beast.algos.qpg.updates import ActorCriticQUpdate, Temperature
from beast.config import AUTO, ConfigError, flag
from beast.train_step import StepLoss

__all__ = ["SAC", "SACArgs", "SACUpdate"]


@dataclass(frozen=True)
class SACArgs(DDPGArgs):
    """SAC (Haarnoja et al. 2018): a tanh-Gaussian policy, twin critics, learned temperature."""

    ent_coef: str = flag(
        AUTO,
        "The temperature alpha (SB3's ent_coef; --alpha is RMSprop's): auto learns it"
        " towards --target_entropy from --ent_coef_init; a number fixes it.",
    )
    ent_coef_init: float = flag(1.0, "--ent_coef auto: alpha's starting value.")
    target_entropy: str = flag(
        AUTO, "--ent_coef auto: the policy entropy alpha steers to; auto is -dim(actions)."
    )
    num_critics: ClassVar[int] = 2

    @staticmethod
    def check(config: Any) -> None:
        DDPGArgs.check(config)
        alpha = auto_or_float("ent_coef", config.ent_coef)
        auto_or_float("target_entropy", config.target_entropy)
        if alpha is not None and alpha < 0:
            raise ConfigError(f"--ent_coef must be auto or >= 0, got {config.ent_coef}")
        if not config.ent_coef_init > 0:
            raise ConfigError(f"--ent_coef_init must be > 0, got {config.ent_coef_init}")


class SACUpdate(ActorCriticQUpdate):
    """SAC's losses, with the temperature learned (`target_entropy`) or fixed (`alpha`)."""

    def __init__(
        self,
        model: nn.Module,
        context: LearnerContext,
        config: Any,
        *,
        alpha: float | None,
        alpha_init: float,
        target_entropy: float,
        **kwargs: Any,
    ) -> None:
        self.learn_alpha = alpha is None
        temperature = Temperature(alpha_init).to(context.device) if alpha is None else None
        super().__init__(model, context, config, temperature=temperature, **kwargs)
        self.target_entropy = target_entropy
        self.fixed_alpha = torch.tensor(
            max(alpha, 1e-30) if alpha is not None else 1.0, device=self.low.device
        )

    @property
    def log_alpha(self) -> Tensor:
        if self.temperature is not None:
            return self.temperature.log_alpha
        return self.fixed_alpha.log()

    def groups_to_train(self, ahead: int = 0) -> tuple[str, ...]:
        return ("critic", "actor", "alpha") if self.learn_alpha else ("critic", "actor")

    def noise(self, batch_size: int, action_dim: int) -> dict[str, Tensor]:
        """Row 0 draws a' at x_{s+k} (the targets), row 1 a at x_s (the actor's loss)."""
        return {"noise": torch.randn(2, batch_size, action_dim).to(self.low.device)}

    def draw(self, inputs: Mapping[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """A reparametrised a ~ pi(.|x) for one row of inputs: ([B, d], log pi [B])."""
        outputs = self.net(inputs, ())[0]
        mean = outputs["action_mean"][0].float()
        log_std = outputs["action_log_std"][0].float()
        return sample_tanh_gaussian(mean, log_std, noise)

    def losses(self, inputs: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        step, bootstrap, actions, returns = self.prepared(inputs)
        alpha = (
            self.temperature.log_alpha.detach().exp()
            if self.temperature is not None
            else self.fixed_alpha
        )
        # The next action a' ~ pi(.|x_{s+k}) without gradient (half the actor's backward).
        with torch.no_grad():
            next_action, next_log_prob = self.draw(bootstrap, inputs["noise"][0])
            next_q = self.target.critic(bootstrap, next_action.unsqueeze(0))[:, 0].float()
            targets = soft_q_targets(returns, inputs["terminal"], next_q, next_log_prob, alpha)
        q = self.critic_values(step, actions, frozen=False)
        loss_critic = critic_loss(q, targets, inputs.get("weights"))
        drawn, log_prob = self.draw(step, inputs["noise"][1])
        q_pi = self.critic_values(step, drawn, frozen=True)
        loss_actor = (alpha * log_prob - q_pi.min(dim=0).values).mean()
        total = loss_critic + loss_actor
        if self.temperature is not None and "alpha" in train:
            total = total + temperature_loss(
                self.temperature.log_alpha, log_prob, self.target_entropy
            )
        stats = {
            "critic_loss": loss_critic.detach(),
            "actor_loss": loss_actor.detach(),
            "alpha": alpha,
            "entropy": -log_prob.detach().mean(),
            "mean_q": q.detach().mean(),
            "mean_target": targets.mean(),
            "total_loss": total.detach(),
        }
        return StepLoss(total, stats)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.temperature is not None:
            with torch.no_grad():
                self.temperature.log_alpha.copy_(state["log_alpha"])
        super().load_state_dict(state)


class SAC(DDPG):
    """SAC: a tanh-Gaussian policy, twin critics and a learned (or fixed) temperature."""

    name = "sac"
    summary = (
        "SAC (Haarnoja et al. 2018): tanh-squashed Gaussian policy, twin critics, learned"
        " temperature, on transition replay; continuous actions."
    )
    Args = SACArgs
    stochastic = True
    core_defaults: Mapping[str, Any] = {**DDPG.core_defaults, "learning_rate": 3e-4}

    def target_entropy(self) -> float:
        value = auto_or_float("target_entropy", self.config.target_entropy)
        return -float(self.spec.action_dim) if value is None else value

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        config = self.config
        return SACUpdate(
            model,
            context,
            config,
            action_low=self.spec.action_low,
            action_high=self.spec.action_high,
            average_actor=False,
            alpha=auto_or_float("ent_coef", config.ent_coef),
            alpha_init=config.ent_coef_init,
            target_entropy=self.target_entropy(),
        )

    def describe_extra(self) -> list[str]:
        alpha = auto_or_float("ent_coef", self.config.ent_coef)
        if alpha is None:
            return [
                f"alpha learned from {self.config.ent_coef_init:g} towards entropy"
                f" {self.target_entropy():g}"
            ]
        return [f"alpha fixed at {alpha:g}"]
