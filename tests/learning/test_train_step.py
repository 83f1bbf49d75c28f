"""beast.train_step: the compiled update matches the eager one, and never stops a run.

The contract (beast/train_step/): the compiled step (the forward passes, losses,
gradients, clipping, guard, optimizer arithmetic and target updates in one graph) takes
the same step as the eager one (backward, the Stepper, torch.optim's own Adam or
RMSprop, the Polyak averager) to float tolerance, for every kind of update: rollouts
(IMPALA, PPO), sequence replay (R2D2), transition replay (DQN with priorities) and
twin-critic actor-critics (SAC, TD3). The parity tests run with torch's aot_eager
backend (on CPU: the step's traced graph itself, run by eager kernels; seconds, where
inductor's C++ takes a minute cold on 2 cores); one test builds and loads inductor's
package itself.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

from beast.learning.learner import NonFiniteError
from beast.train_step import (
    auto,
    compiler,
)
from beast.train_step.interface import kind_of, step_trains
from tests.support.train_steps import (
    CARTPOLE,
    PENDULUM,
    assert_same_steps,
    block_of,
    build,
    pair,
    rollout_batch,
    scaled_linear_step,
    transition_batch,
)


def test_transition_replay_dqn_with_priorities_matches_eager(fast_backend):
    flags = ("--hidden_size", "16", "--batch_size", "8", "--target_update_period", "3")
    eager, compiled, progress = pair("dqn", CARTPOLE, *flags, "--n_step", "3", clipping=1.0)
    batches = [transition_batch(8, seed, continuous=False) for seed in range(9)]
    assert_same_steps(eager, compiled, batches, progress, priorities=True)
    update = compiled[1]
    assert update.train_step.path == "compiled", update.log_lines
    # The target network was copied at updates 3, 6 and 9, in the graph as eagerly.
    for a, b in zip(
        eager[1].target_model.parameters(), update.target_model.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("backend", "parts", "device"),
    [
        ("aot_eager", 4, "cpu"),
        ("inductor", 2, "cpu"),
        pytest.param(
            "inductor",
            4,
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
        ),
    ],
)
def test_a_block_of_steps_is_one_compiled_call_that_steps_as_one_at_a_time(
    monkeypatch, tmp_path, backend, parts, device
):
    """A block of 4 batches (2 with inductor on the CPU, whose package of the unrolled
    steps takes a while to build): the compiled update takes each block of batches in one
    call (one graph, the target copied inside it every third step; on CUDA one graph
    replay), and makes the steps, priorities and target copies the eager update on the
    CPU makes taking the batches one by one."""
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(compiler, "BACKEND", backend)
    flags = ("--hidden_size", "16", "--batch_size", "8", "--target_update_period", "3")
    flags += ("--n_step", "3")
    (model_a, update_a), (model_b, update_b), progress = pair(
        "dqn", CARTPOLE, *flags, clipping=1.0, device=device
    )
    # CUDA's kernels sum in other orders than the CPU's.
    close = {"rtol": 1e-3, "atol": 1e-4} if device == "cuda" else {"rtol": 1e-4, "atol": 1e-5}
    for i in range(5):
        batches = [transition_batch(8, parts * i + k, continuous=False) for k in range(parts)]
        for each in progress:
            each.step = 100 * i
        infos_a = [update_a(copy.deepcopy(batch)) for batch in batches]
        infos_b = update_b.block(block_of(batches, device))
        for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
            torch.testing.assert_close(b.cpu(), a, **close)
        targets_a, targets_b = update_a.target_model, update_b.target_model
        for a, b in zip(targets_a.parameters(), targets_b.parameters(), strict=True):
            torch.testing.assert_close(b.cpu(), a, **close)
        for info_a, info_b in zip(infos_a, infos_b, strict=True):
            torch.testing.assert_close(info_b.priorities.cpu(), info_a.priorities, **close)
            total_b = torch.as_tensor(info_b.stats["total_loss"]).cpu()
            torch.testing.assert_close(
                total_b, torch.as_tensor(info_a.stats["total_loss"]), **close
            )
    step = update_b.train_step
    assert step.path == ("CUDA graph" if device == "cuda" else "compiled"), update_b.log_lines
    assert step.steps_taken == 5 * parts == update_b.num_updates == update_a.num_updates
    assert step._calls[("model",)] == 5


def test_a_non_finite_step_inside_a_block_is_skipped_alone(fast_backend):
    """A block's second batch has a non-finite loss: compiled as eagerly, that step is
    skipped and counted, and the steps before and after it are taken."""
    results = {}
    for mode in ("off", "on"):
        model, optimizer, progress, step = scaled_linear_step(mode)
        x = torch.randn(1, 12, 3, generator=torch.Generator().manual_seed(1))  # [T, B, 3]
        for _ in range(4):  # eager probes, then the compiled block
            step.steps({"x": x, "scale": torch.ones(12)}, train=("model",), taus=(None,) * 3)
        scale = torch.tensor([1.0] * 4 + [float("nan")] * 4 + [2.0] * 4)
        applied = step.steps({"x": x, "scale": scale}, train=("model",), taus=(None,) * 3)
        results[mode] = (
            [r.applied for r in applied],
            [p.detach().clone() for p in model.parameters()],
            progress.skipped_updates,
            float(optimizer.state[model.weight]["step"]),
            step.path,
        )
    eager, compiled = results["off"], results["on"]
    assert eager[0] == compiled[0] == [True, False, True]
    for a, b in zip(eager[1], compiled[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert eager[2] == compiled[2] == 1 and eager[3] == compiled[3] == 14.0
    assert compiled[4] == "compiled"


def test_a_block_names_each_steps_groups_or_every_steps():
    """`train` names every step's groups, or each step's (one sequence per step): a block
    whose steps all train the same groups is that kind, whatever the form; one whose
    steps differ is the tuple of its steps' groups. A step that trains nothing goes in no
    such block, and every step needs its groups."""
    critic, both = ("critic",), ("critic", "actor")
    assert kind_of([critic, critic]) == critic
    assert kind_of([critic, both]) == (critic, both)
    assert step_trains(critic, 3) == (critic, critic, critic)
    assert step_trains((critic, both), 2) == (critic, both)
    assert step_trains((), 2) == ((), ())
    with pytest.raises(ValueError, match="a step that trains nothing"):
        kind_of([(), critic])
    with pytest.raises(ValueError, match="called with 3"):
        step_trains((critic, both), 3)
    _, _, _, step = scaled_linear_step("off")
    block = {"x": torch.randn(1, 4, 3), "scale": torch.ones(4)}
    with pytest.raises(ValueError, match="1 steps' groups for 2 steps"):
        step.steps(block, train=[("model",)], taus=(None, None))
    step.steps(block, train=[("model",), ("model",)], taus=(None, None))
    step.steps(block, train=("model",), taus=(None, None))
    assert step._calls == {("model",): 2}


def test_a_loss_that_stops_early_takes_no_blocks():
    _, _, _, step = scaled_linear_step("off", proceed=True)
    with pytest.raises(ValueError, match="one call at a time, not in a block"):
        block = {"x": torch.randn(1, 4, 3), "scale": torch.ones(4)}
        step.steps(block, train=("model",), taus=(None, None))


def test_rollouts_impala_and_ppo_match_eager(fast_backend):
    flags = ("--hidden_size", "16", "--unroll_length", "6", "--batch_size", "4")
    eager, compiled, progress = pair("impala", CARTPOLE, *flags, "--optimizer", "rmsprop")
    assert_same_steps(eager, compiled, [rollout_batch(6, 4, s) for s in range(6)], progress)
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines
    ppo_flags = (*flags, "--num_epochs", "2", "--num_minibatches", "2", "--no-synchronous")
    eager, compiled, progress = pair("ppo", CARTPOLE, *ppo_flags, clipping=0.5)
    # PPO draws each epoch's minibatches from torch's generator: seeded alike per batch.
    assert_same_steps(eager, compiled, [rollout_batch(6, 4, s) for s in range(3)], progress)
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines


def test_ppos_minibatch_steps_in_blocks_are_its_steps_one_at_a_time(fast_backend):
    """With no --target_kl no minibatch step can stop the rest: PPO takes them in blocks
    of up to `_STEPS_PER_CALL` (compiled: one call each), every epoch's order drawn
    first, and makes the steps it makes one call at a time (a --target_kl no step
    reaches)."""
    flags = ("--hidden_size", "16", "--unroll_length", "6", "--batch_size", "4")
    flags += ("--num_epochs", "3", "--num_minibatches", "2", "--no-synchronous")
    one_model, one_at_a_time, one_progress = build(
        "ppo", CARTPOLE, "off", *flags, "--target_kl", "1e9", clipping=0.5
    )
    block_model, in_blocks, block_progress = build("ppo", CARTPOLE, "on", *flags, clipping=0.5)
    batches = [rollout_batch(6, 4, s) for s in range(4)]
    assert_same_steps(
        (one_model, one_at_a_time),
        (block_model, in_blocks),
        batches,
        (one_progress, block_progress),
    )
    step = in_blocks.train_step
    assert step.path == "compiled", in_blocks.log_lines
    assert step.steps_taken == 4 * 6 == one_at_a_time.train_step.steps_taken
    assert step._calls[("model",)] == 4 * 2  # 6 steps an update: blocks of 3
    assert one_at_a_time.train_step._calls[("model",)] == 4 * 6


@pytest.mark.parametrize("advantages", ["gae", "vtrace"])
def test_a_call_that_trains_nothing_is_a_compiled_forward_pass(fast_backend, advantages):
    """`train=()` is the loss's forward pass alone (PPO's fixed targets): compiled like a
    step once its eager calls are timed, its outputs those of the eager pass, nothing
    trained or written, and no optimizer step counted."""
    flags = ("--hidden_size", "16", "--unroll_length", "6", "--batch_size", "4")
    flags += ("--advantages", advantages, "--no-synchronous")
    (_, eager), (model, compiled), _ = pair("ppo", CARTPOLE, *flags)
    before = [p.detach().clone() for p in model.parameters()]
    for seed in range(auto.EAGER_PROBES + 3):
        data = rollout_batch(6, 4, seed).data
        expected, got = eager.targets(data), compiled.targets(data)
        for key, value in expected._asdict().items():
            torch.testing.assert_close(getattr(got, key), value, rtol=1e-5, atol=1e-6)
    step = compiled.train_step
    assert step.path == "compiled" and () in step._decided, step.log
    assert step.steps_taken == 0
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_step_reads_the_modules_buffers_as_they_are_now(fast_backend):
    """Buffers (here the observation normaliser's statistics, which every batch moves)
    are inputs of the compiled step, not constants of its trace: after them, the two
    paths still take the same steps."""
    flags = ("--hidden_size", "16", "--unroll_length", "6", "--batch_size", "4")
    flags += ("--normalize_obs", "--num_epochs", "1", "--no-synchronous")
    eager, compiled, progress = pair("ppo", CARTPOLE, *flags)
    for seed in range(6):
        batch = rollout_batch(6, 4, seed)
        batch.data["obs"] = batch.data["obs"] * 5.0 + 3.0 * seed  # statistics that move
        for model, _ in (eager, compiled):  # as the learner does before each update
            model.obs_rms.update(batch.data["obs"])
        assert_same_steps(eager, compiled, [batch], progress)
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines
    # The traces (here run as they are) keep none of them as a constant, which a package
    # would hold a copy of: the minibatch step's, and the targets' forward pass's.
    buffers = {b.data_ptr() for b in compiled[0].buffers()}
    decided = compiled[1].train_step._decided
    assert set(decided) == {("model",), ()} and None not in decided.values()
    for step in decided.values():
        for runner in step._runners.values():
            graph = runner.graph
            nodes = graph.graph.nodes
            constants = [getattr(graph, n.target) for n in nodes if n.op == "get_attr"]
            assert not buffers & {c.data_ptr() for c in constants if isinstance(c, Tensor)}


@pytest.mark.parametrize(
    "algo, flags",
    [
        ("laser", ("--unroll_length", "6", "--batch_size", "4")),
        ("a2c", ("--unroll_length", "6", "--batch_size", "4", "--no-synchronous")),
        ("c51", ("--batch_size", "8")),
        ("rainbow", ("--batch_size", "8")),
        ("apex", ("--batch_size", "8")),
        ("ddpg", ("--net_arch", "16,16", "--batch_size", "8")),
    ],
)
def test_every_other_algorithm_compiles_and_matches_eager(fast_backend, algo, flags):
    """The algorithms the tests above leave out: their steps trace into one graph (no
    host read, no shape that depends on the data) and take the eager steps."""
    continuous = algo == "ddpg"
    spec = PENDULUM if continuous else CARTPOLE
    if "--unroll_length" in flags:
        batches = [rollout_batch(6, 4, seed) for seed in range(4)]
    else:
        flags = (*flags, "--hidden_size", "16") if not continuous else flags
        batches = [transition_batch(8, seed, continuous=continuous) for seed in range(5)]
    eager, compiled, progress = pair(algo, spec, *flags)
    assert_same_steps(eager, compiled, batches, progress, priorities=algo in ("apex", "rainbow"))
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines


def test_sequence_replay_r2d2_matches_eager(fast_backend):
    flags = ("--hidden_size", "8", "--model", "mlp", "--batch_size", "4", "--burn_in", "2")
    flags += ("--seq_len", "6", "--seq_overlap", "2", "--n_step", "2")
    flags += ("--target_update_period", "2")
    eager, compiled, progress = pair("r2d2", CARTPOLE, *flags)
    batches = [rollout_batch(6, 4, s, hidden=8) for s in range(5)]
    assert_same_steps(eager, compiled, batches, progress, priorities=True)
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_twin_critic_actor_critics_match_eager(fast_backend, algo):
    flags = ("--net_arch", "16,16", "--batch_size", "8")
    eager, compiled, progress = pair(algo, PENDULUM, *flags)
    batches = [transition_batch(8, seed, continuous=True) for seed in range(7)]
    assert_same_steps(eager, compiled, batches, progress)
    update = compiled[1]
    assert update.train_step.path == "compiled", update.log_lines
    for a, b in zip(eager[1].target.parameters(), update.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if algo == "sac":
        torch.testing.assert_close(update.log_alpha, eager[1].log_alpha, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("algo", "compile"),
    [("sac", "off"), ("ddpg", "off"), ("td3", "off"), ("sac", "on"), ("ddpg", "on"), ("td3", "on")],
)
def test_actor_critic_blocks_step_as_one_batch_at_a_time(fast_backend, algo, compile):
    """Blocks of 4 batches, each in one call, with each batch's own noise: SAC and DDPG
    train the same groups every step, with a Polyak average after each; TD3's delayed
    actor trains the critic alone and then critic and actor by turns, averaging after the
    second of each pair. They make the steps, targets, temperature and stats that eager
    calls one batch at a time make, the noise drawn in the same order.

    Eager, the block's steps are the same arithmetic: 4 blocks, to rounding. Compiled,
    3 blocks (two eager probes, then one compiled call of 4 steps), to the compiled-
    against-eager tolerance of the tests above: over more of Adam's steps a near-zero
    gradient rounded otherwise moves its weight by up to the learning rate, and the
    losses by more."""
    flags = ("--net_arch", "16,16", "--batch_size", "8")
    (model_a, update_a), (model_b, update_b), progress = pair(
        algo, PENDULUM, *flags, compile=compile
    )
    blocks, close = (
        (4, {"rtol": 1e-6, "atol": 1e-7}) if compile == "off" else (3, {"rtol": 1e-4, "atol": 1e-5})
    )
    for i in range(blocks):
        batches = [transition_batch(8, 4 * i + k, continuous=True) for k in range(4)]
        for each in progress:
            each.step = 100 * i
        torch.manual_seed(i)
        infos_a = [update_a(copy.deepcopy(batch)) for batch in batches]
        torch.manual_seed(i)
        infos_b = update_b.block(block_of(batches))
        for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
            torch.testing.assert_close(b, a, **close)
        for a, b in zip(update_a.target.parameters(), update_b.target.parameters(), strict=True):
            torch.testing.assert_close(b, a, **close)
        for info_a, info_b in zip(infos_a, infos_b, strict=True):
            assert info_a.stats.keys() == info_b.stats.keys()
            for key, value in info_a.stats.items():
                torch.testing.assert_close(
                    torch.as_tensor(info_b.stats[key]).float(),
                    torch.as_tensor(value).float(),
                    equal_nan=True,  # TD3's actor loss before its first actor update
                    **close,
                )
    if algo == "sac":
        torch.testing.assert_close(update_b.log_alpha, update_a.log_alpha, **close)
    step = update_b.train_step
    assert step.path == ("eager" if compile == "off" else "compiled"), update_b.log_lines
    steps = 4 * blocks
    assert step.steps_taken == steps == update_b.num_updates == update_a.num_updates
    assert sum(step._calls.values()) == blocks
    if algo == "td3":  # one kind: the critic alone, then critic and actor, twice
        critic, both = ("critic",), ("critic", "actor")
        assert list(step._calls) == [(critic, both, critic, both)]


def test_checkpoints_hold_the_same_state_on_either_path(fast_backend):
    """Optimizer states live in the flat buffers the compiled step writes: a state_dict
    taken after compiled steps resumes an eager update exactly where it was."""
    flags = ("--hidden_size", "16", "--batch_size", "8")
    _, compiled, progress = pair("dqn", CARTPOLE, *flags)
    model, update = compiled
    batches = [transition_batch(8, seed, continuous=False) for seed in range(6)]
    for batch in batches:
        update(batch)
    assert update.train_step.path == "compiled", update.log_lines
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(update.state_dict())
    steps = [float(s["step"]) for s in saved["optimizer"]["state"].values()]
    assert steps == [6.0] * len(steps)
    fresh_model, fresh, _ = build("dqn", CARTPOLE, "on", *flags)
    fresh_model.load_state_dict(saved_model)
    fresh.load_state_dict(saved)
    reference_model, reference, _ = build("dqn", CARTPOLE, "off", *flags)
    reference_model.load_state_dict(saved_model)
    reference.load_state_dict(saved)
    for batch in batches[:2]:
        fresh(batch)
        reference(batch)
    for a, b in zip(fresh_model.parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_non_finite_step_is_skipped_in_the_graph_and_counted(fast_backend):
    """The guard is a `where` in the graph: a non-finite loss leaves every parameter and
    moment as it was, counts a skipped update, and enough in a row stop the run."""
    model, optimizer, progress, step = scaled_linear_step("on", max_nonfinite_updates=2)
    x = torch.randn(5, 3)
    for _ in range(6):
        assert step({"x": x, "scale": torch.tensor(1.0)}, train=("model",)).applied
    assert step.path == "compiled"
    before = [p.detach().clone() for p in model.parameters()]
    moments = optimizer.state[model.weight]["exp_avg"].clone()
    result = step({"x": x, "scale": torch.tensor(float("nan"))}, train=("model",))
    assert not result.applied and progress.skipped_updates == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], moments)
    assert float(optimizer.state[model.weight]["step"]) == 6.0
    with pytest.raises(NonFiniteError, match="2 consecutive updates"):
        step({"x": x, "scale": torch.tensor(float("inf"))}, train=("model",))
