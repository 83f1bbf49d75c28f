"""A run's start-up line says which path its update takes, a build in the background is
said the moment it starts, and a progress line marks the switch to the compiled step
(issue 43, item 3; beast/run/lifecycle.py, beast/train_step `TrainStep.plan`)."""

from __future__ import annotations

import re

from beast.train_step import auto, compiler
from tests.support.in_process import run_monobeast


def _run(tmp_path, *flags: str) -> list[str]:
    result = run_monobeast(
        ["--algo", "dqn", "--env", "CartPole-v1", "--savedir", str(tmp_path), "--xpid", "run"]
        + ["--hidden_size", "16", *flags]
    )
    assert result.returncode in (0, None), result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout.splitlines()


def test_the_start_up_line_says_the_update_runs_eagerly_under_compile_off(tmp_path):
    lines = _run(tmp_path, "--total_steps", "1500", "--compile", "off")
    start = next(line for line in lines if line.startswith("[beast] run run in "))
    assert ", the update eager (--compile off);" in start


def test_a_compiling_run_says_so_at_start_up_and_marks_the_switch(monkeypatch, tmp_path):
    """--compile on with the tests' backend (the trace run on eager kernels, no C++): the
    start-up line plans the build, the build's start is said with its estimate, and a
    progress line says at which step the compiled update took over."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    lines = _run(
        tmp_path,
        *("--total_steps", "12000", "--compile", "on", "--log_interval", "0.1"),
        *("--learning_starts", "500", "--num_threads", "1"),
    )
    start = next(line for line in lines if line.startswith("[beast] run run in "))
    assert (
        ", the update eager for its first steps, then compiling it in the background"
        " (about 20 s from a prior; eager until then);"
    ) in start
    said = lines.index(
        "[beast] compiling the update in the background (about 20 s from a prior); eager until then"
    )
    switched = [
        i for i, line in enumerate(lines) if re.search(r" \| update compiled at step [\d,]+ ", line)
    ]
    assert len(switched) == 1 and switched[0] > said, lines
    assert lines[switched[0]].startswith("[beast] step ")
