"""Native components behind Pythonic classes; with beast/native/acting.py (an
actor's sampler and step copies), the only code that touches ffi/lib.

`IndexQueue` is a FIFO of int32 rollout-slot indices shared by the learner and
actor processes (the free/full protocol of `beast.buffers`). It lives in C
(`index_queue.c`) over shared memory that Python allocates and owns:

- a process that dies mid-call cannot deadlock the others (robust mutex);
- a blocked `get` sleeps on a futex with the GIL released, and a `put` in any
  process wakes it without running Python;
- `close()` wakes every blocked `get`, in every process, at once (shutdown).

`Batcher` is the request table of central inference (`batcher.c`): actors
post K requests each and sleep until all K are answered; inference threads in
the learner collect ready requests as one sorted index tensor, run one
forward pass and answer, which wakes exactly the actors they served.

`SumTree` is prioritized replay's sampling structure (`sum_tree.c`): float64
priorities in a sum tree and a max tree, O(log n) updates and samples, one
robust process-shared lock per call so actors inserting and a learner sampling
from other processes never see (or leave) a corrupt total, and a generation
per slot so that priorities computed for overwritten data are dropped.

`SlotOwners` records who holds each rollout slot that is on no queue; an
`IndexQueue` sets a slot's mark in the same critical section as it moves the slot
(`get`/`put` with `owners`), so a process killed anywhere leaves every slot
queued or marked, and `reclaim` returns a dead owner's slots exactly once
(index_queue.h, "Owner marks").

`PyIndexQueue`, `PyBatcher` and `PySumTree` are the pure-Python references
with the same interfaces (threads only), used for parity tests.
"""

import collections
import math
import operator
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

try:
    from beast.native._ext import ffi, lib
except ModuleNotFoundError as e:
    if e.name != "beast.native._ext":
        raise
    raise ImportError(
        "beast's native extension (beast.native._ext) is not built: run `pip install -e .`"
    ) from e

__all__ = [
    "Batcher",
    "BatcherStats",
    "IndexQueue",
    "NO_OWNER",
    "PyBatcher",
    "PyIndexQueue",
    "PySumTree",
    "QueueClosed",
    "SlotOwners",
    "SumTree",
    "SumTreeSample",
    "SumTreeStats",
]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# A slot's owner mark when nobody (or only a queue) holds it.
NO_OWNER = lib.BEAST_NO_OWNER
_MAX_CAPACITY = lib.BEAST_QUEUE_MAX_CAPACITY
_MAX_TIMEOUT_SECONDS = 2**32


class QueueClosed(Exception):
    """Raised by a closed IndexQueue's `put`/`get` and a closed Batcher's
    `post`/`wait_answered`/`collect`."""


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


class SlotOwners:
    """Who holds each of `num_slots` slots that is on no queue: an owner id (>= 0), or
    NO_OWNER. An int64 shared tensor; `IndexQueue.get`/`put` with `owners` set a slot's
    mark as they move it, `IndexQueue.reclaim` clears a dead owner's.

    Picklable to multiprocessing children of any start method: the same memory.
    """

    def __init__(self, num_slots: int) -> None:
        tensor = torch.full((_check_capacity(num_slots),), NO_OWNER, dtype=torch.int64)
        self._attach(tensor.share_memory_())

    def _attach(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        # C borrows the memory for as long as self.tensor keeps it alive.
        self._marks = ffi.cast("int64_t *", tensor.data_ptr())

    def __getstate__(self) -> dict:
        return {"tensor": self.tensor}

    def __setstate__(self, state: dict) -> None:
        if not state["tensor"].is_shared():
            raise RuntimeError("SlotOwners can only be pickled to multiprocessing children")
        self._attach(state["tensor"])

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


# Central inference: the request table.

_MAX_SLOTS = lib.BEAST_BATCHER_MAX_SLOTS
# Slot states of the pure-Python reference (batcher.c's SLOT_* values).
_EMPTY, _READY, _TAKEN = 0, 1, 2


class BatcherStats(NamedTuple):
    """Running totals of a Batcher, for diagnostics and tests."""

    posted: int  # requests posted
    answered: int  # requests answered and credited to their group
    dropped: int  # READY or TAKEN requests dropped by reset_group
    stale: int  # answers ignored: slot not TAKEN, or its group reset since the post


def _check_sizes(num_groups: int, group_size: int, num_servers: int) -> tuple[int, int, int]:
    num_groups, group_size = operator.index(num_groups), operator.index(group_size)
    num_servers = operator.index(num_servers)
    if num_groups < 1 or group_size < 1:
        raise ValueError(
            f"num_groups and group_size must be >= 1, got {num_groups} and {group_size}"
        )
    if not 1 <= num_servers <= num_groups:
        raise ValueError(f"num_servers must be in [1, num_groups={num_groups}], got {num_servers}")
    if num_groups * group_size > _MAX_SLOTS:
        raise ValueError(f"num_groups * group_size must be at most {_MAX_SLOTS}")
    return num_groups, group_size, num_servers


def _server_groups(server: int, num_groups: int, num_servers: int) -> range:
    """Groups of `server`: contiguous ranges, as batcher.c splits them."""
    return range(server * num_groups // num_servers, (server + 1) * num_groups // num_servers)


class _BatcherArgs:
    """Argument checks shared by Batcher and PyBatcher, so both raise alike."""

    num_groups: int
    group_size: int
    num_servers: int

    @property
    def num_slots(self) -> int:
        return self.num_groups * self.group_size

    def slots(self, group: int) -> range:
        """Slot indices of `group`: rows of the caller's request tensors."""
        group = self._check_group(group)
        return range(group * self.group_size, (group + 1) * self.group_size)

    def server_groups(self, server: int) -> range:
        """Groups served by `server` (contiguous, so batches index close rows)."""
        server = operator.index(server)
        if not 0 <= server < self.num_servers:
            raise ValueError(f"server must be in [0, {self.num_servers}), got {server}")
        return _server_groups(server, self.num_groups, self.num_servers)

    def server_of(self, group: int) -> int:
        """The server whose range holds `group`."""
        group = self._check_group(group)
        return ((group + 1) * self.num_servers - 1) // self.num_groups

    def _check_group(self, group: int) -> int:
        group = operator.index(group)
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group must be in [0, {self.num_groups}), got {group}")
        return group

    def _check_count(self, count: int | None) -> int:
        if count is None:
            return self.group_size
        count = operator.index(count)
        if not 1 <= count <= self.group_size:
            raise ValueError(f"count must be in [1, group_size={self.group_size}], got {count}")
        return count

    def collect(
        self,
        server: int,
        max_batch: int,
        *,
        min_batch: int | None = None,
        timeout: float | None = None,
        batch_window: float = 0.0,
    ) -> torch.Tensor:
        """Take a batch of ready requests of `server`'s groups: int64 [n], ascending.

        Waits up to `timeout` seconds (None: forever) for a first request and
        returns an empty tensor if none comes. Then keeps taking requests until
        it has `max_batch`, or at least `min_batch` (default: max_batch), or
        `batch_window` seconds have passed since the first was taken (0: take
        what is ready now). min_batch=1 is greedy: no added latency, batches
        grow by themselves while the forward pass runs. Raises QueueClosed once
        closed. The indices must be passed to `answer` before collecting again.
        """
        return self.collector(
            server, max_batch, min_batch=min_batch, batch_window=batch_window, reuse=False
        )(timeout)

    def collector(
        self,
        server: int,
        max_batch: int,
        *,
        min_batch: int | None = None,
        batch_window: float = 0.0,
        reuse: bool = True,
    ) -> Callable[[float | None], torch.Tensor]:
        """`collect` with these arguments checked once: `collector(...)(timeout)`, for a
        server thread's loop (the wrapper's checks and allocations cost more than the
        C call). With `reuse` every batch may be a view of one buffer, overwritten by
        the next call: answer a batch before collecting the next, as the rules say."""
        server = operator.index(server)
        cap, min_batch, window_ns = self._batch_bounds(server, max_batch, min_batch, batch_window)
        return self._collector(server, cap, min_batch, window_ns, reuse)

    def _collector(
        self, server: int, cap: int, min_batch: int, window_ns: int, reuse: bool
    ) -> Callable[[float | None], torch.Tensor]:
        """The implementation's collect loop over checked bounds."""
        raise NotImplementedError

    def _batch_bounds(
        self, server: int, max_batch: int, min_batch: int | None, batch_window: float
    ) -> tuple[int, int, int]:
        """(max, min) capped at the server's slot count, and the window in ns."""
        groups = self.server_groups(server)  # checks server
        max_batch = operator.index(max_batch)
        min_batch = max_batch if min_batch is None else operator.index(min_batch)
        if not 1 <= min_batch <= max_batch:
            raise ValueError(
                f"need 1 <= min_batch <= max_batch, got min_batch={min_batch},"
                f" max_batch={max_batch}"
            )
        if batch_window < 0:
            raise ValueError("'batch_window' must be a non-negative number")
        cap = min(max_batch, len(groups) * self.group_size)
        window_ns = int(min(batch_window, _MAX_TIMEOUT_SECONDS) * 1e9)
        return cap, min(min_batch, cap), window_ns

    def _as_indices(self, indices) -> torch.Tensor:
        """int64, 1-D and contiguous; a collected batch passes through as is."""
        if (
            isinstance(indices, torch.Tensor)
            and indices.dtype == torch.int64
            and indices.dim() == 1
            and indices.is_contiguous()
            and indices.device.type == "cpu"
        ):
            return indices  # no torch op: answer() runs on every served batch
        return torch.as_tensor(indices, dtype=torch.int64, device="cpu").reshape(-1).contiguous()

    def _bad_indices(self) -> ValueError:
        return ValueError(f"slot indices must be in [0, {self.num_slots})")


def _raise_for_batcher(status: int) -> None:
    """The one place the Batcher's C status codes become Python exceptions."""
    if status == lib.BEAST_OK:
        return
    if status == lib.BEAST_ECLOSED:
        raise QueueClosed("Batcher is closed")
    if status == lib.BEAST_EFULL:
        # One actor per group, posting again only once answered: a second post
        # is a protocol bug, not something to wait out.
        raise RuntimeError("post on a group whose requests are not all answered")
    if status == lib.BEAST_EINVAL:
        raise ValueError("invalid argument, or memory does not hold an initialised Batcher")
    raise RuntimeError(f"Batcher: unexpected native status {status}")


def _remaining_ns(deadline: int | None) -> int:
    return -1 if deadline is None else max(0, deadline - time.monotonic_ns())


class Batcher(_BatcherArgs):
    """Process-shared request table for central inference (see batcher.h).

    `num_groups` groups (one per actor) of `group_size` slots (one per env);
    slot `g * group_size + k` is env k of actor g, and indexes the caller's
    shared request tensors (observations in, actions/logits/states out). The
    groups are split into `num_servers` contiguous ranges, one per inference
    thread: a post wakes only the server of its group.

    Actor::

        obs[batcher.slots(g)] = ...            # inputs first
        batcher.post(g)
        while not batcher.wait_answered(g, timeout=1.0):
            if not learner_alive(): return     # the server died
        action = actions[batcher.slots(g)]     # then outputs

    Server thread i::

        idx = batcher.collect(i, max_batch, timeout=0.1, batch_window=0.001)
        if len(idx):
            out = model(obs.index_select(0, idx)); actions[idx] = out ...
            batcher.answer(idx)                # wakes the actors served

    Rules: one actor per group at a time; one thread per server index, which
    answers each batch before collecting the next; `reset_group` only for a
    group whose actor has died.
    Closing (`close`) wakes everyone: `post`, `wait_answered` and `collect`
    raise QueueClosed from then on; `answer` and `reset_group` still work.
    Blocking calls release the GIL and sleep on futexes; a signal runs its
    Python handler and the wait resumes with the time left.

    Picklable to `multiprocessing` children of any start method: only the
    shared-memory tensor travels, and the child re-derives its C pointer.
    """

    def __init__(self, num_groups: int, group_size: int, num_servers: int = 1) -> None:
        num_groups, group_size, num_servers = _check_sizes(num_groups, group_size, num_servers)
        nbytes = lib.beast_batcher_nbytes(num_groups, group_size, num_servers)
        # Python owns the memory; C borrows it through self._mem for exactly
        # as long as self._tensor keeps the shared mapping alive.
        tensor = torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
        mem = ffi.cast("void *", tensor.data_ptr())
        _raise_for_batcher(lib.beast_batcher_init(mem, nbytes, num_groups, group_size, num_servers))
        self._attach(tensor)

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._mem = ffi.cast("void *", tensor.data_ptr())
        sizes = ffi.new("uint32_t[3]")
        _raise_for_batcher(lib.beast_batcher_sizes(self._mem, sizes, sizes + 1, sizes + 2))
        self.num_groups, self.group_size, self.num_servers = (int(x) for x in sizes)

    def __getstate__(self) -> dict:
        return {"tensor": self._tensor}

    def __setstate__(self, state: dict) -> None:
        tensor = state["tensor"]
        # As for IndexQueue: only torch's multiprocessing pickler shares the
        # memory; a plain pickle would make a private table nobody else sees.
        if not tensor.is_shared():
            raise RuntimeError("Batcher can only be pickled to multiprocessing children")
        self._attach(tensor)

    def post(self, group: int, count: int | None = None) -> None:
        """Post requests for the first `count` slots of `group` (default: all K).

        Write the inputs of those slots first. Raises RuntimeError if the
        group still has unanswered requests, QueueClosed once closed.
        """
        group, count = self._check_group(group), self._check_count(count)
        _raise_for_batcher(lib.beast_batcher_post(self._mem, group, count))

    def wait_answered(self, group: int, timeout: float | None = None) -> bool:
        """Sleep until every request of `group` is answered; False on timeout.

        Returns True at once if nothing is pending. Like `threading.Event.wait`
        it returns a bool rather than raising, because timing out is the
        actor's normal cue to check that the server is alive and wait again.
        Raises QueueClosed once closed.
        """
        group = self._check_group(group)
        deadline = _deadline_ns(timeout)
        while True:
            status = lib.beast_batcher_wait_answered(self._mem, group, _remaining_ns(deadline))
            if status != lib.BEAST_EINTR:
                break
        if status == lib.BEAST_ETIMEDOUT:
            return False
        _raise_for_batcher(status)
        return True

    def _collector(
        self, server: int, cap: int, min_batch: int, window_ns: int, reuse: bool
    ) -> Callable[[float | None], torch.Tensor]:
        n = ffi.new("uint32_t *")
        buffer = torch.empty(cap, dtype=torch.int64) if reuse else None

        def collect(timeout: float | None = None) -> torch.Tensor:
            deadline = _deadline_ns(timeout)
            out = buffer if buffer is not None else torch.empty(cap, dtype=torch.int64)
            out_ptr = ffi.cast("int64_t *", out.data_ptr())
            while True:
                remaining = _remaining_ns(deadline)
                status = lib.beast_batcher_collect(
                    self._mem, server, out_ptr, cap, min_batch, remaining, window_ns, n
                )
                if status != lib.BEAST_EINTR:
                    break
            if status == lib.BEAST_ETIMEDOUT:
                return out[:0]
            _raise_for_batcher(status)
            return out[: n[0]]

        return collect

    def answer(self, indices) -> None:
        """Mark collected slots answered (write their outputs first); wakes
        each group whose requests are now all answered. `indices`: int64
        tensor or sequence. Slots dropped by `reset_group` are ignored."""
        indices = self._as_indices(indices)
        # C checks the range (cheaper than two torch reductions here) and
        # changes nothing when an index is bad.
        status = lib.beast_batcher_answer(
            self._mem, ffi.cast("const int64_t *", indices.data_ptr()), indices.numel()
        )
        if status == lib.BEAST_EINVAL:
            raise self._bad_indices()
        _raise_for_batcher(status)

    def reset_group(self, group: int) -> None:
        """Drop the requests of `group`, whose actor has died, so they are not
        served; a later answer to one already collected is ignored, never
        credited to the group's next actor."""
        _raise_for_batcher(lib.beast_batcher_reset_group(self._mem, self._check_group(group)))

    def pending(self, group: int) -> int:
        """Number of requests of `group` not yet answered."""
        out = ffi.new("uint32_t *")
        _raise_for_batcher(lib.beast_batcher_pending(self._mem, self._check_group(group), out))
        return int(out[0])

    @property
    def stats(self) -> BatcherStats:
        out = ffi.new("struct beast_batcher_stats *")
        _raise_for_batcher(lib.beast_batcher_stats(self._mem, out))
        return BatcherStats(int(out.posted), int(out.answered), int(out.dropped), int(out.stale))

    def close(self) -> None:
        """Close the table and wake every actor and server. Idempotent."""
        _raise_for_batcher(lib.beast_batcher_close(self._mem))

    def __repr__(self) -> str:
        return (
            f"Batcher(num_groups={self.num_groups}, group_size={self.group_size},"
            f" num_servers={self.num_servers})"
        )


class PyBatcher(_BatcherArgs):
    """Pure-Python reference for `Batcher`: same interface and batch order, one
    process only. Follows batcher.c step by step (generations, the per-server
    scan cursor), so a single-threaded sequence of calls gives identical
    results."""

    def __init__(self, num_groups: int, group_size: int, num_servers: int = 1) -> None:
        self.num_groups, self.group_size, self.num_servers = _check_sizes(
            num_groups, group_size, num_servers
        )
        self._slot_state = [_EMPTY] * self.num_slots
        self._slot_gen = [0] * self.num_slots
        self._gen = [0] * self.num_groups
        self._pending = [0] * self.num_groups
        self._cursor = [0] * self.num_servers
        self._totals = [0, 0, 0, 0]  # BatcherStats fields
        self._closed = False
        # Guards every field above; notified on post, answer, reset and close.
        self._cond = threading.Condition()

    def post(self, group: int, count: int | None = None) -> None:
        group, count = self._check_group(group), self._check_count(count)
        with self._cond:
            if self._closed:
                raise QueueClosed("PyBatcher is closed")
            if self._pending[group]:
                raise RuntimeError("post on a group whose requests are not all answered")
            self._pending[group] = count
            for slot in self.slots(group)[:count]:
                self._slot_state[slot] = _READY
                self._slot_gen[slot] = self._gen[group]
            self._totals[0] += count
            self._cond.notify_all()

    def wait_answered(self, group: int, timeout: float | None = None) -> bool:
        group = self._check_group(group)
        deadline = _deadline_ns(timeout)
        with self._cond:
            while True:
                if self._closed:
                    raise QueueClosed("PyBatcher is closed")
                if self._pending[group] == 0:
                    return True
                remaining = _remaining_ns(deadline)
                if remaining == 0:
                    return False
                self._cond.wait(None if remaining < 0 else remaining / 1e9)

    def _scan(self, server: int, out: list[int], cap: int) -> None:
        groups = self.server_groups(server)
        start = self._cursor[server] if self._cursor[server] < len(groups) else 0
        for j in range(len(groups)):
            rel = (start + j) % len(groups)
            group = groups[rel]
            if self._pending[group] == 0:
                continue
            for slot in self.slots(group):
                if self._slot_state[slot] != _READY:
                    continue
                self._slot_state[slot] = _TAKEN
                out.append(slot)
                if len(out) == cap:
                    # Round robin, as in batcher.c: resume after this group,
                    # or at it if a batch split it and READY slots remain.
                    rest = range(slot + 1, self.slots(group).stop)
                    split = any(self._slot_state[s] == _READY for s in rest)
                    self._cursor[server] = rel if split else (rel + 1) % len(groups)
                    return

    def _collector(
        self, server: int, cap: int, min_batch: int, window_ns: int, reuse: bool
    ) -> Callable[[float | None], torch.Tensor]:
        del reuse  # every batch is a new tensor here

        def collect(timeout: float | None = None) -> torch.Tensor:
            deadline = _deadline_ns(timeout)
            window_end = None
            out: list[int] = []
            with self._cond:
                while True:
                    if self._closed:
                        raise QueueClosed("PyBatcher is closed")
                    self._scan(server, out, cap)
                    if len(out) == cap or (out and len(out) >= min_batch):
                        break
                    if not out:
                        remaining = _remaining_ns(deadline)
                        if remaining == 0:
                            break
                    else:
                        if window_end is None:
                            if window_ns == 0:
                                break
                            window_end = time.monotonic_ns() + window_ns
                        remaining = _remaining_ns(window_end)
                        if remaining == 0:
                            break
                    self._cond.wait(None if remaining < 0 else remaining / 1e9)
            return torch.tensor(sorted(out), dtype=torch.int64)

        return collect

    def answer(self, indices) -> None:
        slots = self._as_indices(indices).tolist()
        if any(not 0 <= slot < self.num_slots for slot in slots):
            raise self._bad_indices()
        with self._cond:
            for slot in slots:
                group = slot // self.group_size
                if self._slot_state[slot] != _TAKEN:
                    self._totals[3] += 1
                    continue
                self._slot_state[slot] = _EMPTY
                if self._slot_gen[slot] != self._gen[group] or self._pending[group] == 0:
                    self._totals[3] += 1
                    continue
                self._pending[group] -= 1
                self._totals[1] += 1
            self._cond.notify_all()

    def reset_group(self, group: int) -> None:
        group = self._check_group(group)
        with self._cond:
            self._gen[group] += 1
            self._pending[group] = 0
            for slot in self.slots(group):
                if self._slot_state[slot] != _EMPTY:
                    self._totals[2] += 1
                self._slot_state[slot] = _EMPTY
            self._cond.notify_all()

    def pending(self, group: int) -> int:
        group = self._check_group(group)
        with self._cond:
            return self._pending[group]

    @property
    def stats(self) -> BatcherStats:
        with self._cond:
            return BatcherStats(*self._totals)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (
            f"PyBatcher(num_groups={self.num_groups}, group_size={self.group_size},"
            f" num_servers={self.num_servers})"
        )


# Prioritized replay: the sum tree.

_MAX_TREE_CAPACITY = lib.BEAST_SUMTREE_MAX_CAPACITY
_UINT32_MAX = 2**32 - 1


class SumTreeSample(NamedTuple):
    """What `SumTree.sample` returns for n draws.

    indices: int64 [n], the sampled leaves.
    generations: int64 [n], each leaf's generation when it was sampled (pass
        them back to `update` so that a slot overwritten since is skipped).
    priorities: float64 [n], each leaf's priority when it was sampled.
    total: the sum of all priorities the draws were scaled by, read in the
        same critical section, so `priorities / total` are exactly the
        probabilities the leaves were drawn with.
    """

    indices: torch.Tensor
    generations: torch.Tensor
    priorities: torch.Tensor
    total: float


class SumTreeStats(NamedTuple):
    """A consistent snapshot of a SumTree's counters."""

    total: float  # sum of all priorities
    max: float  # largest priority, 0.0 when all are 0
    claims: int  # claim() calls so far; min(claims, capacity) slots were ever claimed
    owner_deaths: int  # times a process died inside a call and the lock was recovered


def _check_tree_capacity(capacity: int) -> int:
    capacity = operator.index(capacity)
    if not 1 <= capacity <= _MAX_TREE_CAPACITY:
        raise ValueError(f"capacity must be in [1, {_MAX_TREE_CAPACITY}], got {capacity}")
    return capacity


def _as_1d(values, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A contiguous 1-D CPU tensor of `dtype` (a copy only when needed)."""
    if (
        isinstance(values, torch.Tensor)
        and values.is_floating_point()
        and not dtype.is_floating_point
    ):
        # as_tensor would truncate 2.7 to 2 without a word.
        raise TypeError(f"{name} must be integers, got a {values.dtype} tensor")
    tensor = torch.as_tensor(values, dtype=dtype, device="cpu").reshape(-1).contiguous()
    if tensor.numel() > _UINT32_MAX:
        raise ValueError(f"too many {name} in one call: {tensor.numel()}")
    return tensor


def _same_length(name: str, tensor: torch.Tensor, n: int) -> None:
    if tensor.numel() != n:
        raise ValueError(f"{name} has {tensor.numel()} entries, expected {n} (one per index)")


_UINT64_MAX = 2**64 - 1
_TREE_STATE_KEYS = ("priorities", "generations", "claims", "cursor")
_BAD_STATE_PRIORITIES = "state['priorities'] must all be finite and >= 0"


class _TreeState(NamedTuple):
    """A checked `SumTree.state_dict()`: tensors contiguous on the CPU."""

    priorities: torch.Tensor  # float64 [capacity]
    generations: torch.Tensor  # int64 [capacity] (uint64 in C, same bits)
    claims: int
    cursor: int


def _check_tree_state(state, capacity: int) -> _TreeState:
    """Shapes, dtypes and counter ranges of a state for a tree of `capacity`
    leaves; ValueError with one line naming the first bad entry. Priorities'
    values are the caller's to check (SumTree lets beast_sumtree_restore do it)."""
    if not isinstance(state, dict) or set(state) != set(_TREE_STATE_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"a SumTree state is a dict with keys {list(_TREE_STATE_KEYS)}, got {got}")
    tensors = []
    for key, dtype in (("priorities", torch.float64), ("generations", torch.int64)):
        value = state[key]
        if (
            not isinstance(value, torch.Tensor)
            or value.dtype != dtype
            or tuple(value.shape) != (capacity,)
        ):
            got = (
                f"{value.dtype} {list(value.shape)}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise ValueError(f"state[{key!r}] must be a {dtype} tensor [{capacity}], got {got}")
        tensors.append(value.detach().to("cpu").contiguous())
    counters = []
    for key in ("claims", "cursor"):
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
            raise ValueError(f"state[{key!r}] must be an int in [0, 2**64), got {value!r}")
        counters.append(value)
    return _TreeState(*tensors, *counters)


def _raise_for_tree(status: int, capacity: int) -> None:
    """The one place the SumTree's C status codes become Python exceptions."""
    if status == lib.BEAST_OK:
        return
    if status == lib.BEAST_EINVAL:
        raise ValueError(
            f"invalid argument: indices must be in [0, {capacity}), priorities finite and"
            " >= 0, draws in [0, 1] (or the memory does not hold an initialised SumTree)"
        )
    if status == lib.BEAST_EEMPTY:
        raise ValueError("cannot sample: every priority in the SumTree is 0")
    if status == lib.BEAST_EFULL:
        raise RuntimeError(
            f"every one of the {capacity} replay slots is being written by a live process:"
            " make the replay's capacity larger than the number of concurrent writers"
        )
    if status == lib.BEAST_ENOTRECOVERABLE:
        raise RuntimeError("SumTree lock is not recoverable")
    raise RuntimeError(f"SumTree: unexpected native status {status}")


class SumTree:
    """Process-shared sum tree of float64 priorities (see sum_tree.h).

    ``capacity`` leaves, all 0 at first. ``sample(draws)`` maps each draw u in
    [0, 1] to the leaf whose cumulative range holds ``u * total``, so leaf i
    comes out with probability ``p_i / total``; pass stratified draws
    (``(k + U[0,1)) / n`` for k < n) for PER's stratified sampling. Updates,
    samples and claims are O(log capacity) each; a batch is one call, one lock.

    float64 rather than float32 (as rlpyt argues): float32 sums of a large
    tree round badly enough that a descent can land on a zero-priority leaf,
    and priorities in the 1e-6 range next to ones in the 1e2 range would lose
    their mass to rounding.

    Replay slots: ``claim()`` returns the next ring slot that no live process
    is writing, with its new generation, and zeroes its priority while the
    caller writes the slot's data; ``commit(index, generation, priority)``
    then makes it sampleable. Skipping slots still being written keeps two
    writers out of one slot when one is descheduled while the other laps the
    ring. ``update(..., generations=...)`` only touches leaves whose
    generation still matches (a learner's priority for data that has since
    been overwritten is dropped).

    Picklable to `multiprocessing` children of any start method: only the
    shared-memory tensor travels, and the child re-derives its C pointer.

    Checkpoints: ``state_dict()`` is the logical state (leaf priorities and
    generations, claim counter, ring cursor) as plain tensors and ints, and
    ``load_state_dict`` puts it back into a tree of the same capacity, which
    then samples and claims exactly as the saved one would have. Which slots
    were mid-write is not saved: after a restore every slot is free.
    """

    def __init__(self, capacity: int) -> None:
        capacity = _check_tree_capacity(capacity)
        nbytes = lib.beast_sumtree_nbytes(capacity)
        # Python owns the memory; C borrows it through self._mem for exactly
        # as long as self._tensor keeps the shared mapping alive.
        tensor = torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
        mem = ffi.cast("void *", tensor.data_ptr())
        _raise_for_tree(lib.beast_sumtree_init(mem, nbytes, capacity), capacity)
        self._attach(tensor)

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._mem = ffi.cast("void *", tensor.data_ptr())
        out = ffi.new("uint32_t *")
        _raise_for_tree(lib.beast_sumtree_capacity(self._mem, out), 0)
        self._capacity = int(out[0])

    def __getstate__(self) -> dict:
        return {"tensor": self._tensor}

    def __setstate__(self, state: dict) -> None:
        tensor = state["tensor"]
        # As for IndexQueue: only torch's multiprocessing pickler shares the
        # memory; a plain pickle would make a private tree nobody else sees.
        if not tensor.is_shared():
            raise RuntimeError("SumTree can only be pickled to multiprocessing children")
        self._attach(tensor)

    @property
    def capacity(self) -> int:
        return self._capacity

    def stats(self) -> SumTreeStats:
        out = ffi.new("struct beast_sumtree_stats *")
        _raise_for_tree(lib.beast_sumtree_stats(self._mem, out), self._capacity)
        return SumTreeStats(
            float(out.total), float(out.max), int(out.claims), int(out.owner_deaths)
        )

    def total(self) -> float:
        """Sum of all priorities."""
        return self.stats().total

    def max(self) -> float:
        """Largest priority (0.0 when all are 0)."""
        return self.stats().max

    def update(self, indices, priorities, generations=None) -> int:
        """Set ``priorities[k]`` (float64, finite, >= 0) at leaf ``indices[k]``.

        With ``generations`` (as `sample` or `claim` returned them), only
        leaves whose generation still matches are written. A repeated index
        keeps its last value. Returns how many leaves were written. Raises
        ValueError, changing nothing, for an index out of range or a negative
        or non-finite priority.
        """
        indices = _as_1d(indices, torch.int64, "indices")
        n = indices.numel()
        priorities = _as_1d(priorities, torch.float64, "priorities")
        _same_length("priorities", priorities, n)
        gens_ptr = ffi.NULL
        if generations is not None:
            generations = _as_1d(generations, torch.int64, "generations")
            _same_length("generations", generations, n)
            gens_ptr = ffi.cast("uint64_t *", generations.data_ptr())
        applied = ffi.new("uint32_t *")
        status = lib.beast_sumtree_update(
            self._mem,
            ffi.cast("int64_t *", indices.data_ptr()),
            ffi.cast("double *", priorities.data_ptr()),
            gens_ptr,
            n,
            applied,
        )
        _raise_for_tree(status, self._capacity)
        return int(applied[0])

    def _get(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        indices = _as_1d(indices, torch.int64, "indices")
        priorities = torch.empty(indices.numel(), dtype=torch.float64)
        generations = torch.empty(indices.numel(), dtype=torch.int64)
        status = lib.beast_sumtree_get(
            self._mem,
            ffi.cast("int64_t *", indices.data_ptr()),
            indices.numel(),
            ffi.cast("double *", priorities.data_ptr()),
            ffi.cast("uint64_t *", generations.data_ptr()),
        )
        _raise_for_tree(status, self._capacity)
        return priorities, generations

    def get(self, indices) -> torch.Tensor:
        """Priorities at ``indices``: float64 [n]."""
        return self._get(indices)[0]

    def generations(self, indices) -> torch.Tensor:
        """Generations at ``indices``: int64 [n]."""
        return self._get(indices)[1]

    def sample(self, draws) -> SumTreeSample:
        """One leaf per draw u in [0, 1] (float64 [n]); see the class docstring.

        Never returns a zero-priority leaf. Raises ValueError when every
        priority is 0, or for a draw outside [0, 1].
        """
        draws = _as_1d(draws, torch.float64, "draws")
        n = draws.numel()
        indices = torch.empty(n, dtype=torch.int64)
        generations = torch.empty(n, dtype=torch.int64)
        priorities = torch.empty(n, dtype=torch.float64)
        total = ffi.new("double *")
        status = lib.beast_sumtree_sample(
            self._mem,
            ffi.cast("double *", draws.data_ptr()),
            n,
            ffi.cast("int64_t *", indices.data_ptr()),
            ffi.cast("uint64_t *", generations.data_ptr()),
            ffi.cast("double *", priorities.data_ptr()),
            total,
        )
        _raise_for_tree(status, self._capacity)
        return SumTreeSample(indices, generations, priorities, float(total[0]))

    def claim(self) -> tuple[int, int]:
        """Claim the next ring slot no live process is writing: (index, generation).

        The slot's priority becomes 0 (it cannot be sampled while its data is
        rewritten), its generation is bumped and this process becomes its
        writer until ``commit``. Raises RuntimeError when live writers hold
        every slot.
        """
        index = ffi.new("int64_t *")
        generation = ffi.new("uint64_t *")
        _raise_for_tree(lib.beast_sumtree_claim(self._mem, index, generation), self._capacity)
        return int(index[0]), int(generation[0])

    def commit(self, index: int, generation: int, priority: float) -> bool:
        """Finish a `claim`: set the slot's priority and release it.

        False (nothing changed) if the slot was claimed again since, which
        only happens after this process was taken for dead.
        """
        applied = ffi.new("uint32_t *")
        status = lib.beast_sumtree_commit(
            self._mem, operator.index(index), operator.index(generation), float(priority), applied
        )
        _raise_for_tree(status, self._capacity)
        return bool(applied[0])

    def invalidate(self, indices) -> torch.Tensor:
        """Make leaves ``indices`` unsampleable while their data is rewritten in place:
        priority 0, generation bumped. Returns the new generations, int64 [n]; a sample or
        update that carries an older one is stale. The writer sets the new priority with
        `update` once the data is whole. Raises ValueError for an index out of range."""
        indices = _as_1d(indices, torch.int64, "indices")
        generations = torch.empty(indices.numel(), dtype=torch.int64)
        status = lib.beast_sumtree_invalidate(
            self._mem,
            ffi.cast("int64_t *", indices.data_ptr()),
            indices.numel(),
            ffi.cast("uint64_t *", generations.data_ptr()),
        )
        _raise_for_tree(status, self._capacity)
        return generations

    @property
    def owner_deaths(self) -> int:
        """Times a process died inside a call and the lock was recovered."""
        return self.stats().owner_deaths

    def state_dict(self) -> dict:
        """The tree's logical state, copied in one critical section.

        ``{"priorities": float64 [capacity], "generations": int64 [capacity],
        "claims": int, "cursor": int}``: fresh tensors (not views of the shared
        memory) and plain ints, so ``torch.save`` writes it and
        ``torch.load(weights_only=True)`` reads it back. ``cursor`` is the ring
        position the next `claim` starts looking at. Not included: which slots
        are being written (pids mean nothing in another run) and owner_deaths.
        """
        priorities = torch.empty(self._capacity, dtype=torch.float64)
        generations = torch.empty(self._capacity, dtype=torch.int64)
        claims = ffi.new("uint64_t *")
        cursor = ffi.new("uint64_t *")
        status = lib.beast_sumtree_export(
            self._mem,
            ffi.cast("double *", priorities.data_ptr()),
            ffi.cast("uint64_t *", generations.data_ptr()),
            self._capacity,
            claims,
            cursor,
        )
        _raise_for_tree(status, self._capacity)
        return {
            "priorities": priorities,
            "generations": generations,
            "claims": int(claims[0]),
            "cursor": int(cursor[0]),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the tree's state with ``state`` (a `state_dict` of a tree of
        the same capacity, native or `PySumTree`), in one critical section.

        The sums are rebuilt from the leaves and every slot is left free, so
        the tree then samples, updates and claims exactly as the saved one
        would have. Meant for resuming, before any writer claims a slot: a
        claim made before the restore loses its slot. Raises ValueError,
        changing nothing, for a wrong key, dtype or shape, a counter outside
        [0, 2**64), or a priority that is negative or not finite.
        """
        checked = _check_tree_state(state, self._capacity)
        status = lib.beast_sumtree_restore(
            self._mem,
            ffi.cast("double *", checked.priorities.data_ptr()),
            ffi.cast("uint64_t *", checked.generations.data_ptr()),
            self._capacity,
            checked.claims,
            checked.cursor,
        )
        if status == lib.BEAST_EINVAL:
            # Capacity and shapes were checked above: C refused a priority.
            raise ValueError(_BAD_STATE_PRIORITIES)
        _raise_for_tree(status, self._capacity)

    def __repr__(self) -> str:
        return f"SumTree(capacity={self._capacity}, total={self.total()})"


class PySumTree:
    """Pure-Python reference for `SumTree`: same interface, threads only.

    The same tree and the same float64 operations in the same order, so its
    totals and samples equal the native tree's bit for bit.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = _check_tree_capacity(capacity)
        self._leaves = 1
        while self._leaves < self._capacity:
            self._leaves *= 2
        self._sum = [0.0] * (2 * self._leaves)
        self._max = [0.0] * (2 * self._leaves)
        self._gen = [0] * self._capacity
        self._writing = [False] * self._capacity
        self._claims = 0
        self._cursor = 0
        # Guards every list above, _claims and _cursor.
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    def stats(self) -> SumTreeStats:
        with self._lock:
            return SumTreeStats(self._sum[1], self._max[1], self._claims, 0)

    def total(self) -> float:
        return self.stats().total

    def max(self) -> float:
        return self.stats().max

    def invalidate(self, indices) -> torch.Tensor:
        indices = self._check_indices(_as_1d(indices, torch.int64, "indices"))
        out = []
        with self._lock:
            for i in indices:
                self._set_leaf(i, 0.0)
                self._gen[i] += 1
                out.append(self._gen[i])
        return torch.tensor(out, dtype=torch.int64)

    @property
    def owner_deaths(self) -> int:
        """Always 0: threads cannot die holding the lock."""
        return 0

    def _check_indices(self, indices: torch.Tensor) -> list[int]:
        out = indices.tolist()
        if any(not 0 <= i < self._capacity for i in out):
            _raise_for_tree(lib.BEAST_EINVAL, self._capacity)
        return out

    def _pull(self, k: int) -> None:
        self._sum[k] = self._sum[2 * k] + self._sum[2 * k + 1]
        self._max[k] = max(self._max[2 * k], self._max[2 * k + 1])

    def _set_leaf(self, i: int, p: float) -> None:
        k = self._leaves + i
        self._sum[k] = self._max[k] = p
        k //= 2
        while k >= 1:
            self._pull(k)
            k //= 2

    def update(self, indices, priorities, generations=None) -> int:
        index_list = self._check_indices(_as_1d(indices, torch.int64, "indices"))
        n = len(index_list)
        priorities = _as_1d(priorities, torch.float64, "priorities")
        _same_length("priorities", priorities, n)
        values = priorities.tolist()
        if any(not math.isfinite(p) or p < 0.0 for p in values):
            _raise_for_tree(lib.BEAST_EINVAL, self._capacity)
        gens = None
        if generations is not None:
            generations = _as_1d(generations, torch.int64, "generations")
            _same_length("generations", generations, n)
            gens = generations.tolist()
        applied = 0
        with self._lock:
            for k, (i, p) in enumerate(zip(index_list, values, strict=True)):
                if gens is not None and self._gen[i] != gens[k]:
                    continue
                self._set_leaf(i, p)
                applied += 1
        return applied

    def _get(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        index_list = self._check_indices(_as_1d(indices, torch.int64, "indices"))
        with self._lock:
            priorities = [self._sum[self._leaves + i] for i in index_list]
            gens = [self._gen[i] for i in index_list]
        return (
            torch.tensor(priorities, dtype=torch.float64),
            torch.tensor(gens, dtype=torch.int64),
        )

    def get(self, indices) -> torch.Tensor:
        return self._get(indices)[0]

    def generations(self, indices) -> torch.Tensor:
        return self._get(indices)[1]

    def sample(self, draws) -> SumTreeSample:
        values = _as_1d(draws, torch.float64, "draws").tolist()
        if any(not 0.0 <= u <= 1.0 for u in values):  # NaN fails too
            _raise_for_tree(lib.BEAST_EINVAL, self._capacity)
        indices, gens, priorities = [], [], []
        with self._lock:
            total = self._sum[1]
            if not total > 0.0:
                _raise_for_tree(lib.BEAST_EEMPTY, self._capacity)
            for u in values:
                target, k = u * total, 1
                while k < self._leaves:
                    left, right = self._sum[2 * k], self._sum[2 * k + 1]
                    if target < left or right <= 0.0:
                        k = 2 * k
                    else:
                        target -= left
                        k = 2 * k + 1
                i = k - self._leaves
                indices.append(i)
                gens.append(self._gen[i])
                priorities.append(self._sum[k])
        return SumTreeSample(
            torch.tensor(indices, dtype=torch.int64),
            torch.tensor(gens, dtype=torch.int64),
            torch.tensor(priorities, dtype=torch.float64),
            total,
        )

    def claim(self) -> tuple[int, int]:
        with self._lock:
            for _ in range(self._capacity):
                i = self._cursor % self._capacity
                self._cursor += 1
                if not self._writing[i]:
                    break
            else:
                _raise_for_tree(lib.BEAST_EFULL, self._capacity)
            self._set_leaf(i, 0.0)
            self._gen[i] += 1
            self._writing[i] = True
            self._claims += 1
            return i, self._gen[i]

    def commit(self, index: int, generation: int, priority: float) -> bool:
        index, priority = operator.index(index), float(priority)
        if not 0 <= index < self._capacity or not math.isfinite(priority) or priority < 0.0:
            _raise_for_tree(lib.BEAST_EINVAL, self._capacity)
        with self._lock:
            if self._gen[index] != generation:
                return False
            self._set_leaf(index, priority)
            self._writing[index] = False
            return True

    def state_dict(self) -> dict:
        with self._lock:
            return {
                "priorities": torch.tensor(
                    self._sum[self._leaves : self._leaves + self._capacity], dtype=torch.float64
                ),
                "generations": torch.tensor(self._gen, dtype=torch.int64),
                "claims": self._claims,
                "cursor": self._cursor,
            }

    def load_state_dict(self, state: dict) -> None:
        checked = _check_tree_state(state, self._capacity)
        values = checked.priorities.tolist()
        if any(not math.isfinite(p) or p < 0.0 for p in values):
            raise ValueError(_BAD_STATE_PRIORITIES)
        with self._lock:
            self._sum[self._leaves : self._leaves + self._capacity] = values
            self._max[self._leaves : self._leaves + self._capacity] = values
            # The C tree's generations are uint64: a state's int64 -1 is 2**64 - 1
            # there, and its claim wraps to 0 as this one's does from -1.
            self._gen = checked.generations.tolist()
            self._writing = [False] * self._capacity
            self._claims, self._cursor = checked.claims, checked.cursor
            for k in range(self._leaves - 1, 0, -1):
                self._pull(k)

    def __repr__(self) -> str:
        return f"PySumTree(capacity={self._capacity}, total={self.total()})"
