"""Q-networks for the DQN family, R2D2 and Ape-X: torso -> [LSTM] -> a dueling or plain
head, with one value or a distribution over atoms per action.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor, nn

from beast.models.base import _RELU_GAIN, CoreState, ObsShape, _orthogonal_init
from beast.models.lstm import _Trunk

__all__ = [
    "DEFAULT_Q_HEAD_SIZE",
    "DEFAULT_Q_LSTM_SIZE",
    "DistributionalQOutput",
    "QNet",
    "QOutput",
]


# R2D2's LSTM (Kapturowski et al. 2019, section 2.3) and the width of each dueling stream for
# the image torsos (R2D2 and Ape-X: 512).
DEFAULT_Q_LSTM_SIZE = 512
DEFAULT_Q_HEAD_SIZE = 512


class QOutput(NamedTuple):
    """What a Q-network returns for each step.

    q_values: float32 [T, B, num_actions], Q(x_t, a) for every action a.
    """

    q_values: Tensor


class DistributionalQOutput(NamedTuple):
    """What a distributional Q-network returns for each step (C51, Rainbow).

    q_logits: float32 [T, B, num_actions, num_atoms], the logits of each action's return
        distribution over the algorithm's fixed support (Bellemare et al. 2017).
    """

    q_logits: Tensor


class QNet(_Trunk):
    """torso -> [LSTM] (`_Trunk`) -> Q head, dueling or not, with one value or a
    distribution per action.

    Dueling (Wang et al. 2016, eq. 9): ``Q = V + A - mean_a A``, from a value stream and an
    advantage stream, each ``Linear(head_size) -> ReLU -> Linear`` (one ``Linear`` on the
    MLP torso); subtracting the mean
    advantage makes V and A identifiable without changing the greedy action. Without it,
    one such stream gives Q. With ``num_atoms`` > 1 every output is a vector of logits
    over the atoms (C51), and the dueling sum is taken per atom (Rainbow, section 3).

    Args:
        torso: maps float32 [N, *obs_shape] to float32 [N, torso_size].
        torso_size: features per sample out of ``torso``.
        obs_shape: shape of one observation.
        num_actions: size of the discrete action space.
        use_lstm: R2D2's recurrent core, fed ``[features, clipped reward, one-hot last action]``
            and reset per sample at ``done``; without it the head reads the features only.
        use_last_action_reward: whether the core (or the head) reads the clipped reward
            and the last action; None: with the LSTM only, as above.
        lstm_size: LSTM hidden size (ignored without ``use_lstm``).
        head_size: width of each stream's hidden layer; None for streams of one linear
            layer (the MLP torso's layers are the hidden ones, as in SB3's QNetwork).
        dueling: the dueling head, else one stream.
        num_atoms: 1 for Q-values (`QOutput`), else the atoms of a distributional head
            (`DistributionalQOutput`).
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
        head_size: int | None,
        dueling: bool = True,
        num_atoms: int = 1,
        use_last_action_reward: bool | None = None,
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.num_atoms = num_atoms
        core_input_size = self._build_trunk(
            torso,
            torso_size,
            obs_shape,
            use_lstm=use_lstm,
            lstm_size=lstm_size,
            action_size=num_actions,
            use_last_action_reward=(
                use_lstm if use_last_action_reward is None else use_last_action_reward
            ),
        )
        head_input_size = lstm_size if use_lstm else core_input_size

        def stream(outputs: int) -> nn.Sequential:
            if head_size is None:
                layers = nn.Sequential(nn.Linear(head_input_size, outputs))
                _orthogonal_init(layers[0], 1.0)
                return layers
            layers = nn.Sequential(
                nn.Linear(head_input_size, head_size), nn.ReLU(), nn.Linear(head_size, outputs)
            )
            _orthogonal_init(layers[0], _RELU_GAIN)
            _orthogonal_init(layers[2], 1.0)
            return layers

        self.value = stream(num_atoms) if dueling else None
        # The advantage stream of a dueling head, or the Q stream itself.
        self.action_values = stream(num_actions * num_atoms)

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: CoreState = ()
    ) -> tuple[QOutput | DistributionalQOutput, CoreState]:
        """Run T steps for B samples; the ``inputs`` contract is beast/models/__init__.py's.

        Feed-forward models read only ``inputs["obs"]`` (and the reward and last action
        if ``use_last_action_reward``) and return the empty state.
        """
        x, T, B = self._features(inputs["obs"])
        if self.core is None:
            core_output = self._core_input(x, inputs)
            core_state = ()
        else:
            with _float32(x):
                core_input = self._core_input(x.float(), inputs)
                core_output, core_state = self._unroll(core_input, inputs["done"], core_state)
        q = _output_in_float32(self.action_values, core_output)
        q = q.view(T * B, self.num_actions, self.num_atoms)
        if self.value is not None:
            value = _output_in_float32(self.value, core_output).unsqueeze(1)
            q = value + q - q.mean(dim=1, keepdim=True)
        if self.num_atoms > 1:
            return DistributionalQOutput(q.view(T, B, self.num_actions, self.num_atoms)), core_state
        return QOutput(q.view(T, B, self.num_actions)), core_state


def _float32(x: Tensor) -> contextlib.AbstractContextManager:
    """No autocast inside (a bf16 learner's, --precision): float32 arithmetic. Where
    autocast is off already (actors, fp32 learners), nothing: even a disabled autocast
    costs its enter and exit on every forward pass."""
    if not torch.is_autocast_enabled(x.device.type):
        return contextlib.nullcontext()
    return torch.autocast(x.device.type, enabled=False)


def _output_in_float32(stream: nn.Sequential, x: Tensor) -> Tensor:
    """A Q stream whose last layer runs in float32 whatever the autocast around it: a bf16
    learner (--precision) runs the torso's convolutions and the streams' hidden layers in
    bf16 where the CPU or GPU has it, and the Q-values keep the resolution their targets
    need (bf16's 8 bits are 0.016 at Q = 3, as fine as late TD errors). The recurrent
    core runs in float32 too: its state carries rounding from step to step."""
    *hidden_layers, last = stream  # (slicing a Sequential builds a new one: 15 us a call)
    for layer in hidden_layers:
        x = layer(x)
    with _float32(x):
        return last(x.float())
