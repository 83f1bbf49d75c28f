"""What the native wrappers share: `QueueClosed`, the deadlines their blocking calls
pass to C (monotonic nanoseconds).
"""

import time

__all__ = [
    "QueueClosed",
]


_MAX_TIMEOUT_SECONDS = 2**32


class QueueClosed(Exception):
    """Raised by a closed IndexQueue's `put`/`get` and a closed Batcher's
    `post`/`wait_answered`/`collect`."""


def _deadline_ns(timeout: float | None) -> int | None:
    """Absolute `time.monotonic_ns()` deadline (CLOCK_MONOTONIC on Linux), or None."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    # Clamped so that the nanoseconds fit int64_t; 2**32 s is "forever" enough.
    return time.monotonic_ns() + int(min(timeout, _MAX_TIMEOUT_SECONDS) * 1e9)


def _remaining_ns(deadline: int | None) -> int:
    return -1 if deadline is None else max(0, deadline - time.monotonic_ns())
