"""A call of one kind of step made compiled (beast/train_step/step.py): on CPU traced and
packaged ahead of time (beast/train_step/package.py), or loaded from the packages an
earlier run recorded (known_packages.py); on CUDA torch.compile's. `TrainStep` decides
which, and when; here each is made, from the step's graph function (`StepGraph.step`),
and a compiled call's outputs read back as its steps' results (`call_results`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from beast.train_step import compiler, package
from beast.train_step.background import MODULES_IN_USE
from beast.train_step.build_child import BuildChild
from beast.train_step.flat import Used
from beast.train_step.interface import Kind, ParameterGroup, StepResult, Train, step_trains

__all__ = ["Traced", "call_results", "compile_call", "load_call", "trace_call"]

# A step's graph function (`StepGraph.step`), or a compiled call of it.
Step = Callable[..., tuple[Any, ...]]


class Traced:
    """A call's traces (`trace_call`): each distinct step's function and trace, and for
    each step of the call, which of them it is."""

    def __init__(self) -> None:
        self.functions: list[Callable[..., Any]] = []
        self.traces: list[package.Trace] = []
        self.order: list[int] = []

    def call(
        self, steps: Sequence[Callable[..., Any]], cut: tuple[str, ...] | None
    ) -> Callable[..., Any]:
        """The compiled call: the one step's own, or the steps chained."""
        return steps[0] if len(steps) == 1 else package.ChainedSteps(steps, cut)


def trace_call(
    step: Step,
    trains: Sequence[Train],
    pieces: Sequence[Mapping[str, Any]],
    used: Mapping[Train, Used | None],
    arguments: Callable[[Mapping[str, Any]], tuple[Any, ...]],
) -> Traced:
    """A call traced for its packages: each distinct step of it alone (a block's steps
    that train the same groups share one trace), on its part of the block (`pieces`:
    `package.ChainedSteps` says why not the block's unrolled graph). `trains`: each step's
    groups; `used`: the parameters each `trains` reaches (`Used`; absent: all of them);
    `arguments`: a part's arguments of `step`, copies."""
    traced = Traced()
    first: dict[Train, int] = {}
    for train, piece in zip(trains, pieces, strict=True):
        if train not in first:
            first[train] = len(traced.traces)
            function = functools.partial(step, trains=(train,), used=(used.get(train),), cut=None)
            traced.functions.append(function)
            traced.traces.append(package.trace(function, arguments(piece)))
        traced.order.append(first[train])
    return traced


def compile_call(
    function: Step,
    arguments: tuple[Any, ...],
    traced: Traced | None,
    cut: tuple[str, ...] | None,
    stopping: threading.Event | None,
    child: BuildChild | None,
) -> tuple[Step, float | None]:
    """The call compiled (`arguments`: copies of the state and the batch; the dry run
    that proves the result writes them, never the run's state), and the seconds its
    packages took to build (None: torch.compile's). On CPU the call was `traced` and each
    step is packaged (`package.PackagedStep`; the first build takes `child`, a build's
    child started for it, else stopped here); on CUDA `function` is torch.compile's. The
    steps of every update in the process wait meanwhile (`MODULES_IN_USE`). Raises what
    compiling raised (dynamo and inductor errors, a missing C++ compiler)."""
    try:
        built = None
        if traced is not None:
            packaged = []
            for each, trace in zip(traced.functions, traced.traces, strict=True):
                packaged.append(package.PackagedStep(each, _holding_for_export, stopping))
                packaged[-1].add(trace, child)  # the first build takes the child
                child = None
            compiled = traced.call([packaged[i] for i in traced.order], cut)
            built = sum(each.build_seconds for each in packaged)
        else:
            compiled = torch.compile(
                function,
                backend=compiler.BACKEND,
                fullgraph=True,
                dynamic=False,
                **compiler.lean_guards(),
            )
        with MODULES_IN_USE.for_compilation():
            compiled(*arguments)  # torch.compile's compilation; a package's proof
    finally:
        if child is not None:  # not handed to a build (the package's own stops it)
            child.stop()
    return compiled, built


def load_call(
    step: Step,
    names: Sequence[str],
    trains: Sequence[Train],
    used: Sequence[Used | None],
    pieces: Sequence[Mapping[str, Any]],
    arguments: Callable[[Mapping[str, Any]], tuple[Any, ...]],
    cut: tuple[str, ...] | None,
    stopping: threading.Event | None,
) -> Step:
    """A call of the packages an earlier run built (`names`, each step's), loaded with no
    trace: each step's is `step` over its groups (`trains`) and the parameters it
    reaches (`used`), for its part of the block (`pieces`; `arguments`: a part's arguments
    of `step`)."""
    loaded: dict[str, package.PackagedStep] = {}
    for name, train, piece, used_i in zip(names, trains, pieces, used, strict=True):
        if name not in loaded:
            function = functools.partial(step, trains=(train,), used=(used_i,), cut=None)
            loaded[name] = package.PackagedStep(function, MODULES_IN_USE.for_compilation, stopping)
            loaded[name].add_package(package.package_path(name), arguments(piece))
    steps = [loaded[name] for name in names]
    return steps[0] if len(steps) == 1 else package.ChainedSteps(steps, cut)


def call_results(
    kind: Kind,
    outputs: tuple[Any, ...],
    taus: Sequence[float | None],
    stepper: Any,
    groups: Mapping[str, ParameterGroup],
    move_targets: Callable[[float], None],
) -> list[StepResult]:
    """A compiled call's `outputs` (`StepGraph.step`'s) as its steps' results: each step
    of `kind` recorded by the learner's `stepper` as an eager step is, and the targets
    moved `taus[i]` of the way (`move_targets`) after step i if it was applied."""
    totals, grad_norms, finite, weights_finite, proceed, stats, priorities = outputs
    if not kind:  # forward only
        return [StepResult(False, False, *each) for each in zip(stats, priorities, strict=True)]
    if not bool(proceed[0]):  # (a call of one step: a block's loss has no proceed)
        return [StepResult(False, True, stats[0], priorities[0])]
    # Read from the device once a call, not once a step.
    verdicts = zip(
        finite.tolist(),
        weights_finite.tolist(),
        totals.tolist(),
        grad_norms.tolist(),
        strict=True,
    )
    results = []
    trains = step_trains(kind, len(taus))
    # Each distinct step's optimizers, listed once a call (a block of one kind: once).
    optimizers = {train: [groups[name].optimizer for name in train] for train in set(trains)}
    for i, (tau, train, (finite_i, weights_finite_i, total, norm)) in enumerate(
        zip(taus, trains, verdicts, strict=True)
    ):
        applied = stepper.record(
            finite=finite_i,
            weights_finite=weights_finite_i,
            loss=total,
            grad_norm=norm,
            optimizers=optimizers[train],
        )
        if applied and tau is not None:
            move_targets(tau)
        results.append(StepResult(applied, False, stats[i], priorities[i]))
    return results


@contextlib.contextmanager
def _holding_for_export() -> Iterator[None]:
    """The modules held for a trace's export (beast/train_step/package.py, a graph its
    own file cannot hold), which patches torch.nn.Module process-wide: the learner's next
    step waits until the export holds them (Python's locks are not fair: it could take
    them back at every step)."""
    MODULES_IN_USE.compilation_starting()
    with MODULES_IN_USE.for_compilation():
        yield
