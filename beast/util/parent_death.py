"""A child process that ends with the thread that started it, from its first line.

    python -m beast.util.parent_death PARENT_PID SIGNAL MODULE:FUNCTION [ARG ...]

has the kernel send this process SIGNAL (a name, say SIGTERM) when the thread of process
PARENT_PID that started it exits (Linux's PR_SET_PDEATHSIG), with the signal's default
action (a parent that ignored it, as a run does while it stops, would have passed that
on and the signal would be lost), exits at once if that process is gone already, and
only then imports MODULE and calls FUNCTION with the ARGs as strings.

Nothing here imports torch: a child whose own imports take seconds (torch's) is tied to
its parent before them, so a run that ends meanwhile never leaves it importing on alone.
A child told so in its own code, after its imports, would be blind for as long as they
take.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys

__all__ = ["signal_when_parent_dies"]

# prctl(2) option: the signal this process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def signal_when_parent_dies(signal_number: int) -> None:
    """Have the kernel send this process `signal_number` when the thread that started it
    exits (its process dying included): Linux's PR_SET_PDEATHSIG; nothing elsewhere."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0)


def _main(argv: list[str]) -> None:
    parent, signal_name, target, *arguments = argv
    signal_number = signal.Signals[signal_name]
    signal.signal(signal_number, signal.SIG_DFL)
    signal_when_parent_dies(signal_number)
    if os.getppid() != int(parent):  # it ended before the kernel knew to tell
        sys.exit(1)
    module, function = target.split(":")
    getattr(importlib.import_module(module), function)(*arguments)


if __name__ == "__main__":
    _main(sys.argv[1:])
