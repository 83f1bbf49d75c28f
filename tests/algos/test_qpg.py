"""DDPG, TD3 and SAC (beast/algos/qpg) against references written from the papers.

Expected values come from plain per-element loops over the papers' formulas (Haarnoja et
al. 2018, "Soft Actor-Critic Algorithms and Applications", eq. 3, 7, 18 and appendix C;
Fujimoto et al. 2018, eq. 15 and algorithm 1; Lillicrap et al. 2016, section 7), in
float64 with `math`, never by the code under test. Then the update's mechanics (one
backward pass over several optimizers, the frozen critics of the actor's loss, the
delayed actor, the checkpointed state), the acting rule, and bad input.
"""

import math
import random

import numpy as np
import pytest
import torch
from torch import nn

from beast.algos.base import LearnerContext
from beast.algos.build import build_algorithm
from beast.algos.nstep import NStepReturns
from beast.algos.policies import SquashedPolicy
from beast.algos.qpg.functions import (
    critic_loss,
    from_unit_actions,
    sample_tanh_gaussian,
    smoothed_target_actions,
    soft_q_targets,
    tanh_gaussian_log_prob,
    td3_targets,
    temperature_loss,
    to_unit_actions,
)
from beast.algos.qpg.networks import ActorCriticQNet, EnsembleMLP
from beast.envs import EnvSpec
from beast.experience.contract import Batch
from beast.learning.learner import Stepper, TrainingProgress
from beast.models import PolyakAverager
from beast.run.parsing import parse_args
from tests.support.in_process import run_monobeast
from tests.support.references import reference_tanh_gaussian_log_prob
from tests.support.runs import assert_refused_in_one_line

# 1. The numerics, against per-element loops.


def test_tanh_gaussian_log_prob_matches_a_per_element_loop():
    rng = random.Random(0)
    B, d = 16, 3
    u = [[rng.uniform(-3, 3) for _ in range(d)] for _ in range(B)]
    mean = [[rng.uniform(-1, 1) for _ in range(d)] for _ in range(B)]
    log_std = [[rng.uniform(-2, 0.5) for _ in range(d)] for _ in range(B)]
    got = tanh_gaussian_log_prob(
        torch.tensor(u, dtype=torch.float64),
        torch.tensor(mean, dtype=torch.float64),
        torch.tensor(log_std, dtype=torch.float64),
    )
    want = [reference_tanh_gaussian_log_prob(*row) for row in zip(u, mean, log_std, strict=True)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_tanh_gaussian_log_prob_stays_finite_where_tanh_saturates():
    # tanh(20) rounds to 1 in float32: 1 - tanh^2 is 0 there, the stable form is not.
    u = torch.tensor([[20.0], [-20.0]])
    got = tanh_gaussian_log_prob(u, torch.zeros(2, 1), torch.zeros(2, 1))
    assert torch.isfinite(got).all()
    # log(1 - tanh(u)^2) ~ log 4 - 2|u| for large |u|.
    want = -0.5 * 400 - 0.5 * math.log(2 * math.pi) - (math.log(4.0) - 40.0)
    np.testing.assert_allclose(got.numpy(), [want, want], rtol=1e-5)


def test_sample_tanh_gaussian_is_the_squashed_draw_and_its_log_prob():
    mean, log_std = torch.tensor([[0.3, -0.2]]), torch.tensor([[-0.5, 0.1]])
    noise = torch.tensor([[1.5, -0.7]])
    action, log_prob = sample_tanh_gaussian(mean, log_std, noise)
    u = [0.3 + math.exp(-0.5) * 1.5, -0.2 + math.exp(0.1) * -0.7]
    np.testing.assert_allclose(action.numpy()[0], [math.tanh(x) for x in u], rtol=1e-6)
    want = reference_tanh_gaussian_log_prob(u, [0.3, -0.2], [-0.5, 0.1])
    assert float(log_prob[0]) == pytest.approx(want, rel=1e-5)


def _random_returns(rng, B, n, gamma):
    """Windows of k <= n rewards, their G and gamma^k by loops."""
    rewards = [[rng.uniform(-2, 2) for _ in range(B)] for _ in range(n)]
    n_steps = [rng.randint(1, n) for _ in range(B)]
    terminal = [rng.random() < 0.3 for _ in range(B)]
    G = [sum(gamma**i * rewards[i][b] for i in range(n_steps[b])) for b in range(B)]
    discounts = [gamma ** n_steps[b] for b in range(B)]
    returns = NStepReturns(torch.tensor(G), torch.tensor(discounts))
    return returns, G, discounts, terminal


def test_sac_soft_target_uses_the_min_of_twin_critics_and_the_entropy_term():
    rng = random.Random(1)
    B, n, gamma, alpha = 12, 3, 0.97, 0.2
    returns, G, discounts, terminal = _random_returns(rng, B, n, gamma)
    q1 = [rng.uniform(-5, 5) for _ in range(B)]
    q2 = [rng.uniform(-5, 5) for _ in range(B)]
    log_p = [rng.uniform(-3, 1) for _ in range(B)]
    got = soft_q_targets(
        returns,
        torch.tensor(terminal),
        torch.tensor([q1, q2]),
        torch.tensor(log_p),
        alpha,
    )
    want = [
        G[b] + (0.0 if terminal[b] else discounts[b] * (min(q1[b], q2[b]) - alpha * log_p[b]))
        for b in range(B)
    ]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_td3_target_smooths_clips_and_takes_the_min():
    rng = random.Random(2)
    B, d, gamma, sigma, c = 10, 2, 0.99, 0.2, 0.5
    returns, G, discounts, terminal = _random_returns(rng, B, 1, gamma)
    mu = [[rng.uniform(-1, 1) for _ in range(d)] for _ in range(B)]
    eps = [[rng.gauss(0, 3) for _ in range(d)] for _ in range(B)]  # wide: clips happen
    smoothed = smoothed_target_actions(torch.tensor(mu), torch.tensor(eps), sigma, c)
    want_actions = [
        [min(1.0, max(-1.0, mu[b][i] + min(c, max(-c, sigma * eps[b][i])))) for i in range(d)]
        for b in range(B)
    ]
    np.testing.assert_allclose(smoothed.numpy(), want_actions, rtol=1e-6, atol=1e-6)

    # Two known critics of the smoothed action: Q_1(a) = sum a, Q_2(a) = 1 - sum a^2.
    def q1(a):
        return sum(a)

    def q2(a):
        return 1.0 - sum(x * x for x in a)

    next_q = torch.tensor(
        [[q1(a) for a in want_actions], [q2(a) for a in want_actions]], dtype=torch.float32
    )
    got = td3_targets(returns, torch.tensor(terminal), next_q)
    want = [
        G[b] + (0.0 if terminal[b] else discounts[b] * min(q1(a), q2(a)))
        for b, a in enumerate(want_actions)
    ]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_critic_loss_is_half_the_summed_mean_squared_errors():
    q = torch.tensor([[1.0, 2.0, 3.0], [0.0, 2.5, 5.0]])
    y = torch.tensor([1.5, 2.0, 4.0])
    want = 0.5 * ((0.25 + 0 + 1) / 3 + (2.25 + 0.25 + 1) / 3)
    assert float(critic_loss(q, y)) == pytest.approx(want)
    weights = torch.tensor([2.0, 1.0, 0.0])
    want = 0.5 * ((2 * 0.25 + 0 + 0) / 3 + (2 * 2.25 + 0.25 + 0) / 3)
    assert float(critic_loss(q, y, weights)) == pytest.approx(want)


@pytest.mark.parametrize("entropy_gap", [-0.7, 0.9])
def test_temperature_gradient_raises_alpha_when_entropy_is_below_target(entropy_gap):
    """d/d(log alpha) = -(mean log pi + H~): negative (descent raises alpha) when the
    entropy -mean log pi is below the target H~, positive when above."""
    target_entropy = -2.0
    entropy = target_entropy + entropy_gap
    log_probs = torch.full((8,), -entropy)
    log_alpha = torch.tensor(0.3, requires_grad=True)
    temperature_loss(log_alpha, log_probs, target_entropy).backward()
    want = -(-entropy + target_entropy)  # = entropy_gap
    assert float(log_alpha.grad) == pytest.approx(want)
    if entropy_gap < 0:
        assert log_alpha.grad < 0  # a gradient step raises alpha
    else:
        assert log_alpha.grad > 0


def test_polyak_averager_moves_tau_of_the_way_and_copies_counters():
    torch.manual_seed(0)
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    online.register_buffer("count", torch.tensor(7))
    target.register_buffer("count", torch.tensor(0))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    averager = PolyakAverager(target, online)
    tau = 0.005
    averager(tau)
    for key in ("weight", "bias"):
        mine, theirs = online.state_dict()[key].double(), before[key].double()
        want = [
            tau * a + (1 - tau) * b for a, b in zip(mine.flatten(), theirs.flatten(), strict=True)
        ]
        np.testing.assert_allclose(
            target.state_dict()[key].flatten().double().numpy(), want, rtol=1e-6
        )
    assert int(target.count) == 7
    averager(1.0)
    torch.testing.assert_close(target.weight, online.weight)


def test_unit_actions_round_trip_to_the_bounds():
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 10.0])
    unit = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5]])
    env = from_unit_actions(unit, low, high)
    torch.testing.assert_close(env, torch.tensor([[-2.0, 0.0], [2.0, 10.0], [0.0, 7.5]]))
    torch.testing.assert_close(to_unit_actions(env, low, high), unit)


# 2. The network and the acting rule.


def test_ensemble_mlp_members_are_independent_mlps():
    torch.manual_seed(0)
    ensemble = EnsembleMLP(2, [5, 8, 1])
    x = torch.randn(4, 5)
    out = ensemble(x)
    for member in range(2):
        w0, b0 = ensemble.weights[0][member], ensemble.biases[0][member]
        w1, b1 = ensemble.weights[1][member], ensemble.biases[1][member]
        want = torch.relu(x @ w0 + b0) @ w1 + b1
        torch.testing.assert_close(out[member], want)


def _outputs(mean, log_std=None, epsilon=None):
    out = {"action_mean": torch.tensor(mean).unsqueeze(0)}
    if log_std is not None:
        out["action_log_std"] = torch.tensor(log_std).unsqueeze(0)
    if epsilon is not None:
        out["epsilon"] = torch.tensor(epsilon).unsqueeze(0)
    return out


def test_squashed_policy_acts_in_the_bounds_and_deterministically_in_test_mode():
    low, high = (-2.0, 0.0), (2.0, 4.0)
    mean = [[0.5, -1.0], [3.0, 0.0]]
    test = SquashedPolicy(low, high, stochastic=True, explore=False)
    actions = np.zeros((2, 2), dtype=np.float32)
    test.bind({"action": actions}, {})(_outputs(mean, [[0.0, 0.0]] * 2))
    want = [
        [low[i] + (math.tanh(m) + 1) * (high[i] - low[i]) / 2 for i, m in enumerate(row)]
        for row in mean
    ]
    np.testing.assert_allclose(actions, want, rtol=1e-6)
    torch.manual_seed(0)
    for stochastic in (True, False):
        policy = SquashedPolicy(low, high, stochastic=stochastic, noise=5.0, scheduled=True)
        act = policy.bind({"action": actions}, {})
        draws = []
        for epsilon in ([0.0, 0.0], [1.0, 1.0]):
            for _ in range(200):
                act(_outputs(mean, [[1.0, 1.0]] * 2, epsilon))
                draws.append(actions.copy())
        draws = np.array(draws)
        assert (draws >= np.array(low) - 1e-6).all() and (draws <= np.array(high) + 1e-6).all()
        assert draws.std(axis=0).min() > 0.1  # it explores
    # epsilon 1: uniform over the box (the warm-up), whatever the actor says.
    uniform = draws[200:]
    np.testing.assert_allclose(uniform.mean(axis=0), [[0.0, 2.0]] * 2, atol=0.35)


# 3. The update.

PENDULUM = EnvSpec(
    obs_shape=(3,),
    obs_dtype=np.dtype(np.float32),
    num_actions=0,
    action_shape=(1,),
    action_low=(-2.0,),
    action_high=(2.0,),
)


def _update(algo: str, *flags: str):
    config = parse_args(
        ["--algo", algo, "--env", "Pendulum-v1", "--net_arch", "16,16", "--batch_size", "8"]
        + list(flags)
    )
    algorithm = build_algorithm(config, PENDULUM)
    model = algorithm.build_model()
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=0.0,
        max_nonfinite_updates=10,
        lr_schedule="constant",
        total_steps=1000,
        progress=progress,
    )
    context = LearnerContext(
        device=torch.device("cpu"), bf16=False, step=stepper, progress=progress
    )
    return model, algorithm.learner(model, context)


def _batch(B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(2, B, 3, generator=g),
        "reward": torch.randn(2, B, generator=g),
        "done": torch.zeros(2, B, dtype=torch.bool),
        "last_action": torch.zeros(2, B, 1),
        "action": torch.rand(2, B, 1, generator=g) * 4 - 2,
        "n_step_rewards": torch.randn(1, B, generator=g),
        "n_steps": torch.ones(B, dtype=torch.int64),
        "terminal": torch.zeros(B, dtype=torch.bool),
    }
    return Batch(data=data, weights=torch.ones(B))


def _snapshot(module):
    return [p.detach().clone() for p in module.parameters()]


def _changed(before, module):
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_frozen_critics_pass_gradients_to_the_actions_only():
    _, update = _update("sac")
    inputs = {"obs": torch.randn(1, 8, 3)}
    actions = torch.zeros(8, 1, requires_grad=True)
    update.critic_values(inputs, actions, frozen=True).sum().backward()
    assert actions.grad is not None and actions.grad.abs().sum() > 0
    assert all(p.grad is None for p in update.critic_params)
    assert all(p.requires_grad for p in update.critic_params)  # restored


def test_sac_update_trains_critics_actor_and_temperature_and_ends_the_warm_up():
    model, update = _update("sac")
    assert float(update.schedule.epsilon) == 1.0  # random actions until the first update
    critic, actor = _snapshot(update.net.critic), _snapshot(update.net.actor)
    alpha = float(update.log_alpha.detach())
    target_before = _snapshot(update.target.critic)
    info = update(_batch())
    assert _changed(critic, update.net.critic) and _changed(actor, update.net.actor)
    assert float(update.log_alpha.detach()) != alpha
    assert _changed(target_before, update.target.critic)
    assert float(update.schedule.epsilon) == 0.0
    assert {"critic_loss", "actor_loss", "alpha", "entropy"} <= set(info.stats)


def test_the_learner_normalises_observations_as_the_actors_do():
    model, update = _update("sac", "--normalize_obs")
    # Statistics far from the batch's, one per dimension: a shift, a scale that clips
    # (std 0.1 against unit-scale observations) and none.
    mean, var = [5.0, 0.0, 0.0], [4.0, 0.01, 1.0]
    model.obs_rms.mean.copy_(torch.tensor(mean, dtype=torch.float64))
    model.obs_rms.var.copy_(torch.tensor(var, dtype=torch.float64))
    seen = {}
    forward = update.net.forward

    def spy(inputs, core_state=()):
        seen["obs"] = inputs["obs"]
        return forward(inputs, core_state)

    update.net.forward = spy
    batch = _batch()
    update(batch)
    # By hand: VecNormalize's clip((obs - mean) / sqrt(var + 1e-8), -10, 10), in float64.
    obs = batch.data["obs"][:1].double().numpy()
    expected = np.clip((obs - np.array(mean)) / np.sqrt(np.array(var) + 1e-8), -10.0, 10.0)
    assert (np.abs(expected[..., 1]) == 10.0).any()  # the clip is exercised
    # Tolerance: float32 rounding of values up to 10.
    np.testing.assert_allclose(seen["obs"].numpy(), expected, rtol=1e-6, atol=1e-6)


def test_sac_with_a_fixed_temperature_keeps_it():
    _, update = _update("sac", "--ent_coef", "0.1")
    update(_batch())
    assert float(update.log_alpha.exp()) == pytest.approx(0.1)
    assert update.alpha_optimizer is None


def test_td3_trains_the_actor_and_the_targets_every_policy_delay_updates():
    _, update = _update("td3", "--policy_delay", "2")
    actor, target = _snapshot(update.net.actor), _snapshot(update.target)
    update(_batch(seed=1))
    assert not _changed(actor, update.net.actor) and not _changed(target, update.target)
    update(_batch(seed=2))
    assert _changed(actor, update.net.actor) and _changed(target, update.target)


def test_ddpg_has_one_critic_and_trains_the_actor_every_update():
    _, update = _update("ddpg")
    assert update.net.critic.net.num_members == 1
    actor = _snapshot(update.net.actor)
    update(_batch())
    assert _changed(actor, update.net.actor)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_update_state_round_trips(algo):
    _, update = _update(algo)
    for seed in range(3):
        update(_batch(seed=seed))
    state = update.state_dict()
    _, fresh = _update(algo)
    fresh.load_state_dict(state)
    assert fresh.num_updates == update.num_updates == 3
    for a, b in zip(fresh.target.parameters(), update.target.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert fresh.critic_optimizer.state_dict()["state"].keys() == (
        update.critic_optimizer.state_dict()["state"].keys()
    )
    if algo == "sac":
        assert torch.equal(fresh.log_alpha.detach(), update.log_alpha.detach())
        assert fresh.alpha_optimizer.state_dict()["state"][0]["step"] == 3


def test_the_built_in_network_returns_the_contract():
    net = ActorCriticQNet((3,), 2, hidden_sizes=(8, 8), num_critics=2, stochastic=True)
    outputs, state = net({"obs": torch.zeros(4, 5, 3)}, ())
    assert outputs["action_mean"].shape == (4, 5, 2) == outputs["action_log_std"].shape
    assert net.critic({"obs": torch.zeros(4, 5, 3)}, torch.zeros(4, 5, 2)).shape == (2, 4, 5)


# 4. The update-to-data ratio, held in a real run.


def test_utd_ratio_holds_through_a_run(tmp_path):
    """Two actors of two envs against one learner: updates = utd x the steps after
    learning_starts, within the rate limit's slack (the learner at most a batch and an
    actor write ahead, the actors at most two batches' worth)."""
    utd, batch, starts, total = 2.0, 16, 100, 1200
    argv = ["--algo", "sac", "--env", "Pendulum-v1", "--num_actors", "2"]
    argv += ["--num_envs_per_actor", "2", "--batch_size", str(batch), "--net_arch", "16,16"]
    argv += ["--utd_ratio", str(utd), "--learning_starts", str(starts), "--num_threads", "1"]
    argv += ["--total_steps", str(total), "--savedir", str(tmp_path), "--xpid", "utd"]
    result = run_monobeast(argv)
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(tmp_path / "utd" / "model.tar", weights_only=True)
    steps, updates = checkpoint["step"], checkpoint["progress"]["num_updates"]
    expected = utd * (steps - starts)
    slack = 2 * 2 + 4  # updates: the learner's batch and write, the actors' two batches
    assert expected - slack <= updates <= expected + slack, (steps, updates)


# 5. Bad input: one line, exit 2.


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--algo", "sac", "--env", "CartPole-v1"], "continuous (Box) action space"),
        (["--algo", "sac", "--env", "Pendulum-v1", "--utd_ratio", "0"], "--utd_ratio"),
        (
            ["--algo", "td3", "--env", "tests.envs.test_envs:InfiniteBoxActionEnv"],
            "infinite bounds",
        ),
        (["--algo", "ddpg", "--env", "Pendulum-v1", "--net_arch", "a,b"], "--net_arch"),
        (["--algo", "sac", "--env", "Pendulum-v1", "--ent_coef", "high"], "--ent_coef"),
    ],
    ids=["sac-discrete", "utd-0", "infinite-bounds", "bad-net-arch", "bad-ent-coef"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, [*argv, "--total_steps", "100"], fragment)
