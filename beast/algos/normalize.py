"""Running observation normalisation and return-based reward scaling (--normalize_obs,
--normalize_reward), for every algorithm, saved with the run.

Both are what Stable-Baselines3's VecNormalize does (and what PPO's MuJoCo results
assume), placed where beast's asynchronous actors need them:

- Observations: the statistics live in the model, as buffers of `ObservationNormalizer`,
  which wraps the algorithm's network and normalises `inputs["obs"]` before it:
  ``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)``. A Dict or Tuple observation has
  statistics per float leaf, each normalised on its own; integer leaves (uint8 images,
  which image torsos scale themselves) pass as they are. So local actors (which read the
  shared model), the central inference server, polybeast's env servers, checkpoints and
  --mode test all act with the statistics the weights were trained with, with no other
  channel. The learner updates them from each batch's observations after the update, so
  an update sees the statistics the actors acted with.
- Rewards: divided by the running standard deviation of the discounted return
  ``G_t = r_t + gamma * G_{t-1}`` (reset at episode ends; no mean is subtracted), then
  clipped to +-10. Env batches keep G per env (beast/envs/batch.py, with the algorithm's
  --discounting) and actors store it with each step; `RewardScaler`, in the learner,
  keeps its variance and scales the rewards that the algorithm's loss reads
  (`LearnerContext.scale_rewards`). Models still see the raw reward as an input, as
  they did when acting.

`RunningMeanStd` merges batch moments (Chan et al.'s parallel algorithm), in float64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from beast.fields import OBS_KEY, Field, flatten_obs, nest_obs

__all__ = [
    "CLIP",
    "DISCOUNTED_RETURN_KEY",
    "EPSILON",
    "ObservationNormalizer",
    "RewardScaler",
    "RunningMeanStd",
    "find_observation_normalizer",
]

# VecNormalize's defaults: clip_obs = clip_reward = 10, epsilon = 1e-8.
CLIP = 10.0
EPSILON = 1e-8
# The per-step field that carries each env's running discounted return to the learner.
DISCOUNTED_RETURN_KEY = "discounted_return"


class RunningMeanStd(nn.Module):
    """Mean and variance of everything `update` has seen, per element of `shape`.

    Buffers (float64): mean, var, count. Starts at mean 0, var 1 and a count of 1e-4
    (VecNormalize's), so the first batch dominates at once.
    """

    def __init__(self, shape: Sequence[int] = ()) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, values: Tensor) -> None:
        """Merge `values` ([N, *shape]) into the running moments."""
        values = values.to(device=self.mean.device, dtype=torch.float64).reshape(
            -1, *self.mean.shape
        )
        n = values.shape[0]
        if n == 0:
            return
        batch_mean = values.mean(0)
        batch_var = values.var(0, unbiased=False)
        delta = batch_mean - self.mean
        total = self.count + n
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class ObservationNormalizer(nn.Module):
    """The algorithm's network behind running observation normalisation (module docstring).

    Forwards `initial_state` and every attribute the engine reads from the inner model;
    its state_dict is the inner model's under "model." plus the statistics: a Box's under
    "obs_rms.", a Dict's or Tuple's float leaves' under "leaf_rms.0.", "leaf_rms.1." ...
    in field order.

    Args:
        model: the network.
        obs: the observation's fields (`EnvSpec.obs_fields()`); its float ones get
            statistics.
    """

    def __init__(self, model: nn.Module, obs: Mapping[str, Field]) -> None:
        super().__init__()
        self.model = model
        self.keys = tuple(key for key, f in obs.items() if f.dtype.is_floating_point)
        statistics = [RunningMeanStd(obs[key].shape) for key in self.keys]
        if self.keys == (OBS_KEY,):
            self.obs_rms = statistics[0]  # the name checkpoints of Box runs hold
        else:
            self.leaf_rms = nn.ModuleList(statistics)

    def statistics(self) -> dict[str, RunningMeanStd]:
        """The running statistics by observation field."""
        modules = [self.obs_rms] if self.keys == (OBS_KEY,) else list(self.leaf_rms)
        return dict(zip(self.keys, modules, strict=True))

    def initial_state(self, batch_size: int, device: Any = None) -> tuple[Tensor, ...]:
        if device is None:
            return self.model.initial_state(batch_size)
        return self.model.initial_state(batch_size, device)

    def normalize(self, obs: Any) -> Any:
        """float32 obs [..., *obs_shape] -> clip((obs - mean) / std, -10, 10); for a Dict
        or Tuple observation (its structure of tensors), each float leaf with its own
        statistics."""
        if isinstance(obs, Tensor):
            return _normalize(obs, self.obs_rms)
        leaves = flatten_obs(obs)
        for key, rms in self.statistics().items():
            leaves[key] = _normalize(leaves[key], rms)
        return nest_obs(leaves)

    def forward(self, inputs: Mapping[str, Any], core_state: Any = ()) -> Any:
        return self.model({**inputs, "obs": self.normalize(inputs["obs"])}, core_state)

    @torch.no_grad()
    def observe(self, batch: Mapping[str, Tensor]) -> None:
        """Update the statistics with a learner batch's observations, `[L, B, ...]` per
        field (rows 1..L-1: row 0 of a rollout repeats the last row of the one before)."""
        for key, rms in self.statistics().items():
            rms.update(batch[key][1:])


def _normalize(obs: Tensor, rms: RunningMeanStd) -> Tensor:
    mean = rms.mean.to(torch.float32)
    std = torch.sqrt(rms.var + EPSILON).to(torch.float32)
    return ((obs.float() - mean) / std).clamp(-CLIP, CLIP)


def find_observation_normalizer(model: nn.Module) -> ObservationNormalizer | None:
    """The model's normaliser (--normalize_obs), unwrapped from torch.compile; or None."""
    model = getattr(model, "_orig_mod", model)
    return model if isinstance(model, ObservationNormalizer) else None


class RewardScaler:
    """Scales a batch's rewards by the running std of the discounted return (module
    docstring); state_dict/load_state_dict for the checkpoint."""

    def __init__(self) -> None:
        self.return_rms = RunningMeanStd()

    @torch.no_grad()
    def observe(self, batch: Mapping[str, Tensor]) -> None:
        """Update the variance with a batch's discounted returns (rows 1..L-1)."""
        self.return_rms.update(batch[DISCOUNTED_RETURN_KEY][1:].flatten())

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        """The batch's rewards, `[L, B]`, scaled and clipped."""
        rewards = batch["reward"]
        std = float(torch.sqrt(self.return_rms.var + EPSILON))
        return (rewards / std).clamp(-CLIP, CLIP)

    def state_dict(self) -> dict[str, Tensor]:
        return self.return_rms.state_dict()

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.return_rms.load_state_dict(state)
