"""The learner's side of the rollout slots (beast/experience/rollout_slots.py): `RolloutSource`
takes full slots, copies batches of them out time-major (with LASER's replayed rollouts mixed in)
and puts the slots back on the free queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from beast.experience.contract import Batch
from beast.experience.rollout_slots import _POLL_SECONDS, RolloutBuffers
from beast.util.threads import ThreadGroup

if TYPE_CHECKING:
    from beast.experience.rollout_replay import RolloutReplay

__all__ = [
    "RolloutSource",
]


class RolloutSource:
    """The learner's side of the slots: batches of `batch_size` full rollouts.

    A batch is `batch_size` full slots copied out time-major (`gather`); the slots go back
    to the free queue at once, so actors never wait on a learner step. A torn slot (see the
    module docstring) is counted and freed, never batched. With a `replay` (LASER,
    beast/experience/rollout_replay.py), `num_replayed` of the batch's rollouts are drawn from it
    (the last columns) and the fresh ones go in afterwards: every rollout any actor
    produced is replayed from then on, and a batch never replays its own fresh rollouts.
    Until the replay holds `num_replayed` rollouts, batches are all fresh. Only fresh
    rollouts count as agent steps and report finished episodes; a replayed step was
    counted when it was fresh.

    `start()` runs `num_threads` preparation threads (one per learner thread, so that
    gathering the next batch never waits on an update in flight) that keep up to two
    batches ready on the learning device; `next()` takes one. Without them (--serial),
    `poll()` prepares one when enough rollouts are full, without blocking.

    `synchronous`: a batch's slots go back to the free queue only when the learner
    `release`s the batch, after its update's weights are published. With as many slots as
    the actors fill at once (the engine's choice for a synchronous experience), an actor
    that finished its rollouts then waits in `take` for the update they feed, and acts
    on with its weights: every batch is one rollout of every env, all from the weights of
    the update before (but for step 0, whose action was chosen before the update).
    """

    def __init__(
        self,
        buffers: RolloutBuffers,
        *,
        batch_size: int,
        device: torch.device,
        replay: RolloutReplay | None = None,
        num_replayed: int = 0,
        num_threads: int = 1,
        synchronous: bool = False,
    ) -> None:
        if replay is not None and not 0 < num_replayed < batch_size:
            raise ValueError(
                f"with a replay, num_replayed must be in [1, batch_size), got {num_replayed}"
            )
        self.buffers = buffers
        self.batch_size = batch_size
        self.device = device
        self.replay = replay
        self.num_replayed = num_replayed if replay is not None else 0
        self.synchronous = synchronous
        self.torn_rollouts = 0
        # Guards torn_rollouts, which preparation threads bump concurrently.
        self._torn_lock = threading.Lock()
        self.failed = threading.Event()
        self._threads = ThreadGroup(on_error=self.failed)
        # Prepared batches waiting for a learner thread; small, so that a slow learner
        # applies back-pressure to the preparation threads and not to memory.
        self._ready: queue.Queue = queue.Queue(maxsize=2)
        for i in range(num_threads):
            self._threads._add_thread(self._prepare_loop, f"batcher-{i}")

    # The engine's side (beast/learning/learner.py's Source protocol).

    def start(self) -> None:
        self._threads.start()

    def stop(self, timeout: float) -> None:
        self._threads.stop(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._threads.error

    def next(self, timeout: float) -> Batch | None:
        """A prepared batch, or None after `timeout` seconds without one."""
        try:
            return self._ready.get(timeout=timeout)
        except queue.Empty:
            return None

    def poll(self) -> Batch | None:
        """A batch if `batch_size` rollouts are full now, else None (no threads: --serial)."""
        if self.buffers.full_queue.qsize() < self._num_fresh():
            return None
        return self._prepare(lambda: False)

    def pending_steps(self) -> int:
        """Agent steps taken that no batch accounts for: none, rollouts carry theirs."""
        return 0

    def pending_episodes(self) -> tuple[list[float], list[int]]:
        return [], []

    def feedback(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        """Nothing to send back: rollouts have no priorities."""

    def release(self, batch: Batch) -> None:
        """The learner is done with `batch` and has published its update's weights: a
        synchronous source frees its slots now (class docstring)."""
        if self.synchronous and batch.indices is not None:
            for index in batch.indices.tolist():
                self.buffers.free(index)

    def stats(self) -> dict[str, float]:
        stats = {"torn_rollouts": self.torn_rollouts}
        if self.replay is not None:
            stats["replay_fill"] = len(self.replay) / self.replay.capacity
        return stats

    def status_line(self) -> str | None:
        return None

    def describe(self) -> str:
        line = self.buffers.describe()
        if self.replay is not None:
            line += (
                f", a replay of {self.replay.capacity:,} rollouts"
                f" ({self.replay.nbytes() / 2**20:,.0f} MiB, {self.num_replayed} of each"
                f" batch's {self.batch_size} rollouts)"
            )
        return line

    def close(self) -> None:
        self.buffers.close()

    def save_replay(self, write: Callable[[dict[str, torch.Tensor]], None]) -> dict | None:
        """Checkpoint the replay: `write` its tensors (the atomic replay file) and return
        the small rest for model.tar; None without a replay. Preparation threads go on
        adding meanwhile: `settle` marks the rows they rewrote, which a restore drops."""
        if self.replay is None:
            return None
        tensors, state = self.replay.contents()
        write(tensors)
        return self.replay.settle(state)

    def restore_replay(self, tensors: Mapping[str, torch.Tensor], state: Mapping) -> str:
        """Load a checkpointed replay; returns what was restored, for the start-up line."""
        if self.replay is None:
            raise ValueError("this run has no replay")
        self.replay.restore(tensors, state)
        return f"replay of {len(self.replay):,} rollouts"

    # Preparation.

    def _num_fresh(self) -> int:
        replaying = self.replay is not None and len(self.replay) >= self.num_replayed
        return self.batch_size - self.num_replayed if replaying else self.batch_size

    def _prepare_loop(self) -> None:
        stopped = self._threads._stop.is_set
        while not stopped():
            batch = self._prepare(stopped)
            while batch is not None and not stopped():
                try:
                    self._ready.put(batch, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue

    def _prepare(self, stopped: Callable[[], bool]) -> Batch | None:
        """Gather one batch (None when `stopped()` turns True while waiting)."""
        buffers = self.buffers
        num_fresh = self._num_fresh()
        indices: list[int] = []
        while len(indices) < num_fresh:
            try:
                index = buffers.take_full(_POLL_SECONDS)
            except queue.Empty:
                if stopped():
                    for index in indices:
                        buffers.free(index)
                    return None
                continue
            if buffers.is_torn(index):
                with self._torn_lock:
                    self.torn_rollouts += 1
                buffers.free(index)
                continue
            indices.append(index)
        data = buffers.gather(indices)
        if not self.synchronous:  # else `release` frees them after the update
            for index in indices:
                buffers.free(index)
        # Step 0 repeats the previous rollout's last step: count episodes from t=1.
        ended = data["episode_end"][1:]
        returns = tuple(data["episode_return"][1:][ended].tolist())
        lengths = tuple(data["episode_step"][1:][ended].tolist())
        stats = {}
        if self.replay is not None:
            # Sampled before the fresh rollouts go in: none is replayed beside itself.
            replaying = num_fresh < self.batch_size
            replayed = self.replay.sample(self.num_replayed) if replaying else None
            self.replay.add(data)
            if replayed is not None:
                data = {k: torch.cat([v, replayed[k]], dim=1) for k, v in data.items()}
            stats["replayed_rollouts"] = self.batch_size - num_fresh
        if self.device.type != "cpu":
            pin = self.device.type == "cuda"
            data = {
                k: (v.pin_memory() if pin else v).to(self.device, non_blocking=pin)
                for k, v in data.items()
            }
        return Batch(
            data=data,
            indices=torch.tensor(indices, dtype=torch.int64) if self.synchronous else None,
            new_steps=buffers.unroll_length * num_fresh,
            episode_returns=returns,
            episode_steps=lengths,
            stats=stats,
        )
