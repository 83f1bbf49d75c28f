"""The dtype rule for the policies' numerics: PPO's surrogate and value losses, the
categorical and Gaussian distributions (beast/algos/surrogate.py, distributions.py), and
DDPG's, TD3's and SAC's targets and losses (beast/algos/qpg/functions.py).

The references are plain loops over the papers' formulas, in float64, never the code
under test (tests/support/references.py). Each case is run three ways
(tests/support/dtype_cases.py): all float inputs float32, all float64, and one float
input float64 with the rest float32, for each input every checked output is computed
from.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from beast.algos import surrogate
from beast.algos.distributions import Categorical, DiagGaussian
from beast.algos.qpg import functions as qpg
from tests.support.dtype_cases import (
    DTYPES,
    RHO_BAR,
    A,
    B,
    Case,
    D,
    T,
    bootstrapped,
    cases,
    check_in,
    check_promoted_by,
    implied_kl_reference,
    n_step,
    per_step_inputs,
    pick,
    promoting,
    returns_inputs,
    softmax,
)
from tests.support.references import (
    implied_kl_by_quadrature,
    numpy_log_softmax,
    reference_tanh_gaussian_log_prob,
)

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
        "surrogate.masked_mean",
        lambda rng: per_step_inputs(rng, "values"),
        lambda t: (surrogate.masked_mean(t["values"], t["mask"]),),
        lambda x: ((x["values"] * x["mask"]).sum() / max(x["mask"].sum(), 1),),
        ("values",),
    ),
    *(
        Case(
            f"surrogate.clipped_surrogate[clip_range={clip_range}]",
            lambda rng: {
                "log_ratio": rng.normal(0.0, 0.3, T * B),
                "advantages": rng.normal(0.0, 1.0, T * B),
            },
            lambda t, clip_range=clip_range: (
                surrogate.clipped_surrogate(t["log_ratio"], t["advantages"], clip_range),
            ),
            lambda x, clip_range=clip_range: surrogate_reference(x, clip_range),
            ("log_ratio", "advantages"),
        )
        for clip_range in (0.2, None)
    ),
    *(
        Case(
            f"surrogate.value_loss[clip_range_vf={clip_range}]",
            lambda rng: {
                key: rng.normal(0.0, 0.5, T * B) for key in ("values", "returns", "old_values")
            },
            lambda t, clip_range=clip_range: (
                surrogate.value_loss(t["values"], t["returns"], t["old_values"], clip_range),
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


CASES = [*POLICY_CASES, *QPG_CASES]


@DTYPES
@cases(CASES)
def test_outputs_follow_the_inputs_dtype(case, dtype):
    check_in(case, dtype)


@promoting(CASES)
def test_one_float64_input_promotes_the_outputs(case, wide):
    check_promoted_by(case, wide)
