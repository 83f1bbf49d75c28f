"""Whole rollouts outside shared memory: staged per env server, committed whole.

An env server (or, with --policy central, the learner's inference thread)
builds each rollout in a `RolloutStaging`: every field of the rollout spec
(beast/buffers.py), env-major, `[K, T+1, ...]` per field and `[K, d0, ...]`
per recurrent-state field, the layout of K rollout slots side by side. The
learner process copies a finished rollout into K free slots with `commit`
and only then puts them on the full queue, so a rollout lost in flight (its
server or node died) never reaches a slot, and a slot never holds half of
one: the learner's batches are built from whole rollouts only.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from beast.buffers import Field, RolloutBuffers, core_state_key
from beast.inference import ActionBatch
from beast.native import QueueClosed

__all__ = ["CommitTimes", "RolloutStaging", "commit", "check_rollout"]

# How often a receiver waiting for free slots looks at its stop flag.
_POLL_SECONDS = 0.2


class RolloutStaging:
    """One rollout of K envs, `[K, T+1, ...]` per field, written a step at a time.

    Alignment is the slots' (beast/buffers.py): step t holds the observation,
    the reward that led to it, the action taken from it and the policy's outputs
    for it; step 0 repeats step T of the previous rollout.
    """

    def __init__(self, spec: Mapping[str, Field], num_envs: int) -> None:
        self.num_envs = num_envs
        self.tensors = {
            key: torch.zeros((num_envs, *f.shape), dtype=f.dtype) for key, f in spec.items()
        }
        self.num_core_state = sum(key.startswith("core_state_") for key in spec)

    def write_step(
        self,
        t: int,
        inputs: Mapping[str, torch.Tensor],
        env_outputs: Mapping[str, torch.Tensor],
        step: ActionBatch,
        rollout_ids: torch.Tensor,
    ) -> None:
        """inputs: obs [K, ...], reward, done, last_action [K]; env_outputs: episode_* [K]."""
        fields = self.tensors
        for key, value in inputs.items():
            fields[key][:, t] = value
        for key, value in env_outputs.items():
            fields[key][:, t] = value
        fields["action"][:, t] = step.action
        fields["policy_logits"][:, t] = step.policy_logits
        fields["baseline"][:, t] = step.baseline
        fields["rollout_id"][:, t] = rollout_ids

    def write_state(self, state: tuple[torch.Tensor, ...]) -> None:
        """The recurrent state that produced step 0's output, per env: [K, d0, ...] each."""
        for i, tensor in enumerate(state):
            self.tensors[core_state_key(i)].copy_(tensor)

    def repeat_last_step(self, rollout_ids: torch.Tensor) -> None:
        """Start the next rollout, with ids `rollout_ids` [K]: step 0 becomes step T."""
        for key, tensor in self.tensors.items():
            if not key.startswith("core_state_"):
                tensor[:, 0] = tensor[:, -1]
        # Every step carries its rollout's id, step 0 included (beast/buffers.py).
        self.tensors["rollout_id"][:, 0] = rollout_ids

    def arrays(self) -> dict[str, np.ndarray]:
        """numpy views (Ray ships numpy arrays without pickling them element by element)."""
        return {key: tensor.numpy() for key, tensor in self.tensors.items()}


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


@dataclass
class CommitTimes:
    """Seconds `commit` spent, summed: waiting for free slots, and copying."""

    wait_s: float = 0.0
    copy_s: float = 0.0


def commit(
    buffers: RolloutBuffers,
    rollout: Mapping[str, np.ndarray],
    stop: threading.Event,
    times: CommitTimes | None = None,
) -> bool:
    """Copy a whole K-env rollout into K free slots, then put them on the full queue.

    Blocks while no slot is free (back-pressure on the servers). Returns False,
    having written nothing to the full queue, when `stop` is set or the queues
    are closed (shutdown); slots it had taken go back to the free queue.
    """
    start = time.perf_counter()
    num_envs = len(rollout["rollout_id"])
    slots: list[int] = []
    try:
        while len(slots) < num_envs:
            try:
                slots.append(buffers.free_queue.get(timeout=_POLL_SECONDS))
            except queue.Empty:
                if stop.is_set():
                    raise QueueClosed from None
    except QueueClosed:
        for index in slots:
            try:
                buffers.free_queue.put(index)
            except QueueClosed:
                break
        return False
    copy_start = time.perf_counter()
    index = np.asarray(slots)
    for key, tensor in buffers.tensors.items():
        # Through numpy: Ray hands out read-only arrays, which numpy copies from
        # without complaint (torch would warn on each).
        tensor.numpy()[index] = rollout[key]
    if times is not None:
        times.wait_s += copy_start - start
        times.copy_s += time.perf_counter() - copy_start
    try:
        for slot in slots:
            buffers.full_queue.put(slot)
    except QueueClosed:
        return False
    return True
