"""Ctrl-C during a run's start-up (beast/util/interrupts.py, beast/acting/fork_server.py):
held, never lost, raised where the run chooses."""

import contextlib
import multiprocessing.forkserver
import signal
import subprocess
import sys
import textwrap

import pytest

from beast.acting import fork_server
from beast.util.interrupts import (
    hold_interrupts_during_start_up,
    raise_if_interrupt_held,
    raise_if_stop_requested,
    raise_keyboard_interrupt,
    release_held_interrupts,
    stop_on_signals,
)


@pytest.fixture
def own_sigint():
    """The test's changes to the stop signals' handlers, SIGINT's mask and the request
    flag end with it."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_on_signals()  # with no hold in place, clears a request the test left
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def test_a_held_ctrl_c_is_raised_by_the_run_not_where_it_landed(own_sigint):
    hold_interrupts_during_start_up()
    raise_if_interrupt_held()  # nothing held yet
    signal.raise_signal(signal.SIGINT)  # would raise inside an import (pybind11: abort)
    with pytest.raises(KeyboardInterrupt):
        raise_if_interrupt_held()
    with pytest.raises(KeyboardInterrupt):
        raise_if_stop_requested()


def test_a_stop_an_earlier_run_took_is_not_held_for_the_next(own_sigint):
    """In-process runs one after the other (a test's, a sweep's): the first one's Ctrl-C
    must not stop the second at its start."""
    with contextlib.suppress(KeyboardInterrupt):
        raise_keyboard_interrupt(signal.SIGINT, None)
    raise_if_interrupt_held()
    release_held_interrupts()


def test_a_second_ctrl_c_during_start_up_raises_at_once(own_sigint):
    hold_interrupts_during_start_up()
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_the_run_loop_keeps_a_ctrl_c_held_during_start_up(own_sigint):
    hold_interrupts_during_start_up()
    signal.raise_signal(signal.SIGINT)
    stop_on_signals()  # the run's loop takes over; the request stays
    with pytest.raises(KeyboardInterrupt):
        raise_if_stop_requested()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # and now raises where it lands


def test_releasing_the_hold_raises_a_held_ctrl_c_and_restores_pythons_own(own_sigint):
    hold_interrupts_during_start_up()
    release_held_interrupts()  # none held: returns
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    hold_interrupts_during_start_up()
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        release_held_interrupts()


def test_a_ctrl_c_while_the_fork_server_starts_is_not_lost(own_sigint, monkeypatch):
    """The server must not start with a Ctrl-C's default action (it would print a
    traceback from its imports); this process keeps its Ctrl-C, delivered once the server
    has started. It was ignored there, and lost: the run trained on."""

    def start_server_as_ctrl_c_lands() -> None:
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", start_server_as_ctrl_c_lands)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
        fork_server.start()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_the_fork_server_starts_with_ctrl_c_blocked():
    """Blocked from its exec on, so that a Ctrl-C to the group waits, pending, until its
    imports are done and it ignores SIGINT. (The resource tracker's start unblocked
    SIGINT when it came first inside the server's start.)"""
    script = textwrap.dedent(
        """
        import multiprocessing.forkserver, signal
        from beast.acting import fork_server
        fork_server.start()
        pid = multiprocessing.forkserver._forkserver._forkserver_pid
        with open(f"/proc/{pid}/status") as status:
            blocked = next(line for line in status if line.startswith("SigBlk:"))
        print(bool(int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1))))
        fork_server.stop()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
