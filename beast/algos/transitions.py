"""What every learner on the transition replay (beast/experience/transition_replay.py) shares: the
DQN
family and Ape-X (beast/algos/dqn.py), DDPG, TD3 and SAC (beast/algos/qpg/). Their
batches hold each transition's window of k <= n rewards (``n_step_rewards [n, B]``,
``n_steps [B]``), their flags the replay's size and fill, the n of the returns, the
discount and the target networks' tau, and their actors may act with an exploration
rate that travels with the weights (`ExplorationSchedule`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from beast.algos.base import LearnerContext, as_outputs
from beast.algos.impala import clip_rewards
from beast.algos.nstep import NStepReturns, n_step_returns
from beast.config import ConfigError, require_fraction, require_nonnegative, require_positive
from beast.models import time_and_batch

__all__ = [
    "ExplorationSchedule",
    "check_transition_args",
    "find_exploration_schedule",
    "scaled_n_step_returns",
]

# The replay stores each window's length k <= n as a uint8 (n_steps,
# beast/experience/transition_replay.py).
_MAX_N_STEP = 255


class ExplorationSchedule(nn.Module):
    """A network with the exploration rate its actors act with: a buffer the learner sets
    from the run's env steps before publishing the weights, returned as an output
    ``epsilon [T, B]`` (`EpsilonGreedyPolicy(scheduled=True)` and
    `SquashedPolicy(scheduled=True)` read it). It travels with the weights to every actor,
    the central server and polybeast's env servers, and is in every checkpoint, so a
    resumed run explores as it would have."""

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
        # [T, B] from the observation, not the reward: a network that acts on the
        # observation alone exports with that input alone (beast/trained/policy.py).
        outputs["epsilon"] = self.epsilon.expand(*time_and_batch(inputs["obs"]))
        return outputs, core_state


def find_exploration_schedule(model: nn.Module) -> ExplorationSchedule | None:
    """The `ExplorationSchedule` among `model`'s modules (inside the engine's wrappers),
    or None."""
    return next((m for m in model.modules() if isinstance(m, ExplorationSchedule)), None)


def scaled_n_step_returns(
    data: Mapping[str, Tensor],
    context: LearnerContext,
    discounting: float,
    reward_clipping: str = "none",
) -> NStepReturns:
    """A batch's n-step returns G and discounts gamma^k, [B] each (beast/algos/nstep.py),
    from its reward windows as the loss must see them: scaled as the run says
    (`LearnerContext.scale_rewards`, --normalize_reward), then clipped."""
    rewards = context.scale_rewards({**data, "reward": data["n_step_rewards"]})
    return n_step_returns(clip_rewards(rewards, reward_clipping), data["n_steps"], discounting)


def check_transition_args(config: Any, networks: str) -> None:
    """The cross-field checks of the flags every transition learner has: --n_step,
    --replay_size and --learning_starts (which must fit in it), --discounting, --tau; and
    no --use_lstm, since single transitions carry no recurrent state (`networks`: what the
    algorithm trains, for that refusal)."""
    require_positive(config, "n_step", "replay_size", "batch_size")
    if config.n_step > _MAX_N_STEP:
        raise ConfigError(f"--n_step must be at most {_MAX_N_STEP}, got {config.n_step}")
    require_nonnegative(config, "learning_starts")
    if config.learning_starts > config.replay_size:
        raise ConfigError(
            f"--learning_starts {config.learning_starts} exceeds --replay_size"
            f" {config.replay_size}: learning would never start"
        )
    require_fraction(config, "discounting")
    if not 0.0 < config.tau <= 1.0:
        raise ConfigError(f"--tau must be in (0, 1], got {config.tau}")
    if config.use_lstm:
        raise ConfigError(
            f"--algo {config.algo} trains {networks} on single transitions; drop --use_lstm"
        )
