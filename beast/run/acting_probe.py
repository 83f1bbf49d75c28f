"""Real actor processes filling rollout slots with no learner: what measures acting
(benchmarks/bench.py `measure_acting`) and what tests check an actor's rollouts with
(tests/support/acting.py) both start, as beast/run/measure.py's other measurements are
shared; the runtime never imports the benchmarks or the tests.

The actors start as `beast.run.runner.train` starts them: forkserver, the supervisor's
`ActorPool` running `run_actor`, shared `RolloutBuffers` and a shared-memory model, or,
with `policy="central"`, an inference server in this process serving them. A consumer
thread takes each full slot and puts it straight back on the free queue, so the actors
never wait on a learner; it records when each slot arrived and keeps the first
`capture` of them.
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from beast.acting.actor import ActorSettings
from beast.acting.inference import InferenceServer, InferenceTable
from beast.acting.supervisor import ActorPool
from beast.algos.base import Algorithm
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.fields import core_state_shapes
from beast.native import QueueClosed

__all__ = ["ActorsWithoutLearner"]

# How often the consumer looks at its stop flag while no slot is full.
_POLL_SECONDS = 0.1
# Seconds actors get to exit after the queues close before they are killed (as the runner).
_JOIN_SECONDS = 5.0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ActorsWithoutLearner:
    """The actors of `algorithm`'s config (`num_actors` of `num_envs_per_actor` envs of
    `env`, `unroll_length`, `--num_env_splits` for `policy`) acting with `actor_model`
    through its acting rule, in a `with` block (module docstring). No restarts: a failed
    actor or inference server is an error at the next `check`.

    Args:
        num_buffers: rollout slots; default twice the slots the actors hold at a time.
        policy: "local" (each actor runs the model) or "central" (one inference thread
            here, batches of up to all envs, `inference_timeout_ms` batch window).
        bf16: act under bf16 autocast.
        capture: keep this many full slots (`rollouts`).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        actor_model: nn.Module,
        *,
        num_buffers: int | None = None,
        policy: str = "local",
        bf16: bool = False,
        inference_timeout_ms: float = 0.0,
        capture: int = 0,
        log: Callable[[str], None] = _stderr,
    ) -> None:
        if policy not in ("local", "central"):
            raise ValueError(f"policy must be local or central, got {policy!r}")
        config, spec = algorithm.config, algorithm.spec
        rule = algorithm.acting_rule()
        actor_model.share_memory()
        actor_model.eval()
        slots_held = config.num_actors * config.num_envs_per_actor
        num_buffers = num_buffers or 2 * slots_held
        if num_buffers < slots_held:
            raise ValueError(
                f"num_buffers must be >= num_actors * num_envs_per_actor ({slots_held})"
            )
        self.capture = capture
        self.buffers = RolloutBuffers(
            rollout_spec(
                unroll_length=config.unroll_length,
                obs=spec.obs_fields(),
                record=rule.record_spec(),
                core_state_shapes=core_state_shapes(actor_model.initial_state(1)),
            ),
            num_buffers,
        )
        self.arrivals: list[float] = []  # perf_counter time of every full slot
        self.captured: list[dict[str, torch.Tensor]] = []
        self._stop = threading.Event()
        splits = config.env_splits(policy)
        self.table: InferenceTable | None = None
        self.server: InferenceServer | None = None
        if policy == "central":
            self.table = InferenceTable(
                num_actors=config.num_actors,
                num_envs=config.num_envs_per_actor,
                obs=spec.obs_fields(),
                policy=rule,
                initial_state=actor_model.initial_state(1),
                num_env_splits=splits,
            )
            self.server = InferenceServer(
                table=self.table,
                policy=rule,
                model=copy.deepcopy(actor_model),
                source=actor_model,
                device=torch.device("cpu"),
                max_batch=slots_held,
                batch_window=inference_timeout_ms / 1000.0,
                bf16=bf16,
            )
        self.actors = ActorPool(
            settings=ActorSettings(
                env=config.env,
                seed=config.seed,
                num_actors=config.num_actors,
                num_envs=config.num_envs_per_actor,
                episodic_life=False,
                policy=rule,
                bf16=bf16,
                num_env_splits=splits,
            ),
            sink=self.buffers,
            policy_source=self.table if self.table is not None else actor_model,
            num_actors=config.num_actors,
            max_restarts=0,
            log=log,
        )
        self._consumer = threading.Thread(target=self._consume, name="probe-consumer", daemon=True)

    def _consume(self) -> None:
        buffers = self.buffers
        while not self._stop.is_set():
            try:
                index = buffers.full_queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            except QueueClosed:
                return
            if len(self.captured) < self.capture:
                self.captured.append(buffers.gather([index]))
            self.arrivals.append(time.perf_counter())
            try:
                buffers.free_queue.put(index)
            except QueueClosed:
                return

    def __enter__(self) -> ActorsWithoutLearner:
        self._consumer.start()
        if self.server is not None:
            self.server.start()
        self.actors.start()
        return self

    def check(self) -> None:
        """RuntimeError when an actor exited or the inference server failed."""
        failure = self.actors.check()
        if failure:
            raise RuntimeError(failure)
        if self.server is not None and self.server.failed.is_set():
            raise RuntimeError(f"inference failed: {self.server.error!r}")

    def rollouts(self) -> dict[str, torch.Tensor]:
        """The captured slots as one batch, [unroll_length + 1, captured] per field."""
        return {key: torch.cat([c[key] for c in self.captured], dim=1) for key in self.captured[0]}

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.buffers.close()
        if self.table is not None:
            self.table.close()
        self._consumer.join(_JOIN_SECONDS)
        self.actors.stop(_JOIN_SECONDS)
        if self.server is not None:
            self.server.stop(_JOIN_SECONDS)
