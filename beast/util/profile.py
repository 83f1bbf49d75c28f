"""Where a run's time goes: per-phase seconds of actors and learner (--profile).

Actors and the learner add the seconds each phase takes to rows of float64
counters; actors' rows live in shared memory (one row per actor, kept across
restarts) so the learner process can read them at any time. The clocks
always run: a `perf_counter` call and a numpy add per phase cost well under
a microsecond, against milliseconds per actor step. `--profile` decides only
whether the breakdown is printed, every `--log_interval` seconds and at the
end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from beast.fields import shared_zeros

__all__ = [
    "ACTOR_PHASES",
    "LEARNER_PHASES",
    "PhaseClock",
    "format_profile",
    "shared_counters",
]

# An actor's loop: wait for free rollout slots, get K actions (a local forward pass, or
# a round trip to the inference server), step the K envs, write the step into the slots.
ACTOR_PHASES = ("wait_slots", "inference", "env_step", "slot_write")
# A learner thread's loop: wait for a prepared batch, forward + loss, backward (with
# gradient clipping), optimizer step, publish weights to the actors' model.
LEARNER_PHASES = ("wait_batch", "forward", "backward", "optimizer", "publish")


def shared_counters(rows: int, phases: Sequence[str]) -> torch.Tensor:
    """Zeroed float64 [rows, len(phases)] seconds in shared memory."""
    return shared_zeros((rows, len(phases)), torch.float64)


class PhaseClock:
    """Adds the time since the previous mark to a phase's counter.

        clock = PhaseClock(counters_row, ACTOR_PHASES)
        ...wait...;   clock.mark("wait_slots")
        ...forward...; clock.mark("inference")

    `counters_row` is a float64 tensor [len(phases)] (a row of `shared_counters`);
    the clock writes through a numpy view of it, which costs nanoseconds, not the
    microseconds of a torch element update.
    """

    def __init__(self, counters_row: torch.Tensor, phases: Sequence[str]) -> None:
        self._seconds = counters_row.numpy()
        self._index = {phase: i for i, phase in enumerate(phases)}
        self._last = time.perf_counter()

    def restart(self) -> None:
        """Start the next interval now (time since the last mark counts nowhere)."""
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self._seconds[self._index[phase]] += now - self._last
        self._last = now


def format_profile(
    actor_seconds: torch.Tensor | np.ndarray,
    learner_seconds: torch.Tensor | np.ndarray,
    *,
    num_updates: int,
    steps: int,
) -> list[str]:
    """Lines of the breakdown: each phase's share of its side's measured time.

    actor_seconds: [num_actors, len(ACTOR_PHASES)]; learner_seconds:
    [num_learner_threads, len(LEARNER_PHASES)]. Learner phases are also given
    in milliseconds per update.
    """
    actor = np.asarray(actor_seconds, dtype=np.float64).sum(axis=0)
    learner = np.asarray(learner_seconds, dtype=np.float64).sum(axis=0)
    lines = []
    total = actor.sum()
    if total > 0:
        parts = ", ".join(
            f"{phase} {100 * s / total:.0f}%" for phase, s in zip(ACTOR_PHASES, actor, strict=True)
        )
        per_step = 1e3 * total / steps if steps else float("nan")
        lines.append(f"actors ({total:,.0f} s, {per_step:.3f} actor-ms per agent step): {parts}")
    total = learner.sum()
    if total > 0 and num_updates:
        parts = ", ".join(
            f"{phase} {100 * s / total:.0f}% ({1e3 * s / num_updates:.0f} ms)"
            for phase, s in zip(LEARNER_PHASES, learner, strict=True)
        )
        lines.append(f"learner ({total:,.0f} s, per update): {parts}")
    return lines
