"""The dtype rule for the actor-critics' returns and losses: GAE, V-trace and its
log-rhos (beast/algos/gae.py, vtrace.py), IMPALA's and LASER's losses
(beast/algos/impala.py, laser.py), and the step discounts' dtype.

The references are plain loops over the papers' formulas, in float64, never the code
under test (tests/support/references.py). Each case is run three ways
(tests/support/dtype_cases.py): all float inputs float32, all float64, and one float
input float64 with the rest float32, for each input every checked output is computed
from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from beast.algos import gae, impala, laser, vtrace
from tests.support.dtype_cases import (
    DTYPES,
    GAMMA,
    LAMBDA,
    RHO_BAR,
    A,
    B,
    Case,
    T,
    cases,
    check_in,
    check_promoted_by,
    implied_kl_reference,
    per_step_inputs,
    pick,
    promoting,
    softmax,
)
from tests.support.references import (
    gae_reference,
    numpy_log_softmax,
    random_episode_ends,
    vtrace_reference,
)

# GAE and V-trace ----------------------------------------------------------------------


def gae_inputs(rng):
    terminated, truncated = random_episode_ends(rng, T, B)
    return {
        "rewards": rng.normal(0.0, 1.0, (T, B)),
        "values": rng.normal(0.0, 1.0, (T + 1, B)),
        "terminated": terminated,
        "truncated": truncated,
    }


def gae_case_reference(x):
    advantages = gae_reference(
        x["rewards"], x["values"], x["terminated"], x["truncated"], GAMMA, LAMBDA
    )
    return advantages, advantages + x["values"][:-1]


def vtrace_inputs(rng):
    return {
        "log_rhos": rng.normal(0.0, 1.0, (T, B)),
        "discounts": np.where(rng.random((T, B)) < 0.2, 0.0, GAMMA),
        "rewards": rng.normal(0.0, 1.0, (T, B)),
        "values": rng.normal(0.0, 1.0, (T, B)),
        "bootstrap_value": rng.normal(0.0, 1.0, B),
    }


def vtrace_case_reference(x, log_rhos=None):
    inputs = {**x, "log_rhos": x["log_rhos"] if log_rhos is None else log_rhos}
    return vtrace_reference(
        **{key: inputs[key] for key in VTRACE_INPUTS},
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
        lambda_=1.0,
        clip_c_threshold=1.0,
    )[:2]


def logits_inputs(rng):
    inputs = vtrace_inputs(rng)
    del inputs["log_rhos"]
    return {
        "behavior_policy_logits": rng.normal(0.0, 2.0, (T, B, A)),
        "target_policy_logits": rng.normal(0.0, 2.0, (T, B, A)),
        "actions": rng.integers(0, A, (T, B)),
        **inputs,
    }


def log_rhos_reference(x):
    return pick(numpy_log_softmax(x["target_policy_logits"]), x["actions"]) - pick(
        numpy_log_softmax(x["behavior_policy_logits"]), x["actions"]
    )


def from_logits_reference(x):
    return vtrace_case_reference(x, log_rhos_reference(x))


VTRACE_INPUTS = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")
LOGITS_INPUTS = ("behavior_policy_logits", "target_policy_logits", *VTRACE_INPUTS[1:])

TARGET_CASES = [
    Case(
        "generalized_advantages",
        gae_inputs,
        lambda t: gae.generalized_advantages(
            t["rewards"],
            t["values"],
            t["terminated"],
            t["truncated"],
            discount=GAMMA,
            lambda_=LAMBDA,
        ),
        gae_case_reference,
        ("rewards", "values"),
    ),
    Case(
        "vtrace.from_importance_weights",
        vtrace_inputs,
        lambda t: vtrace.from_importance_weights(**t),
        vtrace_case_reference,
        VTRACE_INPUTS,
    ),
    Case(
        "vtrace.from_logits",
        logits_inputs,
        lambda t: vtrace.from_logits(**t)[:2],  # vs, pg_advantages
        from_logits_reference,
        LOGITS_INPUTS,
    ),
    Case(
        "vtrace.from_logits.log_rhos",
        logits_inputs,
        lambda t: (vtrace.from_logits(**t).log_rhos,),
        lambda x: (log_rhos_reference(x),),
        LOGITS_INPUTS[:2],  # the log-ratios come from the logits alone
    ),
    Case(
        "vtrace.action_log_probs",
        lambda rng: {
            "policy_logits": rng.normal(0.0, 2.0, (T, B, A)),
            "actions": rng.integers(0, A, (T, B)),
        },
        lambda t: (vtrace.action_log_probs(t["policy_logits"], t["actions"]),),
        lambda x: (pick(numpy_log_softmax(x["policy_logits"]), x["actions"]),),
        ("policy_logits",),
    ),
]


# IMPALA and LASER ---------------------------------------------------------------------

BASELINE_COST, ENTROPY_COST = 0.5, 0.01
# Between the KLs of the drawn steps (none is within 1e-3 of it): 6 of the 29 are rejected.
TRUST_REGION = 0.3


def actor_critic_inputs(rng):
    """A learner batch as impala.py's docstring lays it out, [T+1, B, ...], with
    terminations and truncations."""
    terminated, truncated = random_episode_ends(rng, T, B)
    return {
        "learner_logits": rng.normal(0.0, 1.0, (T + 1, B, A)),
        "baseline": rng.normal(0.0, 1.0, (T + 1, B)),
        "reward": rng.normal(0.0, 1.0, (T + 1, B)),
        "behaviour_logits": rng.normal(0.0, 1.0, (T + 1, B, A)),
        "action": rng.integers(0, A, (T + 1, B)),
        # random_episode_ends lays out T transitions; here row t+1 holds transition t's.
        "terminated": np.concatenate([np.zeros((1, B), dtype=bool), terminated]),
        "truncated": truncated,
    }


def actor_critic_call(t, loss):
    outputs = {"policy_logits": t["learner_logits"], "baseline": t["baseline"]}
    batch = {
        "policy_logits": t["behaviour_logits"],
        **{key: t[key] for key in ("reward", "action", "terminated", "truncated")},
    }
    costs = {
        "discounting": GAMMA,
        "reward_clipping": "abs_one",
        "baseline_cost": BASELINE_COST,
        "entropy_cost": ENTROPY_COST,
    }
    if loss == "laser":
        return (laser.laser_loss(outputs, batch, trust_region_threshold=TRUST_REGION, **costs)[0],)
    return (impala.impala_loss(outputs, batch, **costs).total_loss,)


def actor_critic_reference(x, loss):
    """IMPALA section 4.2 with beast's layout (impala.py's docstring): transition t pairs
    action[t] with reward[t+1]; a truncated row is no transition; LASER rejects the steps
    whose KL(pi || pi~) exceeds the trust region (importance weight 0, no pg or baseline
    term). Sums over T and B."""
    valid = ~x["truncated"][:-1]
    if loss == "laser":
        kl = implied_kl_reference(x["behaviour_logits"][:-1], x["learner_logits"][:-1], RHO_BAR)
        valid_kls = np.sort(kl[valid])
        assert np.abs(valid_kls - TRUST_REGION).min() > 1e-3  # no step at the boundary
        trained = valid & (kl <= TRUST_REGION)
    else:
        trained = valid
    actions = x["action"][:-1]
    log_pi = pick(numpy_log_softmax(x["learner_logits"][:-1]), actions)
    log_mu = pick(numpy_log_softmax(x["behaviour_logits"][:-1]), actions)
    vs, pg_advantages = vtrace_reference(
        log_rhos=np.where(trained, log_pi - log_mu, -np.inf),
        discounts=GAMMA * (~x["terminated"][1:] & valid),
        rewards=np.clip(x["reward"][1:], -1.0, 1.0),
        values=x["baseline"][:-1],
        bootstrap_value=x["baseline"][-1],
        clip_rho_threshold=RHO_BAR,
        clip_pg_rho_threshold=RHO_BAR,
        lambda_=1.0,
        clip_c_threshold=1.0,
    )[:2]
    probs = softmax(x["learner_logits"][:-1])
    entropy = -(probs * np.log(probs)).sum(-1)
    pg_loss = -(trained * log_pi * pg_advantages).sum()
    baseline_loss = 0.5 * (trained * (vs - x["baseline"][:-1]) ** 2).sum()
    entropy_loss = -(valid * entropy).sum()
    return (pg_loss + BASELINE_COST * baseline_loss + ENTROPY_COST * entropy_loss,)


LOSS_INPUTS = ("learner_logits", "baseline", "reward", "behaviour_logits")

ACTOR_CRITIC_CASES = [
    Case(
        "impala.policy_gradient_loss",
        lambda rng: per_step_inputs(rng, "log_probs", "advantages"),
        lambda t: (impala.policy_gradient_loss(t["log_probs"], t["advantages"], t["mask"]),),
        lambda x: (-(x["mask"] * x["log_probs"] * x["advantages"]).sum(),),
        ("log_probs", "advantages"),
    ),
    Case(
        "impala.baseline_loss",
        lambda rng: per_step_inputs(rng, "values", "targets"),
        lambda t: (impala.baseline_loss(t["values"], t["targets"], t["mask"]),),
        lambda x: (0.5 * (x["mask"] * (x["targets"] - x["values"]) ** 2).sum(),),
        ("values", "targets"),
    ),
    Case(
        "impala.entropy_loss",
        lambda rng: per_step_inputs(rng, "entropy"),
        lambda t: (impala.entropy_loss(t["entropy"], t["mask"]),),
        lambda x: (-(x["mask"] * x["entropy"]).sum(),),
        ("entropy",),
    ),
    Case(
        "impala.clip_rewards",
        lambda rng: {"rewards": rng.normal(0.0, 2.0, (T, B))},
        lambda t: (impala.clip_rewards(t["rewards"], "abs_one"),),
        lambda x: (np.clip(x["rewards"], -1.0, 1.0),),
        ("rewards",),
    ),
    Case(
        "impala.impala_loss",
        actor_critic_inputs,
        lambda t: actor_critic_call(t, "impala"),
        lambda x: actor_critic_reference(x, "impala"),
        LOSS_INPUTS,
    ),
    Case(
        "laser.laser_loss",
        actor_critic_inputs,
        lambda t: actor_critic_call(t, "laser"),
        lambda x: actor_critic_reference(x, "laser"),
        LOSS_INPUTS,
    ),
    *(
        Case(
            f"laser.trust_region_kl[rho_bar={rho_bar}]",
            lambda rng: {
                "behaviour": rng.normal(0.0, 1.0, (T, B, A)),
                "target": rng.normal(0.0, 1.0, (T, B, A)),
            },
            lambda t, rho_bar=rho_bar: (
                laser.trust_region_kl(
                    {"policy_logits": t["behaviour"]}, {"policy_logits": t["target"]}, rho_bar
                ),
            ),
            # No clipping: pi~ = pi, KL 0.
            lambda x, rho_bar=rho_bar: (
                implied_kl_reference(x["behaviour"], x["target"], rho_bar or math.inf),
            ),
            ("behaviour", "target"),
        )
        for rho_bar in (1.0, None)
    ),
]


CASES = [*TARGET_CASES, *ACTOR_CRITIC_CASES]


@DTYPES
@cases(CASES)
def test_outputs_follow_the_inputs_dtype(case, dtype):
    check_in(case, dtype)


@promoting(CASES)
def test_one_float64_input_promotes_the_outputs(case, wide):
    check_promoted_by(case, wide)


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float64])
def test_step_discounts_take_the_dtype_asked_for(dtype):
    # Rows 0..3: the transition into row 1 terminates; row 2 is a truncated final
    # observation. Transition 0: terminal, 0; transition 1: gamma; step 2: no transition.
    batch = {
        "terminated": torch.tensor([[False], [True], [False], [False]]),
        "truncated": torch.tensor([[False], [False], [True], [False]]),
    }
    args = () if dtype is None else (dtype,)
    discounts, valid = impala.step_discounts_and_valid(batch, GAMMA, *args)
    expected_dtype = torch.float32 if dtype is None else dtype
    assert discounts.dtype == expected_dtype
    assert discounts[:, 0].tolist() == [0.0, torch.tensor(GAMMA, dtype=expected_dtype).item(), 0.0]
    assert valid[:, 0].tolist() == [True, True, False]
