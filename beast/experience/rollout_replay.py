"""LASER's replay: a FIFO of whole rollouts in shared memory, sampled uniformly.

LASER (Schmitt, Hessel & Simonyan 2019, "Off-Policy Actor-Critic with Shared
Experience Replay", arXiv:1909.11583) mixes replayed rollouts into every
IMPALA batch. Its replay is deliberately plain (section 5): experience "is
removed in a first in first out order, so that replay always holds the most
recent experience", and sampling is uniform, which the paper found as good
as prioritised replay on DMLab-30 while having no priorities to tune and
nothing agent-specific, so one replay can serve several learners.

What is stored: every rollout the learner receives, once, with every field of
the rollout spec (beast/experience/rollout_slots.py), in the same per-slot layout. Two fields
make a replayed rollout learnable long after its actor's weights are gone:
`policy_logits`, the behaviour policy mu that V-trace and the trust region
compare against, and the `core_state_i` fields, the recurrent state the actor
started the rollout from, so a replayed rollout is unrolled from its stored
state like a fresh one. (The paper instead replays whole episodes from their
start to recompute LSTM states with current weights; fixed-length rollouts
make that impossible, so a replayed rollout starts from a state that older
weights computed; within the rollout the learner's unroll recomputes it.)

Layout: like the rollout slots, one contiguous shared-memory block per field,
`[capacity, *per-slot shape]`. Shared memory costs nothing over private
memory in the learner process and lets other processes (several learners
sharing experience, as in the paper's sweeps) map the same replay.

Checkpointed with the run (`contents`, `settle` and `restore`, through
`RolloutSource.save_replay`: beast/run/build.py `Run.save`) unless --no-checkpoint_replay.
The rollouts are written while batch threads go on adding; the rows they rewrite
meanwhile are dropped at restore.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch
from torch import Tensor

from beast.fields import Field, leading_rows, shared_zeros

__all__ = ["RolloutReplay"]


class RolloutReplay:
    """A ring of `capacity` rollouts; the newest overwrite the oldest.

    Batches in and out are time-major, as `RolloutBuffers.gather` makes them:
    rollout fields `[T+1, B, ...]`, core-state fields `[d0, B, ...]`, the
    rollout index at dim 1 for every field.
    """

    def __init__(self, spec: Mapping[str, Field], capacity: int, seed: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.spec = dict(spec)
        self.capacity = capacity
        self.tensors = {
            key: shared_zeros((capacity, *f.shape), f.dtype) for key, f in self.spec.items()
        }
        # Guards the tensors, _next, _size, _generations and _generator: batch threads
        # (one per learner thread) add and sample concurrently, and a sample must never
        # copy a row that an add is overwriting.
        self.lock = threading.Lock()
        self._next = 0  # row the next rollout goes to: the oldest once full
        self._size = 0
        # How often each row was written: a checkpoint written while adds go on drops
        # the rows rewritten meanwhile (`settle`).
        self._generations = torch.zeros(capacity, dtype=torch.int64)
        self._generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        with self.lock:
            return self._size

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def add(self, batch: Mapping[str, Tensor]) -> None:
        """Store the batch's rollouts (every spec field; other keys are ignored).

        The rollouts go in column order, so with more columns than capacity
        only the last `capacity` stay, as if added one by one.
        """
        num_rollouts = batch[next(iter(self.spec))].shape[1]
        first = max(0, num_rollouts - self.capacity)
        count = num_rollouts - first
        if count == 0:
            return
        with self.lock:
            rows = (self._next + torch.arange(count)) % self.capacity
            for key, tensor in self.tensors.items():
                tensor[rows] = batch[key][:, first:].movedim(1, 0)
            self._generations[rows] += 1
            self._next = (self._next + count) % self.capacity
            self._size = min(self._size + count, self.capacity)

    def sample(self, num_rollouts: int) -> dict[str, Tensor]:
        """`num_rollouts` distinct stored rollouts, each row equally likely; a copy.

        Without replacement within one call, so a batch never holds the same
        rollout twice; independent between calls.
        """
        with self.lock:
            if not 0 < num_rollouts <= self._size:
                raise ValueError(
                    f"cannot sample {num_rollouts} rollouts from a replay holding {self._size}"
                )
            rows = torch.randperm(self._size, generator=self._generator)[:num_rollouts].tolist()
            # One copy per field straight into the batch layout (as RolloutBuffers.gather
            # does); a copy, so the rows may be overwritten once the lock is released.
            return {
                key: torch.stack([tensor[row] for row in rows], dim=1)
                for key, tensor in self.tensors.items()
            }

    def contents(self) -> tuple[dict[str, Tensor], dict[str, object]]:
        """A checkpoint of the replay: the stored rollouts and the ring's position.

        The tensors are views of the replay's own memory (a full Atari replay is
        gigabytes: no copy), and batch threads may go on adding while they are written
        out; `settle` the state after the write, so that rows rewritten meanwhile are
        not restored half old, half new."""
        with self.lock:
            size, next_row = self._size, self._next
            generations = self._generations.clone()
        tensors = {key: leading_rows(tensor, size) for key, tensor in self.tensors.items()}
        state = {"capacity": self.capacity, "size": size, "next": next_row}
        return tensors, {**state, "generations": generations}

    def settle(self, state: dict[str, object]) -> dict[str, object]:
        """`contents`' state, once its tensors are written: "intact" marks the saved
        rows that no add rewrote since (bool [size]); `restore` keeps only those."""
        with self.lock:
            rewritten = self._generations != state["generations"]
        settled = {key: value for key, value in state.items() if key != "generations"}
        return {**settled, "intact": ~rewritten[: int(state["size"])]}

    def restore(self, tensors: Mapping[str, Tensor], state: Mapping[str, object]) -> None:
        """Load `contents`' two parts, settled; ValueError (one line) for another layout.

        Rows not intact (rewritten while the checkpoint was written) are dropped: the
        rest are packed from the oldest, and the ring goes on after them."""
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"the saved replay holds {state['capacity']} rollouts, this one {self.capacity}"
            )
        size = int(state["size"])
        for key, tensor in self.tensors.items():
            saved = tensors.get(key)
            if saved is None or tuple(saved.shape) != (size, *tensor.shape[1:]):
                raise ValueError(f"the saved replay's field {key} does not fit this replay")
        intact = state.get("intact")
        with self.lock:
            if intact is None or bool(intact.all()):
                for key, tensor in self.tensors.items():
                    tensor[:size] = tensors[key]
                self._size, self._next = size, int(state["next"])
            else:
                # Oldest first: a full ring's oldest row is the one it would write next.
                oldest = int(state["next"]) if size == self.capacity else 0
                ages = [(oldest + age) % size for age in range(size)]
                kept = [row for row in ages if intact[row]]
                for key, tensor in self.tensors.items():
                    for packed, row in enumerate(kept):
                        tensor[packed] = tensors[key][row]
                self._size, self._next = len(kept), len(kept) % self.capacity
            self._generations.zero_()
