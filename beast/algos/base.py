"""The algorithm interface: what an algorithm declares, so that the engine never names one.

An algorithm is one class under beast/algos/, found by name through the registry
(`ALGORITHMS` in beast/algos/__init__.py). The engine (env batches, actor processes,
local and central inference, rollout slots and replays, the learner, monobeast and
polybeast) builds a run through this interface only:

    Args            its flags: a frozen dataclass whose fields are made with
                    `beast.config.flag`. The parser adds them to the core flags, grouped
                    under the algorithm in --help; `validate` checks them.
    model_outputs   what its network returns per step (name -> per-env shape), so a
                    network is checked against it at start-up (`--model module:Name`).
    build_model     its network, from the env spec, or the user's model class.
    acting_rule     its acting rule (`ActingRule`): model outputs for n envs -> actions and
                    whatever the learner needs stored with them (logits, values...).
                    Local actors, the central inference server, polybeast's env servers
                    and --mode test all act through it.
    experience      what its actors produce (beast/experience/specs.py): fixed-length
                    `Rollouts` into the rollout slots (with an optional FIFO of whole
                    rollouts mixed into batches), sequences into a `SequenceReplay`
                    (prioritized), or every step into a `TransitionReplay` (uniform or
                    prioritized).
    learner         its update (`Update`): losses, targets, priorities, target
                    networks, optimizers, and the state its checkpoint keeps.

How a new algorithm plugs in, and what its model must return: docs/algorithms.md.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from beast.experience.contract import Batch
from beast.experience.specs import Experience, ExperienceLayout
from beast.fields import Field, core_state_shapes

if TYPE_CHECKING:
    from beast.config import Config
    from beast.envs import EnvSpec
    from beast.train_step import ParameterGroup, StepLoss, TargetNetwork, TrainStep

__all__ = [
    "Algorithm",
    "LearnerContext",
    "OptimizerStep",
    "OptimizerUpdate",
    "ActingRule",
    "Progress",
    "Update",
    "UpdateInfo",
    "as_outputs",
    "require_one_batch",
]


def as_outputs(outputs: Any) -> Mapping[str, Tensor]:
    """A model's per-step outputs as a mapping: models may return a dict or a NamedTuple
    (beast.models' `AgentOutput`, `QOutput`)."""
    if isinstance(outputs, Mapping):
        return outputs
    as_dict = getattr(outputs, "_asdict", None)
    if as_dict is None:
        raise TypeError(
            f"a model's outputs must be a dict or a NamedTuple of tensors, got {type(outputs)}"
        )
    return as_dict()


class ActingRule(abc.ABC):
    """How an algorithm acts: model outputs for n envs -> their actions and what is stored.

    The engine allocates the record arrays (one per `record_spec` field, `[n, ...]`,
    fixed addresses: an actor's own arrays, rows of the central request table, an env
    server's) and the per-env parameter rows, calls `bind` once per such set, and calls
    the returned function after every forward pass with the model's outputs for those n
    envs (time-major, `[1, n, ...]`). Binding once lets a policy keep native samplers
    over fixed arrays: an actor's step must not allocate.

    Policies are pickled to actor processes and env servers: plain attributes only.
    """

    @abc.abstractmethod
    def record_spec(self) -> dict[str, Field]:
        """Per-env, per-step fields the policy writes (no time axis), "action" included."""

    def env_params(self, num_envs: int) -> dict[str, np.ndarray]:
        """Per-env constants over all `num_envs` envs of a run, `[num_envs, ...]` each (Ape-X's
        epsilons); env j of actor a with K envs is row a*K + j. None by default."""
        return {}

    @abc.abstractmethod
    def bind(
        self, record: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> Callable[[Mapping[str, Tensor]], None]:
        """A function that fills `record` ([n, ...] arrays) from model outputs for n envs,
        reading `params` ([n, ...] rows of `env_params`)."""

    def deterministic_action(self, outputs: Mapping[str, Tensor]) -> Tensor:
        """The action of the policy built with `explore=False` (--mode test), as torch ops on
        the model's outputs for n envs (`[1, n, ...]`, as `bind`'s function gets them):
        int64 [n] or float32 [n, d], before the env's bounds clip it. What an exported
        policy computes (beast/trained/policy.py); a Q-network's is greedy, without --test_epsilon.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no deterministic action, so its policy cannot be"
            " exported; define ActingRule.deterministic_action"
        )


class UpdateInfo(NamedTuple):
    """What an update reports.

    stats: scalars for the run log (tensors or floats).
    priorities: float [B], new priorities of a prioritized replay's samples (before its
        exponent), or None (no replay, or the update was skipped).
    """

    stats: Mapping[str, Any]
    priorities: Tensor | None = None


def batch_rewards(data: Mapping[str, Tensor]) -> Tensor:
    """A batch's rewards as stored (`LearnerContext.scale_rewards` without
    --normalize_reward)."""
    return data["reward"]


class OptimizerStep(Protocol):
    """The learner's optimizer step as an algorithm sees it (beast/learning/learner.py `Stepper`).

    Named here by what algorithms use of it, so that this interface does not import the
    learner, which imports the interface."""

    total_steps: int  # the run's --total_steps, which the learning-rate schedule spans

    def __call__(
        self,
        loss: Tensor,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        parameters: Iterable[Tensor],
    ) -> bool:
        """Backward `loss`, clip, guard and step; False when skipped as non-finite."""
        ...


class Progress(Protocol):
    """The run's counters as an algorithm reads them (beast/learning/learner.py
    `TrainingProgress`)."""

    @property
    def step(self) -> int:
        """Agent steps accounted for."""
        ...

    @property
    def num_updates(self) -> int:
        """Updates that stepped an optimizer."""
        ...


@dataclass
class LearnerContext:
    """What the engine gives an algorithm's learner.

    device: where the model and batches live.
    bf16: run forward passes under bf16 autocast (`autocast()`); losses stay float32.
    step: the one optimizer step (beast/learning/learner.py `Stepper`): zero_grad, backward,
        clipping, the non-finite guard, the learning-rate schedule, the step.
    progress: the run's counters (agent steps, updates), read-only for the algorithm.
    scale_rewards: a batch's data -> its rewards `[L, B]` as the loss must see them
        (--normalize_reward scales them, beast/algos/normalize.py; else `data["reward"]`).
        Models read the raw `data["reward"]`, as they did when acting.
    compile: --compile: whether `train_step` compiles the update (on, off, or auto:
        where it pays, beast/train_step).
    log: where the learner's one-off lines go (the path its update took).
    optimizer_steps: about how many optimizer steps the run takes
        (`Algorithm.optimizer_steps`), which --compile auto weighs; None: unknown.
    compile_in_background: compile in a thread of its own (a run's learner), rather
        than in the step that decides (tests, benchmarks).
    stopping: set when the run stops (the learner's `stop`): a step waiting for a
        compilation gives up (`StepAbandoned`).
    """

    device: torch.device
    bf16: bool
    step: OptimizerStep
    progress: Progress
    scale_rewards: Callable[[Mapping[str, Tensor]], Tensor] = batch_rewards
    compile: str = "off"
    log: Callable[[str], None] = print
    optimizer_steps: int | None = None
    compile_in_background: bool = False
    stopping: threading.Event | None = None
    # What the learner's step is made from besides beast's code and its arguments (the
    # run's settings, the env's spaces), for packages known from earlier runs
    # (beast/train_step TrainStep's `identity`); None where unknown (a user's model).
    step_identity: str | None = None

    def autocast(self) -> torch.autocast:
        """bf16 autocast (`bf16`) without its cache of cast weights: a compiled step
        (beast/train_step) traces the casts into its graph, where a cache would hand
        the tracer a real tensor cast outside it."""
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False
        )

    def train_step(
        self,
        loss: Callable[[Mapping[str, Tensor], tuple[str, ...]], StepLoss],
        *,
        modules: Mapping[str, nn.Module],
        groups: Sequence[ParameterGroup],
        targets: Sequence[TargetNetwork] = (),
    ) -> TrainStep:
        """The algorithm's optimizer step over `loss` (beast/train_step), eager or
        compiled as the run says."""
        from beast.train_step import TrainStep

        return TrainStep(
            loss,
            modules=modules,
            groups=groups,
            targets=targets,
            stepper=self.step,
            compile=self.compile,
            log=self.log,
            expected_steps=self.optimizer_steps,
            background=self.compile_in_background,
            stopping=self.stopping,
            identity=self.step_identity,
        )


def require_one_batch(batch: Batch) -> None:
    """ValueError unless `batch` is one batch: an update that takes blocks in `block`
    refuses one in `__call__`, whose result is one update's."""
    if batch.parts != 1:
        raise ValueError(f"a block of {batch.parts} batches takes `block`, one update each")


class Update(abc.ABC):
    """An algorithm's learning state in the learner process: optimizers, target networks,
    counters. Called under the learner's lock, one batch at a time."""

    @abc.abstractmethod
    def __call__(self, batch: Batch) -> UpdateInfo:
        """One update on `batch`; optimizer steps go through `context.step`."""

    def block(self, batch: Batch) -> list[UpdateInfo] | None:
        """One update on each batch of a replay's block (`batch.parts` > 1:
        --updates_per_sample), all in one call of its train step (`TrainStep.steps`: one
        compiled graph, no return to Python between them), one optimizer step each; or
        None (the default), where the update takes a block's batches one call at a time
        (the learner then calls it on each)."""
        return None

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the model: optimizer states, target networks,
        counters (tensors and plain data only)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def settled(self) -> bool:
        """Whether the update runs on its steady path: its `train_step`'s compilation,
        if any, decided (the learner's thread tuner measures from then on)."""
        train_step = getattr(self, "train_step", None)
        return train_step is None or train_step.settled


class OptimizerUpdate(Update):
    """An update whose checkpoint holds its optimizers' states under the names `optimizers`
    gives them (subclasses add their target networks and counters); restoring them hands
    the states to its `train_step` too."""

    optimizer: torch.optim.Optimizer
    train_step: TrainStep

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers, by the key their state has in the checkpoint: by default the
        one `optimizer` over the whole model."""
        return {"optimizer": self.optimizer}

    def state_dict(self) -> dict[str, Any]:
        return {name: optimizer.state_dict() for name, optimizer in self.optimizers().items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, optimizer in self.optimizers().items():
            optimizer.load_state_dict(state[name])
        self.train_step.load_optimizer_states()


class Algorithm(abc.ABC):
    """One algorithm (module docstring); built once per process from the run's config.

    Class attributes:
        name: its --algo name (the registry key).
        summary: one line for --help.
        Args: the dataclass of its flags.
        bf16_auto: whether --precision auto may pick bf16 for it (image models only).
        bf16_builtin_only: auto picks bf16 for its built-in models only (Q-learning: they
            keep the Q-values in float32, beast/models/q.py `QNet`), never for a user's.
        continuous_actions: whether it acts in continuous (Box) action spaces; the engine
            refuses such an env for an algorithm that does not, in one line.
        discrete_actions: whether it acts in Discrete action spaces (likewise).
        core_defaults: core flags (beast/config/flags.py `Config`) whose defaults differ for it
            (PPO's optimizer and rollout length, say): what a run gets with no config file
            (--config none, or no configs/<algo>/ file for its env's family) and no flag;
            a family's configs/<algo>/ file and the command line still replace them.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    Args: ClassVar[type]
    bf16_auto: ClassVar[bool] = True
    bf16_builtin_only: ClassVar[bool] = False
    continuous_actions: ClassVar[bool] = False
    discrete_actions: ClassVar[bool] = True
    core_defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, config: Config, spec: EnvSpec) -> None:
        self.config = config
        self.spec = spec

    @classmethod
    @abc.abstractmethod
    def validate(cls, config: Config) -> None:
        """Cross-field checks of its flags; raise `beast.config.ConfigError` (one line)."""

    @abc.abstractmethod
    def model_outputs(self) -> dict[str, tuple[int, ...]]:
        """Per-step outputs its network must return: name -> shape per env."""

    def build_model(self) -> nn.Module:
        """The network: the user's `--model package.module:Name`, or a built-in one; with
        --normalize_obs, behind the running normaliser (beast/algos/normalize.py)."""
        from beast.algos.normalize import ObservationNormalizer
        from beast.models import build_user_model, is_user_model

        if is_user_model(self.config.model):
            model = build_user_model(self.config, self.spec)
        else:
            model = self.builtin_model()
        model = self.wrap_model(model)
        if self.config.normalize_obs:
            model = ObservationNormalizer(model, self.spec.obs_fields())
        return model

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The network as the algorithm runs it, built-in or the user's: by default itself
        (DQN's linear exploration wraps it with the epsilon its actors act with)."""
        return model

    @abc.abstractmethod
    def builtin_model(self) -> nn.Module:
        """The built-in network `--model` names (auto, atari, resnet, mlp)."""

    @abc.abstractmethod
    def acting_rule(self, explore: bool = True) -> ActingRule:
        """The acting rule; `explore=False` for --mode test."""

    @abc.abstractmethod
    def experience(self) -> Experience:
        """What the actors produce and the learner samples."""

    @abc.abstractmethod
    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        """The learning state for `model` (on `context.device`), optimizers included."""

    def experience_layout(self, model: nn.Module) -> ExperienceLayout:
        """What one env step of its experience stores, for `model`: the observation, the
        policy's record (and each env's running discounted return with
        --normalize_reward), the model's recurrent state."""
        from beast.algos.normalize import DISCOUNTED_RETURN_KEY

        record = dict(self.acting_rule().record_spec())
        if self.config.normalize_reward:
            record[DISCOUNTED_RETURN_KEY] = Field((), torch.float32)
        return ExperienceLayout(
            obs=self.spec.obs_fields(),
            record=record,
            core_state_shapes=core_state_shapes(model.initial_state(1)),
        )

    def describe(self) -> str:
        """A fragment for the start-up line (e.g. the loss's settings); empty by default."""
        return ""

    def optimizer_steps(self, total_steps: int) -> int | None:
        """About how many optimizer steps a run of `total_steps` agent steps takes (what
        --compile auto weighs against the cost of compiling); None when unknown. By
        default one per batch of its experience (`Experience.optimizer_steps`)."""
        return self.experience().optimizer_steps(total_steps, self.config.batch_size)
