"""Env servers: K environments stepped in a loop inside one Ray actor.

`EnvServer` is a plain class (tests use it without Ray); `beast.poly.trainer`
wraps it with `ray.remote` and places the servers across the cluster's nodes.
Its K envs are a `beast.envs.batch` batch, as a monobeast actor's are, and it acts
with the algorithm's policy (beast/algos), as an actor does. Two ways to act, per
`--policy`:

    local    `rollout()` steps the K envs T times with the server's own CPU
             copy of the model (`beast.acting.inference.LocalInference`, the actors'
             local policy) and returns what the learner's experience takes
             from them: a whole rollout, `[K, T+1, ...]` per field, or the
             sequences cut from those T steps with their episodes and step
             count (a replay stays in the learner process). One Ray call per
             T x K steps amortises Ray's per-call cost (about a millisecond).
    central  `step(actions)` steps the K envs once with actions the learner
             computed and returns the K envs' new step; the learner batches
             all servers' observations into one forward pass and builds the
             same payloads itself. One Ray call per K steps.

Each reply carries the server's incarnation (node, pid, a random id): Ray
restarts a server whose process or node died and retries the calls that
were in flight on the new process, and the learner sees from the changed
incarnation that the rollout the old one was stepping is lost.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from beast.acting.actor import env_sources, policy_inputs
from beast.acting.inference import LocalInference, record_arrays
from beast.algos.build import build_algorithm
from beast.envs.batch import make_env_batch
from beast.poly.config import PolyConfig

__all__ = ["EnvServer", "Incarnation", "RolloutTimes"]

# Seeds of a restarted server's envs are offset by this times a random draw, so
# that a replacement does not replay its predecessor's episodes.
_RESTART_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class Incarnation:
    """Which process is (now) behind an env server."""

    server_index: int
    node_id: str
    hostname: str
    pid: int
    token: str  # unique per process start


@dataclass(frozen=True)
class RolloutTimes:
    """Where a server's time for one rollout went, seconds (the throughput note's data)."""

    env: float
    policy: float
    total: float


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return "local"


class EnvServer:
    """K environments of `config.env` with, for --policy local, a CPU policy.

    recipe: how the learner's experience wants the steps (`staging_recipe()` of its
        rollout slots or sequence replay): local rollouts are built with it.
    """

    def __init__(
        self, config: PolyConfig, server_index: int, recipe: Any, restarted: bool = False
    ) -> None:
        torch.set_num_threads(1)
        k = config.servers_envs
        self.num_envs = k
        self.unroll_length = config.unroll_length
        # A server Ray restarts runs __init__ again with the same arguments; it knows
        # it is a replacement from Ray's runtime context, and takes fresh env seeds.
        incarnation = 0
        if restarted or _was_restarted():
            incarnation = 1 + int.from_bytes(os.urandom(2), "little")
        torch.manual_seed(config.seed * 7919 + server_index + incarnation * _RESTART_SEED_STRIDE)
        self.incarnation = Incarnation(
            server_index=server_index,
            node_id=_node_id(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            token=uuid.uuid4().hex,
        )
        # Env i of server s gets seed + s*K + i, as actor s's envs do in monobeast.
        first_seed = config.seed + server_index * k + incarnation * _RESTART_SEED_STRIDE
        self.env_batch = make_env_batch(
            config.env,
            k,
            first_seed,
            config.episodic_life,
            config.env_backend,
            return_discount=config.return_discount(),
        )
        algorithm = build_algorithm(config, self.env_batch.spec)
        policy = algorithm.acting_rule()
        self.last_action = np.zeros_like(record_arrays(policy, k)["action"])
        self.weights_version = -1
        self.policy: LocalInference | None = None
        if config.policy == "local":
            self.model = algorithm.build_model().eval()
            # Env j of server s is row s*K + j of the run's envs (Ape-X's epsilons).
            rows = slice(server_index * k, (server_index + 1) * k)
            params = {
                key: value[rows] for key, value in policy.env_params(config.servers * k).items()
            }
            self.policy = LocalInference(self.model, policy, k, params)
            self.inputs = policy_inputs(self.env_batch, self.last_action)
            # Rollout ids: a random 31-bit prefix per process and a counter; unique per
            # rollout and per env, as beast/experience/rollout_slots.py's torn-slot check needs.
            self.writer, self.staging = recipe.writer(
                {**env_sources(self.env_batch, self.last_action), **self.policy.record},
                publish_every=self.unroll_length,
                first_id=int.from_bytes(os.urandom(4), "little") >> 1 << 32,
                id_stride=k,
            )
        self._acted = False  # the current step's action is computed and written

    def info(self) -> Incarnation:
        return self.incarnation

    def load_weights(self, version: int, state: dict[str, np.ndarray]) -> None:
        self.model.load_state_dict({key: torch.from_numpy(np.array(v)) for key, v in state.items()})
        self.weights_version = version

    def rollout(self, version: int, weights: list) -> tuple[Incarnation, Any, RolloutTimes]:
        """--policy local: T steps of the K envs; returns what the learner's experience
        takes from them (see the module docstring).

        `weights` is `[ObjectRef]` of the learner's state dict at `version`, nested in
        a list so that Ray fetches it only when the version is new to this server.
        """
        start = time.perf_counter()
        if version != self.weights_version:
            import ray

            self.load_weights(version, ray.get(weights[0]))
        env_time = policy_time = 0.0
        policy, actions = self.policy, self.policy.record["action"]
        while True:
            if self._acted:
                np.copyto(self.last_action, actions)
                env_start = time.perf_counter()
                self.env_batch.step(actions)
                env_time += time.perf_counter() - env_start
            policy_start = time.perf_counter()
            policy.act(self.inputs)
            policy_time += time.perf_counter() - policy_start
            self.writer.write(policy.state)
            self._acted = True
            payload = self.staging.take_rollout()
            if payload is not None:
                times = RolloutTimes(env_time, policy_time, time.perf_counter() - start)
                return self.incarnation, payload, times

    def step(self, actions: np.ndarray | None, token: str | None) -> tuple[Incarnation, dict]:
        """--policy central: apply K actions (None: none yet), return the K envs' new step.

        `token` is the incarnation the actions were computed for. A call Ray retried
        on a restarted server finds another token and returns its envs' current
        outputs without stepping them, so the learner starts a new rollout there
        rather than mixing two processes' steps in one.
        """
        if actions is not None and token == self.incarnation.token:
            self.env_batch.step(actions)
        sources = env_sources(self.env_batch, self.last_action)
        del sources["last_action"]  # the learner knows the actions it sent
        return self.incarnation, sources

    def close(self) -> None:
        self.env_batch.close()


def _was_restarted() -> bool:
    try:
        import ray

        if not ray.is_initialized():
            return False
        # Ray's property warns about an internal call of its own deprecated API.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except (ImportError, AttributeError, RuntimeError, AssertionError):
        return False  # not inside a Ray actor (Ray asserts that it is)
