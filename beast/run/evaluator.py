"""Evaluation during training (--eval_interval): the policy without exploration, on an env
of its own, beside training.

Training returns mix in exploration (epsilon, sampled actions, action noise); papers
report the returns of the evaluation policy, `Algorithm.acting_rule(explore=False)`, the one
`--mode test` acts with (beast/trained/play.py says what it is for each algorithm). Each time
training passes a multiple of --eval_interval agent steps, the learner hands a snapshot of
its weights to the evaluator, which plays --eval_episodes episodes with it through
`play_episodes` (--mode test's loop) and reports (step, returns, lengths) back to the run
log. Its env is its own: made once, seeded `--seed + EVAL_SEED_OFFSET` (no training env
has that seed) and reset to that seed at every evaluation, so that every snapshot plays
from the same start states; torch is reseeded too, so an evaluation is a function of the
weights alone. The snapshot with the best mean return so far is written to
RUN_DIR/model_best.tar (beast/outputs/checkpoint.py), with its step and returns.

Where it runs:

    monobeast, polybeast  `Evaluator`: one process (forkserver, as the actors), which
                          neither the actors nor the learner wait for. The learner thread
                          copies the snapshot into shared memory, once per interval; one
                          handed over while the process is still busy replaces the
                          waiting one, so it evaluates the newest snapshot next.
    --serial              `InlineEvaluator`: the same evaluation in the run's own process,
                          between two updates (training waits for it).

The hand-off (`EvalChannel`): the snapshot (a CPU copy of the model), an int64 control row
(the steps handed, taken, posted and read, and a stop flag) and a mailbox for one result,
all in shared memory, each read and written under one lock that either side takes with a
timeout, so that a process that dies holding it blocks nobody (its replacement gets a new
lock). The learner never waits for an evaluation: a result waits in the mailbox until the
main thread takes it (`Evaluator.check`, twice a second), and the evaluator waits for that
before posting the next.

Supervised like the actors (beast/acting/supervisor.py): a dead evaluator is reported once with
its traceback and replaced, and the replacement evaluates the newest snapshot again; more
than --max_actor_restarts replacements within a minute stop the run. It exits when told
to, or when the learner process is gone. A run that reaches --total_steps waits for the
evaluations still to come (Ctrl-C skips them); an interrupted or failed run stops the
evaluator at once.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from beast import envs
from beast.acting.error_board import ErrorBoard, post_traceback
from beast.acting.fork_server import actor_context
from beast.acting.inference import LocalInference
from beast.acting.supervisor import (
    ForkServerError,
    RestartWindow,
    WorkerProcess,
    start_worker,
    stop_workers,
)
from beast.algos.build import build_algorithm, build_checked_model, config_from_dict
from beast.config import Config
from beast.learning.learner import UpdateStats
from beast.models import copy_weights
from beast.outputs.checkpoint import BEST_CHECKPOINT_NAME, load_checkpoint, save_best_checkpoint
from beast.outputs.eval_report import EvalReport
from beast.run.build import Run
from beast.train_step import MODULES_IN_USE
from beast.trained.play import play_episodes
from beast.util.interrupts import ignore_interrupts
from beast.util.threads import die_with_fork_server, process_alive

if TYPE_CHECKING:
    from beast.outputs.logs import RunLog

__all__ = [
    "EVAL_SEED_OFFSET",
    "EvalChannel",
    "EvalReport",
    "EvalSchedule",
    "EvalWorker",
    "Evaluation",
    "Evaluator",
    "InlineEvaluator",
    "build_evaluator",
    "describe_evaluation",
    "run_evaluator",
]

# The evaluation env's seed is --seed plus this: training envs take --seed + i for their
# index i (and + 100,003 per replacement), far below it.
EVAL_SEED_OFFSET = 2**30
# How often the idle evaluator looks for a snapshot, the stop flag and the learner.
_POLL_SECONDS = 0.1
# Longest wait for the channel's lock: a copy under it takes milliseconds, so a longer
# wait means the other side died holding it.
_LOCK_SECONDS = 2.0
# Seconds the evaluator gets to exit when told to stop before it is killed.
_STOP_SECONDS = 2.0

# The control row's columns.
_HANDED, _TAKEN, _POSTED, _READ, _STOP = range(5)


@contextlib.contextmanager
def _holding(lock: Any) -> Iterator[bool]:
    """Whether `lock` was taken within _LOCK_SECONDS; released on leaving if it was."""
    taken = lock.acquire(timeout=_LOCK_SECONDS)
    try:
        yield taken
    finally:
        if taken:
            lock.release()


class EvalSchedule:
    """Which updates hand over a snapshot: the first to reach each multiple of `interval`
    past `step` (where the run starts or resumes). One update that passes several
    multiples hands over one snapshot."""

    def __init__(self, interval: int, step: int) -> None:
        self.interval = interval
        self.next = (step // interval + 1) * interval

    def due(self, step: int) -> bool:
        if step < self.next:
            return False
        self.next = (step // self.interval + 1) * self.interval
        return True


class EvalWorker:
    """What evaluates: the env, a model to load snapshots into, the evaluation policy, and
    the best mean return so far (read back from model_best.tar when a run resumes).

    config: the run's config as a dict (`Config.to_dict()`, polybeast's included): it is
        also what model_best.tar keeps, for --mode test.
    """

    def __init__(self, config: Mapping[str, Any], run_dir: str) -> None:
        self.config = dict(config)
        self.run_dir = run_dir
        run_config = config_from_dict(config)
        self.num_episodes = run_config.eval_episodes
        self.seed = run_config.seed + EVAL_SEED_OFFSET
        self.env = envs.make(run_config.env, seed=self.seed, episodic_life=False)
        self.spec = envs.env_spec(self.env)
        algorithm = build_algorithm(run_config, self.spec)
        self.model = build_checked_model(algorithm).eval()
        self.policy = algorithm.acting_rule(explore=False)
        self.best_return = _saved_best_return(run_dir)

    def evaluate(self, step: int) -> EvalReport:
        """Play the episodes with the model's current weights (the snapshot of `step`)."""
        start = time.monotonic()
        # The policy draws its random numbers (Q-networks' epsilon) from a generator seeded
        # from torch's; torch's own state is put back after (--serial evaluates in the
        # training process, whose random streams must not restart at every evaluation).
        # There a compilation may be exporting, which torch's seeding races (ModulesInUse).
        with MODULES_IN_USE.held(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            policy = LocalInference(self.model, self.policy, num_envs=1)
        episodes = play_episodes(self.env, self.spec, policy, self.num_episodes, seed=self.seed)
        returns = tuple(episode.ret for episode in episodes)
        mean = statistics.fmean(returns)
        best = mean > self.best_return
        if best:
            save_best_checkpoint(
                self.run_dir,
                {
                    "model_state_dict": self.model.state_dict(),
                    "config": self.config,
                    "step": step,
                    "eval": {"mean_return": mean, "returns": list(returns)},
                },
            )
            self.best_return = mean
        return EvalReport(
            step=step,
            returns=returns,
            lengths=tuple(episode.length for episode in episodes),
            seconds=time.monotonic() - start,
            best=best,
        )

    def close(self) -> None:
        self.env.close()


def _saved_best_return(run_dir: str) -> float:
    """The mean return in RUN_DIR/model_best.tar, or -inf when there is none (or it is
    unreadable: the next evaluation replaces it)."""
    path = os.path.join(run_dir, BEST_CHECKPOINT_NAME)
    if not os.path.isfile(path):
        return float("-inf")
    try:
        return float(load_checkpoint(path)["eval"]["mean_return"])
    except Exception:  # a torn or foreign file
        return float("-inf")


class EvalChannel:
    """The shared memory between the learner process and the evaluator (module docstring).

    Picklable to the evaluator process (forkserver): its tensors travel as shared memory,
    its lock as a semaphore.
    """

    def __init__(self, ctx: Any, snapshot: nn.Module, num_episodes: int) -> None:
        self.snapshot = snapshot
        # Steps (-1: none): handed (the snapshot's), taken (copied out by the evaluator),
        # posted (the result in the mailbox), read (taken by the learner); and stop (0/1).
        self.control = torch.tensor([-1, -1, -1, -1, 0], dtype=torch.int64).share_memory_()
        # The mailbox: one result.
        self.returns = torch.zeros(num_episodes, dtype=torch.float64).share_memory_()
        self.lengths = torch.zeros(num_episodes, dtype=torch.int64).share_memory_()
        self.seconds_and_best = torch.zeros(2, dtype=torch.float64).share_memory_()
        self.new_lock(ctx)

    def new_lock(self, ctx: Any) -> None:
        """A fresh lock (for a replacement evaluator: the dead one may hold the old one)."""
        self.lock = ctx.Lock()

    def value(self, column: int) -> int:
        return int(self.control[column])

    @property
    def handed(self) -> int:
        """The step of the newest snapshot handed over (-1: none yet)."""
        return self.value(_HANDED)

    @property
    def taken(self) -> int:
        """The step of the snapshot the evaluator copied out last (-1: none yet)."""
        return self.value(_TAKEN)

    def request_stop(self) -> None:
        """Tell the evaluator to exit (it looks between evaluations)."""
        self.control[_STOP] = 1

    # The learner process's side.

    def hand(self, source: nn.Module, step: int) -> bool:
        """Copy `source`'s weights in as the snapshot of `step`; False when the lock was not
        free in time (the snapshot is skipped)."""
        with _holding(self.lock) as held:
            if held:
                copy_weights(self.snapshot, source)
                self.control[_HANDED] = step
            return held

    def take(self) -> EvalReport | None:
        """The result waiting in the mailbox, or None."""
        with _holding(self.lock) as held:
            posted = self.value(_POSTED)
            if not held or posted <= self.value(_READ):
                return None
            self.control[_READ] = posted
            seconds, best = self.seconds_and_best.tolist()
            return EvalReport(
                step=posted,
                returns=tuple(self.returns.tolist()),
                lengths=tuple(self.lengths.tolist()),
                seconds=seconds,
                best=bool(best),
            )

    def outstanding(self) -> bool:
        """Whether a snapshot handed over has no result taken yet."""
        return self.value(_HANDED) > self.value(_READ)

    def retake_lost(self) -> None:
        """After the evaluator died: the snapshot it was evaluating is evaluated again (the
        newest one handed, which the snapshot holds)."""
        self.control[_TAKEN] = self.control[_POSTED]

    # The evaluator's side.

    def next_snapshot(self, model: nn.Module, running: Callable[[], bool]) -> int | None:
        """Wait for a snapshot newer than the last one taken, copy it into `model` and
        return its step; None once `running()` says to stop."""
        while running():
            with _holding(self.lock) as held:
                handed = self.value(_HANDED)
                if held and handed > self.value(_TAKEN):
                    copy_weights(model, self.snapshot)
                    self.control[_TAKEN] = handed
                    return handed
            time.sleep(_POLL_SECONDS)
        return None

    def post(self, result: EvalReport, running: Callable[[], bool]) -> bool:
        """Put `result` in the mailbox once the previous one was taken; False if told to
        stop first."""
        while running():
            with _holding(self.lock) as held:
                if held and self.value(_POSTED) == self.value(_READ):
                    self.returns.copy_(torch.tensor(result.returns, dtype=torch.float64))
                    self.lengths.copy_(torch.tensor(result.lengths, dtype=torch.int64))
                    self.seconds_and_best[0] = result.seconds
                    self.seconds_and_best[1] = float(result.best)
                    self.control[_POSTED] = result.step
                    return True
            time.sleep(_POLL_SECONDS)
        return False


def run_evaluator(
    config: dict[str, Any],
    run_dir: str,
    channel: EvalChannel,
    learner_pid: int,
    error_row: torch.Tensor,
) -> None:
    """The evaluator process: evaluate snapshots as they come, until told to stop or the
    learner is gone. Exits 1 after posting its traceback to `error_row`."""
    die_with_fork_server()
    ignore_interrupts()  # shutdown is the learner's job
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)

    def running() -> bool:
        return not channel.value(_STOP) and process_alive(learner_pid)

    try:
        worker = EvalWorker(config, run_dir)
        try:
            while (step := channel.next_snapshot(worker.model, running)) is not None:
                if not channel.post(worker.evaluate(step), running):
                    return
        finally:
            worker.close()
    except Exception:
        post_traceback(error_row)
        sys.exit(1)


class Evaluation:
    """What both evaluators share: the schedule, the run log, the calls the runners make.

    `start()` once; `after_update(stats)` from the learner (thread) after each update;
    `check()` from the monitor loop; `finish(step)` once a run reached total_steps and its
    learner stopped (its last steps may have passed a multiple without an update: a
    replay's actors count steps while the learner waits, so that multiple is evaluated
    there); `close()` at shutdown.
    """

    def __init__(self, run: Run, log: RunLog, step: int) -> None:
        self.config_dict = run.config.to_dict()
        self.run_dir = run.config.run_dir
        self.log = log
        self.schedule = EvalSchedule(run.config.eval_interval, step)

    def start(self) -> None:
        """Start evaluating (the process, where there is one)."""

    def after_update(self, stats: UpdateStats) -> None:
        if self.schedule.due(stats.step):
            self._evaluate(stats.step)

    def _evaluate(self, step: int) -> None:
        """Evaluate the learner's current weights as the snapshot of `step`."""
        raise NotImplementedError

    def check(self) -> str | None:
        """Results to the run log; why the run must stop, or None."""
        return None

    def finish(self, step: int, stop_requested: Callable[[], bool] = lambda: False) -> None:
        """The evaluations still due at the run's last `step`, waited for unless
        `stop_requested()` says otherwise."""
        if self.schedule.due(step):
            self._evaluate(step)

    def close(self) -> None:
        """Stop evaluating (any evaluation in progress is dropped)."""


class InlineEvaluator(Evaluation):
    """--serial: evaluates in this process, right after the update that is due."""

    def __init__(self, run: Run, log: RunLog, step: int) -> None:
        super().__init__(run, log, step)
        self.source = run.model
        self.worker = EvalWorker(self.config_dict, self.run_dir)

    def _evaluate(self, step: int) -> None:
        copy_weights(self.worker.model, self.source)
        self.log.record_eval(self.worker.evaluate(step))

    def close(self) -> None:
        self.worker.close()


class Evaluator(Evaluation):
    """The evaluator process, seen from the learner process (module docstring); `start`
    it once, then call it as `Evaluation` says."""

    def __init__(self, run: Run, log: RunLog, step: int) -> None:
        super().__init__(run, log, step)
        self.ctx = actor_context()  # the actors' fork server
        snapshot = build_checked_model(run.algorithm)
        snapshot.share_memory()
        self.channel = EvalChannel(self.ctx, snapshot, run.config.eval_episodes)
        # The weights the actors act with (published after each update, under the
        # learner's lock, which `after_update` takes too: no torn snapshot).
        self.source, self.source_lock = run.actor_model, run.learner.lock
        self.error_board = ErrorBoard(1, log.print)
        self.restart_window = RestartWindow(run.config.max_actor_restarts)
        self.process: WorkerProcess | None = None

    def start(self) -> None:
        """Start the evaluator process; ForkServerError when it cannot be started."""
        self.process = start_worker(
            lambda: WorkerProcess(
                self.ctx,
                target=run_evaluator,
                name="evaluator",
                args=(
                    self.config_dict,
                    self.run_dir,
                    self.channel,
                    os.getpid(),
                    self.error_board.tensor[0],
                ),
            )
        )

    def _evaluate(self, step: int) -> None:
        """Hand over a snapshot; the evaluator takes it when it is free."""
        with self.source_lock:
            handed = self.channel.hand(self.source, step)
        if not handed:
            self.log.print(f"evaluator unresponsive: no evaluation of step {step:,}")

    def check(self) -> str | None:
        result = self.channel.take()
        if result is not None:
            self.log.record_eval(result)
        process = self.process
        if process is None:
            return None
        if process.server_gone():  # the actors' supervisor replaces the server
            process.kill()
        if not process.exited(_STOP_SECONDS if process.server_gone() else 0.0):
            return None
        reason = self.error_board.death_reason(0, process.exitcode(), "the evaluator")
        process.close()
        self.process = None
        if not self.restart_window.allow():
            return self.restart_window.refusal(f"the evaluator {reason}", "evaluators")
        self.log.print(
            f"the evaluator {reason}; starting a replacement (restart {self.restart_window.total})"
        )
        self.channel.new_lock(self.ctx)
        self.channel.retake_lost()
        try:
            self.start()
        except ForkServerError as error:
            return f"{error}, so the run stops"
        return None

    def finish(self, step: int, stop_requested: Callable[[], bool] = lambda: False) -> None:
        super().finish(step)
        if self.channel.outstanding():
            self.log.print(
                f"waiting for the evaluation of step {self.channel.handed:,} (Ctrl-C skips it)"
            )
        while self.channel.outstanding() and self.process is not None and not stop_requested():
            failure = self.check()
            if failure:
                self.log.print(failure)
                return
            time.sleep(_POLL_SECONDS)

    def close(self) -> None:
        self.channel.request_stop()
        if self.process is not None:
            stop_workers([self.process], _STOP_SECONDS)


def build_evaluator(run: Run, log: RunLog, step: int) -> Evaluation | None:
    """The run's evaluator (--serial: inline), or None without --eval_interval."""
    if not run.config.eval_interval:
        return None
    if run.config.serial:
        return InlineEvaluator(run, log, step)
    return Evaluator(run, log, step)


def describe_evaluation(config: Config) -> str:
    """The start-up line's account of evaluation."""
    where = "between updates" if config.serial else "in its own process"
    return (
        f"evaluation every {config.eval_interval:,} steps: {config.eval_episodes} episodes"
        f" {where}, the best kept in {BEST_CHECKPOINT_NAME}"
    )
