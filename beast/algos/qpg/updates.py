"""The learner updates of DDPG, TD3 and SAC's common part: twin (or single) critics and an
actor trained on transition batches (`ActorCriticQUpdate`), and the deterministic actor's
update (`TD3Update`): TD3's, with its delayed actor and target policy smoothing, and
DDPG's, the same with a delay of one and no smoothing."""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from beast.algos.base import (
    LearnerContext,
    OptimizerUpdate,
    UpdateInfo,
    require_one_batch,
)
from beast.algos.normalize import find_observation_normalizer
from beast.algos.nstep import NStepReturns
from beast.algos.qpg.functions import (
    critic_loss,
    smoothed_target_actions,
    td3_targets,
    to_unit_actions,
)
from beast.algos.transitions import (
    find_exploration_schedule,
    scaled_n_step_returns,
)
from beast.experience.contract import Batch
from beast.fields import index_inputs, model_inputs
from beast.models import ModelError
from beast.train_step import ParameterGroup, StepLoss, StepResult, TargetNetwork
from beast.train_step.optim import build_optimizer

__all__ = ["ActorCriticQUpdate", "TD3Update", "Temperature", "find_actor_critic"]


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
