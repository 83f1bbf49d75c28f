"""DDPG (Lillicrap et al. 2016) as a plug-in (beast/algos/base.py): flags, network, acting,
replay and update, and what TD3 and SAC take from it. The equations are
beast/algos/qpg/functions.py's, the network contract beast/algos/qpg/networks.py's, the
updates beast/algos/qpg/updates.py's.

All three train on the transition replay (beast/experience/transition_replay.py, uniform,
with optional n-step returns), at `--utd_ratio` gradient updates per env step: the
replay's rate limit (`samples_per_insert` = utd_ratio x batch_size) holds it whichever of
the actors and the learner is faster. The first `--learning_starts` env steps are uniform
random actions: the network's exploration rate
(`beast.algos.transitions.ExplorationSchedule`, travelling with the weights) is 1 until
the learner's first update sets it to 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from beast.algos.base import (
    ActingRule,
    Algorithm,
    LearnerContext,
    Update,
)
from beast.algos.policies import SquashedPolicy
from beast.algos.qpg.networks import ActorCriticQNet
from beast.algos.qpg.updates import TD3Update
from beast.algos.replay_args import ReplayArgs, with_default
from beast.algos.transitions import (
    ExplorationSchedule,
    check_transition_args,
)
from beast.config import AUTO, ConfigError, flag, require_nonnegative
from beast.experience.specs import Experience, TransitionReplay
from beast.models import ModelError

__all__ = ["DDPG", "DDPGArgs", "auto_or_float", "parse_net_arch"]


def parse_net_arch(text: str) -> tuple[int, ...]:
    """ "256,256" -> (256, 256); ConfigError for anything but positive integers."""
    try:
        sizes = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--net_arch {text!r} is not a list of layer widths; write it as 256,256")
    return sizes


def auto_or_float(name: str, text: str) -> float | None:
    """None for "auto", else the float; ConfigError otherwise."""
    if str(text) == AUTO:
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--{name} must be auto or a number, got {text!r}") from None


@dataclass(frozen=True)
class DDPGArgs(ReplayArgs):
    """What DDPG, TD3 and SAC share; defaults as Stable-Baselines3's."""

    replay_size: int = with_default(ReplayArgs, "replay_size", 1_000_000)
    n_step: int = with_default(ReplayArgs, "n_step", 1)
    learning_starts: int = flag(
        100,
        "Env steps of uniform random actions, in the replay before the learner samples.",
    )
    utd_ratio: float = flag(
        1.0,
        "Gradient updates per env step (update-to-data ratio; SB3's gradient_steps /"
        " train_freq): actors wait when they run ahead and the learner when it does.",
    )
    tau: float = flag(0.005, "Polyak averaging of the target networks after each update.")
    net_arch: str = flag("256,256", "Hidden layer widths of the built-in actor and of each critic.")
    action_noise: float = flag(
        0.1,
        "Exploration: std of the Gaussian noise added to the actor's action, in units of"
        " half the action range (SB3's NormalActionNoise on its scaled actions).",
    )

    # Fixed per algorithm (DDPG: one critic, actor and targets updated every update,
    # no target smoothing); TD3 turns them into flags.
    num_critics: ClassVar[int] = 1
    policy_delay: ClassVar[int] = 1
    target_noise: ClassVar[float] = 0.0
    target_noise_clip: ClassVar[float] = 0.0

    @staticmethod
    def check(config: Any) -> None:
        check_transition_args(config, networks="feed-forward networks")
        if not config.utd_ratio > 0:
            raise ConfigError(
                f"--utd_ratio must be > 0 (gradient updates per env step), got"
                f" {config.utd_ratio}; 1 is SB3's train_freq 1, gradient_steps 1"
            )
        require_nonnegative(config, "action_noise")
        parse_net_arch(config.net_arch)


class DDPG(Algorithm):
    """DDPG: a deterministic actor with Gaussian exploration noise, one critic, Polyak targets."""

    name = "ddpg"
    summary = (
        "DDPG (Lillicrap et al. 2016): deterministic actor, one critic, Polyak target"
        " networks, on transition replay; continuous actions."
    )
    Args: ClassVar[type] = DDPGArgs
    bf16_auto = False
    continuous_actions = True
    discrete_actions = False
    stochastic: ClassVar[bool] = False
    core_defaults: Mapping[str, Any] = {
        "optimizer": "adam",
        "learning_rate": 1e-3,
        "epsilon": 1e-8,
        "lr_schedule": "constant",
        "grad_norm_clipping": 0.0,
        "batch_size": 256,
        "num_actors": 1,
        "num_envs_per_actor": 1,
    }

    @classmethod
    def validate(cls, config: Any) -> None:
        cls.Args.check(config)

    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        d = (self.spec.action_dim,)
        return {"action_mean": d, "action_log_std": d} if self.stochastic else {"action_mean": d}

    def builtin_model(self) -> nn.Module:
        config, spec = self.config, self.spec
        vector = spec.nested or len(spec.obs_shape) == 1
        if config.model not in ("auto", "mlp") or not vector:
            raise ModelError(
                f"--algo {config.algo}'s built-in network is an MLP on vector observations"
                f" (or a Dict's or Tuple's leaves; --model auto or mlp), and --env"
                f" {config.env} has {spec.describe_obs()} observations with --model"
                f" {config.model}; pass --model package.module:Name"
                " (beast/algos/qpg/networks.py says what it returns)"
            )
        if config.use_last_action_reward:
            raise ModelError(
                f"--algo {config.algo}'s built-in network reads the observation alone; drop"
                " --use_last_action_reward"
            )
        return ActorCriticQNet(
            spec.model_obs_shape(),
            spec.action_dim,
            hidden_sizes=parse_net_arch(config.net_arch),
            num_critics=self.Args.num_critics,
            stochastic=self.stochastic,
        )

    def wrap_model(self, model: nn.Module) -> nn.Module:
        critic = getattr(model, "critic", None)
        if not isinstance(critic, nn.Module):
            raise ModelError(
                f"--model {self.config.model} has no critic submodule; --algo"
                f" {self.config.algo} needs critic(inputs, actions) -> [C, T, B] beside the"
                " actor's forward (beast/algos/qpg/networks.py)"
            )
        if self.config.learning_starts > 0:
            return ExplorationSchedule(model, 1.0)
        return model

    def acting_rule(self, explore: bool = True) -> ActingRule:
        config = self.config
        return SquashedPolicy(
            self.spec.action_low,
            self.spec.action_high,
            stochastic=self.stochastic,
            noise=config.action_noise,
            scheduled=config.learning_starts > 0,
            explore=explore,
        )

    def experience(self) -> Experience:
        config = self.config
        return TransitionReplay(
            capacity=config.replay_size,
            min_size=config.learning_starts,
            n_step=config.n_step,
            prioritized=False,
            priority_exponent=0.0,
            importance_sampling_exponent=0.0,
            samples_per_insert=config.utd_ratio * config.batch_size,
            frame_dedup=False,
        )

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        config, args = self.config, self.Args
        # DDPG's are the Args' fixed class values; TD3's are flags.
        return TD3Update(
            model,
            context,
            config,
            action_low=self.spec.action_low,
            action_high=self.spec.action_high,
            average_actor=True,
            policy_delay=getattr(config, "policy_delay", args.policy_delay),
            target_noise=getattr(config, "target_noise", args.target_noise),
            target_noise_clip=getattr(config, "target_noise_clip", args.target_noise_clip),
        )

    def describe(self) -> str:
        config, args = self.config, self.Args
        critics = "one critic" if args.num_critics == 1 else f"{args.num_critics} critics"
        parts = [critics, *self.describe_extra()]
        parts.append(f"Polyak tau {config.tau:g}, {config.n_step}-step")
        plural = "" if config.utd_ratio == 1 else "s"
        parts.append(f"{config.utd_ratio:g} update{plural} per env step")
        parts.append(f"{config.learning_starts:,} random steps first")
        return ", ".join(parts)

    def describe_extra(self) -> list[str]:
        return [f"action noise {self.config.action_noise:g}"]
