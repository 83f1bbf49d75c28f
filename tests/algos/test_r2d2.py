"""Contract of beast.algos.r2d2.

In order of strength: independent references written from the papers'
formulas in plain Python loops (value rescaling and its inverse in 50-digit
decimal arithmetic, Pohlen et al. 2018; n-step double-Q targets with episode
ends, R2D2 section 2; sequence priorities, R2D2 section 2.3; the loss); small
cases worked by hand; invariants (gradients, burn-in, shapes).
"""

from __future__ import annotations

import decimal
import math
import random

import numpy as np
import pytest
import torch

from beast.algos import r2d2
from beast.algos.value_rescaling import inverse_value_rescaling, value_rescaling
from beast.models import build_q_model
from tests.support.references import (
    builder_like_batch,
    h_inverse_reference,
    h_reference,
    loss_reference,
    priorities_reference,
    targets_reference,
)

D = decimal.Decimal
# 50 significant digits: the references are exact to far below float64's 1e-16.
decimal.getcontext().prec = 50


MAGNITUDES = [0.0] + [m * 10.0**e for e in range(-6, 7) for m in (1.0, 3.7)]
VALUES = sorted({s * m for m in MAGNITUDES for s in (1.0, -1.0)})


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
def test_value_rescaling_matches_decimal_reference(eps):
    x = torch.tensor(VALUES, dtype=torch.float64)
    h = value_rescaling(x, eps)
    h_inv = inverse_value_rescaling(x, eps)
    # float64, no cancellation in our forms: each is ~6 roundings of half an ulp
    # (2.2e-16 relative) with a condition number <= 2, so within 6 ulps; we see <= 2.4.
    rel = 6 * 2.2e-16
    for i, v in enumerate(VALUES):
        assert float(h[i]) == pytest.approx(float(h_reference(v, eps)), rel=rel, abs=0)
        assert float(h_inv[i]) == pytest.approx(float(h_inverse_reference(v, eps)), rel=rel, abs=0)


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-14), (torch.float32, 2e-6)])
def test_round_trip_across_magnitudes(eps, dtype, rel):
    """h^-1(h(x)) == x and h(h^-1(x)) == x from 1e-6 to 1e6, both signs. The
    tolerance is a few ulps of the dtype times h's condition number, which is
    at most ~2 on this range; h^-1 of 1e6 is ~1e12, still far inside float32."""
    x = torch.tensor(VALUES, dtype=dtype)
    for out in (
        inverse_value_rescaling(value_rescaling(x, eps), eps),
        value_rescaling(inverse_value_rescaling(x, eps), eps),
    ):
        assert out.dtype == dtype
        torch.testing.assert_close(out, x, rtol=rel, atol=0)


def test_value_rescaling_known_values():
    # h(3) = sqrt(4) - 1 + 3 eps; h(-3) = -h(3); h^-1(1) with eps = 0 is (1 + 1)^2 - 1 = 3.
    x = torch.tensor([3.0, -3.0, 0.0], dtype=torch.float64)
    assert value_rescaling(x, 1e-3).tolist() == pytest.approx([1.003, -1.003, 0.0])
    assert inverse_value_rescaling(torch.tensor([1.0]), 0.0).item() == pytest.approx(3.0)
    # Strictly increasing (so argmax commutes with it) and odd.
    grid = torch.linspace(-100, 100, 2001, dtype=torch.float64)
    assert (value_rescaling(grid).diff() > 0).all()
    assert (inverse_value_rescaling(grid).diff() > 0).all()
    with pytest.raises(ValueError):
        value_rescaling(x, -1.0)


# n-step double-Q targets.


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_step", [1, 3, 5])
@pytest.mark.parametrize("eps", [1e-3, None])
@pytest.mark.parametrize("truncate_at_end", [True, False])
def test_n_step_targets_match_reference(seed, n_step, eps, truncate_at_end):
    rng = np.random.default_rng(seed)
    num_rows, batch, gamma = 12, 6, 0.97
    arrays = builder_like_batch(num_rows, batch, 4, rng)
    if seed == 3:
        # Arbitrary end patterns too (several ends in a column, ends at masked rows).
        terminated = rng.random((num_rows, batch)) < 0.2
        truncated = rng.random((num_rows, batch)) < 0.1
        mask = rng.random((num_rows, batch)) < 0.8
        arrays = (*arrays[:3], terminated, truncated, mask)
    expected, expected_valid = targets_reference(
        *(a.tolist() for a in arrays), n_step, gamma, eps, truncate_at_end
    )
    out = r2d2.n_step_double_q_targets(
        *(torch.from_numpy(a) for a in arrays),
        n_step=n_step,
        discounting=gamma,
        rescale_eps=eps,
        truncate_at_end=truncate_at_end,
    )
    assert out.valid.tolist() == expected_valid
    # float64 throughout; gamma^k by repeated products vs a power differs by ulps.
    np.testing.assert_allclose(out.targets.numpy(), np.array(expected), rtol=1e-12, atol=1e-12)


def test_n_step_targets_worked_by_hand():
    """One column, 5 rows, n = 2, gamma = 0.5, no rescaling; the episode ends on
    the transition into row 3 (row 3 is the terminal row, row 4 padding).

    Double-Q: the online net prefers action 1 at rows 1, 2, 3 and action 0 at
    row 0; the target net's values are 10 * row + action.
    """
    rewards = torch.tensor([[9.0], [1.0], [2.0], [4.0], [0.0]])
    terminated = torch.tensor([[False], [False], [False], [True], [True]])
    truncated = torch.zeros(5, 1, dtype=torch.bool)
    mask = torch.tensor([[True], [True], [True], [False], [False]])
    online_q = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]], [[0.0, 1.0]], [[0, 1.0]]])
    target_q = torch.tensor([[[10.0 * t, 10.0 * t + 1]] for t in range(5)])
    kwargs = dict(n_step=2, discounting=0.5, rescale_eps=None)
    out = r2d2.n_step_double_q_targets(
        online_q, target_q, rewards, terminated, truncated, mask, **kwargs
    )
    # Row 0: r1 + 0.5 r2 + 0.25 Q-(x2, a* = 1) = 1 + 1 + 0.25 * 21.
    # Row 1: r2 + 0.5 r3, then the episode ends: 2 + 2, no bootstrap.
    # Row 2: r3 and the episode ends: 4.
    assert out.targets.flatten().tolist() == [7.25, 4.0, 4.0, 0.0, 0.0]
    assert out.valid.flatten().tolist() == [True, True, True, False, False]
    # Row 3 a time limit's final observation instead: rows 1 and 2 bootstrap from it,
    # Q-(x3, a* = 1) = 31, not from 0 (a terminal) nor from row 4 (the next episode).
    # Row 1: 2 + 0.5 * 4 + 0.25 * 31; row 2: 4 + 0.5 * 31.
    truncated[3], terminated[3] = True, False
    out = r2d2.n_step_double_q_targets(
        online_q, target_q, rewards, terminated, truncated, mask, **kwargs
    )
    assert out.targets.flatten().tolist() == [7.25, 11.75, 19.5, 0.0, 0.0]
    assert out.valid.flatten().tolist() == [True, True, True, False, False]


def test_sequence_end_truncates_or_drops_the_window():
    """No episode end; T = 4, n = 3, gamma = 1, no rescaling, target Q = 100 everywhere."""
    rewards = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    ends = torch.zeros(4, 1, dtype=torch.bool)
    mask = torch.ones(4, 1, dtype=torch.bool)
    q = torch.full((4, 1, 2), 100.0)
    kwargs = dict(n_step=3, discounting=1.0, rescale_eps=None)
    out = r2d2.n_step_double_q_targets(q, q, rewards, ends, ends, mask, **kwargs)
    # Row 0: 1 + 2 + 3 + 100; row 1: 2 + 3 + 100 (2 steps); row 2: 3 + 100; row 3: none.
    assert out.targets.flatten().tolist() == [106.0, 105.0, 103.0, 0.0]
    assert out.valid.flatten().tolist() == [True, True, True, False]
    out = r2d2.n_step_double_q_targets(
        q, q, rewards, ends, ends, mask, truncate_at_end=False, **kwargs
    )
    assert out.valid.flatten().tolist() == [True, False, False, False]


def test_apex_layout_trains_only_row_zero():
    """Ape-X: seq_len = n + 1, no burn-in, full windows only."""
    n = 3
    rewards = torch.randn(n + 1, 5)
    ends = torch.zeros(n + 1, 5, dtype=torch.bool)
    mask = torch.ones(n + 1, 5, dtype=torch.bool)
    q = torch.randn(n + 1, 5, 4)
    out = r2d2.n_step_double_q_targets(
        q, q, rewards, ends, ends, mask, n_step=n, discounting=0.99, truncate_at_end=False
    )
    assert out.valid[0].all() and not out.valid[1:].any()


def test_terminal_row_q_values_never_leak():
    """Non-finite Q at a terminal row (another episode's) does not reach the target."""
    rewards = torch.tensor([[0.0], [1.0], [0.0]])
    terminated = torch.tensor([[False], [True], [True]])
    mask = torch.tensor([[True], [False], [False]])
    q = torch.tensor([[[0.0, 0.0]], [[math.inf, math.nan]], [[math.nan, 0.0]]])
    out = r2d2.n_step_double_q_targets(
        q, q, rewards, terminated, torch.zeros_like(terminated), mask, n_step=5, discounting=0.9
    )
    assert out.targets[0, 0].item() == pytest.approx(value_rescaling(torch.tensor(1.0)).item())


def test_target_argument_checks():
    q = torch.zeros(3, 2, 4)
    r = torch.zeros(3, 2)
    b = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="n_step"):
        r2d2.n_step_double_q_targets(q, q, r, b, b, b, n_step=0, discounting=0.9)
    with pytest.raises(ValueError, match="discounting"):
        r2d2.n_step_double_q_targets(q, q, r, b, b, b, n_step=1, discounting=1.5)
    with pytest.raises(ValueError, match="rewards"):
        r2d2.n_step_double_q_targets(q, q, r[:2], b, b, b, n_step=1, discounting=0.9)
    with pytest.raises(ValueError, match="truncated"):
        r2d2.n_step_double_q_targets(q, q, r, b, b[:2], b, n_step=1, discounting=0.9)
    with pytest.raises(ValueError, match="differ"):
        r2d2.double_q_values(q, q[:, :, :3])


# Priorities.


@pytest.mark.parametrize("eta", [0.9, 0.0, 1.0, 0.5])
def test_sequence_priorities_match_reference(eta):
    rng = np.random.default_rng(0)
    td = rng.normal(0.0, 3.0, (20, 7))
    valid = rng.random((20, 7)) < 0.6
    valid[:, 3] = False  # a sequence with nothing to train
    out = r2d2.sequence_priorities(torch.from_numpy(td), torch.from_numpy(valid), eta)
    expected = priorities_reference(td.tolist(), valid.tolist(), eta)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-14)
    assert out[3] == 0.0
    with pytest.raises(ValueError):
        r2d2.sequence_priorities(torch.from_numpy(td), torch.from_numpy(valid), 1.5)


# The loss.


@pytest.mark.parametrize("burn_in", [0, 4])
def test_loss_and_priorities_match_reference(burn_in):
    rng = np.random.default_rng(burn_in)
    num_rows, batch_size, num_actions = 14, 5, 3
    online_q, target_q, rewards, terminated, truncated, mask = builder_like_batch(
        num_rows, batch_size, num_actions, rng, episode_end_prob=0.05
    )
    actions = rng.integers(0, num_actions, (num_rows, batch_size))
    weights = rng.uniform(0.2, 1.0, batch_size)
    batch = {
        "action": actions,
        "reward": rewards,
        "terminated": terminated,
        "truncated": truncated,
        "mask": mask,
    }
    expected_loss, expected_priorities = loss_reference(
        online_q, target_q, batch, weights.tolist(), burn_in, 3, 0.99, 1e-3, 0.9
    )
    online = torch.from_numpy(online_q).requires_grad_()
    out = r2d2.r2d2_loss(
        online,
        torch.from_numpy(target_q),
        {k: torch.from_numpy(v) for k, v in batch.items()},
        torch.from_numpy(weights),
        burn_in=burn_in,
        n_step=3,
        discounting=0.99,
    )
    assert out.total_loss.item() == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(out.priorities.numpy(), expected_priorities, rtol=1e-12)
    assert not out.priorities.requires_grad
    assert all(not v.requires_grad and v.dim() == 0 for v in out.stats.values())
    # Gradient only reaches Q(x_t, a_t) at trained rows: none at burn-in rows,
    # none at other actions (the double-Q argmax and target are constants).
    out.total_loss.backward()
    grad = online.grad
    assert (grad[:burn_in] == 0).all()
    taken = torch.zeros_like(grad, dtype=torch.bool)
    taken.scatter_(-1, torch.from_numpy(actions).unsqueeze(-1), True)
    assert (grad[~taken] == 0).all()
    assert (grad[burn_in:][taken[burn_in:]] != 0).any()


def test_zero_weights_zero_the_loss_but_not_the_priorities():
    rng = np.random.default_rng(0)
    online_q, target_q, rewards, terminated, truncated, mask = builder_like_batch(6, 3, 2, rng)
    batch = {
        "action": torch.zeros(6, 3, dtype=torch.int64),
        "reward": torch.from_numpy(rewards),
        "terminated": torch.from_numpy(terminated),
        "truncated": torch.from_numpy(truncated),
        "mask": torch.from_numpy(mask),
    }
    out = r2d2.r2d2_loss(
        torch.from_numpy(online_q),
        torch.from_numpy(target_q),
        batch,
        torch.zeros(3, dtype=torch.float64),
        burn_in=0,
        n_step=2,
        discounting=0.9,
    )
    assert out.total_loss.item() == 0.0 and (out.priorities > 0).all()
    with pytest.raises(ValueError, match="burn_in"):
        r2d2.r2d2_loss(
            torch.from_numpy(online_q),
            torch.from_numpy(target_q),
            batch,
            torch.ones(3),
            burn_in=6,
            n_step=2,
            discounting=0.9,
        )


def test_unroll_with_burn_in_matches_one_unroll_and_stops_gradients():
    torch.manual_seed(0)
    model = build_q_model("mlp", (3,), 4, use_lstm=True, hidden_size=16)
    T, B, burn_in = 7, 2, 3
    inputs = {
        "obs": torch.randn(T, B, 3),
        "reward": torch.randn(T, B),
        "last_action": torch.randint(0, 4, (T, B)),
        "done": torch.zeros(T, B, dtype=torch.bool),
    }
    state = model.initial_state(B)
    q, final_state = r2d2.unroll_with_burn_in(model, inputs, state, burn_in)
    full, full_state = model(inputs, state)
    # Same computation split in two LSTM calls: float32 rounding only.
    torch.testing.assert_close(q, full.q_values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final_state, full_state, rtol=1e-5, atol=1e-6)
    q[:burn_in].sum().backward(retain_graph=True)
    assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())
    q[burn_in:].sum().backward()
    assert any(p.grad is not None and (p.grad != 0).any() for p in model.parameters())


def test_random_episode_layouts_never_bootstrap_across_an_end():
    """Invariant on many random layouts: a target equals the reference and is
    never built from a row after the first episode end in its window."""
    rng = random.Random(0)
    for _ in range(50):
        num_rows, n = rng.randrange(2, 10), rng.randrange(1, 6)
        gen = np.random.default_rng(rng.randrange(10**6))
        online_q, target_q, rewards, terminated, truncated, mask = builder_like_batch(
            num_rows, 3, 2, gen
        )
        # Poison everything after each column's terminal row: it must never matter.
        for b in range(3):
            ends = np.nonzero(terminated[1:, b] | truncated[1:, b])[0]
            if len(ends):
                start = ends[0] + 2
                online_q[start:, b] = target_q[start:, b] = 1e30
                rewards[start:, b] = 1e30
        arrays = (online_q, target_q, rewards, terminated, truncated, mask)
        out = r2d2.n_step_double_q_targets(
            *(torch.from_numpy(a) for a in arrays), n_step=n, discounting=0.9
        )
        assert (out.targets.abs() < 1e6).all()
