"""beast.train_step's inductor packages on CPU: a compiled step built, kept and loaded by a
later run from its first step, a failed build said once, and the compile cache
(beast/util/records.py) kept clean: what earlier builds left is removed, a build stops
with its run, a run that dies mid-build leaves nothing behind.
"""

from __future__ import annotations

import collections
import copy
import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from beast.train_step import (
    ParameterGroup,
    auto,
    build_child,
    compiler,
    package,
)
from beast.train_step.flat import Layout, used_from_reached, used_parameters
from tests.support.runs import processes_with_marker, wait_until_gone
from tests.support.train_steps import (
    CARTPOLE,
    assert_same_steps,
    build,
    pair,
    step_until_compiled,
    transition_batch,
)


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

    assert build_child._remove_build_leftovers(str(tmp_path), now) == 1
    left = {entry.name for entry in tmp_path.iterdir()}
    assert old_build not in left
    kept = {recent_build, recent_inside, renamed_inside, not_a_build, probe, packages}
    assert left == {*kept, short_name}
    assert build_child._remove_build_leftovers(str(tmp_path), now + 3600) == 3


def test_a_package_build_under_way_stops_with_the_run(monkeypatch, tmp_path):
    """A package builds in a child process beside the run; a run that stops stops it
    (no process left behind) and the build says so with `BuildStopped`, no error."""
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    children = []
    popen = subprocess.Popen

    def endless_build(argv, **kwargs):  # a build that would outlast the run
        children.append(popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return children[-1]

    monkeypatch.setattr(build_child.subprocess, "Popen", endless_build)
    traced = package.trace(lambda x: (x * 2.0,), (torch.ones(3),))
    stopping = threading.Event()
    threading.Timer(0.5, stopping.set).start()
    with pytest.raises(build_child.BuildStopped):
        traced.build(traced.export(), stopping)
    # Stopped, not waited for: the 60 s child ended by a signal, not of its own.
    assert len(children) == 1 and children[0].poll() is not None
    assert children[0].returncode < 0
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
    # Gone in 0.03-0.1 s here. Before, a child went on importing torch (1.3 s here, more
    # on a busy machine) and then through the interpreter's exit (1 s); a compiling one
    # went on compiling (12-14 s here from its first compiler to the package). The
    # compiling child's stop is a Python handler, run when its main thread is next
    # scheduled: on a machine busy with a parallel suite, allow it seconds.
    assert wait_until_gone(marker, timeout={"importing": 1.0, "compiling": 5.0}[stage]) == []
    # Its build's scratch directory: removed by the child's stop (compiling), or by the
    # next build's start (importing: the kernel's signal ended the child before it had a
    # handler).
    build_child.BuildChild().stop()
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"beast-step-{run.pid}-*")) == []


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
