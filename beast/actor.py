"""Actor processes: K environments stepped in a for-loop, one batched policy call.

Each actor owns K environments and K rollout slots at a time. Per step it
asks its policy for K actions at once, steps the K environments, and
writes step t of env k into slot k. Two policies (beast/inference.py):

- local: ONE forward pass of the actor's own CPU model over all K
  observations (batching is what makes a CPU forward pass cheap per
  sample). The model's weights live in shared memory and are overwritten
  in place by the learner after every update, so an actor always acts with
  recent weights without any message passing.
- central: the actor posts its K inputs to the shared request table and
  sleeps until an inference thread of the learner process has answered
  them, batched with other actors' requests.

Actors ignore SIGINT: Ctrl-C reaches the whole process group, and shutdown
is the learner's job (it closes the queues, which wakes and stops actors).
If the learner dies without closing them, actors notice within a second
that its pid is gone and exit.

An actor that fails writes its traceback to its row of the shared error
board and exits 1; the supervisor (beast/supervisor.py) reports it once and
decides whether to replace the actor.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import sys
import traceback
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from beast.buffers import RolloutBuffers, core_state_key
from beast.envs.batch import EnvBatch, make_env_batch
from beast.inference import CentralPolicy, InferenceTable, LocalPolicy
from beast.native import QueueClosed
from beast.native.acting import StepCopies
from beast.profile import ACTOR_PHASES, PhaseClock
from beast.sequence_actor import SequenceSink, run_sequence_actor

__all__ = ["ActorSettings", "ERROR_BOARD_BYTES", "run_actor"]

# How often a blocked actor checks that the learner still exists.
_PARENT_CHECK_SECONDS = 1.0
# Bytes per actor for its error report (a traceback; longer ones keep their end).
ERROR_BOARD_BYTES = 8192
# Seeds of a replacement actor's envs are offset by this per incarnation.
_INCARNATION_SEED_STRIDE = 100_003


@dataclass(frozen=True)
class ActorSettings:
    """What an actor process needs to know; a picklable subset of Config."""

    env: str
    seed: int
    num_envs: int
    unroll_length: int
    episodic_life: bool
    bf16: bool = False  # local policy: the forward pass under bf16 autocast


def _learner_alive(pid: int) -> bool:
    """False once the learner has exited, including as a zombie not yet reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _take_free_slots(
    buffers: RolloutBuffers, count: int, owner: int, learner_pid: int
) -> list[int] | None:
    """K free slot indices, now owned by `owner`; None when the run is shutting down."""
    slots = []
    while len(slots) < count:
        try:
            index = buffers.free_queue.get(timeout=_PARENT_CHECK_SECONDS)
            buffers.slot_owner[index] = owner
            slots.append(index)
        except queue.Empty:
            if not _learner_alive(learner_pid):
                return None
        except QueueClosed:
            return None
    return slots


def _env_batch(settings: ActorSettings, actor_index: int, incarnation: int) -> EnvBatch:
    """This actor's K environments; a replacement actor gets fresh seeds."""
    k = settings.num_envs
    first_seed = settings.seed + actor_index * k + incarnation * _INCARNATION_SEED_STRIDE
    return make_env_batch(settings.env, k, first_seed, settings.episodic_life)


def run_actor(
    actor_index: int,
    incarnation: int,
    settings: ActorSettings,
    buffers: RolloutBuffers | SequenceSink,
    policy_source: nn.Module | InferenceTable,
    learner_pid: int,
    error_board: torch.Tensor,
    phase_seconds: torch.Tensor | None = None,
) -> None:
    """Process entry point. Exits 0 on shutdown, 1 after posting its error.

    buffers: the rollout slots (IMPALA, LASER), or for R2D2 / Ape-X the
    sequence sink, which runs beast/sequence_actor.py's loop instead.
    policy_source: the shared-memory model (local policy) or the request
    table of the learner's inference server (central policy).
    phase_seconds: shared float64 [num_actors, len(ACTOR_PHASES)]; this actor
    adds the seconds of each phase of its loop to its row (beast/profile.py).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)  # actors never backpropagate
    torch.manual_seed(settings.seed * 7919 + actor_index + incarnation * _INCARNATION_SEED_STRIDE)
    try:
        if phase_seconds is None:
            phase_seconds = torch.zeros((actor_index + 1, len(ACTOR_PHASES)), dtype=torch.float64)
        clock = PhaseClock(phase_seconds[actor_index], ACTOR_PHASES)
        if isinstance(buffers, SequenceSink):
            run_sequence_actor(
                actor_index,
                buffers,
                policy_source,
                functools.partial(_env_batch, settings, actor_index, incarnation),
                functools.partial(_learner_alive, learner_pid),
                clock,
            )
        else:
            _act(actor_index, incarnation, settings, buffers, policy_source, learner_pid, clock)
    except Exception:
        report = traceback.format_exc().encode("utf-8")[-(ERROR_BOARD_BYTES - 1) :]
        row = error_board[actor_index]
        row.zero_()
        row[: len(report)] = torch.frombuffer(bytearray(report), dtype=torch.uint8)
        sys.exit(1)


def _act(
    actor_index: int,
    incarnation: int,
    settings: ActorSettings,
    buffers: RolloutBuffers,
    policy_source: nn.Module | InferenceTable,
    learner_pid: int,
    clock: PhaseClock,
) -> None:
    k, unroll_length = settings.num_envs, settings.unroll_length
    env_batch = _env_batch(settings, actor_index, incarnation)
    if isinstance(policy_source, InferenceTable):
        alive = functools.partial(_learner_alive, learner_pid)
        policy = CentralPolicy(policy_source, actor_index, alive)
    else:
        policy = LocalPolicy(policy_source, k, bf16=settings.bf16)
    # Rollout ids: this process's pid in the high bits, a counter in the low ones.
    rollout_ids = np.arange(k, dtype=np.int64) + (os.getpid() << 32)
    last_action = np.zeros(k, dtype=np.int64)
    # Tensor views of the env batch's numpy arrays: no copies when building inputs.
    inputs = {
        "obs": torch.from_numpy(env_batch.obs),
        "reward": torch.from_numpy(env_batch.reward),
        "done": torch.from_numpy(env_batch.done),
        "last_action": torch.from_numpy(last_action),
    }
    fields = {key: tensor.numpy() for key, tensor in buffers.tensors.items()}
    try:
        step = policy.act(inputs)  # the same ActionBatch, overwritten, at every act
        actions = step.action.numpy()
        # Where each slot field's step comes from: a [K, ...] array at a fixed address.
        sources = {
            "obs": env_batch.obs,
            "reward": env_batch.reward,
            "done": env_batch.done,
            "last_action": last_action,
            "action": actions,
            "policy_logits": step.policy_logits.numpy(),
            "baseline": step.baseline.numpy(),
            "episode_end": env_batch.episode_end,
            "episode_return": env_batch.episode_return,
            "episode_step": env_batch.episode_step,
            "rollout_id": rollout_ids,
        }
        # Env i's [1, ...] row of each source, made once: rollouts only change the slots.
        source_rows = {key: [array[i : i + 1] for i in range(k)] for key, array in sources.items()}
        clock.restart()
        while True:
            slot_list = _take_free_slots(buffers, k, actor_index, learner_pid)
            if slot_list is None:
                return
            clock.mark("wait_slots")
            # Step t of env k goes to row t of slot k: one native call per step.
            write_step = StepCopies(
                [
                    (fields[key][slot], row)
                    for key, rows in source_rows.items()
                    for row, slot in zip(rows, slot_list, strict=True)
                ]
            )
            # The state that produced step 0's output: the learner replays
            # step 0 from it. Policies give it per env, [K, d0, ...], as slots store it.
            slots = np.array(slot_list, dtype=np.int64)
            for i, tensor in enumerate(policy.state):
                fields[core_state_key(i)][slots] = tensor.numpy()
            write_step.run(0)
            clock.mark("slot_write")
            for t in range(1, unroll_length + 1):
                np.copyto(last_action, actions)
                env_batch.step(actions)
                clock.mark("env_step")
                policy.act(inputs)
                clock.mark("inference")
                write_step.run(t)
                clock.mark("slot_write")
            for slot in slot_list:
                buffers.slot_owner[slot] = -1
                buffers.full_queue.put(slot)
            clock.mark("slot_write")
            rollout_ids += k
            if not _learner_alive(learner_pid):
                return
    except QueueClosed:
        return
    finally:
        env_batch.close()
