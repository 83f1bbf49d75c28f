"""Algorithms, found by name: adding one touches its module, its configs, its tests and
one line of `ALGORITHMS` (beast/algos/base.py says what the class declares)."""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from beast.algos.base import Algorithm

__all__ = ["ALGORITHMS", "algorithm_class"]

# --algo name -> "module:Class". Imported on first use, so listing the names (the
# parser's choices) costs nothing.
ALGORITHMS: dict[str, str] = {
    "impala": "beast.algos.impala:Impala",
    "laser": "beast.algos.laser:Laser",
    "r2d2": "beast.algos.r2d2:R2D2",
    "apex": "beast.algos.apex:ApeX",
    "ppo": "beast.algos.ppo:PPO",
    "a2c": "beast.algos.ppo:A2C",
    "dqn": "beast.algos.dqn:DQN",
    "c51": "beast.algos.dqn:C51",
    "rainbow": "beast.algos.dqn:Rainbow",
    "ddpg": "beast.algos.qpg.ddpg:DDPG",
    "td3": "beast.algos.qpg.td3:TD3",
    "sac": "beast.algos.qpg.sac:SAC",
}


@functools.cache
def algorithm_class(name: str) -> type[Algorithm]:
    """The Algorithm class registered as `name`; KeyError for an unknown one."""
    module, _, attribute = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
