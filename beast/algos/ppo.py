"""PPO and A2C: clipped-surrogate and plain policy gradients on rollouts (one family).

PPO (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"): every batch of
rollouts is passed over `--num_epochs` times in `--num_minibatches` minibatches, each
minimising

    L = -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)            (eq. 7)
        + c_V (V(x_t) - R_t)^2  - c_H H(pi(.|x_t))                (eq. 9)

averaged over the minibatch's steps, with r_t = pi_theta(a_t|x_t) / mu(a_t|x_t) the ratio
to the policy the actor acted with (stored with the step: beast/algos/distributions.py),
eps = `--clip_range` (linearly annealed with `--clip_range_schedule linear`), A_t the
advantages (normalised per minibatch with `--normalize_advantage`), R_t the value
targets, c_V = `--baseline_cost` (Stable-Baselines3's vf_coef: no 1/2) and c_H =
`--entropy_cost`. With `--clip_range_vf` the value's change is clipped as the ratio's is,
max((V - R)^2, (V_old + clip(V - V_old, -eps_V, eps_V) - R)^2). With `--target_kl`, the
update stops before a minibatch whose approximate KL E[(r - 1) - log r] exceeds 1.5
`--target_kl` (Stable-Baselines3's rule). Feed-forward models draw minibatches of single
steps; recurrent ones of whole rollouts, each from its stored initial state.

A2C (Mnih et al. 2016; Stable-Baselines3's A2C): one pass, one minibatch, and the
unclipped policy gradient -log pi(a_t|x_t) A_t in place of the surrogate. Same code.

Targets come once per batch, before the first epoch, from the learner's model: values
V(x_t) for t = 0..T, and either GAE (`--advantages gae`, beast/algos/gae.py) or V-trace
(`--advantages vtrace`: R_t = v_t and A_t = r_t + gamma v_{t+1} - V(x_t), beast/algos/
vtrace.py, with the ratios clipped at 1). Transitions out of a truncated episode's final
observation are no transitions (beast/envs/batch.py): they are masked out of every mean.

Stale data. beast's actors do not stop for the learner, so a batch can come from weights
several updates old. Two answers, `--synchronous` (the default) or not:

- synchronous: actors wait, after each rollout, for the update it feeds (the engine's
  synchronous rollouts: beast/experience/rollout_source.py `RolloutSource`); every batch is
  one rollout of every env acted by the weights it updates (but for the first step of each rollout),
  as in Stable-Baselines3 and CleanRL. `--batch_size` must be the number of envs.
- asynchronous: actors never wait; the surrogate's ratio is to the behaviour policy that
  acted (as in Sample Factory's APPO, which the ratio above is already), and `--advantages
  vtrace` corrects the targets for the lag too.

Why synchronous is the default: measured in benchmarks/RESULTS.md ("PPO: synchronous or
asynchronous actors").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beast.algos import vtrace
from beast.algos.actor_critic import ActorCriticAlgorithm, float_forward
from beast.algos.base import LearnerContext, OptimizerUpdate, Update, UpdateInfo
from beast.algos.distributions import ActionDistribution
from beast.algos.gae import generalized_advantages
from beast.algos.impala import REWARD_CLIPPING_MODES, clip_rewards, step_discounts_and_valid
from beast.algos.surrogate import clipped_surrogate, masked_mean, value_loss
from beast.config import ConfigError, flag, require_fraction, require_nonnegative
from beast.experience.contract import Batch
from beast.experience.specs import Experience, Rollouts
from beast.fields import core_state, index_inputs, map_inputs, model_inputs
from beast.train_step import ParameterGroup, StepLoss
from beast.train_step.optim import build_optimizer

__all__ = [
    "A2C",
    "A2CArgs",
    "PPO",
    "PPOArgs",
    "PolicyGradientArgs",
    "PolicyGradientUpdate",
    "Targets",
]

ADVANTAGE_ESTIMATORS = ("gae", "vtrace")
CLIP_SCHEDULES = ("constant", "linear")
# SB3's advantage normalisation: (A - mean) / (std + 1e-8).
_ADVANTAGE_EPSILON = 1e-8
# SB3's early stop: a minibatch whose approximate KL exceeds this times --target_kl.
_TARGET_KL_MARGIN = 1.5
# Minibatch steps per call of the train step, where none can stop the rest: a compiled
# call is one graph of them, unrolled, whose package takes the longer to build the more
# steps it holds (benchmarks/RESULTS.md).
_STEPS_PER_CALL = 5


class Targets(NamedTuple):
    """What a batch's update trains towards, fixed before its first epoch; [T, B] each.

    behaviour_log_probs: log mu(a_t|x_t), of the policy that acted.
    old_values: V(x_t) of the learner's model before the update.
    advantages, returns: A_t and R_t (module docstring).
    valid: bool, step t is a transition (not a truncated episode's final observation).
    initial_log_ratio: log pi(a_t|x_t) - log mu(a_t|x_t) before the update: the policy lag.
    """

    behaviour_log_probs: Tensor
    old_values: Tensor
    advantages: Tensor
    returns: Tensor
    valid: Tensor
    initial_log_ratio: Tensor


@dataclass(frozen=True)
class PolicyGradientArgs:
    """The flags PPO and A2C share."""

    discounting: float = flag(0.99, "Discount factor gamma.")
    gae_lambda: float = flag(
        0.95, "GAE's lambda (V-trace's too, with --advantages vtrace): 1 is Monte Carlo."
    )
    entropy_cost: float = flag(
        0.0, "Weight of the mean entropy bonus (Stable-Baselines3's ent_coef)."
    )
    baseline_cost: float = flag(
        0.5,
        "Weight of the mean squared value error (Stable-Baselines3's vf_coef: no 1/2).",
    )
    normalize_advantage: bool = flag(
        True, "Normalise advantages to mean 0 and std 1 in each minibatch."
    )
    reward_clipping: str = flag(
        "none", "Reward clipping in the loss.", choices=REWARD_CLIPPING_MODES
    )
    synchronous: bool = flag(
        True,
        "Actors wait after each rollout for the update it feeds (SB3/CleanRL semantics;"
        " --batch_size must be num_actors*num_envs_per_actor); --no-synchronous: actors never"
        " wait, and the loss corrects for their policy lag (see --advantages).",
    )
    advantages: str = flag(
        "gae",
        "Advantage estimator: gae, or vtrace (V-trace targets, correcting for the policy lag"
        " of asynchronous actors, as Sample Factory's APPO).",
        choices=ADVANTAGE_ESTIMATORS,
    )

    @staticmethod
    def check(config: Any) -> None:
        require_nonnegative(config, "entropy_cost", "baseline_cost")
        require_fraction(config, "discounting", "gae_lambda")
        if not config.synchronous:
            return
        if config.actor_layout_is_auto:
            raise ConfigError(
                "--synchronous needs a fixed actor layout (its batch is one rollout of every"
                " env): give --num_actors and --num_envs_per_actor numbers, not auto"
            )
        envs = config.envs_per_learner
        if envs is None:
            raise ConfigError(
                "--synchronous: every learner's batch is one rollout of each of its envs, so"
                " --num_env_servers must split evenly among --num_learners"
            )
        if config.batch_size != envs:
            raise ConfigError(
                f"--synchronous: a batch is one rollout of every env, so --batch_size must be"
                f" {envs} (the envs feeding a learner), got {config.batch_size}; or use"
                " --no-synchronous"
            )


@dataclass(frozen=True)
class PPOArgs(PolicyGradientArgs):
    """PPO's flags; the defaults are Stable-Baselines3's."""

    clip_range: float = flag(0.2, "PPO's epsilon: the ratio is clipped to [1 - eps, 1 + eps].")
    clip_range_schedule: str = flag(
        "constant",
        "--clip_range: constant, or linear decay to 0 at --total_steps.",
        choices=CLIP_SCHEDULES,
    )
    clip_range_vf: float | None = flag(
        None, "Clip each value's change from its pre-update value to +-this; default: no."
    )
    num_epochs: int = flag(10, "Passes over each batch.")
    num_minibatches: int = flag(
        32,
        "Minibatches per pass: of the batch's unroll_length*batch_size steps (feed-forward"
        " models), or of its batch_size rollouts (recurrent models); must divide it.",
    )
    target_kl: float | None = flag(
        None,
        "Stop a batch's update before a minibatch whose approximate KL to the acting policy"
        " exceeds 1.5 x this (Stable-Baselines3's rule); default: never.",
    )

    @staticmethod
    def check(config: Any) -> None:
        PolicyGradientArgs.check(config)
        if not 0.0 < config.clip_range < 1.0:
            raise ConfigError(f"--clip_range must be in (0, 1), got {config.clip_range}")
        for name in ("clip_range_vf", "target_kl"):
            value = getattr(config, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be positive (or unset), got {value}")
        for name in ("num_epochs", "num_minibatches"):
            if getattr(config, name) < 1:
                raise ConfigError(f"--{name} must be positive, got {getattr(config, name)}")
        if config.use_lstm:
            units, count = "rollouts", config.batch_size
        else:
            units, count = "steps", config.unroll_length * config.batch_size
        if count % config.num_minibatches:
            raise ConfigError(
                f"--num_minibatches {config.num_minibatches} does not divide the batch's"
                f" {count} {units} (--batch_size {config.batch_size}"
                + ("" if config.use_lstm else f" x --unroll_length {config.unroll_length}")
                + "); pick a divisor"
            )


@dataclass(frozen=True)
class A2CArgs(PolicyGradientArgs):
    """A2C's flags; the defaults are Stable-Baselines3's (no advantage normalisation,
    lambda 1: n-step returns)."""

    gae_lambda: float = flag(1.0, "GAE's lambda: 1 gives A2C's n-step returns.")
    normalize_advantage: bool = flag(False, "Normalise advantages to mean 0 and std 1.")

    @staticmethod
    def check(config: Any) -> None:
        PolicyGradientArgs.check(config)


class PolicyGradientUpdate(OptimizerUpdate):
    """A batch's PPO or A2C update (module docstring).

    Args:
        model, context: the learner's.
        optimizer: over the model's parameters.
        distribution: the policy's action distribution.
        config: the run's flags (this family's and the core ones).
        clip_range: eps, or None for A2C's unclipped policy gradient.
        num_epochs, num_minibatches: 1 and 1 for A2C.
    """

    def __init__(
        self,
        model: nn.Module,
        context: LearnerContext,
        optimizer: torch.optim.Optimizer,
        distribution: ActionDistribution,
        config: Any,
        *,
        clip_range: float | None,
        num_epochs: int,
        num_minibatches: int,
    ) -> None:
        self.model, self.context, self.optimizer = model, context, optimizer
        self.distribution = distribution
        self.config = config
        self.clip_range = clip_range
        self.num_epochs, self.num_minibatches = num_epochs, num_minibatches
        self.recurrent = bool(model.initial_state(1))
        self.param_keys = tuple(distribution.param_shapes())
        self.train_step = context.train_step(
            self.step_loss,
            modules={"model": model},
            groups=[ParameterGroup("model", optimizer)],
        )

    def current_clip_range(self) -> float | None:
        """--clip_range now: constant, or linearly annealed with the agent steps."""
        if self.clip_range is None or self.config.clip_range_schedule == "constant":
            return self.clip_range
        total = self.context.step.total_steps
        return self.clip_range * (1.0 - min(self.context.progress.step, total) / total)

    def step_loss(self, inputs: Mapping[str, Any], train: tuple[str, ...]) -> StepLoss:
        """What each call of the train step computes: a minibatch's loss, or, training
        nothing, the batch's fixed targets (`fixed_targets`), compiled like the steps."""
        if not train:
            return self.fixed_targets(inputs)
        return self.minibatch_loss(inputs, train)

    def targets(self, data: Mapping[str, Tensor]) -> Targets:
        """The batch's fixed targets (class docstring), from one forward pass: a train
        step that trains nothing."""
        self.model.eval()
        return Targets(**self.train_step(data, train=()).stats)

    @torch.no_grad()
    def fixed_targets(self, data: Mapping[str, Tensor]) -> StepLoss:
        """The batch's fixed targets as a `StepLoss` of no loss, the targets its stats."""
        config, context, distribution = self.config, self.context, self.distribution
        outputs = float_forward(self.model, context, model_inputs(data), core_state(data))
        values = outputs["baseline"]
        actions = data["action"][:-1]
        behaviour = {key: data[key][:-1] for key in self.param_keys}
        behaviour_log_probs = distribution.log_prob(behaviour, actions)
        target = {key: outputs[key][:-1] for key in self.param_keys}
        log_ratio = distribution.log_prob(target, actions) - behaviour_log_probs
        rewards = clip_rewards(context.scale_rewards(data)[1:], config.reward_clipping)
        discounts, valid = step_discounts_and_valid(data, config.discounting)
        if config.advantages == "gae":
            advantages, returns = generalized_advantages(
                rewards,
                values,
                data["terminated"][1:],
                data["truncated"],
                discount=config.discounting,
                lambda_=config.gae_lambda,
            )
        else:
            # A step that is no transition gets ratio 0: v_t = V(x_t), traces cut.
            returns = vtrace.from_importance_weights(
                log_rhos=log_ratio.masked_fill(valid.logical_not(), -torch.inf),
                discounts=discounts,
                rewards=rewards,
                values=values[:-1],
                bootstrap_value=values[-1],
                lambda_=config.gae_lambda,
            ).vs
            next_returns = torch.cat([returns[1:], values[-1:]])
            advantages = (rewards + discounts * next_returns - values[:-1]) * valid
        targets = Targets(
            behaviour_log_probs=behaviour_log_probs,
            old_values=values[:-1],
            advantages=advantages,
            returns=returns,
            valid=valid,
            initial_log_ratio=log_ratio,
        )
        return StepLoss(values.new_zeros(()), targets._asdict())

    def _step_inputs(self, data: Mapping[str, Tensor], targets: Targets) -> dict[str, Any]:
        """What every minibatch step reads: the whole batch laid out for indexing by a
        minibatch's `index` (inside the step, where the gathers fuse with the loss).

        Feed-forward: single steps, [T*B, ...] (the model sees [1, M, ...]). Recurrent:
        whole rollouts, inputs [T+1, B, ...], state and targets by column (the model
        runs over them from their stored state; only steps 0..T-1 train).
        """
        inputs = model_inputs(data)
        if self.recurrent:
            return {
                "model_inputs": inputs,
                "core_state": core_state(data),
                "actions": data["action"][:-1],
                "targets": targets._asdict(),
            }
        return {
            "model_inputs": map_inputs(lambda value: value[:-1].flatten(0, 1), inputs),
            "core_state": (),
            "actions": data["action"][:-1].flatten(0, 1),
            "targets": {key: t.flatten(0, 1) for key, t in targets._asdict().items()},
        }

    def minibatch(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, Any], tuple[Tensor, ...], Tensor, Targets]:
        """The minibatch `inputs["index"]` picks from `_step_inputs`: (model inputs, core
        state, actions, targets); feed-forward [1, M, ...], recurrent [T+1, M, ...]."""
        index = inputs["index"]
        targets = inputs["targets"]
        if self.recurrent:
            return (
                index_inputs(inputs["model_inputs"], (slice(None), index)),
                tuple(s[:, index] for s in inputs["core_state"]),
                inputs["actions"][:, index],
                Targets(**{key: t[:, index] for key, t in targets.items()}),
            )
        return (
            index_inputs(inputs["model_inputs"], (None, index)),
            (),
            inputs["actions"][index].unsqueeze(0),
            Targets(**{key: t[index].unsqueeze(0) for key, t in targets.items()}),
        )

    def minibatch_loss(self, inputs: Mapping[str, Any], train: tuple[str, ...]) -> StepLoss:
        """The clipped surrogate (or A2C's policy gradient), the value loss and the
        entropy bonus on the minibatch `inputs["index"]` selects (module docstring);
        does not proceed past --target_kl."""
        config, distribution = self.config, self.distribution
        model_in, state, actions, mb = self.minibatch(inputs)
        clip_range = inputs.get("clip_range")
        valid = mb.valid
        outputs = float_forward(self.model, self.context, model_in, state)
        if self.recurrent:  # the rollouts' steps 0..T-1 train; step T bootstraps
            outputs = {key: value[:-1] for key, value in outputs.items()}
        params = {key: outputs[key] for key in self.param_keys}
        log_probs = distribution.log_prob(params, actions)
        log_ratio = log_probs - mb.behaviour_log_probs
        advantages = mb.advantages
        if config.normalize_advantage:
            # Where the minibatch has one valid step or none, its advantages stay as they are.
            mean = masked_mean(advantages, valid)
            std = masked_mean((advantages - mean).square(), valid).sqrt()
            normalized = (advantages - mean) / (std + _ADVANTAGE_EPSILON)
            advantages = torch.where(valid.sum() > 1, normalized, advantages)
        policy_term = masked_mean(
            clipped_surrogate(
                log_ratio if clip_range is not None else log_probs, advantages, clip_range
            ),
            valid,
        )
        clip_vf = getattr(config, "clip_range_vf", None)
        value_term = masked_mean(
            value_loss(outputs["baseline"], mb.returns, mb.old_values, clip_vf), valid
        )
        entropy = masked_mean(distribution.entropy(params), valid)
        loss = policy_term + config.baseline_cost * value_term - config.entropy_cost * entropy
        with torch.no_grad():
            ratio = log_ratio.detach().exp()
            approx_kl = masked_mean((ratio - 1.0) - log_ratio.detach(), valid)
            clipped = (
                masked_mean(((ratio - 1.0).abs() > clip_range).float(), valid)
                if clip_range is not None
                else torch.zeros((), device=ratio.device)
            )
        stats = {
            "total_loss": loss.detach(),
            "pg_loss": policy_term.detach(),
            "baseline_loss": value_term.detach(),
            "entropy": entropy.detach(),
            "approx_kl": approx_kl,
            "clip_fraction": clipped,
        }
        target_kl = getattr(config, "target_kl", None)
        proceed = None if target_kl is None else approx_kl <= _TARGET_KL_MARGIN * target_kl
        return StepLoss(loss, stats, proceed=proceed)

    def __call__(self, batch: Batch) -> UpdateInfo:
        data = batch.data
        targets = self.targets(data)
        clip_range = self.current_clip_range()
        inputs = self._step_inputs(data, targets)
        device = targets.valid.device
        if clip_range is not None:
            inputs["clip_range"] = torch.tensor(clip_range, device=device)
        count = targets.valid.shape[1] if self.recurrent else targets.valid.numel()
        indices = self._minibatch_indices(count, device)
        # Each step's statistics in one row (copied: a CUDA graph's outputs are rewritten
        # by its next replay), averaged once: 20 steps an update on CartPole were 120
        # tensor additions, one at a time.
        names: tuple[str, ...] = ()
        rows: list[Tensor] = []
        stopped_early = False
        self.model.train()
        if getattr(self.config, "target_kl", None) is None and count % self.num_minibatches == 0:
            # No step can stop the rest: they go in blocks, each one call of the train
            # step (compiled, one graph), every epoch's order drawn first (the steps draw
            # no random numbers, so the orders are those the steps one by one would use).
            chosen = list(indices)
            per_call = max(n for n in range(1, _STEPS_PER_CALL + 1) if len(chosen) % n == 0)
            results = []
            for start in range(0, len(chosen), per_call):
                block = {**inputs, "index": torch.cat(chosen[start : start + per_call])}
                taus = (None,) * per_call
                results += self.train_step.steps(block, train=("model",), taus=taus, cut=("index",))
        else:
            results = []
            for index in indices:
                results.append(self.train_step({**inputs, "index": index}, train=("model",)))
                if results[-1].stopped:
                    stopped_early = True
                    results.pop()
                    break
        for result in results:
            names = tuple(result.stats)
            rows.append(torch.stack(tuple(result.stats.values())))
        minibatches = len(rows)
        means = dict(zip(names, torch.stack(rows).mean(0).unbind(), strict=True)) if rows else {}
        return UpdateInfo(stats=self._stats(means, minibatches, targets, clip_range, stopped_early))

    def _minibatch_indices(self, count: int, device: torch.device) -> Iterator[Tensor]:
        """Each minibatch's indices into the batch's `count` items (steps, or rollouts
        for a recurrent model), epoch after epoch, each epoch's order drawn as it starts
        (from torch's global generator, which checkpoints save and restore). One
        minibatch is the whole batch in order: no term of the loss depends on it."""
        whole = torch.arange(count, device=device) if self.num_minibatches == 1 else None
        for _ in range(self.num_epochs):
            order = torch.randperm(count, device=device) if whole is None else whole
            yield from order.chunk(self.num_minibatches)

    @torch.no_grad()
    def _stats(
        self,
        means: Mapping[str, Tensor],
        minibatches: int,
        targets: Targets,
        clip_range: float | None,
        stopped_early: bool,
    ) -> dict[str, Any]:
        valid = targets.valid
        returns, values = targets.returns[valid], targets.old_values[valid]
        variance = returns.var() if returns.numel() > 1 else torch.zeros(())
        explained = 1.0 - (returns - values).var() / variance if variance > 0 else torch.zeros(())
        stats: dict[str, Any] = dict(means)
        stats.update(
            {
                "minibatches": minibatches,
                "stopped_early": float(stopped_early),
                "explained_variance": explained,
                # Policy lag: the ratio to the acting policy before the update (1 when the
                # learner's weights acted, as with --synchronous but for step 0).
                "mean_rho": masked_mean(targets.initial_log_ratio.exp(), valid),
                "mean_advantage": masked_mean(targets.advantages, valid),
            }
        )
        if clip_range is not None:
            stats["clip_range"] = clip_range
        return stats


class PPO(ActorCriticAlgorithm):
    """PPO: the clipped surrogate over several epochs of minibatches."""

    name = "ppo"
    summary = (
        "Proximal Policy Optimization (Schulman et al. 2017): clipped surrogate, GAE,"
        " several epochs of minibatches per batch of rollouts."
    )
    Args = PPOArgs
    # Stable-Baselines3's PPO defaults, where they are core flags: Adam at 3e-4 (eps
    # 1e-5), gradient norm 0.5, and 2048 steps per update (16 envs x 128).
    core_defaults: Mapping[str, Any] = {
        "optimizer": "adam",
        "learning_rate": 3e-4,
        "epsilon": 1e-5,
        "lr_schedule": "constant",
        "grad_norm_clipping": 0.5,
        "unroll_length": 128,
        "batch_size": 16,
    }

    @classmethod
    def validate(cls, config: Any) -> None:
        cls.Args.check(config)

    def passes(self) -> tuple[float | None, int, int]:
        """(clip_range, num_epochs, num_minibatches) of each batch's update."""
        config = self.config
        return config.clip_range, config.num_epochs, config.num_minibatches

    def optimizer_steps(self, total_steps: int) -> int | None:
        batches = super().optimizer_steps(total_steps)
        _, num_epochs, num_minibatches = self.passes()
        return None if batches is None else batches * num_epochs * num_minibatches

    def experience(self) -> Experience:
        return Rollouts(
            unroll_length=self.config.unroll_length, synchronous=self.config.synchronous
        )

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        clip_range, num_epochs, num_minibatches = self.passes()
        return PolicyGradientUpdate(
            model,
            context,
            build_optimizer(self.config, model),
            self.distribution,
            self.config,
            clip_range=clip_range,
            num_epochs=num_epochs,
            num_minibatches=num_minibatches,
        )

    def describe(self) -> str:
        config = self.config
        text = (
            f"{'synchronous' if config.synchronous else 'asynchronous'} actors,"
            f" {config.advantages} advantages"
        )
        clip_range, num_epochs, num_minibatches = self.passes()
        if clip_range is None:
            return text
        return f"{text}, {num_epochs} epochs x {num_minibatches} minibatches"


class A2C(PPO):
    """A2C: one unclipped policy-gradient step per batch of short rollouts."""

    name = "a2c"
    summary = (
        "Advantage actor-critic (Mnih et al. 2016, synchronous as Stable-Baselines3's):"
        " one policy-gradient step per batch of short rollouts."
    )
    Args = A2CArgs
    # Stable-Baselines3's A2C defaults: RMSprop at 7e-4 (alpha 0.99, eps 1e-5), gradient
    # norm 0.5, 5-step rollouts.
    core_defaults: Mapping[str, Any] = {
        "optimizer": "rmsprop",
        "learning_rate": 7e-4,
        "alpha": 0.99,
        "epsilon": 1e-5,
        "lr_schedule": "constant",
        "grad_norm_clipping": 0.5,
        "unroll_length": 5,
        "batch_size": 16,
    }

    def passes(self) -> tuple[float | None, int, int]:
        return None, 1, 1
