"""DDPG, TD3 and SAC as plug-ins (beast/algos/base.py): flags, network, acting, replay and
update. The equations are beast/algos/qpg/functions.py's; the network contract is
beast/algos/qpg/networks.py's.

All three train on the transition replay (beast/experience/transition_replay.py, uniform, with
optional n-step returns), at `--utd_ratio` gradient updates per env step: the replay's
rate limit (`samples_per_insert` = utd_ratio x batch_size) holds it whichever of the
actors and the learner is faster. The first `--learning_starts` env steps are uniform
random actions: the network's exploration rate (`beast.algos.transitions.ExplorationSchedule`,
travelling with the weights) is 1 until the learner's first update sets it to 0.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from beast.algos.base import (
    ActingRule,
    Algorithm,
    LearnerContext,
    OptimizerUpdate,
    Update,
    UpdateInfo,
    require_one_batch,
)
from beast.algos.normalize import find_observation_normalizer
from beast.algos.nstep import NStepReturns
from beast.algos.policies import SquashedPolicy
from beast.algos.qpg.functions import (
    critic_loss,
    sample_tanh_gaussian,
    smoothed_target_actions,
    soft_q_targets,
    td3_targets,
    temperature_loss,
    to_unit_actions,
)
from beast.algos.qpg.networks import ActorCriticQNet
from beast.algos.transitions import (
    ExplorationSchedule,
    check_transition_args,
    find_exploration_schedule,
    scaled_n_step_returns,
)
from beast.config import ConfigError, flag, require_nonnegative
from beast.experience.contract import Batch
from beast.experience.specs import Experience, TransitionReplay
from beast.fields import index_inputs, model_inputs
from beast.models import ModelError
from beast.train_step import ParameterGroup, StepLoss, StepResult, TargetNetwork
from beast.train_step.optim import build_optimizer

__all__ = [
    "DDPG",
    "SAC",
    "TD3",
    "ActorCriticQUpdate",
    "DDPGArgs",
    "SACArgs",
    "SACUpdate",
    "TD3Args",
    "TD3Update",
    "parse_net_arch",
]

AUTO = "auto"


def parse_net_arch(text: str) -> tuple[int, ...]:
    """ "256,256" -> (256, 256); ConfigError for anything but positive integers."""
    try:
        sizes = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--net_arch {text!r} is not a list of layer widths; write it as 256,256")
    return sizes


def _auto_or_float(name: str, text: str) -> float | None:
    """None for "auto", else the float; ConfigError otherwise."""
    if str(text) == AUTO:
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--{name} must be auto or a number, got {text!r}") from None


@dataclass(frozen=True)
class DDPGArgs:
    """What DDPG, TD3 and SAC share; defaults as Stable-Baselines3's."""

    discounting: float = flag(0.99, "Discount factor gamma.")
    replay_size: int = flag(
        1_000_000,
        "Transitions the replay keeps (each env step once, in its env's ring, in shared"
        " memory); the startup line prints the total.",
    )
    learning_starts: int = flag(
        100,
        "Env steps of uniform random actions, in the replay before the learner samples.",
    )
    n_step: int = flag(1, "Rewards summed before bootstrapping from the target critics.")
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


@dataclass(frozen=True)
class TD3Args(DDPGArgs):
    """TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor."""

    policy_delay: int = flag(2, "Critic updates per actor update (and per target-network update).")
    target_noise: float = flag(
        0.2, "Target policy smoothing: std of the noise on the target action (unit box)."
    )
    target_noise_clip: float = flag(0.5, "Target policy smoothing: the noise's clip.")
    num_critics: ClassVar[int] = 2

    @staticmethod
    def check(config: Any) -> None:
        DDPGArgs.check(config)
        if config.policy_delay < 1:
            raise ConfigError(f"--policy_delay must be >= 1, got {config.policy_delay}")
        if config.target_noise < 0 or config.target_noise_clip < 0:
            raise ConfigError("--target_noise and --target_noise_clip must be >= 0")


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
        alpha = _auto_or_float("ent_coef", config.ent_coef)
        _auto_or_float("target_entropy", config.target_entropy)
        if alpha is not None and alpha < 0:
            raise ConfigError(f"--ent_coef must be auto or >= 0, got {config.ent_coef}")
        if not config.ent_coef_init > 0:
            raise ConfigError(f"--ent_coef_init must be > 0, got {config.ent_coef_init}")


def find_actor_critic(model: nn.Module) -> nn.Module:
    """The network inside the engine's wrappers (observation normaliser, exploration
    schedule): the outermost module with a `critic` submodule."""
    for module in model.modules():
        if isinstance(getattr(module, "critic", None), nn.Module):
            return module
    raise ModelError("the network has no critic submodule (beast/algos/qpg/networks.py)")


class Temperature(nn.Module):
    """SAC's learned temperature, as log alpha: a module so that the learner's step trains
    it as it trains the networks (beast/train_step)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))


def frozen_call(module: nn.Module, *args: Any) -> Any:
    """`module(*args)` with its parameters as constants: gradients reach the inputs only
    (the actor's loss through the critics). Under the learner's compiled step the
    parameters it reads are the step's own (beast/train_step)."""
    constants = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, constants, args)


class ActorCriticQUpdate(OptimizerUpdate):
    """What DDPG, TD3 and SAC share in the learner:

    1. the batch's inputs, rows [2, B] (x_s and x_{s+k}), observations normalised as the
       actors saw them (--normalize_obs), stored actions mapped to the unit box, n-step
       returns from the (scaled) rewards;
    2. the losses (`losses`, per algorithm), summed: the critics', and the actor's (and
       the temperature's) where this update trains them; the actor's loss sees the
       critics as constants (their parameters' gradients are not taken), so one backward
       pass serves every optimizer;
    3. one optimizer step (beast/train_step: eager or compiled) over the groups the
       losses train ("critic", "actor", SAC's "alpha"; separate optimizer states, all in
       the checkpoint), and the target networks' Polyak averaging (`--tau`) after every
       actor update;
    4. the end of the random warm-up (the exploration rate to 0) at the first update.

    The losses draw no random numbers: the noise they need comes with the inputs
    (`noise`), drawn here from torch's generator (checkpointed).
    """

    def __init__(
        self,
        model: nn.Module,
        context: LearnerContext,
        config: Any,
        *,
        action_low: tuple[float, ...],
        action_high: tuple[float, ...],
        average_actor: bool,
        temperature: Temperature | None = None,
    ) -> None:
        self.model, self.context, self.config = model, context, config
        self.net = find_actor_critic(model)
        self.normalizer = find_observation_normalizer(model)
        self.schedule = find_exploration_schedule(model)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.critic_params = list(self.net.critic.parameters())
        critic_ids = {id(p) for p in self.critic_params}
        self.actor_params = [p for p in self.net.parameters() if id(p) not in critic_ids]
        self.critic_optimizer = build_optimizer(config, self.critic_params)
        self.actor_optimizer = build_optimizer(config, self.actor_params)
        self.temperature = temperature
        self.alpha_optimizer = (
            build_optimizer(config, temperature.parameters()) if temperature is not None else None
        )
        groups = [
            ParameterGroup("critic", self.critic_optimizer),
            ParameterGroup("actor", self.actor_optimizer),
        ]
        modules = {"model": model, "target": self.target}
        if temperature is not None:
            assert self.alpha_optimizer is not None
            groups.append(ParameterGroup("alpha", self.alpha_optimizer))
            modules["temperature"] = temperature
        # SAC has no target actor: only the critics are averaged.
        followed = (
            TargetNetwork(self.target, self.net)
            if average_actor
            else TargetNetwork(self.target.critic, self.net.critic)
        )
        device = context.device
        self.low = torch.tensor(action_low, dtype=torch.float32, device=device)
        self.high = torch.tensor(action_high, dtype=torch.float32, device=device)
        self.train_step = context.train_step(
            self.losses, modules=modules, groups=groups, targets=[followed]
        )
        self.num_updates = 0  # applied updates (critic steps)

    def prepared(
        self, inputs: Mapping[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor, NStepReturns]:
        """The loss's view of a batch: model inputs of x_s and x_{s+k} ([1, B] each,
        normalised as the actors saw them), the stored actions in the unit box [B, d],
        and the n-step returns from the (scaled) rewards."""
        data = model_inputs(inputs)
        if self.normalizer is not None:
            data["obs"] = self.normalizer.normalize(data["obs"])
        returns = scaled_n_step_returns(inputs, self.context, self.config.discounting)
        actions = to_unit_actions(inputs["action"][0].float(), self.low, self.high)
        return _rows(data, 0), _rows(data, 1), actions, returns

    @abc.abstractmethod
    def losses(self, inputs: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        """The step's summed losses on a batch's tensors (with its `noise`), for the
        groups in `train`."""

    @abc.abstractmethod
    def noise(self, batch_size: int, action_dim: int) -> dict[str, Tensor]:
        """The standard normal draws the losses need, by name: [rows, B, d] each, the
        batch on dim 1 as the batch's other fields have it, so that a block's draws are
        cut as its batches are (`split_block`)."""

    def groups_to_train(self, ahead: int = 0) -> tuple[str, ...]:
        """The groups the update `ahead` updates after the next one trains (the next
        one's at 0), its earlier ones all applied."""
        return ("critic", "actor")

    def critic_values(
        self, inputs: Mapping[str, Tensor], actions: Tensor, *, frozen: bool
    ) -> Tensor:
        """The online critics at (x_s, actions [B, d]): [C, B]. `frozen`: as constants,
        so that the actor's loss sends gradients to the actions only."""
        if frozen:
            return frozen_call(self.net.critic, inputs, actions.unsqueeze(0))[:, 0]
        return self.net.critic(inputs, actions.unsqueeze(0))[:, 0]

    def __call__(self, batch: Batch) -> UpdateInfo:
        require_one_batch(batch)
        return self._steps(batch)[0]

    def block(self, batch: Batch) -> list[UpdateInfo]:
        """A replay's block of batches in one call of the train step, one update each,
        each training the groups it would train called alone: SAC's and DDPG's every
        group, TD3's the critic alone and then critic and actor by turns (its delayed
        actor: a pattern of steps fixed before the call, so that a step skipped as
        non-finite inside the block shifts none of the later ones, there alone)."""
        return self._steps(batch)

    def _steps(self, batch: Batch) -> list[UpdateInfo]:
        """One optimizer step on each of `batch`'s parts, step i training
        `groups_to_train(i)`, each with its own noise drawn in turn (the draws a call per
        batch would make), the targets averaged after each step that trains the actor."""
        parts = batch.parts
        trains = [self.groups_to_train(ahead) for ahead in range(parts)]
        B = batch.data["n_steps"].shape[0] // parts
        draws = [self.noise(B, self.low.shape[0]) for _ in range(parts)]
        inputs = dict(batch.data)
        # One batch takes its draws as they are, uncopied.
        inputs.update(
            {
                key: draws[0][key] if parts == 1 else torch.cat([d[key] for d in draws], dim=1)
                for key in draws[0]
            }
        )
        if batch.weights is not None:
            inputs["weights"] = batch.weights
        taus = [self.config.tau if "actor" in train else None for train in trains]
        results = self.train_step.steps(inputs, train=trains, taus=taus)
        return [self.step_info(result) for result in results]

    def step_info(self, result: StepResult) -> UpdateInfo:
        """What one step of a call reports; an applied one counts, and the first ends the
        random warm-up."""
        stats = dict(result.stats)
        if not result.applied:
            return UpdateInfo(stats=stats)
        self.num_updates += 1
        if self.schedule is not None and float(self.schedule.epsilon) != 0.0:
            self.schedule.epsilon.fill_(0.0)  # the random warm-up is over
        return UpdateInfo(stats=stats)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        optimizers = {
            "actor_optimizer": self.actor_optimizer,
            "critic_optimizer": self.critic_optimizer,
        }
        if self.alpha_optimizer is not None:
            optimizers["alpha_optimizer"] = self.alpha_optimizer
        return optimizers

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "target": self.target.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.num_updates = int(state["num_updates"])
        super().load_state_dict(state)


def _rows(inputs: Mapping[str, Tensor], row: int) -> dict[str, Tensor]:
    return index_inputs(inputs, slice(row, row + 1))


class TD3Update(ActorCriticQUpdate):
    """TD3's losses (DDPG's with one critic, no smoothing and no delay)."""

    def __init__(
        self,
        *args: Any,
        policy_delay: int,
        target_noise: float,
        target_noise_clip: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.policy_delay = policy_delay
        self.last_actor_loss = torch.tensor(float("nan"))
        self.target_noise, self.target_noise_clip = target_noise, target_noise_clip

    def groups_to_train(self, ahead: int = 0) -> tuple[str, ...]:
        if (self.num_updates + ahead + 1) % self.policy_delay == 0:
            return ("critic", "actor")
        return ("critic",)

    def noise(self, batch_size: int, action_dim: int) -> dict[str, Tensor]:
        if self.target_noise == 0.0:
            return {}
        device = self.low.device
        return {"target_noise": torch.randn(1, batch_size, action_dim).to(device)}

    def losses(self, inputs: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        net = self.net
        step, bootstrap, actions, returns = self.prepared(inputs)
        with torch.no_grad():
            target_actions = torch.tanh(self.target(bootstrap, ())[0]["action_mean"][0].float())
            if "target_noise" in inputs:
                target_actions = smoothed_target_actions(
                    target_actions,
                    inputs["target_noise"][0],
                    self.target_noise,
                    self.target_noise_clip,
                )
            next_q = self.target.critic(bootstrap, target_actions.unsqueeze(0))[:, 0].float()
            targets = td3_targets(returns, inputs["terminal"], next_q)
        q = self.critic_values(step, actions, frozen=False)
        total = critic_loss(q, targets, inputs.get("weights"))
        stats: dict[str, Any] = {
            "critic_loss": total.detach(),
            "mean_q": q.detach().mean(),
            "mean_target": targets.mean(),
        }
        if "actor" in train:
            mu = torch.tanh(net(step, ())[0]["action_mean"][0].float())
            actor_loss = -self.critic_values(step, mu, frozen=True)[0].mean()
            total = total + actor_loss
            stats["actor_loss"] = actor_loss.detach()
        stats["total_loss"] = total.detach()
        return StepLoss(total, stats)

    def step_info(self, result: StepResult) -> UpdateInfo:
        info = super().step_info(result)
        stats = dict(info.stats)
        # Every update logs the same columns: the latest actor loss between actor updates.
        if "actor_loss" in stats:
            self.last_actor_loss = stats["actor_loss"]
        stats["actor_loss"] = self.last_actor_loss
        return UpdateInfo(stats=stats, priorities=info.priorities)


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


class TD3(DDPG):
    """TD3: DDPG with twin critics, target policy smoothing and delayed actor updates."""

    name = "td3"
    summary = (
        "TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor"
        " updates, on transition replay; continuous actions."
    )
    Args = TD3Args

    def describe_extra(self) -> list[str]:
        config = self.config
        return [
            f"action noise {config.action_noise:g}",
            f"target noise {config.target_noise:g} clipped to {config.target_noise_clip:g}",
            f"actor every {config.policy_delay} updates",
        ]


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
        value = _auto_or_float("target_entropy", self.config.target_entropy)
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
            alpha=_auto_or_float("ent_coef", config.ent_coef),
            alpha_init=config.ent_coef_init,
            target_entropy=self.target_entropy(),
        )

    def describe_extra(self) -> list[str]:
        alpha = _auto_or_float("ent_coef", self.config.ent_coef)
        if alpha is None:
            return [
                f"alpha learned from {self.config.ent_coef_init:g} towards entropy"
                f" {self.target_entropy():g}"
            ]
        return [f"alpha fixed at {alpha:g}"]
