"""The actors' fork server: one process that imports beast.acting.actor (and torch) once, from
which every actor and evaluator process forks (fast restarts, and no fork of the
multi-threaded learner process).

Its imports take 1.4 s on this project's 2-core machine. A run with actor processes
starts it (`start`) once its config is known and before its own start-up (the env's
probe, the model's build, the thread tuner), so that the server's imports run on the
other core meanwhile; a run with no actor process (--serial, a config file's `serial`,
--mode test) never starts it. Nothing here imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import threading

__all__ = ["actor_context", "start", "stop"]


def actor_context() -> mp.context.ForkServerContext:
    """The context actors and evaluators are started from."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["beast.acting.actor"])
    return ctx


def start() -> None:
    """Start the fork server now, if it is not running; at this process's exit, one still
    importing (a run that stopped early) is stopped with it, not left to finish its
    imports alone.

    It starts with SIGINT blocked, which it keeps across its exec and its interpreter's
    start: a terminal's Ctrl-C reaches the whole process group, and multiprocessing's
    server ignores SIGINT only once its imports are done, so a Ctrl-C in the run's first
    seconds printed a KeyboardInterrupt traceback from them (or a "Fatal Python error"
    from its interpreter's start). Blocked here, not ignored: a Ctrl-C to this process
    while the server starts waits for the unblock, where an ignored one was lost and the
    run trained on. The run stops the server and its actors itself; they unblock SIGINT
    (beast.util.interrupts.ignore_interrupts). The resource tracker, which the server's
    start would start first, starts before the block: its start unblocks SIGINT when
    done, whatever the mask was."""
    actor_context()
    multiprocessing.resource_tracker.ensure_running()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    atexit.unregister(stop)  # once, however many runs this process starts
    atexit.register(stop)


def stop() -> None:
    """Stop the fork server if one is running (what it started has stopped already: a run
    stops its actors first), as multiprocessing's own `_stop` does but without waiting:
    it may be importing still, and is collected in a thread of its own."""
    server = multiprocessing.forkserver._forkserver
    with server._lock:
        pid = server._forkserver_pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        os.close(server._forkserver_alive_fd)
        address = server._forkserver_address
        if not multiprocessing.util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        server._forkserver_pid = server._forkserver_alive_fd = None
        server._forkserver_address = None
    threading.Thread(target=_collect, args=(pid,), name="fork-server-collect", daemon=True).start()


def _collect(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
