"""The DQN family (beast/algos/dqn.py) against references written from the papers.

Every expected value here is computed by a plain loop over the papers' formulas
(Bellemare et al. 2017, algorithm 1; Hessel et al. 2018, eq. 2 with double Q; Schaul et
al. 2016, section 3.4), from a raw step stream this file records itself, never by the
code under test.
"""

import math
import random

import numpy as np
import pytest
import torch
from torch import nn

from beast.algos.distributional import categorical_projection
from beast.algos.dqn import (
    categorical_loss,
    linear_epsilon,
    q_learning_targets,
    q_loss,
)
from beast.algos.nstep import NStepReturns, n_step_returns
from beast.experience.transition_replay import RingAppender, RingReplay, step_spec
from beast.fields import Field, box_obs
from beast.models import polyak_update
from tests.support.references import reference_projection
from tests.support.runs import assert_refused_in_one_line

# 1. C51 projection (Bellemare et al. 2017, algorithm 1).


def project_both(returns, discounts, terminal, probs, v_min, v_max):
    num_atoms = probs.shape[1]
    support = torch.linspace(v_min, v_max, num_atoms)
    got = categorical_projection(
        NStepReturns(returns.float(), discounts.float()), terminal, probs.float(), support
    )
    expected = reference_projection(
        returns.float().tolist(),
        discounts.float().tolist(),
        terminal.tolist(),
        probs.float().tolist(),
        v_min,
        v_max,
    )
    return got, torch.tensor(expected, dtype=torch.float64)


def random_probs(generator, batch, atoms):
    return torch.rand(batch, atoms, generator=generator, dtype=torch.float64).softmax(dim=1)


def test_categorical_projection_matches_algorithm_1_random():
    g = torch.Generator().manual_seed(0)
    batch, atoms, v_min, v_max = 64, 51, -10.0, 10.0
    returns = (torch.rand(batch, generator=g) - 0.5) * 30  # some beyond the support
    k = torch.randint(1, 4, (batch,), generator=g)
    discounts = 0.99 ** k.double()
    terminal = torch.rand(batch, generator=g) < 0.25
    terminal[:3] = True
    probs = random_probs(g, batch, atoms)
    got, expected = project_both(returns, discounts, terminal, probs, v_min, v_max)
    assert got.shape == (batch, atoms)
    torch.testing.assert_close(got.double().sum(dim=1), torch.ones(batch, dtype=torch.float64))
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_categorical_projection_on_atoms_and_beyond_the_support():
    # Support -5 ... 5 (dz = 1); with gamma^k = 1 an integer G lands every atom exactly on
    # an atom, or past the ends where it clamps onto z_1 or z_N.
    g = torch.Generator().manual_seed(1)
    atoms, v_min, v_max = 11, -5.0, 5.0
    returns = torch.tensor([0.0, 2.0, -3.0, 7.0, -12.0, 100.0, -100.0, 3.0, 4.5, 5.0, -5.0, 0.0])
    discounts = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.9, 0.5, 0.5, 1.0, 1.0, 0.0])
    terminal = torch.tensor([False] * 7 + [True, True, True, True, False])
    probs = random_probs(g, len(returns), atoms)
    got, expected = project_both(returns, discounts, terminal, probs, v_min, v_max)
    torch.testing.assert_close(
        got.double().sum(dim=1), torch.ones(len(returns), dtype=torch.float64)
    )
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)
    # Spot checks of the reference itself: G = 0, gamma = 1 is the identity; far beyond
    # the support all mass sits at the end; terminal G = 3 puts it all on atom 8.
    torch.testing.assert_close(got[0].double(), probs[0], atol=1e-6, rtol=0)
    assert abs(float(got[5, -1]) - 1.0) < 1e-6 and abs(float(got[6, 0]) - 1.0) < 1e-6
    assert abs(float(got[7, 8]) - 1.0) < 1e-6
    # Terminal G = 4.5: split evenly between atoms 9 (z = 4) and 10 (z = 5).
    assert abs(float(got[8, 9]) - 0.5) < 1e-6 and abs(float(got[8, 10]) - 0.5) < 1e-6
    # gamma^k = 0, not terminal: all mass at G = 0 (atom 5).
    assert abs(float(got[11, 5]) - 1.0) < 1e-6


def test_categorical_projection_two_atoms_and_fractional_positions():
    g = torch.Generator().manual_seed(2)
    for atoms, v_min, v_max in ((2, -1.0, 1.0), (7, 0.0, 3.0), (21, -2.5, 7.5)):
        batch = 40
        returns = torch.rand(batch, generator=g) * (v_max - v_min) * 1.5 + v_min - 0.25
        discounts = torch.rand(batch, generator=g)
        terminal = torch.rand(batch, generator=g) < 0.3
        probs = random_probs(g, batch, atoms)
        got, expected = project_both(returns, discounts, terminal, probs, v_min, v_max)
        torch.testing.assert_close(got.double().sum(dim=1), torch.ones(batch, dtype=torch.float64))
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


# 2. n-step (double) Q-learning targets from a transition replay.

OBS_SHAPE = (3,)
NUM_ACTIONS = 4


def make_stream(rng: random.Random, length: int, env: int) -> dict[str, np.ndarray]:
    """One env's raw rows, with beast/envs/batch.py's alignment: row t's reward and
    terminated belong to the transition into row t; a terminated row (done too) is the
    next episode's first; a truncated row is the final obs, the next the reset (done,
    reward 0). Occasionally a bare done row (an env recreated mid-episode). obs encodes
    (env, t) so every row can be identified after sampling."""
    rows = {
        "obs": np.zeros((length, *OBS_SHAPE), np.float32),
        "reward": np.zeros(length, np.float32),
        "done": np.zeros(length, bool),
        "terminated": np.zeros(length, bool),
        "truncated": np.zeros(length, bool),
        "last_action": np.zeros(length, np.int64),
        "action": np.zeros(length, np.int64),
    }
    previous_truncated = False
    for t in range(length):
        rows["obs"][t] = (env, t, rng.uniform(-1, 1))
        u = rng.random()
        if t == 0:
            rows["done"][t] = True  # the first reset
        elif previous_truncated:
            rows["done"][t] = True  # the reset after a truncation: reward 0, no flags
        elif u < 0.12:
            rows["done"][t] = rows["terminated"][t] = True
            rows["reward"][t] = rng.uniform(-2, 2)
        elif u < 0.24:
            rows["truncated"][t] = True
            rows["reward"][t] = rng.uniform(-2, 2)
        elif u < 0.27:
            rows["done"][t] = True  # recreated: neither flag
            rows["reward"][t] = rng.uniform(-2, 2)
        else:
            rows["reward"][t] = rng.uniform(-2, 2)
        previous_truncated = bool(rows["truncated"][t])
        rows["action"][t] = rng.randrange(NUM_ACTIONS)
        rows["last_action"][t] = 0 if rows["done"][t] else rows["action"][t - 1]
    return rows


def expected_transition(rows, s: int, n: int):
    """(k, terminal) of the transition out of row s, or None when there is none: a
    truncated row takes no action; a window is cut at a terminated row (terminal, no
    bootstrap) or a truncated row (bootstrap from it), dropped at a bare done row, and
    needs its last row to exist."""
    if rows["truncated"][s]:
        return None
    for i in range(1, n + 1):
        t = s + i
        if t >= len(rows["reward"]):
            return None
        if rows["terminated"][t]:
            return i, True
        if rows["truncated"][t]:
            return i, False
        if rows["done"][t]:
            return None
    return n, False


def reference_target(rows, s, k, terminal, gamma, q_online_next, q_target_next, double):
    """Hessel et al. 2018, eq. 2: y = sum_{i<k} gamma^i r_{s+1+i} + gamma^k
    Q_target(x_{s+k}, a*), a* from the online (double) or the target Q-values; the sum
    alone when terminal. q_*_next: the Q-values at x_{s+k}."""
    ret = 0.0
    for i in range(k):
        ret += gamma**i * float(rows["reward"][s + 1 + i])
    if terminal:
        return ret
    chooser = q_online_next if double else q_target_next
    best = max(range(NUM_ACTIONS), key=lambda a: chooser[a])
    return ret + gamma**k * q_target_next[best]


def build_replay(streams, *, n_step, ring, prioritized=False, alpha=0.6, beta=0.4):
    record = {"action": Field((), torch.int64)}
    spec = step_spec(box_obs(OBS_SHAPE, np.float32), record)
    replay = RingReplay(
        spec,
        num_envs=len(streams),
        capacity=ring * len(streams),
        n_step=n_step,
        prioritized=prioritized,
        alpha=alpha,
        beta=beta,
    )
    appender = RingAppender(replay, 0, len(streams))
    for t in range(len(streams[0]["reward"])):
        appender.append({key: np.stack([rows[key][t] for rows in streams]) for key in spec})
    return replay


def expected_slots(streams, n_step, ring):
    """{slot: (env, s, k, terminal)} for every transition still sampleable: its window
    complete and its start row not yet overwritten in the env's ring."""
    slots = {}
    for env, rows in enumerate(streams):
        length = len(rows["reward"])
        for s in range(max(0, length - ring), length):
            found = expected_transition(rows, s, n_step)
            if found is not None:
                slots[env * ring + s % ring] = (env, s, *found)
    return slots


@pytest.mark.parametrize("n_step, ring, length", [(3, 40, 100), (1, 30, 50), (5, 200, 150)])
def test_n_step_double_q_targets_through_ring_replay(n_step, ring, length):
    rng = random.Random(n_step * 1000 + ring)
    streams = [make_stream(rng, length, env) for env in range(2)]
    replay = build_replay(streams, n_step=n_step, ring=ring)
    assert replay.ring == ring
    expected = expected_slots(streams, n_step, ring)

    # The stream has what this test is about: windows cut by terminations and by
    # truncations, and (n > 1) windows that run their full n steps.
    kinds = {(k == n_step, terminal) for _, _, k, terminal in expected.values()}
    wanted = {(True, False), (True, True)} if n_step == 1 else {(True, False), (False, True)}
    assert wanted | ({(False, False)} if n_step > 1 else set()) <= kinds

    # Exactly the expected slots are sampleable (uniform priority 1), nothing else.
    everything = torch.arange(replay.capacity)
    live = set(torch.nonzero(replay.tree.get(everything) > 0).flatten().tolist())
    assert live == set(expected)

    gamma = 0.9
    q_online = {
        (env, t): [rng.gauss(0, 1) for _ in range(NUM_ACTIONS)]
        for env in range(2)
        for t in range(length)
    }
    q_target = {key: [rng.gauss(0, 1) for _ in range(NUM_ACTIONS)] for key in q_online}

    def table(q, obs):  # Q(x, .) looked up by the row obs identifies
        return torch.tensor([q[int(o[0]), int(o[1])] for o in obs.tolist()])

    generator = torch.Generator().manual_seed(3)
    seen = set()
    batch_size = 512
    assert 2 * len(expected) <= batch_size  # so every batch draws every transition
    for _ in range(3):
        sample = replay.sample(batch_size, generator)
        batch = sample.batch
        returns = n_step_returns(batch["n_step_rewards"], batch["n_steps"], gamma)
        next_target = table(q_target, batch["obs"][1])
        next_online = table(q_online, batch["obs"][1])
        targets = {
            True: q_learning_targets(returns, batch["terminal"], next_target, next_online),
            False: q_learning_targets(returns, batch["terminal"], next_target, None),
        }
        torch.testing.assert_close(sample.weights, torch.ones(batch_size))
        for b, slot in enumerate(sample.indices.tolist()):
            env, s, k, terminal = expected[slot]
            rows = streams[env]
            seen.add(slot)
            assert int(batch["n_steps"][b]) == k and bool(batch["terminal"][b]) == terminal
            # Never from a truncated row, never across an episode end.
            assert not rows["truncated"][s]
            assert not rows["done"][s + 1 : s + k].any()
            assert not rows["truncated"][s + 1 : s + k].any()
            assert rows["done"][s + k] == terminal or rows["truncated"][s + k]
            # The two rows are steps s and s + k of this env.
            np.testing.assert_array_equal(batch["obs"][0, b].numpy(), rows["obs"][s])
            np.testing.assert_array_equal(batch["obs"][1, b].numpy(), rows["obs"][s + k])
            assert int(batch["action"][0, b]) == rows["action"][s]
            window = [float(rows["reward"][s + 1 + i]) if i < k else 0.0 for i in range(n_step)]
            np.testing.assert_allclose(batch["n_step_rewards"][:, b].numpy(), window)
            for double in (True, False):
                want = reference_target(
                    rows, s, k, terminal, gamma, q_online[env, s + k], q_target[env, s + k], double
                )
                got = float(targets[double][b])
                assert abs(got - want) < 1e-5, (env, s, k, terminal, double, got, want)
    # Stratified draws over equal masses of at least 2 / batch_size reach each one.
    assert seen == set(expected)


# 3. Importance weights (Schaul et al. 2016, section 3.4).


@pytest.mark.parametrize("alpha, beta", [(0.6, 0.4), (0.5, 1.0), (1.0, 0.0)])
def test_prioritized_probabilities_and_importance_weights(alpha, beta):
    rng = random.Random(7)
    streams = [make_stream(rng, 60, env) for env in range(2)]
    replay = build_replay(streams, n_step=3, ring=64, prioritized=True, alpha=alpha, beta=beta)
    slots = sorted(expected_slots(streams, 3, 64))
    indices = torch.tensor(slots)
    priorities = torch.tensor([rng.uniform(0.05, 5.0) for _ in slots], dtype=torch.float64)
    assert replay.update_priorities(indices, priorities, replay.tree.generations(indices)) == len(
        slots
    )
    scaled = {i: float(p) ** alpha for i, p in zip(slots, priorities.tolist(), strict=True)}
    total = sum(scaled.values())
    prob = {i: v / total for i, v in scaled.items()}
    count = len(slots)

    generator = torch.Generator().manual_seed(11)
    for _ in range(5):
        sample = replay.sample(32, generator)
        drawn = sample.indices.tolist()
        assert set(drawn) <= set(slots)
        want_p = [prob[i] for i in drawn]
        np.testing.assert_allclose(sample.probabilities.numpy(), want_p, rtol=1e-9)
        raw = [(count * p) ** -beta for p in want_p]
        want_w = [w / max(raw) for w in raw]
        np.testing.assert_allclose(sample.weights.numpy(), want_w, rtol=1e-5)
        assert abs(float(sample.weights.max()) - 1.0) < 1e-6
    # A per-call beta overrides the replay's.
    sample = replay.sample(32, generator, beta=0.7)
    raw = [(count * prob[i]) ** -0.7 for i in sample.indices.tolist()]
    np.testing.assert_allclose(sample.weights.numpy(), [w / max(raw) for w in raw], rtol=1e-5)


# 4. Small pure functions.


def test_polyak_update_moves_tau_of_the_way_and_tau_1_copies():
    torch.manual_seed(0)
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    tau = 0.3
    polyak_update(target, online, tau)
    for key, value in target.state_dict().items():
        want = tau * online.state_dict()[key] + (1 - tau) * before[key]
        torch.testing.assert_close(value, want, atol=1e-6, rtol=0)
    # The online network is untouched, and tau = 1 copies it.
    polyak_update(target, online, 1.0)
    for key, value in target.state_dict().items():
        assert torch.equal(value, online.state_dict()[key])
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="tau"):
            polyak_update(target, online, bad)


def test_linear_epsilon():
    assert linear_epsilon(0, 1.0, 0.05, 1000) == pytest.approx(1.0)
    assert linear_epsilon(250, 1.0, 0.05, 1000) == pytest.approx(1.0 - 0.25 * 0.95)
    assert linear_epsilon(500, 1.0, 0.05, 1000) == pytest.approx(0.525)
    assert linear_epsilon(1000, 1.0, 0.05, 1000) == pytest.approx(0.05)
    assert linear_epsilon(10**9, 1.0, 0.05, 1000) == pytest.approx(0.05)
    assert linear_epsilon(-5, 1.0, 0.05, 1000) == pytest.approx(1.0)
    assert linear_epsilon(123, 1.0, 0.05, 0) == pytest.approx(0.05)
    assert linear_epsilon(50, 0.2, 0.6, 100) == pytest.approx(0.4)  # rising works too


def test_q_loss_huber_and_mse_on_hand_cases():
    q = torch.tensor([0.0, 0.0, 1.0, 0.0, 2.0], requires_grad=True)
    y = torch.tensor([0.5, -2.0, 4.0, 0.0, 1.25])
    w = torch.tensor([1.0, 1.0, 0.5, 0.0, 2.0])
    # d = y - q = [0.5, -2, 3, 0, -0.75]
    huber = [0.125, 1.5, 2.5, 0.0, 0.28125]  # 0.5 d^2 if |d| < 1 else |d| - 0.5
    mse = [0.125, 2.0, 4.5, 0.0, 0.28125]  # 0.5 d^2
    for name, per_sample in (("huber", huber), ("mse", mse)):
        out = q_loss(q, y, w, loss=name)
        want = sum(wi * li for wi, li in zip(w.tolist(), per_sample, strict=True)) / 5
        assert out.total_loss.item() == pytest.approx(want, abs=1e-6)
        np.testing.assert_allclose(out.priorities.numpy(), [0.5, 2.0, 3.0, 0.0, 0.75], atol=1e-6)
        assert not out.priorities.requires_grad
        (grad,) = torch.autograd.grad(out.total_loss, q)
        d = [0.5, -2.0, 3.0, 0.0, -0.75]
        dl = [max(-1.0, min(1.0, x)) for x in d] if name == "huber" else d
        want_grad = [-wi * di / 5 for wi, di in zip(w.tolist(), dl, strict=True)]
        np.testing.assert_allclose(grad.numpy(), want_grad, atol=1e-6)
    with pytest.raises(ValueError, match="loss"):
        q_loss(q, y, w, loss="l1")


def test_categorical_loss_is_weighted_cross_entropy():
    g = torch.Generator().manual_seed(5)
    batch, atoms = 6, 9
    logits = torch.randn(batch, atoms, generator=g, requires_grad=True)
    target = torch.rand(batch, atoms, generator=g).softmax(dim=1)
    weights = torch.rand(batch, generator=g)
    support = torch.linspace(-2.0, 2.0, atoms)
    out = categorical_loss(logits, target, weights, support)
    entropies = []
    for row, m in zip(logits.tolist(), target.tolist(), strict=True):
        top = max(row)
        log_z = top + math.log(sum(math.exp(x - top) for x in row))
        entropies.append(-sum(mj * (x - log_z) for mj, x in zip(m, row, strict=True)))
    want = sum(w * h for w, h in zip(weights.tolist(), entropies, strict=True)) / batch
    assert out.total_loss.item() == pytest.approx(want, abs=1e-5)
    np.testing.assert_allclose(out.priorities.numpy(), entropies, atol=1e-5)
    # Its gradient w.r.t. the logits is w (softmax - m) / B.
    (grad,) = torch.autograd.grad(out.total_loss, logits)
    want_grad = weights.unsqueeze(1) * (logits.detach().softmax(dim=1) - target) / batch
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=0)


# 5. Bad input: one line, exit 2.


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--algo", "c51", "--env", "CartPole-v1", "--v_min", "5", "--v_max", "5"], "--v_min"),
        (["--algo", "dqn", "--env", "Pendulum-v1"], "Discrete"),
        (
            ["--algo", "dqn", "--env", "CartPole-v1", "--replay_size", "100000000000"],
            "--replay_size",
        ),
    ],
    ids=["c51-empty-support", "dqn-box-actions", "dqn-replay-too-large"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, [*argv, "--total_steps", "100"], fragment)
