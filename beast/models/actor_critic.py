"""The actor-critic networks' shared core and heads: a policy head (logits for discrete
actions, a diagonal Gaussian for continuous ones) and a baseline head, on a torso the
family modules give (beast/models/atari.py, resnet.py, mlp.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from beast.models.base import (
    _BASELINE_GAIN,
    _POLICY_GAIN,
    DEFAULT_LSTM_SIZE,
    AgentOutput,
    CoreState,
    GaussianAgentOutput,
    ObsShape,
    _orthogonal_init,
)
from beast.models.lstm import _Trunk

__all__ = [
    "ActorCriticNet",
    "ImageActorCriticNet",
]


class _PolicyHeads(nn.Module):
    """The policy and baseline heads on a feature vector, for discrete or continuous actions.

    Discrete: ``policy`` is a linear layer to the logits. Continuous: ``policy`` gives the
    Gaussian's mean and ``log_std`` is a state-independent vector of d parameters.
    """

    def _build_heads(
        self, in_size: int, num_actions: int, action_dim: int, log_std_init: float
    ) -> None:
        if (num_actions > 0) == (action_dim > 0):
            raise ValueError(
                f"give num_actions (discrete) or action_dim (continuous), got {num_actions}"
                f" and {action_dim}"
            )
        self.num_actions, self.action_dim = num_actions, action_dim
        self.policy = nn.Linear(in_size, action_dim or num_actions)
        if action_dim:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        _orthogonal_init(self.policy, _POLICY_GAIN)

    def _agent_output(
        self, policy_features: Tensor, baseline: Tensor, T: int, B: int
    ) -> AgentOutput | GaussianAgentOutput:
        if not self.action_dim:
            return AgentOutput(self.policy(policy_features).view(T, B, self.num_actions), baseline)
        mean = self.policy(policy_features).view(T, B, self.action_dim)
        return GaussianAgentOutput(mean, self.log_std.expand_as(mean), baseline)


class ActorCriticNet(_PolicyHeads, _Trunk):
    """The trunk (`_Trunk`: torso -> [LSTM]) and heads; subclasses provide the torso.
    Without the LSTM the heads read what it would: the features, and the reward and last
    action if ``use_last_action_reward``.

    Args:
        torso: maps float32 [N, *obs_shape] to float32 [N, torso_size].
        torso_size: features per sample out of ``torso``.
        obs_shape: shape of one observation.
        num_actions: size of a discrete action space (0 for continuous actions).
        use_lstm: put a one-layer LSTM between the torso and the heads.
        lstm_size: LSTM hidden size (ignored without ``use_lstm``).
        action_dim: d of a continuous action space (0 for discrete actions): a Gaussian
            head (`GaussianAgentOutput`) instead of logits.
        log_std_init: the Gaussian's initial log standard deviation.
        use_last_action_reward: the core also reads the clipped reward and the last action
            (`_Trunk`); the subclasses choose when it is not given.
    """

    def __init__(
        self,
        torso: nn.Module,
        torso_size: int,
        obs_shape: ObsShape,
        num_actions: int,
        *,
        use_lstm: bool,
        lstm_size: int,
        action_dim: int = 0,
        log_std_init: float = 0.0,
        use_last_action_reward: bool = True,
    ) -> None:
        super().__init__()
        core_input_size = self._build_trunk(
            torso,
            torso_size,
            obs_shape,
            use_lstm=use_lstm,
            lstm_size=lstm_size,
            action_size=action_dim or num_actions,
            use_last_action_reward=use_last_action_reward,
        )
        core_output_size = lstm_size if use_lstm else core_input_size
        self._build_heads(core_output_size, num_actions, action_dim, log_std_init)
        self.baseline = nn.Linear(core_output_size, 1)
        _orthogonal_init(self.baseline, _BASELINE_GAIN)

    def _action_features(self, last_action: Tensor) -> Tensor:
        """[N] indices -> one-hot [N, num_actions]; continuous [N, d] -> float [N, d]."""
        if self.action_dim:
            return last_action.float()
        return super()._action_features(last_action)

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: CoreState = ()
    ) -> tuple[AgentOutput | GaussianAgentOutput, CoreState]:
        """Run T steps for B samples. See beast/models/__init__.py for the ``inputs`` contract.

        For recurrent models an empty ``core_state`` means ``initial_state(B)``. The returned
        state is the one after step T-1, so carrying it into the next call gives the same
        outputs as one call over all steps (up to float32 rounding, see
        tests/models/test_models.py).
        """
        x, T, B = self._features(inputs["obs"])
        core_input = self._core_input(x, inputs)
        if self.core is None:
            core_output = core_input
            core_state = ()
        else:
            core_output, core_state = self._unroll(core_input, inputs["done"], core_state)

        baseline = self.baseline(core_output).view(T, B)
        return self._agent_output(core_output, baseline, T, B), core_state


class ImageActorCriticNet(ActorCriticNet):
    """`ActorCriticNet` on an image torso that its family names (`build_torso`: obs_shape
    [C, H, W] -> (torso, features), initialised); AtariNet and ResNet are two of these.
    The LSTM is ``lstm_size`` wide (default 256, IMPALA's). The core reads the last
    action and reward unless ``use_last_action_reward`` is False: one frame stack shows
    neither (TorchBeast's AtariNet, IMPALA's networks)."""

    build_torso: Callable[[tuple[int, ...]], tuple[nn.Module, int]]

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        *,
        use_lstm: bool = False,
        lstm_size: int = DEFAULT_LSTM_SIZE,
        action_dim: int = 0,
        log_std_init: float = 0.0,
        use_last_action_reward: bool | None = None,
    ) -> None:
        obs_shape = tuple(obs_shape)
        torso, torso_size = type(self).build_torso(obs_shape)
        super().__init__(
            torso,
            torso_size,
            obs_shape,
            num_actions,
            use_lstm=use_lstm,
            lstm_size=lstm_size,
            action_dim=action_dim,
            log_std_init=log_std_init,
            use_last_action_reward=use_last_action_reward is not False,
        )
