"""Models from the user (--model package.module:Name), and the start-up check that any
model, built-in or the user's, returns what the algorithm needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from beast.fields import map_inputs, model_inputs
from beast.models.base import ModelError
from beast.util.references import import_module

__all__ = [
    "build_user_model",
    "check_model",
    "is_user_model",
]


# What a model that does not fit the env raises when built or run on it (a user's model
# written for a Box, given a Dict's shapes): reported in one line, never a traceback.
_MODEL_ERRORS = (TypeError, ValueError, RuntimeError, AttributeError, KeyError, IndexError)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def is_user_model(name: str) -> bool:
    """True for `package.module:Name`, a model given by import path."""
    return ":" in name


def _import_model(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ModelError(f"--model {path!r} is not an import path; write package.module:Name")
    try:
        module = import_module(module_name)
    except ImportError as error:
        missing = getattr(error, "name", None)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ModelError(
                f"--model {path}: cannot import module '{module_name}' (check the path, and"
                " that the package is installed or on PYTHONPATH)"
            ) from None
        raise ModelError(f"--model {path}: importing '{module_name}' failed: {error}") from error
    factory: Any = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ModelError(f"--model {path}: module '{module_name}' has no '{attribute}'")
    if not callable(factory):
        raise ModelError(f"--model {path} is not callable; point it at a class or a factory")
    return factory


def build_user_model(config: Any, spec: Any) -> nn.Module:
    """`Name(obs_shape=..., num_actions=...)` for `--model package.module:Name` (for a
    continuous action space: `Name(obs_shape=..., action_dim=...)`; for a Dict or Tuple
    observation, obs_shape is the leaves' shapes nested as the observation,
    `EnvSpec.model_obs_shape`): an nn.Module with `initial_state(batch_size)` and
    `forward(inputs, core_state)` (the contract of beast/models/__init__.py's docstring;
    docs/models.md). ModelError, one line, when the path does not
    import or the call does not fit."""
    path = config.model
    if getattr(config, "use_last_action_reward", None) is not None:
        raise ModelError(
            f"--use_last_action_reward chooses the built-in networks' inputs; --model {path}"
            " reads what its forward reads (docs/models.md): drop the flag"
        )
    factory = _import_model(path)
    kwargs = {"obs_shape": spec.model_obs_shape()}
    if spec.continuous:
        kwargs["action_dim"] = spec.action_dim
    else:
        kwargs["num_actions"] = spec.num_actions
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as error:
        raise ModelError(
            f"--model {path} must accept ({', '.join(kwargs)}) as keyword arguments for"
            f" {spec.describe_actions()}: {error}"
        ) from None
    except ValueError:  # a callable without a signature (a C function): just call it
        pass
    try:
        model = factory(**kwargs)
    except _MODEL_ERRORS as error:
        raise ModelError(
            f"--model {path} cannot be built for {spec.describe_obs()} observations"
            f" ({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}; docs/models.md):"
            f" {_first_line(error)}"
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"--model {path} returned {type(model).__name__}, not a torch nn.Module")
    if not callable(getattr(model, "initial_state", None)):
        raise ModelError(
            f"--model {path} has no initial_state(batch_size) method; return () from it for"
            " a feed-forward model (docs/models.md)"
        )
    return model


def check_model(
    model: nn.Module, spec: Any, outputs: Mapping[str, tuple[int, ...]], name: str
) -> None:
    """Run `model` once on a [T=2, B=2] batch of zeros shaped like the env's, and check that
    it returns the `outputs` the algorithm needs, `[T, B, *shape]` each, and a state it
    takes back. ModelError (one line naming `name`, the --model flag) otherwise, at
    start-up, rather than a traceback from an actor or the learner."""
    T, B = 2, 2
    obs = spec.obs_fields()
    fields = {
        **{key: torch.zeros((T, B, *f.shape), dtype=f.dtype) for key, f in obs.items()},
        "reward": torch.zeros((T, B)),
        "done": torch.zeros((T, B), dtype=torch.bool),
        "last_action": torch.zeros((T, B, *spec.action_shape), dtype=spec.action_field().dtype),
    }
    inputs = model_inputs(fields)
    try:
        with torch.no_grad():
            state = model.initial_state(B)
            result = model(inputs, state)
            result, state = result
            model(map_inputs(lambda value: value[:1], inputs), state)
    except _MODEL_ERRORS as error:
        raise ModelError(
            f"--model {name} does not run on {spec.describe_obs()} observations"
            " (model(inputs, core_state) -> (outputs, core_state), docs/models.md):"
            f" {_first_line(error)}"
        ) from None
    try:
        got = result if isinstance(result, Mapping) else result._asdict()
    except AttributeError:
        raise ModelError(
            f"--model {name} returned {type(result).__name__} outputs; return a dict (or a"
            f" NamedTuple) with {', '.join(outputs)}"
        ) from None
    for key, shape in outputs.items():
        if key not in got:
            raise ModelError(
                f"--model {name} returns {', '.join(got) or 'nothing'}; this algorithm needs"
                f" {', '.join(f'{k} [T, B{_dims(s)}]' for k, s in outputs.items())}"
            )
        if tuple(got[key].shape) != (T, B, *shape):
            raise ModelError(
                f"--model {name} returns {key} of shape {tuple(got[key].shape)} for T={T},"
                f" B={B}; expected [T, B{_dims(shape)}]"
            )


def _dims(shape: tuple[int, ...]) -> str:
    return "".join(f", {d}" for d in shape)
