"""Models as a user writes them for `--model tests.support.user_models:Name` (docs/models.md):
plain nn.Modules, no beast base class. `TinyActorCritic`, `TinyGaussianActorCritic` and
`TinyQNetwork` are good; the others are the mistakes the start-up check must catch in one line."""

from __future__ import annotations

import torch
from torch import nn


class _Body(nn.Module):
    def __init__(self, obs_shape: tuple[int, ...], width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(int(torch.tensor(obs_shape).prod()), width), nn.ReLU()
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.flatten(0, 1).float())


class TinyActorCritic(nn.Module):
    """For actor-critic algorithms: policy_logits [T, B, A] and baseline [T, B]."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        self.body = _Body(obs_shape)
        self.hidden = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.policy = nn.Linear(64, num_actions)
        self.value = nn.Linear(64, 1)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        T, B = inputs["obs"].shape[:2]
        x = self.hidden(self.body(inputs["obs"]))
        return {
            "policy_logits": self.policy(x).view(T, B, -1),
            "baseline": self.value(x).view(T, B),
        }, ()


class TinyGaussianActorCritic(nn.Module):
    """For actor-critic algorithms on a Box action space (beast passes action_dim, not
    num_actions): action_mean and action_log_std [T, B, d], baseline [T, B]."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int) -> None:
        super().__init__()
        self.body = _Body(obs_shape)
        self.mean = nn.Linear(64, action_dim)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.value = nn.Linear(64, 1)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        T, B = inputs["obs"].shape[:2]
        x = self.body(inputs["obs"])
        mean = self.mean(x).view(T, B, -1)
        return {
            "action_mean": mean,
            "action_log_std": self.log_std.expand_as(mean),
            "baseline": self.value(x).view(T, B),
        }, ()


class TinyQNetwork(nn.Module):
    """For Q-learning algorithms: q_values [T, B, A]."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        self.body = _Body(obs_shape)
        self.q = nn.Linear(64, num_actions)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        T, B = inputs["obs"].shape[:2]
        return {"q_values": self.q(self.body(inputs["obs"])).view(T, B, -1)}, ()


class NeedsAWidth(TinyActorCritic):
    """A constructor beast cannot call: it needs a third argument."""

    def __init__(self, obs_shape, num_actions, width):
        super().__init__(obs_shape, num_actions)


class NoBaseline(TinyActorCritic):
    """Returns the logits only."""

    def forward(self, inputs, core_state=()):
        outputs, state = super().forward(inputs, core_state)
        return {"policy_logits": outputs["policy_logits"]}, state


class NoInitialState(nn.Module):
    """Forgets initial_state."""

    def __init__(self, obs_shape, num_actions):
        super().__init__()
        self.inner = TinyActorCritic(obs_shape, num_actions)

    def forward(self, inputs, core_state=()):
        return self.inner(inputs, core_state)


class DictActorCritic(nn.Module):
    """For a Dict observation of vectors (DictCartPole-v1): obs_shape is a dict of the
    leaves' shapes, and inputs["obs"] a dict of [T, B, ...] tensors with the same keys."""

    def __init__(self, obs_shape: dict[str, tuple[int, ...]], num_actions: int) -> None:
        super().__init__()
        self.keys = sorted(obs_shape)
        size = sum(int(torch.tensor(obs_shape[key]).prod()) for key in self.keys)
        self.hidden = nn.Sequential(nn.Linear(size, 64), nn.ReLU())
        self.policy = nn.Linear(64, num_actions)
        self.value = nn.Linear(64, 1)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        obs = inputs["obs"]
        T, B = obs[self.keys[0]].shape[:2]
        x = torch.cat([obs[key].reshape(T * B, -1).float() for key in self.keys], dim=1)
        x = self.hidden(x)
        return {
            "policy_logits": self.policy(x).view(T, B, -1),
            "baseline": self.value(x).view(T, B),
        }, ()
