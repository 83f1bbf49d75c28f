"""Process-wide state a test may change and the next test must not inherit."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def global_state_kept() -> Iterator[None]:
    """Restore torch's intra-op thread count and the global random states of torch, NumPy
    and `random` when the body ends: a run in this process sets its --num_threads and
    seeds torch, which would otherwise change what later tests in the process start
    from."""
    threads = torch.get_num_threads()
    states = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
