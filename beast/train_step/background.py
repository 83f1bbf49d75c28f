"""Compilations in a thread of their own (beast/train_step/__init__.py): the learner's
steps wait for one, the rest of a run (actors, logging, a stop) does not, and a step
waiting when the run stops gives up (`StepAbandoned`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MODULES_IN_USE",
    "ModulesInUse",
    "StepAbandoned",
    "compilation_thread",
    "compilations_under_way",
    "wait_for_compilations",
]

# How often a step waiting for a compilation looks whether the run is stopping.
_STOP_POLL_SECONDS = 0.1
# The names of compilation threads begin with it (`compilations_under_way`).
_THREAD_PREFIX = "compile-"


class StepAbandoned(Exception):
    """The run began to stop while a step waited for a compilation: no step was taken
    (the learner's loop ends on it, as on a closed queue)."""


class ModulesInUse:
    """Who may run torch code of the learner's: one step at a time, or a compilation for
    as long as it runs. What a compilation does is seen by the whole process: torch.fx
    patches nn.Module.__call__ while it traces, so a module called from the learner's
    thread meanwhile would be traced, not run (a PPO run's eager step died of "module is
    not installed as a submodule"); and torch.export raises a process-wide flag under
    which every optimizer call annotates one global dict that the export's tracer
    annotates too (a DQN step's `zero_grad`, in a process where another update's
    compilation exported, died of KeyError: 'custom'; so did a checkpoint's, and the next
    run's `torch.manual_seed`). So there is one, `MODULES_IN_USE`, for every update in the
    process, held too by whatever else calls such functions while a run's compilation may
    run (a checkpoint, an evaluation in the learner's process)."""

    def __init__(self) -> None:
        # Held by every step and by a compilation for as long as it runs.
        self._lock = threading.RLock()
        # Set once a compilation started in the background holds `_lock` (the learner's
        # next step waits for that, or it could take the lock back first, and again at
        # every step: Python's locks are not fair).
        self._compilation_holds = threading.Event()
        self._compilation_holds.set()
        # Who waits for a compilation, and since when (`waiting_seconds`).
        self._waiting: dict[object, float] = {}
        self._compiling = False  # `compilation_holds_them`

    @contextlib.contextmanager
    def held(self, stopping: threading.Event | None = None) -> Iterator[None]:
        """Held for one step (or a checkpoint, an evaluation), once any compilation under
        way is done; StepAbandoned if `stopping` is set while it waits."""
        if not (self._compilation_holds.is_set() and self._lock.acquire(blocking=False)):
            waiter = object()
            self._waiting[waiter] = time.monotonic()
            try:
                if not _wait_for(self._compilation_holds.wait, stopping) or not _wait_for(
                    lambda seconds: self._lock.acquire(timeout=seconds), stopping
                ):
                    raise StepAbandoned("the run stopped while the step waited for a compilation")
            finally:
                del self._waiting[waiter]
        try:
            yield
        finally:
            self._lock.release()

    def waiting_seconds(self) -> float:
        """How long the longest waiter (a step, a checkpoint) has waited for a compilation;
        0 when none waits. The progress line says so: on CUDA a run's steps stop for the
        whole compilation (30-90 s of "SPS 0" on an H100 otherwise unexplained)."""
        started = list(self._waiting.values())
        return time.monotonic() - min(started) if started else 0.0

    def compilation_starting(self) -> None:
        """Before a compilation thread starts: the next step waits until it holds them."""
        self._compilation_holds.clear()

    @contextlib.contextmanager
    def for_compilation(self) -> Iterator[None]:
        """Held for a compilation (in its own thread or the learner's)."""
        try:
            with self._lock:
                self._compilation_holds.set()
                self._compiling = True
                try:
                    yield
                finally:
                    self._compiling = False
        finally:
            self._compilation_holds.set()  # whatever happened: never a stuck learner

    def compilation_holds_them(self) -> bool:
        """Whether a compilation holds them now: a step or a checkpoint would wait for it
        (on CUDA for the whole compilation; on CPU while a trace is exported, not while
        its package builds)."""
        return self._compiling


# Every update's steps and compilations in this process take turns through it.
MODULES_IN_USE = ModulesInUse()


def _wait_for(attempt: Callable[[float], bool], stopping: threading.Event | None) -> bool:
    """`attempt(seconds)` until it succeeds (at once, unless a compilation runs); False
    if `stopping` is set meanwhile."""
    while not attempt(_STOP_POLL_SECONDS):
        if stopping is not None and stopping.is_set():
            return False
    return True


def compilation_thread(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    """A compilation's thread (not started), named for `compilations_under_way`. Not a
    daemon: the interpreter's exit waits for it rather than freezing it inside torch's
    C++ (which aborts the process); monobeast.py and polybeast.py exit without waiting
    (`beast.run.cli.exit_process`)."""
    # daemon=False said, not left to the default: a thread started from a daemon thread
    # (the learner's) is one too, and the interpreter's exit then ended it inside torch's
    # C++ (which aborts the process: "terminate called without an active exception").
    return threading.Thread(target=target, args=args, name=f"{_THREAD_PREFIX}{name}", daemon=False)


def _compilation_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(_THREAD_PREFIX) and t.is_alive()]


def compilations_under_way() -> bool:
    """Whether a learner's compilation (a thread of its own) is still running."""
    return bool(_compilation_threads())


def wait_for_compilations() -> None:
    """Until the compilations under way in this process are done (at a run's set-up: an
    earlier run's, which a stop does not wait for, its builds stopped and an export
    ending in seconds; or a run's beside it in another thread): the set-up must not call
    torch while one exports (`ModulesInUse`)."""
    for thread in _compilation_threads():
        thread.join()
