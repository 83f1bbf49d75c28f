"""`SumTree` (sum_tree.c): prioritized replay's sampling structure. float64 priorities
in a sum tree and a max tree, O(log n) updates and samples, one robust process-shared
lock per call so actors inserting and a learner sampling from other processes never see
(or leave) a corrupt total, and a generation per slot so that priorities computed for
overwritten data are dropped. `PySumTree` is the pure-Python reference.
"""

import math
import operator
import threading
from typing import NamedTuple

import torch

from beast.native._ext import ffi, lib
from beast.native.shared_block import SharedBlock

__all__ = [
    "PySumTree",
    "SumTree",
    "SumTreeSample",
    "SumTreeStats",
]


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


class SumTree(SharedBlock):
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
        self._create(
            nbytes,
            lambda mem: _raise_for_tree(lib.beast_sumtree_init(mem, nbytes, capacity), capacity),
        )

    def _read_header(self) -> None:
        out = ffi.new("uint32_t *")
        _raise_for_tree(lib.beast_sumtree_capacity(self._mem, out), 0)
        self._capacity = int(out[0])

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
