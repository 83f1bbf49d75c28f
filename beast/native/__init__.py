"""Native components behind Pythonic classes; the modules of this package are the only
code that touches ffi/lib.

`IndexQueue` is a FIFO of int32 rollout-slot indices shared by the learner and
actor processes (the free/full protocol of `beast.experience.rollout_slots`). It lives in C
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

The wrappers, one module per native part (each with its reference):

    index_queue.py  `IndexQueue`, `SlotOwners`, `PyIndexQueue`      (index_queue.c)
    batcher.py      `Batcher`, `BatcherStats`, `PyBatcher`           (batcher.c)
    sum_tree.py     `SumTree`, `SumTreeSample`, `SumTreeStats`, `PySumTree`  (sum_tree.c)
    acting.py       an actor's sampler and step copies               (acting.c)
    waits.py        `QueueClosed` and the deadlines the blocking calls pass to C
    shared_block.py `SharedBlock`: a wrapper's shared memory, pickled to children
"""

# Every wrapper imports ffi and lib from the compiled extension; checking it here, where
# any of them is first imported, turns a checkout that was never built into one line.
try:
    from beast.native._ext import ffi, lib  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "beast.native._ext":
        raise
    raise ImportError(
        "beast's native extension (beast.native._ext) is not built: run `pip install -e .`"
    ) from e

from beast.native.batcher import Batcher, BatcherStats, PyBatcher
from beast.native.index_queue import NO_OWNER, IndexQueue, PyIndexQueue, SlotOwners
from beast.native.sum_tree import PySumTree, SumTree, SumTreeSample, SumTreeStats
from beast.native.waits import QueueClosed

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
