"""Stop signals (Ctrl-C's SIGINT, SIGTERM) turned into one clean stop of a run.

A run's start-up holds Ctrl-C (`hold_interrupts_during_start_up`): the entry scripts
install the hold before their imports (beast/run/cli.py's `run_script`), and the run
raises the KeyboardInterrupt at a point of its own (`raise_if_interrupt_held`, or its
loop's `raise_if_stop_requested`).
A KeyboardInterrupt raised wherever the main thread happens to be is not safe there:
inside torch's import it is raised through pybind11 and aborts the process ("terminate
called after throwing an instance of 'pybind11::error_already_set'", exit -6; ale_py's
nanobind the same), and C code that clears errors can drop it silently.

Once a run's loop is up, `stop_on_signals` makes SIGINT and SIGTERM raise at once, and
keeps the request in a flag that the loops look at too: the interrupt can be raised in a
finalizer (multiprocessing's, closing a dead actor's pipes during a garbage collection),
where Python prints it and drops it.

Nothing here imports beyond the standard library: the hold goes in before the imports.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = [
    "hold_interrupts_during_start_up",
    "ignore_interrupts",
    "raise_if_interrupt_held",
    "raise_if_stop_requested",
    "raise_keyboard_interrupt",
    "release_held_interrupts",
    "stop_on_signals",
]

# Set by a stop signal's handler (see the module's docstring).
_STOP_REQUESTED = threading.Event()


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    _STOP_REQUESTED.set()
    raise KeyboardInterrupt


def _hold_interrupt(signum: int, frame: Any) -> None:
    """The first Ctrl-C of a start-up is kept for the run to raise; a second one raises
    here, for a start-up that would not reach the run's own check (an env that hangs)."""
    if _STOP_REQUESTED.is_set():
        raise KeyboardInterrupt
    _STOP_REQUESTED.set()


def hold_interrupts_during_start_up() -> None:
    """Hold SIGINT until the run raises it (`raise_if_interrupt_held`) or its loop takes
    over (`stop_on_signals`). Call from the main thread, before the heavy imports."""
    _STOP_REQUESTED.clear()
    signal.signal(signal.SIGINT, _hold_interrupt)


def _holding() -> bool:
    return signal.getsignal(signal.SIGINT) is _hold_interrupt


def raise_if_interrupt_held() -> None:
    """KeyboardInterrupt if the start-up's hold is in place and holds a Ctrl-C; not for
    a stop an earlier run in this process took (the runs of a test, or of a sweep)."""
    if _holding() and _STOP_REQUESTED.is_set():
        raise KeyboardInterrupt


def release_held_interrupts() -> None:
    """Back to Python's own Ctrl-C (for work with no loop of its own, such as --mode
    test), raising first a Ctrl-C that was held."""
    if _holding():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if _STOP_REQUESTED.is_set():
            raise KeyboardInterrupt


def raise_if_stop_requested() -> None:
    """KeyboardInterrupt if a stop signal came since the start-up's hold or
    `stop_on_signals`, but was held or dropped: a run's loop calls it each pass. Only in
    the main thread, whose run installed the handlers: a run in another thread keeps the
    process's own, and a stop an earlier run took is not its own."""
    if _STOP_REQUESTED.is_set() and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt


def stop_on_signals() -> dict[int, Any]:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt; returns the handlers they replace.

    Installed explicitly: a shell starts background jobs with SIGINT ignored, and `kill
    -INT` must still stop the run cleanly. A Ctrl-C held during the start-up stays
    requested, and stops the run at its loop's first pass. Only the main thread may set
    handlers: a run started from another thread (a Ray Tune trial, beast.train in a
    thread) keeps the process's own and returns {}; it ends at total_steps or on an error.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    if not _holding():
        _STOP_REQUESTED.clear()  # a stop an earlier run in this process took
    return {
        signum: signal.signal(signum, raise_keyboard_interrupt)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }


def ignore_interrupts() -> None:
    """For the processes the run stops itself (actors, evaluators): SIGINT ignored, as a
    terminal's Ctrl-C reaches the whole process group, and unblocked, as the fork server
    they fork from started with it blocked (beast/acting/fork_server.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
