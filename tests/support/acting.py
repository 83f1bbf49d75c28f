"""Real IMPALA actor processes filling rollout slots, as a run starts them, with no learner
(beast/run/acting_probe.py): `capture_rollouts` gathers the first full slots
(tests/acting/test_actor_rollouts.py). Nothing here is timed: the capture ends when it
holds its count.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn

from beast import envs
from beast.algos.build import config_for
from beast.algos.impala import Impala
from beast.run.acting_probe import ActorsWithoutLearner

# How often the main thread checks that the actors are alive.
POLL_SECONDS = 0.1
# A bound, not a speed: a capture that gets no slot in this long fails instead of hanging
# (process start, env creation and the first forward pass take seconds on a busy machine).
CAPTURE_TIMEOUT = 300.0


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
    with ActorsWithoutLearner(algorithm, actor_model, policy=policy, capture=count) as probe:
        deadline = time.monotonic() + CAPTURE_TIMEOUT
        while len(probe.captured) < count:
            probe.check()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(probe.captured)} of {count} slots in {CAPTURE_TIMEOUT:.0f} s"
                )
            time.sleep(POLL_SECONDS)
        return probe.rollouts()
