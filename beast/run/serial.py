"""--serial: the learner and one actor's envs take turns in this one process.

No actor process, no learner or inference thread: the main thread steps the actor's K
envs (the same `beast.acting.actor.Actor`, writing into the same sink) and, whenever the
source has a batch, runs one learner update on it (the same `Learner.step`), so that a
user can put `breakpoint()` inside an env or a model and step through both (rlpyt's
serial sampler). It is slower than the parallel run, and it is the same algorithm:

- rollouts: an update as soon as `--batch_size` rollouts are full, so the learner
  trains on data from the newest weights;
- a replay: updates while the learner is behind `--samples_per_insert` sampled
  sequences per inserted one (past `--min_replay_size`), which must be positive here:
  it is the update-to-data ratio that actors and learner otherwise keep by waiting
  for each other.

The run is one actor (`--num_actors` is taken as 1) with `--policy local`; the rollout
slots are at least 2K + B, so the actor never waits for a slot the learner would free.
With --eval_interval, the evaluation runs inline too, right after the update that passes
each multiple (beast/run/evaluator.py `InlineEvaluator`): training waits for it.
Ctrl-C stops it with a final checkpoint, as a parallel run.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import traceback

import torch

from beast.acting.actor import Actor
from beast.config import Config, ConfigError
from beast.learning.learner import NonFiniteError
from beast.outputs.checkpoint import CheckpointError
from beast.run.lifecycle import (
    TrainingError,
    actor_settings,
    end_of_run,
    report,
    start_evaluation,
    start_run,
    update_note,
)
from beast.util.interrupts import raise_if_stop_requested, stop_on_signals
from beast.util.profile import ACTOR_PHASES, PhaseClock

__all__ = ["train_serial"]


def serial_config(config: Config) -> Config:
    """`config` as --serial runs it: one actor, enough slots (module docstring)."""
    if config.policy == "central":
        raise ConfigError("--serial acts with the learner's own model; use --policy local")
    if config.actor_layout_is_auto:
        raise ConfigError("--serial runs one actor: give --num_envs_per_actor a number")
    k, batch = config.num_envs_per_actor, config.batch_size
    return dataclasses.replace(
        config,
        num_actors=1,
        policy="local",
        num_env_splits=1,
        num_buffers=max(config.num_buffers or 0, 2 * k + batch),
    )


def train_serial(config: Config) -> None:
    """Train until total_steps in this process; returns after a clean stop."""
    run, log = start_run(serial_config(config))
    config = run.config
    refusal = run.algorithm.experience().serial_refusal()
    if refusal:
        log.close()
        raise ConfigError(refusal)
    try:
        evaluator = start_evaluation(run, log)
    except BaseException:
        log.close()
        raise
    run.sink.take_turns()
    progress, learner, source = run.progress, run.learner, run.source
    clock = PhaseClock(torch.zeros(len(ACTOR_PHASES), dtype=torch.float64), ACTOR_PHASES)
    previous = stop_on_signals()
    failure: str | None = None
    actor = None
    try:
        actor = Actor(0, 0, actor_settings(run), run.sink, run.actor_model, os.getpid(), clock)
        last_line = last_checkpoint = time.monotonic()
        while progress.step < learner.total_steps:
            batch = source.poll()
            if batch is not None:
                learner.on_update(learner.step(batch))  # the run log, and the evaluator
            else:
                with torch.no_grad():
                    if not actor.step():
                        break
                progress.step += source.pending_steps()
            raise_if_stop_requested()
            now = time.monotonic()
            if now - last_line >= config.log_interval:
                report(run, log)
                last_line = now
            if now - last_checkpoint >= config.checkpoint_interval:
                run.save()
                last_checkpoint = now
        if progress.step >= learner.total_steps:
            log.report_progress(update_note(run))
            log.print(f"reached {end_of_run(run)}")
            if evaluator is not None:
                evaluator.finish(progress.step)
    except KeyboardInterrupt:
        log.print("interrupted: writing a final checkpoint")
    except NonFiniteError as error:
        failure = str(error)
    except Exception as error:  # an env or the update failed: say where, once
        log.print("serial run failed:\n" + "".join(traceback.format_exception(error)).rstrip())
        failure = f"serial run failed: {type(error).__name__}: {error}"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        try:
            if actor is not None:
                actor.close()
            if evaluator is not None:
                evaluator.close()
            run.source.close()
            if not run.save():
                log.print("the model has non-finite weights: keeping the previous checkpoint")
            log.print(f"checkpoint at step {progress.step:,} in {config.run_dir}")
        except CheckpointError as error:
            failure = failure or str(error)
        finally:
            log.close()
    if failure:
        raise TrainingError(failure)
