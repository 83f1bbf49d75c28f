"""How a worker process tells its supervisor why it died: a row of shared memory.

A failing actor or evaluator writes its traceback (UTF-8, NUL-terminated, its end kept
when longer than a row) into its row of a shared uint8 tensor and exits 1
(`post_traceback`). The supervisor (beast/acting/supervisor.py), noticing the death, reads and
clears the row (`ErrorBoard.death_reason`): the first report of each distinct traceback
is logged in full, later ones as one line, and a process killed by a signal or exiting
without a report is described by its exit code.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable

import torch

__all__ = ["ERROR_BOARD_BYTES", "ErrorBoard", "post_traceback"]

# Bytes per process for its error report (a traceback; longer ones keep their end).
ERROR_BOARD_BYTES = 8192


def post_traceback(row: torch.Tensor) -> None:
    """Write the exception being handled into `row` (uint8 [ERROR_BOARD_BYTES], shared)."""
    report = traceback.format_exc().encode("utf-8")[-(ERROR_BOARD_BYTES - 1) :]
    row.zero_()
    row[: len(report)] = torch.frombuffer(bytearray(report), dtype=torch.uint8)


class ErrorBoard:
    """`rows` rows of shared memory, one per supervised process, and what was reported.

    `tensor` (uint8 [rows, ERROR_BOARD_BYTES]) is handed to the processes; `log` gets each
    distinct traceback once.
    """

    def __init__(self, rows: int, log: Callable[[str], None]) -> None:
        self.tensor = torch.zeros((rows, ERROR_BOARD_BYTES), dtype=torch.uint8)
        self.tensor.share_memory_()
        self.log = log
        self._reported: set[str] = set()

    def death_reason(self, row: int, exitcode: int | None, who: str) -> str:
        """Why the process of `row` died, in a few words ("raised ValueError: ...", "killed
        by SIGKILL"); its traceback goes to the log the first time it is seen. `who` names
        the process in that log line; `exitcode` None: lost with the process's fork
        server."""
        board = self.tensor[row]
        report = board.numpy().tobytes().split(b"\0", 1)[0].decode("utf-8", errors="replace")
        board.zero_()
        if report:
            summary = report.strip().splitlines()[-1]
            if report not in self._reported:
                self._reported.add(report)
                self.log(f"{who} failed:\n{report.rstrip()}")
            return f"raised {summary}"
        if exitcode is None:  # beast/acting/supervisor.py `WorkerProcess.exitcode`
            return "died with its fork server"
        if exitcode < 0:
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"exited with code {exitcode}"
