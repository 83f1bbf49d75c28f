"""Native components behind Pythonic classes; the only module that touches ffi/lib.

`IndexQueue` is a FIFO of int32 rollout-slot indices shared by the learner and
actor processes (the free/full protocol of `beast.buffers`). It lives in C
(`index_queue.c`) over shared memory that Python allocates and owns:

- a process that dies mid-call cannot deadlock the others (robust mutex);
- a blocked `get` sleeps on a futex with the GIL released, and a `put` in any
  process wakes it without running Python;
- `close()` wakes every blocked `get`, in every process, at once (shutdown).

`PyIndexQueue` is the pure-Python reference with the same interface (threads
only), used for parity tests.
"""

import collections
import operator
import queue
import threading
import time

import torch

try:
    from beast.native._ext import ffi, lib
except ModuleNotFoundError as e:
    if e.name != "beast.native._ext":
        raise
    raise ImportError(
        "beast's native extension (beast.native._ext) is not built: run `pip install -e .`"
    ) from e

__all__ = ["IndexQueue", "PyIndexQueue", "QueueClosed"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_MAX_CAPACITY = lib.BEAST_QUEUE_MAX_CAPACITY
_MAX_TIMEOUT_SECONDS = 2**32


class QueueClosed(Exception):
    """Raised by `put` and `get` once the queue has been closed."""


def _check_capacity(capacity: int) -> int:
    capacity = operator.index(capacity)
    if not 1 <= capacity <= _MAX_CAPACITY:
        raise ValueError(f"capacity must be in [1, {_MAX_CAPACITY}], got {capacity}")
    return capacity


def _check_index(index: int) -> int:
    index = operator.index(index)
    if not _INT32_MIN <= index <= _INT32_MAX:
        raise ValueError(f"index must fit in int32, got {index}")
    return index


def _deadline_ns(timeout: float | None) -> int | None:
    """Absolute `time.monotonic_ns()` deadline (CLOCK_MONOTONIC on Linux), or None."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    # Clamped so that the nanoseconds fit int64_t; 2**32 s is "forever" enough.
    return time.monotonic_ns() + int(min(timeout, _MAX_TIMEOUT_SECONDS) * 1e9)


def _raise_for(status: int, capacity: int) -> None:
    """The one place C status codes become Python exceptions."""
    if status == lib.BEAST_OK:
        return
    if status == lib.BEAST_ETIMEDOUT:
        raise queue.Empty
    if status == lib.BEAST_ECLOSED:
        raise QueueClosed("IndexQueue is closed")
    if status == lib.BEAST_EFULL:
        # Indices are slots: more puts than slots means a protocol bug, so this
        # is an error rather than something to wait out.
        raise RuntimeError(f"put on a full IndexQueue (capacity {capacity})")
    if status == lib.BEAST_EINVAL:
        raise ValueError("memory does not hold an initialised IndexQueue")
    if status == lib.BEAST_ENOTRECOVERABLE:
        raise RuntimeError("IndexQueue lock is not recoverable")
    raise RuntimeError(f"IndexQueue: unexpected native status {status}")


class IndexQueue:
    """Process-shared FIFO of int32 indices, with blocking `get` and `close`.

    Picklable to `multiprocessing` children of any start method: only the
    shared-memory tensor travels, and the child re-derives its C pointer.
    `put` never blocks: there are as many slots as capacity, so a full queue
    is a bug (RuntimeError).
    """

    def __init__(self, capacity: int) -> None:
        capacity = _check_capacity(capacity)
        nbytes = lib.beast_queue_nbytes(capacity)
        # Python owns the memory; C borrows it through self._mem for exactly
        # as long as self._tensor keeps the shared mapping alive.
        tensor = torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
        _raise_for(lib.beast_queue_init(self._pointer(tensor), nbytes, capacity), capacity)
        self._attach(tensor)

    @staticmethod
    def _pointer(tensor: torch.Tensor):
        return ffi.cast("void *", tensor.data_ptr())

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._mem = self._pointer(tensor)
        out = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_capacity(self._mem, out), 0)
        self._capacity = int(out[0])

    def __getstate__(self) -> dict:
        return {"tensor": self._tensor}

    def __setstate__(self, state: dict) -> None:
        tensor = state["tensor"]
        # torch's multiprocessing pickler hands the child the same shared
        # memory; any other pickler copies the bytes into a private queue
        # nobody else sees, which is never what the caller meant.
        if not tensor.is_shared():
            raise RuntimeError("IndexQueue can only be pickled to multiprocessing children")
        self._attach(tensor)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def owner_deaths(self) -> int:
        """Times a process died inside a queue call and the lock was recovered."""
        out = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_owner_deaths(self._mem, out), self._capacity)
        return int(out[0])

    def put(self, index: int) -> None:
        """Append `index` (int32). Raises QueueClosed, or RuntimeError when full."""
        index = _check_index(index)
        _raise_for(lib.beast_queue_put(self._mem, index), self._capacity)

    def get(self, timeout: float | None = None) -> int:
        """Pop the oldest index, waiting up to `timeout` seconds (None: forever).

        Raises `queue.Empty` on timeout and QueueClosed once closed. The wait
        releases the GIL. A signal returns control here (BEAST_EINTR) so its
        Python handler runs, e.g. KeyboardInterrupt; then the wait resumes
        with the time left.
        """
        deadline = _deadline_ns(timeout)
        out = ffi.new("int32_t *")
        while True:
            remaining = -1 if deadline is None else max(0, deadline - time.monotonic_ns())
            status = lib.beast_queue_get(self._mem, out, remaining)
            if status != lib.BEAST_EINTR:
                break
        _raise_for(status, self._capacity)
        return int(out[0])

    def close(self) -> None:
        """Close the queue and wake every waiter in every process. Idempotent."""
        _raise_for(lib.beast_queue_close(self._mem), self._capacity)

    def qsize(self) -> int:
        out = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_size(self._mem, out), self._capacity)
        return int(out[0])

    def __repr__(self) -> str:
        return f"IndexQueue(capacity={self._capacity}, qsize={self.qsize()})"


class PyIndexQueue:
    """Pure-Python reference for `IndexQueue`: same interface, one process only."""

    def __init__(self, capacity: int) -> None:
        self._capacity = _check_capacity(capacity)
        self._items: collections.deque[int] = collections.deque()
        self._closed = False
        # Guards _items and _closed; notified on every put and on close.
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def owner_deaths(self) -> int:
        """Always 0: threads cannot die holding the lock."""
        return 0

    def put(self, index: int) -> None:
        index = _check_index(index)
        with self._cond:
            if self._closed:
                raise QueueClosed("PyIndexQueue is closed")
            if len(self._items) >= self._capacity:
                raise RuntimeError(f"put on a full PyIndexQueue (capacity {self._capacity})")
            self._items.append(index)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> int:
        deadline = _deadline_ns(timeout)
        with self._cond:
            while True:
                if self._closed:
                    raise QueueClosed("PyIndexQueue is closed")
                if self._items:
                    return self._items.popleft()
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic_ns()
                if remaining <= 0:
                    raise queue.Empty
                self._cond.wait(remaining / 1e9)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def __repr__(self) -> str:
        return f"PyIndexQueue(capacity={self._capacity}, qsize={self.qsize()})"
