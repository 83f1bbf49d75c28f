"""The learner: one loop for every algorithm, and the one optimizer step.

Learner threads take batches from the run's source, hand each to the algorithm's update
(beast/algos/base.py `Update`) under one lock, send what it returns back to the source
(a prioritized replay's new priorities), count agent steps and finished episodes, and
publish the weights to the actors. The learner does not know which algorithm runs, nor
where batches come from: it holds a `Source` (beast/experience/contract.py, which lists
what a source answers), built by the algorithm's experience spec.

The whole update (forward, backward, step) holds one lock: the model's parameters are
updated in place, and a second thread's backward pass over parameters changed under it
would be wrong (autograd rejects it). Several learner threads therefore overlap only the
hand-off, as in TorchBeast; torch's intra-op threads parallelise the step itself.

`Stepper` is the one place for zero_grad, backward, gradient clipping, the non-finite
guard, the reduction across learners (polybeast), the learning-rate schedule and the
optimizer step; an algorithm calls it once per optimizer step (several per update for
algorithms with several optimizers or epochs). An update whose loss or gradient norm is
not finite is skipped and counted, and `max_nonfinite_updates` of them in a row stop the
run, so a diverged model is never stepped or published.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from beast.algos.base import Update
from beast.experience.contract import Batch, Source
from beast.learning.thread_tuner import ThreadTuner
from beast.train_step import StepAbandoned
from beast.train_step.optim import INITIAL_LR, lr_multiplier
from beast.util.profile import LEARNER_PHASES, PhaseClock
from beast.util.threads import ThreadGroup

__all__ = [
    "Learner",
    "NonFiniteError",
    "Stepper",
    "TrainingProgress",
    "UpdateStats",
]

# How often blocked threads look at the stop flag.
_POLL_SECONDS = 0.2


@dataclass
class TrainingProgress:
    """Counters that a checkpoint saves and a resumed run continues from."""

    step: int = 0  # agent steps accounted for
    num_updates: int = 0  # updates that stepped an optimizer
    skipped_updates: int = 0  # optimizer steps skipped: non-finite loss or gradient


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


# reduce_gradients(parameters, finite) -> finite on every learner (beast/poly/distributed.py).
GradientReduction = Callable[[list[torch.Tensor], bool], bool]


_NON_FINITE_WEIGHTS = (
    "an optimizer step made the weights non-finite; lower --learning_rate (the last"
    " checkpoint is kept as it is)"
)


class Stepper:
    """One optimizer step on a loss: the module docstring's guard, schedule and step.

    Args:
        grad_norm_clipping: global norm bound of each step's gradient (0: none).
        max_nonfinite_updates: consecutive skipped steps that stop the run.
        lr_schedule, total_steps: each optimizer group's rate is its base rate times
            `beast.train_step.optim.lr_multiplier(lr_schedule, progress.step, total_steps)`.
        progress: the run's counters (read for the schedule; skipped steps counted).
        reduce_gradients: several learners (beast/poly): called on every step, finite or
            not (it is a collective), with this learner's finiteness; it combines the
            gradients across learners in place, clips them, and returns whether the step
            is finite on all of them, so that every learner takes the same step or skip.
    """

    def __init__(
        self,
        *,
        grad_norm_clipping: float,
        max_nonfinite_updates: int,
        lr_schedule: str,
        total_steps: int,
        progress: TrainingProgress,
        reduce_gradients: GradientReduction | None = None,
    ) -> None:
        self.grad_norm_clipping = grad_norm_clipping
        self.max_nonfinite_updates = max_nonfinite_updates
        self.lr_schedule = lr_schedule
        self.total_steps = total_steps
        self.progress = progress
        self.reduce_gradients = reduce_gradients
        self.clock: PhaseClock | None = None  # the calling learner thread's (--profile)
        self.steps_applied = 0
        self.grad_norm = float("nan")  # of the last step's gradient, before clipping
        self.learning_rate = float("nan")  # of the last step applied (first group)
        self._consecutive_nonfinite = 0
        self._stepped: dict[int, list[torch.Tensor]] = {}  # each optimizer's, since a check

    def check_weights(self) -> None:
        """NonFiniteError when a step since the last call made the weights non-finite.

        Called once per update (`Learner.step`), not per optimizer step: finite
        gradients (checked per step) make finite steps but for a runaway learning rate,
        and one foreach norm per update is cheap where a check per tensor per step cost
        PPO's many small steps about 7% of the update."""
        stepped, self._stepped = self._stepped, {}
        for params in stepped.values():
            if not bool(torch.isfinite(nn.utils.get_total_norm(params))):
                raise NonFiniteError(_NON_FINITE_WEIGHTS)

    def _mark(self, phase: str) -> None:
        if self.clock is not None:
            self.clock.mark(phase)

    def __call__(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        parameters: Iterable[torch.Tensor],
    ) -> bool:
        """Backward `loss` and step `optimizer` over `parameters` (the ones it optimizes);
        True when the step was taken, False when it was skipped as non-finite.

        Several optimizers (an actor's, a critic's, a temperature's: beast/algos/qpg) share
        one backward pass of the sum of their losses, one clipping norm and one finiteness
        verdict, and each steps the parameters it holds that received a gradient."""
        self._mark("forward")  # what the algorithm did since: forward pass and loss
        optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else optimizer
        params = [p for p in parameters if p.requires_grad]
        for each in optimizers:
            each.zero_grad(set_to_none=True)
        loss.backward()
        # clip_grad_norm_ with an infinite bound just measures the norm.
        max_norm = self.grad_norm_clipping if self.grad_norm_clipping > 0 else float("inf")
        grad_norm = nn.utils.clip_grad_norm_(params, max_norm)
        self._mark("backward")
        finite = bool(torch.isfinite(loss.detach())) and bool(torch.isfinite(grad_norm))
        if self.reduce_gradients is not None:
            finite = self.reduce_gradients(params, finite)
        self.grad_norm = float(grad_norm)
        if not finite:
            for each in optimizers:
                each.zero_grad(set_to_none=True)
            self._skipped(loss, grad_norm)
            return False
        self._consecutive_nonfinite = 0
        multiplier = self.lr_multiplier()
        for each in optimizers:
            for group in each.param_groups:
                group["lr"] = group[INITIAL_LR] * multiplier
            each.step()
        self._applied(optimizers, params)
        self._mark("optimizer")
        return True

    def lr_multiplier(self) -> float:
        """The schedule's factor now (`beast.train_step.optim.lr_multiplier` at the run's step)."""
        return lr_multiplier(self.lr_schedule, self.progress.step, self.total_steps)

    def _applied(self, optimizers: Sequence[torch.optim.Optimizer], params: list) -> None:
        self.learning_rate = optimizers[0].param_groups[0]["lr"]
        self._stepped[id(optimizers[0])] = params
        self.steps_applied += 1

    def _skipped(self, loss: torch.Tensor | float, grad_norm: torch.Tensor | float) -> None:
        """Count a non-finite step; NonFiniteError after max_nonfinite_updates in a row."""
        self.progress.skipped_updates += 1
        self._consecutive_nonfinite += 1
        if self._consecutive_nonfinite >= self.max_nonfinite_updates:
            loss = loss.detach() if isinstance(loss, torch.Tensor) else loss
            raise NonFiniteError(
                f"{self._consecutive_nonfinite} consecutive updates had a non-finite loss or"
                f" gradient (loss {float(loss)}, gradient norm {float(grad_norm)});"
                " lower --learning_rate, check the env's rewards and observations, or raise"
                " --max_nonfinite_updates"
            )

    def record(
        self,
        *,
        finite: bool,
        weights_finite: bool,
        loss: torch.Tensor | float,
        grad_norm: torch.Tensor | float,
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> bool:
        """Account for a step taken elsewhere (beast/train_step's compiled step, which
        clipped, guarded, stepped and checked the new weights on the device, with this
        stepper's settings and schedule): the counters, the guard's verdict and the log's
        figures, as `__call__` and `check_weights` keep them. Returns `finite` (whether
        the step was applied)."""
        self.grad_norm = float(grad_norm)
        if not finite:
            self._skipped(loss, grad_norm)
            return False
        if not weights_finite:
            raise NonFiniteError(_NON_FINITE_WEIGHTS)
        self._consecutive_nonfinite = 0
        self.learning_rate = optimizers[0].param_groups[0]["lr"]
        self.steps_applied += 1
        self._mark("optimizer")
        return True


class Learner(ThreadGroup):
    """Learner threads over `source`, updating with `update` (module docstring).

    Args:
        update: the algorithm's learning state (beast/algos/base.py `Update`).
        source: where batches come from (module docstring).
        stepper: the `Stepper` the update's optimizer steps go through.
        progress: the run's counters; `step` counts agent steps (the batches' fresh
            steps, or the replay actors' env steps) and decides when `total_steps` is
            reached.
        publish: copies the learned weights to the actors (called after each update
            that stepped an optimizer).
        on_update: receives each update's `UpdateStats` (the run log), outside the lock.
        observers: called with each batch's data after its update, before the weights
            are published (running statistics: beast/algos/normalize.py).
        thread_tuner: measures and sets the torch thread count as the run goes; None
            keeps the count set at start-up.
        updates_ready: whether the update has settled on its path (compiled or not), from
            when the tuner may measure.
        stopping: set by `stop` before the threads are joined: the update's
            `LearnerContext.stopping`, so that a step waiting for a compilation gives up.
    """

    def __init__(
        self,
        *,
        update: Update,
        source: Source,
        stepper: Stepper,
        progress: TrainingProgress,
        total_steps: int,
        num_learner_threads: int,
        publish: Callable[[], None],
        on_update: Callable[[UpdateStats], None],
        observers: Sequence[Callable[[Mapping[str, torch.Tensor]], None]] = (),
        thread_tuner: ThreadTuner | None = None,
        updates_ready: Callable[[], bool] = lambda: True,
        stopping: threading.Event | None = None,
    ) -> None:
        self.finished = threading.Event()  # total_steps reached, or a thread failed
        self.stopping = stopping if stopping is not None else threading.Event()
        super().__init__(on_error=self.finished)
        self.update = update
        self.source = source
        self.stepper = stepper
        self.progress = progress
        self.total_steps = total_steps
        self.publish = publish
        self.on_update = on_update
        self.observers = tuple(observers)
        self.thread_tuner = thread_tuner
        self.updates_ready = updates_ready
        # Guards the model, the algorithm's state, progress and the published weights:
        # everything an update or a checkpoint touches.
        self.lock = threading.Lock()
        # What each phase_seconds column holds (beast/util/profile.py, --profile): wait_batch
        # (waiting for a batch, and for the lock), forward (the algorithm's forward pass
        # and loss), backward (with clipping), optimizer, publish.
        self.phase_seconds = torch.zeros(
            (num_learner_threads, len(LEARNER_PHASES)), dtype=torch.float64
        )
        for i in range(num_learner_threads):
            self._add_thread(functools.partial(self._learn_loop, i), f"learner-{i}")

    def start(self) -> None:
        self.source.start()
        super().start()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        super().stop(timeout)
        self.source.stop(timeout)

    def _learn_loop(self, thread_index: int) -> None:
        clock = PhaseClock(self.phase_seconds[thread_index], LEARNER_PHASES)
        progress = self.progress
        while not self._stop.is_set():
            if self.source.failed.is_set():
                raise self.source.error
            batch = self.source.next(_POLL_SECONDS)
            with self.lock:
                if batch is None:
                    # No batch yet (a replay still filling): keep the step count moving,
                    # and stop if the actors alone reach total_steps.
                    progress.step += self.source.pending_steps()
                    if progress.step >= self.total_steps:
                        self.finished.set()
                        return
                    clock.restart()
                    continue
                clock.mark("wait_batch")
                if progress.step >= self.total_steps:
                    self.finished.set()
                    return
                try:
                    stats = self.step(batch, clock)
                except StepAbandoned:  # stopping while a compilation ran: not trained on
                    return
                if progress.step >= self.total_steps:
                    self.finished.set()
            self.on_update(stats)

    def step(self, batch: Batch, clock: PhaseClock | None = None) -> UpdateStats:
        """One update on `batch`, with everything around it; the caller holds the lock
        (or is the only thread: --serial)."""
        stepper, progress, source = self.stepper, self.progress, self.source
        stepper.clock = clock
        applied = stepper.steps_applied
        # A replay's block of batches: one update each, in one call where the update
        # takes blocks (one optimizer step each), else one call each.
        infos = self.update.block(batch) if batch.parts > 1 else None
        if infos is not None:
            stepper.check_weights()
            progress.num_updates += stepper.steps_applied - applied
        else:
            infos = []
            for part in batch.split():
                before = stepper.steps_applied
                infos.append(self.update(part))
                stepper.check_weights()
                progress.num_updates += stepper.steps_applied > before
        for observe in self.observers:
            observe(batch.data)
        source.feedback(batch, _block_priorities([info.priorities for info in infos]))
        if stepper.steps_applied > applied:
            self.publish()
            if clock is not None:
                clock.mark("publish")
        source.release(batch)
        # The batch's steps count as consumed even when its update was skipped.
        progress.step += batch.new_steps + source.pending_steps()
        returns, lengths = source.pending_episodes()
        losses = _mean_stats([info.stats for info in infos])
        losses["grad_norm"] = stepper.grad_norm
        losses["learning_rate"] = stepper.learning_rate
        losses["skipped_updates"] = progress.skipped_updates
        losses.update(source.stats())
        losses.update(batch.stats)
        if self.thread_tuner is not None:
            self.thread_tuner.after_update(progress.step, self.updates_ready())
        return UpdateStats(
            step=progress.step,
            num_updates=progress.num_updates,
            losses=losses,
            episode_returns=[*batch.episode_returns, *returns],
            episode_steps=[*batch.episode_steps, *lengths],
        )


def _block_priorities(priorities: list[torch.Tensor | None]) -> torch.Tensor | None:
    """A block's new priorities, its batches' in order; None when a batch has none (its
    update was skipped: the block's priorities stay as they were)."""
    if any(p is None for p in priorities):
        return None
    return priorities[0] if len(priorities) == 1 else torch.cat(priorities)  # type: ignore[arg-type]


def _mean_stats(stats: list[Mapping[str, Any]]) -> dict[str, float]:
    """Each logged scalar averaged over a block's updates (one update: as it is). The
    tensors among them are read in one stack: a DQN block's 4 updates of 6 scalars were
    24 reads, one at a time (1.5% of its learner thread's time in a run, py-spy)."""
    tensors = [
        value for each in stats for value in each.values() if isinstance(value, torch.Tensor)
    ]
    read = iter(torch.stack([t.reshape(()) for t in tensors]).tolist() if tensors else ())
    floats = [
        {
            key: next(read) if isinstance(value, torch.Tensor) else float(value)
            for key, value in each.items()
        }
        for each in stats
    ]
    if len(floats) == 1:
        return floats[0]
    keys = dict.fromkeys(key for each in floats for key in each)
    return {
        key: sum(each[key] for each in floats if key in each)
        / sum(1 for each in floats if key in each)
        for key in keys
    }
