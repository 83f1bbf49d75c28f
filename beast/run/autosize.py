"""`--num_envs_per_actor auto` and `--num_actors auto`: the actor layout from a short measurement.

Run in the learner process at start-up, before any actor exists, so the cores are free.

num_envs_per_actor: the actor's own loop (K envs stepped one after the other, one
batched policy call for all K) timed in CPU-seconds per agent step for each K in
`ENV_CANDIDATES`. A larger K spreads the policy call's fixed cost (and, for the real
model, makes its forward pass cheaper per sample) over more envs, but every rollout
takes K times longer to fill, so the learner's batches grow staler. The pick is the
smallest K within `K_TOLERANCE` of the cheapest.

num_actors: with the learner on a GPU, every core but one (kept for the learner
process's own thread and the inference threads). With a CPU learner, actors and learner
share the cores in proportion to their measured CPU cost per agent step, acting
(above) against one learner update on a synthetic batch: actors get
``ceil(cores * acting / (acting + learning))`` of them, at least one. An extra actor
beyond that only waits for free slots while the learner catches up.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from beast.acting.actor import policy_inputs
from beast.acting.inference import LocalInference
from beast.algos.base import Algorithm
from beast.config import AUTO, Config, ConfigError
from beast.envs.batch import LoopEnvBatch, make_env_batch
from beast.run.measure import TrivialModel, learning_cost, torch_threads

__all__ = ["ENV_CANDIDATES", "K_TOLERANCE", "acting_cost", "resolve_actor_layout"]

ENV_CANDIDATES = (1, 2, 4, 8, 16)
K_TOLERANCE = 0.05
# CPU time measured per candidate K, after the warm-up steps.
_MEASURE_SECONDS = 0.4
_WARMUP_STEPS = 3


def acting_cost(
    config: Config,
    algorithm: Algorithm,
    model: torch.nn.Module,
    num_envs: int,
    seconds: float = _MEASURE_SECONDS,
) -> float:
    """CPU-seconds per agent step of an actor's loop with `num_envs` envs and `model`
    acting through the algorithm's policy (one torch thread, as actors run)."""
    batch = make_env_batch(
        config.env, num_envs, config.seed, config.episodic_life, config.env_backend
    )
    # The C++ backends step the envs in worker threads: count the whole process's CPU
    # time then (its other threads idle during the measurement), this thread's otherwise.
    clock = time.thread_time if isinstance(batch, LoopEnvBatch) else time.process_time
    try:
        policy = LocalInference(model, algorithm.acting_rule(), num_envs)
        last_action = np.zeros_like(policy.record["action"])
        inputs = policy_inputs(batch, last_action)
        steps, start = -_WARMUP_STEPS, 0.0
        with torch_threads(1), torch.no_grad():
            while True:
                if steps == 0:
                    start = clock()
                action = policy.act(inputs)["action"]
                np.copyto(last_action, action)
                batch.step(action)
                steps += 1
                elapsed = clock() - start
                if steps > 0 and elapsed >= seconds:
                    return elapsed / (steps * num_envs)
    finally:
        batch.close()


def resolve_actor_layout(
    config: Config,
    algorithm: Algorithm,
    device: torch.device,
    policy: str,
    precision: str,
    log: Callable[[str], None] = print,
) -> Config:
    """`config` with num_actors / num_envs_per_actor "auto" replaced by measured values
    (and num_buffers derived from them unless it was given); unchanged when neither is
    auto. The actors' model is `algorithm`'s (measured under --policy local)."""
    if AUTO not in (config.num_actors, config.num_envs_per_actor):
        return config
    # Under --policy central the actors' own cost excludes the forward pass.
    model = (
        algorithm.build_model().eval()
        if policy == "local"
        else TrivialModel(algorithm.model_outputs())
    )
    if algorithm.experience().measured_item(algorithm.experience_layout(model)) is None:
        raise ConfigError(
            f"--num_actors / --num_envs_per_actor auto measure an actor filling rollouts"
            f" against the learner's update on them; give numbers with --algo {config.algo}"
        )
    num_envs = config.num_envs_per_actor
    costs: dict[int, float] = {}
    if num_envs == AUTO:
        costs = {k: acting_cost(config, algorithm, model, k) for k in ENV_CANDIDATES}
        best = min(costs.values())
        num_envs = min(k for k, cost in costs.items() if cost <= best * (1 + K_TOLERANCE))
        table = ", ".join(f"{k}: {1e3 * cost:.3f}" for k, cost in costs.items())
        log(
            f"--num_envs_per_actor auto: {num_envs} (acting core-ms per agent step by K, {table};"
            f" the smallest K within {K_TOLERANCE:.0%} of the cheapest)"
        )
    num_actors = config.num_actors
    if num_actors == AUTO:
        cores = len(os.sched_getaffinity(0))
        if device.type == "cuda":
            num_actors = max(1, cores - 1)
            log(f"--num_actors auto: {num_actors} (learner on {device}: {cores} cores less one)")
        else:
            acting = costs.get(num_envs) or acting_cost(config, algorithm, model, num_envs)
            learning = learning_cost(algorithm, bf16=precision == "bf16", num_threads=1)
            share = acting / (acting + learning)
            num_actors = min(cores, max(1, math.ceil(cores * share)))
            log(
                f"--num_actors auto: {num_actors} of {cores} cores (acting {1e3 * acting:.3f},"
                f" learning {1e3 * learning:.3f} core-ms per agent step: the actors' share of"
                f" the CPU is {share:.0%})"
            )
    num_buffers = config.num_buffers or config.default_num_buffers(num_actors * num_envs)
    resolved = dataclasses.replace(
        config, num_actors=num_actors, num_envs_per_actor=num_envs, num_buffers=num_buffers
    )
    resolved.validate()
    return resolved
