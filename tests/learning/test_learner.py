"""Contract of beast.learning.learner with a replay: one update (loss, step, priorities,
publishing, target copies, counters), env-step progress, the learning-rate schedule,
the non-finite guard, and the threads' start/finish/stop.

The learner runs R2D2's update (beast.algos.r2d2.SequenceQUpdate) over a sequence
source; a small replay is filled by SequenceBuilders from a random stream. Updates are
called directly where the test is about one update, and through the threads where it
is about their protocol.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from beast.algos.base import LearnerContext
from beast.algos.policies import EpsilonGreedyPolicy
from beast.algos.r2d2 import SequenceQUpdate, r2d2_loss
from beast.experience.contract import Batch
from beast.experience.replay_sink import SequenceSink
from beast.experience.replay_source import ReplaySource
from beast.experience.sequence_replay import PrioritizedReplay, SequenceBuilder, sequence_spec
from beast.fields import box_obs, core_state_shapes
from beast.learning import thread_tuner
from beast.learning.learner import Learner, NonFiniteError, Stepper, TrainingProgress
from beast.learning.thread_tuner import RECORD_FILE, ThreadTuner, others_cpu_seconds, setup_key
from beast.models import build_q_model, copy_weights
from beast.run.parsing import parse_args
from beast.train_step import auto, compiler
from beast.train_step.optim import build_optimizer
from beast.util.records import read_record, write_record

pytestmark = pytest.mark.usefixtures("watchdog")

SEQ_LEN, OVERLAP, BURN_IN, NUM_ACTIONS = 6, 3, 2, 3


def q_model(use_lstm: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_q_model("mlp", (3,), NUM_ACTIONS, use_lstm=use_lstm, hidden_size=8)


def filled_sink(model: torch.nn.Module, min_replay_size: int, seed: int = 0) -> SequenceSink:
    """A sink whose replay holds the sequences of a random stream with episode ends."""
    spec = sequence_spec(
        seq_len=SEQ_LEN,
        obs=box_obs((3,), np.float32),
        record=EpsilonGreedyPolicy(NUM_ACTIONS).record_spec(),
        core_state_shapes=core_state_shapes(model.initial_state(1)),
    )
    sink = SequenceSink(
        PrioritizedReplay(spec, 100),
        num_actors=1,
        seq_len=SEQ_LEN,
        seq_overlap=OVERLAP,
        min_replay_size=min_replay_size,
    )
    builder = SequenceBuilder(spec, SEQ_LEN, OVERLAP)
    rng = np.random.default_rng(seed)
    state = [torch.zeros(s.shape[:1] + s.shape[2:]) for s in model.initial_state(1)]
    for t in range(200):
        done = t == 0 or rng.random() < 0.05
        row = {
            "obs": torch.from_numpy(rng.normal(size=3).astype(np.float32)),
            "reward": float(rng.normal()),
            "done": done,
            "terminated": done and t > 0,
            "truncated": False,
            "last_action": int(rng.integers(NUM_ACTIONS)),
            "action": int(rng.integers(NUM_ACTIONS)),
        }
        sequence = builder.append(row, state)
        if sequence is not None:
            sink.replay.add(sequence)
            sink.inserted[0] += 1
    return sink


def make_learner(
    use_lstm=True,
    *,
    loss_fn=None,
    reward_clipping="none",
    lr_schedule="constant",
    total_steps=1000,
    progress=None,
    target_update_period=3,
    min_replay_size=4,
    max_nonfinite_updates=3,
    compile="off",
    losses: list | None = None,
) -> tuple[Learner, list]:
    """A learner of R2D2's update on a filled replay; with `losses`, every output of its
    loss (a `QLossOutput`: loss, stats and new priorities) is appended there."""
    model, target, actor_model = q_model(use_lstm), q_model(use_lstm), q_model(use_lstm)
    progress = progress or TrainingProgress()
    records: list = []
    stepper = Stepper(
        grad_norm_clipping=40.0,
        max_nonfinite_updates=max_nonfinite_updates,
        lr_schedule=lr_schedule,
        total_steps=total_steps,
        progress=progress,
    )
    context = LearnerContext(torch.device("cpu"), False, stepper, progress, compile=compile)
    loss_fn = loss_fn or functools.partial(
        r2d2_loss, burn_in=BURN_IN, n_step=3, discounting=0.99, truncate_at_end=True
    )
    if losses is not None:
        loss_fn = functools.partial(recorded_loss, loss_fn, losses)
    optimizer_flags = SimpleNamespace(optimizer="adam", learning_rate=1e-3, epsilon=1e-3)
    update = SequenceQUpdate(
        model,
        target,
        context,
        build_optimizer(optimizer_flags, model),
        loss_fn,
        burn_in=BURN_IN,
        target_update_period=target_update_period,
        reward_clipping=reward_clipping,
    )
    sink = filled_sink(model, min_replay_size)
    learner = Learner(
        update=update,
        source=ReplaySource(sink, batch_size=8, device=torch.device("cpu")),
        stepper=stepper,
        progress=progress,
        total_steps=total_steps,
        num_learner_threads=1,
        publish=functools.partial(copy_weights, actor_model, model),
        on_update=records.append,
    )
    learner.actor_model = actor_model  # for the assertions below
    return learner, records


def recorded_loss(loss_fn, losses: list, *args, **kwargs):
    output = loss_fn(*args, **kwargs)
    losses.append(output)
    return output


def assert_tree_holds_the_loss_priorities(learner: Learner, indices, priorities) -> None:
    """The replay's sum tree holds, at each sampled item, max(p, min_priority) ** alpha
    (PER's stored priority, computed here in float64) of the priority p the loss gave
    it. Items drawn twice in one batch are left out: which of their two writes lands is
    the tree's choice."""
    replay = learner.source.replay
    p = priorities.detach().double().clamp(min=replay.min_priority) ** replay.alpha
    once = [i for i, index in enumerate(indices.tolist()) if indices.tolist().count(index) == 1]
    assert once  # a batch of 8 from ~60 sequences draws most once
    # Tolerance: both are float64 powers of the same float32 priorities.
    torch.testing.assert_close(replay.tree.get(indices[once]), p[once], rtol=1e-12, atol=0.0)


def sample(learner: Learner, generator: torch.Generator | None = None) -> Batch:
    drawn = learner.source.replay.sample(8, generator)
    return Batch(drawn.batch, drawn.weights, drawn.indices, drawn.generations)


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("use_lstm", [False, True])
def test_one_update_steps_publishes_and_reprioritises(use_lstm):
    losses = []
    learner, _ = make_learner(use_lstm, losses=losses)
    sink, update = learner.source.sink, learner.update
    sink.env_steps[0] = 123
    sink.record_episode(0, 9.0, 9)
    before = parameters(update.model)
    target_before = parameters(update.target_model)
    batch = sample(learner, torch.Generator().manual_seed(0))
    priorities_before = sink.replay.tree.get(batch.indices).clone()
    with learner.lock:
        stats = learner.step(batch)
    after = parameters(update.model)
    assert not same(before, after)
    assert same(after, parameters(learner.actor_model))  # published
    assert same(target_before, parameters(update.target_model))  # not yet: period 3
    assert not torch.equal(sink.replay.tree.get(batch.indices), priorities_before)
    assert len(losses) == 1  # one loss, whose priorities the replay now holds
    assert_tree_holds_the_loss_priorities(learner, batch.indices, losses[0].priorities)
    assert stats.step == learner.progress.step == 123  # env steps, from the actors
    assert stats.num_updates == 1
    assert stats.episode_returns == [9.0] and stats.episode_steps == [9]
    assert int(sink.sampled[0]) == 8 == stats.losses["sampled_sequences"]
    assert stats.losses["inserted_sequences"] == len(sink.replay)
    assert {"total_loss", "mean_q", "grad_norm", "learning_rate", "replay_fill"} <= set(
        stats.losses
    )


@pytest.mark.parametrize("period", [100, 2])
def test_a_block_of_batches_is_one_update_each_and_one_priority_update(period):
    """--updates_per_sample 3: one sampled block, three updates in turn on its three
    batches in one call (as three separate batches would make them, the target copied
    after the second with period 2), the weights published after the last, every sampled
    item reprioritised, three updates and 24 samples counted."""
    losses = []
    learner, _ = make_learner(target_update_period=period, losses=losses)
    twin, _ = make_learner(target_update_period=period)
    drawn = check_block(learner, twin, same)
    # One loss per batch of the block, their priorities written for the whole block.
    assert len(losses) == 3
    priorities = torch.cat([loss.priorities for loss in losses])
    assert_tree_holds_the_loss_priorities(learner, drawn.indices, priorities)


# Its compilation (aot_eager) takes seconds unloaded and over 30 s beside a busy machine:
# a longer watchdog, or the alarm lands in the compiler and the step falls back to eager.
@pytest.mark.watchdog(300)
def test_a_compiled_block_of_sequences_steps_as_one_at_a_time(monkeypatch):
    """The same with the update compiled (torch's aot_eager backend: the block's traced
    graph on eager kernels), after its eager probes: R2D2's recurrent sequences, burn-in
    and target copy inside the block in one graph, to float tolerance."""
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    learner, _ = make_learner(target_update_period=2, compile="on")
    twin, _ = make_learner(target_update_period=2)
    for _ in range(3):  # the eager probes, then the compiled block
        check_block(learner, twin, close)
    assert learner.update.train_step.path == "compiled"


def close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    return True


def check_block(learner: Learner, twin: Learner, same):
    """`learner` takes a block of 3 batches of 8; `twin` the same batches one by one.
    Returns the block's draw."""
    steps_before = learner.update.train_step.steps_taken
    updates_before = learner.progress.num_updates
    drawn = learner.source.replay.sample(8, torch.Generator().manual_seed(0), parts=3)
    block = Batch(drawn.batch, drawn.weights, drawn.indices, drawn.generations, parts=3)
    parts = block.split()
    assert [p.data["reward"].shape[1] for p in parts] == [8, 8, 8]
    assert torch.equal(parts[1].data["reward"], drawn.batch["reward"][:, 8:16])
    assert torch.equal(parts[2].weights, drawn.weights[16:])
    with learner.lock:
        stats = learner.step(block)
    for part in parts:  # the same updates, one batch at a time
        twin.update(part)
    assert same(parameters(learner.update.model), parameters(twin.update.model))
    assert same(parameters(learner.update.target_model), parameters(twin.update.target_model))
    assert same(parameters(learner.update.model), parameters(learner.actor_model))
    assert learner.update.train_step.steps_taken == steps_before + 3  # in one call
    assert learner.progress.num_updates == updates_before + 3 == learner.update.num_updates
    assert stats.num_updates == learner.progress.num_updates
    assert int(learner.source.sink.sampled[0]) == 8 * learner.update.num_updates
    tree = learner.source.sink.replay.tree
    assert (tree.get(drawn.indices) != 1.0).all()  # every item's new priority written
    return drawn


def test_target_network_is_copied_every_period():
    learner, _ = make_learner(target_update_period=3)
    update = learner.update
    generator = torch.Generator().manual_seed(1)
    for step in range(1, 7):
        target_before = parameters(update.target_model)
        with learner.lock:
            learner.step(sample(learner, generator))
        copied = step % 3 == 0
        assert same(parameters(update.target_model), parameters(update.model)) == copied
        if not copied:
            assert same(parameters(update.target_model), target_before)


def test_the_loss_sees_clipped_rewards_only_when_asked():
    seen = []

    def loss_fn(online_q, target_q, batch, weights):
        seen.append(batch["reward"].abs().max().item())
        return r2d2_loss(
            online_q, target_q, batch, weights, burn_in=BURN_IN, n_step=3, discounting=0.9
        )

    for clipping in ("none", "abs_one"):
        learner, _ = make_learner(loss_fn=loss_fn, reward_clipping=clipping)
        learner.source.replay.tensors["reward"].mul_(10.0)
        with learner.lock:
            learner.step(sample(learner, torch.Generator().manual_seed(0)))
    assert seen[0] > 1.0 and seen[1] <= 1.0


def test_linear_schedule_decays_over_env_steps_and_resume_counts_on():
    learner, _ = make_learner(
        lr_schedule="linear", total_steps=1000, progress=TrainingProgress(step=200)
    )
    learner.source.sink.env_steps[0] = 300  # this run's actors: 200 + 300 = 500 of 1000
    with learner.lock:
        stats = learner.step(sample(learner))
    assert stats.step == 500
    assert stats.losses["learning_rate"] == pytest.approx(1e-3 * (1 - 200 / 1000))
    with learner.lock:
        stats = learner.step(sample(learner))
    # Set before the step from the step count of the previous update: 500 of 1000.
    assert stats.losses["learning_rate"] == pytest.approx(1e-3 * 0.5)


def test_nonfinite_updates_are_skipped_then_stop_the_run():
    def nan_loss(online_q, target_q, batch, weights):
        out = r2d2_loss(
            online_q, target_q, batch, weights, burn_in=BURN_IN, n_step=3, discounting=0.9
        )
        return out._replace(total_loss=out.total_loss * float("nan"))

    learner, _ = make_learner(loss_fn=nan_loss, max_nonfinite_updates=3)
    before = parameters(learner.update.model)
    sampled = int(learner.source.sink.sampled[0])
    for _ in range(2):
        with learner.lock:
            stats = learner.step(sample(learner))
    assert stats.losses["skipped_updates"] == 2 and learner.progress.num_updates == 0
    assert same(before, parameters(learner.update.model))
    # Skipped batches were consumed all the same, for the actors' rate limit.
    assert int(learner.source.sink.sampled[0]) == sampled + 16
    with pytest.raises(NonFiniteError, match="3 consecutive updates"), learner.lock:
        learner.step(sample(learner))


def test_threads_learn_until_the_actors_reach_total_steps():
    learner, records = make_learner(total_steps=1000)
    learner.start()
    try:
        deadline = threading.Event()
        while len(records) < 3 and not deadline.wait(0.05):
            assert learner.error is None
        assert not learner.finished.is_set()
        learner.source.sink.env_steps[0] = 1000
        assert learner.finished.wait(10)
        assert learner.error is None
    finally:
        learner.stop(5)
    assert all(not t.is_alive() for t in learner._threads)
    assert records[-1].num_updates == len(records)
    assert learner.source.status_line() is None  # learning has started


def test_threads_wait_for_min_replay_size_and_still_count_steps():
    learner, records = make_learner(min_replay_size=1000, total_steps=50)
    learner.source.sink.env_steps[0] = 7
    filled = len(learner.source.replay)
    assert learner.source.status_line() == (
        f"filling the replay: {filled} of 1,000 sequences before learning starts, 7 env steps"
    )
    learner.start()
    try:
        assert not learner.finished.wait(0.5)
        learner.source.sink.env_steps[0] = 50  # the actors alone reach total_steps
        assert learner.finished.wait(10)
    finally:
        learner.stop(5)
    assert records == [] and learner.progress.step == 50 and learner.error is None


def test_every_update_reaches_the_thread_tuner_in_threads_or_serially():
    """`Learner.step` itself tells the tuner of each update (the run's agent step, and
    whether the update has settled), so --serial, which calls it from its own loop
    with no learner thread, measures its thread count as a threaded run does."""
    learner, _ = make_learner(False)
    seen = []
    learner.thread_tuner = SimpleNamespace(after_update=lambda *args: seen.append(args))
    learner.source.sink.env_steps[0] = 50
    with learner.lock:
        stats = learner.step(sample(learner, torch.Generator().manual_seed(0)))
    assert seen == [(stats.step, learner.updates_ready())] and stats.step == 50


def test_the_thread_tuner_keeps_the_count_that_ran_the_run_faster():
    """After the warm-up, windows at 1 and 2 threads alternate; the run's agent steps/s in
    each decide, a larger count needing a 5% margin; the choice is set and said once."""
    now = [0.0]
    threads = []
    lines = []
    tuner = ThreadTuner(
        [2, 1],
        lines.append,
        warmup_seconds=5.0,
        window_seconds=2.0,
        rounds=2,
        clock=lambda: now[0],
        set_threads=threads.append,
    )
    step = 0
    # Before the update settles (compiling), nothing is measured.
    tuner.after_update(step, updates_ready=False)
    assert tuner.chosen is None and threads == []
    while tuner.chosen is None:
        now[0] += 0.1
        rate = 1000 if (threads and threads[-1] == 2) else 800  # agent steps per second
        step += int(rate * 0.1)
        tuner.after_update(step, updates_ready=True)
    assert threads[:4] == [1, 2, 1, 2] and threads[-1] == 2 and tuner.chosen == 2
    assert len(lines) == 1 and lines[0].startswith("learner threads: 2 (")
    # A gain under the margin keeps the smaller count.
    close = ThreadTuner(
        [1, 2],
        lines.append,
        warmup_seconds=0.0,
        window_seconds=1.0,
        clock=lambda: now[0],
        set_threads=threads.append,
    )
    while close.chosen is None:
        now[0] += 0.1
        step += 103 if threads[-1:] == [2] else 100
        close.after_update(step, updates_ready=True)
    assert close.chosen == 1


def test_the_thread_tuners_choice_is_remembered_for_the_same_setup(tmp_path, monkeypatch):
    """A measured choice is saved under its setup's key; a run of the same setup (another
    seed) takes it at its first update without measuring windows, and says where it came
    from; another setup (more actors) measures again."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    config = parse_args(["--algo", "dqn", "--env", "CartPole-v1", "--seed", "1"])
    key = setup_key(config, [1, 2])
    now, threads, lines = [0.0], [], []
    first = ThreadTuner(
        [1, 2],
        lines.append,
        record_key=key,
        warmup_seconds=0.0,
        window_seconds=1.0,
        clock=lambda: now[0],
        set_threads=threads.append,
        others_cpu=lambda: 0.0,  # an idle machine: the suite's own load is not the point
    )
    step = 0
    while first.chosen is None:
        now[0] += 0.1
        step += 150 if threads[-1:] == [2] else 100
        first.after_update(step, updates_ready=True)
    assert first.chosen == 2 and lines[-1].endswith("measured in this run; --num_threads fixes it)")

    other_seed = parse_args(["--algo", "dqn", "--env", "CartPole-v1", "--seed", "4"])
    assert setup_key(other_seed, [1, 2]) == key
    threads.clear()
    second = ThreadTuner([1, 2], lines.append, record_key=key, set_threads=threads.append)
    second.after_update(0, updates_ready=False)
    assert second.chosen == 2 and threads == [2]
    assert "earlier run of this setup" in lines[-1] and "1,500 with 2" in lines[-1]

    more_actors = parse_args(["--algo", "dqn", "--env", "CartPole-v1", "--num_actors", "2"])
    assert setup_key(more_actors, [1, 2]) != key
    with monkeypatch.context() as patched:  # another version of beast measures again
        patched.setattr(thread_tuner, "source_digest", lambda: b"beast's code, edited")
        assert setup_key(config, [1, 2]) != key
    fresh = ThreadTuner([1, 2], lines.append, record_key=setup_key(more_actors, [1, 2]))
    fresh.after_update(0, updates_ready=True)
    assert fresh.chosen is None


NOW = 1.8e9  # the wall clock the remembered entries below are judged at


def measure(tuner, threads, now, rates=None):
    """Run `tuner`'s windows to its choice, the run making rates[count] agent steps/s."""
    rates = rates or {1: 100, 2: 150}
    step = 0
    while tuner.chosen is None:
        now[0] += 0.1
        step += int(rates[threads[-1]] * 0.1) if threads else 0
        tuner.after_update(step, updates_ready=True)


@pytest.mark.parametrize(
    "entry, reason",
    [
        # The start-up the issue saw: a window at 2 threads under other work.
        ({"rates": {"1": 134.0, "2": 2.0}}, "its figures are implausible (134 with 1, 2 with 2"),
        ({"rates": {"1": 134.0}}, "its figures are incomplete (134 with 1)"),
        ({"measured_at": NOW - 8 * 86400}, "it was measured 8 days ago"),
        ({"others_share": 0.6}, "other processes used 60% of the machine while it was measured"),
        ({"measured_at": None}, "it was recorded without its time and the machine's load"),
    ],
)
def test_an_unsound_remembered_count_is_measured_again(tmp_path, monkeypatch, entry, reason):
    """A remembered count whose figures are implausible, incomplete, old or measured on
    a busy machine is not kept: the run measures the counts again, says why, and
    remembers its own figures with their time and the machine's load."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    sound = {"threads": 1, "rates": {"1": 134.0, "2": 120.0}}
    sound.update(measured_at=NOW - 3600, others_share=0.05)
    entry = {k: v for k, v in {**sound, **entry}.items() if v is not None}
    write_record(RECORD_FILE, "setup", entry)
    now, threads, lines = [0.0], [], []
    tuner = ThreadTuner(
        [1, 2],
        lines.append,
        record_key="setup",
        warmup_seconds=0.0,
        window_seconds=1.0,
        clock=lambda: now[0],
        set_threads=threads.append,
        others_cpu=lambda: 0.1 * now[0],  # 5% of 2 cores: a quiet machine
        machine_cores=2,
        wall_clock=lambda: NOW,
    )
    measure(tuner, threads, now)
    assert threads[:4] == [1, 2, 1, 2] and tuner.chosen == 2
    assert f"measured in this run (the remembered count was not kept: {reason}" in lines[-1]
    saved = read_record(RECORD_FILE, "setup")
    assert saved["threads"] == 2 and saved["measured_at"] == NOW
    assert saved["others_share"] == pytest.approx(0.05, abs=1e-3)


def test_a_sound_remembered_count_is_kept_and_a_busy_measurement_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    now, threads, lines = [0.0], [], []
    busy = ThreadTuner(
        [1, 2],
        lines.append,
        record_key="setup",
        warmup_seconds=0.0,
        window_seconds=1.0,
        clock=lambda: now[0],
        set_threads=threads.append,
        others_cpu=lambda: 1.5 * now[0],  # other work kept 1.5 of 2 cores busy
        machine_cores=2,
        wall_clock=lambda: NOW,
    )
    measure(busy, threads, now)
    assert lines[-1].endswith(
        "measured in this run, while other processes used 75% of the machine: the next run"
        " measures again; --num_threads fixes it)"
    )
    again = ThreadTuner([1, 2], lines.append, record_key="setup", wall_clock=lambda: NOW)
    again.after_update(0, updates_ready=True)
    assert again.chosen is None  # measures
    write_record(RECORD_FILE, "setup", {**read_record(RECORD_FILE, "setup"), "others_share": 0.1})
    kept = ThreadTuner([1, 2], lines.append, record_key="setup", wall_clock=lambda: NOW + 3600)
    kept.after_update(0, updates_ready=False)
    assert kept.chosen == 2 and "measured in an earlier run of this setup" in lines[-1]


def child_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_others_cpu_seconds_leaves_out_the_run_itself():
    """What this process and its children used is the run's, not the others': counted
    from a process that is not there (no run), the others' time is larger by at least
    what a busy child of this process used."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        spent = child_cpu_seconds(child.pid)
        no_run = others_cpu_seconds(root=2**22 + 1)  # above pid_max's default: no process
        this_run = others_cpu_seconds()
    finally:
        child.kill()
        child.wait()
    assert spent > 0.05  # it ran, however loaded the machine
    # Ticks are 10 ms: the two readings, a few ms apart, differ by the run's time (and
    # the ticks the whole machine spent between them, at most a tick per core).
    assert no_run - this_run >= spent - 0.01 * (os.cpu_count() + 1)


def test_optimizers_import_no_dynamo_until_something_else_does():
    """beast.train_step.optim runs torch.optim's dynamo-disabled functions plainly until dynamo is
    imported (1 s of a run's start otherwise), and as torch would from then on."""
    probe = """
import sys, torch
from types import SimpleNamespace
from beast.train_step.optim import build_optimizer
model = torch.nn.Linear(3, 2)
for name in ("adam", "rmsprop"):
    config = SimpleNamespace(
        optimizer=name, learning_rate=0.01, epsilon=1e-5, alpha=0.99, momentum=0.0
    )
    optimizer = build_optimizer(config, model)
    optimizer.zero_grad()
    optimizer.load_state_dict(optimizer.state_dict())
print("dynamo before a step:", "torch._dynamo" in sys.modules)
model(torch.ones(1, 3)).sum().backward()
optimizer.step()  # torch.optim's step imports dynamo itself
print("dynamo after a step:", "torch._dynamo" in sys.modules)
optimizer.zero_grad()
wrapped = torch.optim.Optimizer.zero_grad.__wrapped__.__dynamo_disable
print("torch's own wrapper now:", type(wrapped).__name__ != "_DynamoDisabledOnceImported")
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "dynamo before a step: False" in done.stdout
    assert "dynamo after a step: True" in done.stdout
    assert "torch's own wrapper now: True" in done.stdout
