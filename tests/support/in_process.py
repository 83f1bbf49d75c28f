"""monobeast.py's and polybeast.py's main, run in the test process with their output
captured.

A run's actors still fork from the fork server (polybeast's env servers are still Ray
workers), and its learner, checkpoints and logs are the real ones; what the run skips is
a new interpreter's start-up and exit (importing torch and torch._dynamo, the fork
server's imports, the teardown): ~5 of the ~7 s of a 2,000-step CartPole run in
monobeast, ~6 of the ~10 s of one in polybeast joining a running Ray cluster. Tests that
check process-level behaviour (signals, exit codes from a shell, orphans, shared-memory
leaks, tracebacks from worker processes, a private Ray instance) run the scripts as
processes instead (tests/end_to_end/test_monobeast.py's `run` and `start`).
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable

import monobeast
import polybeast
from tests.support.global_state import global_state_kept


def run_main(main: Callable[[list[str]], int], argv: list[str]) -> subprocess.CompletedProcess:
    """main(argv), its stdout and stderr captured, as subprocess.run returns them (argparse
    exits with SystemExit: its code is the return code). The thread count and random
    states the run sets are restored after it (`global_state_kept`)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        global_state_kept(),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            returncode = main(argv)
        except SystemExit as exit:
            returncode = exit.code
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())


def run_monobeast(argv: list[str]) -> subprocess.CompletedProcess:
    return run_main(monobeast.main, argv)


def run_polybeast(argv: list[str]) -> subprocess.CompletedProcess:
    """polybeast.py joining the Ray cluster that argv's --ray_address names."""
    assert "--ray_address" in argv, "in-process polybeast runs join a running cluster"
    return run_main(polybeast.main, argv)
