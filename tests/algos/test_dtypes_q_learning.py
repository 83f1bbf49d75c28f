"""The dtype rule for the Q-learners' numerics: DQN's n-step targets, losses and C51's
projection (beast/algos/dqn.py), R2D2's value rescaling, targets, loss and priorities
(beast/algos/r2d2.py), in float32 and in float64 against float64 references.

The references are plain loops over the papers' formulas, in float64, never the code
under test (tests/support/references.py). Each case is run three ways
(tests/support/dtype_cases.py): all float inputs float32, all float64, and one float
input float64 with the rest float32, for each input every checked output is computed
from.
"""

from __future__ import annotations

import numpy as np
import torch

from beast.algos import dqn, nstep, r2d2
from beast.algos.value_rescaling import inverse_value_rescaling, value_rescaling
from tests.support.dtype_cases import (
    DTYPES,
    EPS,
    GAMMA,
    N_STEP,
    A,
    B,
    Case,
    T,
    bootstrapped,
    cases,
    check_in,
    check_promoted_by,
    elementwise,
    n_step,
    pick,
    promoting,
    returns_inputs,
    softmax,
)
from tests.support.references import (
    builder_like_batch,
    h_inverse_reference,
    h_reference,
    loss_reference,
    numpy_log_softmax,
    priorities_reference,
    reference_projection,
    targets_reference,
)

# dqn ----------------------------------------------------------------------------------


def n_step_returns_reference(x):
    rewards, steps = x["rewards"], x["n_steps"]
    returns = [sum(GAMMA**i * rewards[i, b] for i in range(steps[b])) for b in range(B)]
    return np.array(returns), np.array([GAMMA ** int(k) for k in steps])


def q_targets_reference(x, double, rescale):
    chooser = x["next_online_q"] if double else x["next_target_q"]
    q = pick(x["next_target_q"], chooser.argmax(-1))
    if rescale:
        q = elementwise(lambda v: h_inverse_reference(v, EPS), q)
    y = bootstrapped(x, q)
    return (elementwise(lambda v: h_reference(v, EPS), y) if rescale else y,)


def huber(d):
    return np.where(np.abs(d) <= 1.0, 0.5 * d * d, np.abs(d) - 0.5)


def q_loss_reference(x, loss):
    d = x["targets"] - x["q_taken"]
    per_sample = huber(d) if loss == "huber" else 0.5 * d * d
    return np.mean(x["weights"] * per_sample), np.abs(d)


# C51's support is exact in float32 (steps of 0.25), so a float32 support is the same one.
C51_ATOMS, C51_RANGE = 41, 5.0


def projection_inputs(rng):
    support = -C51_RANGE + 0.25 * np.arange(C51_ATOMS)
    probs = softmax(rng.normal(0.0, 1.0, (B, C51_ATOMS)))
    return returns_inputs(rng, next_probs=probs, support=support)


def projection_reference(x):
    support = x["support"]
    expected = reference_projection(
        x["returns"].tolist(),
        x["discounts"].tolist(),
        x["terminal"].tolist(),
        x["next_probs"].tolist(),
        support[0],
        support[-1],
    )
    return (np.array(expected),)


def categorical_loss_reference(x):
    cross_entropy = -(x["target_probs"] * numpy_log_softmax(x["logits_taken"])).sum(-1)
    return np.mean(x["weights"] * cross_entropy), cross_entropy


DQN_CASES = [
    Case(
        "n_step_returns",
        lambda rng: {
            "rewards": rng.normal(0.0, 1.0, (N_STEP, B)),
            "n_steps": rng.integers(1, N_STEP + 1, B),
        },
        lambda t: nstep.n_step_returns(t["rewards"], t["n_steps"], GAMMA),
        n_step_returns_reference,
        ("rewards",),
    ),
    Case(
        "bootstrap_targets",
        lambda rng: returns_inputs(rng, values=rng.normal(0.0, 2.0, B)),
        lambda t: (dqn.bootstrap_targets(n_step(t), t["terminal"], t["values"]),),
        lambda x: (bootstrapped(x, x["values"]),),
        ("returns", "discounts", "values"),
    ),
    *(
        Case(
            f"q_learning_targets[{'double' if double else 'max'}, rescale={rescale}]",
            lambda rng: returns_inputs(
                rng,
                next_target_q=rng.normal(0.0, 3.0, (B, A)),
                next_online_q=rng.normal(0.0, 3.0, (B, A)),
            ),
            lambda t, double=double, rescale=rescale: (
                dqn.q_learning_targets(
                    n_step(t),
                    t["terminal"],
                    t["next_target_q"],
                    t["next_online_q"] if double else None,
                    rescale_eps=EPS if rescale else None,
                ),
            ),
            lambda x, double=double, rescale=rescale: q_targets_reference(x, double, rescale),
            # The online Q-values only pick the action.
            ("returns", "discounts", "next_target_q"),
        )
        for double, rescale in ((True, True), (False, False))
    ),
    *(
        Case(
            f"q_loss[{loss}]",
            lambda rng: {
                "q_taken": rng.normal(0.0, 2.0, B),
                "targets": rng.normal(0.0, 2.0, B),
                "weights": rng.uniform(0.0, 1.0, B),
            },
            lambda t, loss=loss: dqn.q_loss(t["q_taken"], t["targets"], t["weights"], loss=loss)[
                ::2
            ],  # total_loss, priorities
            lambda x, loss=loss: q_loss_reference(x, loss),
            ("q_taken", "targets"),  # the priorities ignore the weights
        )
        for loss in dqn.LOSSES
    ),
    Case(
        "categorical_projection",
        projection_inputs,
        lambda t: (
            dqn.categorical_projection(n_step(t), t["terminal"], t["next_probs"], t["support"]),
        ),
        projection_reference,
        ("returns", "discounts", "next_probs", "support"),
    ),
    Case(
        "categorical_loss",
        lambda rng: {
            "logits_taken": rng.normal(0.0, 1.0, (B, 11)),
            "target_probs": softmax(rng.normal(0.0, 1.0, (B, 11))),
            "weights": rng.uniform(0.0, 1.0, B),
            "support": np.linspace(-5.0, 5.0, 11),
        },
        lambda t: dqn.categorical_loss(
            t["logits_taken"], t["target_probs"], t["weights"], t["support"]
        )[::2],  # total_loss, priorities
        categorical_loss_reference,
        ("logits_taken", "target_probs"),  # the support only enters the stats
    ),
]


# r2d2 ---------------------------------------------------------------------------------


def r2d2_batch_inputs(rng, num_rows, num_actions, episode_end_prob):
    online_q, target_q, rewards, terminated, truncated, mask = builder_like_batch(
        num_rows, B, num_actions, rng, episode_end_prob=episode_end_prob
    )
    return {
        "online_q": online_q,
        "target_q": target_q,
        "reward": rewards,
        "terminated": terminated,
        "truncated": truncated,
        "mask": mask,
    }


BATCH_KEYS = ("reward", "terminated", "truncated", "mask")
R2D2_ROWS, BURN_IN = 10, 2


def r2d2_loss_call(t):
    batch = {key: t[key] for key in (*BATCH_KEYS, "action")}
    out = r2d2.r2d2_loss(
        t["online_q"],
        t["target_q"],
        batch,
        t["weights"],
        burn_in=BURN_IN,
        n_step=N_STEP,
        discounting=GAMMA,
        rescale_eps=EPS,
    )
    return out.total_loss, out.priorities


def r2d2_loss_reference(x):
    batch = {key: x[key] for key in (*BATCH_KEYS, "action")}
    total, priorities = loss_reference(
        x["online_q"], x["target_q"], batch, x["weights"].tolist(), BURN_IN, N_STEP, GAMMA, EPS, 0.9
    )
    return total, np.array(priorities)


R2D2_CASES = [
    Case(
        "value_rescaling",
        lambda rng: {"x": rng.normal(0.0, 10.0, (T, B))},
        lambda t: (value_rescaling(t["x"], EPS),),
        lambda x: (elementwise(lambda v: h_reference(v, EPS), x["x"]),),
        ("x",),
    ),
    Case(
        "inverse_value_rescaling",
        lambda rng: {"x": rng.normal(0.0, 10.0, (T, B))},
        lambda t: (inverse_value_rescaling(t["x"], EPS),),
        lambda x: (elementwise(lambda v: h_inverse_reference(v, EPS), x["x"]),),
        ("x",),
    ),
    Case(
        "double_q_values",
        lambda rng: {
            "online_q": rng.normal(0.0, 1.0, (T, B, A)),
            "target_q": rng.normal(0.0, 1.0, (T, B, A)),
        },
        lambda t: (r2d2.double_q_values(t["online_q"], t["target_q"]),),
        lambda x: (pick(x["target_q"], x["online_q"].argmax(-1)),),
        ("target_q",),  # the online Q-values only pick the action
    ),
    Case(
        "n_step_double_q_targets",
        lambda rng: r2d2_batch_inputs(rng, R2D2_ROWS, A, 0.15),
        lambda t: (
            r2d2.n_step_double_q_targets(
                t["online_q"],
                t["target_q"],
                *(t[key] for key in BATCH_KEYS),
                n_step=N_STEP,
                discounting=GAMMA,
                rescale_eps=EPS,
            ).targets,
        ),
        lambda x: (
            np.array(
                targets_reference(
                    x["online_q"].tolist(),
                    x["target_q"].tolist(),
                    *(x[key].tolist() for key in BATCH_KEYS),
                    N_STEP,
                    GAMMA,
                    EPS,
                    True,
                )[0]
            ),
        ),
        ("target_q", "reward"),
    ),
    Case(
        "sequence_priorities",
        lambda rng: {"td": rng.normal(0.0, 2.0, (T, B)), "valid": rng.random((T, B)) < 0.7},
        lambda t: (r2d2.sequence_priorities(t["td"], t["valid"], 0.9),),
        lambda x: (np.array(priorities_reference(x["td"].tolist(), x["valid"].tolist(), 0.9)),),
        ("td",),
    ),
    Case(
        "r2d2_loss",
        lambda rng: {
            **r2d2_batch_inputs(rng, R2D2_ROWS, 3, 0.05),
            "action": rng.integers(0, 3, (R2D2_ROWS, B)),
            "weights": rng.uniform(0.2, 1.0, B),
        },
        r2d2_loss_call,
        r2d2_loss_reference,
        ("online_q", "target_q", "reward"),  # the priorities ignore the weights
    ),
]


CASES = [*DQN_CASES, *R2D2_CASES]


@DTYPES
@cases(CASES)
def test_outputs_follow_the_inputs_dtype(case, dtype):
    check_in(case, dtype)


@promoting(CASES)
def test_one_float64_input_promotes_the_outputs(case, wide):
    check_promoted_by(case, wide)


def test_categorical_projection_takes_a_float64_support_with_float32_returns():
    # The case: scatter() used to refuse float64 atoms into a float32 target.
    returns = dqn.NStepReturns(torch.tensor([0.3, -7.0]), torch.tensor([0.9, 0.5]))
    support = torch.linspace(-5.0, 5.0, 11, dtype=torch.float64)
    probs = torch.full((2, 11), 1.0 / 11)
    target = dqn.categorical_projection(returns, torch.tensor([False, True]), probs, support)
    assert target.dtype == torch.float64
    mass = probs.double().sum(-1)  # 1 up to the float32 rounding of 1/11
    # Terminal row: all mass on G = -7, clipped to z_1 = -5.
    assert target[1].tolist() == [mass[1].item()] + [0.0] * 10
    # Tolerance: float64 sums of 11 terms.
    torch.testing.assert_close(target.sum(-1), mass, rtol=1e-15, atol=1e-15)
