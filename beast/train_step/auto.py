"""--compile auto's decision (beast/train_step/__init__.py): compile a kind of step only
where the run's remaining steps would save more than compiling costs, and keep the
compiled step only if it is measured faster. What compiling cost and gained is kept
beside the compiled graphs (`StepRecord`), so the next run decides with real figures."""

from __future__ import annotations

import collections
import hashlib
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves

from beast.train_step.interface import Kind, Train
from beast.util.records import read_record, write_record

__all__ = [
    "BUILD_SHARE_PER_EXTRA_STEP",
    "BuildClass",
    "BuildHistory",
    "COMPILED_RATIO",
    "Decision",
    "EAGER_PROBES",
    "FIRST_BUILD_SECONDS",
    "KEEP_COMPILED_BELOW",
    "RECURRENT_BUILD_FACTOR",
    "RETRY_BELOW_SECONDS",
    "StepRecord",
    "build_share",
    "hardware",
    "signature",
    "worth_compiling",
]

# What --compile auto assumes before a step has been compiled on this machine: what a
# first compilation costs the run, and a compiled step's time over an eager one's. On CPU
# the step's package is built in a process beside the run, which goes on eagerly: a DQN
# CartPole run kept ~70% of its eager rate for the 28 s its first build took on 2 cores
# (about 8 s lost), and a package built once loads in under a second; networks with
# convolutions build for about as long, or longer (`FIRST_BUILD_SECONDS`). On CUDA
# torch.compile stalls the learner (SAC's step, 35-76 s). The ratios: on CPU 0.3-0.5 for
# the MLPs of classic control and MuJoCo (benchmarks/RESULTS.md), 0.8-1.1 for
# convolutional networks, whose time is their convolutions'; on CUDA 0.1-0.3.
FIRST_COMPILE_SECONDS = {"cpu": 10.0, "cpu convolutions": 30.0, "cuda": 60.0}
# A call of K steps (a block, `TrainStep.steps`) on CUDA unrolls them in one graph, whose
# build takes longer: each step past the first adds about this share of a one-step build
# (measured on CPU when CPU blocks were unrolled too: DQN CartPole's block of 4, 51 s
# against 27 s for one step; PPO's of 5, 51 s against 25). On CPU a block's steps are
# one step's package called once each (package.ChainedSteps): one build (`build_share`).
BUILD_SHARE_PER_EXTRA_STEP = 0.3
COMPILED_RATIO = {"cpu": 0.6, "cpu convolutions": 0.9, "cuda": 0.3}
# A compiled step kept only if at least this much faster than the eager one, measured.
KEEP_COMPILED_BELOW = 0.97
# A record that says the compiled step was no faster is put to the test again where
# compiling costs less than this (a package's load, the trace before it included: 0.1-
# 0.5 s alone, 2.3 s in a SAC HalfCheetah run on 2 busy cores; a build takes 10 s and
# more): one timing on a busy machine would otherwise keep every later run of the step
# eager, with nothing to correct it (a record of compiled SAC at 25 ms against 17.7
# eager, after a 2.3 s load, kept 5,000-step HalfCheetah runs eager at 60-75 env steps/s;
# compiled, the same run went 104-111).
RETRY_BELOW_SECONDS = 5.0
# Eager steps of each kind timed before deciding (the first, warming caches, not counted).
EAGER_PROBES = 4
# How long a package's build takes (CPU) or torch.compile's compilation (CUDA), before
# this machine has done one: what the log announces, not what auto weighs (that is what
# the build costs the run, which goes on eagerly meanwhile: `FIRST_COMPILE_SECONDS`).
# Convolutional steps on the 2-core VM (2026-12-07): IMPALA's, LASER's and PPO's Pong
# updates 19-25 s in their runs, Rainbow's 16.4 s and R2D2's 133 s (its LSTM's 80 steps
# unrolled) in `benchmarks.cold_build`; the prior is the common case, and a machine's
# own builds replace it (`BuildHistory`).
FIRST_BUILD_SECONDS = {"cpu": 20.0, "cpu convolutions": 25.0, "cuda": 60.0}
# A recurrent core's steps are unrolled in the graph, so its builds take several times
# longer: R2D2's Pong update 133 s (`benchmarks.cold_build`) and 146 s in a run, against
# 16-25 s for the feed-forward convolutional steps above. Their own history (`BuildClass`)
# keeps them from skewing the feed-forward steps' estimate, and the feed-forward steps'
# from announcing "about 19 s" for a build of 146; before one, the prior is this factor
# over the hardware's.
RECURRENT_BUILD_FACTOR = 5.5


def build_share(hardware: str, steps_per_call: int) -> float:
    """A build of a call of `steps_per_call` steps over a one-step build's: on CUDA the
    steps are unrolled in one graph (`BUILD_SHARE_PER_EXTRA_STEP` a step past the first);
    on CPU each distinct step is its own package (package.ChainedSteps), as cheap to
    build as one step's."""
    if hardware != "cuda":
        return 1.0
    return 1 + BUILD_SHARE_PER_EXTRA_STEP * max(steps_per_call - 1, 0)


class BuildClass(NamedTuple):
    """The steps whose builds take about as long as each other's: the same hardware
    (`hardware`), and a recurrent core or none (`RECURRENT_BUILD_FACTOR`)."""

    hardware: str
    recurrent: bool = False

    @classmethod
    def of(cls, device: torch.device, modules: Iterable[nn.Module]) -> BuildClass:
        modules = list(modules)
        recurrent = any(isinstance(m, nn.RNNBase) for m in modules)
        return cls(hardware(device, modules), recurrent)

    @property
    def key(self) -> str:
        return self.hardware + (" recurrent" if self.recurrent else "")

    def prior(self) -> float:
        """A build's seconds before this machine has done one of the class."""
        seconds = FIRST_BUILD_SECONDS[self.hardware]
        return seconds * RECURRENT_BUILD_FACTOR if self.recurrent else seconds


class BuildHistory:
    """How long the last builds of compiled steps took on this machine, by `BuildClass`,
    kept beside the compiled graphs: the log's "about N s" for the next build of any
    step of the class (a step built once loads from its package, so the figures that
    matter are other steps'). Each figure is kept per step of its call (a block of K
    steps builds for longer, `BUILD_SHARE_PER_EXTRA_STEP`)."""

    _FILE = "beast_builds.json"
    _KEEP = 10  # the newest figures, per class

    @classmethod
    def estimate(cls, builds: BuildClass, steps_per_call: int = 1) -> tuple[float, str]:
        """About how long a build of a call of `steps_per_call` steps takes here, and
        where the figure comes from: the median of past builds of the class, or the prior
        (`BuildClass.prior`)."""
        figures = read_record(cls._FILE, builds.key).get("seconds_per_unit")
        scale = build_share(builds.hardware, steps_per_call)
        if isinstance(figures, list) and figures:
            try:
                return statistics.median(float(f) for f in figures) * scale, "from past builds"
            except (TypeError, ValueError):
                pass
        return builds.prior() * scale, "from a prior"

    @classmethod
    def add(cls, builds: BuildClass, seconds: float, steps_per_call: int = 1) -> None:
        """A build of a call of `steps_per_call` steps took `seconds`."""
        figures = read_record(cls._FILE, builds.key).get("seconds_per_unit")
        figures = [f for f in figures if isinstance(f, (int, float))] if figures else []
        scale = build_share(builds.hardware, steps_per_call)
        figures.append(round(seconds / scale, 2))
        write_record(cls._FILE, builds.key, {"seconds_per_unit": figures[-cls._KEEP :]})


class StepRecord(NamedTuple):
    """What compiling one step cost and gained on this machine (seconds), kept in the
    compile cache by `signature`, so that --compile auto decides with the next run's real
    cost: cached graphs load in seconds where a first compilation takes a minute. None
    where not yet known."""

    signature: str
    compile_seconds: float | None = None
    eager: float | None = None
    compiled: float | None = None

    _FILE = "beast_steps.json"

    @classmethod
    def load(cls, signature: str) -> StepRecord:
        known = read_record(cls._FILE, signature)
        return cls(signature, **{k: known.get(k) for k in cls._fields[1:]})

    def save(self) -> None:
        """Into the shared record file (beast/util/records.py); a read-only home keeps nothing:
        auto decides on the defaults next time."""
        figures = {k: v for k, v in self._asdict().items() if k != "signature"}
        write_record(self._FILE, self.signature, figures)


def signature(
    loss: Callable[..., Any],
    kind: Train,
    inputs: Mapping[str, Any],
    params: Sequence[Tensor],
    device: torch.device,
) -> str:
    """What identifies a step's graph across runs: the loss, the parameters' and inputs'
    shapes and dtypes, the kind, the device and torch's version."""
    name = getattr(loss, "__qualname__", type(loss).__qualname__)
    leaves = [
        (tuple(t.shape), str(t.dtype)) if isinstance(t, Tensor) else repr(t)
        for t in tree_leaves(dict(inputs))
    ]
    shapes = [tuple(p.shape) for p in params]
    text = repr((name, kind, shapes, leaves, torch.__version__, str(device)))
    return hashlib.sha1(text.encode()).hexdigest()


def hardware(device: torch.device, modules: Iterable[nn.Module]) -> str:
    """What `COMPILED_RATIO` knows: cuda, cpu, or cpu convolutions."""
    if device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in modules):
        return "cpu convolutions"
    return "cuda" if device.type == "cuda" else "cpu"


def worth_compiling(
    eager: float,
    record: StepRecord,
    calls_left: int | None,
    hardware: str,
    steps_per_call: int = 1,
) -> tuple[bool, str]:
    """Whether compiling a step pays over the calls left (--compile auto), and why not.
    `eager`: seconds a call (of `steps_per_call` optimizer steps), `calls_left` of them.
    Before a first compilation on this machine, it assumes `hardware`'s cost and
    compiled-to-eager time ratio (`FIRST_COMPILE_SECONDS`, `COMPILED_RATIO`), the cost
    grown for a call of several steps (`BUILD_SHARE_PER_EXTRA_STEP`)."""
    if calls_left is None:
        return True, ""
    ratio = COMPILED_RATIO[hardware]
    cost = record.compile_seconds
    first = cost is None
    if first:
        cost = FIRST_COMPILE_SECONDS[hardware] * build_share(hardware, steps_per_call)
    measured = record.compiled / record.eager if record.eager and record.compiled else None
    if measured is not None and (measured < KEEP_COMPILED_BELOW or cost >= RETRY_BELOW_SECONDS):
        ratio = measured
    saving = calls_left * eager * (1.0 - ratio)
    if saving > cost:
        return True, ""
    hint = (
        " (once compiled, a step loads in seconds: --compile on compiles it now and lets"
        " later runs of this config compile by default)"
        if first
        else ""
    )
    return False, (
        f"compiling costs about {cost:.0f} s{' the first time' if first else ''}, and"
        f" {calls_left:,} more calls of the step would save about {saving:.0f} s{hint}"
    )


class Decision:
    """--compile auto's bookkeeping for one `TrainStep` (beast/train_step/step.py): the calls
    and steps each kind of step made (`calls`, `steps`: the step's own counters), its timed
    eager calls, and, for a kind just compiled, its record and its compiled calls timed
    against the eager ones. `mode`: --compile (auto decides; on compiles, and keeps,
    regardless). `expected_steps`: about how many optimizer steps the run takes."""

    def __init__(
        self,
        mode: str,
        expected_steps: int | None,
        calls: collections.Counter[Kind],
        steps: collections.Counter[Kind],
    ) -> None:
        self.mode, self.expected_steps = mode, expected_steps
        self.calls, self.steps = calls, steps
        self.eager_timings: dict[Kind, list[float]] = {}
        self.timed: dict[Kind, StepRecord] = {}  # kinds whose compiled calls are being timed
        self.compiled_timings: dict[Kind, list[float]] = {}

    def steps_taken(self) -> int:
        """Optimizer steps taken: the steps of every kind that trains something."""
        return sum(count for kind, count in self.steps.items() if kind)

    def add_eager(self, kind: Kind, seconds: float) -> None:
        self.eager_timings.setdefault(kind, []).append(seconds)

    def probed(self, kind: Kind) -> bool:
        """Whether `kind` made its `EAGER_PROBES` timed eager calls: time to decide."""
        return len(self.eager_timings.get(kind, ())) >= EAGER_PROBES

    def eager_seconds(self, kind: Kind) -> float:
        """An eager call's median time, the first (which warms caches up) left out."""
        return statistics.median(self.eager_timings[kind][1:])

    def calls_left(self, kind: Kind) -> int | None:
        """About how many more calls of `kind` the run will make: the optimizer steps left
        over the steps a call of it took so far (a block's: several), and for a
        forward-only kind as many as it came per step so far (PPO's targets: one an update
        of 20 steps)."""
        if self.expected_steps is None:
            return None
        taken = self.steps_taken()
        steps_so_far = self.steps[kind] if kind else taken
        return max(0, self.expected_steps - taken) * self.calls[kind] // max(1, steps_so_far)

    def per_step(self, kind: Kind, seconds: float | None) -> str:
        """A call's `seconds`, per step of the calls of `kind` so far, for the log."""
        per_call = self.steps[kind] / max(1, self.calls[kind])
        return f"{(seconds or 0.0) / max(1.0, per_call) * 1e3:.2f} ms a step"

    def not_worth(
        self, kind: Kind, eager: float, record: StepRecord, parts: int, hardware: str
    ) -> str | None:
        """Under --compile auto, why compiling a call of `parts` steps, `eager` seconds,
        would not pay over the calls left; None where it would, or where the mode is not
        auto."""
        if self.mode != "auto":
            return None
        worth, reason = worth_compiling(eager, record, self.calls_left(kind), hardware, parts)
        return None if worth else reason

    def time_compiled(self, kind: Kind, seconds: float) -> str | None:
        """Time the first compiled calls of a kind being timed against its eager ones
        (`seconds`: 0 for a call that was not finite, which does not count). Once timed, its
        record keeps what compiling cost and gained for the next decisions on this step;
        returns why the step goes back to eager (under --compile auto, a compiled step no
        faster than the eager one), else None (--compile on keeps it regardless)."""
        record = self.timed[kind]
        timings = self.compiled_timings.setdefault(kind, [])
        if seconds:
            timings.append(seconds)
        if len(timings) <= EAGER_PROBES:
            return None
        del self.timed[kind]
        compiled = statistics.median(timings[1:])
        record._replace(compiled=compiled).save()
        slower = record.eager is not None and compiled > KEEP_COMPILED_BELOW * record.eager
        if self.mode != "auto" or not slower:
            return None
        return (
            f"the compiled update took {self.per_step(kind, compiled)} against"
            f" {self.per_step(kind, record.eager)} eagerly: the learner goes on eagerly"
        )
