"""beast: a PyTorch engine for scalable deep reinforcement learning.

    import beast
    result = beast.train(env="CartPole-v1", total_steps=200_000)  # any flag by name
    beast.evaluate(result.run_dir, episodes=10)

The Python API is beast/api.py (docs/api.md). Its names are imported on first use, so
that `import beast` stays cheap for the actor processes, which import beast's modules.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_API = {
    "train": "beast.api",
    "evaluate": "beast.api",
    "TrainResult": "beast.api",
    "EvalResult": "beast.evaluate",
    "Config": "beast.config",
    "ConfigError": "beast.config",
    "EnvError": "beast.envs",
    "TrainingError": "beast.runner",
    "CheckpointError": "beast.checkpoint",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'beast' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


class _Package(types.ModuleType):
    """The type of the `beast` module: `beast.evaluate` stays the API's function although
    the submodule beast/evaluate.py (`--mode test`) has its name, and Python binds every
    submodule to its package's attribute when it is first imported. (`from beast.evaluate
    import test` still finds the submodule, in sys.modules.)"""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
