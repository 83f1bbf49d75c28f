"""A run's components, built from its plan (beast/run/plan.py) through the algorithm's
interface: none of them names an algorithm. `build_run` gives the algorithm's network on
the learning device and the actors' shared copy of it, the experience the algorithm asks
for (a sink the actors write into and a source the learner reads, built by its experience
spec), the algorithm's update, and the learner around it.

A checkpoint (`Run.save`) holds the model, the algorithm's state (optimizers, target
networks, counters), the config, the progress counters and torch's RNG state in
RUN_DIR/model.tar, and with --checkpoint_replay the replay's contents in
RUN_DIR/replay.tar, written first, with a token that model.tar repeats
(beast/run/resume.py loads both).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from beast import envs
from beast.algos.base import ActingRule, Algorithm, LearnerContext, Update
from beast.algos.build import build_checked_model
from beast.algos.normalize import RewardScaler, find_observation_normalizer
from beast.config import RUN_NAMING_FLAGS, Config, ConfigError
from beast.experience.contract import Sink, Source
from beast.experience.specs import ExperienceError, ExperienceSetup
from beast.learning.learner import Learner, Stepper, TrainingProgress, UpdateStats
from beast.learning.thread_tuner import thread_tuner_for
from beast.models import WeightCopier, copy_weights, is_user_model
from beast.outputs.checkpoint import (
    save_checkpoint,
    save_replay_file,
)
from beast.run.plan import RunPlan
from beast.train_step import MODULES_IN_USE


def build_experience(
    plan: RunPlan, actor_model: nn.Module, num_writers: int
) -> tuple[Sink, Source]:
    """The sink actors (or env servers, `num_writers` of them) write into and the source
    the learner reads, for the algorithm's `experience()`."""
    config, algorithm, device = plan.config, plan.algorithm, plan.device
    setup = ExperienceSetup(
        num_writers=num_writers,
        envs_per_writer=config.envs_per_writer,
        lanes_per_writer=config.writer_lanes(plan.policy_mode),
        num_buffers=config.num_buffers,
        batch_size=config.batch_size,
        updates_per_sample=config.updates_per_sample,
        num_learner_threads=config.num_learner_threads,
        device=device,
        seed=config.seed,
        serial=config.serial,
        algo=config.algo,
        env=config.env,
    )
    try:
        return algorithm.experience().build(algorithm.experience_layout(actor_model), setup)
    except ExperienceError as error:
        raise ConfigError(str(error)) from error


@dataclass
class Run:
    """Everything a learner process holds for one run (`build_run`), around its plan."""

    plan: RunPlan
    policy: ActingRule  # the algorithm's acting rule
    model: nn.Module  # the learner's, on `device`
    actor_model: nn.Module  # the CPU copy in shared memory the actors read
    update: Update
    stepper: Stepper
    progress: TrainingProgress
    sink: Sink
    source: Source
    learner: Learner
    reward_scaler: RewardScaler | None = None  # --normalize_reward

    @property
    def config(self) -> Config:
        return self.plan.config

    @property
    def spec(self) -> envs.EnvSpec:
        return self.plan.spec

    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def precision(self) -> str:
        return self.plan.precision

    @property
    def algorithm(self) -> Algorithm:
        return self.plan.algorithm

    def describe(self) -> str:
        """The start-up line's account of the algorithm and the experience."""
        detail = self.algorithm.describe()
        algo = f"{self.config.algo}" + (f" ({detail})" if detail else "")
        return f"{algo}, {self.source.describe()}"

    def save(self, *, step_multiplier: int = 1, timeout: float | None = None) -> bool | None:
        """Write a checkpoint (module docstring). False (and nothing written) when the model
        is not finite; None when the learner's lock was not free within `timeout` seconds
        (an update stuck in a collective). Raises CheckpointError.

        The lock is held only while the model's and the algorithm's state are copied (a
        few MB). The files are written after it is released: a replay's contents take
        tens of seconds for gigabytes, and the learner that waited for them held back
        the actors too (samples_per_insert). The replay's contents are therefore those of
        a moment later than the model's, by the updates that ran in between; its writers
        may go on meanwhile (`Source.save_replay`).

        step_multiplier: polybeast's learners each count their share of the steps.
        """
        config, lock = self.config, self.learner.lock
        if not lock.acquire(timeout=-1 if timeout is None else timeout):
            return None
        try:
            if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
                return False
            progress = dataclasses.asdict(self.progress)
            progress["step"] *= step_multiplier
            # Held too: the optimizers' state_dict races a compilation's export (ModulesInUse).
            with MODULES_IN_USE.held():
                # A copy: the learner changes these tensors in place once the lock is free.
                payload = copy.deepcopy(
                    {
                        "model_state_dict": self.model.state_dict(),
                        "algorithm_state": self.update.state_dict(),
                        "reward_scaler": (
                            self.reward_scaler.state_dict()
                            if self.reward_scaler is not None
                            else None
                        ),
                        "config": config.to_dict(),
                        "progress": progress,
                        "torch_rng_state": torch.get_rng_state(),
                        # Kept at the top level for tools that only want the step.
                        "step": progress["step"],
                    }
                )
        finally:
            lock.release()
        if config.checkpoint_replay:
            token = uuid.uuid4().hex
            write = functools.partial(_write_replay, config.run_dir, token)
            state = self.source.save_replay(write)
            if state is not None:
                payload["replay"] = {"token": token, **state}
        save_checkpoint(config.run_dir, payload)
        return True


def _write_replay(run_dir: str, token: str, tensors: dict[str, torch.Tensor]) -> None:
    save_replay_file(run_dir, {"token": token, "tensors": tensors})


# Settings none of which the learner's step reads: a run differing from an earlier one
# only in these loads that run's compiled step without tracing it (`step_identity`).
# Not total_steps: a schedule is an input of the step today, but nothing promises it.
_OUTSIDE_THE_STEP = RUN_NAMING_FLAGS | {"profile"}


def step_identity(config: Config, spec: envs.EnvSpec, precision: str) -> str | None:
    """What the learner's compiled step is made from besides beast's code and its
    arguments: every setting but those `_OUTSIDE_THE_STEP`, the precision the run
    resolved, and the env's spaces (an action space's bounds are constants of the
    graph). None for a user's model (--model package.module:Name), whose code beast
    cannot see: its steps are always traced."""
    if is_user_model(config.model):
        return None
    settings = [
        (field.name, getattr(config, field.name))
        for field in dataclasses.fields(config)
        if field.name not in _OUTSIDE_THE_STEP
    ]
    return repr((type(config).__name__, settings, precision, spec))


def build_run(
    plan: RunPlan,
    *,
    num_writers: int,
    on_update: Callable[[UpdateStats], None],
    log: Callable[[str], None],
    total_steps: int | None = None,
    reduce_gradients: Any = None,
) -> Run:
    """Build a run's components from its plan (module docstring); the plan's model becomes
    the learner's, on the plan's device.

    num_writers: actors (monobeast) or this learner's env servers (polybeast).
    total_steps: this learner's share (polybeast with several learners); default all.
    reduce_gradients: polybeast's combination of gradients across learners; each step's
        clipping is then its job.
    """
    config, spec, algorithm, precision = plan.config, plan.spec, plan.algorithm, plan.precision
    total_steps = config.total_steps if total_steps is None else total_steps
    policy = algorithm.acting_rule()
    model = plan.model.to(plan.device)
    actor_model = build_checked_model(algorithm)
    copy_weights(actor_model, model)
    actor_model.share_memory()
    actor_model.eval()
    sink, source = build_experience(plan, actor_model, num_writers)
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=config.grad_norm_clipping if reduce_gradients is None else 0.0,
        max_nonfinite_updates=config.max_nonfinite_updates,
        lr_schedule=config.lr_schedule,
        total_steps=total_steps,
        progress=progress,
        reduce_gradients=reduce_gradients,
    )
    reward_scaler = RewardScaler() if config.normalize_reward else None
    context = LearnerContext(
        device=plan.device,
        bf16=precision == "bf16",
        step=stepper,
        progress=progress,
        compile=config.compile,
        log=log,
        optimizer_steps=algorithm.optimizer_steps(total_steps),
        compile_in_background=True,
        stopping=threading.Event(),
        step_identity=step_identity(config, spec, precision),
    )
    observers = []
    if reward_scaler is not None:
        context.scale_rewards = reward_scaler
        observers.append(reward_scaler.observe)
    normalizer = find_observation_normalizer(model)
    if normalizer is not None:
        observers.append(normalizer.observe)
    update = algorithm.learner(model, context)
    learner = Learner(
        update=update,
        source=source,
        stepper=stepper,
        progress=progress,
        # Where this process stops: --stop_step short of the schedules' total_steps.
        total_steps=min(total_steps, config.stop_step or total_steps),
        num_learner_threads=config.num_learner_threads,
        publish=WeightCopier(actor_model, model),
        on_update=on_update,
        observers=observers,
        thread_tuner=thread_tuner_for(config, plan.device, log),
        updates_ready=update.settled,
        stopping=context.stopping,
    )
    return Run(
        plan=plan,
        policy=policy,
        model=model,
        actor_model=actor_model,
        update=update,
        stepper=stepper,
        progress=progress,
        sink=sink,
        source=source,
        learner=learner,
        reward_scaler=reward_scaler,
    )
