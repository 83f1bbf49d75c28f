"""A run's components, built through the algorithm registry; resume and checkpoints.

Shared by monobeast (beast/run/runner.py), polybeast (beast/poly/trainer.py), --serial
(beast/run/serial.py) and --mode test (beast/trained/play.py): none of them names an algorithm.
`build_run` turns a config into the algorithm (beast/algos), its network (checked
against what the algorithm needs), the actors' shared copy of it, the experience the
algorithm asks for (rollout slots, optionally with a replay of rollouts, or a
prioritized sequence replay: a sink the actors write into and a source the learner
reads), the algorithm's update, and the learner around it.

A checkpoint (`save`) holds the model, the algorithm's state (optimizers, target
networks, counters), the config, the progress counters and torch's RNG state in
RUN_DIR/model.tar, and with --checkpoint_replay the replay's contents in
RUN_DIR/replay.tar, written first, with a token that model.tar repeats. `resume`
loads both; a replay file whose token does not match (a crash between the two writes,
or model.tar fell back to model.prev.tar) is left out, and the run says so.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from beast import envs
from beast.algos import ALGORITHMS, algorithm_class
from beast.algos.base import Algorithm, LearnerContext, Policy, Update
from beast.algos.normalize import RewardScaler, find_observation_normalizer
from beast.config import RUN_NAMING_FLAGS, Config, ConfigError
from beast.envs.batch import check_backend
from beast.experience.contract import Sink, Source
from beast.experience.specs import ExperienceError, ExperienceSetup
from beast.learning.learner import Learner, Stepper, TrainingProgress, UpdateStats
from beast.learning.thread_tuner import learner_threads, thread_tuner_for
from beast.models import ModelError, WeightCopier, check_model, copy_weights, is_user_model
from beast.outputs.checkpoint import (
    CheckpointError,
    has_checkpoint,
    load_latest_checkpoint,
    load_replay_file,
    save_checkpoint,
    save_replay_file,
)
from beast.train_step import MODULES_IN_USE, compilations_under_way, wait_for_compilations

__all__ = [
    "Run",
    "acting_bf16",
    "build_algorithm",
    "build_checked_model",
    "build_run",
    "check_resumable",
    "with_current_hyperparameters",
    "cpu_bf16_native",
    "prepare",
    "select_device",
    "select_policy",
    "select_precision",
]

# Flags a resumed run must share with its checkpoint: they define the model,
# its inputs, the optimizer state's layout or the algorithm's state.
RESUME_MUST_MATCH = (
    "env",
    "algo",
    "model",
    "use_lstm",
    "hidden_size",
    "activation",
    "normalize_obs",
    "optimizer",
)
# Flags that may differ on resume without comment.
_RESUME_IGNORED = ("xpid", "savedir", "resume", "mode", "config", "stop_step")


def select_device(config: Config) -> torch.device:
    if not config.disable_cuda and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def select_policy(config: Config, device: torch.device) -> str:
    """--policy with auto resolved: central when the learner has a GPU, else local.

    On a CPU-only machine the two spend the same core-time on the forward pass, but
    central inference adds a round trip per step and runs the forward pass in the
    learner process, beside the learner's update; local measured faster on 2 cores
    (benchmarks/RESULTS.md). With a GPU, central moves that forward pass off the CPUs.
    """
    if config.policy != "auto":
        return config.policy
    return "central" if device.type == "cuda" else "local"


def cpu_bf16_native() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def select_precision(
    config: Config, device: torch.device, spec: envs.EnvSpec, algorithm: type[Algorithm]
) -> str:
    """The learner's precision, "fp32" or "bf16", with --precision auto resolved.

    auto picks bf16 for image models where bf16 is native, unless the algorithm says it
    must not (`Algorithm.bf16_auto`), or only for its built-in models (Q-learning, whose
    built-in models keep the Q-values in float32: `Algorithm.bf16_builtin_only`).
    Emulated bf16 (an older CPU) is slower than fp32, and so is a few-millisecond MLP
    update, where the casts cost more than the matmuls save. On a 2-core AVX512-BF16
    EPYC, bf16 cut the AtariNet update (T=80, B=8) from 909 to 413 ms at 1 thread, with
    gradients within 1.4% of fp32's (cosine 0.9999); see benchmarks/RESULTS.md.
    """
    if config.precision != "auto":
        return config.precision
    if not algorithm.bf16_auto or not spec.has_images():
        return "fp32"
    if algorithm.bf16_builtin_only and is_user_model(config.model):
        return "fp32"
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_bf16_native() else "fp32"


def acting_bf16(precision: str, device: torch.device) -> bool:
    """Whether acting forward passes on `device` run under bf16 autocast: in a bf16
    run, where `device` has native bf16 (AtariNet at K=8 on one CPU thread: 2.7 ->
    2.2 ms; Pong end to end 1,585 -> 1,675 steps/s, benchmarks/RESULTS.md)."""
    return precision == "bf16" and (device.type == "cuda" or cpu_bf16_native())


def build_algorithm(config: Config, spec: envs.EnvSpec) -> Algorithm:
    """The run's algorithm for the env; a one-line ConfigError when it cannot act in the
    env's action space or normalise its observations."""
    algorithm = algorithm_class(config.algo)
    if spec.continuous and not algorithm.continuous_actions:
        able = [name for name in ALGORITHMS if algorithm_class(name).continuous_actions]
        raise ConfigError(
            f"--algo {config.algo} needs a Discrete action space, and {config.env} has"
            f" {spec.describe_actions()}; for continuous actions use --algo"
            f" {', '.join(able)}"
        )
    if not spec.continuous and not algorithm.discrete_actions:
        able = [name for name in ALGORITHMS if algorithm_class(name).discrete_actions]
        raise ConfigError(
            f"--algo {config.algo} needs a continuous (Box) action space, and {config.env}"
            f" has {spec.describe_actions()} (Discrete); for discrete actions use --algo"
            f" {', '.join(able)}"
        )
    if config.normalize_obs and not any(
        f.dtype.is_floating_point for f in spec.obs_fields().values()
    ):
        raise ConfigError(
            f"--normalize_obs is for float vector observations, and {config.env}'s are"
            f" {spec.describe_obs()} (image models scale pixels themselves); drop"
            " --normalize_obs"
        )
    return algorithm(config, spec)


def build_checked_model(algorithm: Algorithm) -> nn.Module:
    """The algorithm's network, or a one-line ConfigError when it cannot be built for the
    env or does not return what the algorithm needs (checked on a dummy batch)."""
    config, spec = algorithm.config, algorithm.spec
    try:
        model = algorithm.build_model()
        check_model(model, spec, algorithm.model_outputs(), config.model)
    except ModelError as error:
        raise ConfigError(str(error)) from None
    except ValueError as error:  # a built-in model that does not fit the observations
        raise ConfigError(
            f"--model {config.model} does not fit --env {config.env}: {error}"
        ) from None
    return model


def prepare(config: Config) -> tuple[Config, envs.EnvSpec, torch.device, str]:
    """Seed torch, probe the env's spec and --env_backend, check the model, pick device
    and precision, measure an "auto" actor layout (beast/run/autosize.py), set torch threads.
    Returns the config with the layout resolved."""
    # Another run in this process (the Python API, the tests) may have left a compilation
    # exporting: torch's seeding and optimizers race with it (ModulesInUse).
    if compilations_under_way():
        print("[beast] waiting for another run's compilation in this process", flush=True)
        wait_for_compilations()
    torch.manual_seed(config.seed)
    probe = envs.make(config.env, seed=config.seed, episodic_life=config.episodic_life)
    try:
        spec = envs.env_spec(probe)
        # An --env_backend that cannot run --env (or is not installed) stops here, in one line.
        check_backend(config.env, config.env_backend)
        algorithm = build_algorithm(config, spec)
        check_frame_stacks(algorithm, probe)
    finally:
        probe.close()
    # Fail here, in one line, on a model that does not fit.
    model = build_checked_model(algorithm)
    num_parameters = sum(p.numel() for p in model.parameters())
    check_replay_fits(algorithm, model)
    device = select_device(config)
    precision = select_precision(config, device, spec, type(algorithm))
    if config.actor_layout_is_auto:
        from beast.run.autosize import resolve_actor_layout

        config = resolve_actor_layout(
            config,
            algorithm,
            device,
            select_policy(config, device),
            precision,
            log=lambda line: print(f"[beast] {line}", flush=True),
        )
        torch.manual_seed(config.seed)  # the measurement drew random numbers
    num_threads = learner_threads(config, device, precision, num_parameters)
    if num_threads:
        torch.set_num_threads(num_threads)
    return config, spec, device, precision


def check_frame_stacks(algorithm: Algorithm, env: Any) -> None:
    """A one-line ConfigError when the algorithm's replay deduplicates frames and an image
    leaf of the env's observation is not a frame stack (`envs.images_not_stacked`): its
    steps could never be rebuilt (a transition replay would sample nothing, a sequence
    replay refuse every sequence)."""
    if not algorithm.experience().frame_dedup or not algorithm.spec.has_images():
        return
    not_stacked = envs.images_not_stacked(env, algorithm.spec)
    if not_stacked:
        spec, flag = algorithm.spec.obs_fields(), "--no-frame_dedup"
        leaves = ", ".join(f"{key} {spec[key].shape}" for key in not_stacked)
        raise ConfigError(
            f"--frame_dedup stores frame stacks once per frame, and {algorithm.config.env}'s"
            f" {leaves} are not frame stacks (obs_t[:-1] != obs_{{t-1}}[1:] in an episode);"
            f" pass {flag}"
        )


def available_memory() -> int:
    """Bytes of memory this machine can still give: MemAvailable (Linux), else physical."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# The share of the available memory a replay may take: the learner, the actors and the
# page cache need the rest.
REPLAY_MEMORY_SHARE = 0.8


def check_replay_fits(algorithm: Algorithm, model: nn.Module) -> None:
    """A one-line ConfigError, before anything is allocated (or a run directory made),
    when the algorithm's replay would take more than REPLAY_MEMORY_SHARE of the memory
    available: what it needs, and the --replay_size that would fit."""
    footprint = algorithm.experience().footprint(algorithm.experience_layout(model))
    if footprint is None:
        return
    budget = REPLAY_MEMORY_SHARE * available_memory()
    if footprint.nbytes > budget:
        stacks = algorithm.spec.has_images() and not footprint.frame_dedup
        hint = ", or store frames once with --frame_dedup" if stacks else ""
        raise ConfigError(
            f"a replay of {footprint.capacity:,} {footprint.unit} needs"
            f" {footprint.nbytes / 2**30:,.1f} GiB ({footprint.per_item:,.0f} B each), more"
            f" than {REPLAY_MEMORY_SHARE:.0%} of the {budget / REPLAY_MEMORY_SHARE / 2**30:,.1f}"
            f" GiB available; lower --replay_size to {int(budget // footprint.per_item):,} or"
            f" less{hint}"
        )


def build_experience(
    config: Config,
    algorithm: Algorithm,
    policy: Policy,
    actor_model: nn.Module,
    device: torch.device,
    num_writers: int,
) -> tuple[Sink, Source]:
    """The sink actors (or env servers, `num_writers` of them) write into and the source
    the learner reads, for the algorithm's `experience()`."""
    setup = ExperienceSetup(
        num_writers=num_writers,
        envs_per_writer=config.envs_per_writer,
        lanes_per_writer=config.writer_lanes(select_policy(config, device)),
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
    """Everything a learner process holds for one run (`build_run`)."""

    config: Config
    spec: envs.EnvSpec
    device: torch.device
    precision: str
    algorithm: Algorithm
    policy: Policy
    model: nn.Module  # the learner's, on `device`
    actor_model: nn.Module  # the CPU copy in shared memory the actors read
    update: Update
    stepper: Stepper
    progress: TrainingProgress
    sink: Sink
    source: Source
    learner: Learner
    reward_scaler: RewardScaler | None = None  # --normalize_reward

    def describe(self) -> str:
        """The start-up line's account of the algorithm and the experience."""
        detail = self.algorithm.describe()
        algo = f"{self.config.algo}" + (f" ({detail})" if detail else "")
        return f"{algo}, {self.source.describe()}"

    def save(self, *, step_multiplier: int = 1, timeout: float | None = None) -> bool | None:
        """Write a checkpoint (module docstring), under the learner's lock. False (and
        nothing written) when the model is not finite; None when the lock was not free
        within `timeout` seconds (an update stuck in a collective). Raises CheckpointError.

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
                payload = {
                    "model_state_dict": self.model.state_dict(),
                    "algorithm_state": self.update.state_dict(),
                    "reward_scaler": (
                        self.reward_scaler.state_dict() if self.reward_scaler is not None else None
                    ),
                    "config": config.to_dict(),
                    "progress": progress,
                    "torch_rng_state": torch.get_rng_state(),
                    # Kept at the top level for tools that only want the step.
                    "step": progress["step"],
                }
            if config.checkpoint_replay:
                token = uuid.uuid4().hex
                write = functools.partial(_write_replay, config.run_dir, token)
                state = self.source.save_replay(write)
                if state is not None:
                    payload["replay"] = {"token": token, **state}
            save_checkpoint(config.run_dir, payload)
        finally:
            lock.release()
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
    config: Config,
    spec: envs.EnvSpec,
    device: torch.device,
    precision: str,
    *,
    num_writers: int,
    on_update: Callable[[UpdateStats], None],
    log: Callable[[str], None],
    total_steps: int | None = None,
    reduce_gradients: Any = None,
) -> Run:
    """Build a run's components (module docstring).

    num_writers: actors (monobeast) or this learner's env servers (polybeast).
    total_steps: this learner's share (polybeast with several learners); default all.
    reduce_gradients: polybeast's combination of gradients across learners; each step's
        clipping is then its job.
    """
    total_steps = config.total_steps if total_steps is None else total_steps
    algorithm = build_algorithm(config, spec)
    policy = algorithm.policy()
    model = build_checked_model(algorithm).to(device)
    actor_model = build_checked_model(algorithm)
    copy_weights(actor_model, model)
    actor_model.share_memory()
    actor_model.eval()
    sink, source = build_experience(config, algorithm, policy, actor_model, device, num_writers)
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
        device=device,
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
        thread_tuner=thread_tuner_for(config, device, log),
        updates_ready=update.settled,
        stopping=context.stopping,
    )
    return Run(
        config=config,
        spec=spec,
        device=device,
        precision=precision,
        algorithm=algorithm,
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


def check_resumable(saved: dict[str, Any], config: Config, path: str) -> list[str]:
    """Raise ConfigError on an incompatible checkpoint; return the other changed flags."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    mismatched = [
        f"--{key} {saved.get(key, defaults[key])!r} in the checkpoint, {getattr(config, key)!r} now"
        for key in RESUME_MUST_MATCH
        if saved.get(key, defaults[key]) != getattr(config, key)
    ]
    if mismatched:
        raise ConfigError(
            f"cannot resume from {path}: {'; '.join(mismatched)} (use a new --xpid to start over)"
        )
    current = config.to_dict()
    return [
        f"{key} {saved[key]!r} -> {current[key]!r}"
        for key in current
        if key in saved and key not in _RESUME_IGNORED and saved[key] != current[key]
    ]


def with_current_hyperparameters(saved: Any, current: Any) -> Any:
    """`saved` (an algorithm's state) with every optimizer's param-group settings (base
    learning rate, eps, betas, ...) taken from `current`, the state of the run being
    resumed, built from its flags.

    torch's `Optimizer.load_state_dict` restores the saved groups' settings too, so
    without this a flag changed on resume (`--learning_rate`, which PBT perturbs:
    beast/tune/pbt.py) would be listed as changed and silently not used. The moment
    estimates and step counts stay the checkpoint's; so does `lr`, which the learner sets
    from the base rate and the schedule before every step."""
    if isinstance(saved, dict) and isinstance(current, dict):
        if "param_groups" in saved and "state" in saved and "param_groups" in current:
            groups = [
                {**old, **{k: v for k, v in new.items() if k not in ("params", "lr")}}
                for old, new in zip(saved["param_groups"], current["param_groups"], strict=False)
            ]
            return {**saved, "param_groups": groups}
        return {k: with_current_hyperparameters(v, current.get(k)) for k, v in saved.items()}
    return saved


def load_resume_payload(config: Config) -> tuple[dict[str, Any], str, str | None, list[str]] | None:
    """The checkpoint to resume from, or None for a new run: (payload, its path, why the
    newest file was skipped or None, the flags that changed). ConfigError when --resume
    finds none or the checkpoint does not fit."""
    if config.resume and not has_checkpoint(config.run_dir):
        raise ConfigError(f"--resume: no checkpoint in {config.run_dir}")
    if not has_checkpoint(config.run_dir):
        return None
    try:
        payload, path, skipped = load_latest_checkpoint(config.run_dir)
    except CheckpointError as error:
        raise ConfigError(f"{error} (use a new --xpid to start over)") from error
    changed = check_resumable(payload["config"], config, path)
    return payload, path, skipped, changed


def restore(
    run: Run,
    payload: dict[str, Any],
    path: str,
    *,
    progress_divisor: int = 1,
    with_replay: bool = True,
) -> str:
    """Load a checkpoint into `run` before anything starts; returns what the replay
    restore did ("" without a replay in the checkpoint), for the start-up line.

    progress_divisor: polybeast's learners each count their share of the steps.
    with_replay: False for polybeast's several learners, each with its own replay.
    """
    try:
        run.model.load_state_dict(payload["model_state_dict"])
        copy_weights(run.actor_model, run.model)
        run.update.load_state_dict(
            with_current_hyperparameters(payload["algorithm_state"], run.update.state_dict())
        )
        if run.reward_scaler is not None and payload.get("reward_scaler") is not None:
            run.reward_scaler.load_state_dict(payload["reward_scaler"])
    except (RuntimeError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(f"cannot resume from {path}: it does not fit: {reason}") from error
    saved = dict(payload["progress"])
    saved["step"] //= progress_divisor
    fields = {f.name for f in dataclasses.fields(TrainingProgress)}
    for key, value in saved.items():
        if key in fields:
            setattr(run.progress, key, value)
    torch.set_rng_state(payload["torch_rng_state"])
    meta = payload.get("replay")
    if meta is None:
        return ""
    if not run.config.checkpoint_replay:
        return "replay not restored (--no-checkpoint_replay): it starts empty"
    if not with_replay:
        return "each learner's replay starts empty (the checkpoint holds one learner's)"
    saved_replay = load_replay_file(run.config.run_dir)
    if saved_replay is None or saved_replay.get("token") != meta["token"]:
        return "the saved replay does not match this checkpoint: the replay starts empty"
    try:
        return "restored " + run.source.restore_replay(saved_replay["tensors"], meta)
    except (ValueError, KeyError) as error:
        return f"the saved replay does not fit ({error}): the replay starts empty"
