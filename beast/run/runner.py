"""MonoBeast training: build the components, run them, shut them down.

The components come from the run's plan and build (beast/run/plan.py, build.py), through the
algorithm registry; nothing here names an algorithm. One shutdown protocol for every way a run ends
(total_steps reached, Ctrl-C, SIGTERM, too many actor deaths, a failed learner): stop the learner
threads, close the sink (which wakes and stops every actor), join the actors with a timeout, kill
what is left, then write the final checkpoint (unless the model is not finite: a good checkpoint is
never overwritten by a diverged one). Shared memory is shared through file
descriptors that torch unlinks at creation, so no /dev/shm segment outlives the
processes.

A run whose directory already holds a checkpoint resumes from it: model, the
algorithm's state (optimizers, target networks), step counters, RNG state and, with
--checkpoint_replay, the replay; flags that define the model must match.

--serial runs the same components with no actor process and no thread
(beast/run/serial.py).

With --eval_interval an evaluator process (beast/run/evaluator.py) plays the evaluation
policy on snapshots the learner hands it; it is supervised with the actors, and a run
that reaches total_steps waits for its last evaluation before shutting down.
"""

from __future__ import annotations

import signal
import time
import traceback

import torch

from beast.acting import fork_server
from beast.acting.inference import InferenceServer, InferenceTable
from beast.acting.supervisor import ActorPool, ForkServerError
from beast.algos.build import build_checked_model
from beast.config import Config
from beast.outputs.checkpoint import CheckpointError
from beast.outputs.logs import RunLog
from beast.run.build import Run
from beast.run.evaluator import Evaluation
from beast.run.lifecycle import (
    TrainingError,
    actor_settings,
    end_of_run,
    learner_failure,
    open_run_log,
    report,
    start_evaluation,
    start_run,
)
from beast.run.plan import acting_bf16
from beast.train_step import MODULES_IN_USE
from beast.util.interrupts import raise_if_stop_requested, stop_on_signals
from beast.util.profile import format_profile

__all__ = [
    "TrainingError",
    "actor_settings",
    "build_inference",
    "open_run_log",
    "end_of_run",
    "start_evaluation",
    "start_run",
    "train",
]

# Seconds actors get to exit after the sink closes before they are killed.
_ACTOR_JOIN_SECONDS = 5.0
# How often the main thread checks on actors and the learner.
_MONITOR_SECONDS = 0.5
# Seconds learner threads get to finish an update in flight.
_LEARNER_STOP_SECONDS = 3.0


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


def _save(run: Run, log: RunLog) -> None:
    if MODULES_IN_USE.compilation_holds_them():  # `Run.save` takes them too
        log.print("the checkpoint waits for the learner's compilation under way to end")
    if not run.save():
        log.print("the model has non-finite weights: keeping the previous checkpoint")


def train(config: Config) -> None:
    """Train until total_steps; returns normally after a clean shutdown."""
    if config.serial:
        from beast.run.serial import train_serial

        train_serial(config)
        return
    # Now, before the run's start-up: the server imports torch and the actor's modules
    # on the other core while this process probes the env and builds the model.
    fork_server.start()
    run, log = start_run(config)
    config = run.config
    if run.progress.step >= run.learner.total_steps:
        flag = "stop_step" if run.learner.total_steps < config.total_steps else "total_steps"
        log.print(f"already at {end_of_run(run)}; raise --{flag} to go on")
        log.close()
        return
    learner = run.learner
    table: InferenceTable | None = None
    server: InferenceServer | None = None
    if run.plan.policy_mode == "central":
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
        settings=actor_settings(run),
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
        raise_if_stop_requested()
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
