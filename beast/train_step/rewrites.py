"""What a step's trace rewrites before inductor sees it (beast/train_step/package.py
`trace`): float32 tanh as a rational function, batched products as products and a sum,
and matrix products whose transposed form measured faster on this CPU, transposed."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["DECOMPOSITIONS", "transpose_slow_products"]


# tanh's 13th convergent of Lambert's continued fraction, x / (1 + x²/(3 + x²/(5 + ...
# + x²/25))), as x P(x²) / Q(x²) with P(0) = Q(0) = 1: the coefficients of P, then Q, in
# rising powers of x², exact ratios of integers rounded once.
_TANH_NUMERATOR = (
    1.0,
    0.14666666666666667,
    0.0052173913043478265,
    6.625258799171843e-05,
    3.2286836253274086e-07,
    5.179706350792634e-10,
    1.264885555749117e-13,
)
_TANH_DENOMINATOR = (
    1.0,
    0.48,
    0.03188405797101449,
    0.0006625258799171842,
    5.230467473030402e-06,
    1.5193805295658393e-08,
    1.1510458557316966e-11,
)
# Where the convergent reaches 1 in float32 (tanh(8) = 1 - 2.3e-7): its input is clamped
# there, beyond which it would overshoot.
_TANH_CLAMP = 8.0


def _tanh(x: Tensor) -> Any:
    """float32 tanh as the trace computes it: Lambert's continued fraction to its 13th
    convergent (`_TANH_NUMERATOR`), two polynomials of degree 6 in x² and a division,
    which inductor fuses with the operations around it. Inductor's tanh kernel is the
    accurate vector tanh, 26 us on 256x64 on this project's machine against 11.5 us for
    2 sigmoid(2x) - 1 (the form traced before) and less for this one (PPO CartPole's step
    calls it 4 times). Within 3.6e-7 of tanh, relative too, so tiny values keep their
    precision (`tests/learning/test_train_step.py`). Other dtypes keep tanh (NotImplemented: a
    float64 step keeps its precision)."""
    if x.dtype != torch.float32:
        return NotImplemented
    x = x.clamp(-_TANH_CLAMP, _TANH_CLAMP)
    x2 = x * x
    numerator = _polynomial(x2, _TANH_NUMERATOR)
    denominator = _polynomial(x2, _TANH_DENOMINATOR)
    return x * numerator / denominator


def _polynomial(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """sum_i coefficients[i] x^i, by Horner's rule."""
    value = x * coefficients[-1] + coefficients[-2]
    for coefficient in reversed(coefficients[:-2]):
        value = value * x + coefficient
    return value


def _bmm(a: Tensor, b: Tensor) -> Any:
    """A batched product [E, M, K] @ [E, K, N] with M, K or N of 1 (an ensemble's scalar
    output layer, its gradient's outer product), as products and a sum that inductor
    fuses with their neighbours; others stay products (NotImplemented: make_fx traces
    the operator itself). MKL's batched kernels take such a product slowly on this
    project's machine: 141 us for SAC's twin critics' output layer forward ([2, 256, 256]
    @ [2, 256, 1], 131k multiply-adds) and 112 us for its outer product, three and two
    of each a SAC step, at one thread."""
    if a.dtype not in (torch.float32, torch.float64) or b.dtype != a.dtype:
        return NotImplemented  # bf16's products rounded before their sum: kept whole
    rows, inner, columns = a.shape[-2], a.shape[-1], b.shape[-1]
    if inner == 1:
        return a * b
    if columns == 1:
        return (a * b.mT).sum(-1, keepdim=True)
    if rows == 1:
        return (a.mT * b).sum(-2, keepdim=True)
    return NotImplemented


def _baddbmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: float = 1, alpha: float = 1) -> Any:
    """beta bias + alpha a @ b, its product as `_bmm` takes it (NotImplemented where that
    keeps the product)."""
    product = _bmm(a, b)
    return NotImplemented if product is NotImplemented else beta * bias + alpha * product


# Operators the trace writes in other operators (make_fx's decompositions).
DECOMPOSITIONS = {
    torch.ops.aten.tanh.default: _tanh,
    torch.ops.aten.bmm.default: _bmm,
    torch.ops.aten.baddbmm.default: _baddbmm,
}

# A product is taken transposed where that measured this much faster or better.
_TRANSPOSED_GAIN = 0.6
# Products measured: those with a dimension this small; each form timed in rounds of
# about this many seconds.
_SMALL_DIMENSION = 32
_MEASURE_SECONDS = 2e-3


def transpose_slow_products(graph: torch.fx.GraphModule) -> None:
    """Each CPU matrix product of the trace (`mm`, and `bmm` of an ensemble's stacked
    members) that the BLAS computes much faster transposed, written transposed: A @ B as
    (Bᵀ @ Aᵀ)ᵀ, made contiguous again (a copy that fuses into what reads it).

    Why: the BLAS's speed depends on the operands' layouts, not only on the arithmetic.
    A first layer's weight gradient, gᵀ @ x with x of few columns (CartPole's 4 inputs,
    Pendulum's 3), takes a transposed [H, B] by a [B, 4]. At one thread on this
    project's machine, in MKL: 19-22 us against 5.7 for xᵀ @ g, the same numbers
    transposed, at H 64 and B 256 (PPO CartPole's step takes two, DQN's one); at H 256,
    81 us against 18.5 (SAC Pendulum's actor), and 154 against 31 for its twin critics'
    `bmm`. The mirror case is as slow the other way. So each product's two forms are
    timed once per process on this CPU, for its shapes, strides and dtype
    (`_transposed_faster`)."""
    transposes = {torch.ops.aten.mm.default: [1, 0], torch.ops.aten.bmm.default: [0, 2, 1]}
    permute = torch.ops.aten.permute.default
    changed = False
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in transposes:
            continue
        a, b = (arg.meta.get("val") for arg in node.args)
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.device.type == "cpu"):
            continue
        layout = (tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype, b.dtype)
        if not _transposed_faster(*layout):
            continue
        order, new = transposes[node.target], graph.graph.call_function
        with graph.graph.inserting_before(node):
            swapped = new(
                node.target,
                (new(permute, (node.args[1], order)), new(permute, (node.args[0], order))),
            )
            product = new(
                torch.ops.aten.clone.default,
                (new(permute, (swapped, order)),),
                {"memory_format": torch.contiguous_format},
            )
        node.replace_all_uses_with(product)
        graph.graph.erase_node(node)
        changed = True
    if changed:
        graph.graph.lint()
        graph.recompile()


@functools.cache
def _transposed_faster(
    shape_a: tuple[int, ...],
    stride_a: tuple[int, ...],
    shape_b: tuple[int, ...],
    stride_b: tuple[int, ...],
    dtype_a: torch.dtype,
    dtype_b: torch.dtype,
) -> bool:
    """Whether A @ B (2-d or batched 3-d) of these layouts takes under `_TRANSPOSED_GAIN`
    of its time as (Bᵀ @ Aᵀ)ᵀ made contiguous, at this thread's torch threads: each form
    the best of 3 rounds of about `_MEASURE_SECONDS`. Only a product with a dimension of
    at most `_SMALL_DIMENSION` is measured: the slow layouts found have one, and a large
    product would cost the trace tens of milliseconds to time."""
    rows, inner, columns = shape_a[-2], shape_a[-1], shape_b[-1]
    if min(rows, inner, columns) > _SMALL_DIMENSION:
        return False
    a, b = _laid_out(shape_a, stride_a, dtype_a), _laid_out(shape_b, stride_b, dtype_b)
    as_traced = _seconds_a_call(lambda: torch.matmul(a, b))
    transposed = _seconds_a_call(lambda: torch.matmul(b.mT, a.mT).mT.contiguous())
    return transposed < _TRANSPOSED_GAIN * as_traced


def _seconds_a_call(call: Callable[[], Any]) -> float:
    """`call`'s seconds, the best of 3 rounds of about `_MEASURE_SECONDS` (after one
    warm-up call, and one that sizes the rounds)."""
    call()
    started = time.perf_counter()
    call()
    calls = max(3, min(100, int(_MEASURE_SECONDS / (time.perf_counter() - started))))
    rounds = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter() - started) / calls)
    return min(rounds)


def _laid_out(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Random values in this layout, which may repeat elements (stride 0: an input
    expanded over an ensemble's members)."""
    reach = sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    extent = 0 if 0 in shape else 1 + reach
    return torch.empty(extent, dtype=dtype).uniform_(-1.0, 1.0).as_strided(shape, stride)
