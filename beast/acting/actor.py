"""Actor processes: K environments stepped in a for-loop, one batched policy call.

One loop for every algorithm: each actor owns K environments, asks its policy for K
actions at once, steps the K environments, and hands each step to the writer of the
run's sink (`Sink`, beast/experience/contract.py: rollout slots, or a replay it adds
sequences or steps to). The step it hands over is the env batch's arrays, the actor's last
actions and the policy's record (the algorithm's: beast/algos/base.py `ActingRule`), all
at fixed addresses. Two ways to act (beast/acting/inference.py):

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
is the learner's job (it closes the sink, which wakes and stops actors).
If the learner dies without closing it, actors notice within a second
that its pid is gone and exit. If their fork server dies, the kernel kills
them with it, and the supervisor replaces them (beast/acting/supervisor.py).

An actor that fails writes its traceback to its row of the shared error
board and exits 1; the supervisor (beast/acting/supervisor.py) reports it once and
decides whether to replace the actor.

`Actor` is also what --serial steps in the learner's own process (beast/run/serial.py).
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from beast.acting.error_board import ERROR_BOARD_BYTES, post_traceback
from beast.acting.inference import CentralInference, InferenceTable, LocalInference
from beast.algos.base import ActingRule
from beast.envs.batch import EnvBatch, make_env_batch
from beast.experience.contract import Sink
from beast.native import QueueClosed
from beast.util.interrupts import ignore_interrupts
from beast.util.profile import ACTOR_PHASES, PhaseClock
from beast.util.threads import die_with_fork_server, process_alive

__all__ = [
    "Actor",
    "ActorSettings",
    "ERROR_BOARD_BYTES",
    "env_sources",
    "policy_inputs",
    "run_actor",
]

# Seeds of a replacement actor's envs are offset by this per incarnation.
_INCARNATION_SEED_STRIDE = 100_003


@dataclass(frozen=True)
class ActorSettings:
    """What an actor process needs to know; a picklable subset of Config."""

    env: str
    seed: int
    num_actors: int
    num_envs: int
    episodic_life: bool
    policy: ActingRule  # the algorithm's acting rule
    env_backend: str = "auto"  # make_env_batch's backend (--env_backend)
    return_discount: float | None = None  # envs keep G_t (--normalize_reward)
    bf16: bool = False  # local policy: the forward pass under bf16 autocast
    num_env_splits: int = 1  # lanes of num_envs / num_env_splits envs (see _Lane)


def env_sources(env_batch: EnvBatch, last_action: np.ndarray) -> dict[str, np.ndarray]:
    """The env batch's per-step arrays and the actor's last actions: what a sink's writer
    copies each step besides the policy's record (the observation's leaves and
    beast/experience/rollout_slots.py `ENV_STEP_KEYS`)."""
    return {
        **env_batch.obs_arrays,
        "reward": env_batch.reward,
        "done": env_batch.done,
        "terminated": env_batch.terminated,
        "truncated": env_batch.truncated,
        "last_action": last_action,
        "episode_end": env_batch.episode_end,
        "episode_return": env_batch.episode_return,
        "episode_step": env_batch.episode_step,
        "discounted_return": env_batch.discounted_return,  # --normalize_reward's
    }


def policy_inputs(env_batch: EnvBatch, last_action: np.ndarray) -> dict[str, torch.Tensor]:
    """Tensor views of what a policy reads each step (`LocalInference.post`): the env batch's
    observation leaves, reward and done, and the actor's last actions. No copies: the
    arrays are updated in place, step after step."""
    arrays = {
        **env_batch.obs_arrays,
        "reward": env_batch.reward,
        "done": env_batch.done,
        "last_action": last_action,
    }
    return {key: torch.from_numpy(array) for key, array in arrays.items()}


def _env_batch(
    settings: ActorSettings, actor_index: int, incarnation: int, first: int, count: int
) -> EnvBatch:
    """This actor's envs [first, first + count); a replacement actor gets fresh seeds."""
    k = settings.num_envs
    first_seed = settings.seed + actor_index * k + incarnation * _INCARNATION_SEED_STRIDE
    return make_env_batch(
        settings.env,
        count,
        first_seed + first,
        settings.episodic_life,
        settings.env_backend,
        return_discount=settings.return_discount,
    )


def run_actor(
    actor_index: int,
    incarnation: int,
    settings: ActorSettings,
    sink: Sink,
    policy_source: nn.Module | InferenceTable,
    learner_pid: int,
    error_board: torch.Tensor,
    phase_seconds: torch.Tensor | None = None,
) -> None:
    """Process entry point. Exits 0 on shutdown, 1 after posting its error.

    sink: where the steps go (`Sink`: rollout slots or a replay).
    policy_source: the shared-memory model (local policy) or the request
    table of the learner's inference server (central policy).
    phase_seconds: shared float64 [num_actors, len(ACTOR_PHASES)]; this actor
    adds the seconds of each phase of its loop to its row (beast/util/profile.py).
    """
    die_with_fork_server()
    ignore_interrupts()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)  # actors never backpropagate
    torch.manual_seed(settings.seed * 7919 + actor_index + incarnation * _INCARNATION_SEED_STRIDE)
    try:
        if phase_seconds is None:
            phase_seconds = torch.zeros((actor_index + 1, len(ACTOR_PHASES)), dtype=torch.float64)
        clock = PhaseClock(phase_seconds[actor_index], ACTOR_PHASES)
        actor = Actor(actor_index, incarnation, settings, sink, policy_source, learner_pid, clock)
        try:
            while actor.step():
                pass
        except QueueClosed:
            return
        finally:
            actor.close()
    except Exception:
        post_traceback(error_board[actor_index])
        sys.exit(1)


class _Lane:
    """A split of an actor's envs, stepped while the other splits' actions are computed.

    With central inference an actor would idle for every round trip to the server.
    Split into lanes (Sample Factory's double-buffered sampling), it posts one lane's
    inputs and steps the next lane's envs while they are served, so a round trip
    costs nothing as long as it is shorter than stepping the other lanes. With one
    lane this is the plain loop: act on all K envs, write the step, step the envs.

    Each lane owns its K/S envs, its policy (a central group, or a local model) and
    its writer into the sink.
    """

    def __init__(
        self,
        env_batch: EnvBatch,
        policy: LocalInference | CentralInference,
        make_writer: Any,
        clock: PhaseClock,
    ) -> None:
        self.env_batch, self.policy, self.clock = env_batch, policy, clock
        self.last_action = np.zeros_like(policy.record["action"])
        # Tensor views of the env batch's numpy arrays: no copies when building inputs.
        self.inputs = policy_inputs(env_batch, self.last_action)
        self.actions = policy.record["action"]
        self.writer = make_writer({**env_sources(env_batch, self.last_action), **policy.record})

    def post(self) -> None:
        """Ask for the actions of the envs' current step."""
        self.policy.post(self.inputs)
        self.clock.mark("inference")

    def advance(self) -> bool:
        """Take the posted step's output, write the step, step the envs, post the next
        step. False when the run is shutting down."""
        self.policy.wait()
        self.clock.mark("inference")
        if not self.writer.write(self.policy.state):
            return False
        np.copyto(self.last_action, self.actions)
        self.env_batch.step(self.actions)
        self.clock.mark("env_step")
        self.post()
        return True


class Actor:
    """An actor's K envs in `settings.num_env_splits` lanes, each writing into `sink`."""

    def __init__(
        self,
        actor_index: int,
        incarnation: int,
        settings: ActorSettings,
        sink: Sink,
        policy_source: nn.Module | InferenceTable,
        learner_pid: int,
        clock: PhaseClock,
    ) -> None:
        splits = settings.num_env_splits
        lane_envs = settings.num_envs // splits
        # The policy's per-env parameters over all the run's envs (Ape-X's spread of
        # epsilons); this actor's are rows actor_index * K ... + K. With central
        # inference the request table holds them.
        params = settings.policy.env_params(settings.num_actors * settings.num_envs)
        self.lanes: list[_Lane] = []
        try:
            for s in range(splits):
                first = s * lane_envs
                env_batch = _env_batch(settings, actor_index, incarnation, first, lane_envs)
                if isinstance(policy_source, InferenceTable):
                    alive = functools.partial(process_alive, learner_pid)
                    policy: LocalInference | CentralInference = CentralInference(
                        policy_source, actor_index, alive, split=s
                    )
                else:
                    row = actor_index * settings.num_envs + first
                    policy = LocalInference(
                        policy_source,
                        settings.policy,
                        lane_envs,
                        {key: value[row : row + lane_envs] for key, value in params.items()},
                        bf16=settings.bf16,
                    )
                # Rollout ids: the pid in the high bits; lanes take disjoint residues mod
                # the actor's K, since every lane adds K per rollout.
                make_writer = functools.partial(
                    sink.writer,
                    actor_index,
                    first_id=first + (os.getpid() << 32),
                    id_stride=settings.num_envs,
                    learner_pid=learner_pid,
                    clock=clock,
                    lane=actor_index * splits + s,
                    incarnation=incarnation,
                )
                self.lanes.append(_Lane(env_batch, policy, make_writer, clock))
        except BaseException:
            self.close()
            raise
        clock.restart()
        for lane in self.lanes:
            lane.post()

    def step(self) -> bool:
        """One step of every lane; False when the run is shutting down."""
        return all(lane.advance() for lane in self.lanes)

    def close(self) -> None:
        for lane in self.lanes:
            lane.env_batch.close()
