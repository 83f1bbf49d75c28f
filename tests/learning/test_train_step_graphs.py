"""beast.train_step's graphs themselves: CUDA graph replays match eager (with a GPU), and
what the trace rewrites (tanh, products in the BLAS's faster layout, batched products of
a dimension of one) computes what the eager operations do.
"""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch
from torch import Tensor

from beast.experience.contract import Batch
from beast.train_step import package, rewrites
from tests.support.train_steps import (
    PENDULUM,
    build,
    transition_batch,
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_match_eager():
    flags = ("--net_arch", "16,16", "--batch_size", "8")
    eager = build("sac", PENDULUM, "off", *flags)
    model, update, _ = build("sac", PENDULUM, "on", *flags, device="cuda")
    for seed in range(8):
        batch = transition_batch(8, seed, continuous=True)
        torch.manual_seed(seed)
        eager[1](copy.deepcopy(batch))
        torch.manual_seed(seed)
        update(Batch({k: v.cuda() for k, v in batch.data.items()}, batch.weights.cuda()))
    assert update.train_step.path == "CUDA graph"
    for a, b in zip(eager[0].parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_cuda_graph_captures_while_another_thread_copies_to_the_gpu():
    """Central inference copies each batch of observations to the GPU in a thread of its
    own while the learner captures its step: the capture must neither fail nor fail the
    copies (a capture in CUDA's global mode did both: "operation not permitted when
    stream is capturing", and Pong's run died of it on an H100)."""
    from beast.train_step.cuda_graph import CudaGraphStep

    def step(weights: Tensor, inputs: dict[str, Tensor]) -> tuple[Tensor]:
        weights.add_(inputs["x"].mean())
        return (weights * 2,)

    stop, errors = threading.Event(), []

    def copy_to_gpu() -> None:
        try:
            while not stop.is_set():
                torch.randn(64, 1024).to("cuda").sum().item()
        except Exception as error:  # the inference thread's failure, kept for the assert
            errors.append(error)

    copier = threading.Thread(target=copy_to_gpu)
    copier.start()
    try:
        for _ in range(20):
            weights = torch.zeros(4, device="cuda")
            graphed = CudaGraphStep(step, (weights, {"x": torch.ones(8, device="cuda")}))
            (out,) = graphed(weights, {"x": torch.full((8,), 3.0, device="cuda")})
            torch.testing.assert_close(out.cpu(), torch.full((4,), 6.0))
    finally:
        stop.set()
        copier.join()
    assert not errors, errors


def test_the_traces_tanh_is_tanh_to_float32_precision():
    """Traces write float32 tanh as a rational function (rewrites._tanh, for inductor's
    faster kernels): against tanh in float64, within 4e-7 everywhere, relative too
    (tiny values keep their precision), never past 1, NaN kept; float64 keeps tanh."""
    x = torch.cat(
        [
            torch.linspace(-12.0, 12.0, 2_000_001),
            torch.logspace(-30, 0, 1_000),
            -torch.logspace(-30, 0, 1_000),
            torch.tensor([0.0, 8.0, -8.0, 7.9999, 8.0001, 50.0, -50.0, math.inf, -math.inf]),
        ]
    )
    exact = torch.tanh(x.double())
    traced = rewrites._tanh(x)
    error = (traced.double() - exact).abs()
    assert error.max() <= 4e-7
    assert (error / exact.abs().clamp_min(1e-300)).max() <= 4e-7
    assert traced.abs().max() <= 1.0
    assert rewrites._tanh(torch.tensor([math.nan])).isnan().all()
    assert rewrites._tanh(x.double()) is NotImplemented


@pytest.mark.parametrize("faster", [True, False])
@pytest.mark.parametrize("members", [None, 2], ids=["mm", "bmm"])
def test_a_product_the_blas_takes_faster_transposed_is_traced_transposed(
    monkeypatch, faster, members
):
    """A first layer's weight gradient, gᵀ @ x with x of few columns, is what the BLAS
    computes fastest as (xᵀ @ g)ᵀ, for one network or an ensemble's stacked members:
    where the measurement (`rewrites._transposed_faster`, stubbed here) says so, the trace
    takes it that way, contiguous again for the ops that view it, with the same values;
    where not, the trace keeps the product as it was."""
    measured = []
    monkeypatch.setattr(
        rewrites, "_transposed_faster", lambda *layout: measured.append(layout) or faster
    )

    def weight_gradient(g, x):
        return (g.mT @ x).reshape(-1) * 2.0  # a view after the product, as a flat gradient

    batch = () if members is None else (members,)
    g, x = torch.randn(*batch, 256, 64), torch.randn(*batch, 256, 4)
    traced = package.trace(weight_gradient, (g, x))
    target = torch.ops.aten.mm.default if members is None else torch.ops.aten.bmm.default
    (product,) = [n for n in traced.graph.graph.nodes if n.target is target]
    # The product's layouts were measured: gᵀ [64, 256] (column-major) by x [256, 4].
    (layout,) = measured
    assert layout[0] == (*batch, 64, 256) and layout[1][-2:] == (1, 64)
    assert layout[2] == (*batch, 256, 4)
    first = product.args[0]
    assert (first.target is torch.ops.aten.permute.default) is faster
    # The same sums in another order: float32 rounding of 256-term sums of size ~16.
    torch.testing.assert_close(traced.graph(g, x), weight_gradient(g, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "rows, inner, columns, kept",
    [(256, 256, 1, False), (256, 1, 256, False), (1, 256, 4, False), (256, 256, 4, True)],
    ids=["output-layer", "outer-product", "row", "product"],
)
def test_a_batched_product_with_a_dimension_of_one_is_traced_as_products_and_a_sum(
    rows, inner, columns, kept
):
    """An ensemble's product with M, K or N of 1 (its scalar output layer, that layer's
    gradient) is traced as products and a sum (rewrites._bmm), with bmm's and baddbmm's
    values; others stay products."""
    a, b = torch.randn(2, rows, inner), torch.randn(2, inner, columns)
    bias = torch.randn(2, 1, columns)

    def products(a, b, bias):
        return (
            torch.bmm(a, b),
            torch.baddbmm(bias, a, b),
            torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0),
        )

    traced = package.trace(products, (a, b, bias))
    targets = {node.target for node in traced.graph.graph.nodes}
    assert (
        torch.ops.aten.bmm.default in targets or torch.ops.aten.baddbmm.default in targets
    ) is kept
    for got, want in zip(traced.graph(a, b, bias), products(a, b, bias), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_products_are_measured_in_their_own_layouts_even_repeating_ones():
    """The measurement builds operands in the trace's layouts, including an input
    expanded over an ensemble's members (stride 0), which no kernel may write into."""
    gradient = ((2, 64, 256), (64 * 256, 1, 64))  # gᵀ per member, column-major
    for inputs_stride in [(0, 4, 1), (256 * 4, 4, 1)]:  # x expanded, or one per member
        layout = (*gradient, (2, 256, 4), inputs_stride, torch.float32, torch.float32)
        assert rewrites._transposed_faster(*layout) in (True, False)
    assert rewrites._laid_out((0, 4), (4, 1), torch.float32).shape == (0, 4)
