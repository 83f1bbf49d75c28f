"""A cold build made cheaper (issue 43, item 3): the trace handed to the build's child as
its own graph (beast/train_step/graph_file.py), each distinct step of a block its own
package (`package.ChainedSteps`, whose parity the block tests of test_train_step.py
check), and the child started with the run where a build is coming."""

from __future__ import annotations

import operator
import pickletools
import subprocess
import sys
import time

import pytest
import torch

from beast.train_step import auto, graph_file, package
from beast.train_step.graph import copied
from tests.support.train_steps import CARTPOLE, build, transition_batch


def _step(state: torch.Tensor, inputs: dict[str, torch.Tensor], scale: float):
    """A small step as the trace sees one: nested arguments, an in-place write of an
    input, a constant tensor, a tuple output with a list in it."""
    bounds = torch.tensor([-1.0, 1.0])
    x = torch.tanh(inputs["x"] @ state) * scale
    low, high = torch.unbind(bounds)
    new = (state + x.mean(0)).clamp(low, high)
    state.copy_(new)
    values, indices = torch.max(x, dim=1)
    return new.sum(), [values, indices]


def _arguments() -> tuple:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 3, generator=g), {"x": torch.randn(5, 3, generator=g)}, 0.5)


def test_a_written_graph_reads_back_and_computes_what_the_trace_does():
    traced = package.trace(_step, _arguments())
    module, arguments = graph_file.loads(graph_file.dumps(traced.graph, traced.arguments))
    targets = {node.target for node in module.graph.nodes if node.op == "call_function"}
    assert operator.getitem in targets and torch.ops.aten.mm.default in targets
    # The read graph takes the flat inputs (each leaf, as inductor passes them); its
    # specs give the call's structure back.
    expected_state, got_state = copied(_arguments()), copied(_arguments())
    expected = traced.graph(*expected_state)
    flat = torch.utils._pytree.tree_flatten((got_state, {}))[0]
    got = torch.utils._pytree.tree_unflatten(module(*flat), module._out_spec)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_state[0], expected_state[0])  # the in-place write
    assert torch.utils._pytree.tree_flatten((arguments, {}))[1] == module._in_spec


def test_a_graph_of_a_target_it_cannot_name_is_refused():
    def local_function(x):  # a target no import reaches: the export's way instead
        return x + 1

    traced = package.trace(lambda x: (x * 2.0,), (torch.ones(3),))
    node = next(n for n in traced.graph.graph.nodes if n.op == "call_function")
    node.target = local_function
    with pytest.raises(graph_file.Unwritable):
        graph_file.dumps(traced.graph, traced.arguments)


_SCRIPT_THAT_IMPORTS_MULTIPROCESSING_FIRST = """
import multiprocessing  # registers this module as __mp_main__, before torch's modules
import sys

import torch

from beast.train_step import graph_file, package

def step(x):
    return (torch.zeros_like(x) + x.clone(memory_format=torch.contiguous_format),
            torch.ones(2, dtype=torch.bfloat16, layout=torch.strided))

traced = package.trace(step, (torch.ones(3),))
with open(sys.argv[1], "wb") as file:
    file.write(graph_file.dumps(traced.graph, traced.arguments))
"""


def test_a_graph_names_torchs_constants_whatever_the_main_module_holds(tmp_path):
    """A script that imports multiprocessing before torch and holds `torch` itself: its
    graph's memory formats were written as constants of `__mp_main__`, a module the
    build's child resolves to its own main, so every build of such a script failed."""
    written = tmp_path / "graph"
    subprocess.run(
        [sys.executable, "-c", _SCRIPT_THAT_IMPORTS_MULTIPROCESSING_FIRST, str(written)],
        check=True,
        timeout=120,
    )
    data = written.read_bytes()
    modules = {
        argument
        for opcode, argument, _ in pickletools.genops(data)
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE") and "main" in argument
    }
    assert modules == set()
    module, arguments = graph_file.loads(data)
    kwargs = [node.kwargs for node in module.graph.nodes if node.op == "call_function"]
    assert {"memory_format": torch.contiguous_format} in [
        {k: v for k, v in each.items() if k == "memory_format"} for each in kwargs
    ]
    got = module(*arguments)
    torch.testing.assert_close(got[0], torch.ones(3))
    assert got[1].dtype == torch.bfloat16 and got[1].layout == torch.strided


def test_copies_keep_a_views_strides():
    """A block's part is a strided view (`split_block` cuts dim 1); a package runs its
    inputs laid out as traced, so the copies a trace or a dry run takes keep them."""
    block = torch.arange(24.0).view(2, 12)
    part = block[:, 4:8]
    copy = copied({"part": part})["part"]
    assert copy.stride() == part.stride() and not copy.is_contiguous()
    torch.testing.assert_close(copy, part)
    assert copy.data_ptr() != part.data_ptr()


def _run_learner(mode: str, monkeypatch, tmp_path, **flags):
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(tmp_path))
    _, update, _ = build(
        "dqn", CARTPOLE, mode, "--hidden_size", "16", background=True, identity="run"
    )
    return update


def test_a_runs_learner_starts_its_builds_child_with_the_run(monkeypatch, tmp_path):
    """--compile on, a setup no run packaged: the child starts with the learner's update,
    so that its imports run during the run's start; it is the build's child later."""
    update = _run_learner("on", monkeypatch, tmp_path)
    child = update.train_step._spare_child.child
    assert child is not None and child.waiting()
    assert update.train_step._early_build_child() is child
    assert update.train_step._spare_child.child is None
    child.stop()


def test_no_child_for_a_short_auto_run_and_none_left_by_an_eager_decision(monkeypatch, tmp_path):
    """--compile auto starts the child only for a run long enough to compile; one whose
    update then decides to stay eager stops it."""
    update = _run_learner("auto", monkeypatch, tmp_path)
    assert update.train_step.decision.expected_steps is None  # (no length: no child)
    assert update.train_step._spare_child.child is None
    monkeypatch.setattr(auto, "worth_compiling", lambda *args: (False, "too short"))
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
    step = update.train_step
    step.decision.expected_steps = 10**6
    assert step._child_with_the_run()
    step._spare_child.start(step)
    child = step._spare_child.child
    assert child is not None
    for seed in range(4):
        update(transition_batch(8, seed, continuous=False))
    assert step.path == "eager" and step._spare_child.child is None
    deadline = time.monotonic() + 30.0  # stopped: ended by a signal at once
    while child.waiting() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.waiting()
