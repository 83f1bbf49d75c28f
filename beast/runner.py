"""MonoBeast training: build the components, run them, shut them down.

One shutdown protocol for every way a run ends (total_steps reached, Ctrl-C,
SIGTERM, a failed actor or learner thread): stop the learner threads, close
both slot queues (which wakes and stops every actor), join the actors with a
timeout, kill what is left, then write the final checkpoint. Rollout memory
is shared through file descriptors that torch unlinks at creation, so no
/dev/shm segment outlives the processes.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any

import torch

from beast import envs
from beast.actor import ActorSettings, run_actor
from beast.algos.impala import impala_loss
from beast.buffers import RolloutBuffers, rollout_spec
from beast.checkpoint import CHECKPOINT_NAME, save_checkpoint
from beast.config import Config
from beast.learner import Learner, TrainingProgress
from beast.logs import RunLog
from beast.models import build_model

__all__ = ["train", "TrainingError", "build_run_model", "select_device"]

# Seconds actors get to exit after the queues close before they are killed.
_ACTOR_JOIN_SECONDS = 5.0
# Seconds learner threads get to finish an update in flight.
_LEARNER_STOP_SECONDS = 3.0


class TrainingError(RuntimeError):
    """A run that had to stop; the message says why in one line."""


def select_device(config: Config) -> torch.device:
    if not config.disable_cuda and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def build_run_model(config: Config, spec: envs.EnvSpec) -> torch.nn.Module:
    return build_model(
        config.model,
        spec.obs_shape,
        spec.num_actions,
        use_lstm=config.use_lstm,
        hidden_size=config.hidden_size,
    )


def _optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.learning_rate, eps=config.epsilon)
    return torch.optim.RMSprop(
        model.parameters(),
        lr=config.learning_rate,
        alpha=config.alpha,
        momentum=config.momentum,
        eps=config.epsilon,
    )


def _scheduler(config: Config, optimizer: torch.optim.Optimizer):
    steps_per_update = config.unroll_length * config.batch_size

    def linear_decay(num_updates: int) -> float:
        if config.lr_schedule == "constant":
            return 1.0
        return 1.0 - min(num_updates * steps_per_update, config.total_steps) / config.total_steps

    return torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def train(config: Config) -> None:
    """Train until total_steps; returns normally after a clean shutdown."""
    torch.manual_seed(config.seed)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    probe = envs.make(config.env, seed=config.seed, episodic_life=config.episodic_life)
    spec = envs.env_spec(probe)
    probe.close()

    device = select_device(config)
    model = build_run_model(config, spec).to(device)
    actor_model = build_run_model(config, spec)
    actor_model.load_state_dict(model.state_dict())
    actor_model.share_memory()
    actor_model.eval()

    core_shapes = [s.shape[:1] + s.shape[2:] for s in actor_model.initial_state(1)]
    buffers = RolloutBuffers(
        rollout_spec(
            unroll_length=config.unroll_length,
            obs_shape=spec.obs_shape,
            obs_dtype=spec.obs_dtype,
            num_actions=spec.num_actions,
            core_state_shapes=core_shapes,
        ),
        config.num_buffers,
    )
    optimizer = _optimizer(config, model)
    scheduler = _scheduler(config, optimizer)
    log = RunLog(config.run_dir, config.to_dict(), config.total_steps)
    progress = TrainingProgress()
    loss_fn = functools.partial(
        impala_loss,
        discounting=config.discounting,
        reward_clipping=config.reward_clipping,
        baseline_cost=config.baseline_cost,
        entropy_cost=config.entropy_cost,
    )
    learner = Learner(
        model=model,
        actor_model=actor_model,
        buffers=buffers,
        optimizer=optimizer,
        scheduler=scheduler,
        loss_fn=loss_fn,
        device=device,
        batch_size=config.batch_size,
        total_steps=config.total_steps,
        grad_norm_clipping=config.grad_norm_clipping,
        num_learner_threads=config.num_learner_threads,
        on_update=log.record,
        progress=progress,
    )

    def checkpoint() -> None:
        with learner.lock:
            payload = {
                "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(),
                "scheduler_state_dict": scheduler.state_dict(),
                "config": config.to_dict(),
                "step": progress.step,
                "num_updates": progress.num_updates,
            }
            save_checkpoint(os.path.join(config.run_dir, CHECKPOINT_NAME), payload)

    log.print(
        f"run {config.xpid} in {config.run_dir}: env {config.env} (obs {spec.obs_shape}"
        f" {spec.obs_dtype}, {spec.num_actions} actions), {config.num_actors} actors x"
        f" {config.num_envs_per_actor} envs, {config.num_buffers} rollout slots"
        f" ({buffers.nbytes() / 2**20:.0f} MiB), learner on {device}"
    )
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["beast.actor"])
    settings = ActorSettings(
        env=config.env,
        seed=config.seed,
        num_envs=config.num_envs_per_actor,
        unroll_length=config.unroll_length,
        episodic_life=config.episodic_life,
    )
    actors = [
        ctx.Process(
            target=run_actor,
            name=f"actor-{i}",
            args=(i, settings, buffers, actor_model, os.getpid()),
        )
        for i in range(config.num_actors)
    ]
    # Installed explicitly: a shell starts background jobs with SIGINT ignored,
    # and `kill -INT` must still stop the run cleanly.
    previous_handlers = {
        signum: signal.signal(signum, _raise_keyboard_interrupt)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    failure: str | None = None
    try:
        for actor in actors:
            actor.start()
        learner.start()
        failure = _monitor(config, learner, actors, log, checkpoint)
    except KeyboardInterrupt:
        log.print("interrupted: stopping actors and learner, writing a final checkpoint")
    finally:
        # Shutdown is bounded; a second Ctrl-C or a group-wide SIGTERM must not
        # cut it short and leave actors or a half-written checkpoint behind.
        for signum in previous_handlers:
            signal.signal(signum, signal.SIG_IGN)
        try:
            learner.stop(_LEARNER_STOP_SECONDS)
            buffers.close()
            _join_actors(actors)
            checkpoint()
            log.print(f"checkpoint at step {progress.step:,} in {config.run_dir}")
        finally:
            log.close()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
    if failure:
        raise TrainingError(failure)


def _monitor(
    config: Config, learner: Learner, actors: list[mp.Process], log: RunLog, checkpoint
) -> str | None:
    """Main-thread loop: progress lines, periodic checkpoints, health checks."""
    last_checkpoint = time.monotonic()
    while not learner.finished.wait(config.log_interval):
        log.print(log.progress_line())
        for actor in actors:
            if not actor.is_alive():
                return (
                    f"{actor.name} exited with code {actor.exitcode} (its error is printed"
                    " above); stopping the run"
                )
        if time.monotonic() - last_checkpoint >= config.checkpoint_interval:
            checkpoint()
            last_checkpoint = time.monotonic()
    if learner.error is not None:
        error = learner.error
        log.print("learner failed:\n" + "".join(traceback.format_exception(error)).rstrip())
        return f"learner failed: {type(error).__name__}: {error}"
    log.print(log.progress_line())
    log.print(f"reached total_steps {config.total_steps:,}")
    return None


def _join_actors(actors: list[mp.Process]) -> None:
    deadline = time.monotonic() + _ACTOR_JOIN_SECONDS
    for actor in actors:
        if actor.pid is None:
            continue
        actor.join(max(0.0, deadline - time.monotonic()))
    for actor in actors:
        if actor.pid is not None and actor.is_alive():
            actor.kill()
            actor.join(1.0)
