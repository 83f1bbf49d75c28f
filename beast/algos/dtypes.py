"""The dtype rule of beast.algos' pure numerics (V-trace, GAE, n-step and C51 targets,
value rescaling, SAC/TD3 targets, the losses and the action distributions).

A function's floating outputs have the dtype its floating tensor inputs promote to
(``torch.promote_types``: float32 with float32 gives float32, float64 anywhere gives
float64), so float64 tests and float64 research code get float64 all the way through,
and float32 runs stay float32. Each output follows the inputs it is computed from
(a priority ``|y - Q|`` ignores the importance weights' dtype). What does not count:
integer and bool tensors (actions, step counts, episode flags), Python numbers, and
0-dim tensors that stand for a constant (SAC's ``alpha``), which torch's own
arithmetic (``torch.result_type``) treats as Python numbers.

Functions that accumulate (over time, an n-step window, the atoms of a distribution,
a batch) compute in at least float32, as `compute_dtype` gives: bfloat16 or float16
inputs from an autocast forward pass (8 or 11 mantissa bits) cannot hold a discounted
sum faithfully, so they come back float32. Each such function says so.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["compute_dtype"]


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """``torch.promote_types`` over the tensors' dtypes and float32 (module docstring)."""
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors), torch.float32)
