"""The actors' fork server (beast/acting/fork_server.py): started first by monobeast.py where
the flags may start actors, never where they cannot, and stopped without waiting and
without leaving a zombie."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import multiprocessing.forkserver, os, sys, time
    from beast.acting import fork_server
    fork_server.start_for(sys.argv[1:])
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    print("torch imported here:", "torch" in sys.modules)
    print("server:", pid)
    if pid is not None:
        started = time.monotonic()
        fork_server.stop()
        print("stop returned in", round(time.monotonic() - started, 3))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)  # a zombie still answers
            except ProcessLookupError:
                break
            time.sleep(0.05)
        print("gone:", time.monotonic() < deadline)
    """
)


def probe(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_server_starts_before_torch_is_imported_and_stops_without_a_zombie():
    out = probe("--algo", "ppo", "--env", "CartPole-v1")
    assert "torch imported here: False" in out
    assert "server: None" not in out
    stopped = float(out.split("stop returned in")[1].split()[0])
    assert stopped < 0.5  # it does not wait for the server's imports
    assert "gone: True" in out  # killed and collected: not even a zombie


@pytest.mark.parametrize(
    "argv", [("--serial",), ("--help",), ("--mode", "test"), ("--mode=test", "--xpid", "x")]
)
def test_no_server_where_the_flags_start_no_actor(argv):
    assert "server: None" in probe(*argv)
