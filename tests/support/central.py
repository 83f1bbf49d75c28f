"""A central-inference table and server over a small categorical policy, as the learner
builds them (tests/acting/test_inference.py, tests/end_to_end/test_dict_observations.py)."""

from __future__ import annotations

import numpy as np
import torch

from beast.acting.inference import InferenceServer, InferenceTable
from beast.algos.policies import CategoricalPolicy
from beast.fields import box_obs

OBS_SHAPE = (4,)


NUM_ACTIONS = 3


POLICY = CategoricalPolicy(NUM_ACTIONS)


def make_table(
    model, num_actors: int, num_envs: int, num_servers: int = 1, num_env_splits: int = 1
) -> InferenceTable:
    return InferenceTable(
        num_actors=num_actors,
        num_envs=num_envs,
        obs=box_obs(OBS_SHAPE, np.float32),
        policy=POLICY,
        initial_state=model.initial_state(1),
        num_servers=num_servers,
        num_env_splits=num_env_splits,
    )


def make_server(table, model, source, **kwargs) -> InferenceServer:
    defaults = dict(
        table=table,
        policy=POLICY,
        model=model,
        source=source,
        device=torch.device("cpu"),
        max_batch=len(table.inputs["reward"]),
        batch_window=0.0,
    )
    return InferenceServer(**{**defaults, **kwargs})
