"""What a run says about its update's path (issue 43, item 3): the start-up line's plan
(`TrainStep.plan`), the line a build in the background starts with, and the progress
line's mark of the build and of the switch to the compiled step (`progress_note`,
beast/outputs/logs.py `RunLog.progress_line`)."""

from __future__ import annotations

import io
import os
import re
import threading

import torch
from torch import nn

from beast.outputs.logs import RunLog
from beast.train_step import auto, package
from beast.util.records import read_record
from tests.support.train_steps import CARTPOLE, build, step_until_compiled, transition_batch

PLAN_OF_A_BUILD = (
    "the update eager for its first steps, then compiling it in the background"
    " (about {seconds} s {source}; eager until then)"
)


def test_the_plan_says_eager_under_compile_off():
    _, update, _ = build("dqn", CARTPOLE, "off", "--hidden_size", "16")
    assert update.train_step.plan() == "the update eager (--compile off)"


def test_a_first_build_is_planned_with_the_prior_and_auto_says_its_condition(monkeypatch, tmp_path):
    """No build on this machine yet: the estimate is the prior (`FIRST_BUILD_SECONDS`);
    under --compile auto the build is conditional on the steps left."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    planned = PLAN_OF_A_BUILD.format(seconds=20, source="from a prior")
    for mode, plan in (("on", planned), ("auto", f"{planned} if the steps left pay for it")):
        _, update, _ = build("dqn", CARTPOLE, mode, "--hidden_size", "16", identity="run")
        assert update.train_step.plan() == plan


def test_the_estimate_is_the_median_of_past_builds(monkeypatch, tmp_path):
    """Past builds on this machine, of any step, give the estimate: their median."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    for seconds in (12.0, 30.0, 14.0):
        auto.BuildHistory.add(auto.BuildClass("cpu"), seconds)
    assert auto.BuildHistory.estimate(auto.BuildClass("cpu")) == (14.0, "from past builds")
    _, update, _ = build("dqn", CARTPOLE, "on", "--hidden_size", "16")
    assert update.train_step.plan() == PLAN_OF_A_BUILD.format(seconds=14, source="from past builds")


def test_recurrent_steps_keep_a_history_of_their_own(monkeypatch, tmp_path):
    """A recurrent core's unrolled steps build several times longer (R2D2's Pong update:
    146 s where the feed-forward ones took 16-25): its estimate is neither the
    feed-forward steps' median nor moves it."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    feed_forward = auto.BuildClass.of(torch.device("cpu"), [nn.Conv2d(4, 8, 3), nn.Linear(8, 2)])
    recurrent = auto.BuildClass.of(torch.device("cpu"), [nn.Conv2d(4, 8, 3), nn.LSTM(8, 8)])
    assert (feed_forward, recurrent) == (
        auto.BuildClass("cpu convolutions"),
        auto.BuildClass("cpu convolutions", recurrent=True),
    )
    prior = auto.FIRST_BUILD_SECONDS["cpu convolutions"] * auto.RECURRENT_BUILD_FACTOR
    assert auto.BuildHistory.estimate(recurrent) == (prior, "from a prior")
    auto.BuildHistory.add(feed_forward, 19.0)
    assert auto.BuildHistory.estimate(recurrent) == (prior, "from a prior")
    auto.BuildHistory.add(recurrent, 146.0)
    assert auto.BuildHistory.estimate(recurrent) == (146.0, "from past builds")
    assert auto.BuildHistory.estimate(feed_forward) == (19.0, "from past builds")


def test_a_setup_whose_packages_exist_plans_to_load_them(fast_backend, monkeypatch, tmp_path):
    """A run of the same setup (identity and code) as one that packaged its step says at
    start-up that the update runs compiled from that package; while a package of it is
    missing, that it builds one."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    flags = ("--hidden_size", "16")
    _, first, _ = build("dqn", CARTPOLE, "on", *flags, identity="run", background=True)
    step_until_compiled(first)
    # The tests' backend writes no package file: the record names them all the same.
    names = read_record("beast_setups.json", first.train_step.known_packages.setup_key())[
        "packages"
    ]
    assert names and not any(os.path.exists(package.package_path(n)) for n in names)
    _, second, _ = build("dqn", CARTPOLE, "on", *flags, identity="run")
    assert second.train_step.plan().startswith("the update eager for its first steps")
    os.makedirs(os.path.join(tmp_path, "steps"), exist_ok=True)
    for name in names:
        open(package.package_path(name), "wb").close()
    _, third, _ = build("dqn", CARTPOLE, "on", *flags, identity="run")
    assert third.train_step.plan() == "the update compiled from its package of an earlier run"
    _, other, _ = build("dqn", CARTPOLE, "on", *flags, identity="another run")
    assert other.train_step.plan().startswith("the update eager for its first steps")


def test_a_build_is_said_at_once_and_the_progress_line_marks_the_switch(
    fast_backend, monkeypatch, tmp_path
):
    """The moment a build starts in the background the log says so, with its estimate;
    while it runs the progress line counts its seconds; the first progress line after the
    compiled step took over says at which step, once."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    runner = package.PackagedStep._runner
    released = threading.Event()

    def held_runner(self, traced):  # a build that ends when the test says
        released.wait(60)  # a bound that fails, never hangs
        return runner(self, traced)

    monkeypatch.setattr(package.PackagedStep, "_runner", held_runner)
    _, update, progress = build("dqn", CARTPOLE, "on", "--hidden_size", "16", background=True)
    step = update.train_step
    seed = 0
    while not step._compilations:
        update(transition_batch(8, seed, continuous=False))
        seed += 1
        assert seed < 10, update.log_lines
    assert update.log_lines == [
        "compiling the update in the background (about 20 s from a prior); eager until then"
    ]
    assert re.fullmatch(r"update eager, compiling \(\d+ s of about 20\)", step.progress_note())
    update(transition_batch(8, seed, continuous=False))  # eager meanwhile
    assert step.path == "eager"
    released.set()
    progress.step = 1234
    step_until_compiled(update)
    assert re.fullmatch(r"update compiled at step 1,234 \(built in \d+ s\)", step.progress_note())
    assert step.progress_note() is None  # said once
    # The build's seconds are the next estimate.
    assert auto.BuildHistory.estimate(auto.BuildClass("cpu"))[1] == "from past builds"


def test_the_progress_line_ends_with_the_note(tmp_path):
    stream = io.StringIO()
    log = RunLog(str(tmp_path), {}, 1000, stream=stream, live=False, tensorboard=False)
    try:
        log.report_progress("update compiled at step 500 (built in 14 s)")
        log.report_progress()
    finally:
        log.close()
    first, second = stream.getvalue().splitlines()
    assert first.startswith("[beast] step 0/1,000")
    assert first.endswith(" | update compiled at step 500 (built in 14 s)")
    assert "update compiled" not in second
