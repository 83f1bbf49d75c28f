"""Value rescaling h and its inverse (Pohlen et al. 2018), which R2D2 and the DQN family's
--value_rescaling apply to their targets: ``h^-1`` of the bootstrap value, the n-step
return added, ``h`` of the sum. Pure functions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_RESCALE_EPS",
    "inverse_value_rescaling",
    "value_rescaling",
]


# R2D2's defaults, here only as the defaults of the arguments below.
DEFAULT_RESCALE_EPS = 1e-3  # Pohlen et al. 2018; R2D2 section 2


def value_rescaling(x: Tensor, eps: float = DEFAULT_RESCALE_EPS) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018, eq. 4).

    Squashes returns of any scale into a range a network can regress on,
    without clipping rewards; R2D2 applies it to every target. Computed as
    ``sign(x) |x| / (sqrt(|x| + 1) + 1) + eps x``, the same value with no
    cancellation between sqrt(|x| + 1) and 1 for tiny |x|, so the round trip
    through `inverse_value_rescaling` is accurate from 1e-6 to 1e6.

    Args:
        x: float tensor of any shape.
        eps: the linear term's weight (> 0 makes h invertible with a
            Lipschitz inverse; 0 gives the plain signed square root).
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    abs_x = x.abs()
    return torch.sign(x) * abs_x / (torch.sqrt(abs_x + 1.0) + 1.0) + eps * x


def inverse_value_rescaling(x: Tensor, eps: float = DEFAULT_RESCALE_EPS) -> Tensor:
    """The exact inverse of `value_rescaling` (Pohlen et al. 2018, proposition A.2).

    The paper's closed form is

        h^-1(x) = sign(x) ( ((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1 ).

    Written as ``sign(x) (u - 1)(u + 1)`` with ``u = (s - 1) / (2 eps)`` and
    ``s = sqrt(1 + 4 eps (|x| + 1 + eps)) = sqrt((1 + 2 eps)^2 + 4 eps |x|)``,
    some algebra gives ``u - 1 = 2|x| / (1 + 2 eps + s)``: a sum of positive
    terms, where the literal form subtracts nearly equal numbers twice (for
    eps = 1e-3 and |x| = 1e-6 it loses all but ~3 digits in float32 and ~7 in
    float64). The rewrite also holds at eps = 0 (``h^-1(x) = sign(x)((|x| +
    1)^2 - 1)``) with no division by eps.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    abs_x = x.abs()
    s = torch.sqrt((1.0 + 2.0 * eps) ** 2 + 4.0 * eps * abs_x)
    u_minus_1 = 2.0 * abs_x / (1.0 + 2.0 * eps + s)
    return torch.sign(x) * u_minus_1 * (u_minus_1 + 2.0)
