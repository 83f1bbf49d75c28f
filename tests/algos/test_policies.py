"""The shared acting rules (beast.algos.policies): what they store, how they draw."""

import numpy as np
import pytest
import torch

from beast.acting.inference import record_arrays
from beast.algos.policies import CategoricalPolicy, EpsilonGreedyPolicy, actor_epsilons


@pytest.mark.parametrize("n", [1, 2, 8, 256])
def test_actor_epsilons_follow_the_apex_formula(n):
    eps = actor_epsilons(n, eps_base=0.4, alpha=7.0)
    assert eps.shape == (n,) and eps.dtype == np.float32
    for i, e in enumerate(eps):
        exponent = 1.0 if n == 1 else 1.0 + 7.0 * i / (n - 1)
        # Tolerance: float32 storage of a float64 power.
        assert e == pytest.approx(0.4**exponent, rel=1e-6)
    if n > 1:
        assert eps[-1] == pytest.approx(0.4**8, rel=1e-6)
        assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    with pytest.raises(ValueError):
        actor_epsilons(0)


def bound(policy, n, params=None):
    record = record_arrays(policy, n)
    return record, policy.bind(record, params if params is not None else policy.env_params(n))


def test_epsilon_greedy_is_greedy_at_zero_uniform_at_one_and_per_env():
    torch.manual_seed(0)
    n = 20000
    q = torch.tensor([[0.0, 5.0, 1.0]]).expand(n, 3).unsqueeze(0)
    policy = EpsilonGreedyPolicy(3, epsilon=0.0)
    record, act = bound(policy, n)
    act({"q_values": q})
    assert set(policy.record_spec()) == {"action"} and (record["action"] == 1).all()
    record, act = bound(EpsilonGreedyPolicy(3, epsilon=1.0), n)
    act({"q_values": q})
    counts = np.bincount(record["action"], minlength=3)
    # Uniform: each 1/3 of 20000; 5 sigma of a binomial is ~330.
    assert (np.abs(counts - n / 3) < 330).all()
    # Each env its own epsilon: 0 for the even rows, 1 for the odd ones.
    epsilons = np.tile(np.array([0.0, 1.0], dtype=np.float32), n // 2)
    record, act = bound(EpsilonGreedyPolicy(3), n, {"epsilon": epsilons})
    act({"q_values": q})
    assert (record["action"][0::2] == 1).all() and (record["action"][1::2] != 1).any()


def test_epsilon_greedy_params_are_the_apex_spread_or_one_test_epsilon():
    spread = EpsilonGreedyPolicy(4, eps_base=0.4, eps_alpha=7.0).env_params(8)["epsilon"]
    np.testing.assert_array_equal(spread, actor_epsilons(8, 0.4, 7.0))
    fixed = EpsilonGreedyPolicy(4, epsilon=0.001).env_params(3)["epsilon"]
    np.testing.assert_array_equal(fixed, np.full(3, 0.001, dtype=np.float32))
    # A scheduled epsilon comes from the model's output, the same for every env: no
    # per-env constants (benchmarks.atari reads their absence as "the envs act alike").
    scheduled = EpsilonGreedyPolicy(3, scheduled=True)
    assert scheduled.env_params(8) == {}
    n = 2000
    q = torch.tensor([[0.0, 5.0, 1.0]]).expand(n, 3).unsqueeze(0)
    record, act = bound(scheduled, n)
    act({"q_values": q, "epsilon": torch.zeros(1, n)})
    assert (record["action"] == 1).all()
    act({"q_values": q, "epsilon": torch.ones(1, n)})
    assert (record["action"] != 1).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_categorical_stores_logits_and_baseline_and_samples_the_softmax(dtype):
    torch.manual_seed(0)
    n = 30000
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(n, 3).unsqueeze(0).to(dtype)
    baseline = torch.arange(n, dtype=torch.float32).unsqueeze(0).to(dtype)
    policy = CategoricalPolicy(3)
    record, act = bound(policy, n)
    act({"policy_logits": logits, "baseline": baseline})
    assert set(record) == {"action", "policy_logits", "baseline"}
    assert record["policy_logits"].dtype == record["baseline"].dtype == np.float32
    np.testing.assert_array_equal(record["policy_logits"], logits[0].float().numpy())
    np.testing.assert_array_equal(record["baseline"], baseline[0].float().numpy())
    freq = np.bincount(record["action"], minlength=3) / n
    probs = torch.softmax(logits[0, 0].float(), -1).numpy()
    # 5 sigma of a binomial frequency at n = 30000: at most 5 * sqrt(0.25 / n) ~ 0.015.
    np.testing.assert_allclose(freq, probs, atol=0.015)


def test_categorical_without_exploration_takes_the_most_probable_action():
    """--mode test and --eval_interval: deterministic, the argmax of each row's logits
    (the first of tied ones), and the logits and baseline stored as when exploring."""
    torch.manual_seed(0)
    logits = torch.tensor([[[0.1, 2.0, -1.0], [3.0, 3.0, 0.0], [-5.0, -4.0, -4.5]]])
    baseline = torch.tensor([[1.0, 2.0, 3.0]])
    record, act = bound(CategoricalPolicy(3, explore=False), 3)
    for _ in range(50):  # never a draw: the same actions every time
        act({"policy_logits": logits, "baseline": baseline})
        np.testing.assert_array_equal(record["action"], [1, 0, 1])
    np.testing.assert_array_equal(record["policy_logits"], logits[0].numpy())
    np.testing.assert_array_equal(record["baseline"], baseline[0].numpy())
