"""The recurrent core of the built-in networks: one LSTM layer unrolled over [T, B]
inputs, each sample's state zeroed where its episode starts (actor-critic and Q-networks
alike).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from beast.models.base import CoreState, ModelError

__all__ = []


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
    if torch.compiler.is_compiling():
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
    """`_unroll_lstm` for a compiled learner step (beast/train_step.py): finding the chunk
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
