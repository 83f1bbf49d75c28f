"""Rollout writers (beast/experience/rollout_slots.py has the slot protocol): a
`RolloutWriter` cuts n envs' steps into rollouts of T+1 steps and hands them to its
destinations: an actor's slots in shared memory (`rollout_slots._Slots`), or, for
polybeast, rollouts staged outside shared memory (`RolloutStaging`) that the learner
commits whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from beast.fields import Field, core_state_key, is_core_state, numpy_dtype
from beast.native.acting import StepCopies
from beast.util.profile import PhaseClock

__all__ = [
    "RolloutDestinations",
    "RolloutStaging",
    "RolloutStagingRecipe",
    "RolloutWriter",
    "step_keys",
]


def step_keys(spec: Mapping[str, Field]) -> list[str]:
    """The spec's per-step fields (those a writer copies every step)."""
    return [key for key in spec if not is_core_state(key)]


class RolloutWriter:
    """Writes a group of n envs' steps as rollouts of T+1 steps into n destinations.

    `sources` maps every per-step field of the spec but `rollout_id` to an array `[n, ...]`
    at a fixed address (the env batch's arrays, the actor's last actions, the policy's
    record), updated in place between writes. Each `write(state)` copies the current step
    (one native call per step: `beast.native.acting.StepCopies`). The first write takes n
    destinations (`RolloutDestinations.take`), stores `state` (the recurrent state,
    `[n, d0, ...]` per tensor, that produced this step's policy output) as the rollout's
    start and writes step 0. The write of step T publishes the rollout and keeps a copy of
    that step and its state: the next rollout's step 0. Its destinations are taken at the
    next write, not at the publish, so a writer waiting for slots never holds back a
    rollout that another writer of the same process has yet to publish (an actor's lanes
    step in turn; with synchronous rollouts each lane's slots come back only after the
    update that reads every lane's rollout).

    Rollout ids: `first_id + arange(n)`, advanced by `id_stride` per rollout; writers of
    one process must use disjoint residues (an actor's lanes: first ids 0, n, 2n, ...,
    stride K), and processes disjoint high bits.
    """

    def __init__(
        self,
        destinations: RolloutDestinations,
        sources: Mapping[str, np.ndarray],
        *,
        first_id: int,
        id_stride: int,
        clock: PhaseClock | None = None,
    ) -> None:
        n = destinations.num_envs
        self.destinations = destinations
        self.unroll_length = destinations.unroll_length
        self.rollout_ids = np.arange(n, dtype=np.int64) + first_id
        self.id_stride = id_stride
        self.clock = clock
        missing = [key for key in destinations.step_keys if key not in sources]
        missing.remove("rollout_id")
        if missing:
            raise ValueError(f"no source for the rollout fields {missing}")
        sources = {**sources, "rollout_id": self.rollout_ids}
        # Env i's [1, ...] row of each source, made once: rollouts only change the slots.
        self._source_rows = {
            key: [sources[key][i : i + 1] for i in range(n)] for key in destinations.step_keys
        }
        self._copies: StepCopies | None = None
        self.t = 0  # the step written last
        # Step T of the rollout published last, and its state: the next one's step 0.
        self._kept_step: dict[str, list[np.ndarray]] | None = None
        self._kept_state: list[torch.Tensor] = []

    def _mark(self, phase: str) -> None:
        if self.clock is not None:
            self.clock.mark(phase)

    def _open(self, state: Sequence[torch.Tensor]) -> bool:
        """Take destinations and write step 0: the current step, or the kept one."""
        rows = self.destinations.take()
        if rows is None:
            return False
        self._mark("wait_slots")
        # Step t of env i goes to row t of destination i: one native call per step.
        self._copies = StepCopies(
            [
                (row[key], source_rows[i])
                for key, source_rows in self._source_rows.items()
                for i, row in enumerate(rows)
            ]
        )
        kept = self._kept_step
        if kept is None:
            self.destinations.write_state(state)
            self._copies.run(0)
        else:
            self.destinations.write_state(self._kept_state)
            for key, kept_rows in kept.items():
                for i, row in enumerate(rows):
                    row[key][0] = kept_rows[i][0]
            for i, row in enumerate(rows):  # the new rollout's ids, not the kept step's
                row["rollout_id"][0] = self.rollout_ids[i]
            self._kept_step = None
        self.t = 0
        return True

    def write(self, state: Sequence[torch.Tensor]) -> bool:
        """Write the current step; False when the run is shutting down."""
        if self._copies is None:  # the first step of all: step 0 of the first rollout
            opened = self._open(state)
            self._mark("slot_write")
            return opened
        if self._kept_step is not None and not self._open(state):
            return False
        self.t += 1
        self._copies.run(self.t)
        if self.t == self.unroll_length:
            if not self.destinations.publish():
                return False
            self.rollout_ids += self.id_stride
            self._kept_step = {
                key: [row.copy() for row in source_rows]
                for key, source_rows in self._source_rows.items()
                if key != "rollout_id"
            }
            self._kept_state = [tensor.clone() for tensor in state]
        self._mark("slot_write")
        return True


class RolloutDestinations:
    """Where a `RolloutWriter` puts its n rollouts: slots in shared memory, or staging."""

    num_envs: int
    unroll_length: int
    step_keys: list[str]

    def take(self) -> list[dict[str, np.ndarray]] | None:
        """n destinations, each field's [T+1, ...] array per env; None: shutting down."""
        raise NotImplementedError

    def write_state(self, state: Sequence[torch.Tensor]) -> None:
        raise NotImplementedError

    def publish(self) -> bool:
        """Hand the written rollouts on; False: shutting down."""
        raise NotImplementedError


@dataclass(frozen=True)
class RolloutStagingRecipe:
    """How to build rollouts for a learner's slots outside its process (polybeast)."""

    spec: dict[str, Field]

    def writer(
        self,
        sources: Mapping[str, np.ndarray],
        *,
        publish_every: int,
        first_id: int,
        id_stride: int,
    ) -> tuple[RolloutWriter, RolloutStaging]:
        """A writer for the n envs of `sources` into staged rollouts, and the staging that
        hands each finished one over (`take_rollout`) for `RolloutBuffers.commit`.
        (`publish_every`: a rollout is ready every T writes by itself.)"""
        staging = RolloutStaging(self.spec, len(sources["reward"]))
        writer = RolloutWriter(staging, sources, first_id=first_id, id_stride=id_stride)
        return writer, staging


class RolloutStaging(RolloutDestinations):
    """Rollouts of n envs built outside shared memory, `[n, T+1, ...]` per field, for
    polybeast: an env server (or the learner's central-inference thread) writes them with
    a `RolloutWriter` and takes each finished one with `take_rollout`.

    Two buffers alternate, so that a finished rollout stays intact while the writer
    starts the next one (whose step 0 repeats the finished one's step T).
    """

    def __init__(self, spec: Mapping[str, Field], num_envs: int) -> None:
        self.num_envs = num_envs
        self.unroll_length = spec["rollout_id"].shape[0] - 1
        self.step_keys = step_keys(spec)
        self._buffers = [
            {
                key: np.zeros((num_envs, *f.shape), dtype=numpy_dtype(f.dtype))
                for key, f in spec.items()
            }
            for _ in range(2)
        ]
        self._current = 0
        self._finished: dict[str, np.ndarray] | None = None

    def take(self) -> list[dict[str, np.ndarray]]:
        arrays = self._buffers[self._current]
        return [{key: arrays[key][i] for key in self.step_keys} for i in range(self.num_envs)]

    def write_state(self, state: Sequence[torch.Tensor]) -> None:
        arrays = self._buffers[self._current]
        for i, tensor in enumerate(state):
            arrays[core_state_key(i)][...] = tensor.numpy()

    def publish(self) -> bool:
        self._finished = self._buffers[self._current]
        self._current = 1 - self._current
        return True

    def take_rollout(self) -> dict[str, np.ndarray] | None:
        """The rollout finished since the last call, or None; valid until the next one
        finishes."""
        finished, self._finished = self._finished, None
        return finished
