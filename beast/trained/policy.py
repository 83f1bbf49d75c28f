"""A trained policy as one function of tensors: what `beast.load_policy` runs in Python
and what `python -m beast.export` saves for use without beast (docs/export.md).

The policy is the one `--mode test` plays (beast/trained/play.py): the run's checkpoint
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
             first step), for a network that reads it (--use_last_action_reward);
             done bool [B]: the observation starts an episode, for a recurrent network
             (its state resets);
             the state: last_action (int64 [B], or float32 [B, d], the unclipped action),
             for a network that reads it, and, for an LSTM, core_state_0 and core_state_1
             float32 [B, 1, hidden].
    outputs  action (int64 [B], or float32 [B, d] within the env's bounds), then the next
             state: next_last_action, next_core_state_0, ...

Only what the network reads is an input (`inputs_read`): a feed-forward policy that acts
on the observation alone (PPO's and SAC's, a feed-forward mlp) takes the observation and
returns the action, and has no state.

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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from beast import envs
from beast.algos.base import ActingRule, as_outputs
from beast.algos.build import build_algorithm, build_checked_model, config_from_dict
from beast.config import Config, ConfigError
from beast.fields import model_inputs, numpy_dtype, obs_leaf, obs_path
from beast.outputs.checkpoint import CHECKPOINT_NAME, has_checkpoint
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
# The inputs besides the observation and the core state, in their order; a policy takes
# those its network reads.
STEP_INPUTS = ("reward", "done", LAST_ACTION)
# The batch size of the example inputs a trace or an export runs once; the files take any.
_EXAMPLE_BATCH = 2


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of the exported function, per env: its name, shape without the
    batch axis, and numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


# The step inputs that are no state, as a signature lists them.
_STEP_SPECS = (TensorSpec("reward", (), "float32"), TensorSpec("done", (), "bool"))


@dataclasses.dataclass(frozen=True)
class Signature:
    """What the exported function takes and returns (module docstring), and where it came
    from; saved with every export as JSON (`to_json`).

    obs: the observation's leaves. step_inputs: reward and done, those the network reads.
    state: last_action (if read), then the core state's tensors. num_actions: a Discrete
    space's size, 0 for a Box. action_low, action_high: a Box's bounds. env, algo, xpid,
    step, checkpoint: the run and the checkpoint it holds.
    """

    obs: tuple[TensorSpec, ...]
    step_inputs: tuple[TensorSpec, ...]
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
        return (*self.obs, *self.step_inputs, *self.state)

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
        # Files written before the inputs followed the network took reward and done.
        step_inputs = values.get("step_inputs", [dataclasses.asdict(s) for s in _STEP_SPECS])
        return cls(
            **{
                **values,
                "obs": specs(values["obs"]),
                "step_inputs": specs(step_inputs),
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
        reads: the STEP_INPUTS it takes (those the network reads, `inputs_read`); the
            network gets zeros for the others.
    """

    def __init__(
        self,
        model: nn.Module,
        rule: ActingRule,
        spec: envs.EnvSpec,
        reads: Sequence[str] = STEP_INPUTS,
    ) -> None:
        super().__init__()
        self.model = model
        self.rule = rule
        self.obs_keys = tuple(spec.obs_fields())
        self.reads = tuple(name for name in STEP_INPUTS if name in reads)
        action = spec.action_field()
        self.action_shape, self.action_dtype = tuple(action.shape), action.dtype
        self.continuous = spec.continuous
        if spec.continuous:
            self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32))
            self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32))

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        n, m = len(self.obs_keys), len(self.reads)
        obs, core = inputs[:n], inputs[n + m :]
        given = dict(zip(self.reads, inputs[n : n + m], strict=True))
        batch = obs[0].shape[0]
        # One time step: the networks' [T=1, B, ...] layout, and their [d0, B, ...] states.
        # The network takes every field; those it does not read are zeros.
        fields = dict(zip(self.obs_keys, obs, strict=True))
        zeros = {
            "reward": ((batch,), torch.float32),
            "done": ((batch,), torch.bool),
            LAST_ACTION: ((batch, *self.action_shape), self.action_dtype),
        }
        for name, (shape, dtype) in zeros.items():
            fields[name] = given[name] if name in given else torch.zeros(shape, dtype=dtype)
        step_inputs = model_inputs({key: value.unsqueeze(0) for key, value in fields.items()})
        state = tuple(s.transpose(0, 1) for s in core)
        outputs, next_state = self.model(step_inputs, state)
        drawn = self.rule.deterministic_action(as_outputs(outputs))
        # --mode test clips what the env gets (EnvSpec.clip_actions), and the model reads
        # the action unclipped as its next last action.
        action = torch.clamp(drawn, self.action_low, self.action_high) if self.continuous else drawn
        next_last_action = (drawn,) if LAST_ACTION in given else ()
        return (action, *next_last_action, *(s.transpose(0, 1) for s in next_state))


def example_inputs(signature: Signature) -> tuple[Tensor, ...]:
    """Zeros for every input of `signature`, [2, ...], done set (a first step): what a
    trace or an export runs once."""
    inputs = []
    for spec in signature.inputs:
        value = np.zeros((_EXAMPLE_BATCH, *spec.shape), dtype=spec.dtype)
        if spec.name == "done":
            value[:] = True
        inputs.append(torch.from_numpy(value))
    return tuple(inputs)


def inputs_read(module: ActingModule, signature: Signature) -> tuple[str, ...]:
    """The STEP_INPUTS that `module` (taking them all, as `signature` lists) reads: those
    its traced graph uses. A network of one's own that cannot be traced is taken to read
    them all."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            # The tracer's warnings are of the Python branches it records, fixed here.
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(module, example_inputs(signature), check_trace=False).graph
    except Exception:  # a user's network: any error of its own; export reports it
        return STEP_INPUTS
    values = list(graph.inputs())[1:]  # after `self`
    used = {spec.name for spec, value in zip(signature.inputs, values, strict=True) if value.uses()}
    return tuple(name for name in STEP_INPUTS if name in used)


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
    rule = algorithm.acting_rule(explore=False)
    action = spec.action_field()
    core_state = []
    for i, tensor in enumerate(model.initial_state(1)):
        shape = tuple(tensor.transpose(0, 1).shape[1:])
        core_state.append(TensorSpec(f"core_state_{i}", shape, str(numpy_dtype(tensor.dtype))))
    last_action = TensorSpec(LAST_ACTION, tuple(action.shape), str(numpy_dtype(action.dtype)))
    signature = Signature(
        obs=tuple(
            TensorSpec(key, tuple(f.shape), str(numpy_dtype(f.dtype)))
            for key, f in spec.obs_fields().items()
        ),
        step_inputs=_STEP_SPECS,
        state=(last_action, *core_state),
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
    reads = inputs_read(ActingModule(model, rule, spec).eval(), signature)
    signature = dataclasses.replace(
        signature,
        step_inputs=tuple(s for s in _STEP_SPECS if s.name in reads),
        state=(*((last_action,) if LAST_ACTION in reads else ()), *core_state),
    )
    return ActingModule(model, rule, spec, reads).eval(), signature


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
        given = {"reward": (np.float32(reward), np.float32), "done": (np.bool_(done), np.bool_)}
        step_inputs = [
            torch.as_tensor(np.broadcast_to(given[s.name][0], (batch_size,)).copy())
            for s in self.signature.step_inputs
        ]
        outputs = self._step([*leaves, *step_inputs, *state])
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
