"""The actor and the critics of DDPG, TD3 and SAC, in one module the engine runs.

The engine acts with ``model(inputs, core_state)``, like any algorithm's network; the
learner also calls ``model.critic(inputs, actions)``. What a network (built-in, or the
user's ``--model package.module:Name``, built with ``obs_shape=`` (for a Dict or Tuple
observation, the leaves' shapes nested) and ``action_dim=``) provides:

    forward(inputs, core_state) -> ({"action_mean": [T, B, d]}, ())
        the actor, before the tanh that puts actions in the unit box (the policy and the
        learner apply it); a stochastic actor (SAC) also returns
        "action_log_std" [T, B, d]
    critic(inputs, actions) -> float [C, T, B]
        a submodule: C critics' Q(x, a), actions [T, B, d] in the unit box [-1, 1]^d
    initial_state(batch_size) -> ()

Every parameter outside `critic` is the actor's (its optimizer takes them). Inputs follow
beast.models' contract; these read only ``inputs["obs"]``.

The built-in network is Stable-Baselines3's MlpPolicy for these algorithms: separate
MLPs of ``net_arch`` widths with ReLU for the actor and for each critic (the critic on
``[obs, action]``), PyTorch's default initialisation; SAC's actor has a mean and a
log-std head, the log-std clamped to [-20, 2]. The C critics are one `EnsembleMLP`: a
batched matrix product per layer evaluates them all, where C separate networks take C.
A Dict or Tuple observation goes through a `MultiInputTorso` without MLP (its vector
leaves concatenated, a conv torso per image leaf) before the actor, and through another
before the critics, as Stable-Baselines3's MultiInputPolicy gives the actor and the
critics their own CombinedExtractor; for a vector Box that torso is the plain flatten.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from beast.models import MultiInputTorso, ObsShape, float_obs, time_and_batch

__all__ = ["ActorCriticQNet", "EnsembleMLP", "LOG_STD_MAX", "LOG_STD_MIN"]

# SB3's (and the SAC reference implementation's) clamp of the actor's log-std head.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers between consecutive `sizes`, ReLU between them (not after the last)."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class EnsembleMLP(nn.Module):
    """`num_members` independent MLPs of the same widths, run as one batched product per
    layer: ``[C, N, in] -> [C, N, out]`` (an ``[N, in]`` input goes to every member).

    Each member's layers start as ``nn.Linear``'s do (uniform in +-1/sqrt(fan_in)), so an
    ensemble of one is an ordinary MLP.
    """

    def __init__(self, num_members: int, sizes: Sequence[int]) -> None:
        super().__init__()
        self.num_members = num_members
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / math.sqrt(n_in)
            self.weights.append(nn.Parameter(torch.empty(num_members, n_in, n_out)))
            self.biases.append(nn.Parameter(torch.empty(num_members, 1, n_out)))
            nn.init.uniform_(self.weights[-1], -bound, bound)
            nn.init.uniform_(self.biases[-1], -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num_members, -1, -1)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                x = torch.relu(x)
        return x


class _Critics(nn.Module):
    """C critics Q_i(x, a) on ``[obs features, action]``: ``(inputs, actions) -> [C, T, B]``."""

    def __init__(
        self, obs_shape: ObsShape, action_dim: int, hidden: Sequence[int], num_critics: int
    ) -> None:
        super().__init__()
        self.torso = MultiInputTorso(obs_shape, hidden_size=None)
        self.net = EnsembleMLP(num_critics, [self.torso.size + action_dim, *hidden, 1])

    def forward(self, inputs: Mapping[str, Tensor], actions: Tensor) -> Tensor:
        obs = inputs["obs"]
        T, B = time_and_batch(obs)
        x = torch.cat([self.torso(float_obs(obs)), actions.reshape(T * B, -1).float()], 1)
        return self.net(x).view(-1, T, B)


class ActorCriticQNet(nn.Module):
    """The built-in network (module docstring).

    Args:
        obs_shape: one observation's shape (flattened for the MLPs), or a Dict's or
            Tuple's leaves' shapes, nested (`EnvSpec.model_obs_shape`).
        action_dim: d.
        hidden_sizes: the widths of every MLP's hidden layers (SB3's net_arch).
        num_critics: C (2 for TD3 and SAC, 1 for DDPG).
        stochastic: a log-std head too (SAC).
    """

    def __init__(
        self,
        obs_shape: ObsShape,
        action_dim: int,
        *,
        hidden_sizes: Sequence[int] = (256, 256),
        num_critics: int = 2,
        stochastic: bool = True,
    ) -> None:
        super().__init__()
        if action_dim < 1 or num_critics < 1 or not hidden_sizes or min(hidden_sizes) < 1:
            raise ValueError(
                f"need action_dim, num_critics and hidden sizes >= 1, got {action_dim},"
                f" {num_critics}, {tuple(hidden_sizes)}"
            )
        self.action_dim = action_dim
        self.stochastic = stochastic
        heads = 2 * action_dim if stochastic else action_dim
        self.actor_torso = MultiInputTorso(obs_shape, hidden_size=None)
        self.actor = _mlp([self.actor_torso.size, *hidden_sizes, heads])
        self.critic = _Critics(obs_shape, action_dim, hidden_sizes, num_critics)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> tuple:
        return ()

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: tuple = ()
    ) -> tuple[dict[str, Tensor], tuple]:
        obs = inputs["obs"]
        T, B = time_and_batch(obs)
        out = self.actor(self.actor_torso(float_obs(obs))).view(T, B, -1)
        if not self.stochastic:
            return {"action_mean": out}, ()
        mean, log_std = out.split(self.action_dim, dim=-1)
        return {
            "action_mean": mean,
            "action_log_std": log_std.clamp(LOG_STD_MIN, LOG_STD_MAX),
        }, ()
