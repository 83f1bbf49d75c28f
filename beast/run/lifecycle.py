"""What a monobeast run does around its loop, shared by the threaded run (beast/run/runner.py),
--serial (beast/run/serial.py) and polybeast's learners (beast/poly/trainer.py): build and
resume the run, open its log, start its evaluation, and report progress and a failed
learner (Ctrl-C and SIGTERM: beast/util/interrupts.py).

Its own module so that --serial, which the runner starts, does not import the runner.
"""

from __future__ import annotations

import traceback

import torch

from beast.acting.actor import ActorSettings
from beast.config import Config, ConfigError, describe_defaults
from beast.envs.batch import resolve_backend
from beast.learning.learner import NonFiniteError, UpdateStats
from beast.outputs.logs import RunLog
from beast.outputs.wandb_log import WandbSettings
from beast.run.build import Run, build_run
from beast.run.evaluator import Evaluation, build_evaluator, describe_evaluation
from beast.run.plan import acting_bf16, plan_run
from beast.run.resume import load_resume_payload, restore
from beast.train_step import MODULES_IN_USE

__all__ = [
    "end_of_run",
    "TrainingError",
    "actor_settings",
    "learner_failure",
    "open_run_log",
    "report",
    "start_evaluation",
    "start_run",
    "update_note",
]


class TrainingError(RuntimeError):
    """A run that had to stop; the message says why in one line."""


# A wait for a compilation this long is said beside the progress line (`report`).
_SAY_WAITS_OVER_SECONDS = 5.0


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


def actor_settings(run: Run) -> ActorSettings:
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
        num_env_splits=config.env_splits(run.plan.policy_mode),
    )


def start_run(config: Config) -> tuple[Run, RunLog]:
    """Build the run's components, resume it if its directory holds a checkpoint, open its
    log and print the start-up line (shared by `train` and --serial)."""
    plan = plan_run(config)
    config, spec = plan.config, plan.spec
    resumed = load_resume_payload(config)  # a checkpoint that does not fit stops us here
    log = open_run_log(config)
    try:
        run = build_run(
            plan,
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
    # An actor steps its envs in lanes of K / splits (--num_env_splits).
    lane_envs = config.num_envs_per_actor // config.env_splits(plan.policy_mode)
    log.print(
        f"run {config.xpid} in {config.run_dir}: env {config.env} (obs {spec.describe_obs()},"
        f" {spec.describe_actions()}), {run.describe()},"
        f" {config.num_actors} actors x {config.num_envs_per_actor} envs"
        f" ({resolve_backend(config.env, config.env_backend, lane_envs)} env batches),"
        f" learner on {plan.device} in {plan.precision} with {torch.get_num_threads()}"
        f" thread(s){_update_plan(run)};"
        f" {describe_defaults(config, spec)}"
    )
    return run, log


def _update_plan(run: Run) -> str:
    """The start-up line's account of the update's path (beast/train_step `TrainStep.plan`:
    eager, compiled from an earlier run's package, or compiled in the background after its
    first steps, with about how long that takes), after a comma; empty for an update
    without a train step."""
    train_step = getattr(run.update, "train_step", None)
    return f", {train_step.plan()}" if train_step is not None else ""


def update_note(run: Run) -> str | None:
    """What the progress line says of the update's path (`TrainStep.progress_note`): a
    build under way, or the switch to the compiled step; None otherwise."""
    train_step = getattr(run.update, "train_step", None)
    return train_step.progress_note() if train_step is not None else None


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
        log.report_progress(update_note(run))
    waited = MODULES_IN_USE.waiting_seconds()
    if waited >= _SAY_WAITS_OVER_SECONDS:
        log.print(f"the learner waits for its update's compilation ({waited:.0f} s so far)")


def end_of_run(run: Run) -> str:
    """Where this process stops training: total_steps, or --stop_step short of it."""
    config = run.config
    if run.learner.total_steps < config.total_steps:
        return f"stop_step {run.learner.total_steps:,} (total_steps {config.total_steps:,})"
    return f"total_steps {config.total_steps:,}"
