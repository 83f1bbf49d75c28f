"""MonoBeast training: build the components, run them, shut them down.

One shutdown protocol for every way a run ends (total_steps reached, Ctrl-C,
SIGTERM, too many actor deaths, a failed learner): stop the learner threads,
close both slot queues (which wakes and stops every actor), join the actors
with a timeout, kill what is left, then write the final checkpoint (unless
the model is not finite: a good checkpoint is never overwritten by a
diverged one). Rollout memory is shared through file descriptors that torch
unlinks at creation, so no /dev/shm segment outlives the processes.

A run whose directory already holds a checkpoint resumes from it: model,
optimizer, scheduler, step counters and RNG state; flags that define the
model must match.

R2D2 and Ape-X (`--algo r2d2|apex`) swap the rollout slots and the learner
for a prioritized sequence replay that the actors fill themselves
(`build_sequence_sink`, beast/sequence_actor.py) and a `ReplayLearner`
(`build_replay_learner`) with a target network, which the checkpoint keeps
beside the model; the rest of the run is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from beast import envs
from beast.actor import ActorSettings
from beast.algos.impala import LossOutput, impala_loss
from beast.algos.laser import laser_loss
from beast.algos.r2d2 import DEFAULT_RESCALE_EPS, r2d2_loss
from beast.buffers import RolloutBuffers, core_state_shapes, rollout_spec
from beast.checkpoint import (
    CheckpointError,
    has_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from beast.compile import CompiledForward
from beast.config import Q_LEARNING_ALGOS, Config, ConfigError
from beast.inference import InferenceServer, InferenceTable
from beast.learner import Learner, NonFiniteError, TrainingProgress, UpdateStats
from beast.logs import RunLog
from beast.models import build_model, build_q_model
from beast.profile import format_profile
from beast.replay import PrioritizedReplay, replay_footprint, sequence_spec
from beast.replay_learner import ReplayLearner
from beast.rollout_replay import RolloutReplay
from beast.sequence_actor import SequenceSink
from beast.supervisor import ActorPool

__all__ = [
    "TrainingError",
    "build_inference",
    "build_optimizer",
    "build_scheduler",
    "check_resumable",
    "open_run_log",
    "prepare_learner_process",
    "raise_keyboard_interrupt",
    "build_loss",
    "build_replay",
    "build_replay_learner",
    "build_run_model",
    "build_sequence_sink",
    "select_device",
    "select_policy",
    "sequence_layout",
    "train",
]

# Seconds actors get to exit after the queues close before they are killed.
_ACTOR_JOIN_SECONDS = 5.0
# How often the main thread checks on actors and the learner.
_MONITOR_SECONDS = 0.5
# Flags a resumed run must share with its checkpoint: they define the model,
# its inputs or the optimizer state's layout.
_RESUME_MUST_MATCH = ("env", "model", "use_lstm", "hidden_size", "optimizer")
# Flags that may differ on resume without comment.
_RESUME_IGNORED = ("xpid", "savedir", "resume", "mode")
# Seconds learner threads get to finish an update in flight.
_LEARNER_STOP_SECONDS = 3.0


class TrainingError(RuntimeError):
    """A run that had to stop; the message says why in one line."""


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
    if config.algo in Q_LEARNING_ALGOS:
        return "local"  # R2D2 / Ape-X actors act with a local Q-network only
    return "central" if device.type == "cuda" else "local"


def build_inference(
    config: Config,
    spec: envs.EnvSpec,
    actor_model: torch.nn.Module,
    device: torch.device,
    num_updates=lambda: 0,
    precision: str = "fp32",
) -> tuple[InferenceTable, InferenceServer]:
    """The request table and the inference server for --policy central.

    The server acts with its own copy of the model on --actor_device (default the
    learner's device), refreshed from `actor_model`, the weights the learner publishes.
    """
    table = InferenceTable(
        num_actors=config.num_actors,
        num_envs=config.num_envs_per_actor,
        obs_shape=spec.obs_shape,
        obs_dtype=spec.obs_dtype,
        num_actions=spec.num_actions,
        initial_state=actor_model.initial_state(1),
        num_servers=config.num_inference_threads,
        num_env_splits=config.env_splits("central"),
    )
    server_device = torch.device(config.actor_device) if config.actor_device else device
    server = InferenceServer(
        table=table,
        model=build_run_model(config, spec),
        source=actor_model,
        device=server_device,
        max_batch=config.max_inference_batch or config.slots_in_use_by_actors,
        batch_window=config.inference_timeout_ms / 1000.0,
        sync_every=config.inference_sync_every,
        num_updates=num_updates,
        bf16=acting_bf16(precision, server_device),
    )
    return table, server


def build_run_model(config: Config, spec: envs.EnvSpec) -> torch.nn.Module:
    """The run's network: a dueling Q-network for r2d2 (with an LSTM, always) and apex
    (feed-forward), else an actor-critic."""
    if config.algo in Q_LEARNING_ALGOS:
        return build_q_model(
            config.model,
            spec.obs_shape,
            spec.num_actions,
            use_lstm=config.algo == "r2d2",
            hidden_size=config.hidden_size,
        )
    return build_model(
        config.model,
        spec.obs_shape,
        spec.num_actions,
        use_lstm=config.use_lstm,
        hidden_size=config.hidden_size,
    )


def build_loss(config: Config) -> Callable[..., LossOutput]:
    """The learner's `loss_fn(outputs, batch)`: LASER's loss for --algo laser, a replay or
    a trust region, else IMPALA's (so plain IMPALA logs keep their columns)."""
    costs: dict[str, Any] = {
        "discounting": config.discounting,
        "reward_clipping": config.reward_clipping,
        "baseline_cost": config.baseline_cost,
        "entropy_cost": config.entropy_cost,
    }
    if config.algo == "laser" or config.replay_ratio or config.trust_region_threshold:
        return functools.partial(
            laser_loss, trust_region_threshold=config.trust_region_threshold, **costs
        )
    return functools.partial(impala_loss, **costs)


def build_replay(config: Config, buffers: RolloutBuffers) -> RolloutReplay | None:
    """LASER's replay, in the rollout slots' layout; None when --replay_ratio is 0."""
    if not config.replay_ratio:
        return None
    return RolloutReplay(buffers.spec, config.replay_size, seed=config.seed)


def sequence_layout(config: Config) -> tuple[int, int, int]:
    """(seq_len, seq_overlap, burn_in) of the replayed sequences.

    r2d2: the flags (80, 40, 40 by default). apex: n_step, n_step - 1, 0: every step
    starts one sequence of n_step + 1 rows, an n-step transition with its bootstrap row
    (the layout beast.replay.SequenceBuilder and r2d2_loss document for Ape-X).
    """
    if config.algo == "apex":
        return config.n_step, config.n_step - 1, 0
    return config.seq_len, config.seq_overlap, config.burn_in


def build_sequence_sink(
    config: Config, spec: envs.EnvSpec, actor_model: torch.nn.Module
) -> SequenceSink:
    """R2D2 / Ape-X: the shared prioritized replay of --replay_size sequences and the
    actors' counters, what the sequence actors write into instead of rollout slots."""
    seq_len, seq_overlap, _ = sequence_layout(config)
    layout = sequence_spec(
        seq_len=seq_len,
        obs_shape=spec.obs_shape,
        obs_dtype=spec.obs_dtype,
        core_state_shapes=core_state_shapes(actor_model.initial_state(1)),
    )
    try:
        replay = PrioritizedReplay(
            layout,
            config.replay_size,
            alpha=config.priority_exponent,
            beta=config.importance_sampling_exponent,
            frame_dedup=config.frame_dedup,
        )
    except ValueError as error:  # frame dedup of observations that are not frame stacks
        raise ConfigError(f"--frame_dedup does not fit {config.env}: {error}") from error
    return SequenceSink(
        replay,
        num_actors=config.num_actors,
        num_envs=config.num_envs_per_actor,
        seq_len=seq_len,
        seq_overlap=seq_overlap,
        eps_base=config.eps_base,
        eps_alpha=config.eps_alpha,
        samples_per_insert=config.samples_per_insert,
        min_replay_size=config.min_replay_size,
        batch_size=config.batch_size,
    )


def build_replay_learner(
    config: Config,
    *,
    model: torch.nn.Module,
    target_model: torch.nn.Module,
    actor_model: torch.nn.Module,
    sink: SequenceSink,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    precision: str,
    progress: TrainingProgress,
    on_update: Callable[[UpdateStats], None],
) -> ReplayLearner:
    """R2D2 / Ape-X: the learner over the sink's replay, with the loss's constants bound."""
    _, _, burn_in = sequence_layout(config)
    loss_fn = functools.partial(
        r2d2_loss,
        burn_in=burn_in,
        n_step=config.n_step,
        discounting=config.discounting,
        rescale_eps=DEFAULT_RESCALE_EPS if config.value_rescaling else None,
        # R2D2: a step in a sequence's last n rows is burn-in in the next sequence, so it
        # trains here with the shorter return there is. Ape-X: each transition trains its
        # first row only, with a full n-step return or an episode end.
        truncate_at_end=config.algo == "r2d2",
    )
    return ReplayLearner(
        model=model,
        target_model=target_model,
        actor_model=actor_model,
        sink=sink,
        optimizer=optimizer,
        loss_fn=loss_fn,
        device=device,
        batch_size=config.batch_size,
        burn_in=burn_in,
        total_steps=config.total_steps,
        learning_rate=config.learning_rate,
        lr_schedule=config.lr_schedule,
        grad_norm_clipping=config.grad_norm_clipping,
        target_update_period=config.target_update_period,
        min_replay_size=config.min_replay_size,
        num_learner_threads=config.num_learner_threads,
        max_nonfinite_updates=config.max_nonfinite_updates,
        on_update=on_update,
        progress=progress,
        precision=precision,
        clip_rewards=config.reward_clipping == "abs_one",
        seed=config.seed,
    )


def _storage_description(
    config: Config, buffers: RolloutBuffers | SequenceSink, replay: RolloutReplay | None
) -> str:
    """The startup line's account of the run's shared memory."""
    if isinstance(buffers, SequenceSink):
        seq_len, seq_overlap, _ = sequence_layout(config)
        footprint = replay_footprint(
            buffers.replay.spec, frame_dedup=config.frame_dedup, seq_overlap=seq_overlap
        )
        return (
            f"prioritized replay of {config.replay_size:,} sequences of {seq_len} steps"
            f" ({buffers.nbytes() / 2**20:,.0f} MiB, {footprint.per_env_step:,.0f} B per env"
            f" step{', frame dedup' if config.frame_dedup else ''}), learning from"
            f" {config.min_replay_size:,}"
        )
    return f"{config.num_buffers} rollout slots ({buffers.nbytes() / 2**20:.0f} MiB)" + (
        f", LASER replay of {config.replay_size} rollouts ({replay.nbytes() / 2**20:,.0f}"
        f" MiB, {config.num_replayed} of each batch's {config.batch_size} rollouts)"
        if replay is not None
        else ""
    )


def build_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.learning_rate, eps=config.epsilon)
    return torch.optim.RMSprop(
        model.parameters(),
        lr=config.learning_rate,
        alpha=config.alpha,
        momentum=config.momentum,
        eps=config.epsilon,
    )


def build_scheduler(config: Config, optimizer: torch.optim.Optimizer):
    # Agent steps are fresh steps: replayed rollouts were counted when they were fresh.
    steps_per_update = config.unroll_length * (config.batch_size - config.num_replayed)

    def linear_decay(num_updates: int) -> float:
        # r2d2/apex: the ReplayLearner sets the rate from env steps itself and never steps
        # this scheduler; it is only checkpointed.
        if config.lr_schedule == "constant" or config.algo in Q_LEARNING_ALGOS:
            return 1.0
        return 1.0 - min(num_updates * steps_per_update, config.total_steps) / config.total_steps

    return torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def check_resumable(saved: dict[str, Any], config: Config, path: str) -> list[str]:
    """Raise ConfigError on an incompatible checkpoint; return the other changed flags."""
    mismatched = [
        f"--{key} {saved.get(key)!r} in the checkpoint, {getattr(config, key)!r} now"
        for key in _RESUME_MUST_MATCH
        if saved.get(key) != getattr(config, key)
    ]
    # A Q-network and an actor-critic do not fit each other's checkpoints (checkpoints
    # older than --algo are IMPALA's); impala and laser share one model.
    saved_algo = saved.get("algo", "impala")
    if saved_algo != config.algo and {saved_algo, config.algo} & set(Q_LEARNING_ALGOS):
        mismatched.append(f"--algo {saved_algo!r} in the checkpoint, {config.algo!r} now")
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


def open_run_log(config: Config) -> RunLog:
    try:
        return RunLog(config.run_dir, config.to_dict(), config.total_steps)
    except OSError as error:
        raise ConfigError(
            f"cannot write the run directory {config.run_dir}: {error.strerror or error}"
            " (choose a writable --savedir)"
        ) from error


def select_precision(config: Config, device: torch.device, spec: envs.EnvSpec) -> str:
    """The learner's precision, "fp32" or "bf16", with --precision auto resolved.

    auto picks bf16 for image models where bf16 is native. Emulated bf16 (an older
    CPU) is slower than fp32, and so is a few-millisecond MLP update, where the casts
    cost more than the matmuls save. On a 2-core AVX512-BF16 EPYC, bf16 cut the
    AtariNet update (T=80, B=8) from 909 to 413 ms at 1 thread, with gradients within
    1.4% of fp32's (cosine 0.9999); see benchmarks/RESULTS.md.
    """
    if config.precision != "auto":
        return config.precision
    if config.algo in Q_LEARNING_ALGOS:
        # Q-values regress onto targets whose TD errors, late in training, are as small as
        # bf16's resolution near them (8 mantissa bits: 0.016 at Q = 3).
        return "fp32"
    if len(spec.obs_shape) != 3:
        return "fp32"
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_bf16_native() else "fp32"


def cpu_bf16_native() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def acting_bf16(precision: str, device: torch.device) -> bool:
    """Whether acting forward passes on `device` run under bf16 autocast: in a bf16
    run, where `device` has native bf16 (AtariNet at K=8 on one CPU thread: 2.7 ->
    2.2 ms; Pong end to end 1,585 -> 1,675 steps/s, benchmarks/RESULTS.md)."""
    return precision == "bf16" and (device.type == "cuda" or cpu_bf16_native())


def learner_threads(config: Config, device: torch.device, precision: str) -> int | None:
    """torch intra-op threads for the learner; None keeps torch's default (CPU count).

    A CPU bf16 learner gets 1 thread when the actors already fill the cores: its
    oneDNN kernels stall each time one of their threads is preempted. On 2 cores with
    2 actors, a 2-thread bf16 update went from 206 ms alone to 0.4-5.6 s beside the
    actors, a 1-thread one from 334 to 447 ms; end to end, 1 thread gave 1,339-1,381
    steps/s and 2 threads 1,118-1,231 (benchmarks/RESULTS.md).
    """
    if config.num_threads:
        return config.num_threads
    cores = len(os.sched_getaffinity(0))
    if device.type == "cpu" and precision == "bf16" and config.num_actors >= cores:
        return 1
    return None


def prepare_learner_process(config: Config) -> tuple[Config, envs.EnvSpec, torch.device, str]:
    """Seed torch, probe the env's spec, pick device and precision, measure an "auto"
    actor layout (beast/autosize.py), set torch threads. Returns the config with the
    layout resolved."""
    torch.manual_seed(config.seed)
    probe = envs.make(config.env, seed=config.seed, episodic_life=config.episodic_life)
    spec = envs.env_spec(probe)
    probe.close()
    device = select_device(config)
    precision = select_precision(config, device, spec)
    if config.actor_layout_is_auto:
        from beast.autosize import resolve_actor_layout

        config = resolve_actor_layout(
            config,
            spec,
            device,
            functools.partial(build_run_model, config, spec),
            select_policy(config, device),
            precision,
            log=lambda line: print(f"[beast] {line}", flush=True),
        )
        torch.manual_seed(config.seed)  # the measurement drew random numbers
    num_threads = learner_threads(config, device, precision)
    if num_threads:
        torch.set_num_threads(num_threads)
    return config, spec, device, precision


def train(config: Config) -> None:
    """Train until total_steps; returns normally after a clean shutdown."""
    config, spec, device, precision = prepare_learner_process(config)
    q_learning = config.algo in Q_LEARNING_ALGOS
    model = build_run_model(config, spec).to(device)
    # R2D2 / Ape-X: the target network, checkpointed beside the model.
    target_model = build_run_model(config, spec).to(device) if q_learning else None
    if target_model is not None:
        target_model.load_state_dict(model.state_dict())
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer)
    progress = TrainingProgress()
    resumed_from = None
    if config.resume and not has_checkpoint(config.run_dir):
        raise ConfigError(f"--resume: no checkpoint in {config.run_dir}")
    if has_checkpoint(config.run_dir):
        try:
            payload, path, skipped = load_latest_checkpoint(config.run_dir, device)
        except CheckpointError as error:
            raise ConfigError(f"{error} (use a new --xpid to start over)") from error
        changed = check_resumable(payload["config"], config, path)
        try:
            model.load_state_dict(payload["model_state_dict"])
            if target_model is not None:
                target_model.load_state_dict(payload["target_model_state_dict"])
            optimizer.load_state_dict(payload["optimizer_state_dict"])
            scheduler.load_state_dict(payload["scheduler_state_dict"])
        except (RuntimeError, ValueError, KeyError) as error:
            reason = str(error).strip().splitlines()[0]
            raise ConfigError(f"cannot resume from {path}: it does not fit: {reason}") from error
        progress = TrainingProgress(**payload["progress"])
        torch.set_rng_state(payload["torch_rng_state"])
        resumed_from = (path, skipped, changed)

    actor_model = build_run_model(config, spec)
    actor_model.load_state_dict(model.state_dict())
    actor_model.share_memory()
    actor_model.eval()

    buffers: RolloutBuffers | SequenceSink
    if q_learning:
        buffers = build_sequence_sink(config, spec, actor_model)
    else:
        buffers = RolloutBuffers(
            rollout_spec(
                unroll_length=config.unroll_length,
                obs_shape=spec.obs_shape,
                obs_dtype=spec.obs_dtype,
                num_actions=spec.num_actions,
                core_state_shapes=core_state_shapes(actor_model.initial_state(1)),
            ),
            config.num_buffers,
        )
    log = open_run_log(config)
    log.start_from(progress.step)
    if resumed_from is not None:
        path, skipped, changed = resumed_from
        if skipped:
            log.print(f"the newest checkpoint is unusable ({skipped}); using the previous one")
        log.print(
            f"resuming {config.xpid} from {path} at step {progress.step:,}"
            f" ({progress.num_updates:,} updates)"
            + (f"; changed flags: {', '.join(changed)}" if changed else "")
        )
    replay: RolloutReplay | None = None
    learner: Learner | ReplayLearner
    if isinstance(buffers, SequenceSink):
        learner = build_replay_learner(
            config,
            model=model,
            target_model=target_model,
            actor_model=actor_model,
            sink=buffers,
            optimizer=optimizer,
            device=device,
            precision=precision,
            progress=progress,
            on_update=log.record,
        )
    else:
        replay = build_replay(config, buffers)
        learner = Learner(
            model=model,
            actor_model=actor_model,
            buffers=buffers,
            optimizer=optimizer,
            scheduler=scheduler,
            loss_fn=build_loss(config),
            device=device,
            batch_size=config.batch_size,
            total_steps=config.total_steps,
            grad_norm_clipping=config.grad_norm_clipping,
            num_learner_threads=config.num_learner_threads,
            max_nonfinite_updates=config.max_nonfinite_updates,
            precision=precision,
            on_update=log.record,
            progress=progress,
            forward=CompiledForward(model, log.print) if config.compile else None,
            replay=replay,
            num_replayed=config.num_replayed,
        )

    def checkpoint() -> None:
        with learner.lock:
            if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
                log.print("the model has non-finite weights: keeping the previous checkpoint")
                return
            payload = {
                "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(),
                "scheduler_state_dict": scheduler.state_dict(),
                "config": config.to_dict(),
                "progress": dataclasses.asdict(progress),
                "torch_rng_state": torch.get_rng_state(),
                # Kept at the top level for tools that only want the step.
                "step": progress.step,
            }
            if target_model is not None:
                payload["target_model_state_dict"] = target_model.state_dict()
            save_checkpoint(config.run_dir, payload)

    log.print(
        f"run {config.xpid} in {config.run_dir}: env {config.env} (obs {spec.obs_shape}"
        f" {spec.obs_dtype}, {spec.num_actions} actions), {config.num_actors} actors x"
        f" {config.num_envs_per_actor} envs, {_storage_description(config, buffers, replay)}"
        f", learner on {device} in {precision}"
        f" with {torch.get_num_threads()} thread(s)"
    )
    if progress.step >= config.total_steps:
        log.print(f"already at total_steps {config.total_steps:,}; raise --total_steps to go on")
        log.close()
        return
    policy = select_policy(config, device)
    table: InferenceTable | None = None
    server: InferenceServer | None = None
    if policy == "central":
        table, server = build_inference(
            config, spec, actor_model, device, lambda: learner.progress.num_updates, precision
        )
        log.print(
            f"central inference on {server.device} in {'bf16' if server.bf16 else 'fp32'}:"
            f" {config.num_inference_threads} thread(s),"
            f" batches of up to {server.max_batch} envs,"
            f" each actor's envs in {table.num_env_splits} lane(s) of {table.lane_envs}"
        )
    actors = ActorPool(
        settings=ActorSettings(
            env=config.env,
            seed=config.seed,
            num_envs=config.num_envs_per_actor,
            unroll_length=config.unroll_length,
            episodic_life=config.episodic_life,
            bf16=acting_bf16(precision, torch.device("cpu")),
            num_env_splits=config.env_splits(policy),
        ),
        buffers=buffers,
        policy_source=table if table is not None else actor_model,
        num_actors=config.num_actors,
        max_restarts=config.max_actor_restarts,
        log=log.print,
    )
    # Installed explicitly: a shell starts background jobs with SIGINT ignored,
    # and `kill -INT` must still stop the run cleanly.
    previous_handlers = {
        signum: signal.signal(signum, raise_keyboard_interrupt)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    failure: str | None = None
    try:
        if server is not None:
            server.start()
        actors.start()
        learner.start()
        failure = _monitor(config, learner, actors, server, log, checkpoint)
    except KeyboardInterrupt:
        log.print("interrupted: stopping actors and learner, writing a final checkpoint")
    except CheckpointError as error:
        failure = str(error)
    finally:
        # Shutdown is bounded; a second Ctrl-C or a group-wide SIGTERM must not
        # cut it short and leave actors or a half-written checkpoint behind.
        for signum in previous_handlers:
            signal.signal(signum, signal.SIG_IGN)
        try:
            learner.stop(_LEARNER_STOP_SECONDS)
            buffers.close()
            if table is not None:
                table.close()
            actors.stop(_ACTOR_JOIN_SECONDS)
            if server is not None:
                server.stop(_LEARNER_STOP_SECONDS)
            checkpoint()
            log.print(f"checkpoint at step {progress.step:,} in {config.run_dir}")
            if config.profile:
                _print_profile(learner, actors, log)
            if server is not None:
                log.print(f"central inference: {server.stats.summary()}")
        except CheckpointError as error:
            failure = failure or str(error)
        finally:
            log.close()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
    if failure:
        raise TrainingError(failure)


def _print_profile(learner: Learner | ReplayLearner, actors: ActorPool, log: RunLog) -> None:
    for line in format_profile(
        actors.phase_seconds,
        learner.phase_seconds,
        num_updates=learner.progress.num_updates,
        steps=learner.progress.step,
    ):
        log.print(f"profile: {line}")


def _monitor(
    config: Config,
    learner: Learner | ReplayLearner,
    actors: ActorPool,
    server: InferenceServer | None,
    log: RunLog,
    checkpoint,
) -> str | None:
    """Main-thread loop: actor supervision, progress lines, periodic checkpoints."""
    last_line = last_checkpoint = time.monotonic()
    while not learner.finished.wait(_MONITOR_SECONDS):
        failure = actors.check()
        if failure:
            return failure
        if server is not None and server.failed.is_set():
            error = server.error
            log.print("inference failed:\n" + "".join(traceback.format_exception(error)).rstrip())
            return f"inference failed: {type(error).__name__}: {error}"
        now = time.monotonic()
        if now - last_line >= config.log_interval:
            filling = learner.filling_line() if isinstance(learner, ReplayLearner) else None
            if filling is not None:
                log.print(filling)
            else:
                log.report_progress()
            if config.profile:
                _print_profile(learner, actors, log)
                if server is not None:
                    log.print(f"profile: central inference: {server.stats.summary()}")
            last_line = now
        if now - last_checkpoint >= config.checkpoint_interval:
            checkpoint()
            last_checkpoint = now
    if learner.error is not None:
        error = learner.error
        if isinstance(error, NonFiniteError):
            return str(error)
        log.print("learner failed:\n" + "".join(traceback.format_exception(error)).rstrip())
        return f"learner failed: {type(error).__name__}: {error}"
    log.report_progress()
    log.print(f"reached total_steps {config.total_steps:,}")
    return None
