"""Real IMPALA actor processes filling rollout slots, as a run starts them, with no learner:
`capture_rollouts` gathers the first full slots (tests/acting/test_actor_rollouts.py).

The actors start as `beast.run.runner.train` starts them: forkserver, the supervisor's
`ActorPool` running `run_actor`, shared `RolloutBuffers` and a shared-memory model, or
with `policy="central"` an inference server in this process serving them. A consumer
thread takes each full slot and puts it straight back on the free queue, so the actors
never wait on a learner. Nothing here is timed: the capture ends when it holds its count.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import sys
import threading
import time

import torch
from torch import nn

from beast import envs
from beast.acting.actor import ActorSettings
from beast.acting.inference import InferenceServer, InferenceTable
from beast.acting.supervisor import ActorPool
from beast.algos.build import config_for
from beast.algos.impala import Impala
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.fields import core_state_shapes
from beast.native import QueueClosed

# How often the main thread checks that the actors are alive.
POLL_SECONDS = 0.1
# A bound, not a speed: a capture that gets no slot in this long fails instead of hanging
# (process start, env creation and the first forward pass take seconds on a busy machine).
CAPTURE_TIMEOUT = 300.0
# Seconds actors get to exit after the queues close before they are killed (as the runner).
JOIN_SECONDS = 5.0


def capture_rollouts(
    *,
    env: str,
    num_envs: int,
    unroll_length: int,
    count: int,
    actor_model: nn.Module,
    seed: int,
    policy: str = "local",
    num_env_splits: int = 1,
) -> dict[str, torch.Tensor]:
    """The first `count` full slots one actor of `num_envs` envs of `env` writes, acting
    with `actor_model` (IMPALA's policy: a sample from the logits, stored with them and
    the baseline), as one batch of [unroll_length + 1, count] per field.

    Raises:
        RuntimeError: an actor or the inference server failed, or `count` slots did not
            arrive within CAPTURE_TIMEOUT.
    """
    probe = envs.make(env, seed=seed)
    try:
        spec = envs.env_spec(probe)
    finally:
        probe.close()
    config = dataclasses.replace(
        config_for("impala")(),
        env=env,
        seed=seed,
        num_actors=1,
        num_envs_per_actor=num_envs,
        unroll_length=unroll_length,
        num_env_splits=num_env_splits,
    )
    config.validate()  # monobeast's checks: the lanes must split K evenly
    algorithm = Impala(config, spec)
    acting_policy = algorithm.acting_rule()
    actor_model.share_memory()
    actor_model.eval()
    buffers = RolloutBuffers(
        rollout_spec(
            unroll_length=unroll_length,
            obs=spec.obs_fields(),
            record=acting_policy.record_spec(),
            core_state_shapes=core_state_shapes(actor_model.initial_state(1)),
        ),
        2 * num_envs,
    )
    captured: list[dict[str, torch.Tensor]] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                index = buffers.full_queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            except QueueClosed:
                return
            if len(captured) < count:
                captured.append(buffers.gather([index]))
            try:
                buffers.free_queue.put(index)
            except QueueClosed:
                return

    splits = config.env_splits(policy)
    table = server = None
    if policy == "central":
        table = InferenceTable(
            num_actors=1,
            num_envs=num_envs,
            obs=spec.obs_fields(),
            policy=acting_policy,
            initial_state=actor_model.initial_state(1),
            num_env_splits=splits,
        )
        server = InferenceServer(
            table=table,
            policy=acting_policy,
            model=copy.deepcopy(actor_model),
            source=actor_model,
            device=torch.device("cpu"),
            max_batch=num_envs,
            batch_window=0.0,
            bf16=False,
        )
    actors = ActorPool(
        settings=ActorSettings(
            env=env,
            seed=seed,
            num_actors=1,
            num_envs=num_envs,
            episodic_life=False,
            policy=acting_policy,
            bf16=False,  # an MLP acts in float32, as a CPU run of CartPole does
            num_env_splits=splits,
        ),
        sink=buffers,
        policy_source=table if table is not None else actor_model,
        num_actors=1,
        max_restarts=0,  # a failed actor fails the capture
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    consumer = threading.Thread(target=consume, name="capture-consumer", daemon=True)
    try:
        consumer.start()
        if server is not None:
            server.start()
        actors.start()
        deadline = time.monotonic() + CAPTURE_TIMEOUT
        while len(captured) < count:
            failure = actors.check()
            if failure:
                raise RuntimeError(failure)
            if server is not None and server.failed.is_set():
                raise RuntimeError(f"inference failed: {server.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(captured)} of {count} slots in {CAPTURE_TIMEOUT:.0f} s")
            time.sleep(POLL_SECONDS)
    finally:
        stop.set()
        buffers.close()
        if table is not None:
            table.close()
        consumer.join(JOIN_SECONDS)
        actors.stop(JOIN_SECONDS)
        if server is not None:
            server.stop(JOIN_SECONDS)
    return {key: torch.cat([c[key] for c in captured], dim=1) for key in captured[0]}
