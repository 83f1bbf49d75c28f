"""Contract of beast.algos.impala: the batch shift, reward clipping, episode
ends (terminations cut the bootstrap, truncations bootstrap from the final
observation), which tensors carry gradients, the entropy sign, masks and sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from beast.algos import impala, vtrace
from beast.algos.distributions import Categorical

LOSS_KWARGS = {
    "discounting": 0.9,
    "reward_clipping": "abs_one",
    "baseline_cost": 0.5,
    "entropy_cost": 0.01,
}


def make_batch(num_steps, batch_size, num_actions=4, seed=0):
    """Random learner outputs (leaf tensors requiring grad) and a batch of T+1 steps."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_steps + 1, batch_size)
    learner_outputs = {
        "policy_logits": torch.randn(*shape, num_actions, generator=g).requires_grad_(True),
        "baseline": torch.randn(*shape, generator=g).requires_grad_(True),
    }
    terminated = torch.rand(*shape, generator=g) < 0.2
    batch = {
        "obs": torch.zeros(*shape, 2, 2, dtype=torch.uint8),  # ignored
        "reward": torch.randn(*shape, generator=g),
        "done": terminated,
        "terminated": terminated,
        "truncated": torch.zeros(shape, dtype=torch.bool),
        "action": torch.randint(0, num_actions, shape, generator=g),
        "policy_logits": torch.randn(*shape, num_actions, generator=g),
    }
    return learner_outputs, batch


def numpy_log_softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("num_steps", [1, 5])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_shapes_and_stats(num_steps, batch_size):
    learner_outputs, batch = make_batch(num_steps, batch_size)
    out = impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)
    assert out.total_loss.shape == () and torch.isfinite(out.total_loss)
    assert out.total_loss.requires_grad
    expected_keys = {
        "total_loss",
        "pg_loss",
        "baseline_loss",
        "entropy_loss",
        "mean_rho",
        "rho_clipped_fraction",
        "mean_entropy",
    }
    assert set(out.stats) == expected_keys
    for key, value in out.stats.items():
        assert value.shape == () and not value.requires_grad, key
    # Tolerance: the same three float32 scalars summed in the same order.
    torch.testing.assert_close(
        out.stats["total_loss"],
        out.stats["pg_loss"] + out.stats["baseline_loss"] + out.stats["entropy_loss"],
    )
    assert 0.0 <= out.stats["rho_clipped_fraction"] <= 1.0
    assert 0.0 <= out.stats["mean_entropy"] <= math.log(4) + 1e-6  # float32 slack


def test_rejects_a_single_step():
    learner_outputs, batch = make_batch(0, 2)
    with pytest.raises(ValueError, match="T\\+1 >= 2"):
        impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)


def test_rejects_mismatched_batch():
    learner_outputs, batch = make_batch(3, 2)
    batch["reward"] = batch["reward"][:-1]
    with pytest.raises(ValueError, match="reward"):
        impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)


@pytest.mark.parametrize("mode", ["abs", "ABS_ONE", "", "clip"])
def test_bad_reward_clipping_raises(mode):
    learner_outputs, batch = make_batch(2, 2)
    with pytest.raises(ValueError, match="reward_clipping"):
        impala.impala_loss(learner_outputs, batch, **{**LOSS_KWARGS, "reward_clipping": mode})


def test_abs_one_clips_rewards():
    learner_outputs, batch = make_batch(4, 2)
    big, unit = dict(batch), dict(batch)
    big["reward"] = batch["reward"].clone()
    unit["reward"] = batch["reward"].clone()
    big["reward"][2, 0], unit["reward"][2, 0] = 5.0, 1.0
    big["reward"][3, 1], unit["reward"][3, 1] = -5.0, -1.0

    def loss(b, mode):
        return impala.impala_loss(learner_outputs, b, **{**LOSS_KWARGS, "reward_clipping": mode})

    clipped_big, clipped_unit = loss(big, "abs_one"), loss(unit, "abs_one")
    assert torch.equal(clipped_big.total_loss, clipped_unit.total_loss)
    for key in clipped_big.stats:
        assert torch.equal(clipped_big.stats[key], clipped_unit.stats[key]), key
    assert not torch.equal(loss(big, "none").total_loss, loss(unit, "none").total_loss)


def hand_case(done, truncated=(False, False, False, False)):
    """T=3, B=1, A=2, on-policy (batch logits == learner logits, so rho = 1).

    reward[1:] = 1, 2, 3; baseline = 0.5, -1, 4 and bootstrap 10. `done` marks
    terminations (same-step resets), `truncated` final observations of time limits.
    """
    logits = torch.tensor([[[0.0, 1.0]], [[2.0, 0.0]], [[0.5, 0.5]], [[1.0, -1.0]]])
    learner_outputs = {
        "policy_logits": logits.clone().requires_grad_(True),
        "baseline": torch.tensor([[0.5], [-1.0], [4.0], [10.0]], requires_grad=True),
    }
    batch = {
        # reward[0] and done[0] describe the transition into obs_0 (previous rollout).
        "reward": torch.tensor([[7.0], [1.0], [2.0], [3.0]]),
        "done": torch.tensor(done).unsqueeze(1),
        "terminated": torch.tensor(done).unsqueeze(1),
        "truncated": torch.tensor(truncated).unsqueeze(1),
        "action": torch.tensor([[1], [0], [1], [0]]),
        "policy_logits": logits.clone(),
    }
    return learner_outputs, batch


def pg_loss_by_hand(logits, actions, advantages):
    log_probs = numpy_log_softmax(logits.detach().numpy()[:-1, 0])
    return -sum(log_probs[t, actions[t, 0]] * advantages[t] for t in range(len(advantages)))


def test_episode_end_zeroes_the_discount():
    # done[2]: obs_2 starts an episode, so the transition out of obs_1 was
    # terminal and discounts = 0.9, 0, 0.9. By hand (rho = c = 1):
    #   vs = 1 + 0.9*2, 2, 3 + 0.9*10 = 2.8, 2, 12
    #   pg advantages = r_s + gamma_s vs_{s+1} - V_s = 2.3, 3, 8
    # done[0] and reward[0] describe the transition into obs_0 and must not matter.
    learner_outputs, batch = hand_case([True, False, True, False])
    kwargs = {**LOSS_KWARGS, "reward_clipping": "none", "entropy_cost": 0.0}
    out = impala.impala_loss(learner_outputs, batch, **kwargs)

    vs, values = np.array([2.8, 2.0, 12.0]), np.array([0.5, -1.0, 4.0])
    expected_baseline = 0.5 * 0.5 * np.sum((vs - values) ** 2)  # baseline_cost * 0.5 * sum
    expected_pg = pg_loss_by_hand(
        learner_outputs["policy_logits"], batch["action"], [2.3, 3.0, 8.0]
    )
    # Tolerance: float32 arithmetic on numbers of order 10-100.
    assert out.stats["baseline_loss"].item() == pytest.approx(expected_baseline, rel=1e-6)
    assert out.stats["pg_loss"].item() == pytest.approx(expected_pg, rel=1e-6)
    # On-policy: every ratio is exactly exp(0) = 1.
    assert out.stats["mean_rho"].item() == 1.0
    assert out.stats["rho_clipped_fraction"].item() == 0.0

    learner_outputs2, batch2 = hand_case([False, False, True, False])
    batch2["reward"][0] = -100.0
    out2 = impala.impala_loss(learner_outputs2, batch2, **kwargs)
    assert torch.equal(out.total_loss, out2.total_loss)


def test_episode_end_at_last_step_drops_the_bootstrap():
    # done[T]: the last transition was terminal, so V(obs_T) is never used:
    # the loss ignores it and it gets no gradient.
    learner_outputs, batch = hand_case([False, False, False, True])
    out = impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)
    out.total_loss.backward()
    assert learner_outputs["baseline"].grad[-1].item() == 0.0

    learner_outputs2, batch2 = hand_case([False, False, False, True])
    with torch.no_grad():
        learner_outputs2["baseline"][-1] = -1e3
    assert torch.equal(
        impala.impala_loss(learner_outputs2, batch2, **LOSS_KWARGS).total_loss, out.total_loss
    )


def test_truncation_bootstraps_from_the_final_observation():
    # obs_2 is the final observation of an episode cut by a time limit (truncated[2]);
    # the env resets instead of acting from it, so step 3 is the next episode's first
    # (done, reward 0) and the transition out of step 2 is no transition. By hand
    # (rho = c = 1 on policy; step 2 gets rho = c = 0, so vs_2 = V_2):
    #   vs = 1 + 0.9*5.6, 2 + 0.9*V_2, V_2 = 6.04, 5.6, 4
    #   pg advantages = r + gamma vs_next - V = 1 + 0.9*5.6 - 0.5, 2 + 0.9*4 + 1 = 5.54, 6.6
    # Treating the time limit as terminal would give vs_1 = 2; bootstrapping from the
    # next episode's first observation, 2 + 0.9*10 = 11.
    learner_outputs, batch = hand_case(
        [False, False, False, True], truncated=[False, False, True, False]
    )
    batch["terminated"][3] = False  # step 3 is a reset after a truncation, not a termination
    batch["reward"][3] = 99.0  # the no-transition's reward: must not matter
    kwargs = {**LOSS_KWARGS, "reward_clipping": "none", "entropy_cost": 0.0}
    out = impala.impala_loss(learner_outputs, batch, **kwargs)
    vs, values = np.array([6.04, 5.6]), np.array([0.5, -1.0])
    expected_baseline = 0.5 * 0.5 * np.sum((vs - values) ** 2)
    logits = learner_outputs["policy_logits"]
    expected_pg = pg_loss_by_hand(logits[[0, 1, 3]], batch["action"], [5.54, 6.6])
    # Tolerance: float32 arithmetic on numbers of order 10-100.
    assert out.stats["baseline_loss"].item() == pytest.approx(expected_baseline, rel=1e-6)
    assert out.stats["pg_loss"].item() == pytest.approx(expected_pg, rel=1e-6)
    out.total_loss.backward()
    # Step 2 trains nothing (its action was never taken): V(final obs) is only a target.
    assert learner_outputs["baseline"].grad[2].item() == 0.0
    assert torch.all(learner_outputs["policy_logits"].grad[2] == 0)
    assert learner_outputs["baseline"].grad[1].item() != 0.0


def test_gradients_flow_to_outputs_not_through_targets():
    learner_outputs, batch = make_batch(6, 3, seed=1)
    batch["policy_logits"].requires_grad_(True)
    kwargs = {**LOSS_KWARGS, "entropy_cost": 0.0}
    out = impala.impala_loss(learner_outputs, batch, **kwargs)
    out.total_loss.backward()

    logits, baseline = learner_outputs["policy_logits"], learner_outputs["baseline"]
    discounts = 0.9 * (~batch["terminated"][1:]).float()
    targets = vtrace.from_logits(
        batch["policy_logits"][:-1].detach(),
        logits[:-1].detach(),
        batch["action"][:-1],
        discounts,
        batch["reward"][1:].clamp(-1, 1),
        baseline[:-1].detach(),
        baseline[-1].detach(),
    )
    # With vs and the advantages as constants:
    #   d/dV_t [0.5 * cost * (vs_t - V_t)^2] = -cost * (vs_t - V_t)
    #   d/dlogits_t [-log pi(a_t) A_t] = A_t * (softmax(logits_t) - onehot(a_t))
    # and step T, which only feeds the targets, gets nothing.
    expected_baseline_grad = -0.5 * (targets.vs - baseline[:-1].detach())
    onehot = torch.nn.functional.one_hot(batch["action"][:-1], logits.shape[-1]).float()
    expected_logits_grad = targets.pg_advantages.unsqueeze(-1) * (
        torch.softmax(logits[:-1].detach(), -1) - onehot
    )
    # Tolerance: float32 gradients of O(1-10) quantities.
    torch.testing.assert_close(baseline.grad[:-1], expected_baseline_grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad[:-1], expected_logits_grad, rtol=1e-5, atol=1e-5)
    assert torch.all(baseline.grad[-1] == 0) and torch.all(logits.grad[-1] == 0)
    # The behaviour policy is data: no graph reaches it.
    assert batch["policy_logits"].grad is None


def test_losses_are_sums_over_time_and_batch():
    # Duplicating the batch along B doubles every loss term (sums, not means).
    learner_outputs, batch = make_batch(4, 2, seed=2)
    out = impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)
    doubled_outputs = {k: torch.cat([v, v], dim=1) for k, v in learner_outputs.items()}
    doubled_batch = {k: torch.cat([v, v], dim=1) for k, v in batch.items()}
    doubled = impala.impala_loss(doubled_outputs, doubled_batch, **LOSS_KWARGS)
    for key in ("total_loss", "pg_loss", "baseline_loss", "entropy_loss"):
        # Tolerance: float32 sums of twice as many terms.
        torch.testing.assert_close(doubled.stats[key], 2 * out.stats[key], rtol=1e-5, atol=1e-5)
    for key in ("mean_rho", "rho_clipped_fraction", "mean_entropy"):
        torch.testing.assert_close(doubled.stats[key], out.stats[key], rtol=1e-5, atol=1e-6)


def entropy(logits):
    log_probs = numpy_log_softmax(logits)
    return -(np.exp(log_probs) * log_probs).sum(-1)


def softmax_entropy(logits):
    return Categorical(logits.shape[-1]).entropy({"policy_logits": logits})


def test_entropy_loss_is_negative_entropy_and_minimising_it_flattens_the_policy():
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(5, 3, 6, generator=g)).requires_grad_(True)
    loss = impala.entropy_loss(softmax_entropy(logits))
    # Tolerance: float32 log-softmax and a sum of 15 O(1) entropies.
    assert loss.item() == pytest.approx(-entropy(logits.detach().numpy()).sum(), rel=1e-5)
    loss.backward()
    stepped = (logits - 0.1 * logits.grad).detach().numpy()
    # Every one of the 15 policies gets flatter after a gradient step.
    assert np.all(entropy(stepped) > entropy(logits.detach().numpy()))

    uniform = torch.zeros(2, 2, 6, requires_grad=True)
    impala.entropy_loss(softmax_entropy(uniform)).backward()
    # Tolerance: at the maximum the gradient is 0 up to float32 rounding of log(1/6).
    assert uniform.grad.abs().max() < 1e-6


def test_impala_entropy_term_uses_the_cost_and_learner_logits():
    learner_outputs, batch = make_batch(3, 2, seed=3)
    out = impala.impala_loss(learner_outputs, batch, **LOSS_KWARGS)
    expected = LOSS_KWARGS["entropy_cost"] * impala.entropy_loss(
        softmax_entropy(learner_outputs["policy_logits"][:-1])
    )
    # Tolerance: identical float32 computation.
    torch.testing.assert_close(out.stats["entropy_loss"], expected.detach())
    assert out.stats["entropy_loss"] < 0


def test_masks_drop_steps():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 3, 5, generator=g)
    actions = torch.randint(0, 5, (4, 3), generator=g)
    advantages = torch.randn(4, 3, generator=g)
    values, targets = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[1, 2] = mask[3, 0] = False
    keep = mask.clone()

    def masked_vs_dropped(fn, *args):
        # Masking with all ones equals no mask; masking a step equals deleting it.
        assert torch.equal(fn(*args, mask=torch.ones(4, 3)), fn(*args))
        dropped = fn(*(a[keep].unsqueeze(0) for a in args))
        # Tolerance: float32 sums of the same terms in a different order.
        torch.testing.assert_close(fn(*args, mask=mask), dropped, rtol=1e-5, atol=1e-5)

    log_probs = vtrace.action_log_probs(logits, actions)
    masked_vs_dropped(impala.policy_gradient_loss, log_probs, advantages)
    masked_vs_dropped(impala.baseline_loss, values, targets)
    masked_vs_dropped(impala.entropy_loss, softmax_entropy(logits))
    with pytest.raises(ValueError, match="mask"):
        impala.baseline_loss(values, targets, mask=mask[:2])
