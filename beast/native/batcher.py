"""`Batcher` (batcher.c): the request table of central inference. Actors post K
requests each and sleep until all K are answered; inference threads in the learner
collect ready requests as one sorted index tensor, run one forward pass and answer,
which wakes exactly the actors they served. `PyBatcher` is the pure-Python reference.
"""

import operator
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from beast.native._ext import ffi, lib
from beast.native.shared_block import SharedBlock
from beast.native.waits import _MAX_TIMEOUT_SECONDS, QueueClosed, _deadline_ns, _remaining_ns

__all__ = [
    "Batcher",
    "BatcherStats",
    "PyBatcher",
]


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


class Batcher(_BatcherArgs, SharedBlock):
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
        self._create(
            nbytes,
            lambda mem: _raise_for_batcher(
                lib.beast_batcher_init(mem, nbytes, num_groups, group_size, num_servers)
            ),
        )

    def _read_header(self) -> None:
        sizes = ffi.new("uint32_t[3]")
        _raise_for_batcher(lib.beast_batcher_sizes(self._mem, sizes, sizes + 1, sizes + 2))
        self.num_groups, self.group_size, self.num_servers = (int(x) for x in sizes)

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
