"""beast.train_step's compilation beside the run: the trace in the learner's step and the
build in a thread beside it, no step while a trace runs, waits that give up when the run
stops, and --compile auto's decisions (beast/train_step/auto.py): compile only where the
run is long enough, give way to a faster eager step, try a cheap compilation again.
"""

from __future__ import annotations

import threading
import time

import pytest

from beast.run.parsing import parse_args
from beast.train_step import (
    StepAbandoned,
    auto,
    compiler,
    package,
)
from beast.train_step.background import ModulesInUse
from tests.support.train_steps import (
    CARTPOLE,
    build,
    rollout_batch,
    step_until_compiled,
    transition_batch,
)


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


def test_auto_compiles_only_where_the_run_is_long_enough(monkeypatch, tmp_path):
    """--compile auto weighs the steps left against the cost of compiling: a short run
    stays eager (and says why, once), a long one compiles."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    for expected, path in ((20, "eager"), (10**9, "compiled")):
        _, update, _ = build("dqn", CARTPOLE, "auto", "--hidden_size", "16")
        logged = []
        update.train_step.log = logged.append
        update.train_step.decision.expected_steps = expected
        for seed in range(8):
            update(transition_batch(32, seed, continuous=False))
        assert update.train_step.path == path
        assert len(logged) == 1
        if path == "eager":
            assert "compiling costs about" in logged[0] and "--compile on" in logged[0]


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
    released = threading.Event()

    def held_runner(self, traced):
        # The compilation holds the modules (as an export does, or CUDA's torch.compile:
        # a CPU package's build does not) and ends only when the test lets it: a step that
        # waited for it would not return before `released` (60 s: a bound that fails,
        # never hangs, a step that waits).
        with self.holding():
            released.wait(60)
        return runner(self, traced)

    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(package.PackagedStep, "_runner", held_runner)
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)
    stopping = threading.Event()
    update.train_step.stopping = stopping
    with pytest.raises(StepAbandoned):
        for seed in range(10):  # the third step starts the compilation, the fourth waits
            taken = update.train_step.steps_taken
            if seed == 3:
                threading.Timer(0.3, stopping.set).start()
            update(transition_batch(8, seed, continuous=False))
    # The step gave up while the compilation was still held: it did not wait for it.
    compilations = list(update.train_step._compilations.values())
    assert compilations and all(compilation.is_alive() for compilation in compilations)
    assert not released.is_set()
    assert update.train_step.steps_taken == taken
    released.set()
    for compilation in compilations:
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
            release.wait(60)  # a bound that fails, never hangs, a test whose look never comes

    modules.compilation_starting()
    holder = threading.Thread(target=compilation)
    holder.start()

    def look_then_release() -> None:
        # Once the step below is seen waiting (polled; 30 s bounds a wait never seen), two
        # looks a moment apart: the wait grows while it lasts.
        deadline = time.monotonic() + 30
        while modules.waiting_seconds() == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        first = modules.waiting_seconds()
        time.sleep(0.1)
        second, holds = modules.waiting_seconds(), modules.compilation_holds_them()
        seen.extend([first, second, holds, time.monotonic()])
        release.set()

    before = time.monotonic()  # before the step starts waiting
    threading.Thread(target=look_then_release).start()
    with modules.held():
        assert modules.waiting_seconds() == 0.0
        assert not modules.compilation_holds_them()
    holder.join()
    first, second, holds, looked = seen
    # Order, not speed: the wait was seen, grew, and is no longer than the test so far.
    assert 0.0 < first < second <= looked - before and holds


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
    build on CUDA, where the block is one unrolled graph (`BUILD_SHARE_PER_EXTRA_STEP`):
    calls that would repay one step's build but not the block's stay eager, and say what
    the block's would cost. On CPU a block's steps are one step's package called once
    each (package.ChainedSteps): a one-step build."""
    unknown = auto.StepRecord("s")
    # 10 ms a call, 70% of it saved (CUDA's assumed ratio): 7 ms a call. 16,000 calls
    # save 112 s: a one-step build's 60 s, not a block's 114 s; 17,000 save 119 s.
    assert auto.worth_compiling(0.010, unknown, 16_000, "cuda", 1)[0] is True
    worth, reason = auto.worth_compiling(0.010, unknown, 16_000, "cuda", 4)
    assert not worth and "compiling costs about 114 s the first time" in reason
    assert auto.worth_compiling(0.010, unknown, 17_000, "cuda", 4)[0] is True
    # On CPU (60% kept: 4 ms a call saved), 3,000 calls save 12 s, a build's 10 s.
    assert auto.worth_compiling(0.010, unknown, 3_000, "cpu", 4)[0] is True
    assert auto.worth_compiling(0.010, unknown, 2_000, "cpu", 4)[0] is False
    # Once built, a later run's cost is its record's (a load), whatever the block.
    loaded = unknown._replace(compile_seconds=0.5)
    assert auto.worth_compiling(0.010, loaded, 3_000, "cuda", 4)[0] is True


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
