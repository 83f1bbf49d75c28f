"""Distributional targets over a fixed support (C51, Rainbow): the target distribution at
(x_{s+k}, a*) under theta-, shifted and shrunk by ``G + gamma^k z_j`` (G alone when
terminal), clipped to [z_1, z_N] and projected back onto the support (Bellemare et al.
2017, algorithm 1: each atom's mass split between its two neighbours in proportion to
closeness). Pure functions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from beast.algos.dtypes import compute_dtype
from beast.algos.nstep import NStepReturns

__all__ = [
    "categorical_projection",
]


@torch.no_grad()
def categorical_projection(
    returns: NStepReturns, terminal: Tensor, next_probs: Tensor, support: Tensor
) -> Tensor:
    """Project the target distribution onto the support (Bellemare et al. 2017, alg. 1).

    Atom j of the next distribution moves to ``Tz_j = clamp(G + gamma^k z_j, z_1, z_N)``
    (``G`` when terminal), at ``b_j = (Tz_j - z_1) / dz`` in atom units; its probability
    is split between atoms ``l = floor(b_j)`` and ``u = ceil(b_j)`` as ``(u - b_j)`` and
    ``(b_j - l)``, all to l when b_j falls on an atom.

    Args:
        returns: `n_step_returns` ([B] each).
        terminal: bool [B].
        next_probs: float [B, N], p_j(x_{s+k}, a*) under the target network.
        support: float [N], evenly spaced z_1 < ... < z_N.

    Returns:
        float [B, N], rows summing to 1 (as next_probs' do), in the promoted dtype of
        the four float inputs, at least float32.
    """
    dtype = compute_dtype(returns.returns, returns.discounts, next_probs, support)
    support = support.to(dtype)
    num_atoms = support.shape[0]
    # Tensors, not Python floats: the support may be a graph's input (a module buffer),
    # whose values a compiled step never reads on the host.
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (num_atoms - 1)
    discounts = torch.where(terminal, 0.0, returns.discounts.to(dtype)).unsqueeze(1)
    shifted = returns.returns.to(dtype).unsqueeze(1) + discounts * support.unsqueeze(0)
    shifted = shifted.clamp(v_min, v_max)
    position = (shifted - v_min) / delta  # [B, N], in [0, N - 1]
    lower = position.floor().clamp(0, num_atoms - 1)
    upper = position.ceil().clamp(0, num_atoms - 1)
    probs = next_probs.to(dtype)
    on_atom = (upper == lower).float()
    target = torch.zeros_like(probs)
    target.scatter_add_(1, lower.long(), probs * (upper - position + on_atom))
    target.scatter_add_(1, upper.long(), probs * (position - lower))
    return target
