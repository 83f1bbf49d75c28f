"""The recurrent core of the built-in networks: one LSTM layer unrolled over [T, B]
inputs, each sample's state zeroed where its episode starts, on a torso's features
(actor-critic and Q-networks alike: `_Trunk`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from beast.models.base import (
    CoreState,
    ModelError,
    ObsShape,
    _obs_shape,
    float_obs,
    time_and_batch,
)
from beast.util.graph_capture import capturing

__all__ = []


class _Trunk(nn.Module):
    """torso -> [LSTM]: the trunk the actor-critic and Q-networks share (their heads are
    theirs). What the core (the LSTM, one layer of ``lstm_size``, or without it the heads)
    reads is the torso's features and, with ``use_last_action_reward``, the reward
    clipped to [-1, 1] and the last action's features (`_action_features`: one-hot, or a
    continuous action's values), as IMPALA's network does (Espeholt et al. 2018, fig. 3)
    and R2D2's (Kapturowski et al. 2019, section 2.3)."""

    def _build_trunk(
        self,
        torso: nn.Module,
        torso_size: int,
        obs_shape: ObsShape,
        *,
        use_lstm: bool,
        lstm_size: int,
        action_size: int,
        use_last_action_reward: bool,
    ) -> int:
        """Keep the torso and build the LSTM (or None); returns the size of what the core
        reads per sample (the features, then the reward and ``action_size`` action
        features if ``use_last_action_reward``)."""
        self.obs_shape = _obs_shape(obs_shape)
        self.use_lstm = use_lstm
        self.use_last_action_reward = use_last_action_reward
        self.torso = torso
        core_input_size = torso_size + (1 + action_size if use_last_action_reward else 0)
        self.core = nn.LSTM(core_input_size, lstm_size, num_layers=1) if use_lstm else None
        return core_input_size

    num_actions: int

    def _action_features(self, last_action: Tensor) -> Tensor:
        """The last actions' features: [N] indices -> one-hot float [N, num_actions]. A
        comparison, not F.one_hot, which checks the indices' range on the host (a sync on
        CUDA, and no graph can hold it)."""
        actions = torch.arange(self.num_actions, device=last_action.device)
        return (last_action.unsqueeze(-1) == actions).float()

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> CoreState:
        """Zero recurrent state for ``batch_size`` samples (``()`` without an LSTM), on
        ``device``; None means the device of the model's parameters."""
        if self.core is None:
            return ()
        if device is None:
            device = self.core.weight_hh_l0.device
        return _zero_state(self.core, batch_size, device)

    def _features(self, obs: Any) -> tuple[Tensor, int, int]:
        """The torso's features of obs [T, B, ...] as [T*B, F], and T and B."""
        T, B = time_and_batch(obs)
        return self.torso(float_obs(obs)), T, B

    def _core_input(self, features: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
        """What the core reads (class docstring): [T*B, F + 1 + A], or the features
        [T*B, F] alone."""
        if not self.use_last_action_reward:
            return features
        reward = inputs["reward"].flatten(0, 1).float().clamp(-1.0, 1.0).unsqueeze(1)
        last_action = self._action_features(inputs["last_action"].flatten(0, 1))
        return torch.cat([features, reward, last_action], dim=1)

    def _unroll(
        self, core_input: Tensor, done: Tensor, core_state: CoreState
    ) -> tuple[Tensor, CoreState]:
        """The LSTM over core_input [T*B, F] from core_state, reset where done [T, B] is
        set: ([T*B, lstm_size], the state after step T-1)."""
        assert self.core is not None
        T, B = done.shape
        output, core_state = _unroll_lstm(self.core, core_input.view(T, B, -1), done, core_state)
        return output.flatten(0, 1), core_state


def _zero_state(core: nn.LSTM, batch_size: int, device: torch.device | str) -> CoreState:
    shape = (core.num_layers, batch_size, core.hidden_size)
    return (torch.zeros(shape, device=device), torch.zeros(shape, device=device))


def _unroll_lstm(
    core: nn.LSTM, core_input: Tensor, done: Tensor, core_state: CoreState
) -> tuple[Tensor, CoreState]:
    """LSTM over core_input [T, B, F], zeroing a sample's state where done[t] is set.

    Rather than stepping the LSTM once per t (TorchBeast), split T at the steps where any
    sample starts an episode and run one LSTM call per chunk: the state is only reset at
    chunk starts, so this is the same computation, but an 80-step learner unroll with no
    episode end is one fused call instead of 80. Returns (output [T, B, lstm_size], state).
    An empty ``core_state`` means zeros.
    """
    T, B = done.shape
    if not core_state:
        core_state = _zero_state(core, B, core_input.device)
    # [T, 1, B, 1]: indexing t gives [1, B, 1], broadcasting over (layers, B, hidden).
    done = done.bool().view(T, 1, B, 1)
    if capturing():
        return _lstm_steps(core, core_input, done, core_state)
    # Chunk starts: 0, then every t > 0 where some sample's episode starts. T == 1 is the
    # actors' path and skips the search, which would cost a host sync on GPU.
    starts = [0]
    if T > 1:
        starts += (done[1:].flatten(1).any(dim=1).nonzero().flatten() + 1).tolist()
    outputs = []
    for start, end in zip(starts, [*starts[1:], T], strict=True):
        # masked_fill, not a multiply by (1 - done): a reset must also clear NaN/inf (e.g.
        # debug sentinels in an unwritten state buffer), and 0 * NaN is NaN.
        core_state = tuple(s.masked_fill(done[start], 0.0) for s in core_state)
        output, core_state = core(core_input[start:end], core_state)
        outputs.append(output)
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), tuple(core_state)


def _lstm_steps(
    core: nn.LSTM, core_input: Tensor, done: Tensor, core_state: CoreState
) -> tuple[Tensor, CoreState]:
    """`_unroll_lstm` for a compiled learner step (beast/train_step): finding the chunk
    starts reads the batch on the host, which a graph cannot, so here every step resets
    its samples' state and runs the LSTM's cell arithmetic (nn.LSTM's: gates i, f, g, o;
    c' = f c + i g, h' = o tanh(c')), the input's part of every gate for all T steps in one
    matrix product. One layer, no projection, as beast's models build it."""
    if core.num_layers != 1 or core.proj_size or core.bidirectional or not core.bias:
        raise ModelError("a compiled step runs one-layer, unidirectional LSTMs with biases")
    weight_ih, weight_hh = core.weight_ih_l0, core.weight_hh_l0
    input_gates = core_input @ weight_ih.t() + core.bias_ih_l0 + core.bias_hh_l0  # [T, B, 4H]
    h, c = core_state[0][0], core_state[1][0]  # [B, H]
    outputs = []
    for t in range(core_input.shape[0]):
        reset = done[t, 0]  # [B, 1]
        h, c = h.masked_fill(reset, 0.0), c.masked_fill(reset, 0.0)
        gates = input_gates[t] + h @ weight_hh.t()
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), (h.unsqueeze(0), c.unsqueeze(0))
