"""Every public numerics function of beast.algos in float32 and in float64 (the dtype rule,
beast/algos/dtypes.py): the outputs' dtype, and their values against float64 references.

The references are plain loops over the papers' formulas, in float64, never the code
under test; where a test module already holds one (V-trace, the C51 projection, value
rescaling, R2D2's targets, GAE, the tanh-Gaussian log-density) it is reused from there.
Each case is run three ways:

- all float inputs float32: float32 outputs, equal to the reference on the same
  (float32-rounded) numbers to float32 precision;
- all float64: float64 outputs, equal to the reference to float64 precision, which a
  silent float32 step anywhere inside would break by seven orders of magnitude;
- one float input float64 and the rest float32, for each input every checked output is
  computed from: float64 outputs (inputs of mixed precision promote).

Not here, having no float tensor input: `dqn.linear_epsilon` (Python numbers),
`impala.step_discounts_and_valid` (episode flags; its discounts take the dtype asked
for, tested at the end),
`laser.trust_region_mask` (a comparison), `r2d2.unroll_with_burn_in` (a model's unroll).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import Tensor

from beast.algos import dqn, gae, impala, laser, nstep, ppo, r2d2, vtrace
from beast.algos.distributions import Categorical, DiagGaussian
from beast.algos.qpg import functions as qpg
from beast.algos.value_rescaling import inverse_value_rescaling, value_rescaling
from tests.support.references import (
    builder_like_batch,
    gae_reference,
    h_inverse_reference,
    h_reference,
    implied_kl_by_quadrature,
    loss_reference,
    numpy_log_softmax,
    priorities_reference,
    random_episode_ends,
    reference_projection,
    reference_tanh_gaussian_log_prob,
    targets_reference,
    vtrace_reference,
)

T, B, A, N_STEP, D = 6, 5, 4, 3, 2  # steps, batch, actions, n-step window, action dims
GAMMA, LAMBDA, EPS = 0.9, 0.95, 1e-3
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


# dqn ----------------------------------------------------------------------------------


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

BASELINE_COST, ENTROPY_COST, RHO_BAR = 0.5, 0.01, 1.0
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


def implied_kl_reference(behaviour_logits, target_logits, rho_bar):
    """KL(pi || pi~), pi~ = min(rho_bar mu, pi) / Z (LASER section 4.3), per step."""
    pi, mu = softmax(target_logits), softmax(behaviour_logits)
    implied = np.minimum(rho_bar * mu, pi)
    implied = implied / implied.sum(-1, keepdims=True)
    return (pi * np.log(pi / implied)).sum(-1)


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


def per_step_inputs(rng, *names):
    return {
        **{name: rng.normal(0.0, 1.0, (T, B)) for name in names},
        "mask": rng.random((T, B)) < 0.8,
    }


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


# PPO and the action distributions -----------------------------------------------------


def surrogate_reference(x, clip_range):
    ratio, advantages = np.exp(x["log_ratio"]), x["advantages"]
    if clip_range is None:
        return (-x["log_ratio"] * advantages,)
    clipped = np.clip(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return (-np.minimum(ratio * advantages, clipped * advantages),)


def value_loss_reference(x, clip_range):
    loss = (x["values"] - x["returns"]) ** 2
    if clip_range is None:
        return (loss,)
    moved = np.clip(x["values"] - x["old_values"], -clip_range, clip_range)
    return (np.maximum(loss, (x["old_values"] + moved - x["returns"]) ** 2),)


def gaussian_inputs(rng):
    return {
        "action_mean": rng.normal(0.0, 1.0, (T, B, D)),
        "action_log_std": rng.uniform(-1.0, 0.5, (T, B, D)),
        "actions": rng.normal(0.0, 1.0, (T, B, D)),
    }


def gaussian_params(t):
    return {key: t[key] for key in ("action_mean", "action_log_std")}


def gaussian_log_prob_reference(x):
    """sum_i log N(a_i; m_i, s_i), element by element."""
    out = np.zeros((T, B))
    for index in np.ndindex(T, B):
        for m, log_s, a in zip(
            x["action_mean"][index], x["action_log_std"][index], x["actions"][index], strict=True
        ):
            s = math.exp(log_s)
            out[index] += -((a - m) ** 2) / (2 * s * s) - log_s - 0.5 * math.log(2 * math.pi)
    return (out,)


# The Monte-Carlo KL of a Gaussian policy, on many identical steps (test_ppo.py's case).
KL_STEPS = 4096
KL_GAUSSIANS = {"mu": 1.0, "sigma_mu": 1.0, "pi": 0.0, "sigma_pi": 1.0}


def gaussian_kl_inputs(rng):
    def full(value):
        return np.full((KL_STEPS, 1, 1), value)

    return {
        "behaviour_mean": full(KL_GAUSSIANS["mu"]),
        "behaviour_log_std": full(math.log(KL_GAUSSIANS["sigma_mu"])),
        "target_mean": full(KL_GAUSSIANS["pi"]),
        "target_log_std": full(math.log(KL_GAUSSIANS["sigma_pi"])),
    }


def gaussian_kl_call(t):
    torch.manual_seed(0)

    def params(who):
        return {"action_mean": t[f"{who}_mean"], "action_log_std": t[f"{who}_log_std"]}

    kl = DiagGaussian(1).implied_kl(params("behaviour"), params("target"), rho_bar=RHO_BAR)
    return (kl.mean(),)


def categorical_inputs(rng):
    return {"policy_logits": rng.normal(0.0, 2.0, (T, B, A)), "actions": rng.integers(0, A, (T, B))}


POLICY_CASES = [
    Case(
        "ppo.masked_mean",
        lambda rng: per_step_inputs(rng, "values"),
        lambda t: (ppo.masked_mean(t["values"], t["mask"]),),
        lambda x: ((x["values"] * x["mask"]).sum() / max(x["mask"].sum(), 1),),
        ("values",),
    ),
    *(
        Case(
            f"ppo.clipped_surrogate[clip_range={clip_range}]",
            lambda rng: {
                "log_ratio": rng.normal(0.0, 0.3, T * B),
                "advantages": rng.normal(0.0, 1.0, T * B),
            },
            lambda t, clip_range=clip_range: (
                ppo.clipped_surrogate(t["log_ratio"], t["advantages"], clip_range),
            ),
            lambda x, clip_range=clip_range: surrogate_reference(x, clip_range),
            ("log_ratio", "advantages"),
        )
        for clip_range in (0.2, None)
    ),
    *(
        Case(
            f"ppo.value_loss[clip_range_vf={clip_range}]",
            lambda rng: {
                key: rng.normal(0.0, 0.5, T * B) for key in ("values", "returns", "old_values")
            },
            lambda t, clip_range=clip_range: (
                ppo.value_loss(t["values"], t["returns"], t["old_values"], clip_range),
            ),
            lambda x, clip_range=clip_range: value_loss_reference(x, clip_range),
            ("values", "returns") if clip_range is None else ("values", "returns", "old_values"),
        )
        for clip_range in (0.2, None)
    ),
    Case(
        "Categorical.log_prob",
        categorical_inputs,
        lambda t: (Categorical(A).log_prob({"policy_logits": t["policy_logits"]}, t["actions"]),),
        lambda x: (pick(numpy_log_softmax(x["policy_logits"]), x["actions"]),),
        ("policy_logits",),
    ),
    Case(
        "Categorical.entropy",
        categorical_inputs,
        lambda t: (Categorical(A).entropy({"policy_logits": t["policy_logits"]}),),
        lambda x: (-(softmax(x["policy_logits"]) * numpy_log_softmax(x["policy_logits"])).sum(-1),),
        ("policy_logits",),
    ),
    Case(
        "Categorical.implied_kl",
        lambda rng: {
            "behaviour": rng.normal(0.0, 1.0, (T, B, A)),
            "target": rng.normal(0.0, 1.0, (T, B, A)),
        },
        lambda t: (
            Categorical(A).implied_kl(
                {"policy_logits": t["behaviour"]}, {"policy_logits": t["target"]}, 2.0
            ),
        ),
        lambda x: (implied_kl_reference(x["behaviour"], x["target"], 2.0),),
        ("behaviour", "target"),
    ),
    Case(
        "DiagGaussian.log_prob",
        gaussian_inputs,
        lambda t: (DiagGaussian(D).log_prob(gaussian_params(t), t["actions"]),),
        gaussian_log_prob_reference,
        ("action_mean", "action_log_std"),  # actions are taken in the parameters' dtype
    ),
    Case(
        "DiagGaussian.entropy",
        gaussian_inputs,
        lambda t: (DiagGaussian(D).entropy(gaussian_params(t)),),
        lambda x: ((x["action_log_std"] + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1),),
        ("action_log_std",),
    ),
    Case(
        "DiagGaussian.implied_kl",
        gaussian_kl_inputs,
        gaussian_kl_call,
        lambda x: (implied_kl_by_quadrature(**KL_GAUSSIANS, rho_bar=RHO_BAR),),
        ("behaviour_mean", "behaviour_log_std", "target_mean", "target_log_std"),
        # Tolerance: the Monte-Carlo estimate's bias and spread with 32 draws per step,
        # as test_ppo.py's, in either dtype.
        tol32=(0.1, 2e-3),
        tol64=(0.1, 2e-3),
    ),
]


# qpg (DDPG, TD3, SAC) -----------------------------------------------------------------


def unit_box_inputs(rng, low_action, high_action):
    return {
        "actions": rng.uniform(low_action, high_action, (B, D)),
        "low": rng.uniform(-3.0, -1.0, D),
        "high": rng.uniform(1.0, 3.0, D),
    }


def tanh_gaussian_reference(u, mean, log_std):
    out = np.zeros(B)
    for b in range(B):
        out[b] = reference_tanh_gaussian_log_prob(u[b], mean[b], log_std[b])
    return out


def sample_reference(x):
    u = x["mean"] + np.exp(x["log_std"]) * x["noise"]
    return np.tanh(u), tanh_gaussian_reference(u, x["mean"], x["log_std"])


ALPHA, TARGET_NOISE, NOISE_CLIP, TARGET_ENTROPY = 0.2, 0.4, 0.5, -2.0

QPG_CASES = [
    Case(
        "to_unit_actions",
        lambda rng: unit_box_inputs(rng, -1.0, 1.0),
        lambda t: (qpg.to_unit_actions(t["actions"], t["low"], t["high"]),),
        lambda x: (2.0 * (x["actions"] - x["low"]) / (x["high"] - x["low"]) - 1.0,),
        ("actions", "low", "high"),
    ),
    Case(
        "from_unit_actions",
        lambda rng: unit_box_inputs(rng, -1.0, 1.0),
        lambda t: (qpg.from_unit_actions(t["actions"], t["low"], t["high"]),),
        lambda x: (x["low"] + (x["actions"] + 1.0) * (x["high"] - x["low"]) / 2.0,),
        ("actions", "low", "high"),
    ),
    Case(
        "tanh_gaussian_log_prob",
        lambda rng: {
            "u": rng.uniform(-3.0, 3.0, (B, D)),
            "mean": rng.uniform(-1.0, 1.0, (B, D)),
            "log_std": rng.uniform(-2.0, 0.5, (B, D)),
        },
        lambda t: (qpg.tanh_gaussian_log_prob(t["u"], t["mean"], t["log_std"]),),
        lambda x: (tanh_gaussian_reference(x["u"], x["mean"], x["log_std"]),),
        ("u", "mean", "log_std"),
    ),
    Case(
        "sample_tanh_gaussian",
        lambda rng: {
            "mean": rng.uniform(-1.0, 1.0, (B, D)),
            "log_std": rng.uniform(-2.0, 0.0, (B, D)),
            "noise": rng.normal(0.0, 1.0, (B, D)),
        },
        lambda t: qpg.sample_tanh_gaussian(t["mean"], t["log_std"], t["noise"]),
        sample_reference,
        ("mean", "log_std", "noise"),
    ),
    Case(
        "soft_q_targets",
        lambda rng: returns_inputs(
            rng, next_q=rng.normal(0.0, 2.0, (2, B)), next_log_prob=rng.normal(0.0, 1.0, B)
        ),
        lambda t: (
            qpg.soft_q_targets(n_step(t), t["terminal"], t["next_q"], t["next_log_prob"], ALPHA),
        ),
        lambda x: (bootstrapped(x, x["next_q"].min(0) - ALPHA * x["next_log_prob"]),),
        ("returns", "discounts", "next_q", "next_log_prob"),
    ),
    Case(
        "smoothed_target_actions",
        lambda rng: {
            "target_actions": rng.uniform(-1.0, 1.0, (B, D)),
            "noise": rng.normal(0.0, 1.0, (B, D)),
        },
        lambda t: (
            qpg.smoothed_target_actions(t["target_actions"], t["noise"], TARGET_NOISE, NOISE_CLIP),
        ),
        lambda x: (
            np.clip(
                x["target_actions"] + np.clip(TARGET_NOISE * x["noise"], -NOISE_CLIP, NOISE_CLIP),
                -1.0,
                1.0,
            ),
        ),
        ("target_actions", "noise"),
    ),
    Case(
        "td3_targets",
        lambda rng: returns_inputs(rng, next_q=rng.normal(0.0, 2.0, (2, B))),
        lambda t: (qpg.td3_targets(n_step(t), t["terminal"], t["next_q"]),),
        lambda x: (bootstrapped(x, x["next_q"].min(0)),),
        ("returns", "discounts", "next_q"),
    ),
    Case(
        "critic_loss",
        lambda rng: {
            "q": rng.normal(0.0, 2.0, (2, B)),
            "targets": rng.normal(0.0, 2.0, B),
            "weights": rng.uniform(0.0, 1.0, B),
        },
        lambda t: (qpg.critic_loss(t["q"], t["targets"], t["weights"]),),
        lambda x: (0.5 * (x["weights"] * (x["q"] - x["targets"]) ** 2).mean(1).sum(),),
        ("q", "targets", "weights"),
    ),
    Case(
        "temperature_loss",
        lambda rng: {"log_alpha": np.array(rng.normal()), "log_probs": rng.normal(0.0, 1.0, B)},
        lambda t: (qpg.temperature_loss(t["log_alpha"], t["log_probs"], TARGET_ENTROPY),),
        lambda x: (-(x["log_alpha"] * (x["log_probs"] + TARGET_ENTROPY)).mean(),),
        ("log_probs",),  # a 0-dim log_alpha counts as a Python number (dtypes.py)
    ),
]


CASES = [
    *DQN_CASES,
    *R2D2_CASES,
    *TARGET_CASES,
    *ACTOR_CRITIC_CASES,
    *POLICY_CASES,
    *QPG_CASES,
]


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_outputs_follow_the_inputs_dtype(case, dtype):
    tolerance = case.tol32 if dtype == torch.float32 else case.tol64
    check(case, dict.fromkeys(float_inputs(case), dtype), tolerance)


@pytest.mark.parametrize(
    ("case", "wide"),
    [(case, name) for case in CASES for name in case.promoting],
    ids=[f"{case.name}-{name}" for case in CASES for name in case.promoting],
)
def test_one_float64_input_promotes_the_outputs(case, wide):
    dtypes = dict.fromkeys(float_inputs(case), torch.float32)
    dtypes[wide] = torch.float64
    # Tolerance: float32's, as the other inputs carry float32 roundings.
    check(case, dtypes, case.tol32)


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
