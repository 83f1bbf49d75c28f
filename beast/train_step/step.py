"""`TrainStep`: an algorithm's optimizer step, eager or compiled, and which of the two
each kind of step takes (beast/train_step/__init__.py)."""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from beast.models import BufferAverager, PolyakAverager
from beast.train_step import auto, compilation, compiler, lines, package
from beast.train_step.background import MODULES_IN_USE, compilation_thread
from beast.train_step.build_child import BuildChild, SpareChild
from beast.train_step.cuda_graph import CudaGraphStep
from beast.train_step.flat import Layout, OptimizerState, Used, used_from_reached, used_parameters
from beast.train_step.graph import STOPS_EARLY, GraphInputs, Program, StepGraph
from beast.train_step.interface import (
    Kind,
    ParameterGroup,
    StepLoss,
    StepResult,
    TargetNetwork,
    Train,
    kind_of,
    per_step,
    split_block,
    step_trains,
)
from beast.train_step.known_packages import PackageRecords

__all__ = ["COMPILE_MODES", "TrainStep"]

COMPILE_MODES = ("auto", "on", "off")
# --compile auto: a run of at least this many optimizer steps starts its build's child
# with the run (`TrainStep._child_with_the_run`); shorter ones (the tests' 2,000-step
# runs) may well stay eager, and would pay its imports for nothing.
_PRESTART_STEPS = 5_000


class TrainStep:
    """An algorithm's optimizer step (beast/train_step/__init__.py).

    Args:
        loss: (inputs, train) -> StepLoss; `train` names the groups this step trains (the
            loss computes what they need). It must not draw random numbers (a CUDA graph
            would replay the same ones): noise comes in `inputs`.
        modules: every module the loss reads.
        groups: the optimizers and what they train; a step trains some of them.
        targets: target networks, moved towards their online ones when a call asks.
        stepper: the learner's `Stepper` (schedule, guard and counters; the eager step).
        compile: "on", "off", or "auto": compile where it pays (beast/train_step/auto.py).
        log: where the lines about the path taken go (once each).
        expected_steps: about how many steps the run will take (auto weighs them).
        cuda_graphs: on CUDA, replay each compiled step as a CUDA graph.
        background: compile in a thread of its own (a run's learner: its steps wait,
            the rest of the run goes on, and a stop never waits for a compilation);
            else in the calling thread, the step that decides being the first compiled
            one.
        stopping: set when the run stops: a step waiting for a compilation then raises
            StepAbandoned instead of waiting on.
        identity: what, besides beast's code and the step's arguments, the step's graph
            is made from (the run's settings and the env's spaces: beast/run/build.py
            `step_identity`), or None where that is not known (a user's model). Given it,
            a step whose package an earlier run recorded loads it at its first call, with
            no trace and no eager steps before (`_load_known`).
    """

    def __init__(
        self,
        loss: Callable[[Mapping[str, Tensor], tuple[str, ...]], StepLoss],
        *,
        modules: Mapping[str, nn.Module],
        groups: Sequence[ParameterGroup],
        targets: Sequence[TargetNetwork] = (),
        stepper: Any,
        compile: str = "off",
        log: Callable[[str], None] = print,
        expected_steps: int | None = None,
        cuda_graphs: bool = True,
        background: bool = False,
        stopping: threading.Event | None = None,
        identity: str | None = None,
    ) -> None:
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
        self.loss = loss
        self.groups = {group.name: group for group in groups}
        self.stepper = stepper
        self.log = log
        self.cuda_graphs = cuda_graphs
        self.background = background
        self.stopping = stopping
        self.program = Program(modules, loss)
        # The packages earlier runs recorded for this step, and this run's, for the next.
        self.known_packages = PackageRecords(
            identity, loss, self.program.parts, self.groups, stepper
        )
        self.path = "eager"  # what the last step ran: eager, compiled, CUDA graph
        self.compile_seconds = 0.0  # spent compiling (or loading cached graphs)
        self._calls: collections.Counter[Kind] = collections.Counter()  # by kind
        self._steps: collections.Counter[Kind] = collections.Counter()  # by kind
        self.decision = auto.Decision(compile, expected_steps, self._calls, self._steps)
        self._cuts: dict[Kind, tuple[str, ...] | None] = {}  # what each kind's blocks cut
        self._decided: dict[Kind, Callable[..., tuple[Any, ...]] | None] = {}
        self._compiled_seconds: dict[Kind, float] = {}
        self._compilations: dict[Kind, threading.Thread] = {}  # under way (or done)
        self._compiled_steps: dict[Kind, Callable[..., tuple[Any, ...]]] = {}  # to adopt
        # CPU: the seconds a kind's package took to build in this run (0: loaded).
        self._build_seconds: dict[Kind, float] = {}
        self._used: dict[Train, Used | None] = {}  # by the groups a step trains
        self._looked_up: set[Kind] = set()  # kinds whose known package was looked for
        # Builds under way in the background, for the progress line (`progress_note`).
        self._progress = lines.BuildProgress()
        self._layout: Layout | None = None
        self._state: OptimizerState | None = None
        self._compiling = compile != "off"
        if self._compiling:
            try:
                self._layout = Layout(groups, targets)
                self._state = OptimizerState(self._layout, groups)
            except ValueError as error:
                self._decline(str(error))
            else:
                self._graph = StepGraph(
                    self.program, self._layout, self._state, stepper.grad_norm_clipping
                )
                self._inputs = GraphInputs(self._layout, self._state, self._graph, groups, stepper)
        # Built after the layout: they list the tensors the parameters now are.
        self._eager_targets = [PolyakAverager(t.target, t.online) for t in targets]
        self._buffer_targets = BufferAverager(targets)
        # A build's child started now, for the first build (`_early_build_child`).
        self._spare_child = SpareChild()
        if self._child_with_the_run():
            self._spare_child.start(self)

    @property
    def steps_taken(self) -> int:
        """Optimizer steps taken: the steps of every kind that trains something."""
        return self.decision.steps_taken()

    @property
    def settled(self) -> bool:
        """Whether steps take their steady path: not compiling, or a kind of step decided
        (compiled, or kept eager), no compilation under way and no compiled step still
        being timed against the eager one (the thread tuner's windows, which change the
        thread count, wait for that: a compiled step timed at 2 threads beside an actor
        measured slower than eager, and --compile auto kept eager runs from then on)."""
        return not self._compiling or (
            bool(self._decided) and not self._compilations and not self.decision.timed
        )

    def describe(self) -> str:
        """The path the last step took, for the log."""
        if self.path == "eager":
            return "eager"
        return f"{self.path} (compiled in {self.compile_seconds:.1f} s)"

    def plan(self) -> str:
        """The path the update will take, for the run's start-up line: eager (and why), the
        package an earlier run of this setup built (compiled from the first step), or a
        compilation after the first steps (on CPU a build in the background, the learner
        eager until it is done), with about how long it takes: the median of this
        machine's past builds, or a prior (`auto.BuildHistory`)."""
        if not self._compiling:
            return "the update eager" + (" (--compile off)" if self.decision.mode == "off" else "")
        builds = self._build_class()
        packaged = builds.hardware != "cuda" and self.known_packages.setup_packaged()
        return lines.plan(builds, packaged, self.decision.mode)

    def progress_note(self) -> str | None:
        """What the progress line adds about the update's path: a build under way (its
        seconds so far, of about how many), or, once, the switch to the compiled step."""
        return self._progress.note(self._compilations)

    def _decline(self, reason: str) -> None:
        self._compiling = False
        self.log(f"the learner's update runs eagerly: {reason}")

    def load_optimizer_states(self) -> None:
        """After the optimizers' `load_state_dict` (a resumed run): their states back into
        the flat buffers that every path steps."""
        if self._state is not None:
            self._state.adopt()

    def __call__(
        self, inputs: Mapping[str, Any], *, train: Sequence[str], tau: float | None = None
    ) -> StepResult:
        """One optimizer step on `inputs` over the groups named in `train`, then, if it was
        applied and `tau` is given, every target network moved `tau` of the way. It waits
        while a compilation runs, unless the run stops (StepAbandoned).

        With `train` empty, no step: the loss's outputs (its stats, of any shape, and
        priorities) with nothing trained or written, compiled like the steps: an
        algorithm's fixed targets before its minibatch steps (PPO's advantages) are a
        forward pass of this kind."""
        return self.steps(inputs, train=train, taus=(tau,))[0]

    def steps(
        self,
        inputs: Mapping[str, Any],
        *,
        train: Sequence[str] | Sequence[Sequence[str]],
        taus: Sequence[float | None],
        cut: Sequence[str] | None = None,
    ) -> list[StepResult]:
        """`len(taus)` steps over the groups named in `train` in one call, one on each
        batch of the block `inputs` holds (`split_block`: a replay's --updates_per_sample
        batches, drawn at once), each from the weights the one before left; after step i,
        if it was applied and `taus[i]` is given, every target network moved `taus[i]` of
        the way. `train` may name each step's groups instead, one sequence per step (TD3's
        delayed actor: the critic alone, then critic and actor); each pattern of them is a
        kind of its own. Compiled, the block is one graph: no return to Python between its
        steps.
        `cut` names the inputs the block's parts cut (None: every one); the others every
        step reads whole (PPO's batch, which each minibatch's `index` picks from). Every
        call of a kind cuts the same inputs.

        The taus are fixed before the call: an algorithm whose targets follow every n-th
        applied step counts a step skipped inside the block (non-finite) as applied, there
        alone. A loss with `proceed` (an early stop) takes its steps one call at a time."""
        if per_step(train):
            if len(train) != len(taus):
                raise ValueError(f"{len(train)} steps' groups for {len(taus)} steps")
            kind = kind_of([tuple(names) for names in train])
        else:
            kind = tuple(train)
        cut = None if cut is None else tuple(cut)
        if self._cuts.setdefault(kind, cut) != cut:
            raise ValueError(
                f"{lines.subject(kind)} cut {self._cuts[kind]} of its inputs before, {cut} now:"
                " every call of a kind cuts the same inputs"
            )
        with MODULES_IN_USE.held(self.stopping):
            return self._step(kind, inputs, tuple(taus))

    def _step(
        self, kind: Kind, inputs: Mapping[str, Any], taus: tuple[float | None, ...]
    ) -> list[StepResult]:
        self._calls[kind] += 1
        self._steps[kind] += len(taus)
        if self._compiling:
            if kind in self._compilations and not self._compilations[kind].is_alive():
                self._adopt(kind, inputs, len(taus))
            if kind in self._decided:
                compiled = self._decided[kind]
                if compiled is not None:
                    return self._run_compiled(kind, compiled, inputs, taus)
            elif kind not in self._looked_up and self._load_known(kind, inputs, len(taus)):
                return self._run_compiled(kind, self._decided[kind], inputs, taus)
            elif kind not in self._compilations and self.decision.probed(kind):
                self._decide(kind, inputs, len(taus))
                if self._decided.get(kind) is not None:
                    return self._run_compiled(kind, self._decided[kind], inputs, taus)
        return self._run_eager(kind, inputs, taus)

    # -- eager

    def _run_eager(
        self, kind: Kind, inputs: Mapping[str, Any], taus: tuple[float | None, ...]
    ) -> list[StepResult]:
        started = time.perf_counter()
        self.path = "eager"
        parts = len(taus)
        results = []
        blocks = split_block(inputs, parts, self._cuts[kind])
        for part, tau, train in zip(blocks, taus, step_trains(kind, parts), strict=True):
            out = self.loss(part, train)
            if not train:  # a forward pass alone
                results.append(StepResult(False, False, out.stats, out.priorities))
                continue
            if out.proceed is not None:
                if parts > 1:
                    raise ValueError(STOPS_EARLY)
                if not bool(out.proceed):
                    return [StepResult(False, True, out.stats, out.priorities)]
            groups = [self.groups[name] for name in train]
            params = [p for group in groups for p in group.parameters]
            applied = self.stepper(out.total, [group.optimizer for group in groups], params)
            if applied and tau is not None:
                for averager in self._eager_targets:
                    averager(tau)
            if applied and self._compiling and train not in self._used:
                # What the compiled step of this train must reproduce (beast/train_step/
                # __init__.py): the parameters its backward pass reached.
                layout = self._layout
                assert layout is not None
                self._used[train] = used_parameters(
                    layout, [i for name in train for i in layout.group_params[name]]
                )
            results.append(StepResult(applied, False, out.stats, out.priorities))
        complete = not kind or all(result.applied for result in results)
        if complete and self._compiling and kind not in self._decided:
            self.decision.add_eager(kind, time.perf_counter() - started)  # its cost
        return results

    # -- the decision, and compiling

    def _decide(self, kind: Kind, inputs: Mapping[str, Any], parts: int) -> None:
        """Compile this kind of step, or keep it eager (--compile auto, where compiling
        would cost more than it saves over the steps left; said once in the log). A build
        runs in the background (`background`), and a stop never waits for it; a package
        already built is loaded at once."""
        eager = self.decision.eager_seconds(kind)
        record = self._record(kind, inputs)
        reason = self.decision.not_worth(kind, eager, record, parts, self._hardware())
        if reason is not None:
            self._spare_child.stop()
            self._decided[kind] = None
            took = self.decision.per_step(kind, eager)
            self.log(f"{lines.subject(kind)} runs eagerly ({took}): {reason}")
            return
        self.decision.timed[kind] = record._replace(eager=eager)
        function = functools.partial(
            self._graph.step,
            trains=step_trains(kind, parts),
            used=self._step_used(kind, parts),
            cut=self._cuts[kind],
        )
        arguments = self._inputs.arguments(inputs, copies=True, parts=parts)
        started = time.perf_counter()
        traced = None
        child = None
        if self._device().type == "cpu":
            child = self._early_build_child()
            # Traced here, in the learner's thread and its step: a trace puts fake tensors
            # in the modules while it runs, which no other thread may see (a checkpoint
            # takes the lock the learner's step holds).
            try:
                traced = compilation.trace_call(
                    self._graph.step,
                    step_trains(kind, parts),
                    split_block(inputs, parts, self._cuts[kind]),
                    self._used,
                    lambda piece: self._inputs.arguments(piece, copies=True, parts=1),
                )
            except Exception as error:  # an operation no graph holds
                if child is not None:
                    child.stop()
                self._decided[kind] = None
                self.decision.timed.pop(kind)
                self._failed(error)
                return
            if self.known_packages.identity is not None:
                self.known_packages.traced(
                    kind,
                    self._cuts[kind],
                    self._inputs.arguments(inputs, copies=False, parts=parts),
                    [traced.traces[i].path for i in traced.order],
                )
            if child is not None and package.loads_only(traced.traces):
                child.stop()
                child = None
        thread = compilation_thread(
            _name(kind), self._compile, kind, function, arguments, traced, started, child
        )
        self._compilations[kind] = thread
        # A package an earlier run built is loaded here, in the learner's thread: 0.3 s,
        # where a thread of its own would first need the compiler imported here (1 s of
        # the learner's time, every run, for what only a build needs).
        if self.background and not package.loads_only(traced and traced.traces):
            compiler.import_compiler()
            if traced is None:  # torch.compile (CUDA) holds the modules from its start
                MODULES_IN_USE.compilation_starting()
            self.log(self._progress.start(kind, parts, self._build_class()))
            thread.start()
        else:
            thread.run()
            self._adopt(kind, inputs, parts)

    def _adopt(self, kind: Kind, inputs: Mapping[str, Any], parts: int) -> None:
        """A finished compilation: its step from now on (in a CUDA graph on CUDA, captured
        here, in the learner's thread), said once; or eager, said once, if it failed."""
        del self._compilations[kind]
        compiled = self._compiled_steps.pop(kind, None)
        if compiled is None:
            self._progress.failed(kind)
            self._decided[kind] = None
            self.decision.timed.pop(kind, None)
            return
        if self.cuda_graphs and self._device().type == "cuda":
            try:
                arguments = self._inputs.arguments(inputs, copies=False, parts=parts)
                compiled = CudaGraphStep(compiled, arguments)
            except Exception as error:  # a step that does not capture: compiled, ungraphed
                self.log(f"no CUDA graph for {lines.subject(kind)} ({compiler.first_line(error)})")
        compiler.configure_compiler()  # this thread runs the step, and recompiles it if need be
        self._decided[kind] = compiled
        self.known_packages.remember(kind, self._step_used(kind, parts))
        seconds = self._compiled_seconds[kind]
        record = self.decision.timed[kind]
        took = self.decision.per_step(kind, record.eager)
        built = self._build_seconds.get(kind)  # None: torch.compile's (CUDA)
        step = getattr(getattr(self.stepper, "progress", None), "step", None)
        self._progress.adopted(kind, parts, seconds, built, step, self._build_class)
        cached = record.compile_seconds is not None
        self.log(lines.compiled_line(kind, seconds, built, cached, took))
        # What compiling will cost the next run of this step: tracing and loading its
        # package (a build, this run's alone, is not counted).
        self.decision.timed[kind] = record._replace(compile_seconds=seconds - (built or 0.0))

    def _early_build_child(self) -> BuildChild | None:
        """A package build's child, started before the trace where a build is all but
        certain (a step of known identity whose package no earlier run recorded:
        `_load_known` found none), so that its imports run on the other core while this
        thread traces; None where the trace may find a package built already (a user's
        model, whose steps are always traced) or no package is built (the tests'
        backend). The one started with the run, if it still waits, is this one."""
        return self._spare_child.take(
            self.background
            and self.known_packages.identity is not None
            and compiler.BACKEND != "aot_eager"
        )

    def _child_with_the_run(self) -> bool:
        """Whether a build's child starts with the run, where a first build is as good as
        certain: a run's learner on CPU, compiling (`on`, or `auto` over at least
        `_PRESTART_STEPS` steps), whose setup no earlier run packaged. The child's imports
        and instruction-set probes (4-6 s on the 2-core VM, busy: benchmarks/RESULTS.md
        2026-12-07) then run while the run starts and takes its first eager steps, not
        after the decision to compile; it waits for its program, and is stopped if none
        comes (an eager decision, the step's collection)."""
        if not (self._compiling and self.background and self.known_packages.identity is not None):
            return False
        if compiler.BACKEND == "aot_eager" or self._device().type != "cpu":
            return False
        expected = self.decision.expected_steps
        if self.decision.mode == "auto" and (expected is None or expected < _PRESTART_STEPS):
            return False
        return not self.known_packages.setup_packaged()

    def _record(self, kind: Kind, inputs: Mapping[str, Any]) -> auto.StepRecord:
        """What compiling this kind of step cost and gained in earlier runs."""
        params = self._layout.params if self._layout else []
        return auto.StepRecord.load(auto.signature(self.loss, kind, inputs, params, self._device()))

    def _hardware(self) -> str:
        return auto.hardware(self._device(), self.program.modules())

    def _build_class(self) -> auto.BuildClass:
        return auto.BuildClass.of(self._device(), self.program.modules())

    def _load_known(self, kind: Kind, inputs: Mapping[str, Any], parts: int) -> bool:
        """At a kind's first step on CPU: the package an earlier run recorded for this
        step (`PackageRecords.remember`), loaded (in milliseconds) and adopted with no
        trace and no eager step before it, where --compile auto finds it worth loading.
        False where there is none, and the kind goes the usual way: eager steps, then a
        trace.

        The key (`package.known_step_key`) holds beast's code, the run's settings, the
        env's spaces, the modules and optimizers and the arguments' shapes, what the graph
        is made from; a user's model, whose code is not beast's, has no `identity` and is
        always traced."""
        self._looked_up.add(kind)
        if self.known_packages.identity is None or self._device().type != "cpu":
            return False
        if compiler.BACKEND == "aot_eager":
            return False  # the tests' backend: graphs, no packages
        started = time.perf_counter()
        arguments = self._inputs.arguments(inputs, copies=False, parts=parts)
        known = self.known_packages.recorded(kind, self._cuts[kind], arguments, parts)
        if known is None:
            return False
        layout = self._layout
        assert layout is not None
        record = self._record(kind, inputs)
        if (
            record.eager is None
            or self.decision.not_worth(kind, record.eager, record, parts, self._hardware())
            is not None
        ):
            return False
        trains = step_trains(kind, parts)
        try:
            used = tuple(
                None if reached is None else used_from_reached(layout, reached)
                for reached in known.reached
            )
            if len(used) != parts:
                raise ValueError(f"{len(used)} steps recorded for {parts}")
            compiled = compilation.load_call(
                self._graph.step,
                known.names,
                trains,
                used,
                split_block(inputs, parts, self._cuts[kind]),
                lambda piece: self._inputs.arguments(piece, copies=False, parts=1),
                self._cuts[kind],
                self.stopping,
            )
        except Exception:  # a record or package this torch cannot read: traced instead
            return False
        self._used.update(zip(trains, used, strict=True))
        self._decided[kind] = compiled
        self._spare_child.stop()  # an earlier run's package: no build to start it for
        self.decision.timed[kind] = record  # its first steps timed against eager's, as ever
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        self.log(
            f"{lines.subject(kind)} is compiled from its package of an earlier run"
            f" ({seconds:.2f} s, untraced: the same code, settings and shapes;"
            f" eager it took {self.decision.per_step(kind, record.eager)})"
        )
        return True

    def _step_used(self, kind: Kind, parts: int) -> tuple[Used | None, ...]:
        """The parameters each of the `parts` steps of a call of `kind` reaches (`Used`;
        None: all of them), as its eager steps found them."""
        return tuple(self._used.get(train) for train in step_trains(kind, parts))

    def _device(self) -> torch.device:
        return self._layout.flat.device if self._layout is not None else torch.device("cpu")

    def _compile(
        self,
        kind: Kind,
        function: Callable[..., tuple[Any, ...]],
        arguments: tuple[Any, ...],
        traced: compilation.Traced | None,
        started: float,
        child: BuildChild | None = None,
    ) -> None:
        """Compile this kind's step (`compilation.compile_call`: on CPU the `traced` call
        packaged ahead of time, beast/train_step/package.py, which a later run of the same
        step loads in milliseconds; on CUDA torch.compile's, whose graph `_adopt` captures
        for replay); the result waits in `_compiled_steps` for `_adopt`. A failure is said
        once, and the steps stay eager."""
        compiler.configure_compiler()
        try:
            compiled, built = compilation.compile_call(
                function, arguments, traced, self._cuts[kind], self.stopping, child
            )
        except Exception as error:  # dynamo/inductor errors, a missing C++ compiler
            if not (self.stopping is not None and self.stopping.is_set()):
                self._failed(error)  # (a stopped run has nothing more to say of it)
            return
        if built is not None:
            self._build_seconds[kind] = built
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        self._compiled_seconds[kind] = seconds
        self._compiled_steps[kind] = compiled

    def _failed(self, error: Exception) -> None:
        """A step that could not be compiled: said once; it runs eagerly."""
        if os.environ.get("BEAST_DEBUG_COMPILE"):
            raise error
        self._decline(
            f"compiling failed ({type(error).__name__}: {compiler.first_line(error)});"
            " --compile off skips compiling"
        )

    def _run_compiled(
        self,
        kind: Kind,
        compiled: Callable[..., tuple[Any, ...]],
        inputs: Mapping[str, Any],
        taus: tuple[float | None, ...],
    ) -> list[StepResult]:
        started = time.perf_counter()
        self._inputs.set(taus)
        arguments = self._inputs.arguments(inputs, copies=False, parts=len(taus))
        outputs = compiled(*arguments)
        self.path = "CUDA graph" if isinstance(compiled, CudaGraphStep) else "compiled"
        if kind in self.decision.timed:
            finite = outputs[2]  # `StepGraph.step`'s: totals, norms, finite, ...
            seconds = bool(finite.all()) and time.perf_counter() - started
            back_to_eager = self.decision.time_compiled(kind, seconds)
            if back_to_eager:
                self._decided[kind] = None
                self.log(back_to_eager)
        return compilation.call_results(
            kind, outputs, taus, self.stepper, self.groups, self._buffer_targets
        )


def _name(kind: Kind) -> str:
    """A kind in a thread's name: its groups ("critic-actor"), or its steps' one after
    another ("critic/critic-actor")."""
    trains = kind if per_step(kind) else (kind,)
    return "/".join("-".join(train) for train in trains)
