"""The actors' fork server (beast/acting/fork_server.py): started by a run that has actor
processes, never by one that has none, and stopped without waiting and without leaving a
zombie."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

STOP_PROBE = textwrap.dedent(
    """
    import multiprocessing.forkserver, os, time
    from beast.acting import fork_server
    fork_server.start()
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    print("torch imported here:", "torch" in __import__("sys").modules)
    fork_server.stop()
    print("stopped")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # a zombie still answers
        except ProcessLookupError:
            break
        time.sleep(0.05)
    print("gone:", time.monotonic() < deadline)
    """
)

# monobeast.py's main in this process, then whether it ever started a fork server.
RUN_PROBE = textwrap.dedent(
    """
    import multiprocessing.forkserver, sys
    import monobeast
    try:
        code = monobeast.main(sys.argv[1:])
    except SystemExit as done:  # --help
        code = done.code
    print("exit", code)
    print("server:", multiprocessing.forkserver._forkserver._forkserver_pid)
    """
)


def probe(script: str, *argv: str, cwd: str | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_server_stops_without_torch_here_and_without_a_zombie():
    out = probe(STOP_PROBE)
    assert "torch imported here: False" in out
    assert "stopped" in out
    assert "gone: True" in out  # killed and collected: not even a zombie


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("--env", "CartPole-v1", "--serial", "--num_envs_per_actor", "1", "--total_steps", "200"),
        ("--mode", "test", "--xpid", "no_such_run"),
    ],
)
def test_no_server_where_the_run_starts_no_actor(argv, tmp_path):
    out = probe(RUN_PROBE, *argv, "--savedir", str(tmp_path))
    assert "server: None" in out


def test_a_run_with_actors_starts_the_server(tmp_path):
    argv = ("--env", "CartPole-v1", "--total_steps", "200", "--savedir", str(tmp_path))
    out = probe(RUN_PROBE, *argv)
    assert "exit 0" in out
    assert "server: None" not in out
