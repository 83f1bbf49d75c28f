"""The Nature-DQN / TorchBeast AtariNet family: its conv torso (also the multi-input
torso's for large images, and the Q-networks' "atari" torso) and the actor-critic
network on it.
"""

from __future__ import annotations

from torch import nn

from beast.models.actor_critic import ImageActorCriticNet
from beast.models.base import (
    _RELU_GAIN,
    _check_image_shape,
    _flat_size,
    _orthogonal_init,
)

__all__ = [
    "AtariNet",
]


def _atari_torso(obs_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The Nature-DQN torso (see AtariNet), initialised; returns (torso, features)."""
    _check_image_shape(obs_shape, "atari")
    convs = nn.Sequential(
        nn.Conv2d(obs_shape[0], 32, kernel_size=8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, kernel_size=3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    torso = nn.Sequential(convs, nn.Linear(_flat_size(convs, obs_shape, "atari"), 512), nn.ReLU())
    _orthogonal_init(torso, _RELU_GAIN)
    return torso, 512


class AtariNet(ImageActorCriticNet):
    """TorchBeast's AtariNet (the Nature-DQN torso) for [C, H, W] images with H, W >= 36.

    conv 32 8x8 s4 -> ReLU -> conv 64 4x4 s2 -> ReLU -> conv 64 3x3 s1 -> ReLU -> fc 512 -> ReLU.
    """

    build_torso = staticmethod(_atari_torso)
