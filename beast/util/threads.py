"""Daemon threads started and stopped together: the learners' and the inference server's;
and how a worker process follows the processes it depends on.

The first exception a thread raises is kept in `error` and sets the event the owner
passed in (the learner's `finished`, the inference server's `failed`), for the
runner's monitor to stop the run. QueueClosed ends a thread quietly: it is how
shutdown wakes a thread blocked on a queue or the batcher.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from beast.native import QueueClosed
from beast.util.parent_death import signal_when_parent_dies

__all__ = ["ThreadGroup", "die_with_fork_server", "process_alive"]

# The process that imported this module. In a child of the actors' fork server, which
# imports it when it preloads beast.acting.actor, that is the server.
_IMPORTED_BY = os.getpid()


class ThreadGroup:
    def __init__(self, on_error: threading.Event) -> None:
        self.error: BaseException | None = None
        self._on_error = on_error
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _add_thread(self, loop: Callable[[], None], name: str) -> None:
        self._threads.append(
            threading.Thread(target=self._run, args=(loop,), name=name, daemon=True)
        )

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every thread to stop and join them, `timeout` seconds in all."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except QueueClosed:
            pass
        except BaseException as error:  # reported by the runner's monitor
            self.error = error
            self._on_error.set()


def process_alive(pid: int) -> bool:
    """False once process `pid` has exited, including as a zombie not yet reaped: how actors
    and writers blocked on a queue notice that the learner is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def die_with_fork_server() -> None:
    """Have the kernel SIGKILL this process when the fork server it was forked from dies,
    and die now if that has happened already.

    The supervisor (beast/acting/supervisor.py) then sees it gone at once and replaces it through
    a new server; and a child whose server died before telling the supervisor its pid
    cannot run on unsupervised. Nothing happens in a process that imported this module
    itself (--serial, a spawned child): it has no fork server.
    """
    server = _IMPORTED_BY
    if server == os.getpid():
        return
    signal_when_parent_dies(signal.SIGKILL)
    if os.getppid() != server:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
