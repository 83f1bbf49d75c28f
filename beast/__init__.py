"""beast: a PyTorch engine for scalable deep reinforcement learning.

    import beast
    result = beast.train(env="CartPole-v1", total_steps=200_000)  # any flag by name
    beast.evaluate(result.run_dir, episodes=10)
    policy = beast.load_policy(result.run_dir)  # action, state = policy.act(obs, state)

The Python API is beast/api.py (docs/api.md). Its names are imported on first use, so
that `import beast` stays cheap for the actor processes, which import beast's modules.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_API = {
    "train": "beast.api",
    "evaluate": "beast.api",
    "TrainResult": "beast.api",
    "export": "beast.api",
    "load_policy": "beast.api",
    "Policy": "beast.trained.policy",
    "EvalResult": "beast.trained.play",
    "Config": "beast.config",
    "ConfigError": "beast.config",
    "EnvError": "beast.envs",
    "TrainingError": "beast.run.lifecycle",
    "CheckpointError": "beast.outputs.checkpoint",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'beast' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
