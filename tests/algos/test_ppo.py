"""PPO and A2C (beast/algos/ppo.py, beast/algos/gae.py, beast/algos/distributions.py):
numerics against references written from the papers' formulas, the update's mechanics,
and the flags' checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from beast.algos.distributions import Categorical, DiagGaussian
from beast.algos.gae import generalized_advantages
from beast.algos.surrogate import clipped_surrogate, masked_mean, value_loss
from beast.config import ConfigError
from beast.run.parsing import parse_args
from tests.support.references import gae_reference, implied_kl_by_quadrature, random_episode_ends

# GAE ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_papers_sum_with_terminals_and_truncations(lam, seed):
    rng = np.random.default_rng(seed)
    T, B, gamma = 23, 6, 0.97
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T + 1, B))
    terminated, truncated = random_episode_ends(rng, T, B)
    assert terminated.any() and truncated.any()
    out = generalized_advantages(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(terminated),
        torch.tensor(truncated),
        discount=gamma,
        lambda_=lam,
    )
    expected = gae_reference(rewards, values, terminated, truncated, gamma, lam)
    # Tolerance: float64 throughout; sums of 23 O(1) terms.
    np.testing.assert_allclose(out.advantages.numpy(), expected, atol=1e-10)
    np.testing.assert_allclose(out.returns.numpy(), expected + values[:-1], atol=1e-10)
    # A final observation's step trains nothing.
    assert np.all(out.advantages.numpy()[truncated[:-1]] == 0)


def test_gae_with_lambda_one_and_no_episode_end_is_discounted_returns_minus_values():
    rng = np.random.default_rng(3)
    T, B, gamma = 17, 4, 0.9
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T + 1, B))
    out = generalized_advantages(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.zeros((T, B), dtype=torch.bool),
        torch.zeros((T + 1, B), dtype=torch.bool),
        discount=gamma,
        lambda_=1.0,
    )
    returns = np.zeros((T, B))
    for t in range(T):
        returns[t] = sum(gamma**k * rewards[t + k] for k in range(T - t))
        returns[t] += gamma ** (T - t) * values[T]
    # Tolerance: float64.
    np.testing.assert_allclose(out.advantages.numpy(), returns - values[:-1], atol=1e-10)
    np.testing.assert_allclose(out.returns.numpy(), returns, atol=1e-10)


def test_gae_bootstraps_a_truncation_from_the_final_observation():
    # One env: x_0 -> x_1 (final, truncated) | x_2 (reset) -> x_3. lambda 0, gamma 0.5.
    rewards = torch.tensor([[1.0], [0.0], [2.0]])  # r_0, r_1 (the reset row's 0), r_2
    values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    terminated = torch.zeros((3, 1), dtype=torch.bool)
    truncated = torch.tensor([[False], [True], [False], [False]])
    out = generalized_advantages(rewards, values, terminated, truncated, discount=0.5, lambda_=0.0)
    # A_0 = 1 + 0.5 * V(final x_1) - V(x_0) = 1 + 10 - 10; A_1: no transition; A_2 =
    # 2 + 0.5 * 40 - 30.
    assert out.advantages[:, 0].tolist() == [1.0, 0.0, -8.0]


# The clipped surrogate and the value loss ------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "gradient"),
    [
        # Inside [0.8, 1.2]: -r A, gradient d/dlog r = -r A.
        (1.1, 2.0, -2.2, -2.2),
        # Above 1 + eps with A > 0: the clipped term (1.2 A) is the min: no gradient.
        (1.5, 1.0, -1.2, 0.0),
        # Below 1 - eps with A < 0: clip(r) A = -0.8 is the min: no gradient.
        (0.5, -1.0, 0.8, 0.0),
        # Below 1 - eps with A > 0: r A = 0.5 is the min, unclipped: gradient -r A.
        (0.5, 1.0, -0.5, -0.5),
        # Above 1 + eps with A < 0: r A = -1.5 is the min: gradient -r A = 1.5.
        (1.5, -1.0, 1.5, 1.5),
    ],
)
def test_clipped_surrogate_by_hand(ratio, advantage, loss, gradient):
    log_ratio = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    out = clipped_surrogate(log_ratio, torch.tensor([advantage], dtype=torch.float64), 0.2)
    out.sum().backward()
    assert out.item() == pytest.approx(loss)
    assert log_ratio.grad.item() == pytest.approx(gradient, abs=1e-12)


def test_unclipped_policy_gradient_is_a2cs():
    log_probs = torch.tensor([-0.5, -2.0], requires_grad=True)
    out = clipped_surrogate(log_probs, torch.tensor([3.0, -1.0]), None)
    assert out.tolist() == pytest.approx([1.5, -2.0])
    out.sum().backward()
    assert log_probs.grad.tolist() == [-3.0, 1.0]


def test_value_loss_clipping_by_hand():
    values = torch.tensor([1.5, 1.5, 0.9])
    returns = torch.tensor([2.0, 1.0, 0.0])
    old = torch.tensor([1.0, 1.0, 1.0])
    # Unclipped: (V - R)^2.
    assert value_loss(values, returns, old, None).tolist() == pytest.approx([0.25, 0.25, 0.81])
    # eps_V 0.2: V_clipped = (1.2, 1.2, 0.9); the larger of the two squared errors:
    # max(0.25, 0.64), max(0.25, 0.04), max(0.81, 0.81).
    clipped = value_loss(values, returns, old, 0.2)
    assert clipped.tolist() == pytest.approx([0.64, 0.25, 0.81])


def test_masked_mean_ignores_masked_steps_and_survives_an_empty_mask():
    values = torch.tensor([1.0, 100.0, 3.0])
    assert masked_mean(values, torch.tensor([True, False, True])).item() == 2.0
    assert masked_mean(values, torch.zeros(3, dtype=torch.bool)).item() == 0.0


# Distributions ---------------------------------------------------------------------------


def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 3, 4, generator=g)
    log_std = 0.5 * torch.randn(5, 3, 4, generator=g)
    actions = torch.randn(5, 3, 4, generator=g) * 2
    params = {"action_mean": mean, "action_log_std": log_std}
    reference = torch.distributions.Normal(mean, log_std.exp())
    dist = DiagGaussian(4)
    # Tolerance: float32 sums of 4 terms.
    torch.testing.assert_close(
        dist.log_prob(params, actions), reference.log_prob(actions).sum(-1), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        dist.entropy(params), reference.entropy().sum(-1), rtol=1e-5, atol=1e-5
    )


def test_categorical_log_prob_and_entropy_match_torch_distributions():
    g = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(4, 3, 6, generator=g)
    actions = torch.randint(0, 6, (4, 3), generator=g)
    reference = torch.distributions.Categorical(logits=logits)
    dist = Categorical(6)
    params = {"policy_logits": logits}
    torch.testing.assert_close(dist.log_prob(params, actions), reference.log_prob(actions))
    torch.testing.assert_close(dist.entropy(params), reference.entropy())


@pytest.mark.parametrize(
    ("mu", "sigma_mu", "pi", "sigma_pi"),
    [(0.0, 1.0, 0.0, 1.0), (1.0, 1.0, 0.0, 1.0), (0.0, 0.5, 0.3, 1.0), (0.0, 2.0, 0.0, 1.0)],
)
def test_gaussian_trust_region_kl_matches_quadrature(mu, sigma_mu, pi, sigma_pi):
    torch.manual_seed(0)
    steps = 4096  # the Monte-Carlo estimate averaged over many identical steps
    behaviour = {
        "action_mean": torch.full((steps, 1, 1), mu),
        "action_log_std": torch.full((steps, 1, 1), math.log(sigma_mu)),
    }
    target = {
        "action_mean": torch.full((steps, 1, 1), pi),
        "action_log_std": torch.full((steps, 1, 1), math.log(sigma_pi)),
    }
    kl = DiagGaussian(1).implied_kl(behaviour, target, rho_bar=1.0)
    assert kl.shape == (steps, 1) and bool((kl >= 0).all())
    expected = implied_kl_by_quadrature(mu, sigma_mu, pi, sigma_pi, 1.0)
    # Tolerance: the Monte-Carlo estimate's bias and spread with 32 draws per step
    # (its mean over 4,096 steps is within a few percent of the integral).
    assert kl.mean().item() == pytest.approx(expected, rel=0.1, abs=2e-3)


# Flags -----------------------------------------------------------------------------------


def test_num_minibatches_must_divide_the_batch():
    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--num_minibatches", "7"]
    with pytest.raises(ConfigError, match="--num_minibatches 7 does not divide the batch's 256"):
        parse_args(argv)
    # Recurrent models split whole rollouts: 8 of them here.
    with pytest.raises(ConfigError, match="does not divide the batch's 8 rollouts"):
        parse_args([*argv[:-1], "3", "--use_lstm", "--model", "mlp"])


def test_synchronous_batches_are_one_rollout_of_every_env():
    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--batch_size", "4"]
    with pytest.raises(ConfigError, match="--batch_size must be 8"):
        parse_args(argv)
    parse_args([*argv, "--no-synchronous", "--num_minibatches", "4"])  # any batch size


def test_ppo_and_a2c_pick_their_tuned_configs():
    ppo = parse_args(["--algo", "ppo", "--env", "CartPole-v1"])
    assert (ppo.num_epochs, ppo.unroll_length, ppo.model) == (20, 32, "separate_mlp")
    assert ppo.config.endswith("configs/ppo/classic.yaml")
    a2c = parse_args(["--algo", "a2c", "--env", "CartPole-v1"])
    assert (a2c.optimizer, a2c.unroll_length, a2c.normalize_advantage) == ("rmsprop", 5, False)
    cheetah = parse_args(["--algo", "ppo", "--env", "HalfCheetah-v5"])
    assert cheetah.config.endswith("configs/ppo/mujoco.yaml")
    assert cheetah.normalize_obs and cheetah.normalize_reward and cheetah.hidden_size == 256
    # Without a config file, the algorithm's own core defaults (SB3's): Adam 3e-4.
    custom = parse_args(["--algo", "ppo", "--env", "CartPole-v1", "--config", "none"])
    assert (custom.optimizer, custom.learning_rate, custom.grad_norm_clipping) == (
        "adam",
        3e-4,
        0.5,
    )


# Minibatches ---------------------------------------------------------------------------


def minibatch_fixture(T: int, B: int, recurrent: bool, num_minibatches: int):
    """A batch whose every field holds each entry's own (t, b) code, and an update that only
    knows how to cut it (the minibatching needs nothing else)."""
    from beast.algos.ppo import PolicyGradientUpdate, Targets

    code = (torch.arange(T + 1)[:, None] * 100 + torch.arange(B)[None, :]).float()
    data = {key: code.clone() for key in ("obs", "reward", "done", "last_action", "action")}
    data["core_state_0"] = torch.arange(B).float()[None, :, None].expand(1, B, 3).clone()
    targets = Targets(*(code[:-1].clone() for _ in Targets._fields))
    update = PolicyGradientUpdate.__new__(PolicyGradientUpdate)
    update.recurrent, update.num_minibatches = recurrent, num_minibatches
    return update, data, targets


def minibatches(update, data, targets):
    """The minibatches of one epoch, cut as the update cuts them."""
    inputs = update._step_inputs(data, targets)
    count = targets.valid.shape[1] if update.recurrent else targets.valid.numel()
    for index in torch.randperm(count).chunk(update.num_minibatches):
        yield update.minibatch({**inputs, "index": index})


def test_feed_forward_minibatches_cover_every_step_once_per_epoch():
    T, B = 5, 4
    update, data, targets = minibatch_fixture(T, B, recurrent=False, num_minibatches=4)
    seen = []
    for inputs, state, actions, mb in minibatches(update, data, targets):
        assert state == () and inputs["obs"].shape == (1, T * B // 4)
        # Inputs, actions and every target of a step stay together.
        for field in (*inputs.values(), actions, *mb):
            assert torch.equal(field, inputs["obs"])
        seen += inputs["obs"].flatten().tolist()
    assert sorted(seen) == sorted(data["obs"][:-1].flatten().tolist())


def test_recurrent_minibatches_keep_whole_rollouts_with_their_stored_state():
    T, B = 5, 4
    update, data, targets = minibatch_fixture(T, B, recurrent=True, num_minibatches=2)
    columns_seen = []
    for inputs, state, actions, mb in minibatches(update, data, targets):
        obs = inputs["obs"]
        assert obs.shape == (T + 1, 2)  # all T+1 steps: the model runs from step 0
        columns = (obs[0] % 100).long()
        assert torch.equal(obs, data["obs"][:, columns])  # whole rollouts, in time order
        assert torch.equal(state[0], data["core_state_0"][:, columns])  # their own state
        assert torch.equal(actions, data["action"][:-1, columns])
        for target in mb:
            assert torch.equal(target, targets.advantages[:, columns])
        columns_seen += columns.tolist()
    assert sorted(columns_seen) == list(range(B))


def test_ppo_with_an_lstm_trains_through_monobeast(tmp_path):
    from tests.support.in_process import run_monobeast
    from tests.support.runs import read_csv

    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--use_lstm", "--model", "mlp"]
    argv += ["--num_actors", "2", "--num_envs_per_actor", "2", "--batch_size", "4"]
    argv += ["--unroll_length", "16", "--num_minibatches", "2", "--num_epochs", "2"]
    argv += ["--num_threads", "1", "--total_steps", "1500"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", "lstm"])
    assert result.returncode == 0, result.stderr
    rows = read_csv(tmp_path / "lstm" / "logs.csv")
    assert int(rows[-1]["step"]) >= 1500 and all(math.isfinite(float(r["pg_loss"])) for r in rows)
