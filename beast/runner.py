"""MonoBeast training: build the components, run them, shut them down.

The components come from beast/engine.py, through the algorithm registry; nothing here
names an algorithm. One shutdown protocol for every way a run ends (total_steps reached,
Ctrl-C, SIGTERM, too many actor deaths, a failed learner): stop the learner threads,
close the sink (which wakes and stops every actor), join the actors with a timeout, kill
what is left, then write the final checkpoint (unless the model is not finite: a good
checkpoint is never overwritten by a diverged one). Shared memory is shared through file
descriptors that torch unlinks at creation, so no /dev/shm segment outlives the
processes.

A run whose directory already holds a checkpoint resumes from it: model, the
algorithm's state (optimizers, target networks), step counters, RNG state and, with
--checkpoint_replay, the replay; flags that define the model must match.

--serial runs the same components with no actor process and no thread
(beast/serial.py).

With --eval_interval an evaluator process (beast/evaluator.py) plays the evaluation
policy on snapshots the learner hands it; it is supervised with the actors, and a run
that reaches total_steps waits for its last evaluation before shutting down.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from typing import Any

import torch

from beast.actor import ActorSettings
from beast.checkpoint import CheckpointError
from beast.config import Config, ConfigError, describe_defaults
from beast.engine import (
    Run,
    acting_bf16,
    build_checked_model,
    build_run,
    load_resume_payload,
    prepare,
    restore,
    select_policy,
)
from beast.envs.batch import resolve_backend
from beast.evaluator import Evaluation, build_evaluator, describe_evaluation
from beast.inference import InferenceServer, InferenceTable
from beast.learner import NonFiniteError, UpdateStats
from beast.logs import RunLog
from beast.profile import format_profile
from beast.supervisor import ActorPool, ForkServerError, start_actor_server
from beast.wandb_log import WandbSettings

__all__ = [
    "TrainingError",
    "actor_settings",
    "build_inference",
    "open_run_log",
    "end_of_run",
    "raise_keyboard_interrupt",
    "start_evaluation",
    "start_run",
    "stop_on_signals",
    "train",
]

# Seconds actors get to exit after the sink closes before they are killed.
_ACTOR_JOIN_SECONDS = 5.0
# How often the main thread checks on actors and the learner.
_MONITOR_SECONDS = 0.5
# Seconds learner threads get to finish an update in flight.
_LEARNER_STOP_SECONDS = 3.0


class TrainingError(RuntimeError):
    """A run that had to stop; the message says why in one line."""


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> dict[int, Any]:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt; returns the handlers they replace.

    Installed explicitly: a shell starts background jobs with SIGINT ignored, and `kill
    -INT` must still stop the run cleanly. Only the main thread may set handlers: a run
    started from another thread (a Ray Tune trial, beast.train in a thread) keeps the
    process's own and returns {}; it ends at total_steps or on an error.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {
        signum: signal.signal(signum, raise_keyboard_interrupt)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }


def open_run_log(config: Config) -> RunLog:
    try:
        return RunLog(
            config.run_dir,
            config.to_dict(),
            config.total_steps,
            evaluation=config.eval_interval > 0,
            wandb=WandbSettings.from_config(config),
        )
    except OSError as error:
        raise ConfigError(
            f"cannot write the run directory {config.run_dir}: {error.strerror or error}"
            " (choose a writable --savedir)"
        ) from error


def build_inference(run: Run, num_updates=lambda: 0) -> tuple[InferenceTable, InferenceServer]:
    """The request table and the inference server for --policy central.

    The server acts with its own copy of the model on --actor_device (default the
    learner's device), refreshed from `run.actor_model`, the weights the learner
    publishes; the table holds the policy's record and per-env parameters.
    """
    config = run.config
    table = InferenceTable(
        num_actors=config.num_actors,
        num_envs=config.num_envs_per_actor,
        obs=run.spec.obs_fields(),
        policy=run.policy,
        initial_state=run.actor_model.initial_state(1),
        num_servers=config.num_inference_threads,
        num_env_splits=config.env_splits("central"),
    )
    server_device = torch.device(config.actor_device) if config.actor_device else run.device
    server = InferenceServer(
        table=table,
        policy=run.policy,
        model=build_checked_model(run.algorithm),
        source=run.actor_model,
        device=server_device,
        max_batch=config.max_inference_batch or config.slots_in_use_by_actors,
        batch_window=config.inference_timeout_ms / 1000.0,
        sync_every=config.inference_sync_every,
        num_updates=num_updates,
        bf16=acting_bf16(run.precision, server_device),
    )
    return table, server


def actor_settings(run: Run, policy: str) -> ActorSettings:
    config = run.config
    return ActorSettings(
        env=config.env,
        seed=config.seed,
        num_actors=config.num_actors,
        num_envs=config.num_envs_per_actor,
        episodic_life=config.episodic_life,
        policy=run.policy,
        env_backend=config.env_backend,
        return_discount=config.return_discount(),
        bf16=acting_bf16(run.precision, torch.device("cpu")),
        num_env_splits=config.env_splits(policy),
    )


def start_run(config: Config) -> tuple[Run, RunLog]:
    """Build the run's components, resume it if its directory holds a checkpoint, open its
    log and print the start-up line (shared by `train` and --serial)."""
    config, spec, device, precision = prepare(config)
    resumed = load_resume_payload(config)  # a checkpoint that does not fit stops us here
    log = open_run_log(config)
    try:
        run = build_run(
            config,
            spec,
            device,
            precision,
            num_writers=config.num_actors,
            on_update=log.record,
            log=log.print,
        )
    except BaseException:
        log.close()
        raise
    if resumed is not None:
        payload, path, skipped, changed = resumed
        replay_line = restore(run, payload, path)
        if skipped:
            log.print(f"the newest checkpoint is unusable ({skipped}); using the previous one")
        log.print(
            f"resuming {config.xpid} from {path} at step {run.progress.step:,}"
            f" ({run.progress.num_updates:,} updates)"
            + (f"; changed flags: {', '.join(changed)}" if changed else "")
            + (f"; {replay_line}" if replay_line else "")
        )
    log.start_from(run.progress.step)
    # An actor steps its envs in lanes of K / splits (--num_env_splits); --serial's is local.
    policy = "local" if config.serial else select_policy(config, device)
    lane_envs = config.num_envs_per_actor // config.env_splits(policy)
    log.print(
        f"run {config.xpid} in {config.run_dir}: env {config.env} (obs {spec.describe_obs()},"
        f" {spec.describe_actions()}), {run.describe()},"
        f" {config.num_actors} actors x {config.num_envs_per_actor} envs"
        f" ({resolve_backend(config.env, config.env_backend, lane_envs)} env batches),"
        f" learner on {device} in {precision} with {torch.get_num_threads()} thread(s);"
        f" {describe_defaults(config, spec)}"
    )
    return run, log


def start_evaluation(run: Run, log: RunLog) -> Evaluation | None:
    """The run's evaluator (--eval_interval; the process is not started yet), or None; the
    learner's `on_update` then hands it each update's stats after the run log (shared by
    `train` and --serial)."""
    evaluator = build_evaluator(run, log, run.progress.step)
    if evaluator is None:
        return None
    record = run.learner.on_update

    def on_update(stats: UpdateStats) -> None:
        record(stats)
        evaluator.after_update(stats)

    run.learner.on_update = on_update
    log.print(describe_evaluation(run.config))
    return evaluator


def _save(run: Run, log: RunLog) -> None:
    if not run.save():
        log.print("the model has non-finite weights: keeping the previous checkpoint")


def train(config: Config) -> None:
    """Train until total_steps; returns normally after a clean shutdown."""
    if config.serial:
        from beast.serial import train_serial

        train_serial(config)
        return
    start_actor_server()
    run, log = start_run(config)
    config = run.config
    if run.progress.step >= run.learner.total_steps:
        flag = "stop_step" if run.learner.total_steps < config.total_steps else "total_steps"
        log.print(f"already at {end_of_run(run)}; raise --{flag} to go on")
        log.close()
        return
    learner = run.learner
    policy = select_policy(config, run.device)
    table: InferenceTable | None = None
    server: InferenceServer | None = None
    if policy == "central":
        table, server = build_inference(run, lambda: learner.progress.num_updates)
        log.print(
            f"central inference on {server.device} in {'bf16' if server.bf16 else 'fp32'}:"
            f" {config.num_inference_threads} thread(s),"
            f" batches of up to {server.max_batch} envs,"
            f" each actor's envs in {table.num_env_splits} lane(s) of {table.lane_envs}"
        )
    try:
        evaluator = start_evaluation(run, log)
    except BaseException:
        log.close()
        raise
    actors = ActorPool(
        settings=actor_settings(run, policy),
        sink=run.sink,
        policy_source=table if table is not None else run.actor_model,
        num_actors=config.num_actors,
        max_restarts=config.max_actor_restarts,
        log=log.print,
    )
    previous_handlers = stop_on_signals()
    failure: str | None = None
    try:
        if server is not None:
            server.start()
        actors.start()
        if evaluator is not None:
            evaluator.start()
        learner.start()
        failure = _monitor(run, actors, server, evaluator, log)
        if failure is None and evaluator is not None:
            learner.stop(_LEARNER_STOP_SECONDS)  # its last update may hand a snapshot
            evaluator.finish(run.progress.step)
    except KeyboardInterrupt:
        log.print("interrupted: stopping actors and learner, writing a final checkpoint")
    except (CheckpointError, ForkServerError) as error:
        failure = str(error)
    finally:
        # Shutdown is bounded; a second Ctrl-C or a group-wide SIGTERM must not
        # cut it short and leave actors or a half-written checkpoint behind.
        for signum in previous_handlers:
            signal.signal(signum, signal.SIG_IGN)
        try:
            learner.stop(_LEARNER_STOP_SECONDS)
            run.source.close()
            if table is not None:
                table.close()
            actors.stop(_ACTOR_JOIN_SECONDS)
            if evaluator is not None:
                evaluator.close()
            if server is not None:
                server.stop(_LEARNER_STOP_SECONDS)
            _save(run, log)
            log.print(f"checkpoint at step {run.progress.step:,} in {config.run_dir}")
            if config.profile:
                _print_profile(run, actors, log)
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


def _print_profile(run: Run, actors: ActorPool, log: RunLog) -> None:
    for line in format_profile(
        actors.phase_seconds,
        run.learner.phase_seconds,
        num_updates=run.progress.num_updates,
        steps=run.progress.step,
    ):
        log.print(f"profile: {line}")


def learner_failure(run: Run, log: RunLog) -> str | None:
    """Why the learner stopped, if it failed (its traceback goes to the log once)."""
    error = run.learner.error
    if error is None:
        return None
    if isinstance(error, NonFiniteError):
        return str(error)
    log.print("learner failed:\n" + "".join(traceback.format_exception(error)).rstrip())
    return f"learner failed: {type(error).__name__}: {error}"


def report(run: Run, log: RunLog) -> None:
    """A progress line: the source's own while it is not ready (a replay filling up),
    else the run log's."""
    status = run.source.status_line() if not run.progress.num_updates else None
    if status is not None:
        log.print(status)
    else:
        log.report_progress()


def _monitor(
    run: Run,
    actors: ActorPool,
    server: InferenceServer | None,
    evaluator: Evaluation | None,
    log: RunLog,
) -> str | None:
    """Main-thread loop: actor and evaluator supervision, evaluation results, progress
    lines, periodic checkpoints."""
    config, learner = run.config, run.learner
    last_line = last_checkpoint = time.monotonic()
    while not learner.finished.wait(_MONITOR_SECONDS):
        failure = actors.check() or (evaluator.check() if evaluator is not None else None)
        if failure:
            return failure
        if server is not None and server.failed.is_set():
            error = server.error
            log.print("inference failed:\n" + "".join(traceback.format_exception(error)).rstrip())
            return f"inference failed: {type(error).__name__}: {error}"
        now = time.monotonic()
        if now - last_line >= config.log_interval:
            report(run, log)
            if config.profile:
                _print_profile(run, actors, log)
                if server is not None:
                    log.print(f"profile: central inference: {server.stats.summary()}")
            last_line = now
        if now - last_checkpoint >= config.checkpoint_interval:
            _save(run, log)
            last_checkpoint = now
    failure = learner_failure(run, log)
    if failure:
        return failure
    log.report_progress()
    log.print(f"reached {end_of_run(run)}")
    return None


def end_of_run(run: Run) -> str:
    """Where this process stops training: total_steps, or --stop_step short of it."""
    config = run.config
    if run.learner.total_steps < config.total_steps:
        return f"stop_step {run.learner.total_steps:,} (total_steps {config.total_steps:,})"
    return f"total_steps {config.total_steps:,}"
