"""What every built-in network shares: its outputs, its recurrent state, the shapes it is
built from, the model names and widths, orthogonal initialisation, and the float
observations every torso reads. The input contract is the package docstring's
(beast/models/__init__.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beast.fields import map_inputs

__all__ = [
    "ACTIVATIONS",
    "ATARI_MIN_SIZE",
    "AgentOutput",
    "CoreState",
    "DEFAULT_LSTM_SIZE",
    "DEFAULT_MLP_HIDDEN_SIZE",
    "GaussianAgentOutput",
    "MODEL_NAMES",
    "ModelError",
    "ObsShape",
    "float_obs",
    "time_and_batch",
]


MODEL_NAMES = ("auto", "atari", "resnet", "mlp", "separate_mlp")
# Hidden-layer activations of the MLP torsos (--activation).
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
# One observation's shape (a Box), or a Dict's or Tuple's leaves' shapes nested as the
# observation is (`EnvSpec.model_obs_shape`): what models are built from.
ObsShape = Sequence[Any] | Mapping[str, Any]
# The smallest image side AtariNet's torso takes (8x8 s4, 4x4 s2, 3x3 s1 convolutions).
ATARI_MIN_SIZE = 36

# Width of the LSTM core of the image models, as in the IMPALA paper (fig. 3).
DEFAULT_LSTM_SIZE = 256
# Width of both hidden layers of MLPNet (and of its LSTM): CleanRL's and Stable-Baselines3's
# default for classic control.
DEFAULT_MLP_HIDDEN_SIZE = 64
# Orthogonal-init gains; the ReLU gain is torch.nn.init.calculate_gain("relu").
_RELU_GAIN = math.sqrt(2.0)
_POLICY_GAIN = 0.01
_BASELINE_GAIN = 1.0


class AgentOutput(NamedTuple):
    """What a model returns for each step.

    policy_logits: float32 [T, B, num_actions], unnormalised log-probabilities.
    baseline: float32 [T, B], the value estimate V(x_t).
    """

    policy_logits: Tensor
    baseline: Tensor


class GaussianAgentOutput(NamedTuple):
    """What a model returns for each step with continuous actions of dimension d.

    action_mean: float32 [T, B, d], the Gaussian's mean (unbounded: env batches clip
        the drawn action to the action space's bounds).
    action_log_std: float32 [T, B, d], log standard deviations.
    baseline: float32 [T, B], the value estimate V(x_t).
    """

    action_mean: Tensor
    action_log_std: Tensor
    baseline: Tensor


CoreState = tuple[Tensor, ...]
"""``()`` for feed-forward models; ``(h, c)``, each float32 [1, B, lstm_size], for the LSTM."""


def _orthogonal_init(module: nn.Module, gain: float) -> None:
    """Orthogonal weights with ``gain`` and zero biases for every conv/linear in ``module``."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _flat_size(module: nn.Module, in_shape: tuple[int, ...], model_name: str) -> int:
    """Features per sample that ``module`` outputs for one input of ``in_shape``.

    Found by a dummy pass so the models work for any [C, H, W]; a conv stack that would shrink
    the image below 1x1 becomes a one-line ValueError instead of a PyTorch shape error.
    """
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, *in_shape))
    except RuntimeError:
        raise ValueError(
            f"obs_shape {in_shape} is too small for the {model_name} conv torso; "
            "use 'resnet' or 'mlp' for small images"
        ) from None
    return out[0].numel()


def _check_image_shape(obs_shape: tuple[int, ...], model_name: str) -> None:
    if len(obs_shape) != 3:
        raise ValueError(
            f"the {model_name} model needs image observations [C, H, W], got obs_shape "
            f"{obs_shape}; use 'mlp' for vectors"
        )


def float_obs(obs: Any) -> Any:
    """[T, B, ...] observations (a tensor, or a Dict's or Tuple's structure of them) as
    float32 [T*B, ...]: uint8 pixels scaled by 1/255 here rather than by the caller, so
    rollouts store bytes."""
    if isinstance(obs, Tensor):
        return _float_leaf(obs)
    return map_inputs(_float_leaf, obs)


def _float_leaf(obs: Tensor) -> Tensor:
    x = obs.flatten(0, 1)
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def time_and_batch(obs: Any) -> tuple[int, int]:
    """T and B of [T, B, ...] observations (of the first leaf of a Dict or Tuple)."""
    while not isinstance(obs, Tensor):
        obs = next(iter(obs.values())) if isinstance(obs, Mapping) else obs[0]
    return obs.shape[:2]


def _obs_shape(obs_shape: ObsShape) -> ObsShape:
    """A Box's shape as a tuple of ints; a Dict's or Tuple's structure as it is."""
    return tuple(int(d) for d in obs_shape) if _is_shape(obs_shape) else obs_shape


def _is_shape(value: Any) -> bool:
    """Whether `value` is one observation's shape (a tuple of ints), rather than a Dict's
    or Tuple's structure of shapes (`EnvSpec.model_obs_shape`)."""
    return isinstance(value, tuple | list) and all(isinstance(d, int) for d in value)


class ModelError(ValueError):
    """A network that cannot be built or does not fit the algorithm or the env; the message
    is one line for the user (entry points exit 2)."""
