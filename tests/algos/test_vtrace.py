"""Contract of beast.algos.vtrace.

In order of strength: an independent NumPy reference written from the
paper's definition (explicit double sum and explicit trace product, float64,
O(T^3)); small cases worked by hand; invariants (detached outputs, dtypes,
the shape contract of scalable_agent and TorchBeast).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from beast.algos import vtrace
from tests.support.references import numpy_log_softmax, vtrace_reference

EPS32 = float(np.finfo(np.float32).eps)


def random_inputs(shape, seed, log_rho_std):
    """float32-representable inputs (so the reference sees exactly what torch sees)."""
    rng = np.random.default_rng(seed)
    batch_shape = shape[1:]
    # Random episode ends: about one step in five has discount exactly 0.
    discounts = np.where(rng.random(shape) < 0.2, 0.0, 0.9)
    arrays = {
        "log_rhos": rng.normal(0.0, log_rho_std, shape),
        "discounts": discounts,
        "rewards": rng.normal(0.0, 1.0, shape),
        "values": rng.normal(0.0, 1.0, shape),
        "bootstrap_value": rng.normal(0.0, 1.0, batch_shape),
    }
    return {k: v.astype(np.float32) for k, v in arrays.items()}


def to_torch(arrays):
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


CLIPS = {
    # (clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold)
    "unclipped": (None, None, None),
    "default": (1.0, 1.0, 1.0),
    "tight_rho": (0.5, 2.0, 0.5),
    "loose_rho": (2.0, 0.5, 1.0),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 3), (5, 4), (16, 2), (33, 3), (7, 2, 3)])
@pytest.mark.parametrize("clips", list(CLIPS.values()), ids=list(CLIPS))
@pytest.mark.parametrize("lambda_", [1.0, 0.7, 0.0])
def test_matches_paper_reference(seed, shape, clips, lambda_):
    clip_rho, clip_pg_rho, clip_c = clips
    # Unclipped traces multiply raw ratios, so keep them moderate there: with
    # std 1 the products over 33 steps reach e^10 and the test would measure
    # float32 range rather than the algorithm.
    arrays = random_inputs(shape, seed, log_rho_std=0.5 if clip_c is None else 1.0)
    expected_vs, expected_pg, vs_scale, pg_scale = vtrace_reference(
        **arrays,
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
        lambda_=lambda_,
        clip_c_threshold=clip_c,
    )
    out = vtrace.from_importance_weights(
        **to_torch(arrays),
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
        lambda_=lambda_,
        clip_c_threshold=clip_c,
    )
    assert out.vs.dtype == torch.float32 and out.pg_advantages.dtype == torch.float32
    assert out.vs.shape == shape and out.pg_advantages.shape == shape
    # Tolerance: any float32 evaluation of a sum of n products of up to n
    # factors each errs by at most about 2n * eps * (sum of |terms|)
    # (Higham, ch. 3); 3n + 10 leaves room for exp() and the pg step.
    bound = (3 * shape[0] + 10) * EPS32
    np.testing.assert_array_less(np.abs(out.vs.numpy() - expected_vs), bound * vs_scale + 1e-30)
    np.testing.assert_array_less(
        np.abs(out.pg_advantages.numpy() - expected_pg), bound * pg_scale + 1e-30
    )


def hand_inputs(discounts, ratios=(1.0, 1.0, 1.0)):
    """T=3, B=1: rewards 1, 2, 3; values 0.5, -1, 4; bootstrap 10 (float64)."""

    def col(xs):
        return torch.tensor(xs, dtype=torch.float64).unsqueeze(1)

    return {
        "log_rhos": col([math.log(x) for x in ratios]),
        "discounts": col(discounts),
        "rewards": col([1.0, 2.0, 3.0]),
        "values": col([0.5, -1.0, 4.0]),
        "bootstrap_value": torch.tensor([10.0], dtype=torch.float64),
    }


def test_on_policy_is_n_step_return():
    # rho = c = 1 and lambda = 1: the V(x_t) telescope away and v_s is the
    # discounted return bootstrapped from V(x_3) = 10:
    #   v_2 = 3 + 0.9*10 = 12
    #   v_1 = 2 + 0.9*3 + 0.81*10 = 12.8
    #   v_0 = 1 + 0.9*2 + 0.81*3 + 0.729*10 = 12.52
    # pg_s = r_s + 0.9 v_{s+1} - V(x_s):
    #   1 + 0.9*12.8 - 0.5 = 12.02, 2 + 0.9*12 + 1 = 13.8, 3 + 9 - 4 = 8
    out = vtrace.from_importance_weights(
        **hand_inputs([0.9, 0.9, 0.9]), clip_rho_threshold=None, clip_pg_rho_threshold=None
    )
    # Tolerance: float64 arithmetic on numbers of order 10.
    torch.testing.assert_close(out.vs[:, 0].tolist(), [12.52, 12.8, 12.0], rtol=0, atol=1e-12)
    torch.testing.assert_close(
        out.pg_advantages[:, 0].tolist(), [12.02, 13.8, 8.0], rtol=0, atol=1e-12
    )


def test_episode_end_cuts_the_bootstrap():
    # The transition out of x_1 ends the episode (discount 0): v_1 = r_1 and
    # nothing after step 1 reaches v_0 = 1 + 0.9*2 = 2.8; v_2 = 3 + 0.9*10.
    # pg: 1 + 0.9*2 - 0.5 = 2.3, 2 + 0 + 1 = 3, 3 + 9 - 4 = 8.
    out = vtrace.from_importance_weights(**hand_inputs([0.9, 0.0, 0.9]))
    # Tolerance: float64 arithmetic on numbers of order 10.
    torch.testing.assert_close(out.vs[:, 0].tolist(), [2.8, 2.0, 12.0], rtol=0, atol=1e-12)
    torch.testing.assert_close(
        out.pg_advantages[:, 0].tolist(), [2.3, 3.0, 8.0], rtol=0, atol=1e-12
    )


def test_lambda_zero_is_one_step_target():
    # lambda = 0 kills every trace: v_s = V(x_s) + rho_s (r_s + 0.9 V(x_{s+1}) - V(x_s)).
    # Ratios 2, 0.5, 1 clipped at 1 give rho = 1, 0.5, 1:
    #   v_0 = 0.5 + (1 - 0.9 - 0.5) = 0.1
    #   v_1 = -1 + 0.5*(2 + 3.6 + 1) = 2.3
    #   v_2 = 4 + (3 + 9 - 4) = 12
    out = vtrace.from_importance_weights(
        **hand_inputs([0.9, 0.9, 0.9], ratios=(2.0, 0.5, 1.0)), lambda_=0.0
    )
    # Tolerance: float64, exp(log(x)) round-trips to ~1 ulp.
    torch.testing.assert_close(out.vs[:, 0].tolist(), [0.1, 2.3, 12.0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("clip", "expected_vs", "expected_pg"),
    [
        # Ratios 2, 0.5; rewards 1, 1; V = 0 everywhere; gamma = 1.
        # clip 1: rho = c = 1, 0.5; delta = 1, 0.5;
        #   v_1 = 0.5, v_0 = 1 + 1*0.5 = 1.5; pg_0 = 1*(1 + 0.5) = 1.5, pg_1 = 0.5*1.
        (1.0, [1.5, 0.5], [1.5, 0.5]),
        # unclipped: rho = c = 2, 0.5; delta = 2, 0.5;
        #   v_1 = 0.5, v_0 = 2 + 2*0.5 = 3; pg_0 = 2*(1 + 0.5) = 3, pg_1 = 0.5.
        (None, [3.0, 0.5], [3.0, 0.5]),
    ],
)
def test_off_policy_by_hand(clip, expected_vs, expected_pg):
    out = vtrace.from_importance_weights(
        log_rhos=torch.tensor([[math.log(2.0)], [math.log(0.5)]], dtype=torch.float64),
        discounts=torch.ones(2, 1, dtype=torch.float64),
        rewards=torch.ones(2, 1, dtype=torch.float64),
        values=torch.zeros(2, 1, dtype=torch.float64),
        bootstrap_value=torch.zeros(1, dtype=torch.float64),
        clip_rho_threshold=clip,
        clip_pg_rho_threshold=clip,
        clip_c_threshold=clip,
    )
    # Tolerance: float64, exp(log(x)) round-trips to ~1 ulp.
    torch.testing.assert_close(out.vs[:, 0].tolist(), expected_vs, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.pg_advantages[:, 0].tolist(), expected_pg, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1, 2), (6, 4, 5), (20, 3, 18)])
def test_from_logits_matches_importance_weights(shape):
    rng = np.random.default_rng(7)
    num_steps, batch_size, num_actions = shape
    behavior_logits = rng.normal(0.0, 2.0, shape).astype(np.float32)
    target_logits = rng.normal(0.0, 2.0, shape).astype(np.float32)
    actions = rng.integers(0, num_actions, (num_steps, batch_size))
    arrays = random_inputs((num_steps, batch_size), seed=3, log_rho_std=1.0)
    del arrays["log_rhos"]

    def pick(log_probs):
        return np.take_along_axis(log_probs, actions[..., None], -1)[..., 0]

    behavior_lp = pick(numpy_log_softmax(behavior_logits))
    target_lp = pick(numpy_log_softmax(target_logits))
    log_rhos = target_lp - behavior_lp

    out = vtrace.from_logits(
        behavior_policy_logits=torch.from_numpy(behavior_logits),
        target_policy_logits=torch.from_numpy(target_logits),
        actions=torch.from_numpy(actions),
        **to_torch(arrays),
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
    )
    # Tolerance: float32 log-softmax of logits of size ~2*3 errs by a few
    # eps * (|logit| + log A) ~ 1e-6; 1e-5 is a comfortable bound.
    np.testing.assert_allclose(out.behavior_action_log_probs.numpy(), behavior_lp, atol=1e-5)
    np.testing.assert_allclose(out.target_action_log_probs.numpy(), target_lp, atol=1e-5)
    np.testing.assert_allclose(out.log_rhos.numpy(), log_rhos, atol=2e-5)

    expected = vtrace.from_importance_weights(
        log_rhos=torch.from_numpy(log_rhos.astype(np.float32)),
        **to_torch(arrays),
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
    )
    # Tolerance: the log_rhos differ by <= 2e-5, moving the clipped ratios
    # (<= 1) by <= 2e-5 relative; vs and pg are O(10) sums of such terms.
    torch.testing.assert_close(out.vs, expected.vs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.pg_advantages, expected.pg_advantages, rtol=1e-4, atol=1e-4)


def test_action_log_probs_picks_the_action():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # probabilities 1/4, 3/4
    out = vtrace.action_log_probs(logits, torch.tensor([[1]]))
    # Tolerance: float32 log-softmax of O(1) numbers.
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75)]]), rtol=0, atol=1e-6)


def test_outputs_are_detached_targets():
    arrays = to_torch(random_inputs((4, 2), seed=0, log_rho_std=1.0))
    for tensor in arrays.values():
        tensor.requires_grad_(True)
    out = vtrace.from_importance_weights(**arrays)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad

    logits = torch.randn(4, 2, 3, requires_grad=True)
    del arrays["log_rhos"]
    out = vtrace.from_logits(logits, logits, torch.zeros(4, 2, dtype=torch.long), **arrays)
    assert all(not tensor.requires_grad for tensor in out)


def test_low_precision_inputs_compute_in_float32():
    arrays = random_inputs((5, 3), seed=0, log_rho_std=1.0)
    out32 = vtrace.from_importance_weights(**to_torch(arrays))
    out16 = vtrace.from_importance_weights(
        **{k: v.to(torch.bfloat16) for k, v in to_torch(arrays).items()}
    )
    assert out16.vs.dtype == torch.float32
    # Tolerance: bf16 inputs carry 8 mantissa bits (relative 4e-3) on O(1)
    # values summed over 5 steps; the float32 computation adds nothing.
    torch.testing.assert_close(out16.vs, out32.vs, rtol=0.05, atol=0.05)


def test_does_not_modify_inputs():
    arrays = to_torch(random_inputs((9, 2), seed=0, log_rho_std=1.0))
    copies = {k: v.clone() for k, v in arrays.items()}
    vtrace.from_importance_weights(**arrays)
    for key, value in arrays.items():
        assert torch.equal(value, copies[key]), key


@pytest.mark.parametrize("bad", ["discounts", "rewards", "values", "bootstrap_value"])
def test_shape_mismatch_raises(bad):
    # Two columns of three: a size of 1 would broadcast (see the shape contract below).
    arrays = to_torch(random_inputs((4, 3), seed=0, log_rho_std=1.0))
    arrays[bad] = arrays[bad][..., :2]
    with pytest.raises(ValueError, match=bad):
        vtrace.from_importance_weights(**arrays)


# The shape contract of scalable_agent and TorchBeast: the inputs share one rank, the
# bootstrap value has one less; values and bootstrap_value set the targets' shape and
# the other three broadcast against it.

HEADS = 5  # value heads sharing one importance weight per step


@pytest.mark.parametrize(
    "singletons",
    [("log_rhos",), ("log_rhos", "discounts"), ("log_rhos", "discounts", "rewards"), ("rewards",)],
)
def test_higher_rank_inputs_broadcast_against_the_values(singletons):
    arrays = random_inputs((6, 3, HEADS), seed=4, log_rho_std=1.0)
    for name in singletons:
        arrays[name] = arrays[name][..., :1]
    out = vtrace.from_importance_weights(**to_torch(arrays))
    assert out.vs.shape == (6, 3, HEADS) and out.pg_advantages.shape == (6, 3, HEADS)
    for head in range(HEADS):
        # Each head is the [T, B] problem with the broadcast inputs' single column.
        column = {
            name: value[..., 0 if name in singletons else head] for name, value in arrays.items()
        }
        expected_vs, expected_pg, vs_scale, pg_scale = vtrace_reference(
            **column,
            clip_rho_threshold=1.0,
            clip_pg_rho_threshold=1.0,
            lambda_=1.0,
            clip_c_threshold=1.0,
        )
        # Tolerance: as test_matches_paper_reference's, for T = 6.
        bound = (3 * 6 + 10) * EPS32
        np.testing.assert_array_less(
            np.abs(out.vs[..., head].numpy() - expected_vs), bound * vs_scale + 1e-30
        )
        np.testing.assert_array_less(
            np.abs(out.pg_advantages[..., head].numpy() - expected_pg), bound * pg_scale + 1e-30
        )


def higher_rank_zeros():
    """TorchBeast's and scalable_agent's test inputs: T = 3, B = 2, 42 value heads."""
    return {
        "log_rhos": torch.zeros(3, 2, 1),
        "discounts": torch.zeros(3, 2, 1),
        "rewards": torch.zeros(3, 2, 42),
        "values": torch.zeros(3, 2, 42),
        "bootstrap_value": torch.zeros(2, 42),
    }


def test_bootstrap_value_of_the_wrong_rank_is_both_references_error():
    arrays = {**higher_rank_zeros(), "bootstrap_value": torch.zeros(2)}  # should be [2, 42]
    # scalable_agent: ValueError, "must have rank 2".
    with pytest.raises(ValueError, match="bootstrap_value must have rank 2"):
        vtrace.from_importance_weights(**arrays)
    # TorchBeast: RuntimeError, "same number of dimensions: got 3 and 2".
    with pytest.raises(RuntimeError, match="same number of dimensions: got 3 and 2"):
        vtrace.from_importance_weights(**arrays)


@pytest.mark.parametrize("bad", ["values", "discounts", "rewards"])
def test_per_step_input_of_the_wrong_rank_is_an_error(bad):
    arrays = higher_rank_zeros()
    arrays[bad] = arrays[bad][..., 0]  # [3, 2]: rank 2 where log_rhos has 3
    with pytest.raises(vtrace.VTraceShapeError, match=f"{bad} must have rank 3"):
        vtrace.from_importance_weights(**arrays)


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("log_rhos", (3, 2, 2)),  # neither 1 nor 42 heads
        ("discounts", (3, 2, 2)),
        ("rewards", (1, 2, 42)),  # the time axis never broadcasts
        ("log_rhos", (4, 2, 1)),
    ],
)
def test_inputs_that_do_not_broadcast_to_the_values_are_errors(name, shape):
    arrays = {**higher_rank_zeros(), name: torch.zeros(shape)}
    with pytest.raises(vtrace.VTraceShapeError, match=f"{name} has shape"):
        vtrace.from_importance_weights(**arrays)


def test_values_and_bootstrap_value_must_agree():
    arrays = {**higher_rank_zeros(), "bootstrap_value": torch.zeros(2, 1)}
    with pytest.raises(vtrace.VTraceShapeError, match="bootstrap_value has shape"):
        vtrace.from_importance_weights(**arrays)


def test_scalar_log_rhos_is_an_error():
    arrays = {**higher_rank_zeros(), "log_rhos": torch.zeros(())}
    with pytest.raises(vtrace.VTraceShapeError, match="log_rhos must have rank >= 1"):
        vtrace.from_importance_weights(**arrays)
