"""LASER: the trust-region loss (beast.algos.laser) against IMPALA and hand-worked
cases, the learner's mix of fresh and replayed rollouts, its flags, and an end-to-end
monobeast run with a replay."""

from __future__ import annotations

import csv
import functools
import math
import os

import pytest
import torch

from beast import envs
from beast.algos import impala, laser
from beast.algos.base import LearnerContext
from beast.algos.build import config_for
from beast.algos.distributions import Categorical
from beast.algos.impala import ActorCriticUpdate, Impala
from beast.algos.laser import Laser
from beast.algos.policies import CategoricalPolicy
from beast.config import CONFIGS_DIR, ConfigError, load_config_file
from beast.experience.rollout_replay import RolloutReplay
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.experience.rollout_source import RolloutSource
from beast.fields import box_obs, core_state, core_state_shapes
from beast.learning.learner import Learner, Stepper, TrainingProgress
from beast.models import build_model
from beast.run.parsing import parse_args
from tests.support.in_process import run_monobeast

LOSS_KWARGS = {
    "discounting": 0.9,
    "reward_clipping": "abs_one",
    "baseline_cost": 0.5,
    "entropy_cost": 0.01,
}
IMPALA_STATS = (
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "mean_rho",
    "rho_clipped_fraction",
    "mean_entropy",
)


def make_batch(num_steps, batch_size, num_actions=4, seed=0, spread=1.0):
    """Random learner outputs (leaves requiring grad) and a batch of T+1 steps whose
    behaviour logits differ from the target's by `spread` standard deviations."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_steps + 1, batch_size)
    target = torch.randn(*shape, num_actions, generator=g)
    learner_outputs = {
        "policy_logits": target.clone().requires_grad_(True),
        "baseline": torch.randn(*shape, generator=g).requires_grad_(True),
    }
    terminated = torch.rand(*shape, generator=g) < 0.2
    batch = {
        "reward": torch.randn(*shape, generator=g),
        "done": terminated,
        "terminated": terminated,
        "truncated": torch.zeros(shape, dtype=torch.bool),
        "action": torch.randint(0, num_actions, shape, generator=g),
        "policy_logits": target + spread * torch.randn(*shape, num_actions, generator=g),
    }
    return learner_outputs, batch


def probs_to_logits(*rows):
    """[T, 1, A] logits whose softmax is the given probabilities (log p; softmax is
    invariant to the missing constant)."""
    return torch.tensor([[[math.log(p) for p in row]] for row in rows])


# --- the loss, trust region off: IMPALA exactly ----------------------------------------


@pytest.mark.parametrize("threshold", [None, 0.0])
def test_trust_region_off_is_impala_exactly(threshold):
    # Acceptance: with the trust region off (and so with --replay_ratio 0 and no
    # threshold, where the learner's batches are IMPALA's), the loss for a given batch
    # is IMPALA's: the same operations, so bit for bit.
    outputs_a, batch = make_batch(6, 5, seed=1)
    outputs_b = {k: v.detach().clone().requires_grad_(True) for k, v in outputs_a.items()}
    expected = impala.impala_loss(outputs_a, batch, **LOSS_KWARGS)
    got = laser.laser_loss(outputs_b, batch, trust_region_threshold=threshold, **LOSS_KWARGS)
    assert torch.equal(got.total_loss, expected.total_loss)
    for key in IMPALA_STATS:
        assert torch.equal(got.stats[key], expected.stats[key]), key
    assert got.stats["masked_fraction"] == 0.0
    expected.total_loss.backward()
    got.total_loss.backward()
    for key in outputs_a:
        assert torch.equal(outputs_b[key].grad, outputs_a[key].grad), key


def test_a_threshold_no_step_exceeds_is_impala():
    outputs, batch = make_batch(6, 5, seed=2)
    expected = impala.impala_loss(outputs, batch, **LOSS_KWARGS)
    got = laser.laser_loss(outputs, batch, trust_region_threshold=1e6, **LOSS_KWARGS)
    assert got.stats["masked_fraction"] == 0.0
    # Tolerance: the same float32 terms, masked by 1.0 (exact in practice).
    torch.testing.assert_close(got.total_loss, expected.total_loss, rtol=1e-6, atol=1e-6)


# --- the KL and the mask by hand -----------------------------------------------------------


# pi and mu per step, and KL(pi || pi~) worked out with pi~ = min(rho_bar mu, pi) / Z:
#   step 0: pi (.5, .5), mu (.9, .1): min (.5, .1), Z .6, pi~ (5/6, 1/6),
#           KL = .5 ln(.5 * 6/5) + .5 ln(.5 * 6) = .5 ln 1.8
#   step 1: mu = pi: pi~ = pi, KL = 0
#   step 2: pi (.9, .1), mu (.5, .5): min (.5, .1), pi~ (5/6, 1/6),
#           KL = .9 ln(.9 * 6/5) + .1 ln(.1 * 6) = .9 ln 1.08 + .1 ln .6
# Step 2 is far from its behaviour in the naive direction, KL(mu || pi) = .5 ln(5/9) +
# .5 ln 5 = 0.51, but V-trace's implied policy stays close to pi there: the paper's KL
# is small. Step 0 is the reverse.
def logits(policy_logits):
    """A softmax policy's parameters, as the losses take them."""
    return {"policy_logits": policy_logits}


def entropy(policy_logits):
    num_actions = policy_logits.shape[-1]
    return Categorical(num_actions).entropy(logits(policy_logits))


TARGET = probs_to_logits((0.5, 0.5), (0.3, 0.7), (0.9, 0.1))
BEHAVIOUR = probs_to_logits((0.9, 0.1), (0.3, 0.7), (0.5, 0.5))
KL_BY_HAND = [0.5 * math.log(1.8), 0.0, 0.9 * math.log(1.08) + 0.1 * math.log(0.6)]


def test_kl_matches_the_hand_worked_example():
    kl = laser.trust_region_kl(logits(BEHAVIOUR), logits(TARGET), clip_rho_threshold=1.0)
    assert kl.shape == (3, 1)
    # Tolerance: float32 log-softmax and logsumexp of O(1) numbers.
    torch.testing.assert_close(kl[:, 0], torch.tensor(KL_BY_HAND), rtol=1e-5, atol=1e-6)


def test_kl_with_a_larger_rho_bar_by_hand():
    # rho_bar 2, step 0: min(2 mu, pi) = min((1.8, .2), (.5, .5)) = (.5, .2), Z .7,
    # pi~ (5/7, 2/7), KL = .5 ln(.5 * 7/5) + .5 ln(.5 * 7/2) = .5 ln 1.225.
    kl = laser.trust_region_kl(logits(BEHAVIOUR[:1]), logits(TARGET[:1]), clip_rho_threshold=2.0)
    # Tolerance: as above.
    assert kl.item() == pytest.approx(0.5 * math.log(1.225), rel=1e-5)
    # Without clipping V-trace is plain importance sampling: pi~ = pi, nothing rejected.
    assert torch.all(
        laser.trust_region_kl(logits(BEHAVIOUR), logits(TARGET), clip_rho_threshold=None) == 0
    )


@pytest.mark.parametrize(
    "threshold, kept",
    [
        (0.1, [False, True, True]),  # only step 0 (0.294) exceeds 0.1
        (0.01, [False, True, False]),  # step 2 (0.018) too
        (0.3, [True, True, True]),
        (None, None),
        (0.0, None),
    ],
)
def test_mask_against_the_hand_worked_example(threshold, kept):
    kl = torch.tensor(KL_BY_HAND).unsqueeze(1)
    mask = laser.trust_region_mask(kl, threshold)
    if kept is None:
        assert mask is None
    else:
        assert mask[:, 0].tolist() == kept
    assert laser.trust_region_mask(torch.tensor([[math.nan]]), 0.1).tolist() == [[False]]


def test_a_rejected_step_is_dropped_and_cuts_the_trace_by_hand():
    # T=3, B=1, gamma .9, no episode end, rewards r = 1, 2, 3, values V = .5, -1, 4 and
    # bootstrap 10. pi = (.5, .5) everywhere; mu = pi except at step 1, where mu =
    # (.9, .1): KL .294 > .1, so step 1 is rejected and steps 0 and 2 are on-policy
    # (rho = c = 1). By hand (paper eq. 8, lambda(x_1) = 0):
    #   v_2 = r_2 + g V_3 = 3 + 9 = 12         (plain V-trace)
    #   v_1 = V_1 = -1                         (rejected: no TD error of its own)
    #   v_0 = r_0 + g V_1 = 1 - .9 = .1        (the trace stops at x_1: bootstrap V(x_1))
    #   A_0 = r_0 + g v_1 - V_0 = 1 - .9 - .5 = -.4, A_2 = r_2 + g V_3 - V_2 = 8
    #   baseline = cost * .5 * ((.1 - .5)^2 + (12 - 4)^2) = .5 * .5 * 64.16 = 16.04
    #   pg = -(ln .5 * -.4 + ln .5 * 8) = 7.6 ln 2          (actions are equally likely)
    target = probs_to_logits((0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5))
    outputs = {
        "policy_logits": target.clone().requires_grad_(True),
        "baseline": torch.tensor([[0.5], [-1.0], [4.0], [10.0]], requires_grad=True),
    }
    behaviour = target.clone()
    behaviour[1] = probs_to_logits((0.9, 0.1))[0]
    batch = {
        "reward": torch.tensor([[0.0], [1.0], [2.0], [3.0]]),
        "done": torch.zeros(4, 1, dtype=torch.bool),
        "terminated": torch.zeros(4, 1, dtype=torch.bool),
        "truncated": torch.zeros(4, 1, dtype=torch.bool),
        "action": torch.tensor([[1], [0], [1], [0]]),
        "policy_logits": behaviour,
    }
    kwargs = {**LOSS_KWARGS, "reward_clipping": "none", "entropy_cost": 0.0}
    out = laser.laser_loss(outputs, batch, trust_region_threshold=0.1, **kwargs)
    # Tolerance: float32 arithmetic on O(10) numbers.
    assert out.stats["baseline_loss"].item() == pytest.approx(16.04, rel=1e-6)
    assert out.stats["pg_loss"].item() == pytest.approx(7.6 * math.log(2), rel=1e-6)
    assert out.stats["masked_fraction"].item() == pytest.approx(1 / 3)
    assert out.stats["mean_kl"].item() == pytest.approx(0.5 * math.log(1.8) / 3, rel=1e-5)
    # Without the trust region step 1 counts, with rho = .5/.9: a different loss.
    off = laser.laser_loss(outputs, batch, trust_region_threshold=None, **kwargs)
    assert off.stats["baseline_loss"].item() != pytest.approx(16.04, rel=1e-3)


def test_masked_steps_get_no_policy_gradient():
    # Half the steps above the threshold (the median KL). With the entropy cost at 0
    # the logits' gradient is the policy-gradient term's alone: exactly 0 at rejected
    # steps, and not at kept ones. The baseline term drops them as well.
    outputs, batch = make_batch(8, 6, seed=3, spread=2.0)
    kl = laser.trust_region_kl(
        logits(batch["policy_logits"][:-1]), logits(outputs["policy_logits"][:-1])
    )
    threshold = kl.median().item()
    keep = laser.trust_region_mask(kl, threshold)
    assert 0 < int(keep.sum()) < keep.numel()
    kwargs = {**LOSS_KWARGS, "entropy_cost": 0.0}
    out = laser.laser_loss(outputs, batch, trust_region_threshold=threshold, **kwargs)
    out.total_loss.backward()
    logits_grad = outputs["policy_logits"].grad[:-1]
    assert torch.all(logits_grad[~keep] == 0)
    assert torch.all(logits_grad[keep].abs().sum(-1) > 0)
    assert torch.all(outputs["baseline"].grad[:-1][~keep] == 0)
    assert out.stats["masked_fraction"].item() == pytest.approx(float((~keep).float().mean()))
    # Tolerance: the same float32 mean.
    torch.testing.assert_close(out.stats["mean_kl"], kl.mean())


def test_entropy_still_reaches_masked_steps():
    # The entropy regulariser uses no behaviour data and is not masked (module docstring).
    outputs, batch = make_batch(4, 3, seed=4, spread=3.0)
    kwargs = {**LOSS_KWARGS, "baseline_cost": 0.0}
    out = laser.laser_loss(outputs, batch, trust_region_threshold=1e-9, **kwargs)
    assert out.stats["masked_fraction"] == 1.0 and out.stats["pg_loss"] == 0.0
    out.total_loss.backward()
    logits = outputs["policy_logits"]
    expected = torch.autograd.grad(
        LOSS_KWARGS["entropy_cost"] * impala.entropy_loss(entropy(logits[:-1])), logits
    )[0]
    # Tolerance: the same float32 computation.
    torch.testing.assert_close(logits.grad, expected)


def test_stats_are_detached_scalars():
    outputs, batch = make_batch(3, 2)
    out = laser.laser_loss(outputs, batch, trust_region_threshold=0.05, **LOSS_KWARGS)
    assert set(out.stats) == {*IMPALA_STATS, "mean_kl", "masked_fraction"}
    for key, value in out.stats.items():
        assert value.shape == () and not value.requires_grad, key
    assert 0.0 <= out.stats["masked_fraction"] <= 1.0 and out.stats["mean_kl"] >= 0.0
    batch["reward"] = batch["reward"][:-1]
    with pytest.raises(ValueError, match="reward"):
        laser.laser_loss(outputs, batch, trust_region_threshold=0.05, **LOSS_KWARGS)


# --- the learner's batches -------------------------------------------------------------------

UNROLL = 2


def make_learner(batch_size, replay_size=None, num_replayed=0, use_lstm=False):
    """A learner with LASER's update over a rollout source; (learner, source)."""
    model = build_model("mlp", (4,), 2, use_lstm=use_lstm)
    spec = rollout_spec(
        unroll_length=UNROLL,
        obs=box_obs((4,), torch.float32),
        record=CategoricalPolicy(2).record_spec(),
        core_state_shapes=core_state_shapes(model.initial_state(1)),
    )
    buffers = RolloutBuffers(spec, num_buffers=16)
    replay = None if replay_size is None else RolloutReplay(spec, capacity=replay_size)
    source = RolloutSource(
        buffers,
        batch_size=batch_size,
        device=torch.device("cpu"),
        replay=replay,
        num_replayed=num_replayed,
    )
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=40.0,
        max_nonfinite_updates=10,
        lr_schedule="constant",
        total_steps=10**9,
        progress=progress,
    )
    context = LearnerContext(torch.device("cpu"), False, stepper, progress)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer.param_groups[0]["initial_lr"] = 1e-3
    loss_fn = functools.partial(laser.laser_loss, trust_region_threshold=None, **LOSS_KWARGS)
    learner = Learner(
        update=ActorCriticUpdate(model, context, optimizer, loss_fn),
        source=source,
        stepper=stepper,
        progress=progress,
        total_steps=10**9,
        num_learner_threads=1,
        publish=lambda: None,
        on_update=lambda stats: None,
    )
    return learner, source


# Actions must be valid (< 2 actions); every other non-bool field holds the rollout's id.
_ACTION_KEYS = ("action", "last_action")


def put_rollouts(buffers, ids):
    """Full slots whose fields hold the rollout's id (actions: id % 2); each ends an
    episode of return `id` at its last step."""
    for rollout_id in ids:
        index = buffers.free_queue.get()
        for key, tensor in buffers.tensors.items():
            if tensor.dtype == torch.bool:
                tensor[index] = False
            else:
                tensor[index] = rollout_id % 2 if key in _ACTION_KEYS else rollout_id
        buffers.tensors["episode_end"][index, -1] = True
        buffers.full_queue.put(index)


def collect_batches(source, count):
    """`count` batches, as the learner's preparation threads make them."""
    source.start()
    try:
        batches = []
        while len(batches) < count:
            batch = source.next(timeout=10)
            assert batch is not None, "no batch within 10 s"
            batches.append(batch)
        return batches
    finally:
        source.stop(5)


def batch_ids(batch):
    ids = batch["rollout_id"][0].tolist()
    for b, rollout_id in enumerate(ids):
        for key, tensor in batch.items():
            if tensor.dtype != torch.bool:
                expected = rollout_id % 2 if key in _ACTION_KEYS else rollout_id
                assert torch.all(tensor.select(1, b) == expected), key
    return ids


@pytest.mark.parametrize("use_lstm", [False, True])
def test_batches_mix_fresh_and_replayed_rollouts(use_lstm, watchdog):
    # batch 4 at replay ratio 1: 2 fresh + 2 replayed, once the replay holds 2.
    learner, source = make_learner(4, replay_size=16, num_replayed=2, use_lstm=use_lstm)
    put_rollouts(source.buffers, range(8))
    first, second, third = collect_batches(source, 3)
    # The replay is empty at first: an all-fresh batch.
    assert (first.new_steps, batch_ids(first.data)) == (4 * UNROLL, [0, 1, 2, 3])
    # Then the fresh rollouts come first and the replayed ones are earlier rollouts
    # (never the batch's own fresh ones). batch_ids checks that every field of a
    # replayed column, the behaviour logits and the stored initial recurrent state
    # (core_state_i) included, belongs to the same rollout.
    ids = batch_ids(second.data)
    assert second.new_steps == 2 * UNROLL and ids[:2] == [4, 5] and set(ids[2:]) <= {0, 1, 2, 3}
    assert len(set(ids)) == 4
    ids = batch_ids(third.data)
    assert third.new_steps == 2 * UNROLL and ids[:2] == [6, 7]
    assert set(ids[2:]) <= {0, 1, 2, 3, 4, 5}
    assert len(source.replay) == 8  # every fresh rollout went in once
    if use_lstm:
        state = core_state(second.data)
        assert len(state) == 2 and state[0].shape[1] == 4

    # Only fresh rollouts count as agent steps and report episodes.
    stats = learner.step(second)
    assert stats.step == UNROLL * 2
    assert sorted(stats.episode_returns) == [4.0, 5.0]
    assert stats.losses["replayed_rollouts"] == 2
    assert stats.losses["replay_fill"] == 8 / 16
    assert {"mean_kl", "masked_fraction"} <= set(stats.losses)


def test_without_a_replay_batches_are_as_before(watchdog):
    learner, source = make_learner(4)
    put_rollouts(source.buffers, range(8))
    first, second = collect_batches(source, 2)
    assert (first.new_steps, batch_ids(first.data)) == (4 * UNROLL, [0, 1, 2, 3])
    assert (second.new_steps, batch_ids(second.data)) == (4 * UNROLL, [4, 5, 6, 7])
    stats = learner.step(first)
    assert stats.step == UNROLL * 4 and sorted(stats.episode_returns) == [0, 1, 2, 3]
    assert "replay_fill" not in stats.losses


def test_source_rejects_a_replay_without_room_for_fresh_rollouts():
    with pytest.raises(ValueError, match="num_replayed"):
        make_learner(4, replay_size=16, num_replayed=4)
    with pytest.raises(ValueError, match="num_replayed"):
        make_learner(4, replay_size=16, num_replayed=0)


# --- flags ------------------------------------------------------------------------------------


def test_algo_laser_sets_the_replay_and_the_trust_region():
    config = parse_args(["--algo", "laser", "--env", "CartPole-v1"])
    assert config.config.endswith(os.path.join("configs", "laser", "classic.yaml"))
    assert (config.replay_ratio, config.trust_region_threshold) == (1.0, 0.5)
    spec = envs.EnvSpec((4,), torch.float32, 2)
    assert Laser(config, spec).experience().num_replayed == 4 and config.optimizer == "adam"
    # Runs with no tuned file and other config files still get LASER's defaults.
    custom = parse_args(["--algo", "laser", "--env", "CartPole-v1", "--config", "none"])
    assert custom.config is None and (custom.replay_ratio, custom.trust_region_threshold) == (
        1.0,
        0.5,
    )
    # Flags win; 0 turns either part off.
    off = parse_args(["--algo", "laser", "--replay_ratio", "0", "--trust_region_threshold", "0"])
    assert (off.replay_ratio, off.trust_region_threshold) == (0.0, 0.0)
    assert Laser(off, spec).experience().replay_size == 0


@pytest.mark.parametrize("family", ["classic", "atari"])
def test_laser_family_configs_are_impalas_plus_the_laser_keys(family):
    # configs/laser/<family>.yaml repeats IMPALA's tuned file (YAML has no include);
    # this keeps the copies from drifting apart.
    impala_values = load_config_file(
        os.path.join(CONFIGS_DIR, "impala", f"{family}.yaml"), config_for("impala")
    )
    laser_values = load_config_file(
        os.path.join(CONFIGS_DIR, "laser", f"{family}.yaml"), config_for("laser")
    )
    laser_keys = {"algo", "replay_ratio", "replay_size", "trust_region_threshold"}
    assert set(laser_values) == set(impala_values) | laser_keys
    assert {k: laser_values[k] for k in impala_values} == impala_values
    assert laser_values["algo"] == "laser"


def test_impala_has_no_replay_and_laser_has_its_loss():
    spec = envs.EnvSpec((4,), torch.float32, 2)
    config = parse_args(["--env", "CartPole-v1"])
    assert config.algo == "impala" and not hasattr(config, "replay_ratio")
    assert Impala(config, spec).experience().replay_size == 0
    assert Impala(config, spec).loss_fn().func is impala.impala_loss
    replaying = parse_args(["--algo", "laser", "--env", "CartPole-v1", "--replay_ratio", "3"])
    assert Laser(replaying, spec).experience().num_replayed == 6  # 8 * 3/4: 2 fresh + 6
    loss_fn = Laser(parse_args(["--algo", "laser"]), spec).loss_fn()
    assert loss_fn.func is laser.laser_loss and loss_fn.keywords["trust_region_threshold"] == 0.5


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--replay_ratio", "-1"], "--replay_ratio must be >= 0, got -1.0"),
        (["--trust_region_threshold", "-0.5"], "--trust_region_threshold must be >= 0"),
        (["--replay_size", "0"], "--replay_size must be positive"),
        (["--replay_ratio", "1", "--replay_size", "3"], "--replay_size 3 is too small"),
        (["--batch_size", "1", "--replay_ratio", "1"], "replays no rollout"),
        (["--batch_size", "2", "--replay_ratio", "100"], "leaves no fresh rollout"),
        (["--algo", "r2d3"], None),
    ],
)
def test_bad_laser_flags_are_one_line_errors(argv, fragment, capsys):
    if fragment is None:  # not a choice: argparse's one line, exit 2
        with pytest.raises(SystemExit) as info:
            parse_args(argv, prog="monobeast.py")
        assert info.value.code == 2
        assert "invalid choice: 'r2d3'" in capsys.readouterr().err
        return
    with pytest.raises(ConfigError) as info:
        parse_args(["--algo", "laser", *argv])
    assert fragment in str(info.value) and "\n" not in str(info.value)


# --- end to end -------------------------------------------------------------------------------


def test_monobeast_with_replay_runs_and_checkpoints(tmp_path):
    argv = ["--env", "CartPole-v1", "--num_actors", "1", "--num_envs_per_actor", "2"]
    argv += ["--unroll_length", "10", "--batch_size", "4", "--algo", "laser"]
    argv += ["--replay_ratio", "1", "--replay_size", "50", "--trust_region_threshold", "0.5"]
    argv += ["--use_lstm", "--total_steps", "4000", "--num_threads", "1"]
    result = run_monobeast([*argv, "--savedir", str(tmp_path), "--xpid", "laser"])
    assert result.returncode == 0, result.stderr
    assert "a replay of 50 rollouts" in result.stdout
    with open(tmp_path / "laser" / "logs.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"mean_kl", "masked_fraction", "mean_rho", "replay_fill"} <= set(rows[0])
    assert rows[-1]["replayed_rollouts"] == "2" and float(rows[-1]["replay_fill"]) == 1.0
    # Fresh steps only: 2 fresh rollouts of 10 steps per update once replaying.
    assert int(rows[-1]["step"]) - int(rows[-2]["step"]) == 20
    assert (tmp_path / "laser" / "model.tar").is_file()
