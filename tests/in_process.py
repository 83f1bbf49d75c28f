"""monobeast.py's main, run in the test process with its output captured.

A run's actors still fork from the fork server, and its learner, checkpoints and logs
are the real ones; what the run skips is a new interpreter's start-up and exit
(importing torch and torch._dynamo, the fork server's imports, the teardown), which
took ~5 of the ~7 s of a 2,000-step CartPole run. Tests that check process-level
behaviour (signals, exit codes from a shell, orphans, shared-memory leaks, tracebacks
from worker processes) run monobeast.py as a process instead (tests/test_monobeast.py's
`run` and `start`).
"""

from __future__ import annotations

import contextlib
import io
import subprocess

import monobeast


def run_monobeast(argv: list[str]) -> subprocess.CompletedProcess:
    """monobeast.main(argv), its stdout and stderr captured, as subprocess.run returns."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        returncode = monobeast.main(argv)
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())
