"""`IndexQueue` (index_queue.c): a FIFO of int32 rollout-slot indices shared by the
learner and actor processes (the free/full protocol of `beast.experience.rollout_slots`),
over shared memory that Python allocates and owns:

- a process that dies mid-call cannot deadlock the others (robust mutex);
- a blocked `get` sleeps on a futex with the GIL released, and a `put` in any
  process wakes it without running Python;
- `close()` wakes every blocked `get`, in every process, at once (shutdown).

`SlotOwners` records who holds each rollout slot that is on no queue; an
`IndexQueue` sets a slot's mark in the same critical section as it moves the slot
(`get`/`put` with `owners`), so a process killed anywhere leaves every slot
queued or marked, and `reclaim` returns a dead owner's slots exactly once
(index_queue.h, "Owner marks"). `PyIndexQueue` is the pure-Python reference.
"""

import collections
import operator
import queue
import threading
import time

import torch

from beast.native._ext import ffi, lib
from beast.native.shared_block import SharedBlock
from beast.native.waits import QueueClosed, _deadline_ns

__all__ = [
    "IndexQueue",
    "NO_OWNER",
    "PyIndexQueue",
    "SlotOwners",
]


# A slot's owner mark when nobody (or only a queue) holds it.
NO_OWNER = lib.BEAST_NO_OWNER
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_MAX_CAPACITY = lib.BEAST_QUEUE_MAX_CAPACITY


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


_QUEUE_EINVAL = (
    "memory does not hold an initialised IndexQueue, or an index is not one of the owner"
    " marks' slots"
)


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
        raise ValueError(_QUEUE_EINVAL)
    if status == lib.BEAST_ENOTRECOVERABLE:
        raise RuntimeError("IndexQueue lock is not recoverable")
    raise RuntimeError(f"IndexQueue: unexpected native status {status}")


class SlotOwners(SharedBlock):
    """Who holds each of `num_slots` slots that is on no queue: an owner id (>= 0), or
    NO_OWNER. An int64 shared tensor; `IndexQueue.get`/`put` with `owners` set a slot's
    mark as they move it, `IndexQueue.reclaim` clears a dead owner's.

    Picklable to multiprocessing children of any start method: the same memory.
    """

    def __init__(self, num_slots: int) -> None:
        tensor = torch.full((_check_capacity(num_slots),), NO_OWNER, dtype=torch.int64)
        self._attach(tensor.share_memory_())

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        # C borrows the memory for as long as self._tensor keeps it alive.
        self._marks = ffi.cast("int64_t *", tensor.data_ptr())

    @property
    def tensor(self) -> torch.Tensor:
        """The marks, int64 [num_slots], in shared memory."""
        return self._tensor

    def __len__(self) -> int:
        return len(self.tensor)

    def __getitem__(self, index: int) -> int:
        return int(self.tensor[index])

    def held_by(self, owner: int) -> list[int]:
        """The slots marked with `owner`, ascending."""
        return torch.nonzero(self.tensor == owner).flatten().tolist()

    def held(self) -> dict[int, int]:
        """slot -> owner of every marked slot."""
        marked = torch.nonzero(self.tensor != NO_OWNER).flatten().tolist()
        return {index: int(self.tensor[index]) for index in marked}


def _check_owner(owners: SlotOwners | None, owner: int) -> int:
    if owners is not None and not isinstance(owners, SlotOwners):
        raise TypeError(f"owners must be SlotOwners, got {type(owners).__name__}")
    owner = operator.index(owner)
    if owner < NO_OWNER:
        raise ValueError(f"owner must be >= 0 or NO_OWNER ({NO_OWNER}), got {owner}")
    return owner


class IndexQueue(SharedBlock):
    """Process-shared FIFO of int32 indices, with blocking `get` and `close`.

    Picklable to `multiprocessing` children of any start method: only the
    shared-memory tensor travels, and the child re-derives its C pointer.
    `put` never blocks: there are as many slots as capacity, so a full queue
    is a bug (RuntimeError).
    """

    def __init__(self, capacity: int) -> None:
        capacity = _check_capacity(capacity)
        nbytes = lib.beast_queue_nbytes(capacity)
        self._create(
            nbytes, lambda mem: _raise_for(lib.beast_queue_init(mem, nbytes, capacity), capacity)
        )

    def _read_header(self) -> None:
        out = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_capacity(self._mem, out), 0)
        self._capacity = int(out[0])

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def owner_deaths(self) -> int:
        """Times a process died inside a queue call and the lock was recovered."""
        out = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_owner_deaths(self._mem, out), self._capacity)
        return int(out[0])

    def put(self, index: int, *, owners: SlotOwners | None = None, owner: int = NO_OWNER) -> None:
        """Append `index` (int32). Raises QueueClosed, or RuntimeError when full.

        With `owners`, `owners[index]` becomes `owner` once the index is queued, in the
        same critical section (index_queue.h, "Owner marks"); index must be a slot of it.
        """
        index = _check_index(index)
        owner = _check_owner(owners, owner)
        if owners is None:
            status = lib.beast_queue_put(self._mem, index)
        else:
            status = lib.beast_queue_put_marked(self._mem, index, owners._marks, len(owners), owner)
        _raise_for(status, self._capacity)

    def get(
        self,
        timeout: float | None = None,
        *,
        owners: SlotOwners | None = None,
        owner: int = NO_OWNER,
    ) -> int:
        """Pop the oldest index, waiting up to `timeout` seconds (None: forever).

        Raises `queue.Empty` on timeout and QueueClosed once closed. The wait
        releases the GIL. A signal returns control here (BEAST_EINTR) so its
        Python handler runs, e.g. KeyboardInterrupt; then the wait resumes
        with the time left. With `owners`, `owners[index]` becomes `owner` before
        the index leaves the queue, in the same critical section.
        """
        owner = _check_owner(owners, owner)
        deadline = _deadline_ns(timeout)
        out = ffi.new("int32_t *")
        while True:
            remaining = -1 if deadline is None else max(0, deadline - time.monotonic_ns())
            if owners is None:
                status = lib.beast_queue_get(self._mem, out, remaining)
            else:
                status = lib.beast_queue_get_marked(
                    self._mem, out, remaining, owners._marks, len(owners), owner
                )
            if status != lib.BEAST_EINTR:
                break
        _raise_for(status, self._capacity)
        return int(out[0])

    def reclaim(self, index: int, owner: int, owners: SlotOwners, full: "IndexQueue") -> bool:
        """Return slot `index` of `owner`, a dead process, to this (free) queue: if it is
        still marked `owner`, clear the mark and, unless it is queued here or on `full`,
        put it here. True when it was put back. Raises QueueClosed once this queue is
        closed."""
        index = _check_index(index)
        owner = _check_owner(owners, owner)
        if owners is None or owner == NO_OWNER or not isinstance(full, IndexQueue):
            raise ValueError("reclaim needs SlotOwners, an owner id and the full IndexQueue")
        returned = ffi.new("int32_t *")
        status = lib.beast_queue_reclaim(
            self._mem, full._mem, owners._marks, len(owners), index, owner, returned
        )
        _raise_for(status, self._capacity)
        return bool(returned[0])

    def contents(self) -> list[int]:
        """The queued indices, oldest first (also after close)."""
        out = ffi.new("int32_t[]", self._capacity)
        count = ffi.new("uint32_t *")
        _raise_for(lib.beast_queue_snapshot(self._mem, out, self._capacity, count), 0)
        return [int(out[i]) for i in range(count[0])]

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

    def put(self, index: int, *, owners: SlotOwners | None = None, owner: int = NO_OWNER) -> None:
        index = _check_index(index)
        owner = _check_owner(owners, owner)
        with self._cond:
            if owners is not None and not 0 <= index < len(owners):
                raise ValueError(_QUEUE_EINVAL)
            if self._closed:
                raise QueueClosed("PyIndexQueue is closed")
            if len(self._items) >= self._capacity:
                raise RuntimeError(f"put on a full PyIndexQueue (capacity {self._capacity})")
            self._items.append(index)
            if owners is not None:
                owners.tensor[index] = owner
            self._cond.notify()

    def get(
        self,
        timeout: float | None = None,
        *,
        owners: SlotOwners | None = None,
        owner: int = NO_OWNER,
    ) -> int:
        owner = _check_owner(owners, owner)
        deadline = _deadline_ns(timeout)
        with self._cond:
            while True:
                if self._closed:
                    raise QueueClosed("PyIndexQueue is closed")
                if self._items:
                    index = self._items[0]
                    if owners is not None:
                        if not 0 <= index < len(owners):
                            raise ValueError(_QUEUE_EINVAL)
                        owners.tensor[index] = owner
                    return self._items.popleft()
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic_ns()
                if remaining <= 0:
                    raise queue.Empty
                self._cond.wait(remaining / 1e9)

    def reclaim(self, index: int, owner: int, owners: SlotOwners, full: "PyIndexQueue") -> bool:
        index = _check_index(index)
        owner = _check_owner(owners, owner)
        if owners is None or owner == NO_OWNER or not isinstance(full, PyIndexQueue):
            raise ValueError("reclaim needs SlotOwners, an owner id and the full PyIndexQueue")
        if not 0 <= index < len(owners) or full is self:
            raise ValueError(_QUEUE_EINVAL)
        with full._cond, self._cond:
            if self._closed:
                raise QueueClosed("PyIndexQueue is closed")
            if owners[index] != owner:
                return False
            returned = index not in self._items and index not in full._items
            if returned:
                if len(self._items) >= self._capacity:
                    raise RuntimeError(f"put on a full PyIndexQueue (capacity {self._capacity})")
                self._items.append(index)
                self._cond.notify()
            owners.tensor[index] = NO_OWNER
            return returned

    def contents(self) -> list[int]:
        with self._cond:
            return list(self._items)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def __repr__(self) -> str:
        return f"PyIndexQueue(capacity={self._capacity}, qsize={self.qsize()})"
