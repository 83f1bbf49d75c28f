"""Whether the code now running is being captured into a graph (torch.compile's
tracing, or beast's own ahead-of-time trace of a learner step, beast/train_step/
package.py), so that a model can take the branch a graph can hold: no host reads of
tensor values (beast/models/lstm.py runs its cell arithmetic then)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["capturing", "capturing_graph"]

# Per thread: a trace in a compilation thread leaves another thread's eager steps alone.
_state = threading.local()


def capturing() -> bool:
    """True while torch.compile traces this code, or a `capturing_graph` block runs."""
    return torch.compiler.is_compiling() or getattr(_state, "capturing", False)


@contextlib.contextmanager
def capturing_graph() -> Iterator[None]:
    """Code run inside is being traced into a graph (`capturing()` says so)."""
    before = getattr(_state, "capturing", False)
    _state.capturing = True
    try:
        yield
    finally:
        _state.capturing = before
