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

import collections
import copy
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from beast.algos.base import Batch, LearnerContext
from beast.config import parse_args
from beast.envs.spec import EnvSpec
from beast.learning.learner import NonFiniteError, Stepper, TrainingProgress
from beast.run.engine import build_algorithm
from beast.train_step import (
    ParameterGroup,
    StepAbandoned,
    StepLoss,
    TrainStep,
    auto,
    compiler,
    package,
)
from beast.train_step.background import ModulesInUse
from beast.train_step.flat import Layout, used_from_reached, used_parameters
from beast.train_step.interface import kind_of, step_trains
from tests.support.runs import processes_with_marker, wait_until_gone

CARTPOLE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), num_actions=2)
PENDULUM = EnvSpec(
    obs_shape=(3,),
    obs_dtype=np.dtype(np.float32),
    num_actions=0,
    action_shape=(1,),
    action_low=(-2.0,),
    action_high=(2.0,),
)


@pytest.fixture
def fast_backend(monkeypatch):
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    # Compile after two eager steps of a kind (the first times nothing), not four.
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)


def build(
    algo: str,
    spec: EnvSpec,
    compile: str,
    *flags: str,
    clipping: float = 0.0,
    background: bool = False,
    device: str = "cpu",
    identity: str | None = None,
):
    """An algorithm's update on a tiny network, seeded: two builds start identical.
    `identity`: the run's step identity (beast/run/engine.py `step_identity`)."""
    env = "Pendulum-v1" if spec.continuous else "CartPole-v1"
    config = parse_args(["--algo", algo, "--env", env, *flags])
    torch.manual_seed(0)
    algorithm = build_algorithm(config, spec)
    model = algorithm.build_model().to(device)
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=clipping,
        max_nonfinite_updates=3,
        lr_schedule="linear",
        total_steps=10_000,
        progress=progress,
    )
    lines: list[str] = []
    context = LearnerContext(
        device=torch.device(device),
        bf16=False,
        step=stepper,
        progress=progress,
        compile=compile,
        log=lines.append,
        compile_in_background=background,
        step_identity=identity,
    )
    update = algorithm.learner(model, context)
    update.log_lines = lines  # what the step said: why it is not compiled, if it is not
    return model, update, progress


def transition_batch(B: int, seed: int, *, continuous: bool) -> Batch:
    g = torch.Generator().manual_seed(seed)
    obs = 3 if continuous else 4
    action = (
        torch.rand(2, B, 1, generator=g) * 4 - 2
        if continuous
        else torch.randint(0, 2, (2, B), generator=g)
    )
    data = {
        "obs": torch.randn(2, B, obs, generator=g),
        "reward": torch.randn(2, B, generator=g),
        "done": torch.zeros(2, B, dtype=torch.bool),
        "last_action": torch.zeros(2, B, 1) if continuous else torch.zeros(2, B, dtype=torch.int64),
        "action": action,
        "n_step_rewards": torch.randn(3, B, generator=g),
        "n_steps": torch.randint(1, 4, (B,), generator=g),
        "terminal": torch.rand(B, generator=g) < 0.2,
    }
    return Batch(data=data, weights=torch.rand(B, generator=g) + 0.5)


def rollout_batch(T: int, B: int, seed: int, *, hidden: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(T + 1, B, generator=g) < 0.1
    data = {
        "obs": torch.randn(T + 1, B, 4, generator=g),
        "reward": torch.randn(T + 1, B, generator=g),
        "done": done,
        "terminated": done & (torch.rand(T + 1, B, generator=g) < 0.5),
        "truncated": torch.zeros(T + 1, B, dtype=torch.bool),
        "last_action": torch.randint(0, 2, (T + 1, B), generator=g),
        "action": torch.randint(0, 2, (T + 1, B), generator=g),
        "policy_logits": torch.randn(T + 1, B, 2, generator=g),
        "baseline": torch.randn(T + 1, B, generator=g),
        "mask": torch.ones(T + 1, B, dtype=torch.bool),
    }
    data["terminated"] = data["done"] & data["terminated"]
    if hidden:
        data["core_state_0"] = torch.randn(1, B, hidden, generator=g)
        data["core_state_1"] = torch.randn(1, B, hidden, generator=g)
    return Batch(data=data, weights=torch.rand(B, generator=g) + 0.5)


def assert_same_steps(eager, compiled, batches, progress_pair, *, priorities=False):
    """Both updates take each batch; after every step their parameters (and, for a
    prioritized replay, the priorities they return) agree to float tolerance."""
    (model_a, update_a), (model_b, update_b) = eager, compiled
    for i, batch in enumerate(batches):
        for progress in progress_pair:
            progress.step = 100 * i  # the linear learning-rate schedule moves
        torch.manual_seed(i)  # the noise SAC and TD3 draw outside the step
        info_a = update_a(copy.deepcopy(batch))
        torch.manual_seed(i)
        info_b = update_b(copy.deepcopy(batch))
        for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
            # float32 through a few steps of Adam: the two orders of summation differ
            # by rounding, ~1e-7 relative per step.
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        for key in info_a.stats:
            torch.testing.assert_close(
                torch.as_tensor(info_b.stats[key]).float(),
                torch.as_tensor(info_a.stats[key]).float(),
                rtol=1e-4,
                atol=1e-5,
                equal_nan=True,  # TD3's actor loss before its first actor update
            )
        if priorities:
            torch.testing.assert_close(info_b.priorities, info_a.priorities, rtol=1e-4, atol=1e-5)


def step_until_compiled(update, seconds: float = 30.0) -> None:
    """DQN steps on fresh batches until a background compilation is adopted."""
    deadline = time.monotonic() + seconds
    seed = 0
    while update.train_step.path != "compiled" and time.monotonic() < deadline:
        update(transition_batch(8, seed, continuous=False))
        seed += 1
    assert update.train_step.path == "compiled", update.log_lines


def pair(algo, spec, *flags, clipping=0.0, identity=None, compile="on", device="cpu"):
    """Two builds of one update from the same weights: eager on the CPU, and `compile`
    on `device`."""
    model_a, update_a, progress_a = build(algo, spec, "off", *flags, clipping=clipping)
    model_b, update_b, progress_b = build(
        algo, spec, compile, *flags, clipping=clipping, identity=identity, device=device
    )
    return (model_a, update_a), (model_b, update_b), (progress_a, progress_b)


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


def block_of(batches: list[Batch], device: str = "cpu") -> Batch:
    """The batches as one block, as a replay samples `--updates_per_sample` of them: cut
    along dim 0 of 1-D tensors and dim 1 of the others (interface.py `split_block`)."""
    return Batch(
        data={
            key: torch.cat([b.data[key] for b in batches], dim=0 if value.dim() == 1 else 1).to(
                device
            )
            for key, value in batches[0].data.items()
        },
        weights=torch.cat([b.weights for b in batches]).to(device),
        parts=len(batches),
    )


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


def scaled_linear_step(compile: str, *, max_nonfinite_updates: int = 3, proceed: bool = False):
    """A linear model's TrainStep on the loss mean(model(x) * scale) (Adam, lr 0.1), with
    a `proceed` where asked: (model, optimizer, progress, step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["initial_lr"] = 0.1
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=0.0,
        max_nonfinite_updates=max_nonfinite_updates,
        lr_schedule="constant",
        total_steps=100,
        progress=progress,
    )

    def loss(inputs, train):
        value = (model(inputs["x"]).squeeze(-1) * inputs["scale"]).mean()
        return StepLoss(
            value, {"loss": value.detach()}, proceed=torch.tensor(True) if proceed else None
        )

    step = TrainStep(
        loss,
        modules={"model": model},
        groups=[ParameterGroup("model", optimizer)],
        stepper=stepper,
        compile=compile,
        log=lambda line: None,
    )
    return model, optimizer, progress, step


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


def test_the_trace_runs_in_the_learners_step_and_the_build_beside_it(monkeypatch):
    """A trace puts fake tensors in the modules while it runs: it runs in the thread that
    takes the step (the learner's, which holds the lock a checkpoint takes), never in the
    compilation's own thread, which only builds or loads the package."""
    threads = {}
    trace, runner = package.trace, package.PackagedStep._runner

    def recorded_trace(function, arguments):
        threads["trace"] = threading.get_ident()
        return trace(function, arguments)

    def recorded_runner(self, traced):
        threads["build"] = threading.get_ident()
        return runner(self, traced)

    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    monkeypatch.setattr(package, "trace", recorded_trace)
    monkeypatch.setattr(package.PackagedStep, "_runner", recorded_runner)
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)
    step_until_compiled(update)
    assert threads["trace"] == threading.get_ident() != threads["build"]


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


def test_each_compiling_thread_configures_the_compiler(fast_backend):
    """torch keeps its compiler settings per thread: an LSTM update compiles in its own
    background thread (as in a run) after another update compiled in another, and runs
    compiled in this one."""
    r2d2_flags = ("--hidden_size", "8", "--model", "mlp", "--batch_size", "4", "--burn_in", "2")
    r2d2_flags += ("--seq_len", "6", "--seq_overlap", "2", "--n_step", "2")
    runs = [
        (
            build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)[1],
            lambda seed: transition_batch(8, seed, continuous=False),
        ),
        (
            build("r2d2", CARTPOLE, "on", *r2d2_flags, background=True)[1],
            lambda seed: rollout_batch(6, 4, seed, hidden=8),
        ),
    ]
    for update, batch in runs:
        for seed in range(12):
            update(batch(seed))
            for compilation in list(update.train_step._compilations.values()):
                compilation.join()
        assert update.train_step.path == "compiled", update.log_lines


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


def test_inductor_compiles_a_dqn_step_that_matches_eager(monkeypatch, tmp_path):
    """The real backend: inductor's generated C++ around the matrix products, built into
    a package by the first run and loaded by the next (the same step, traced again)."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    flags = ("--hidden_size", "16", "--batch_size", "8", "--target_update_period", "2")
    batches = [transition_batch(8, seed, continuous=False) for seed in range(7)]
    for said in ("compiled (", "compiled from its package of an earlier run"):
        eager, compiled, progress = pair("dqn", CARTPOLE, *flags)
        assert_same_steps(eager, compiled, batches, progress)
        assert compiled[1].train_step.path == "compiled", compiled[1].log_lines
        assert any(said in line for line in compiled[1].log_lines), compiled[1].log_lines
    assert len(os.listdir(tmp_path / "steps")) == 1
    # A run's learner (compiling in the background) loads a package built already in its
    # own thread, in the step that decides: no thread, and no compiler import for one.
    loaded = []
    load = package.Trace.load
    monkeypatch.setattr(package.Trace, "load", lambda t: loaded.append(t.path) or load(t))
    monkeypatch.setattr(compiler, "import_compiler", lambda: pytest.fail("imported"))
    _, update, _ = build("dqn", CARTPOLE, "on", *flags, background=True)
    decided = update.train_step.steps_taken + auto.EAGER_PROBES + 1
    step_until_compiled(update)
    assert update.train_step.steps_taken == decided and len(loaded) == 1


def test_a_package_an_earlier_run_recorded_is_its_first_step_untraced(monkeypatch, tmp_path):
    """A run whose step an earlier run traced and packaged, with the same settings (its
    `identity`), code and shapes, runs that package from its very first step: no eager
    step, no trace. A change to any of these traces again."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    flags = ("--hidden_size", "16", "--batch_size", "8", "--target_update_period", "2")
    # Enough steps for the first run to time its compiled step too (what --compile auto
    # weighs in the next run).
    batches = [transition_batch(8, seed, continuous=False) for seed in range(12)]
    eager, compiled, progress = pair("dqn", CARTPOLE, *flags, identity="settings")
    assert_same_steps(eager, compiled, batches, progress)
    assert compiled[1].train_step.path == "compiled", compiled[1].log_lines

    traces = []
    real_trace = package.trace
    monkeypatch.setattr(package, "trace", lambda *a: traces.append(a) or real_trace(*a))
    eager, compiled, progress = pair("dqn", CARTPOLE, *flags, identity="settings")
    assert_same_steps(eager, compiled, batches[:1], progress)
    update = compiled[1]
    assert update.train_step.path == "compiled" and update.train_step.steps_taken == 1
    assert any("untraced" in line for line in update.log_lines), update.log_lines
    assert_same_steps(eager, compiled, batches[1:4], progress)  # and on, step for step
    assert traces == []

    def traced(identity: str | None) -> bool:
        traces.clear()
        _, update, _ = build("dqn", CARTPOLE, "on", *flags, identity=identity)
        step_until_compiled(update)
        return bool(traces)

    assert traced("other settings")
    assert traced(None)  # a user's model: no identity
    arguments = (torch.zeros(8, 4), {"obs": torch.zeros(8, 2)})
    key = package.known_step_key("settings", arguments)
    for other in (
        (torch.zeros(4, 4), {"obs": torch.zeros(8, 2)}),  # another shape
        (torch.zeros(8, 4, dtype=torch.float64), {"obs": torch.zeros(8, 2)}),
        (torch.zeros(4, 8).t(), {"obs": torch.zeros(8, 2)}),  # other strides
        (torch.zeros(8, 4), {"action": torch.zeros(8, 2)}),
    ):
        assert package.known_step_key("settings", other) != key
    assert package.known_step_key("settings", copy.deepcopy(arguments)) == key
    monkeypatch.setattr(package, "source_digest", lambda: b"beast's code, edited")
    assert traced("settings")


def test_the_parameters_a_step_reaches_are_recorded_as_they_were_found():
    """`Used` rebuilt from a record's flags (a package loaded untraced) is the `Used` an
    eager backward found."""
    trunk, head, spare = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(4, 1)
    group = ParameterGroup(
        "model", torch.optim.Adam([*trunk.parameters(), *head.parameters(), *spare.parameters()])
    )
    layout = Layout([group], [])
    head(trunk(torch.randn(5, 3))).sum().backward()  # `spare` receives no gradient
    found = used_parameters(layout, range(len(layout.params)))
    assert found is not None
    rebuilt = used_from_reached(layout, found.params.tolist())
    assert torch.equal(rebuilt.elements, found.elements)
    assert torch.equal(rebuilt.params, found.params)
    assert used_from_reached(layout, [True] * len(layout.params)) is None
    with pytest.raises(ValueError, match="flags for"):
        used_from_reached(layout, [True])


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


def test_a_failed_compilation_is_said_once_and_the_run_goes_on_eagerly(monkeypatch, tmp_path):
    def broken_build(self, exported, stopping=None):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))  # no package built before
    monkeypatch.setattr(package.Trace, "build", broken_build)
    logged = []
    model_a, update_a, _ = build("dqn", CARTPOLE, "off", "--hidden_size", "16")
    model_b, update_b, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16")
    update_b.train_step.log = logged.append
    for seed in range(8):
        batch = transition_batch(32, seed, continuous=False)
        update_a(copy.deepcopy(batch))
        update_b(copy.deepcopy(batch))
    assert update_b.train_step.path == "eager"
    assert len(logged) == 1
    assert "RuntimeError: no C++ compiler found" in logged[0] and "eagerly" in logged[0]
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_build_removes_what_earlier_builds_left_in_the_cache(tmp_path):
    """inductor leaves each build's C++ and library in its cache beside the package that
    holds them; a build removes those nothing has written to for an hour, and nothing
    else: not a build's of the last hour (one may be under way), not the instruction-set
    probes, the packages or anything not a build's."""
    now = time.time()

    def made(name: str, files: dict[str, float]) -> str:
        """A directory of the cache holding `files` (relative path: age in seconds)."""
        for relative, age in files.items():
            path = tmp_path / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
            os.utime(path, (now - age, now - age))
        for directory in sorted((tmp_path / name).rglob("*"), reverse=True):
            if directory.is_dir():
                os.utime(directory, (now - 7200, now - 7200))
        os.utime(tmp_path / name, (now - 7200, now - 7200))
        return name

    def hashed(tag: str) -> str:
        return "c" + tag * 51

    old_build = made(hashed("a"), {"cw.wrapper.cpp": 7200, "cw.wrapper.so": 7200, "cw/f": 7200})
    recent_build = made(hashed("b"), {"cw.wrapper.cpp": 7200, "cw.kernel.cpp": 60})
    recent_inside = made(hashed("c"), {"cw.wrapper.cpp": 7200, "cw_CxxBuild/o.o": 30})
    # A file renamed inside it lately (a build's temporary made final) dates only its folder.
    renamed_inside = made(hashed("e"), {"cw.wrapper.cpp": 7200, "cw/o.so": 7200})
    os.utime(tmp_path / renamed_inside / "cw", (now - 30, now - 30))
    not_a_build = made(hashed("d"), {"notes.txt": 7200})
    probe = made("3g", {"c3g.cpp": 7200, "c3g.so": 7200})
    packages = made("steps", {"c.pt2": 7200})
    short_name = made("cabc", {"cw.wrapper.cpp": 7200})

    assert package._remove_build_leftovers(str(tmp_path), now) == 1
    left = {entry.name for entry in tmp_path.iterdir()}
    assert old_build not in left
    kept = {recent_build, recent_inside, renamed_inside, not_a_build, probe, packages}
    assert left == {*kept, short_name}
    assert package._remove_build_leftovers(str(tmp_path), now + 3600) == 3


def test_a_package_build_under_way_stops_with_the_run(monkeypatch, tmp_path):
    """A package builds in a child process beside the run; a run that stops stops it
    (no process left behind) and the build says so with `BuildStopped`, no error."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    children = []
    popen = subprocess.Popen

    def endless_build(argv, **kwargs):  # a build that would outlast the run
        children.append(popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return children[-1]

    monkeypatch.setattr(package.subprocess, "Popen", endless_build)
    traced = package.trace(lambda x: (x * 2.0,), (torch.ones(3),))
    stopping = threading.Event()
    threading.Timer(0.5, stopping.set).start()
    started = time.monotonic()
    with pytest.raises(package.BuildStopped):
        traced.build(traced.export(), stopping)
    assert time.monotonic() - started < 5.0
    assert len(children) == 1 and children[0].poll() is not None
    assert not traced.built


# A process that builds a step's package in the foreground, as a run's compilation thread
# does, with SIGINT and SIGTERM ignored, as a stopping run has them (its children inherit
# that): argv[1] is the compile cache.
_BUILDING_RUN = """
import os, signal, sys
os.environ["BEAST_COMPILE_CACHE"] = sys.argv[1]
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import torch
from beast.train_step import package
traced = package.trace(lambda x: (torch.tanh(x @ x).sum(0),), (torch.ones(64, 64),))
traced.build(traced.export())
"""


@pytest.mark.parametrize("stage", ["importing", "compiling"])
def test_a_run_that_dies_mid_build_leaves_nothing_behind(tmp_path, stage):
    """A run killed (or ended with os._exit, as one does while a compilation is under way)
    while its package's child still imports torch, or while the child's C++ compilers
    run: the child and every compiler under it are gone at once, none left running on
    as the run's orphan."""
    marker = uuid.uuid4().hex
    run = subprocess.Popen(
        [sys.executable, "-c", _BUILDING_RUN, str(tmp_path)],
        env=dict(os.environ, BEAST_TEST_MARKER=marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child_seen: list[float] = []

    def importing() -> bool:  # the child imports for 1.3 s: 0.3 s in, it is at it
        if not child_seen and len(processes_with_marker(marker)) > 1:
            child_seen.append(time.monotonic())
        return bool(child_seen) and time.monotonic() - child_seen[0] > 0.3

    reached = {"importing": importing, "compiling": lambda: _compilers(marker)}[stage]
    try:
        deadline = time.monotonic() + 120.0
        while not reached():
            assert run.poll() is None, f"the build ended first: {run.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"not {stage} within 120 s"
            time.sleep(0.02)
        run.kill()
        run.wait()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    # Gone in under 0.1 s here. Before, a child went on importing torch (1.3 s here, more
    # on a busy machine) and then through the interpreter's exit (1 s).
    assert wait_until_gone(marker, timeout=1.0) == []


def _compilers(marker: str) -> list[int]:
    """The processes carrying `marker` that are not Python: a build's compilers."""
    found = []
    for pid in processes_with_marker(marker):
        try:
            executable = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if not executable.startswith("python"):
            found.append(pid)
    return found


def test_auto_compiles_only_where_the_run_is_long_enough(monkeypatch, tmp_path):
    """--compile auto weighs the steps left against the cost of compiling: a short run
    stays eager (and says why, once), a long one compiles."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    for expected, path in ((20, "eager"), (10**9, "compiled")):
        _, update, _ = build("dqn", CARTPOLE, "auto", "--hidden_size", "16")
        logged = []
        update.train_step.log = logged.append
        update.train_step.expected_steps = expected
        for seed in range(8):
            update(transition_batch(32, seed, continuous=False))
        assert update.train_step.path == path
        assert len(logged) == 1
        if path == "eager":
            assert "compiling costs about" in logged[0] and "--compile on" in logged[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_match_eager():
    flags = ("--net_arch", "16,16", "--batch_size", "8")
    eager = build("sac", PENDULUM, "off", *flags)
    model, update, _ = build("sac", PENDULUM, "on", *flags, device="cuda")
    for seed in range(8):
        batch = transition_batch(8, seed, continuous=True)
        torch.manual_seed(seed)
        eager[1](copy.deepcopy(batch))
        torch.manual_seed(seed)
        update(Batch({k: v.cuda() for k, v in batch.data.items()}, batch.weights.cuda()))
    assert update.train_step.path == "CUDA graph"
    for a, b in zip(eager[0].parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_cuda_graph_captures_while_another_thread_copies_to_the_gpu():
    """Central inference copies each batch of observations to the GPU in a thread of its
    own while the learner captures its step: the capture must neither fail nor fail the
    copies (a capture in CUDA's global mode did both: "operation not permitted when
    stream is capturing", and Pong's run died of it on an H100)."""
    from beast.train_step.cuda_graph import CudaGraphStep

    def step(weights: Tensor, inputs: dict[str, Tensor]) -> tuple[Tensor]:
        weights.add_(inputs["x"].mean())
        return (weights * 2,)

    stop, errors = threading.Event(), []

    def copy_to_gpu() -> None:
        try:
            while not stop.is_set():
                torch.randn(64, 1024).to("cuda").sum().item()
        except Exception as error:  # the inference thread's failure, kept for the assert
            errors.append(error)

    copier = threading.Thread(target=copy_to_gpu)
    copier.start()
    try:
        for _ in range(20):
            weights = torch.zeros(4, device="cuda")
            graphed = CudaGraphStep(step, (weights, {"x": torch.ones(8, device="cuda")}))
            (out,) = graphed(weights, {"x": torch.full((8,), 3.0, device="cuda")})
            torch.testing.assert_close(out.cpu(), torch.full((4,), 6.0))
    finally:
        stop.set()
        copier.join()
    assert not errors, errors


def test_a_compiled_step_no_faster_than_eager_gives_way_to_it(fast_backend, monkeypatch, tmp_path):
    """Under --compile auto the run times its first compiled steps against the eager ones
    and keeps the compiled step only if it is faster (here nothing is fast enough), said
    once. (--compile on keeps it: the parity tests above, whose tiny steps run no faster
    compiled, assert that.)"""
    monkeypatch.setattr(auto, "KEEP_COMPILED_BELOW", 0.0)
    monkeypatch.setattr(auto, "worth_compiling", lambda *args: (True, ""))
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))  # its record, not the user's
    _, update, _ = build("dqn", CARTPOLE, "auto", "--hidden_size", "16")
    paths = []
    for seed in range(12):
        update(transition_batch(32, seed, continuous=False))
        paths.append(update.train_step.path)
    assert "compiled" in paths and paths[-1] == "eager"
    reverted = [line for line in update.log_lines if "goes on eagerly" in line]
    assert len(reverted) == 1 and "ms a step against" in reverted[0]


def test_compiled_graphs_go_to_beasts_cache_unless_the_user_chose_one(monkeypatch, tmp_path):
    """torch writes its /tmp default into TORCHINDUCTOR_CACHE_DIR the first time anything
    asks for its cache; beast's persistent cache replaces that default, never a user's
    own choice."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path / "beast"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache_dir()  # torch picks its default, as any earlier compilation in the process does
    compiler.configure_compiler()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "beast")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compiler.configure_compiler()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.parametrize("whose", ["its own", "another update's"])
def test_no_step_runs_while_a_background_compilation_traces(monkeypatch, whose):
    """torch.fx patches nn.Module.__call__ for the whole process while it traces, and
    torch.export raises a process-wide flag: the steps of every update in the process wait
    while a compilation in the background holds the modules (one of a PPO run's eager
    steps, run meanwhile, died in the tracer; a DQN step beside another update's export,
    of KeyError: 'custom'), and go on after it. The window is the hold (an export's,
    `PackagedStep._runner`): the step that started the compilation finishes eagerly
    first, which may be after the thread started."""
    window = []
    runner = package.PackagedStep._runner

    def slow_runner(self, traced):
        with self.holding():
            window.append(time.monotonic())
            time.sleep(0.5)
            built = runner(self, traced)
            window.append(time.monotonic())
        return built

    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(package.PackagedStep, "_runner", slow_runner)
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)
    _, other, _ = build("dqn", CARTPOLE, "off", "--hidden_size", "16")
    watched = update if whose == "its own" else other
    learner_thread = threading.get_ident()
    loss = watched.train_step.loss
    steps = []

    def timed_loss(inputs, kind):
        if watched is other or threading.get_ident() == learner_thread:
            steps.append(time.monotonic())
        return loss(inputs, kind)

    watched.train_step.loss = timed_loss
    compiled = threading.Event()

    def step_the_other() -> None:
        seed = 0
        while not compiled.is_set():
            other(transition_batch(8, seed, continuous=False))
            seed += 1

    stepping = threading.Thread(target=step_the_other)
    stepping.start()
    try:
        step_until_compiled(update)
    finally:
        compiled.set()
        stepping.join()
    assert len(window) == 2 and steps
    assert not [t for t in steps if window[0] <= t <= window[1]]


def test_a_step_waiting_for_a_compilation_gives_up_when_the_run_stops(monkeypatch):
    """A stop never waits for a compilation: the learner's step that waits for one raises
    StepAbandoned once the run's `stopping` is set, having taken no step."""

    runner = package.PackagedStep._runner

    def slow_runner(self, traced):
        time.sleep(3.0)
        return runner(self, traced)

    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(package.PackagedStep, "_runner", slow_runner)
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)
    stopping = threading.Event()
    update.train_step.stopping = stopping
    with pytest.raises(StepAbandoned):
        for seed in range(10):  # the third step starts the compilation, the fourth waits
            taken = update.train_step.steps_taken
            if seed == 3:
                threading.Timer(0.3, stopping.set).start()
                started = time.monotonic()
            update(transition_batch(8, seed, continuous=False))
    assert time.monotonic() - started < 2.0
    assert update.train_step.steps_taken == taken
    for compilation in update.train_step._compilations.values():
        compilation.join()


def test_a_wait_for_a_compilation_is_timed_for_the_progress_line():
    """`waiting_seconds`, which the progress line reports: how long a step has waited for
    a compilation that holds the modules; 0 for a step that waits for none, and once the
    wait is over."""
    modules = ModulesInUse()
    with modules.held():
        assert modules.waiting_seconds() == 0.0
    release, seen = threading.Event(), []

    def compilation() -> None:
        with modules.for_compilation():
            release.wait(5.0)

    modules.compilation_starting()
    holder = threading.Thread(target=compilation)
    holder.start()

    def look_then_release() -> None:
        time.sleep(0.4)
        seen.extend([modules.waiting_seconds(), modules.compilation_holds_them()])
        release.set()

    threading.Thread(target=look_then_release).start()
    with modules.held():
        assert modules.waiting_seconds() == 0.0
        assert not modules.compilation_holds_them()
    holder.join()
    assert 0.3 < seen[0] < 5.0 and seen[1]


def test_a_compilation_thread_is_no_daemon_even_when_a_daemon_starts_it():
    """The interpreter's exit waits for a compilation (the learner's daemon thread starts
    it): a daemon would be ended inside torch's C++, which aborts the process."""
    from beast.train_step.background import compilation_thread

    made = []
    starter = threading.Thread(
        target=lambda: made.append(compilation_thread("test", lambda: None)), daemon=True
    )
    starter.start()
    starter.join()
    assert made and made[0].daemon is False


def test_a_runs_set_up_and_its_checkpoints_wait_while_a_compilation_exports(tmp_path):
    """An export sets a process-wide flag under which torch's seeding and the optimizers'
    state_dict annotate one global dict that the export's tracer swaps: CI saw a run's
    `torch.manual_seed` die of KeyError: 'custom' while an earlier in-process run's
    compilation exported. A run's set-up waits for an earlier run's compilation to end;
    a checkpoint waits while a compilation holds the modules."""
    from beast.run.lifecycle import start_run
    from beast.train_step import MODULES_IN_USE
    from beast.train_step.background import compilation_thread

    ended = []
    earlier = compilation_thread("earlier", lambda: (time.sleep(0.5), ended.append("compile")))
    earlier.start()
    argv = ["--algo", "dqn", "--env", "CartPole-v1", "--num_actors", "1"]
    argv += ["--num_envs_per_actor", "1", "--savedir", str(tmp_path), "--xpid", "x"]
    run, log = start_run(parse_args(argv))
    try:
        assert ended == ["compile"]  # before start_run went on
        holds, release = threading.Event(), threading.Event()

        def exporting() -> None:
            with MODULES_IN_USE.for_compilation():
                holds.set()
                release.wait(10)
                ended.append("export")

        thread = compilation_thread("export", exporting)
        thread.start()
        assert holds.wait(10)
        threading.Timer(0.3, release.set).start()
        assert run.save() is True
        assert ended == ["compile", "export"]  # the checkpoint waited for it
        thread.join()
    finally:
        log.close()
        run.source.close()


def test_auto_tries_a_cheap_compilation_again_that_once_measured_no_faster():
    """A record that says compiled was no faster decides only where compiling costs
    much (a build); where it costs a package's load, the run compiles and measures again
    (its keep-or-revert check stays the judge), so one noisy timing is not forever."""
    slower = auto.StepRecord("s", compile_seconds=0.5, eager=0.010, compiled=0.012)
    assert auto.worth_compiling(0.010, slower, 100_000, "cpu") == (True, "")
    # A load on a busy machine: SAC HalfCheetah's took 2.3 s.
    assert auto.worth_compiling(0.010, slower._replace(compile_seconds=2.3), 100_000, "cpu")[0]
    costly = slower._replace(compile_seconds=30.0)
    worth, reason = auto.worth_compiling(0.010, costly, 100_000, "cpu")
    assert not worth and "would save about -200 s" in reason
    faster = slower._replace(compiled=0.004)
    # 50 steps of 10 ms, 60% faster, save 0.3 s: not the 0.5 s a load costs; 100 do.
    assert auto.worth_compiling(0.010, faster, 50, "cpu")[0] is False
    assert auto.worth_compiling(0.010, faster, 100, "cpu")[0] is True


def test_auto_expects_a_block_of_steps_to_build_for_longer():
    """Before a first build, a call of 4 steps is expected to cost 1.9 times a one-step
    build (`BUILD_SHARE_PER_EXTRA_STEP`): calls that would repay one step's build but
    not the block's stay eager, and say what the block's would cost."""
    unknown = auto.StepRecord("s")
    # 10 ms a call, 60% of it saved (the CPU's assumed ratio): 4 ms a call. 3,000 calls
    # save 12 s: a one-step build's 10 s, not a block's 19 s; 5,000 save 20 s.
    assert auto.worth_compiling(0.010, unknown, 3_000, "cpu", 1)[0] is True
    worth, reason = auto.worth_compiling(0.010, unknown, 3_000, "cpu", 4)
    assert not worth and "compiling costs about 19 s the first time" in reason
    assert auto.worth_compiling(0.010, unknown, 5_000, "cpu", 4)[0] is True
    # Once built, a later run's cost is its record's (a load), whatever the block.
    loaded = unknown._replace(compile_seconds=0.5)
    assert auto.worth_compiling(0.010, loaded, 3_000, "cpu", 4)[0] is True


def test_the_update_settles_only_once_its_compiled_step_is_timed(
    fast_backend, monkeypatch, tmp_path
):
    """The thread tuner changes the thread count once the update settles: not while the
    first compiled steps are timed against the eager ones, which a change would skew."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16")
    states = []
    for seed in range(12):
        update(transition_batch(8, seed, continuous=False))
        states.append((update.train_step.path, update.train_step.settled))
    compiled = [settled for path, settled in states if path == "compiled"]
    assert compiled[: auto.EAGER_PROBES] == [False] * auto.EAGER_PROBES
    assert compiled[-1] is True


def test_the_traces_tanh_is_tanh_to_float32_precision():
    """Traces write float32 tanh as a rational function (package._tanh, for inductor's
    faster kernels): against tanh in float64, within 4e-7 everywhere, relative too
    (tiny values keep their precision), never past 1, NaN kept; float64 keeps tanh."""
    x = torch.cat(
        [
            torch.linspace(-12.0, 12.0, 2_000_001),
            torch.logspace(-30, 0, 1_000),
            -torch.logspace(-30, 0, 1_000),
            torch.tensor([0.0, 8.0, -8.0, 7.9999, 8.0001, 50.0, -50.0, math.inf, -math.inf]),
        ]
    )
    exact = torch.tanh(x.double())
    traced = package._tanh(x)
    error = (traced.double() - exact).abs()
    assert error.max() <= 4e-7
    assert (error / exact.abs().clamp_min(1e-300)).max() <= 4e-7
    assert traced.abs().max() <= 1.0
    assert package._tanh(torch.tensor([math.nan])).isnan().all()
    assert package._tanh(x.double()) is NotImplemented


@pytest.mark.parametrize("faster", [True, False])
@pytest.mark.parametrize("members", [None, 2], ids=["mm", "bmm"])
def test_a_product_the_blas_takes_faster_transposed_is_traced_transposed(
    monkeypatch, faster, members
):
    """A first layer's weight gradient, gᵀ @ x with x of few columns, is what the BLAS
    computes fastest as (xᵀ @ g)ᵀ, for one network or an ensemble's stacked members:
    where the measurement (`package._transposed_faster`, stubbed here) says so, the trace
    takes it that way, contiguous again for the ops that view it, with the same values;
    where not, the trace keeps the product as it was."""
    measured = []
    monkeypatch.setattr(
        package, "_transposed_faster", lambda *layout: measured.append(layout) or faster
    )

    def weight_gradient(g, x):
        return (g.mT @ x).reshape(-1) * 2.0  # a view after the product, as a flat gradient

    batch = () if members is None else (members,)
    g, x = torch.randn(*batch, 256, 64), torch.randn(*batch, 256, 4)
    traced = package.trace(weight_gradient, (g, x))
    target = torch.ops.aten.mm.default if members is None else torch.ops.aten.bmm.default
    (product,) = [n for n in traced.graph.graph.nodes if n.target is target]
    # The product's layouts were measured: gᵀ [64, 256] (column-major) by x [256, 4].
    (layout,) = measured
    assert layout[0] == (*batch, 64, 256) and layout[1][-2:] == (1, 64)
    assert layout[2] == (*batch, 256, 4)
    first = product.args[0]
    assert (first.target is torch.ops.aten.permute.default) is faster
    # The same sums in another order: float32 rounding of 256-term sums of size ~16.
    torch.testing.assert_close(traced.graph(g, x), weight_gradient(g, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "rows, inner, columns, kept",
    [(256, 256, 1, False), (256, 1, 256, False), (1, 256, 4, False), (256, 256, 4, True)],
    ids=["output-layer", "outer-product", "row", "product"],
)
def test_a_batched_product_with_a_dimension_of_one_is_traced_as_products_and_a_sum(
    rows, inner, columns, kept
):
    """An ensemble's product with M, K or N of 1 (its scalar output layer, that layer's
    gradient) is traced as products and a sum (package._bmm), with bmm's and baddbmm's
    values; others stay products."""
    a, b = torch.randn(2, rows, inner), torch.randn(2, inner, columns)
    bias = torch.randn(2, 1, columns)

    def products(a, b, bias):
        return (
            torch.bmm(a, b),
            torch.baddbmm(bias, a, b),
            torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0),
        )

    traced = package.trace(products, (a, b, bias))
    targets = {node.target for node in traced.graph.graph.nodes}
    assert (
        torch.ops.aten.bmm.default in targets or torch.ops.aten.baddbmm.default in targets
    ) is kept
    for got, want in zip(traced.graph(a, b, bias), products(a, b, bias), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_products_are_measured_in_their_own_layouts_even_repeating_ones():
    """The measurement builds operands in the trace's layouts, including an input
    expanded over an ensemble's members (stride 0), which no kernel may write into."""
    gradient = ((2, 64, 256), (64 * 256, 1, 64))  # gᵀ per member, column-major
    for inputs_stride in [(0, 4, 1), (256 * 4, 4, 1)]:  # x expanded, or one per member
        layout = (*gradient, (2, 256, 4), inputs_stride, torch.float32, torch.float32)
        assert package._transposed_faster(*layout) in (True, False)
    assert package._laid_out((0, 4), (4, 1), torch.float32).shape == (0, 4)


def test_a_packages_tensors_are_taken_in_pytrees_order_and_picked_by_shape():
    """A package takes its tensors in the order pytree flattened its arguments at export;
    the step's own walk of them (package._tensors_and_shapes) must give that order, and
    tell a batch of another shape or structure apart."""

    def tensors(*shape):
        return torch.randn(*shape)

    arguments = (
        tensors(3),
        {"b": tensors(2), "a": (tensors(1, 2), [tensors(4), None, 3]), "c": {}},
        (),
        0.5,
    )
    walked, key = package._tensors_and_shapes(arguments)
    leaves = [leaf for leaf in tree_flatten(arguments)[0] if isinstance(leaf, torch.Tensor)]
    assert [id(t) for t in walked] == [id(t) for t in leaves]
    assert package._tensors_and_shapes(copy.deepcopy(arguments))[1] == key
    reshaped = (arguments[0], {**arguments[1], "b": tensors(5)}, *arguments[2:])
    reordered = (arguments[0], dict(reversed(arguments[1].items())), *arguments[2:])
    for other in (reshaped, reordered, arguments[:3]):
        assert package._tensors_and_shapes(other)[1] != key
    # A container of another kind goes through pytree, in the same order.
    point = collections.namedtuple("point", "x y")(tensors(2), tensors(3))
    walked, _ = package._tensors_and_shapes((point, arguments))
    assert [id(t) for t in walked] == [id(point.x), id(point.y), *(id(t) for t in leaves)]
