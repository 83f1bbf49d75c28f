"""Env servers: K environments stepped in a loop inside one Ray actor.

`EnvServer` is a plain class (tests use it without Ray); `beast.poly.trainer`
wraps it with `ray.remote` and places the servers across the cluster's nodes.
Its K envs are a `beast.envs.batch` batch, as a monobeast actor's are.
Two ways to act, per `--policy`:

    local    `rollout()` steps the K envs T times with the server's own CPU
             copy of the model (`beast.inference.LocalPolicy`, the actors'
             local policy) and returns the whole rollout, `[K, T+1, ...]`
             per field. One Ray call per T x K steps amortises Ray's per-call
             cost (about a millisecond) over T*K agent steps.
    central  `step(actions)` steps the K envs once with actions the learner
             computed and returns the K new observations; the learner batches
             all servers' observations into one forward pass. One Ray call
             per K steps.

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

import numpy as np
import torch

from beast import envs
from beast.buffers import Field, core_state_shapes, rollout_spec
from beast.envs.batch import make_env_batch
from beast.inference import LocalPolicy
from beast.poly.config import PolyConfig
from beast.poly.rollouts import RolloutStaging
from beast.runner import build_run_model

__all__ = ["EnvServer", "Incarnation", "RolloutTimes", "poly_rollout_spec"]

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


def poly_rollout_spec(config: PolyConfig, spec: envs.EnvSpec, model: torch.nn.Module):
    """The rollout layout for `config`, `spec` and the model's recurrent state."""
    return rollout_spec(
        unroll_length=config.unroll_length,
        obs_shape=spec.obs_shape,
        obs_dtype=spec.obs_dtype,
        num_actions=spec.num_actions,
        core_state_shapes=core_state_shapes(model.initial_state(1)),
    )


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return "local"


class EnvServer:
    """K environments of `config.env` with, for --policy local, a CPU policy."""

    def __init__(self, config: PolyConfig, server_index: int, restarted: bool = False) -> None:
        torch.set_num_threads(1)
        k = config.num_envs_per_server or config.num_envs_per_actor
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
        self.env_batch = make_env_batch(config.env, k, first_seed, config.episodic_life)
        spec = self.env_batch.spec
        self.model = build_run_model(config, spec)
        self.model.eval()
        self.policy = LocalPolicy(self.model, k)
        self.spec = poly_rollout_spec(config, spec, self.model)
        self.staging = RolloutStaging(self.spec, k)
        self.weights_version = -1
        # Rollout ids: a random 31-bit prefix per process and a counter; unique per
        # rollout and per env, as beast/buffers.py's torn-slot check needs.
        self.rollout_ids = torch.arange(k, dtype=torch.int64) + (
            int.from_bytes(os.urandom(4), "little") >> 1 << 32
        )
        self.inputs = {
            "obs": torch.from_numpy(self.env_batch.obs),
            "reward": torch.from_numpy(self.env_batch.reward),
            "done": torch.from_numpy(self.env_batch.done),
            "last_action": torch.zeros(k, dtype=torch.int64),
        }
        self.env_outputs = {
            "episode_end": torch.from_numpy(self.env_batch.episode_end),
            "episode_return": torch.from_numpy(self.env_batch.episode_return),
            "episode_step": torch.from_numpy(self.env_batch.episode_step),
        }
        self._step = None  # the latest ActionBatch (--policy local)

    def info(self) -> Incarnation:
        return self.incarnation

    def staging_spec(self) -> dict[str, Field]:
        """The rollout layout this server produces (per slot, as beast/buffers.py has it)."""
        return self.spec

    def load_weights(self, version: int, state: dict[str, np.ndarray]) -> None:
        self.model.load_state_dict({key: torch.from_numpy(np.array(v)) for key, v in state.items()})
        self.weights_version = version

    def rollout(
        self, version: int, weights: list
    ) -> tuple[Incarnation, dict[str, np.ndarray], RolloutTimes]:
        """--policy local: T steps of the K envs; returns the whole [K, T+1, ...] rollout.

        `weights` is `[ObjectRef]` of the learner's state dict at `version`, nested in
        a list so that Ray fetches it only when the version is new to this server.
        """
        start = time.perf_counter()
        if version != self.weights_version:
            import ray

            self.load_weights(version, ray.get(weights[0]))
        env_time = 0.0
        policy_start = time.perf_counter()
        if self._step is None:
            self._step = self.policy.act(self.inputs)
        policy_time = time.perf_counter() - policy_start
        staging = self.staging
        staging.write_state(self.policy.state)
        staging.write_step(0, self.inputs, self.env_outputs, self._step, self.rollout_ids)
        for t in range(1, self.unroll_length + 1):
            self.inputs["last_action"].copy_(self._step.action)
            env_start = time.perf_counter()
            self.env_batch.step(self._step.action.numpy())
            policy_start = time.perf_counter()
            self._step = self.policy.act(self.inputs)
            env_time += policy_start - env_start
            policy_time += time.perf_counter() - policy_start
            staging.write_step(t, self.inputs, self.env_outputs, self._step, self.rollout_ids)
        self.rollout_ids += self.num_envs
        times = RolloutTimes(env_time, policy_time, time.perf_counter() - start)
        return self.incarnation, staging.arrays(), times

    def step(
        self, actions: np.ndarray | None, token: str | None
    ) -> tuple[Incarnation, dict[str, np.ndarray]]:
        """--policy central: apply K actions (None: none yet), return the K new env outputs.

        `token` is the incarnation the actions were computed for. A call Ray retried
        on a restarted server finds another token and returns its envs' current
        outputs without stepping them, so the learner starts a new rollout there
        rather than mixing two processes' steps in one.
        """
        if actions is not None and token == self.incarnation.token:
            self.env_batch.step(actions)
        batch = self.env_batch
        return self.incarnation, {
            "obs": batch.obs,
            "reward": batch.reward,
            "done": batch.done,
            "episode_end": batch.episode_end,
            "episode_return": batch.episode_return,
            "episode_step": batch.episode_step,
        }

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
