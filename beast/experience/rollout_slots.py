"""Rollout slots in shared memory: the layout, the free/full protocol and the writers that
fill them (the learner's side is beast/experience/rollout_source.py).

The layout is declared once as a spec (field -> per-slot shape, dtype). Each field is ONE
contiguous shared-memory block shaped `[num_buffers, T+1, ...]` (core-state fields:
`[num_buffers, ...]`), never one tensor per slot: thousands of small shared tensors
exhaust file descriptors. The fields are the step record (`env_step_spec`): what the env
batch reports for a step, plus what the algorithm's policy stores with it
(beast/algos/base.py `ActingRule.record_spec`: the action, and e.g. IMPALA's logits), plus
the rollout's id and the recurrent state at its start. No field is named here but the
env's and the protocol's own.

Protocol: every slot index is in exactly one place at a time, the free queue, an actor, the full
queue, or the learner's batch gatherer. An actor's `RolloutWriter` takes a free index, which marks
the actor's process as its holder in `slot_owner`, writes a whole rollout and puts the index on the
full queue, which clears the mark; the learner's `RolloutSource`
(beast/experience/rollout_source.py) takes full slots (clearing any mark left), copies a batch out
and puts the indices back on the free queue. Only indices cross processes. Each move and its mark
are one critical section of the native queue (beast/native/index_queue.h, "Owner marks"), so an
actor killed at any instant leaves each slot it touched queued or marked as its own. Once the
supervisor has seen the actor's process dead, `reclaim` puts its marked slots that are on no queue
back on the free queue: no slot is lost or doubled, whatever dies and whenever. The mark names the
process, not only the actor index (`owner_id`): a replacement's slots are never reclaimed for its
predecessor.

Every step of a rollout carries the rollout's id (`rollout_id`); a slot whose steps
disagree is torn (written by two rollouts) and is never used.

Alignment (index t of a slot): `obs` (each observation leaf's field, for a Dict or
Tuple) is the observation at step t; `reward` was received
on arriving there; `done` says obs starts an episode, `terminated` that the transition
into it ended one in a terminal state, `truncated` that obs is a time-limited episode's
final observation (beast/envs/batch.py); `last_action` is the action taken before it;
the policy's record (`action`, ...) was computed FROM that observation. Step 0 repeats
step T of the previous rollout so the learner can bootstrap and, with `done`, reset
recurrent state.

polybeast builds rollouts outside shared memory (an env server, or its central
inference thread) with the same writer over `RolloutStaging`, and `commit`s whole ones
into the slots.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from beast.experience.rollout_writer import (
    RolloutDestinations,
    RolloutStagingRecipe,
    RolloutWriter,
    step_keys,
)
from beast.fields import (
    Field,
    core_state_key,
    is_core_state,
    shared_zeros,
)
from beast.native import NO_OWNER, IndexQueue, QueueClosed, SlotOwners
from beast.util.profile import PhaseClock
from beast.util.threads import process_alive

__all__ = [
    "ENV_STEP_KEYS",
    "RolloutBuffers",
    "SlotCensus",
    "check_rollout",
    "commit",
    "env_step_spec",
    "owner_id",
    "rollout_spec",
    "time_major_spec",
]

# What an env batch reports per step (beast/envs/batch.py) besides its observation's
# leaves ("obs" for a Box, beast/fields.py), with the actor's last action.
ENV_STEP_KEYS = (
    "reward",
    "done",
    "terminated",
    "truncated",
    "last_action",
    "episode_end",
    "episode_return",
    "episode_step",
)
# How often a writer blocked on the free queue checks that the learner still exists.
_PARENT_CHECK_SECONDS = 1.0
# How often a blocked learner-side thread looks at its stop flag.
_POLL_SECONDS = 0.2


def owner_id(actor_index: int, incarnation: int) -> int:
    """The mark an actor's process puts on the slots it holds: its index and incarnation
    (the how-manieth process under that index), so that each process has its own."""
    return incarnation << 32 | actor_index


class SlotCensus(NamedTuple):
    """Where the slots are (`RolloutBuffers.census`): counts on the free queues, on the
    full queue and held by marked owners, and the slots found nowhere or twice."""

    free: int
    full: int
    held: int
    lost: list[int]
    doubled: list[int]


def env_step_spec(obs: Mapping[str, Field], action: Field) -> dict[str, Field]:
    """Per-env fields of one step as an env batch reports it: `obs`, the observation's
    fields (`EnvSpec.obs_fields()`: one per leaf), then `ENV_STEP_KEYS`; `action` is one
    action's field (the policy's record["action"]: int64 `()`, or float32 `(d,)`)."""
    return {
        **obs,
        "reward": Field((), torch.float32),
        "done": Field((), torch.bool),
        "terminated": Field((), torch.bool),
        "truncated": Field((), torch.bool),
        "last_action": action,
        # Set on the step that ends a real episode (not a life loss), with the
        # episode's undiscounted return and length: the learner's statistics.
        "episode_end": Field((), torch.bool),
        "episode_return": Field((), torch.float32),
        "episode_step": Field((), torch.int32),
    }


def rollout_spec(
    *,
    unroll_length: int,
    obs: Mapping[str, Field],
    record: Mapping[str, Field],
    core_state_shapes: Sequence[Sequence[int]] = (),
) -> dict[str, Field]:
    """The rollout layout for one env's unroll of T+1 steps.

    `obs` is the observation's fields (`EnvSpec.obs_fields()`); `record` is the policy's
    per-step record (`ActingRule.record_spec()`); `core_state_shapes` the per-env shapes of
    the recurrent state tensors (`core_state_shapes`), so that the state at the start of
    a rollout is stored with it.
    """
    steps = unroll_length + 1
    per_step = {**env_step_spec(obs, record["action"]), **record}
    # Unique per rollout, written with every step: see is_torn().
    rollout_id = {"rollout_id": Field((steps,), torch.int64)}
    return time_major_spec(per_step, steps, rollout_id, core_state_shapes)


def time_major_spec(
    per_step: Mapping[str, Field],
    steps: int,
    own: Mapping[str, Field],
    core_state_shapes: Sequence[Sequence[int]],
) -> dict[str, Field]:
    """A layout of `steps` rows, as rollouts and replayed sequences hold them: each
    per-step field as [steps, *shape], then the layout's `own` fields, then the recurrent
    state at its first row (float32 `core_state_i` of each of `core_state_shapes`)."""
    spec = {key: Field((steps, *f.shape), f.dtype) for key, f in per_step.items()}
    spec.update(own)
    for i, shape in enumerate(core_state_shapes):
        spec[core_state_key(i)] = Field(tuple(shape), torch.float32)
    return spec


class RolloutBuffers:
    """Shared rollout slots plus their free and full index queues.

    `num_lanes` > 0 splits the slots evenly among that many writers (synchronous
    rollouts, `RolloutSource`): lane i takes its slots from, and gets them back on, its own
    free queue, so that a quick writer can never take a slow one's share and run a
    rollout ahead. Lane i owns slots i*m ... (i+1)*m - 1, m = num_buffers / num_lanes.

    Picklable: passing it to a child process (any start method) shares the
    same memory and queues.
    """

    def __init__(self, spec: Mapping[str, Field], num_buffers: int, num_lanes: int = 0) -> None:
        if num_lanes and num_buffers % num_lanes:
            raise ValueError(f"{num_buffers} slots do not split among {num_lanes} lanes")
        self.spec = dict(spec)
        self.num_buffers = num_buffers
        self.unroll_length = self.spec["rollout_id"].shape[0] - 1
        self.tensors = {
            key: shared_zeros((num_buffers, *f.shape), f.dtype) for key, f in self.spec.items()
        }
        # The process holding each slot that is on no queue (`owner_id`), or NO_OWNER.
        self.slot_owner = SlotOwners(num_buffers)
        self._lane_slots = num_buffers // max(num_lanes, 1)
        self.free_queues = [IndexQueue(self._lane_slots) for _ in range(max(num_lanes, 1))]
        self.full_queue = IndexQueue(num_buffers)
        for index in range(num_buffers):
            self.free(index)

    @property
    def free_queue(self) -> IndexQueue:
        """The free queue of unsplit slots (every writer's)."""
        if len(self.free_queues) > 1:
            raise AttributeError("these slots are split among lanes: use free_queue_of(lane)")
        return self.free_queues[0]

    def free_queue_of(self, lane: int) -> IndexQueue:
        """Where writer lane `lane` takes free slots (the one queue of unsplit slots)."""
        return self.free_queues[lane if len(self.free_queues) > 1 else 0]

    def free(self, index: int) -> None:
        """Put slot `index` back on its free queue."""
        self.free_queues[index // self._lane_slots].put(index)

    def lane_has_room(self, lane: int, num_envs: int) -> bool:
        """Whether `lane` can take `num_envs` slots now (polybeast's central feeder, which
        must not block on one server's lane while the others still step)."""
        return self.free_queue_of(lane).qsize() >= num_envs

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def take_turns(self) -> None:
        """--serial: nothing to change; the run gives its one actor enough slots that a
        write never waits for the learner (beast/run/serial.py)."""

    def describe(self) -> str:
        return f"{self.num_buffers} rollout slots ({self.nbytes() / 2**20:,.0f} MiB)"

    def writer(
        self,
        owner: int,
        sources: Mapping[str, np.ndarray],
        *,
        first_id: int,
        id_stride: int,
        learner_pid: int,
        clock: PhaseClock | None = None,
        lane: int = 0,
        incarnation: int = 0,
    ) -> RolloutWriter:
        """Actor `owner`'s writer for the n envs of `sources` (see `RolloutWriter`); `lane`:
        its lane, when the slots are split among lanes; `incarnation`: which of the actor's
        processes this is (`owner_id`)."""
        num_envs = len(sources["reward"])
        holder = owner_id(owner, incarnation)
        return RolloutWriter(
            _Slots(self, holder, num_envs, learner_pid, self.free_queue_of(lane)),
            sources,
            first_id=first_id,
            id_stride=id_stride,
            clock=clock,
        )

    def gather(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Copy slots out into a time-major batch.

        Rollout fields become `[T+1, B, ...]`; core-state fields, stored per
        slot without a batch dim, become `[d0, B, ...]` (batch at dim 1, as
        the model's state tensors have it). One copy per field.
        """
        batch = {}
        for key, tensor in self.tensors.items():
            slots = [tensor[i] for i in indices]
            batch[key] = torch.stack(slots, dim=1)
        return batch

    def is_torn(self, index: int) -> bool:
        """True when slot `index` holds steps of more than one rollout."""
        ids = self.tensors["rollout_id"][index]
        return not bool(torch.all(ids == ids[0]))

    def take_full(self, timeout: float) -> int:
        """A full slot for the learner (clearing its mark: module docstring); queue.Empty
        after `timeout` seconds, QueueClosed once closed."""
        return self.full_queue.get(timeout, owners=self.slot_owner)

    def reclaim(self, owner: int, incarnation: int = 0) -> int:
        """Return the slots that process `incarnation` of actor `owner` holds to the free
        queue; that process must be dead. Returns how many went back (a slot it had taken
        or published as it died is still queued, and stays where it is)."""
        holder = owner_id(owner, incarnation)
        return sum(
            self.free_queues[index // self._lane_slots].reclaim(
                index, holder, self.slot_owner, self.full_queue
            )
            for index in self.slot_owner.held_by(holder)
        )

    def census(self) -> SlotCensus:
        """Where every slot is: exact only while no slot moves and the learner holds none
        (after shutdown, in tests). A marked slot that is also queued (its holder died
        taking or publishing it) counts where it is queued."""
        free = [index for q in self.free_queues for index in q.contents()]
        full = self.full_queue.contents()
        queued = set(free) | set(full)
        marked = [index for index in self.slot_owner.held() if index not in queued]
        places = collections.Counter([*free, *full, *marked])
        return SlotCensus(
            free=len(free),
            full=len(full),
            held=len(marked),
            lost=[index for index in range(self.num_buffers) if index not in places],
            doubled=sorted(index for index, count in places.items() if count > 1),
        )

    def close(self) -> None:
        """Wake and stop everyone blocked on any queue (shutdown)."""
        for free_queue in self.free_queues:
            free_queue.close()
        self.full_queue.close()

    # polybeast: rollouts built outside shared memory, committed whole.

    def staging_recipe(self) -> RolloutStagingRecipe:
        """What an env server needs to build rollouts for these slots (picklable to Ray)."""
        return RolloutStagingRecipe(self.spec)

    def commit(self, rollout: Mapping[str, np.ndarray], stop: threading.Event, row: int) -> bool:
        """Copy a staged rollout into free slots (see `commit`); `row`: the env server's,
        its lane when the slots are split. ValueError when the rollout does not fit the
        slots (a server running other code)."""
        why = check_rollout(self, rollout)
        if why is not None:
            raise ValueError(f"an env server's rollout does not fit: {why}")
        return commit(self, rollout, stop, lane=row)


class _Slots(RolloutDestinations):
    """An actor's destinations: n free slots at a time, put on the full queue when written."""

    def __init__(
        self,
        buffers: RolloutBuffers,
        owner: int,
        num_envs: int,
        learner_pid: int,
        free_queue: IndexQueue,
    ):
        self.buffers, self.owner, self.learner_pid = buffers, owner, learner_pid
        self.free_queue = free_queue
        self.num_envs = num_envs
        self.unroll_length = buffers.unroll_length
        self.step_keys = step_keys(buffers.spec)
        self._fields = {key: tensor.numpy() for key, tensor in buffers.tensors.items()}
        self._state_keys = [key for key in buffers.spec if is_core_state(key)]
        self.slots: list[int] = []

    def take(self) -> list[dict[str, np.ndarray]] | None:
        buffers, slots = self.buffers, []
        while len(slots) < self.num_envs:
            try:
                index = self.free_queue.get(
                    _PARENT_CHECK_SECONDS, owners=buffers.slot_owner, owner=self.owner
                )
                slots.append(index)
            except queue.Empty:
                if not process_alive(self.learner_pid):
                    return None
            except QueueClosed:
                return None
        self.slots = slots
        return [{key: self._fields[key][slot] for key in self.step_keys} for slot in slots]

    def write_state(self, state: Sequence[torch.Tensor]) -> None:
        # Policies give the state per env, [n, d0, ...], as slots store it.
        slots = np.array(self.slots, dtype=np.int64)
        for key, tensor in zip(self._state_keys, state, strict=True):
            self._fields[key][slots] = tensor.numpy()

    def publish(self) -> bool:
        buffers = self.buffers
        for slot in self.slots:
            buffers.full_queue.put(slot, owners=buffers.slot_owner, owner=NO_OWNER)
        return process_alive(self.learner_pid)


def check_rollout(buffers: RolloutBuffers, rollout: Mapping[str, np.ndarray]) -> str | None:
    """Why `rollout` does not fit the learner's slots, or None when it does.

    A server built from other code or another env version would otherwise be
    caught only by a shape error deep in a copy.
    """
    if set(rollout) != set(buffers.tensors):
        return f"fields {sorted(rollout)} differ from the learner's {sorted(buffers.tensors)}"
    for key, tensor in buffers.tensors.items():
        if tuple(rollout[key].shape[1:]) != tuple(tensor.shape[1:]):
            return (
                f"field {key} has shape {tuple(rollout[key].shape[1:])} per env,"
                f" the learner's slots {tuple(tensor.shape[1:])}"
            )
    return None


def commit(
    buffers: RolloutBuffers,
    rollout: Mapping[str, np.ndarray],
    stop: threading.Event,
    lane: int = 0,
) -> bool:
    """Copy a whole n-env rollout into n free slots (of `lane`'s, when the slots are split
    among lanes), then put them on the full queue.

    Blocks while no slot is free (back-pressure on the servers). Returns False,
    having written nothing to the full queue, when `stop` is set or the queues
    are closed (shutdown); slots it had taken go back to the free queue.
    """
    num_envs = len(rollout["rollout_id"])
    free_queue = buffers.free_queue_of(lane)
    slots: list[int] = []
    try:
        while len(slots) < num_envs:
            try:
                slots.append(free_queue.get(timeout=_POLL_SECONDS))
            except queue.Empty:
                if stop.is_set():
                    raise QueueClosed from None
    except QueueClosed:
        for index in slots:
            try:
                buffers.free(index)
            except QueueClosed:
                break
        return False
    index = np.asarray(slots)
    for key, tensor in buffers.tensors.items():
        # Through numpy: Ray hands out read-only arrays, which numpy copies from
        # without complaint (torch would warn on each).
        tensor.numpy()[index] = rollout[key]
    try:
        for slot in slots:
            buffers.full_queue.put(slot)
    except QueueClosed:
        return False
    return True
