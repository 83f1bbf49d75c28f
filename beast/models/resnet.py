"""The IMPALA deep ResNet family: its residual torso (also the multi-input torso's for
small images, and the Q-networks' "resnet" torso) and the actor-critic network on it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from beast.models.actor_critic import ImageActorCriticNet
from beast.models.base import (
    _RELU_GAIN,
    _check_image_shape,
    _flat_size,
    _orthogonal_init,
)

__all__ = [
    "ResNet",
]


class _ResidualBlock(nn.Module):
    """x + conv(ReLU(conv(ReLU(x)))), 3x3 convs with same padding."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


def _resnet_torso(obs_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The IMPALA deep ResNet torso (see ResNet), initialised; returns (torso, features)."""
    _check_image_shape(obs_shape, "resnet")
    layers: list[nn.Module] = []
    in_channels = obs_shape[0]
    for channels in (16, 32, 32):
        layers += [
            nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            _ResidualBlock(channels),
            _ResidualBlock(channels),
        ]
        in_channels = channels
    convs = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
    torso = nn.Sequential(convs, nn.Linear(_flat_size(convs, obs_shape, "resnet"), 256), nn.ReLU())
    _orthogonal_init(torso, _RELU_GAIN)
    return torso, 256


class ResNet(ImageActorCriticNet):
    """The IMPALA deep ResNet (Espeholt et al. 2018, fig. 3, right) for [C, H, W] images.

    Three sections of 16, 32, 32 channels, each: conv 3x3 -> maxpool 3x3 s2 -> two residual
    blocks; then ReLU -> flatten -> fc 256 -> ReLU. The max-pool pads by 1, which gives
    TensorFlow's "SAME" output size ceil(H / 2) (84 -> 42 -> 21 -> 11).
    """

    build_torso = staticmethod(_resnet_torso)
