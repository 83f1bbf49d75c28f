"""What a `TrainStep` says of its update's path (beast/train_step/step.py): the run's
start-up plan, the line that announces a build in the background, the progress line's
count of its seconds and, once, of the switch to the compiled step, and the line saying
a kind went compiled. Each is returned as a string; the step logs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from beast.train_step import auto
from beast.train_step.interface import Kind

__all__ = ["BuildProgress", "compiled_line", "plan", "subject"]


def subject(kind: Kind) -> str:
    """What a log line about `kind`'s path names: the update's steps, or its forward pass
    (a kind that trains nothing)."""
    return "the learner's update" if kind else "the learner's forward pass before its steps"


def plan(builds: auto.BuildClass, packaged: bool, mode: str) -> str:
    """The start-up line's path of a compiling update of `builds`' class: the package an
    earlier run of this setup built (`packaged`: compiled from the first step), or a
    compilation after the first steps (on CPU a build in the background, the learner
    eager until it is done), with about how long it takes: the median of this machine's
    past builds, or a prior (`auto.BuildHistory`); under --compile auto (`mode`), if the
    steps left pay for it."""
    if packaged:
        return "the update compiled from its package of an earlier run"
    seconds, source = auto.BuildHistory.estimate(builds)
    about = f"about {seconds:.0f} s {source}"
    if builds.hardware == "cuda":
        how = f"compiling it by torch.compile ({about}; the steps wait)"
    else:
        how = f"compiling it in the background ({about}; eager until then)"
    if mode == "auto":
        return f"the update eager for its first steps, then {how} if the steps left pay for it"
    return f"the update eager for its first steps, then {how}"


def compiled_line(kind: Kind, seconds: float, built: float | None, cached: bool, took: str) -> str:
    """The line saying `kind` runs compiled from now on, after `seconds` of compiling:
    its package built in this run (`built` seconds), one an earlier run built (`built`
    0), or torch.compile's (`built` None; `cached`: from cached graphs); `took`: what an
    eager step took."""
    if built:
        how = f" ({seconds:.1f} s, its package built beside the learner's eager steps;"
    elif built is not None:
        how = f" from its package of an earlier run ({seconds:.1f} s;"
    else:
        how = f"{' from cached graphs' if cached else ''} ({seconds:.1f} s;"
    return f"{subject(kind)} is compiled{how} eager it took {took})"


class BuildProgress:
    """The builds of a step's kinds in the background, for the progress line: each
    build's start and estimate while it runs, then, once, where the compiled step took
    over; and the estimates of the next builds (`auto.BuildHistory`)."""

    def __init__(self) -> None:
        # A build under way: when it started and about how long it takes (`note`).
        self._started: dict[Kind, tuple[float, float]] = {}
        # Where a compiled step took over from the eager one (the agent step, the build's
        # seconds), until the progress line has said so once.
        self._switched: tuple[int | None, float] | None = None

    def start(self, kind: Kind, parts: int, builds: auto.BuildClass) -> str:
        """A build of `kind` (`parts` steps a call, of `builds`' class) starting now: the line
        that says so at once, with about how long it takes (`auto.BuildHistory`)."""
        seconds, source = auto.BuildHistory.estimate(builds, parts)
        self._started[kind] = (time.perf_counter(), seconds)
        named = subject(kind).replace("the learner's ", "the ")
        if builds.hardware == "cuda":
            return (
                f"compiling {named} by torch.compile (about {seconds:.0f} s {source});"
                " the learner's steps wait for it"
            )
        return (
            f"compiling {named} in the background (about {seconds:.0f} s {source});"
            " eager until then"
        )

    def failed(self, kind: Kind) -> None:
        """`kind`'s compilation failed: no build of it under way."""
        self._started.pop(kind, None)

    def adopted(
        self,
        kind: Kind,
        parts: int,
        seconds: float,
        built: float | None,
        step: int | None,
        builds: Callable[[], auto.BuildClass],
    ) -> None:
        """`kind` compiled in `seconds` (`built`: its package's build, as `compiled_line`),
        adopted at agent step `step`: where it was built in this run, what the progress
        line marks once (`note`), and the next builds' estimate (a build's own seconds:
        trace to load, of `builds`' class)."""
        if self._started.pop(kind, None) is not None or built:
            self._switched = (step, seconds)
            auto.BuildHistory.add(builds(), seconds, parts)

    def note(self, compilations: Mapping[Kind, threading.Thread]) -> str | None:
        """What the progress line adds: a build under way (its seconds so far, of about
        how many), or, once, the switch to the compiled step."""
        now = time.perf_counter()
        for kind, (started, estimate) in list(self._started.items()):
            compilation = compilations.get(kind)
            if compilation is not None and compilation.is_alive():
                return f"update eager, compiling ({now - started:.0f} s of about {estimate:.0f})"
        switched, self._switched = self._switched, None
        if switched is None:
            return None
        step, seconds = switched
        at = f" at step {step:,}" if step is not None else ""
        return f"update compiled{at} (built in {seconds:.0f} s)"
