"""A trained policy as one function of tensors: what `beast.load_policy` runs in Python
and what `python -m beast.export` saves for use without beast (docs/export.md).

The policy is the one `--mode test` plays (beast/evaluate.py): the run's checkpoint
(--checkpoint latest or best), its env's spec, its algorithm's network with the
checkpoint's weights, and the algorithm's evaluation policy (`Algorithm.acting_rule(explore=
False)`), whose action `ActingModule` computes with torch ops
(`ActingRule.deterministic_action`, beast/algos/base.py): the most probable action of an
actor-critic (discrete) or its mean action, clipped to the env's bounds (continuous); the
squashed mean action of SAC, TD3 and DDPG in the env's units; a Q-network's greedy action,
without --mode test's `--test_epsilon` random actions. The running observation statistics
of --normalize_obs live in the network (beast/algos/normalize.py), so they come with it.

One step for B envs, batch first (`Signature` names and orders them):

    inputs   the observation's leaves by field name ("obs" for a Box; "obs.position",
             "obs[0]", ... for a Dict or Tuple, beast/fields.py), as the env (made by
             `beast.envs.make`) returns them: [B, *shape];
             reward float32 [B]: the reward that came with the observation (0 at the
             first step), which the networks read as an input;
             done bool [B]: the observation starts an episode (a recurrent state resets);
             the state: last_action (int64 [B], or float32 [B, d], the unclipped action)
             and, for an LSTM, core_state_0 and core_state_1 float32 [B, 1, hidden].
    outputs  action (int64 [B], or float32 [B, d] within the env's bounds), then the next
             state: next_last_action, next_core_state_0, ...

The initial state is zeros, with done set: what --mode test starts an episode from. As
there, the state carries through an episode end (done resets the LSTM's part; the last
action and the reward stay inputs), so feeding it the observations, rewards and done flags
--mode test sees gives its actions.

Preprocessing stays the caller's: the observation is what `beast.envs.make` returns, for
Atari its DeepMind stack (no-op reset, 4-frame skip with max-pooling, 84x84 grayscale, 4
frames stacked: uint8 [4, 84, 84], beast/envs/atari.py), which gymnasium's own
AtariPreprocessing and FrameStackObservation reproduce (docs/export.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from beast import envs
from beast.algos.base import ActingRule, as_outputs
from beast.config import Config, ConfigError
from beast.fields import model_inputs, numpy_dtype, obs_leaf, obs_path
from beast.outputs.checkpoint import CHECKPOINT_NAME, has_checkpoint
from beast.run.parsing import config_from_dict
from beast.run.plan import build_algorithm, build_checked_model
from beast.trained.play import load_test_checkpoint

__all__ = [
    "ActingModule",
    "Policy",
    "Signature",
    "StepFunction",
    "TensorSpec",
    "acting_module",
    "torch_step",
]

# The state's first part; an LSTM's tensors follow as core_state_0, core_state_1, ...
LAST_ACTION = "last_action"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of the exported function, per env: its name, shape without the
    batch axis, and numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class Signature:
    """What the exported function takes and returns (module docstring), and where it came
    from; saved with every export as JSON (`to_json`).

    obs: the observation's leaves. state: last_action, then the core state's tensors.
    num_actions: a Discrete space's size, 0 for a Box. action_low, action_high: a Box's
    bounds. env, algo, xpid, step, checkpoint: the run and the checkpoint it holds.
    """

    obs: tuple[TensorSpec, ...]
    state: tuple[TensorSpec, ...]
    action: TensorSpec
    num_actions: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    env: str
    algo: str
    xpid: str
    step: int
    checkpoint: str

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return (
            *self.obs,
            TensorSpec("reward", (), "float32"),
            TensorSpec("done", (), "bool"),
            *self.state,
        )

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return (self.action, *(dataclasses.replace(s, name=f"next_{s.name}") for s in self.state))

    def to_json(self) -> str:
        return json.dumps(
            {
                **dataclasses.asdict(self),
                "inputs": [dataclasses.asdict(s) for s in self.inputs],
                "outputs": [dataclasses.asdict(s) for s in self.outputs],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Signature:
        values = json.loads(text)

        def specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in items)

        fields = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in values.items() if key in fields}
        return cls(
            **{
                **values,
                "obs": specs(values["obs"]),
                "state": specs(values["state"]),
                "action": specs([values["action"]])[0],
                "action_low": tuple(values["action_low"]),
                "action_high": tuple(values["action_high"]),
            }
        )


class ActingModule(nn.Module):
    """The network and the evaluation policy's action as one module of flat tensors (the
    module docstring's inputs and outputs, batch first), traceable for TorchScript and ONNX.

    Args:
        model: the algorithm's network (checkpoint weights, eval mode).
        rule: its evaluation policy (`Algorithm.acting_rule(explore=False)`).
        spec: the env's spec.
    """

    def __init__(self, model: nn.Module, rule: ActingRule, spec: envs.EnvSpec) -> None:
        super().__init__()
        self.model = model
        self.rule = rule
        self.obs_keys = tuple(spec.obs_fields())
        self.continuous = spec.continuous
        if spec.continuous:
            self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32))
            self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32))

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        n = len(self.obs_keys)
        obs, (reward, done, last_action), core = inputs[:n], inputs[n : n + 3], inputs[n + 3 :]
        # One time step: the networks' [T=1, B, ...] layout, and their [d0, B, ...] states.
        fields = dict(zip(self.obs_keys, obs, strict=True))
        fields.update(reward=reward, done=done, last_action=last_action)
        step_inputs = model_inputs({key: value.unsqueeze(0) for key, value in fields.items()})
        state = tuple(s.transpose(0, 1) for s in core)
        outputs, next_state = self.model(step_inputs, state)
        drawn = self.rule.deterministic_action(as_outputs(outputs))
        # --mode test clips what the env gets (EnvSpec.clip_actions), and the model reads
        # the action unclipped as its next last action.
        action = torch.clamp(drawn, self.action_low, self.action_high) if self.continuous else drawn
        return (action, drawn, *(s.transpose(0, 1) for s in next_state))


def _run_checkpoint(run_dir: str, checkpoint: str) -> tuple[dict[str, Any], str]:
    """The checkpoint of the run in `run_dir` that `checkpoint` (latest, best) names, and
    its path; a one-line ConfigError when there is none."""
    if checkpoint not in ("latest", "best"):
        raise ConfigError(f"checkpoint must be latest or best, got {checkpoint!r}")
    if not os.path.isdir(run_dir):
        raise ConfigError(f"no run directory {run_dir}: pass the SAVEDIR/XPID of a run")
    if checkpoint == "latest" and not has_checkpoint(run_dir):
        raise ConfigError(
            f"no checkpoint at {os.path.join(run_dir, CHECKPOINT_NAME)}: train the run first"
        )
    savedir, xpid = os.path.split(run_dir.rstrip(os.sep))
    return load_test_checkpoint(Config(savedir=savedir, xpid=xpid, checkpoint=checkpoint))


def acting_module(run_dir: str, checkpoint: str = "latest") -> tuple[ActingModule, Signature]:
    """The acting policy of the run in `run_dir`, as `--mode test` builds it (its env's
    spec, algorithm, network and evaluation policy), and its signature.

    Raises:
        ConfigError: no such run or checkpoint; EnvError: the run's env cannot be made.
    """
    saved, path = _run_checkpoint(run_dir, checkpoint)
    try:
        trained = config_from_dict(saved["config"])
    except (KeyError, TypeError) as error:
        raise ConfigError(f"cannot load {path}: {error}") from error
    env = envs.make(trained.env, seed=0)
    try:
        spec = envs.env_spec(env)
    finally:
        env.close()
    algorithm = build_algorithm(trained, spec)
    model = build_checked_model(algorithm)
    model.load_state_dict(saved["model_state_dict"])
    model.eval()
    module = ActingModule(model, algorithm.acting_rule(explore=False), spec).eval()
    action = spec.action_field()
    state = [TensorSpec(LAST_ACTION, tuple(action.shape), str(numpy_dtype(action.dtype)))]
    for i, tensor in enumerate(model.initial_state(1)):
        shape = tuple(tensor.transpose(0, 1).shape[1:])
        state.append(TensorSpec(f"core_state_{i}", shape, str(numpy_dtype(tensor.dtype))))
    signature = Signature(
        obs=tuple(
            TensorSpec(key, tuple(f.shape), str(numpy_dtype(f.dtype)))
            for key, f in spec.obs_fields().items()
        ),
        state=tuple(state),
        action=TensorSpec("action", tuple(action.shape), str(numpy_dtype(action.dtype))),
        num_actions=spec.num_actions,
        action_low=tuple(spec.action_low),
        action_high=tuple(spec.action_high),
        env=str(trained.env),
        algo=str(trained.algo),
        xpid=str(trained.xpid),
        step=int(saved["step"]),
        checkpoint=os.path.basename(path),
    )
    return module, signature


# A policy's function: the signature's inputs, in order, to its outputs.
StepFunction = Callable[[Sequence[Tensor]], Sequence[Tensor]]


class Policy:
    """A trained policy: `act(obs, state)` -> `(action, state)`, from a run or an export.

    Built by `load_policy`. `state` is an opaque tuple of tensors, None at an episode's
    first step; `signature` says what the function underneath takes and returns.
    """

    def __init__(self, step: StepFunction, signature: Signature) -> None:
        self._step = step
        self.signature = signature

    def initial_state(self, batch_size: int = 1) -> tuple[Tensor, ...]:
        """The zero state for `batch_size` envs (what `state=None` means)."""
        return tuple(
            torch.zeros((batch_size, *s.shape), dtype=_torch_dtype(s.dtype))
            for s in self.signature.state
        )

    def act(
        self,
        obs: Any,
        state: tuple[Tensor, ...] | None = None,
        reward: float | np.ndarray = 0.0,
        done: bool | np.ndarray = False,
    ) -> tuple[Any, tuple[Tensor, ...]]:
        """The policy's action for `obs`, and the state to pass with the next observation.

        Args:
            obs: one observation as the env returns it (an array, or a Dict's or Tuple's
                structure of them), or a batch of them ([B, ...] leaves).
            state: what the previous call returned; None starts an episode (zeros, done).
            reward: the reward that came with `obs` (networks read it, module docstring).
            done: `obs` starts a new episode (after a reset that carried the state on).

        Returns:
            The action as the env takes it (numpy: an int64 scalar or a float32 [d], or
            [B] / [B, d] for a batch), and the next state.
        """
        leaves = []
        for spec in self.signature.obs:
            leaf = obs_leaf(obs, obs_path(spec.name))  # a Box's path is (): obs itself
            leaves.append(torch.as_tensor(np.asarray(leaf, dtype=spec.dtype)))
        batched = leaves[0].dim() > len(self.signature.obs[0].shape)
        if not batched:
            leaves = [leaf.unsqueeze(0) for leaf in leaves]
        batch_size = leaves[0].shape[0]
        if state is None:
            state, done = self.initial_state(batch_size), True
        reward = torch.as_tensor(np.broadcast_to(np.float32(reward), (batch_size,)).copy())
        done = torch.as_tensor(np.broadcast_to(np.bool_(done), (batch_size,)).copy())
        outputs = self._step([*leaves, reward, done, *state])
        action = outputs[0].numpy()
        return (action if batched else action[0]), tuple(outputs[1:])


def _torch_dtype(name: str) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=name)).dtype


def torch_step(module: nn.Module) -> StepFunction:
    """The step function of an `ActingModule`, or of its TorchScript trace."""

    def step(inputs: Sequence[Tensor]) -> Sequence[Tensor]:
        with torch.no_grad():
            return module(*inputs)

    return step
