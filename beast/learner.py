"""The learner: batch threads, learner threads, weight publishing.

Batch threads (one per learner thread) take `batch_size` full slots, copy them out into one
time-major batch (moved to the learning device) and free the slots at once,
so actors never wait on a learner step. Learner threads run the loss and
the optimizer step. The whole update (forward, backward, step) holds one
lock: the model's parameters are updated in place, and a second thread's
backward pass over parameters changed under it would be wrong (autograd
rejects it). Several learner threads therefore overlap only the hand-off,
as in TorchBeast; torch's intra-op threads parallelise the step itself.

The learner does not know which algorithm runs: it calls `loss_fn(outputs,
batch) -> LossOutput` and reads `total_loss` and `stats`.

With a replay (LASER, beast/rollout_replay.py) a batch of `batch_size`
rollouts is `batch_size - num_replayed` fresh ones (the first columns)
followed by `num_replayed` sampled uniformly from the replay, which then
receives the fresh ones: every rollout any actor produced goes into the
replay once, and a batch never replays its own fresh rollouts. Until the
replay holds `num_replayed` rollouts, batches are all fresh. Only fresh
rollouts count as agent steps and report finished episodes; a replayed step
was counted when it was fresh.

Two guards: a torn slot (steps from two rollouts, see beast/buffers.py) is
counted and freed, never batched; an update whose loss or gradient norm is
not finite is skipped and counted, and `max_nonfinite_updates` of them in a
row stop the run, so a diverged model is never stepped or published.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from beast.buffers import RolloutBuffers
from beast.profile import LEARNER_PHASES, PhaseClock
from beast.rollout_replay import RolloutReplay
from beast.threads import ThreadGroup

__all__ = [
    "Learner",
    "LearnerThreads",
    "NonFiniteError",
    "TrainingProgress",
    "UpdateStats",
    "compute_gradients",
    "copy_weights",
]

# How often blocked threads look at the stop flag.
_POLL_SECONDS = 0.2


@dataclass
class TrainingProgress:
    """Counters that a checkpoint saves and a resumed run continues from."""

    step: int = 0  # agent steps consumed by the learner
    num_updates: int = 0
    skipped_updates: int = 0  # non-finite loss or gradient
    torn_rollouts: int = 0  # slots whose steps came from different rollouts


class NonFiniteError(RuntimeError):
    """Too many consecutive non-finite updates."""


@dataclass(frozen=True)
class UpdateStats:
    """What one update reports to the run log."""

    step: int
    num_updates: int
    losses: dict[str, float]
    episode_returns: list[float]
    episode_steps: list[int]


LossFn = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], Any]


def compute_gradients(
    forward: Callable[..., Any],
    loss_fn: LossFn,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, torch.Tensor],
    core_state: tuple[torch.Tensor, ...],
    *,
    grad_norm_clipping: float,
    bf16: bool,
    device_type: str,
    clock: PhaseClock | None = None,
) -> tuple[Any, torch.Tensor]:
    """The first half of an update: forward, loss, backward, gradient clipping.

    `forward` is the model or a wrapper of it (the benchmark passes a compiled
    one). The forward pass may run under bf16 autocast; V-trace and the losses
    always run in float32. Leaves clipped gradients in `.grad`; returns the
    LossOutput and the gradient norm before clipping (0 disables clipping).
    `clock` (--profile) gets a "forward" mark after the loss and a "backward"
    one after clipping.
    """
    model.train()
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        outputs, _ = forward(batch, core_state)
    loss = loss_fn({k: v.float() for k, v in outputs._asdict().items()}, batch)
    if clock is not None:
        clock.mark("forward")
    optimizer.zero_grad(set_to_none=True)
    loss.total_loss.backward()
    # clip_grad_norm_ with an infinite bound just measures the norm.
    max_norm = grad_norm_clipping if grad_norm_clipping > 0 else float("inf")
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if clock is not None:
        clock.mark("backward")
    return loss, grad_norm


def copy_weights(destination: nn.Module, source: nn.Module) -> None:
    """Copy `source`'s weights into `destination` in place (shared memory stays shared)."""
    with torch.no_grad():
        for shared, own in zip(
            destination.state_dict().values(), source.state_dict().values(), strict=True
        ):
            shared.copy_(own)


class LearnerThreads(ThreadGroup):
    """The thread lifecycle both learners share (this module's and beast/replay_learner.py's).

    A `ThreadGroup` whose failure event is `finished` (also set when total_steps is
    reached). Each learner thread gets a row of `phase_seconds` (beast/profile.py,
    --profile).
    """

    def __init__(self, num_learner_threads: int) -> None:
        self.finished = threading.Event()  # total_steps reached, or a thread failed
        super().__init__(on_error=self.finished)
        self.phase_seconds = torch.zeros(
            (num_learner_threads, len(LEARNER_PHASES)), dtype=torch.float64
        )

    def _add_learner_threads(self, learn_loop: Callable[[int], None]) -> None:
        """One thread per row of phase_seconds, running learn_loop(thread_index)."""
        for i in range(len(self.phase_seconds)):
            self._add_thread(functools.partial(learn_loop, i), f"learner-{i}")


class Learner(LearnerThreads):
    def __init__(
        self,
        *,
        model: nn.Module,
        actor_model: nn.Module,
        buffers: RolloutBuffers,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        loss_fn: LossFn,
        device: torch.device,
        batch_size: int,
        total_steps: int,
        grad_norm_clipping: float,
        num_learner_threads: int,
        max_nonfinite_updates: int,
        on_update: Callable[[UpdateStats], None],
        progress: TrainingProgress | None = None,
        precision: str = "fp32",
        forward: Callable[..., Any] | None = None,
        reduce_gradients: Callable[[nn.Module, bool], bool] | None = None,
        replay: RolloutReplay | None = None,
        num_replayed: int = 0,
    ) -> None:
        if replay is not None and not 0 < num_replayed < batch_size:
            raise ValueError(
                f"with a replay, num_replayed must be in [1, batch_size), got {num_replayed}"
            )
        super().__init__(num_learner_threads)
        self.model = model
        # What the update calls for the forward pass: the model, or a compiled wrapper.
        self.forward = forward or model
        self.actor_model = actor_model
        self.buffers = buffers
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.device = device
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.grad_norm_clipping = grad_norm_clipping
        self.max_nonfinite_updates = max_nonfinite_updates
        self.bf16 = precision == "bf16"
        self.replay = replay
        self.num_replayed = num_replayed if replay is not None else 0
        self.on_update = on_update
        # Several learners (beast/poly): called on every update, finite or not (it is a
        # collective), with this learner's finiteness; it combines the gradients across
        # learners in place and returns whether the update is finite on all of them, so
        # that every learner takes the same step or skip and the weights stay identical.
        self.reduce_gradients = reduce_gradients
        self.progress = progress or TrainingProgress()
        self._consecutive_nonfinite = 0
        # Guards progress.torn_rollouts, which batch threads bump without the
        # update lock (they must not wait for an update in flight).
        self._torn_lock = threading.Lock()
        # Guards the model, optimizer, scheduler, progress and the published
        # actor weights: everything an update or a checkpoint touches.
        self.lock = threading.Lock()
        # Prepared batches waiting for a learner thread; small, so that a slow
        # learner applies back-pressure to the batch thread and not to memory.
        # Each with the number of fresh rollouts (its first columns).
        self._batches: queue.Queue[tuple[dict[str, torch.Tensor], int]] = queue.Queue(maxsize=2)
        # One batch-preparation thread per learner thread, so that gathering the
        # next batch never waits on an update in flight.
        for i in range(num_learner_threads):
            self._add_thread(self._batch_loop, f"batcher-{i}")
        self._add_learner_threads(self._learn_loop)

    def _batch_loop(self) -> None:
        pin = self.device.type == "cuda"
        while not self._stop.is_set():
            replaying = self.replay is not None and len(self.replay) >= self.num_replayed
            num_fresh = self.batch_size - self.num_replayed if replaying else self.batch_size
            indices: list[int] = []
            while len(indices) < num_fresh:
                try:
                    index = self.buffers.full_queue.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    if self._stop.is_set():
                        return
                    continue
                if self.buffers.is_torn(index):
                    with self._torn_lock:
                        self.progress.torn_rollouts += 1
                    self.buffers.free_queue.put(index)
                    continue
                indices.append(index)
            batch = self.buffers.gather(indices)
            for index in indices:
                self.buffers.free_queue.put(index)
            if self.replay is not None:
                # Sampled before the fresh rollouts go in: none is replayed beside itself.
                replayed = self.replay.sample(self.num_replayed) if replaying else None
                self.replay.add(batch)
                if replayed is not None:
                    batch = {k: torch.cat([v, replayed[k]], dim=1) for k, v in batch.items()}
            if pin:
                batch = {
                    k: v.pin_memory().to(self.device, non_blocking=True) for k, v in batch.items()
                }
            while not self._stop.is_set():
                try:
                    self._batches.put((batch, num_fresh), timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue

    def _learn_loop(self, thread_index: int) -> None:
        clock = PhaseClock(self.phase_seconds[thread_index], LEARNER_PHASES)
        while not self._stop.is_set():
            try:
                batch, num_fresh = self._batches.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            with self.lock:
                clock.mark("wait_batch")
                if self.progress.step >= self.total_steps:
                    self.finished.set()
                    return
                stats = self._update(batch, num_fresh, clock)
                if self.progress.step >= self.total_steps:
                    self.finished.set()
            self.on_update(stats)

    def _update(
        self,
        batch: dict[str, torch.Tensor],
        num_fresh: int | None = None,
        clock: PhaseClock | None = None,
    ) -> UpdateStats:
        """One optimizer step on one batch whose first `num_fresh` rollouts (default:
        all) are fresh; caller holds the lock."""
        if num_fresh is None:
            num_fresh = batch["reward"].shape[1]
        loss, grad_norm = compute_gradients(
            self.forward,
            self.loss_fn,
            self.model,
            self.optimizer,
            batch,
            self.buffers.core_state(batch),
            grad_norm_clipping=self.grad_norm_clipping,
            bf16=self.bf16,
            device_type=self.device.type,
            clock=clock,
        )
        finite = bool(torch.isfinite(loss.total_loss.detach())) and bool(torch.isfinite(grad_norm))
        if self.reduce_gradients is not None:
            finite = self.reduce_gradients(self.model, finite)
        if finite:
            self._consecutive_nonfinite = 0
            self.optimizer.step()
            if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
                raise NonFiniteError(
                    "an optimizer step made the weights non-finite; lower --learning_rate"
                    " (the last checkpoint is kept as it is)"
                )
            self.scheduler.step()
            if clock is not None:
                clock.mark("optimizer")
            self.publish_weights()
            if clock is not None:
                clock.mark("publish")
            self.progress.num_updates += 1
        else:
            self.optimizer.zero_grad(set_to_none=True)
            self.progress.skipped_updates += 1
            self._consecutive_nonfinite += 1
            if self._consecutive_nonfinite >= self.max_nonfinite_updates:
                raise NonFiniteError(
                    f"{self._consecutive_nonfinite} consecutive updates had a non-finite loss or"
                    f" gradient (loss {float(loss.total_loss.detach())},"
                    f" gradient norm {float(grad_norm)});"
                    " lower --learning_rate, check the env's rewards and observations, or raise"
                    " --max_nonfinite_updates"
                )

        unroll_length = batch["reward"].shape[0] - 1
        # The batch's fresh steps count as consumed even when its update was skipped.
        self.progress.step += unroll_length * num_fresh
        # Step 0 repeats the previous rollout's last step: count episodes from t=1.
        # Replayed rollouts reported theirs when they were fresh.
        ended = batch["episode_end"][1:, :num_fresh]
        losses = {key: float(value) for key, value in loss.stats.items()}
        losses["grad_norm"] = float(grad_norm)
        losses["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        losses["skipped_updates"] = self.progress.skipped_updates
        losses["torn_rollouts"] = self.progress.torn_rollouts
        if self.replay is not None:
            losses["replayed_rollouts"] = batch["reward"].shape[1] - num_fresh
            losses["replay_fill"] = len(self.replay) / self.replay.capacity
        return UpdateStats(
            step=self.progress.step,
            num_updates=self.progress.num_updates,
            losses=losses,
            episode_returns=batch["episode_return"][1:, :num_fresh][ended].tolist(),
            episode_steps=batch["episode_step"][1:, :num_fresh][ended].tolist(),
        )

    def publish_weights(self) -> None:
        """Copy the learner's weights into the actors' shared-memory model, in place."""
        copy_weights(self.actor_model, self.model)
