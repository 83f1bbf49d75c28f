"""The learner's side of a replay that actors fill themselves
(beast/experience/replay_sink.py): sampled batches on the learning device, new priorities
back, and the agent steps and episodes the actors counted on their side."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import torch

from beast.experience.contract import Batch
from beast.experience.replay_sink import ReplaySink

__all__ = ["ReplaySource"]

# The learner's pause when it is ahead of the actors: short, as an actor step is (a
# MuJoCo step and one forward pass take a fraction of a millisecond).
_LEARNER_WAIT_SECONDS = 0.0002


class ReplaySource:
    """The learner's side of a `ReplaySink`: sampled batches on the learning device.

    Each learner thread samples its batch itself, outside the update lock (so with
    several threads one samples while another updates), with its own generator. (A
    sampler thread per learner thread, as rollouts have, measured slower on 2 cores:
    both make many small torch calls and hand the GIL back and forth; the Ape-X CartPole
    update ran 161-172 updates/s that way against 173-203 inline.)

    Agent steps are the actors' env steps, counted on their side (`pending_steps`), not
    steps trained on; episodes come from the actors' rings (`pending_episodes`). Until the
    replay holds `min_replay_size` items (`replay.unit`), `next` returns None.

    With `parts` > 1 (--updates_per_sample) a batch holds that many batches, drawn at once (one
    priority draw, one gather, one host-to-device copy; each part stratified over the whole replay,
    `beast.experience.prioritized.stratified_parts`), which the learner trains on one after another
    (`Batch.split`) and answers with one priority update. The sink's rate limit then counts in such
    blocks (its `batch_size` is the block's).
    """

    def __init__(
        self,
        sink: ReplaySink,
        *,
        batch_size: int,
        device: torch.device,
        seed: int = 0,
        parts: int = 1,
    ) -> None:
        self.sink = sink
        self.replay = sink.replay
        self.unit = sink.replay.unit  # "sequences", "transitions"
        self.batch_size = batch_size
        self.parts = parts
        self.device = device
        self.seed = seed
        self._local = threading.local()
        self._threads_seen = 0
        # Guards the cursors below and _threads_seen: learner threads read them.
        self._lock = threading.Lock()
        self._steps_read = sink.total_env_steps()
        self._episode_cursor = sink.episode_count.numpy().copy()
        self.dropped_episodes = 0
        self.failed = threading.Event()  # never set: sampling runs in the learner threads
        self.error: BaseException | None = None

    def start(self) -> None:
        """Nothing to start: learner threads sample."""

    def stop(self, timeout: float) -> None:
        """Nothing to stop."""

    def _generator(self) -> torch.Generator:
        generator = getattr(self._local, "generator", None)
        if generator is None:
            with self._lock:
                index = self._threads_seen
                self._threads_seen += 1
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            self._local.generator = generator
        return generator

    def _ready(self) -> bool:
        return len(self.replay) >= self.sink.min_replay_size and self.replay.tree.total() > 0

    def next(self, timeout: float) -> Batch | None:
        """A sampled batch, or None (after `timeout`) while the replay is still filling."""
        if not self._ready():
            time.sleep(timeout)
            return None
        if not self.sink.sample_allowed():
            time.sleep(_LEARNER_WAIT_SECONDS)
            return None
        return self._sample()

    def poll(self) -> Batch | None:
        """--serial: a batch when the learner is behind `samples_per_insert` samples per
        inserted item beyond --min_replay_size, else None."""
        sink = self.sink
        owed = sink.samples_per_insert * (sink.total_inserted() - sink.min_replay_size)
        if not self._ready() or int(sink.sampled[0]) >= owed:
            return None
        return self._sample()

    def _sample(self) -> Batch | None:
        try:
            sample = self.replay.sample(self.batch_size, self._generator(), parts=self.parts)
        except ValueError:
            # Every stored slot can be mid-overwrite (priority 0) for a moment.
            if self.replay.tree.total() <= 0:
                return None
            raise
        data, weights = sample.batch, sample.weights
        if self.device.type != "cpu":
            pin = self.device.type == "cuda"
            data = {
                key: (value.pin_memory() if pin else value).to(self.device, non_blocking=pin)
                for key, value in data.items()
            }
            weights = weights.to(self.device, non_blocking=pin)
        return Batch(
            data=data,
            weights=weights,
            indices=sample.indices,
            generations=sample.generations,
            parts=self.parts,
        )

    def pending_steps(self) -> int:
        """Env steps the actors took since the last call."""
        with self._lock:
            total = self.sink.total_env_steps()
            new, self._steps_read = total - self._steps_read, total
        return new

    def pending_episodes(self) -> tuple[list[float], list[int]]:
        with self._lock:
            returns, lengths, dropped = self.sink.new_episodes(self._episode_cursor)
            self.dropped_episodes += dropped
        return returns, lengths

    def feedback(self, batch: Batch, priorities: torch.Tensor | None) -> None:
        """New priorities for the batch's items (None: a skipped update, or a uniform
        replay); the batch counts as sampled either way, for the actors' rate limit: it was
        consumed."""
        if priorities is not None:
            self.replay.update_priorities(batch.indices, priorities, batch.generations)
        self.sink.sampled[0] += self.batch_size * batch.parts

    def release(self, batch: Batch) -> None:
        """Nothing to free: sampled items stay in the replay."""

    def stats(self) -> dict[str, float]:
        return {
            "replay_fill": len(self.replay) / self.replay.capacity,
            f"inserted_{self.unit}": self.sink.total_inserted(),
            f"sampled_{self.unit}": int(self.sink.sampled[0]),
            "dropped_episodes": self.dropped_episodes,
        }

    def status_line(self) -> str | None:
        """Progress while the replay fills up before the first update; None once it holds
        --min_replay_size items."""
        size, needed = len(self.replay), self.sink.min_replay_size
        if size >= needed:
            return None
        return (
            f"filling the replay: {size:,} of {needed:,} {self.unit} before learning starts,"
            f" {self.sink.total_env_steps():,} env steps"
        )

    def describe(self) -> str:
        return self.sink.describe()

    def close(self) -> None:
        self.sink.close()

    def save_replay(self, write: Callable[[dict[str, torch.Tensor]], None]) -> dict:
        """Checkpoint the replay: `write` its contents (the atomic replay file), return the
        small rest (priorities, generations, the rate limiter's counters) for model.tar.
        The actors and the learner may go on while the contents are written: the counters
        are taken with the contents, and `settle` drops what was overwritten meanwhile."""
        tensors, state = self.replay.contents()
        state["inserted"] = self.sink.total_inserted()
        state["sampled"] = int(self.sink.sampled[0])
        write(tensors)
        return self.replay.settle(state)

    def restore_replay(self, tensors: Mapping[str, torch.Tensor], state: Mapping) -> str:
        """Load a checkpointed replay before the actors start; returns what was restored."""
        self.replay.restore(tensors, state)
        self.sink.inserted.zero_()
        self.sink.inserted[0] = int(state["inserted"])
        self.sink.sampled[0] = int(state["sampled"])
        return f"replay of {len(self.replay):,} {self.unit} ({int(state['sampled']):,} sampled)"
