"""The R2D2 / Ape-X learner: sample sequences, n-step double-Q update, new priorities.

Actors (beast/sequence_actor.py) write sequences straight into the shared
prioritized replay; this learner only samples. Each learner thread draws
its batch by priority and moves it to the learning device itself, outside
the update lock, so with several threads one samples while another
updates. (A sampler thread per learner thread, as beast/learner.py has
batch threads, measured slower on 2 cores: both threads make many small
torch calls and hand the GIL back and forth; the Ape-X CartPole update ran
161-172 updates/s that way against 173-203 inline, and in full runs the
learner waited for batches about 40% of its time.) The updates are serialised
by one lock as in beast/learner.py (the parameters are updated in place);
one update per batch:

    1. burn-in: the online network unrolls the first `burn_in` rows from the
       sequence's stored LSTM state without gradient, then the rest with it
       (R2D2 section 3); the target network unrolls all rows from the same
       state, without gradient;
    2. the loss (`loss_fn`, R2D2's n-step double-Q loss with value rescaling,
       each sequence weighted by its importance weight);
    3. backward, gradient clipping, an Adam step (all skipped when the loss or
       gradient is not finite);
    4. the sequences' new priorities (max/mean mix of |TD|) into the replay;
    5. the weights published into the actors' shared CPU model, and every
       `target_update_period` updates copied into the target network.

The learner does not know R2D2 from Ape-X: the loss and the burn-in decide
(Ape-X: feed-forward network, burn_in 0, transitions of n_step + 1 rows).

Progress: `progress.step` is env steps taken by the actors (counted on
their side, in the sink), not steps trained on; it is what `total_steps`
and SPS mean. Until the replay holds `min_replay_size` sequences the
learner only watches that count. Episode returns reach the run log through
the sink's per-actor rings, drained at each update.

It exposes what beast/runner.py uses of `beast.learner.Learner` (start,
stop, finished, error, lock, progress, phase_seconds, publish_weights,
on_update), so the monitor, logs and checkpoints work unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from beast.algos.r2d2 import R2D2LossOutput, unroll_with_burn_in
from beast.buffers import core_state_key
from beast.learner import (
    LearnerThreads,
    NonFiniteError,
    TrainingProgress,
    UpdateStats,
    copy_weights,
)
from beast.profile import LEARNER_PHASES, PhaseClock
from beast.replay import ReplaySample
from beast.sequence_actor import SequenceSink

__all__ = ["QLossFn", "ReplayLearner"]

# How often blocked threads look at the stop flag (and, while the replay fills up,
# at the actors' step count).
_POLL_SECONDS = 0.2
# The model's inputs among a sequence's fields.
_INPUT_KEYS = ("obs", "reward", "done", "last_action")

# loss_fn(online_q [L, B, A], target_q [L, B, A], batch, weights [B]) -> R2D2LossOutput:
# r2d2_loss with its constants bound.
QLossFn = Callable[[Tensor, Tensor, Mapping[str, Tensor], Tensor], R2D2LossOutput]


class ReplayLearner(LearnerThreads):
    """Learner threads over a prioritized sequence replay (module docstring).

    Args:
        model: the online Q-network, on `device`.
        target_model: the target network, same architecture, on `device`.
        actor_model: the actors' shared-memory CPU copy, overwritten after
            every update.
        sink: the replay and the actors' counters (beast/sequence_actor.py).
        optimizer: over `model`'s parameters.
        loss_fn: see `QLossFn`; its burn_in must equal `burn_in`.
        burn_in: rows the online network unrolls without gradient.
        learning_rate, lr_schedule: the rate, constant or decayed linearly to
            0 at `total_steps` env steps (set on the optimizer each update).
        target_update_period: updates between target-network copies.
        min_replay_size: sequences in the replay before sampling starts.
        clip_rewards: clip rewards to [-1, 1] for the targets (--reward_clipping).
        seed: seeds the learner threads' sampling generators.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        target_model: nn.Module,
        actor_model: nn.Module,
        sink: SequenceSink,
        optimizer: torch.optim.Optimizer,
        loss_fn: QLossFn,
        device: torch.device,
        batch_size: int,
        burn_in: int,
        total_steps: int,
        learning_rate: float,
        lr_schedule: str,
        grad_norm_clipping: float,
        target_update_period: int,
        min_replay_size: int,
        num_learner_threads: int,
        max_nonfinite_updates: int,
        on_update: Callable[[UpdateStats], None],
        progress: TrainingProgress | None = None,
        precision: str = "fp32",
        clip_rewards: bool = False,
        seed: int = 0,
    ) -> None:
        if lr_schedule not in ("linear", "constant"):
            raise ValueError(f"lr_schedule must be linear or constant, got {lr_schedule!r}")
        super().__init__(num_learner_threads)
        self.model = model
        self.target_model = target_model.requires_grad_(False)
        self.actor_model = actor_model
        self.sink = sink
        self.replay = sink.replay
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device
        self.batch_size = batch_size
        self.burn_in = burn_in
        self.total_steps = total_steps
        self.learning_rate = learning_rate
        self.lr_schedule = lr_schedule
        self.grad_norm_clipping = grad_norm_clipping
        self.target_update_period = target_update_period
        self.min_replay_size = min_replay_size
        self.max_nonfinite_updates = max_nonfinite_updates
        self.bf16 = precision == "bf16"
        self.clip_rewards = clip_rewards
        self.seed = seed
        self.on_update = on_update
        self.progress = progress or TrainingProgress()
        # A resumed run goes on from its checkpoint's step; the actors count from 0.
        self._step_base = self.progress.step
        self._num_core_state = sum(key.startswith("core_state_") for key in self.replay.spec)
        self._consecutive_nonfinite = 0
        # Per actor: episodes already reported (the reader's cursor into the sink's rings).
        self._episode_cursor = np.zeros(sink.num_actors, dtype=np.int64)
        self._dropped_episodes = 0
        # Guards the model, target model, optimizer, progress, the published actor
        # weights, the priority updates and the episode cursor: everything an update or
        # a checkpoint touches.
        self.lock = threading.Lock()
        # What each phase_seconds column holds here (beast/profile.py, --profile):
        # wait_batch (sampling, and waiting for the lock), forward (burn-in, unroll,
        # target, loss), backward, optimizer (with the priority update), publish (with
        # the target update).
        self._add_learner_threads(self._learn_loop)

    def _sample(self, generator: torch.Generator) -> ReplaySample | None:
        """A batch on the learning device; None while the replay is still filling up."""
        if len(self.replay) < self.min_replay_size or self.replay.tree.total() <= 0:
            return None
        try:
            sample = self.replay.sample(self.batch_size, generator)
        except ValueError:
            # Every stored slot can be mid-overwrite (priority 0) for a moment.
            if self.replay.tree.total() <= 0:
                return None
            raise
        if self.device.type == "cpu":
            return sample
        pin = self.device.type == "cuda"
        batch = {
            key: (value.pin_memory() if pin else value).to(self.device, non_blocking=pin)
            for key, value in sample.batch.items()
        }
        return sample._replace(
            batch=batch, weights=sample.weights.to(self.device, non_blocking=pin)
        )

    def _learn_loop(self, thread_index: int) -> None:
        clock = PhaseClock(self.phase_seconds[thread_index], LEARNER_PHASES)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + thread_index)
        while not self._stop.is_set():
            sample = self._sample(generator)
            if sample is None:
                # Still filling the replay: keep the step count moving, and stop if the
                # actors alone reach total_steps.
                with self.lock:
                    self._count_env_steps()
                    if self.progress.step >= self.total_steps:
                        self.finished.set()
                        return
                self._stop.wait(_POLL_SECONDS)
                clock.restart()
                continue
            with self.lock:
                clock.mark("wait_batch")
                self._count_env_steps()
                if self.progress.step >= self.total_steps:
                    self.finished.set()
                    return
                stats = self._update(sample, clock)
                if self.progress.step >= self.total_steps:
                    self.finished.set()
            self.on_update(stats)

    def _count_env_steps(self) -> None:
        self.progress.step = self._step_base + self.sink.total_env_steps()

    def _learning_rate(self) -> float:
        if self.lr_schedule == "constant":
            return self.learning_rate
        return self.learning_rate * (
            1.0 - min(self.progress.step, self.total_steps) / self.total_steps
        )

    def _update(self, sample: ReplaySample, clock: PhaseClock | None = None) -> UpdateStats:
        """One update on one sampled batch; the caller holds the lock."""
        batch = sample.batch
        inputs = {key: batch[key] for key in _INPUT_KEYS}
        core_state = tuple(batch[core_state_key(i)] for i in range(self._num_core_state))
        self.model.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            online_q, _ = unroll_with_burn_in(self.model, inputs, core_state, self.burn_in)
            with torch.no_grad():
                target_output, _ = self.target_model(inputs, core_state)
        reward = batch["reward"].clamp(-1.0, 1.0) if self.clip_rewards else batch["reward"]
        loss = self.loss_fn(
            online_q.float(),
            target_output.q_values.float(),
            {**batch, "reward": reward},
            sample.weights,
        )
        if clock is not None:
            clock.mark("forward")
        self.optimizer.zero_grad(set_to_none=True)
        loss.total_loss.backward()
        # clip_grad_norm_ with an infinite bound just measures the norm.
        max_norm = self.grad_norm_clipping if self.grad_norm_clipping > 0 else float("inf")
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if clock is not None:
            clock.mark("backward")
        finite = bool(torch.isfinite(loss.total_loss.detach())) and bool(torch.isfinite(grad_norm))
        if finite:
            self._consecutive_nonfinite = 0
            for group in self.optimizer.param_groups:
                group["lr"] = self._learning_rate()
            self.optimizer.step()
            if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
                raise NonFiniteError(
                    "an optimizer step made the weights non-finite; lower --learning_rate"
                    " (the last checkpoint is kept as it is)"
                )
            self.replay.update_priorities(sample.indices, loss.priorities, sample.generations)
            if clock is not None:
                clock.mark("optimizer")
            self.publish_weights()
            self.progress.num_updates += 1
            if self.progress.num_updates % self.target_update_period == 0:
                copy_weights(self.target_model, self.model)
            if clock is not None:
                clock.mark("publish")
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
        # Sampled sequences count for the actors' rate limit even when the update
        # was skipped: they were consumed.
        self.sink.sampled[0] += self.batch_size
        self._count_env_steps()
        returns, lengths, dropped = self.sink.new_episodes(self._episode_cursor)
        self._dropped_episodes += dropped
        losses = {
            ("total_loss" if key == "loss" else key): float(value)
            for key, value in loss.stats.items()
        }
        losses["grad_norm"] = float(grad_norm)
        losses["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        losses["skipped_updates"] = self.progress.skipped_updates
        losses["replay_fill"] = len(self.replay) / self.replay.capacity
        losses["inserted_sequences"] = self.sink.total_inserted()
        losses["sampled_sequences"] = int(self.sink.sampled[0])
        losses["dropped_episodes"] = self._dropped_episodes
        return UpdateStats(
            step=self.progress.step,
            num_updates=self.progress.num_updates,
            losses=losses,
            episode_returns=returns,
            episode_steps=lengths,
        )

    def filling_line(self) -> str | None:
        """Progress while the replay fills up before the first update (the run log's line
        needs updates); None once learning has started."""
        if self.progress.num_updates or len(self.replay) >= self.min_replay_size:
            return None
        return (
            f"filling the replay: {len(self.replay):,} of {self.min_replay_size:,} sequences"
            f" before learning starts, {self._step_base + self.sink.total_env_steps():,} env"
            " steps"
        )

    def publish_weights(self) -> None:
        """Copy the learner's weights into the actors' shared-memory model, in place."""
        copy_weights(self.actor_model, self.model)
