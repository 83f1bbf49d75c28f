"""Compiled steps as ahead-of-time packages (beast/train_step/__init__.py), the CPU path.

torch.compile re-traces a step's Python with dynamo in every run, cached graphs or not:
loading a PPO CartPole step from inductor's caches took 5 s of a 16 s race, and a DQN
step's as long. Here the step is traced once per run at the operator level instead
(`make_fx` over fake tensors: 0.3 s, no kernel runs), the trace's code names the
package, and a package already built is a shared library loaded in milliseconds
(AOTInductor). A new one is compiled by inductor from the trace itself (graph_file.py)
into the same fused C++ kernels torch.compile makes, in a child process
(build_child.py) while the learner goes on eagerly, then kept in
`compile_cache_dir()/steps` for every later run whose step traces the same. A block of
steps is each distinct step's package called in turn (`ChainedSteps`), not one graph of
the steps unrolled, which took twice as long to build and ran no faster.

The package's name is a hash of everything its code depends on: the traced graph's
code, the values of the constants the trace kept, every input's shape, dtype and
strides, torch's version and the CPU's instruction set. So a changed loss, model,
hyperparameter (they are constants of the graph) or batch shape is a new package, never
a stale one. What the trace treats as constant is documented in `StepGraph`: every
parameter and buffer of the modules is an input, read at each step.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_loads

from beast.train_step import compiler, graph_file, rewrites
from beast.train_step.build_child import BuildChild
from beast.train_step.compiler import inductor_patch
from beast.train_step.graph import copied
from beast.train_step.interface import split_block
from beast.util.graph_capture import capturing_graph
from beast.util.records import compile_cache_dir, source_digest

__all__ = [
    "ChainedSteps",
    "PackagedStep",
    "Trace",
    "known_step_key",
    "load_package",
    "loads_only",
    "package_path",
    "trace",
]

# Bumped when what a package holds or how it is called changes.
_FORMAT = 1


class Trace:
    """A step traced at the operator level, and where its package is (or will be)."""

    def __init__(self, graph: torch.fx.GraphModule, arguments: tuple[Any, ...]) -> None:
        self.graph = graph
        self.arguments = arguments
        self.path = package_path(f"{_key(graph, arguments)}.pt2")

    @property
    def built(self) -> bool:
        """Whether an earlier run (or this one) built this step's package."""
        return os.path.exists(self.path)

    def export(self) -> Any:
        """The trace as an ExportedProgram, what a package is built from (an
        operator-level re-trace: under a second; it patches torch.nn.Module for the
        whole process while it runs)."""
        return torch.export.export(self.graph, self.arguments, strict=False)

    def build(
        self,
        program: Any = None,
        stopping: threading.Event | None = None,
        child: BuildChild | None = None,
    ) -> None:
        """Compile this trace into its package (inductor's kernels and their C++ wrapper in
        one shared library: seconds to tens of seconds) in a process of its own, so that
        nothing in this one waits for it but what needs the package (the learner's steps
        go on eagerly meanwhile). `program`: what the child compiles, by default the
        trace's graph itself (beast/train_step/graph_file.py), or an ExportedProgram
        (`export`). `child`: a `build_child.BuildChild` started earlier (its imports then
        ran beside the trace), else one started here. RuntimeError, with the child's last
        line, if it failed; `build_child.BuildStopped` if `stopping` was set first (the
        child is stopped too, as it is when the thread that started it ends: the kernel
        signals it, from the child's first line on, `beast.util.parent_death`)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if program is None:
            program = self.graph_file()
        child = child if child is not None else BuildChild()
        try:
            if isinstance(program, bytes):
                name = os.path.join(child.scratch, "step.graph")
                with open(name, "wb") as file:
                    file.write(program)
            else:
                name = os.path.join(child.scratch, "program.pt2")
                torch.export.save(program, name)
            child.finish(name, self.path, stopping)
        finally:
            child.stop()

    def graph_file(self) -> Any:
        """What a build compiles: the trace's graph as bytes (graph_file.py: 0.02 s), or,
        for a graph that module does not write, the ExportedProgram (`export`)."""
        try:
            return graph_file.dumps(self.graph, self.arguments)
        except graph_file.Unwritable:
            return self.export()

    def load(self) -> Runner:
        """The built package (`load_package`)."""
        return load_package(self.path)


def load_package(path: str) -> Runner:
    """The package at `path`, called with the step's arguments and their tensors
    (`Runner`). One caller at a time (a step holds the lock), so no locking around each
    call.

    The package's loader is made directly (7 ms), not through
    `torch._inductor.aoti_load_package`, whose Python first imports inductor's code cache
    (0.4 s of a PPO CartPole run's start, on the learner's thread) only to warn where the
    package was built on another machine; its name already holds the instruction set and
    torch's version. A torch whose loader takes other arguments goes that way, told not to
    probe the CPU's vector instructions (it compiles and loads a probe for each, in child
    processes: 1.2 s here)."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, -1)
    except (AttributeError, TypeError):
        with inductor_patch(**{"cpp.vec_isa_ok": True}):
            loader = torch._inductor.aoti_load_package(path, run_single_threaded=True).loader
    out_spec = treespec_loads(loader.get_call_spec()[1])

    def run(arguments: Any, tensors: list[Tensor]) -> Any:
        # The kernels' OpenMP regions take this thread's OpenMP count, which in a thread
        # started after torch.set_num_threads is still the core count: a learner thread
        # on one torch thread ran its package on two, beside the actors (AtariNet's
        # 8 x 80 Pong run: 1,372-1,397 agent steps/s, against 1,767 eager). torch's
        # count, set again here (0.2 us), is the thread's.
        torch.set_num_threads(torch.get_num_threads())
        return tree_unflatten(loader.boxed_run(tensors), out_spec)

    return run


def package_path(name: str) -> str:
    """Where the package called `name` is kept."""
    return os.path.join(compile_cache_dir(), "steps", name)


def known_step_key(identity: str, arguments: tuple[Any, ...]) -> str:
    """What names a step's package before it is traced: `identity` (everything its graph
    is made from besides beast's code and the arguments: the run's settings, the env's
    spaces, the step's kind, modules and optimizers; beast/train_step/step.py), beast's
    code (every source file of the package), torch's version, the CPU's instruction set,
    and the arguments' structure, shapes, dtypes, strides and devices. A step whose key
    an earlier run recorded is that run's package, loaded without a trace (which, with the
    import of dynamo it needs, is 1.5 s of a run's start); any change to any of these is
    another key, and the step is traced as before."""
    digest = hashlib.sha256()
    digest.update(repr((_FORMAT, torch.__version__, _instruction_set(), identity)).encode())
    digest.update(source_digest())
    tensors, structure = _tensors_and_shapes(arguments)
    digest.update(repr(structure).encode())
    digest.update(repr([(t.stride(), t.device) for t in tensors]).encode())
    return digest.hexdigest()[:32]


def loads_only(traced: Trace | Sequence[Trace] | None) -> bool:
    """Whether compiling `traced` (a trace, or each step's of a call: `ChainedSteps`) is
    only loading packages: an earlier run built them, and the backend is inductor's (the
    tests' eager backend runs the trace itself)."""
    if traced is None or compiler.BACKEND == "aot_eager":
        return False
    traces = [traced] if isinstance(traced, Trace) else list(traced)
    return bool(traces) and all(each.built for each in traces)


def trace(function: Callable[..., Any], arguments: tuple[Any, ...]) -> Trace:
    """`function(*arguments)` traced over fake tensors of the same shapes (no kernel
    runs, nothing is written), with `capturing()` set for the models it calls. While it
    runs, the modules the function calls through torch.func.functional_call hold fake
    tensors in place of their own: call it where no other thread reads them (the
    learner's thread, in its step, holding the lock a checkpoint takes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with capturing_graph():
        # Tensors the loss holds outside its modules (an action space's bounds) are
        # constants of the graph, as torch.compile makes them.
        graph = make_fx(
            function,
            decomposition_table=rewrites.DECOMPOSITIONS,
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*arguments)
    rewrites.transpose_slow_products(graph)
    return Trace(graph, arguments)


# A loaded step: called with the step's arguments and the tensors among their leaves,
# flattened once by the caller. The package's own `__call__` parses its call specs from
# JSON and flattens the arguments again at every call, after the caller flattened them to
# find the package for their shapes: 38-40 us a call, of PPO CartPole's 0.5 ms kernels.
Runner = Callable[[tuple[Any, ...], list[Tensor]], Any]


class PackagedStep:
    """A step compiled ahead of time, called with the step's arguments. Each package
    holds one shape of batch: a batch of another shape gets its own (traced, and loaded
    or built, in the calling thread, as torch.compile recompiles), never one read past
    its end. The first comes from `add` (a trace) or `add_package` (a package known
    from an earlier run).

    Args:
        function: the step's function.
        holding: held while a trace is exported (which patches torch.nn.Module for the
            whole process).
        stopping: set when the run stops: a build under way then stops
            (`build_child.BuildStopped`).
    """

    def __init__(
        self,
        function: Callable[..., Any],
        holding: Callable[[], AbstractContextManager[Any]],
        stopping: threading.Event | None = None,
    ) -> None:
        self.function = function
        self.holding = holding
        self.stopping = stopping
        # Spent exporting and building packages: what a later run, loading them, skips.
        self.build_seconds = 0.0
        self._runners: dict[Any, Runner] = {}
        # A build's child started for the next build (`add`), or None.
        self._child: BuildChild | None = None

    def add(self, traced: Trace, child: BuildChild | None = None) -> None:
        """The package of `traced` (built first where no run built it before, by `child`
        if one was started for it), for arguments of its shapes."""
        self._child = child
        try:
            self._runners[_tensors_and_shapes(traced.arguments)[1]] = self._runner(traced)
        finally:
            self._child = None

    def add_package(self, path: str, arguments: tuple[Any, ...]) -> None:
        """The package at `path`, for arguments of the shapes of `arguments`."""
        self._runners[_tensors_and_shapes(arguments)[1]] = load_package(path)

    def __call__(self, *arguments: Any) -> Any:
        tensors, shapes = _tensors_and_shapes(arguments)
        runner = self._runners.get(shapes)
        if runner is None:
            runner = self._runners[shapes] = self._runner(trace(self.function, copied(arguments)))
        return runner(arguments, tensors)

    def _runner(self, traced: Trace) -> Runner:
        """The trace's package, built first where no run built it before (by the child
        `add` was handed, where one was started for it; it is stopped if not needed)."""
        child, self._child = self._child, None
        try:
            return self._built(traced, child)
        finally:
            if child is not None:
                child.stop()

    def _built(self, traced: Trace, child: BuildChild | None) -> Runner:
        if compiler.BACKEND == "aot_eager":
            # torch's backend that runs the captured graph on eager kernels, with no code
            # generated (the tests' parity checks): here, the trace itself.
            return _GraphRunner(traced.graph)
        if not traced.built:
            started = time.perf_counter()
            try:
                program = graph_file.dumps(traced.graph, traced.arguments)
            except graph_file.Unwritable:
                with self.holding():  # an export patches torch.nn.Module process-wide
                    program = traced.export()
            if child is None:  # steps go on meanwhile
                traced.build(program, self.stopping)
            else:
                traced.build(program, self.stopping, child=child)
            self.build_seconds += time.perf_counter() - started
        return traced.load()


class ChainedSteps:
    """A call of several steps (a block: `TrainStep.steps`) as one call of each step's
    own package after the other, called as the block's graph is (`StepGraph.step`'s
    arguments, the batch the whole block's) and returning what it returns.

    Each package is one step's graph, traced on one part of the block (`split_block`'s
    views, whose strides it was built for), and writes the flat buffers in place, so the
    next reads the weights, moments and targets the one before left, as the steps of one
    unrolled graph do. Why not that graph: its build grows with its steps (a SAC Pendulum
    block of 4 unrolled: 2,458 nodes against 628 for one step, 39 CPU s of inductor and
    C++ against 17), and the unrolled code is no faster (one thread, the package calls
    alone, SAC's 4 steps one call each took 0.91 of the block's time, median of 15
    paired timings, 2026-12-07).

    Args:
        steps: each step's compiled step, in the block's order (steps that train the same
            groups share one).
        cut: the inputs the block's parts cut (`split_block`; None: every one)."""

    def __init__(self, steps: Sequence[Callable[..., Any]], cut: tuple[str, ...] | None) -> None:
        self.steps = list(steps)
        self.cut = cut

    def __call__(
        self,
        flat: Tensor,
        target_flat: Tensor,
        steps: Tensor,
        buffers: dict[str, Tensor],
        lr: Tensor,
        tau: Tensor,
        held: tuple[Tensor, ...],
        inputs: dict[str, Tensor],
    ) -> tuple[Any, ...]:
        parts = split_block(inputs, len(self.steps), self.cut)
        outputs = [
            step(flat, target_flat, steps, buffers, lr, tau[i : i + 1], held, part)
            for i, (step, part) in enumerate(zip(self.steps, parts, strict=True))
        ]
        # Each step's [1] verdicts, and its stats and priorities (lists of one).
        stacked = tuple(torch.cat([output[j] for output in outputs]) for j in range(5))
        stats = [output[5][0] for output in outputs]
        priorities = [output[6][0] for output in outputs]
        return (*stacked, stats, priorities)


class _GraphRunner:
    """A trace run as it is, on eager kernels (`Runner`)."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        self.graph = graph

    def __call__(self, arguments: tuple[Any, ...], tensors: list[Tensor]) -> Any:
        return self.graph(*arguments)


def _tensors_and_shapes(arguments: tuple[Any, ...]) -> tuple[list[Tensor], Any]:
    """The tensors among the arguments' leaves, in the order a package takes them
    (pytree's: sequences in order, dicts in their keys' order), and what picks the
    package: the arguments' structure, and each tensor's shape, dtype and strides. Arguments of
    tuples, lists, dicts and leaves (every step's) are walked here, in 9 us where pytree's
    flattening and the hashing of its spec took 25 (of PPO CartPole's 0.4 ms step);
    others go through pytree."""
    tensors: list[Tensor] = []
    try:
        return tensors, _structure(arguments, tensors)
    except _OtherContainer:
        leaves, spec = tree_flatten(arguments)
        tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
        return tensors, (spec, *((t.shape, t.dtype, t.stride()) for t in tensors))


class _OtherContainer(Exception):
    """An argument holds a container that `_structure` does not walk."""


def _structure(value: Any, tensors: list[Tensor]) -> Any:
    """`value`'s structure and tensor shapes as a hashable key; its tensors appended to
    `tensors` in pytree's order."""
    if isinstance(value, Tensor):
        tensors.append(value)
        # Strides too: a package runs its inputs as laid out when traced (a block's part,
        # `ChainedSteps`, is a strided view of it).
        return (value.shape, value.dtype, value.stride())
    kind = type(value)
    if kind is tuple or kind is list:
        return (kind, *(_structure(item, tensors) for item in value))
    if kind is dict:
        return (dict, len(value), *value, *(_structure(item, tensors) for item in value.values()))
    if kind in (int, float, bool, str, type(None)):
        return None  # a leaf pytree keeps, of no shape (the trace holds its value)
    raise _OtherContainer(kind.__name__)


def _key(graph: torch.fx.GraphModule, arguments: tuple[Any, ...]) -> str:
    digest = hashlib.sha256()
    digest.update(repr((_FORMAT, torch.__version__, _instruction_set())).encode())
    digest.update(graph.code.encode())
    for node in graph.graph.nodes:
        if node.op == "get_attr":  # a constant the trace kept: its value is code too
            value = getattr(graph, node.target)
            if isinstance(value, Tensor):
                digest.update(repr((node.target, value.shape, value.dtype)).encode())
                digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    leaves, spec = tree_flatten(arguments)
    digest.update(repr(spec).encode())
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            digest.update(repr((leaf.shape, leaf.dtype, leaf.stride(), leaf.device)).encode())
        else:
            digest.update(repr(leaf).encode())
    return digest.hexdigest()[:32]


def _instruction_set() -> str:
    """The vector instructions inductor's C++ kernels were built for."""
    return torch.backends.cpu.get_cpu_capability()
