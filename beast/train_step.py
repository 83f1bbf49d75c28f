"""One optimizer step for every algorithm: eager, or compiled as one graph.

An algorithm states its update once, as a `TrainStep` over:

    loss      (inputs, train) -> `StepLoss`: its forward passes and losses on a batch's
              tensors, for the parameter groups `train` names (TD3 trains its actor
              every other step); plain PyTorch over its modules, called as usual.
    modules   every nn.Module the loss reads (online networks, target networks, SAC's
              temperature), by name.
    groups    what each optimizer trains (`ParameterGroup`), built by beast.optim.
    targets   target networks that follow online ones by Polyak averaging or copies
              (`TargetNetwork`).

and calls it once per optimizer step with the batch's tensors. The engine runs the
rest, the same way for every algorithm and every user model (`--model`):

- Eager: the loss, `backward`, and the learner's `Stepper` (gradient clipping, the
  non-finite guard, the learning-rate schedule, the optimizers' steps), then the targets.
- Compiled (`--compile`): the whole step as one torch.compile graph: the forward passes
  and losses, the gradients (torch.func over every trained parameter at once), the norm
  and its clipping, the finiteness verdict, the optimizers' arithmetic, the target
  updates and the priorities, with no host synchronisation inside. On CPU inductor
  turns it into a few fused C++ loops around the matrix products; on CUDA the compiled
  step is captured in a CUDA graph, so that one replay launches the whole update.

What makes one graph possible: every parameter the step trains lives in one flat buffer
(the parameters become views into it, so the modules, the eager optimizers and
checkpoints see the same memory), each target network in another with the same layout,
and the optimizers' state (Adam's moments, RMSprop's averages, step counts) in flat
buffers that the optimizers' own state entries view. A skipped (non-finite) step is
a `where` in the graph, not a branch on the host. Either path can take over from the
other at any step, and both write the same tensors.

The first step of each kind (`train` and target schedule) runs eagerly: it tells which
parameters the loss reaches (an unused parameter is not stepped, as torch's optimizers
skip a parameter without gradient) and what an eager step costs. The next one compiles.
A compilation that fails, or a graph that cannot be made, leaves the run on the eager
path, said once in the log; it never stops a run.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves, tree_map

from beast.models import PolyakAverager
from beast.optim import INITIAL_LR

__all__ = [
    "COMPILE_MODES",
    "ParameterGroup",
    "StepAbandoned",
    "StepLoss",
    "StepResult",
    "TargetNetwork",
    "TrainStep",
    "compilations_under_way",
    "compile_cache_dir",
]

COMPILE_MODES = ("auto", "on", "off")
# torch.compile's backend: inductor generates the fused C++ (CPU) or Triton (CUDA) code.
_BACKEND = "inductor"

# The optimizer hyperparameters the compiled step implements (beast.optim builds no other).
_ADAM_DEFAULTS = {"weight_decay": 0.0, "amsgrad": False, "maximize": False}
_RMSPROP_DEFAULTS = {"weight_decay": 0.0, "centered": False, "maximize": False}
# torch.nn.utils.clip_grad_norm_'s guard against a zero norm.
_CLIP_EPSILON = 1e-6


# How often a step waiting for a compilation looks whether the run is stopping.
_STOP_POLL_SECONDS = 0.1


class StepAbandoned(Exception):
    """The run began to stop while a step waited for a compilation: no step was taken
    (the learner's loop ends on it, as on a closed queue)."""


def compile_cache_dir() -> str:
    """Where inductor keeps compiled graphs between runs: a second run of a config loads
    its graphs from here instead of compiling them. $BEAST_COMPILE_CACHE, else
    ~/.cache/beast/inductor (torch's default is under /tmp, which a reboot empties)."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "beast", "inductor")
    return os.environ.get("BEAST_COMPILE_CACHE", default)


class StepLoss(NamedTuple):
    """What a loss returns.

    total: the scalar to minimise (the sum of every trained group's loss: one backward
        pass serves all the optimizers).
    stats: detached scalars for the run log.
    priorities: float [B] new priorities of a prioritized replay's samples, or None.
    proceed: a bool scalar; False skips this step without counting it as non-finite
        (PPO's KL early stop), or None.
    """

    total: Tensor
    stats: dict[str, Tensor]
    priorities: Tensor | None = None
    proceed: Tensor | None = None


class StepResult(NamedTuple):
    """What a step did: `applied` (False: skipped, non-finite or not `proceed`),
    `stopped` (the loss said not to proceed), the loss's stats and priorities."""

    applied: bool
    stopped: bool
    stats: dict[str, Tensor]
    priorities: Tensor | None


@dataclass(frozen=True)
class ParameterGroup:
    """An optimizer and the parameters it trains (its single param group's)."""

    name: str
    optimizer: torch.optim.Optimizer

    @property
    def parameters(self) -> list[nn.Parameter]:
        return list(self.optimizer.param_groups[0]["params"])


@dataclass(frozen=True)
class TargetNetwork:
    """A target network whose parameters follow `online`'s, pairwise in
    `parameters()` order: moved `tau` of the way at each averaging step (1: copied).
    Floating-point buffers are averaged too (a normaliser's statistics), others copied."""

    target: nn.Module
    online: nn.Module


# A kind of step: the names of the groups it trains (its graph's one static choice).
Train = tuple[str, ...]


class _StepRecord(NamedTuple):
    """What compiling one step cost and gained on this machine (seconds), kept in the
    compile cache by signature (`TrainStep._signature`), so that --compile auto decides
    with the next run's real cost: cached graphs load in seconds where a first
    compilation takes a minute. None where not yet known."""

    signature: str
    compile_seconds: float | None = None
    eager: float | None = None
    compiled: float | None = None

    @staticmethod
    def _path() -> str:
        return os.path.join(compile_cache_dir(), "beast_steps.json")

    @classmethod
    def load(cls, signature: str) -> _StepRecord:
        try:
            with open(cls._path()) as file:
                known = json.load(file).get(signature, {})
            return cls(signature, **{k: known.get(k) for k in cls._fields[1:]})
        except (OSError, ValueError, TypeError, AttributeError):
            return cls(signature)

    def save(self) -> None:
        """Into the shared file, written to a temporary name and renamed (runs of a sweep
        may write at once: the last write wins, a reader never sees half a file)."""
        path = self._path()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with open(path) as file:
                    known = json.load(file)
            except (OSError, ValueError):
                known = {}
            known[self.signature] = {k: v for k, v in self._asdict().items() if k != "signature"}
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "w") as file:
                json.dump(known, file)
            os.replace(temporary, path)
        except OSError:
            pass  # a read-only home: auto decides on the defaults next time


# What --compile auto assumes before a step has been compiled on this machine: a first
# compilation's cost (on 2 cores, SAC's step took 35-76 s and DQN's about 30 s; cached
# graphs load in 4-10 s), and a compiled step's time over an eager one's: on CPU 0.3-0.5
# for the MLPs of classic control and MuJoCo (benchmarks/RESULTS.md), 0.8-1.1 for
# convolutional networks, whose time is their convolutions'; on CUDA 0.1-0.3.
_FIRST_COMPILE_SECONDS = 60.0
_COMPILED_RATIO = {"cpu": 0.6, "cpu convolutions": 0.9, "cuda": 0.3}
# A compiled step kept only if at least this much faster than the eager one, measured.
_KEEP_COMPILED_BELOW = 0.97
# Eager steps of each kind timed before deciding (the first, warming caches, not counted).
_EAGER_PROBES = 4


def _worth_compiling(
    eager: float, record: _StepRecord, steps_left: int | None, prior: float
) -> tuple[bool, str]:
    """Whether compiling a step pays over the steps left (--compile auto), and why not;
    `prior` is the compiled-to-eager time ratio assumed before one was measured."""
    if steps_left is None:
        return True, ""
    ratio = prior
    if record.eager and record.compiled:
        ratio = record.compiled / record.eager
    cost = record.compile_seconds
    first = cost is None
    if first:
        cost = _FIRST_COMPILE_SECONDS
    saving = steps_left * eager * (1.0 - ratio)
    if saving > cost:
        return True, ""
    hint = (
        " (once compiled, cached graphs load in seconds: --compile on compiles it now and"
        " lets later runs of this config compile by default)"
        if first
        else ""
    )
    return False, (
        f"compiling costs about {cost:.0f} s{' the first time' if first else ''}, and"
        f" {steps_left:,} steps would save about {saving:.0f} s{hint}"
    )


class _Layout:
    """Trained parameters as views of one flat buffer, and every target network's
    parameters as views of another, each at the offset of the online parameter it
    follows (module docstring)."""

    def __init__(self, groups: Sequence[ParameterGroup], targets: Sequence[TargetNetwork]):
        params = [p for group in groups for p in group.parameters]
        if not params:
            raise ValueError("the optimizers train no parameter")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter is in two optimizers")
        first = params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in params):
            raise ValueError("the trained parameters differ in dtype or device")
        self.params = params
        self.offsets: list[int] = []
        size = 0
        for p in params:
            self.offsets.append(size)
            size += p.numel()
        self.size = size
        self.flat = torch.zeros(size, dtype=first.dtype, device=first.device)
        _point_into(self.flat, params, self.offsets)
        # Each group's parameters (indices into params) and flat elements.
        self.group_params: dict[str, range] = {}
        self.group_slices: dict[str, slice] = {}
        start = 0
        for group in groups:
            stop = start + len(group.parameters)
            end = self.offsets[stop] if stop < len(params) else size
            self.group_params[group.name] = range(start, stop)
            self.group_slices[group.name] = slice(self.offsets[start], end)
            start = stop
        index = {id(p): i for i, p in enumerate(params)}
        self.target_flat = torch.zeros_like(self.flat)
        self.target_params: list[nn.Parameter] = []
        self.target_offsets: list[int] = []
        for pair in targets:
            online, target = list(pair.online.parameters()), list(pair.target.parameters())
            if len(online) != len(target):
                raise ValueError("a target network's parameters do not match its online one's")
            for mine, theirs in zip(target, online, strict=True):
                i = index.get(id(theirs))
                if i is None or mine.shape != theirs.shape:
                    raise ValueError("a target network follows a parameter no optimizer trains")
                self.target_params.append(mine)
                self.target_offsets.append(self.offsets[i])
        _point_into(self.target_flat, self.target_params, self.target_offsets)
        pairs = zip(self.target_params, self.target_offsets, strict=True)
        self.target_ranges = _merged([slice(o, o + p.numel()) for p, o in pairs])

    def views(self, flat: Tensor) -> list[Tensor]:
        """The trained parameters' views of `flat` (laid out as `self.flat`)."""
        return _views(flat, self.params, self.offsets)

    def target_views(self, target_flat: Tensor) -> list[Tensor]:
        return _views(target_flat, self.target_params, self.target_offsets)


def _views(flat: Tensor, params: Sequence[Tensor], offsets: Sequence[int]) -> list[Tensor]:
    return [
        flat[start : start + p.numel()].view(p.shape)
        for p, start in zip(params, offsets, strict=True)
    ]


@torch.no_grad()
def _point_into(flat: Tensor, params: Sequence[Tensor], offsets: Sequence[int]) -> None:
    """Copy each parameter into `flat` at its offset and make it a view of that place."""
    for p, view in zip(params, _views(flat, params, offsets), strict=True):
        view.copy_(p.detach())
        p.data = view


def _merged(ranges: Sequence[slice]) -> list[slice]:
    """Ranges that touch joined: a target network is one or a few ranges."""
    merged: list[slice] = []
    for r in sorted(ranges, key=lambda s: s.start):
        if merged and r.start <= merged[-1].stop:
            merged[-1] = slice(merged[-1].start, max(merged[-1].stop, r.stop))
        else:
            merged.append(r)
    return merged


class _OptimizerState:
    """The optimizers' states in flat buffers laid out as the parameters and viewed by the
    optimizers' own state entries (eager steps, checkpoints and the compiled step share
    them), with each group's hyperparameters for the compiled arithmetic."""

    def __init__(self, layout: _Layout, groups: Sequence[ParameterGroup]) -> None:
        self.layout = layout
        self.groups = list(groups)
        device = layout.flat.device
        self.buffers: dict[str, Tensor] = {}
        # Per parameter, as torch keeps them (float32 scalars); the graph reads a group's
        # first, since a group's parameters step together.
        self.steps = torch.zeros(len(layout.params), dtype=torch.float32, device=device)
        self.kinds: dict[str, str] = {}
        self.hyper: dict[str, dict[str, float]] = {}
        self.names: dict[str, tuple[str, ...]] = {}
        for group in groups:
            optimizer = group.optimizer
            if len(optimizer.param_groups) != 1:
                raise ValueError(f"the {group.name} optimizer has several param groups")
            settings = optimizer.param_groups[0]
            if isinstance(optimizer, torch.optim.Adam):
                kind, names, fixed = "adam", ("exp_avg", "exp_avg_sq"), _ADAM_DEFAULTS
                beta1, beta2 = settings["betas"]
                hyper = {"beta1": beta1, "beta2": beta2, "eps": settings["eps"]}
            elif isinstance(optimizer, torch.optim.RMSprop):
                kind, fixed = "rmsprop", _RMSPROP_DEFAULTS
                names = ("square_avg",) + (("momentum_buffer",) if settings["momentum"] else ())
                hyper = {
                    "alpha": settings["alpha"],
                    "eps": settings["eps"],
                    "momentum": settings["momentum"],
                }
            else:
                raise ValueError(f"there is no compiled step for {type(optimizer).__name__}")
            for key, value in fixed.items():
                if settings.get(key, value) != value:
                    raise ValueError(f"there is no compiled step for {key}={settings[key]}")
            self.kinds[group.name], self.hyper[group.name] = kind, hyper
            self.names[group.name] = names
            for name in names:
                self.buffers.setdefault(name, torch.zeros_like(layout.flat))
        self.adopt()

    @torch.no_grad()
    def adopt(self) -> None:
        """Move the optimizers' states into the flat buffers (at the start, and after a
        checkpoint's `load_state_dict` replaced them) and point the optimizers at them."""
        layout = self.layout
        for group in self.groups:
            optimizer = group.optimizer
            for i in layout.group_params[group.name]:
                p, start = layout.params[i], layout.offsets[i]
                old = optimizer.state.get(p, {})
                step = old.get("step")
                self.steps[i] = float(step) if step is not None else 0.0
                # torch keeps RMSprop's (non-capturable) step on the CPU, Adam's fused one
                # with the parameter; a view of `steps` serves where they are together.
                entry: dict[str, Tensor] = {
                    "step": self.steps[i]
                    if self.kinds[group.name] == "adam" or p.device.type == "cpu"
                    else self.steps[i].cpu()
                }
                for name in self.names[group.name]:
                    view = self.buffers[name][start : start + p.numel()].view_as(p)
                    value = old.get(name)
                    view.copy_(value if value is not None else torch.zeros_like(p))
                    entry[name] = view
                optimizer.state[p] = entry


class _Program(nn.Module):
    """The algorithm's modules under one root, so that one `functional_call` puts the
    graph's views of the flat buffers in place of every trained and target parameter."""

    def __init__(self, modules: Mapping[str, nn.Module], loss: Callable[..., StepLoss]):
        super().__init__()
        self.parts = nn.ModuleDict(dict(modules))
        self._loss = loss

    def forward(self, inputs: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        return self._loss(inputs, train)


class _BufferAverager:
    """Target networks' buffers moved towards their online ones' (floating point: by
    tau; counters: copied). Parameters are averaged elsewhere (the graph, or the eager
    `PolyakAverager`)."""

    def __init__(self, targets: Sequence[TargetNetwork]) -> None:
        self.pairs = [
            (mine, theirs)
            for pair in targets
            for mine, theirs in zip(pair.target.buffers(), pair.online.buffers(), strict=True)
        ]

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        for mine, theirs in self.pairs:
            if tau == 1.0 or not mine.is_floating_point():
                mine.copy_(theirs)
            else:
                mine.lerp_(theirs.to(mine.dtype), tau)


class _Used(NamedTuple):
    """Which trained parameters a kind of step reaches: per flat element and per
    parameter (bool). None where all are."""

    elements: Tensor
    params: Tensor


def _used(layout: _Layout | None, indices: Sequence[int]) -> _Used | None:
    """After an eager backward: which of the parameters at `indices` (the trained
    groups') received a gradient; None when all did."""
    if layout is None:
        return None
    reached = [True] * len(layout.params)
    for i in indices:
        reached[i] = layout.params[i].grad is not None
    if all(reached):
        return None
    elements = torch.zeros(layout.size, dtype=torch.bool, device=layout.flat.device)
    for p, start, hit in zip(layout.params, layout.offsets, reached, strict=True):
        elements[start : start + p.numel()] = hit
    return _Used(elements, torch.tensor(reached, device=layout.flat.device))


class TrainStep:
    """An algorithm's optimizer step (module docstring).

    Args:
        loss: (inputs, train) -> StepLoss; `train` names the groups this step trains (the
            loss computes what they need). It must not draw random numbers (a CUDA graph
            would replay the same ones): noise comes in `inputs`.
        modules: every module the loss reads.
        groups: the optimizers and what they train; a step trains some of them.
        targets: target networks, moved towards their online ones when a call asks.
        stepper: the learner's `Stepper` (schedule, guard and counters; the eager step).
        compile: "on", "off", or "auto": compile where it pays (`_worth_compiling`).
        log: where the lines about the path taken go (once each).
        expected_steps: about how many steps the run will take (auto weighs them).
        cuda_graphs: on CUDA, replay each compiled step as a CUDA graph.
        background: compile in a thread of its own (a run's learner: its steps wait,
            the rest of the run goes on, and a stop never waits for a compilation);
            else in the calling thread, the step that decides being the first compiled
            one.
        stopping: set when the run stops: a step waiting for a compilation then raises
            StepAbandoned instead of waiting on.
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
    ) -> None:
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
        self.loss = loss
        self.groups = {group.name: group for group in groups}
        self.stepper = stepper
        self.log = log
        self.mode = compile
        self.expected_steps = expected_steps
        self.cuda_graphs = cuda_graphs
        self.background = background
        self.stopping = stopping
        self.program = _Program(modules, loss)
        self.path = "eager"  # what the last step ran: eager, compiled, CUDA graph
        self.compile_seconds = 0.0  # spent compiling (or loading cached graphs)
        self.steps_taken = 0
        self._timings: dict[Train, list[float]] = {}  # each kind's timed eager steps
        self._decided: dict[Train, Callable[..., tuple[Any, ...]] | None] = {}
        self._records: dict[Train, _StepRecord] = {}  # kinds whose compiled steps are timed
        self._compiled_seconds: dict[Train, float] = {}
        self._compilations: dict[Train, threading.Thread] = {}  # under way (or done)
        # Held by every step and by a compilation for as long as it runs: torch.fx patches
        # nn.Module.__call__ for the whole process while it traces, so a module called
        # from the learner's thread meanwhile would be traced, not run (a PPO run's eager
        # step died of "module is not installed as a submodule"). The learner waits for a
        # compilation in the background; the rest of the run (actors, logging, a stop)
        # does not.
        self._modules_in_use = threading.RLock()
        # Set once a compilation started in the background holds `_modules_in_use` (the
        # learner's next step waits for that, or it could take the lock back first, and
        # again at every step: Python's locks are not fair).
        self._compilation_holds_modules = threading.Event()
        self._compilation_holds_modules.set()
        self._compiled_steps: dict[Train, Callable[..., tuple[Any, ...]]] = {}  # to adopt
        self._compiled_timings: dict[Train, list[float]] = {}
        self._used: dict[Train, _Used | None] = {}
        self._layout: _Layout | None = None
        self._state: _OptimizerState | None = None
        self._lr: Tensor | None = None
        self._lr_multiplier: float | None = None
        self._tau: Tensor | None = None
        self._compiling = compile != "off"
        if self._compiling:
            try:
                self._layout = _Layout(groups, targets)
                self._state = _OptimizerState(self._layout, groups)
            except ValueError as error:
                self._decline(str(error))
            else:
                device = self._layout.flat.device
                self._lr = torch.zeros(len(groups), device=device)
                self._tau = torch.zeros((), device=device)
                self._tau_value = 0.0
        # Built after the layout: they list the tensors the parameters now are.
        self._eager_targets = [PolyakAverager(t.target, t.online) for t in targets]
        self._buffer_targets = _BufferAverager(targets)

    @property
    def settled(self) -> bool:
        """Whether steps take their steady path: not compiling, or a kind of step decided
        (compiled, or kept eager) and no compilation under way."""
        return not self._compiling or (bool(self._decided) and not self._compilations)

    def describe(self) -> str:
        """The path the last step took, for the log."""
        if self.path == "eager":
            return "eager"
        return f"{self.path} (compiled in {self.compile_seconds:.1f} s)"

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
        applied and `tau` is given, every target network moved `tau` of the way."""
        # A step waits while a compilation runs (`_modules_in_use`), unless the run stops.
        if not self._wait_for(self._compilation_holds_modules.wait) or not self._wait_for(
            lambda seconds: self._modules_in_use.acquire(timeout=seconds)
        ):
            raise StepAbandoned("the run stopped while the step waited for a compilation")
        try:
            return self._step(tuple(train), inputs, tau)
        finally:
            self._modules_in_use.release()

    def _wait_for(self, attempt: Callable[[float], bool]) -> bool:
        """`attempt(seconds)` until it succeeds (at once, unless a compilation runs);
        False if `stopping` is set meanwhile."""
        while not attempt(_STOP_POLL_SECONDS):
            if self.stopping is not None and self.stopping.is_set():
                return False
        return True

    def _step(self, kind: Train, inputs: Mapping[str, Any], tau: float | None) -> StepResult:
        self.steps_taken += 1
        if self._compiling:
            if kind in self._compilations and not self._compilations[kind].is_alive():
                self._adopt(kind, inputs)
            if kind in self._decided:
                compiled = self._decided[kind]
                if compiled is not None:
                    return self._run_compiled(kind, compiled, inputs, tau)
            elif (
                kind not in self._compilations and len(self._timings.get(kind, ())) >= _EAGER_PROBES
            ):
                self._decide(kind, inputs)
                if self._decided.get(kind) is not None:
                    return self._run_compiled(kind, self._decided[kind], inputs, tau)
        return self._run_eager(kind, inputs, tau)

    # -- eager

    def _run_eager(self, kind: Train, inputs: Mapping[str, Any], tau: float | None) -> StepResult:
        started = time.perf_counter()
        self.path = "eager"
        groups = [self.groups[name] for name in kind]
        out = self.loss(inputs, kind)
        if out.proceed is not None and not bool(out.proceed):
            return StepResult(False, True, out.stats, out.priorities)
        params = [p for group in groups for p in group.parameters]
        applied = self.stepper(out.total, [group.optimizer for group in groups], params)
        if applied and tau is not None:
            for averager in self._eager_targets:
                averager(tau)
        if applied and self._compiling and kind not in self._decided:
            # What the compiled step of this kind must reproduce (module docstring), and
            # what an eager step costs.
            if kind not in self._used:
                layout = self._layout
                assert layout is not None
                self._used[kind] = _used(
                    layout, [i for name in kind for i in layout.group_params[name]]
                )
            self._timings.setdefault(kind, []).append(time.perf_counter() - started)
        return StepResult(applied, False, out.stats, out.priorities)

    # -- the decision, and compiling

    def _decide(self, kind: Train, inputs: Mapping[str, Any]) -> None:
        """Compile this kind of step, or keep it eager (--compile auto, where compiling
        would cost more than it saves over the steps left; said once in the log). In the
        background (`background`), a stop never waits for the compilation."""
        eager = statistics.median(self._timings[kind][1:])  # the first warms caches up
        record = _StepRecord.load(self._signature(kind, inputs))
        if self.mode == "auto":
            worth, reason = _worth_compiling(
                eager, record, self._steps_left(), _COMPILED_RATIO[self._hardware()]
            )
            if not worth:
                self._decided[kind] = None
                self.log(
                    f"the learner's update runs eagerly ({eager * 1e3:.2f} ms a step): {reason}"
                )
                return
        self._records[kind] = record._replace(eager=eager)
        copies = tree_map(_clone, dict(inputs))
        # Not a daemon: the interpreter's exit waits for it rather than freezing it
        # inside torch's C++ (which aborts the process); monobeast.py and polybeast.py
        # exit without waiting (`beast.cli.exit_process`).
        compilation = threading.Thread(
            target=self._compile, args=(kind, copies), name=f"compile-{'-'.join(kind)}"
        )
        self._compilations[kind] = compilation
        if self.background:
            self._compilation_holds_modules.clear()
            compilation.start()
        else:
            compilation.run()
            self._adopt(kind, inputs)

    def _adopt(self, kind: Train, inputs: Mapping[str, Any]) -> None:
        """A finished compilation: its step from now on (in a CUDA graph on CUDA, captured
        here, in the learner's thread), said once; or eager, said once, if it failed."""
        del self._compilations[kind]
        compiled = self._compiled_steps.pop(kind, None)
        if compiled is None:
            self._decided[kind] = None
            self._records.pop(kind, None)
            return
        if self.cuda_graphs and self._device().type == "cuda":
            try:
                compiled = _CudaGraphStep(compiled, self._arguments(inputs, copies=False))
            except Exception as error:  # a step that does not capture: compiled, ungraphed
                self.log(f"no CUDA graph for the learner's update ({_first_line(error)})")
        _configure_compiler()  # this thread runs the step, and recompiles it if need be
        self._decided[kind] = compiled
        seconds = self._compiled_seconds[kind]
        record = self._records[kind]
        cached = " from cached graphs" if record.compile_seconds is not None else ""
        self.log(
            f"the learner's update is compiled{cached} ({seconds:.1f} s;"
            f" eager it took {record.eager * 1e3:.2f} ms a step)"
        )
        self._records[kind] = record._replace(compile_seconds=seconds)

    def _steps_left(self) -> int | None:
        if self.expected_steps is None:
            return None
        return max(0, self.expected_steps - self.steps_taken)

    def _signature(self, kind: Train, inputs: Mapping[str, Any]) -> str:
        """What identifies this step's graph across runs: the loss, the parameters' and
        inputs' shapes and dtypes, the kind, the device and torch's version."""
        loss = getattr(self.loss, "__qualname__", type(self.loss).__qualname__)
        leaves = [
            (tuple(t.shape), str(t.dtype)) if isinstance(t, Tensor) else repr(t)
            for t in tree_leaves(dict(inputs))
        ]
        params = [tuple(p.shape) for p in self._layout.params] if self._layout else []
        text = repr((loss, kind, params, leaves, torch.__version__, str(self._device())))
        return hashlib.sha1(text.encode()).hexdigest()

    def _hardware(self) -> str:
        """What `_COMPILED_RATIO` knows: cuda, cpu, or cpu convolutions."""
        device = self._device().type
        if device == "cpu" and any(isinstance(m, nn.Conv2d) for m in self.program.modules()):
            return "cpu convolutions"
        return "cuda" if device == "cuda" else "cpu"

    def _device(self) -> torch.device:
        return self._layout.flat.device if self._layout is not None else torch.device("cpu")

    def _compile(self, kind: Train, inputs: Mapping[str, Any]) -> None:
        """Compile this kind's step by a dry run on copies of the state and of `inputs`
        (the run's state is untouched); the result waits in `_compiled_steps` for
        `_adopt`. The learner's steps wait meanwhile (`_modules_in_use`). A failure is
        said once, and the steps stay eager."""
        _configure_compiler()
        function = functools.partial(self._graph, kind=kind, used=self._used.get(kind))
        compiled = torch.compile(
            function, backend=_BACKEND, fullgraph=True, dynamic=False, **_lean_guards()
        )
        started = time.perf_counter()
        try:
            # On CPU the graph's wrapper (its calls of every kernel) in C++ too, not Python:
            # 7-11% off the DQN, PPO and SAC steps measured here.
            cpp_wrapper = self._device().type == "cpu"
            with self._modules_in_use, _inductor_patch(cpp_wrapper=cpp_wrapper):
                self._compilation_holds_modules.set()
                compiled(*self._arguments(inputs, copies=True))
        except Exception as error:  # dynamo/inductor errors, a missing C++ compiler
            if os.environ.get("BEAST_DEBUG_COMPILE"):
                raise
            self._decline(
                f"torch.compile failed ({type(error).__name__}: {_first_line(error)});"
                " --compile off skips compiling"
            )
            return
        finally:
            self._compilation_holds_modules.set()  # whatever happened: never a stuck learner
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        self._compiled_seconds[kind] = seconds
        self._compiled_steps[kind] = compiled

    def _arguments(self, inputs: Mapping[str, Tensor], *, copies: bool) -> tuple[Any, ...]:
        layout, state, lr = self._layout, self._state, self._lr
        assert layout is not None and state is not None and lr is not None
        assert self._tau is not None
        arguments = (layout.flat, layout.target_flat, state.steps, state.buffers, lr, self._tau)
        if copies:
            arguments = tree_map(_clone, arguments)
        return (*arguments, dict(inputs))

    def _run_compiled(
        self,
        kind: Train,
        compiled: Callable[..., tuple[Any, ...]],
        inputs: Mapping[str, Any],
        tau: float | None,
    ) -> StepResult:
        started = time.perf_counter()
        self._set_learning_rates()
        self._set_tau(tau)
        total, grad_norm, finite, weights_finite, proceed, stats, priorities = compiled(
            *self._arguments(inputs, copies=False)
        )
        self.path = "CUDA graph" if isinstance(compiled, _CudaGraphStep) else "compiled"
        record = self._records.get(kind)
        if record is not None:
            self._time_compiled(kind, record, bool(finite) and time.perf_counter() - started)
        if not bool(proceed):
            return StepResult(False, True, stats, priorities)
        groups = [self.groups[name] for name in kind]
        applied = self.stepper.record(
            finite=bool(finite),
            weights_finite=bool(weights_finite),
            loss=total,
            grad_norm=grad_norm,
            optimizers=[group.optimizer for group in groups],
        )
        if applied and tau is not None:
            self._buffer_targets(tau)
        return StepResult(applied, False, stats, priorities)

    def _time_compiled(self, kind: Train, record: _StepRecord, seconds: float) -> None:
        """Time the first compiled steps of a kind against the eager ones: under
        --compile auto, keep the compiled step only if it is faster (said once if not;
        --compile on keeps it regardless), and keep what compiling
        cost and gained for --compile auto's next decisions on this step
        (`_StepRecord`)."""
        timings = self._compiled_timings.setdefault(kind, [])
        if seconds:
            timings.append(seconds)
        if len(timings) <= _EAGER_PROBES:
            return
        del self._records[kind]
        compiled = statistics.median(timings[1:])
        record._replace(compiled=compiled).save()
        slower = record.eager is not None and compiled > _KEEP_COMPILED_BELOW * record.eager
        if self.mode == "auto" and slower:
            self._decided[kind] = None
            self.log(
                f"the compiled update took {compiled * 1e3:.2f} ms a step against"
                f" {record.eager * 1e3:.2f} eagerly: the learner goes on eagerly"
            )

    def _set_tau(self, tau: float | None) -> None:
        """This step's target averaging into the graph's input (0: none)."""
        value = 0.0 if tau is None else tau
        if value != self._tau_value:
            self._tau.fill_(value)
            self._tau_value = value

    def _set_learning_rates(self) -> None:
        """Each group's rate now (the stepper's schedule), into the graph's input and the
        optimizers (which the eager path and the log read)."""
        multiplier = self.stepper.lr_multiplier()
        if multiplier == self._lr_multiplier:
            return
        rates = []
        for group in self.groups.values():
            for settings in group.optimizer.param_groups:
                settings["lr"] = settings[INITIAL_LR] * multiplier
            rates.append(group.optimizer.param_groups[0]["lr"])
        assert self._lr is not None
        self._lr.copy_(torch.tensor(rates))
        self._lr_multiplier = multiplier

    def _graph(
        self,
        flat: Tensor,
        target_flat: Tensor,
        steps: Tensor,
        buffers: dict[str, Tensor],
        lr: Tensor,
        tau: Tensor,
        inputs: dict[str, Tensor],
        *,
        kind: Train,
        used: _Used | None,
    ) -> tuple[Any, ...]:
        """The compiled step (module docstring): writes `flat`, `target_flat`, `steps` and
        `buffers` in place; returns the loss, the gradient norm, its finiteness, the new
        weights' finiteness, whether the loss let the step proceed, the stats and the
        priorities. The targets move `tau`
        of the way (a tensor: 0 leaves them, without a second graph for the steps that
        do not average)."""
        layout, state = self._layout, self._state
        assert layout is not None and state is not None
        trained = {id(p): i for i, p in enumerate(layout.params)}
        followed = {id(p): i for i, p in enumerate(layout.target_params)}
        named = list(self.program.named_parameters(remove_duplicate=False))
        target_views = layout.target_views(target_flat)

        def loss(values: tuple[Tensor, ...]) -> tuple[Tensor, dict[str, Any]]:
            swapped = {}
            for name, p in named:
                if id(p) in trained:
                    swapped[name] = values[trained[id(p)]]
                elif id(p) in followed:
                    swapped[name] = target_views[followed[id(p)]]
            out = torch.func.functional_call(self.program, swapped, (inputs, kind), strict=False)
            # torch.func's auxiliary outputs are tensors only: the absent ones left out.
            aux = {"stats": out.stats}
            if out.priorities is not None:
                aux["priorities"] = out.priorities
            if out.proceed is not None:
                aux["proceed"] = out.proceed
            return out.total, aux

        # Gradients per parameter, then one concatenation: differentiating through views
        # of the flat buffer would build a zero-padded flat gradient for every parameter.
        per_param, (total, aux) = torch.func.grad_and_value(loss, has_aux=True)(
            tuple(layout.views(flat))
        )
        grads = torch.cat([g.reshape(-1) for g in per_param])
        regions = [layout.group_slices[name] for name in kind]
        grad_norm = torch.stack([grads[r].square().sum() for r in regions]).sum().sqrt()
        finite = torch.isfinite(total.detach()) & torch.isfinite(grad_norm)
        proceed = aux.get("proceed", torch.ones((), dtype=torch.bool, device=flat.device))
        ok = finite & proceed
        clipping = self.stepper.grad_norm_clipping
        scale = (clipping / (grad_norm + _CLIP_EPSILON)).clamp(max=1.0) if clipping > 0 else 1.0
        rates = {name: i for i, name in enumerate(self.groups)}
        # Each buffer is written once, whole, from its groups' new pieces in order: writes
        # into slices of a buffer would each become a pass over all of it.
        new_flat, new_buffers = [], {key: [] for key in buffers}
        new_steps = []
        for name, region in layout.group_slices.items():
            indices = layout.group_params[name]
            counts = steps[indices.start : indices.stop]
            pieces = {key: value[region] for key, value in buffers.items()}
            if name not in kind:
                new_flat.append(flat[region])
                new_steps.append(counts)
                for key, piece in pieces.items():
                    new_buffers[key].append(piece)
                continue
            gate = ok if used is None else ok & used.elements[region]
            update = _adam if state.kinds[name] == "adam" else _rmsprop
            param, moved = update(
                flat[region],
                grads[region] * scale,
                pieces,
                counts[0] + 1.0,
                lr[rates[name]],
                state.hyper[name],
            )
            new_flat.append(torch.where(gate, param, flat[region]))
            for key, piece in pieces.items():
                new_buffers[key].append(
                    torch.where(gate, moved[key], piece) if key in moved else piece
                )
            stepped = ok if used is None else ok & used.params[indices.start : indices.stop]
            new_steps.append(torch.where(stepped, counts + 1.0, counts))
        updated = torch.cat(new_flat)
        if layout.target_ranges:
            target_flat.copy_(
                _moved_targets(target_flat, updated, layout.target_ranges, tau, ok & (tau > 0))
            )
        flat.copy_(updated)
        steps.copy_(torch.cat(new_steps))
        for key, value in buffers.items():
            value.copy_(torch.cat(new_buffers[key]))
        # The new weights' check, as the eager path's `Stepper.check_weights` makes it (a
        # norm: inductor's boolean all() over a long buffer was measured to answer False
        # for finite weights now and then).
        weights_finite = torch.isfinite(torch.linalg.vector_norm(updated))
        return (
            total.detach(),
            grad_norm,
            finite,
            weights_finite,
            proceed,
            aux["stats"],
            aux.get("priorities"),
        )


def _moved_targets(
    target_flat: Tensor, online: Tensor, ranges: Sequence[slice], tau: Tensor, ok: Tensor
) -> Tensor:
    """The target buffer with its followed `ranges` moved `tau` of the way to `online`
    (lerp at 1 is the copy) where `ok`, the rest unchanged: one tensor, written once."""
    pieces, position = [], 0
    for region in ranges:
        if region.start > position:
            pieces.append(target_flat[position : region.start])
        old = target_flat[region]
        pieces.append(torch.where(ok, torch.lerp(old, online[region], tau), old))
        position = region.stop
    if position < target_flat.shape[0]:
        pieces.append(target_flat[position:])
    return torch.cat(pieces)


def _adam(
    param: Tensor,
    grad: Tensor,
    state: Mapping[str, Tensor],
    count: Tensor,
    lr: Tensor,
    hyper: Mapping[str, float],
) -> tuple[Tensor, dict[str, Tensor]]:
    """torch.optim.Adam's step (Kingma & Ba 2015, algorithm 1, in torch's order of
    operations) on flat tensors: the new parameters and moments."""
    beta1, beta2, eps = hyper["beta1"], hyper["beta2"], hyper["eps"]
    # Realised as a pair of scalars that the element loop reads, rather than the powers
    # recomputed for every element.
    step_size, correction2 = torch.stack(
        [lr / (1.0 - beta1**count), torch.sqrt(1.0 - beta2**count)]
    ).to(param.dtype)
    exp_avg = torch.lerp(state["exp_avg"], grad, 1.0 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + grad * grad * (1.0 - beta2)
    new_param = param - step_size * (exp_avg / (exp_avg_sq.sqrt() / correction2 + eps))
    return new_param, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def _rmsprop(
    param: Tensor,
    grad: Tensor,
    state: Mapping[str, Tensor],
    count: Tensor,
    lr: Tensor,
    hyper: Mapping[str, float],
) -> tuple[Tensor, dict[str, Tensor]]:
    """torch.optim.RMSprop's step (uncentered; Hinton's lecture 6e, in torch's order of
    operations) on flat tensors: the new parameters and averages."""
    alpha, eps, momentum = hyper["alpha"], hyper["eps"], hyper["momentum"]
    square_avg = state["square_avg"] * alpha + grad * grad * (1.0 - alpha)
    average = square_avg.sqrt() + eps
    if momentum > 0:
        buffer = state["momentum_buffer"] * momentum + grad / average
        return param - lr * buffer, {"square_avg": square_avg, "momentum_buffer": buffer}
    return param - lr * (grad / average), {"square_avg": square_avg}


def compilations_under_way() -> bool:
    """Whether a learner's compilation (a thread of its own) is still running."""
    return any(t.name.startswith("compile-") and t.is_alive() for t in threading.enumerate())


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:240]


def _lean_guards() -> dict[str, Any]:
    """torch.compile's arguments that keep only the guards on the tensors passed in (their
    shapes, dtypes, devices), where this torch has them: the graph's Python constants
    (modules, hyperparameters, the kind of step) are its compiled function's own
    (`isolate_recompiles`: its own entries, never another step's or kind's), and
    evaluating guards on all of them cost about as much as a small network's step."""
    keep = getattr(torch.compiler, "keep_tensor_guards_unsafe", None)
    if keep is None or "isolate_recompiles" not in inspect.signature(torch.compile).parameters:
        return {}
    return {"isolate_recompiles": True, "options": {"guard_filter_fn": keep}}


def _inductor_patch(**settings: Any) -> Any:
    """inductor's settings for the compilations inside the block."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(settings)


def _configure_compiler() -> None:
    """Before a compilation, and in the thread that runs compiled steps (which may
    recompile): generated CPU kernels follow the torch thread count at run time
    (`cpp.dynamic_threads`: the learner's count is measured and may change), compiled
    graphs persist in `compile_cache_dir()`, and dynamo traces through LSTM modules
    (`allow_rnn`: a compiled step runs their cell arithmetic itself, beast/models.py
    `_lstm_steps`, and only reads their parameters). torch keeps these settings per
    thread (its config overrides are context variables), so every such thread sets them."""
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch writes its /tmp default into TORCHINDUCTOR_CACHE_DIR the first time anything
    # asks for the cache, so a user's own setting is one that differs from that default.
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache_dir()
    inductor_config.cpp.dynamic_threads = True
    # Compile in-process: no pool of compile workers to outlive a stopped run (and on a
    # machine whose cores the run uses, no faster).
    inductor_config.compile_threads = 1
    torch._dynamo.config.allow_rnn = True


class _CudaGraphStep:
    """A compiled step replayed as one CUDA graph: the batch is copied into static input
    tensors, the graph replays every kernel of the step, the outputs are the graph's.

    The state tensors (flat buffers, steps, learning rates) are the step's own and keep
    their addresses, so the graph updates them in place. Warm-up runs go to copies of the
    state on a side stream (cuBLAS and the allocator set up outside the capture); the
    capture itself runs nothing. A batch of another shape runs the compiled step as is.
    """

    def __init__(self, step: Callable[..., tuple[Any, ...]], arguments: tuple[Any, ...]):
        *state, inputs = arguments
        self.step = step
        self.inputs = tree_map(_clone, inputs)
        self.shapes = _shapes(self.inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step(*tree_map(_clone, state), self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = step(*state, self.inputs)

    def __call__(self, *arguments: Any) -> tuple[Any, ...]:
        *state, inputs = arguments
        if _shapes(inputs) != self.shapes:
            return self.step(*state, inputs)
        for static, value in zip(tree_leaves(self.inputs), tree_leaves(inputs), strict=True):
            if isinstance(static, Tensor):
                static.copy_(value, non_blocking=True)
        self.graph.replay()
        return self.outputs


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def _shapes(tree: Any) -> list[Any]:
    return [
        (leaf.shape, leaf.dtype) if isinstance(leaf, Tensor) else leaf for leaf in tree_leaves(tree)
    ]
