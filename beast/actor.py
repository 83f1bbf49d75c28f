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

With --num_env_splits S the K envs form S lanes of K/S (`_Lane`): the actor
posts one lane's inputs, then steps the next lane's envs while the first
is served, which hides the central round trip behind env steps.

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
from beast.inference import ActionBatch, CentralPolicy, InferenceTable, LocalPolicy
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
    num_env_splits: int = 1  # lanes of num_envs / num_env_splits envs (see _Lane)


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


def _env_batch(
    settings: ActorSettings, actor_index: int, incarnation: int, first: int = 0, count: int = 0
) -> EnvBatch:
    """This actor's envs [first, first + count) (default all K); a replacement actor gets
    fresh seeds."""
    k = settings.num_envs
    first_seed = settings.seed + actor_index * k + incarnation * _INCARNATION_SEED_STRIDE
    return make_env_batch(settings.env, count or k, first_seed + first, settings.episodic_life)


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


class _Lane:
    """A split of an actor's envs, stepped while the other splits' actions are computed.

    With central inference an actor would idle for every round trip to the server.
    Split into lanes (Sample Factory's double-buffered sampling), it posts one lane's
    inputs and steps the next lane's envs while they are served, so a round trip
    costs nothing as long as it is shorter than stepping the other lanes. With one
    lane this is the plain loop: act on all K envs, step them, write the step.

    Each lane owns its K/S envs, its policy (a central group, or a local model),
    its own K/S rollout slots and the native copies that write its steps.
    """

    def __init__(
        self,
        index: int,
        actor_envs: int,
        env_batch: EnvBatch,
        policy: LocalPolicy | CentralPolicy,
        buffers: RolloutBuffers,
        owner: int,
        learner_pid: int,
        clock: PhaseClock,
    ) -> None:
        k = env_batch.num_envs
        self.env_batch, self.policy, self.buffers = env_batch, policy, buffers
        self.owner, self.learner_pid, self.clock = owner, learner_pid, clock
        self.last_action = np.zeros(k, dtype=np.int64)
        # Tensor views of the env batch's numpy arrays: no copies when building inputs.
        self.inputs = {
            "obs": torch.from_numpy(env_batch.obs),
            "reward": torch.from_numpy(env_batch.reward),
            "done": torch.from_numpy(env_batch.done),
            "last_action": torch.from_numpy(self.last_action),
        }
        # Rollout ids: the pid in the high bits; lanes take disjoint residues mod the
        # actor's K, since every lane adds K per rollout.
        self.rollout_ids = np.arange(k, dtype=np.int64) + index * k + (os.getpid() << 32)
        self.actor_envs = actor_envs
        self.fields = {key: tensor.numpy() for key, tensor in buffers.tensors.items()}
        self.actions: np.ndarray | None = None
        self.source_rows: dict[str, list[np.ndarray]] = {}
        self.slots: list[int] | None = None  # the rollout being written, if any
        self.write_step: StepCopies | None = None
        self.t = 0  # the step whose output the lane waits for (or wrote last)

    def _bind_outputs(self, step: ActionBatch) -> None:
        """Where each slot field's step comes from: a [K, ...] array at a fixed address,
        and env i's [1, ...] row of each, made once: rollouts only change the slots."""
        self.actions = step.action.numpy()
        sources = {
            "obs": self.env_batch.obs,
            "reward": self.env_batch.reward,
            "done": self.env_batch.done,
            "last_action": self.last_action,
            "action": self.actions,
            "policy_logits": step.policy_logits.numpy(),
            "baseline": step.baseline.numpy(),
            "episode_end": self.env_batch.episode_end,
            "episode_return": self.env_batch.episode_return,
            "episode_step": self.env_batch.episode_step,
            "rollout_id": self.rollout_ids,
        }
        k = self.env_batch.num_envs
        self.source_rows = {key: [a[i : i + 1] for i in range(k)] for key, a in sources.items()}

    def _begin_rollout(self) -> bool:
        """Take K/S free slots and write the state and step 0 (the latest output);
        False when the run is shutting down."""
        slot_list = _take_free_slots(
            self.buffers, self.env_batch.num_envs, self.owner, self.learner_pid
        )
        if slot_list is None:
            return False
        self.clock.mark("wait_slots")
        # Step t of env k goes to row t of slot k: one native call per step.
        fields = self.fields
        self.write_step = StepCopies(
            [
                (fields[key][slot], row)
                for key, rows in self.source_rows.items()
                for row, slot in zip(rows, slot_list, strict=True)
            ]
        )
        # The state that produced step 0's output: the learner replays step 0 from
        # it. Policies give it per env, [K, d0, ...], as slots store it.
        slots = np.array(slot_list, dtype=np.int64)
        for i, tensor in enumerate(self.policy.state):
            fields[core_state_key(i)][slots] = tensor.numpy()
        self.write_step.run(0)
        self.slots, self.t = slot_list, 0
        self.clock.mark("slot_write")
        return True

    def _finish_rollout(self) -> bool:
        for slot in self.slots:
            self.buffers.slot_owner[slot] = -1
            self.buffers.full_queue.put(slot)
        self.rollout_ids += self.actor_envs
        self.clock.mark("slot_write")
        return _learner_alive(self.learner_pid)

    def post(self) -> None:
        """Ask for the actions of the envs' current step."""
        self.policy.post(self.inputs)
        self.clock.mark("inference")

    def advance(self, unroll_length: int) -> bool:
        """Take the posted step's output, write it, step the envs, post the next step.
        False when the run is shutting down."""
        step = self.policy.wait()
        self.clock.mark("inference")
        if self.actions is None:
            self._bind_outputs(step)
        if self.slots is None:
            if not self._begin_rollout():
                return False
        else:
            self.write_step.run(self.t)
            self.clock.mark("slot_write")
            if self.t == unroll_length and not (self._finish_rollout() and self._begin_rollout()):
                return False
        np.copyto(self.last_action, self.actions)
        self.env_batch.step(self.actions)
        self.clock.mark("env_step")
        self.t += 1
        self.post()
        return True


def _act(
    actor_index: int,
    incarnation: int,
    settings: ActorSettings,
    buffers: RolloutBuffers,
    policy_source: nn.Module | InferenceTable,
    learner_pid: int,
    clock: PhaseClock,
) -> None:
    splits = settings.num_env_splits
    lane_envs = settings.num_envs // splits
    lanes: list[_Lane] = []
    try:
        for s in range(splits):
            env_batch = _env_batch(settings, actor_index, incarnation, s * lane_envs, lane_envs)
            lanes.append(
                _Lane(
                    s,
                    settings.num_envs,
                    env_batch,
                    _policy(policy_source, actor_index, s, lane_envs, settings, learner_pid),
                    buffers,
                    actor_index,
                    learner_pid,
                    clock,
                )
            )
        clock.restart()
        for lane in lanes:
            lane.post()
        while all(lane.advance(settings.unroll_length) for lane in lanes):
            pass
    except QueueClosed:
        return
    finally:
        for lane in lanes:
            lane.env_batch.close()


def _policy(
    source: nn.Module | InferenceTable,
    actor_index: int,
    split: int,
    num_envs: int,
    settings: ActorSettings,
    learner_pid: int,
) -> LocalPolicy | CentralPolicy:
    if isinstance(source, InferenceTable):
        alive = functools.partial(_learner_alive, learner_pid)
        return CentralPolicy(source, actor_index, alive, split=split)
    return LocalPolicy(source, num_envs, bf16=settings.bf16)
