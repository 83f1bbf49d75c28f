"""The dtype rule's checks (beast/algos/dtypes.py) for every public numerics function of
beast.algos (tests/algos/test_dtypes_*.py): a `Case` draws float64 inputs, calls the
function on tensors of the dtypes asked for, and compares with its float64 reference
on the same (float32-rounded where float32) numbers.

- all float inputs float32: float32 outputs, equal to the reference on the same
  numbers to float32 precision;
- all float64: float64 outputs, equal to the reference to float64 precision, which a
  silent float32 step anywhere inside would break by seven orders of magnitude;
- one float input float64 and the rest float32, for each input every checked output is
  computed from: float64 outputs (inputs of mixed precision promote).

Not checked, having no float tensor input: `dqn.linear_epsilon` (Python numbers),
`impala.step_discounts_and_valid` (episode flags; its discounts take the dtype asked
for, tests/algos/test_dtypes_returns.py), `laser.trust_region_mask` (a comparison),
`r2d2.unroll_with_burn_in` (a model's unroll).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import Tensor

from beast.algos import dqn
from tests.support.references import numpy_log_softmax

T, B, A, N_STEP, D = 6, 5, 4, 3, 2  # steps, batch, actions, n-step window, action dims
GAMMA, LAMBDA, EPS = 0.9, 0.95, 1e-3
RHO_BAR = 1.0  # V-trace's and the implied KL's importance-weight clip
# Tolerances (rtol, atol) on O(1)-O(10) values. float32: a few float32 roundings per
# term of sums of at most T * B terms. float64: the same in float64, with room to spare.
TOL32 = (2e-5, 2e-5)
TOL64 = (1e-10, 1e-10)


@dataclass(frozen=True)
class Case:
    """inputs: the draw, float64 arrays for the float inputs (ints and bools as they are);
    call: tensors -> the outputs checked; reference: the same numbers -> float64 outputs;
    promoting: the float inputs every checked output is computed from."""

    name: str
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    call: Callable[[dict[str, Tensor]], Sequence[Tensor]]
    reference: Callable[[dict[str, np.ndarray]], Sequence[np.ndarray | float]]
    promoting: tuple[str, ...]
    tol32: tuple[float, float] = TOL32
    tol64: tuple[float, float] = TOL64


def softmax(logits):
    return np.exp(numpy_log_softmax(logits))


def pick(values, actions):
    """values[..., actions] along the last axis."""
    return np.take_along_axis(values, actions[..., None], -1)[..., 0]


def elementwise(fn, x):
    return np.vectorize(lambda v: float(fn(float(v))))(x)


def check(case: Case, dtypes: dict[str, torch.dtype], tolerance: tuple[float, float]) -> None:
    """Draw the inputs, round the float32 ones, run `case` and its reference on the same
    numbers, and compare: every output in the promoted dtype, within `tolerance`."""
    arrays = case.inputs(np.random.default_rng(0))
    floats = [name for name, value in arrays.items() if value.dtype == np.float64]
    assert set(case.promoting) <= set(floats), case.promoting
    assert set(dtypes) == set(floats)
    seen = {
        name: value.astype(np.float32).astype(np.float64)
        if dtypes.get(name) == torch.float32
        else value
        for name, value in arrays.items()
    }
    tensors = {
        name: torch.tensor(value, dtype=dtypes[name]) if name in dtypes else torch.from_numpy(value)
        for name, value in seen.items()
    }
    outputs = case.call(tensors)
    expected = case.reference(seen)
    expected_dtype = (
        torch.float64
        if any(dtypes[name] == torch.float64 for name in case.promoting)
        else torch.float32
    )
    rtol, atol = tolerance
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        assert got.dtype == expected_dtype
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=rtol, atol=atol)


def float_inputs(case: Case) -> list[str]:
    arrays = case.inputs(np.random.default_rng(0))
    return [name for name, value in arrays.items() if value.dtype == np.float64]


DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64], ids=["float32", "float64"]
)


def cases(table: Sequence[Case]) -> pytest.MarkDecorator:
    """Parametrize a test's `case` over `table`, each named."""
    return pytest.mark.parametrize("case", table, ids=[case.name for case in table])


def promoting(table: Sequence[Case]) -> pytest.MarkDecorator:
    """Parametrize a test's `case` and `wide` over each case of `table` and each of its
    promoting inputs."""
    return pytest.mark.parametrize(
        ("case", "wide"),
        [(case, name) for case in table for name in case.promoting],
        ids=[f"{case.name}-{name}" for case in table for name in case.promoting],
    )


def check_in(case: Case, dtype: torch.dtype) -> None:
    """Every float input in `dtype`: outputs in `dtype`, at its precision."""
    tolerance = case.tol32 if dtype == torch.float32 else case.tol64
    check(case, dict.fromkeys(float_inputs(case), dtype), tolerance)


def check_promoted_by(case: Case, wide: str) -> None:
    """`wide` in float64, the other float inputs float32: float64 outputs."""
    dtypes = dict.fromkeys(float_inputs(case), torch.float32)
    dtypes[wide] = torch.float64
    # Tolerance: float32's, as the other inputs carry float32 roundings.
    check(case, dtypes, case.tol32)


# Inputs and references shared by the tables of several modules.


def returns_inputs(rng, **extra):
    """An n-step return per transition (`dqn.NStepReturns`) and the episode-end flags."""
    return {
        "returns": rng.normal(0.0, 2.0, B),
        "discounts": rng.uniform(0.5, 1.0, B),
        "terminal": rng.random(B) < 0.3,
        **extra,
    }


def n_step(t):
    return dqn.NStepReturns(t["returns"], t["discounts"])


def bootstrapped(x, values):
    """y = G + gamma^k v, G alone where terminal (Hessel et al. 2018, eq. 2)."""
    return x["returns"] + np.where(x["terminal"], 0.0, x["discounts"] * values)


def implied_kl_reference(behaviour_logits, target_logits, rho_bar):
    """KL(pi || pi~), pi~ = min(rho_bar mu, pi) / Z (LASER section 4.3), per step."""
    pi, mu = softmax(target_logits), softmax(behaviour_logits)
    implied = np.minimum(rho_bar * mu, pi)
    implied = implied / implied.sum(-1, keepdims=True)
    return (pi * np.log(pi / implied)).sum(-1)


def per_step_inputs(rng, *names):
    return {
        **{name: rng.normal(0.0, 1.0, (T, B)) for name in names},
        "mask": rng.random((T, B)) < 0.8,
    }
