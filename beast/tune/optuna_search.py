"""An Optuna search: TPE over the random search's `params`, trials pruned on the runs'
evaluations, in a storage file that resumes and that several processes share.

    optuna:
      n_trials: 12            # trials in all, over restarts and processes (a resumed trial
                              #   counts once); this and/or timeout
      timeout: 3600           # seconds after which this process starts no new trial
      seed: 0                 # the TPE sampler's
      startup_trials: 4       # random trials before TPE models (Optuna's default, 10, is
                              #   most of a small search)
      pruner: median          # median (default), none, or {median: {n_startup_trials: 3,
                              #   n_warmup_steps: 20000, interval_steps: 1}}
      storage: optuna.db      # SQLite file, relative to SAVEDIR/NAME
      params:                 # the random search's syntax (beast/tune/sweep.py)
        learning_rate: {log_uniform: [0.0001, 0.003]}
        gae_lambda: {uniform: [0.8, 1.0]}

A trial is a monobeast run in SAVEDIR/NAME/trialN (beast/tune/runs.py drives it); its
flags must set --eval_interval. The trial's value is the mean return of the run's last
evaluation; each evaluation is reported to the trial at the step it was due (a multiple
of --eval_interval, so trials compare at the same steps), and when the pruner says so
the run is stopped with SIGINT (a clean stop with a checkpoint) and the trial is
PRUNED. `max_parallel` trials run at once, each driven by a thread of this process.

The storage (optuna's RDB storage on SQLite) holds the study, named after the sweep.
Every state change is one transaction, so a pruned, failed or interrupted trial leaves
it whole. A trial whose search is interrupted (Ctrl-C, SIGTERM) is marked FAIL and
queued again with the same params and run directory; a trial whose search was killed
outright stops sending heartbeats, and once they are _GRACE_SECONDS old any process on
the study marks it FAIL and queues it the same way (its run got SIGINT from the kernel
when the search died: beast/tune/sweep.py's `launch`). The queued trial resumes the run from
its checkpoint (monobeast resumes a run directory), reports its earlier evaluations
from logs.csv, and goes on. Several processes may run the same file against one
storage: they share the budget and TPE's history.
"""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from beast.tune.runs import drive, evaluations, wait_for_threads
from beast.tune.sweep_runs import (
    Run,
    RunResult,
    SweepError,
    SweepSpec,
    check_distribution,
    check_section_keys,
    is_finished,
    keep_sweep_file,
    metrics,
    report,
)

if TYPE_CHECKING:
    import optuna

__all__ = [
    "OptunaSpec",
    "import_optuna",
    "open_study",
    "parse_optuna",
    "run_optuna",
    "study_results",
]

# Seconds between a running trial's heartbeats, and the age at which a trial's last one
# means its search is dead. The grace outlasts a run's clean stop after its search dies
# (beast/tune/runs.py gives one 60 s), so a queued trial never resumes a run directory
# that a stopping run still writes.
_HEARTBEAT_SECONDS = 5
_GRACE_SECONDS = 90
# The trial user attribute naming its run directory: the same for a trial queued again.
_RUN_ATTR = "run"
_PRUNERS = ("median", "none")


@dataclass(frozen=True)
class OptunaSpec:
    """A parsed `optuna:` section."""

    params: dict[str, dict[str, list[Any]]]
    n_trials: int | None = None
    timeout: float | None = None
    seed: int = 0
    startup_trials: int = 10
    pruner: str = "median"
    pruner_args: dict[str, int] = field(default_factory=dict)
    storage: str = "optuna.db"


def import_optuna() -> Any:
    """The optuna module; SweepError (one line, exit 2) when it is not installed."""
    try:
        import optuna
    except ImportError:
        raise SweepError("the optuna search needs optuna: pip install -e '.[tune]'") from None
    return optuna


def parse_optuna(
    section: dict[str, Any], source: str, algo: str | None, flags: dict[str, Any]
) -> OptunaSpec:
    """Check an `optuna:` section; SweepError naming the file and key."""
    import_optuna()
    known = {"n_trials", "timeout", "seed", "startup_trials", "pruner", "storage", "params"}
    check_section_keys(section, known, source)
    params = {
        key: check_distribution(key, dist, source, algo)
        for key, dist in (section.get("params") or {}).items()
    }
    if not params:
        raise SweepError(f"{source}: params is empty (the flags to search, as random's)")
    n_trials, timeout = section.get("n_trials"), section.get("timeout")
    if n_trials is None and timeout is None:
        raise SweepError(f"{source}: give a budget: n_trials, timeout (seconds) or both")
    for key in ("n_trials", "startup_trials", "timeout"):
        value = section.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise SweepError(f"{source}: {key} must be a positive number, got {value!r}")
    if isinstance(n_trials, float):
        raise SweepError(f"{source}: n_trials must be an integer, got {n_trials!r}")
    seed = section.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SweepError(f"{source}: seed must be an integer, got {seed!r}")
    pruner, pruner_args = _parse_pruner(section.get("pruner", "median"), source)
    if not flags.get("eval_interval"):
        raise SweepError(
            f"{source}: a trial's value is its last evaluation's mean return; set"
            " flags: eval_interval (agent steps between evaluations)"
        )
    storage = section.get("storage", "optuna.db")
    if not isinstance(storage, str) or not storage:
        raise SweepError(f"{source}: storage must be a file name, got {storage!r}")
    return OptunaSpec(
        params=params,
        n_trials=n_trials,
        timeout=None if timeout is None else float(timeout),
        seed=seed,
        startup_trials=int(section.get("startup_trials", 10)),
        pruner=pruner,
        pruner_args=pruner_args,
        storage=storage,
    )


def _parse_pruner(value: Any, source: str) -> tuple[str, dict[str, int]]:
    if isinstance(value, str) and value in _PRUNERS:
        return value, {}
    if isinstance(value, dict) and list(value) == ["median"] and isinstance(value["median"], dict):
        args = value["median"]
        allowed = {"n_startup_trials", "n_warmup_steps", "interval_steps"}
        for key, arg in args.items():
            if key not in allowed:
                raise SweepError(
                    f"{source}: pruner: median takes {', '.join(sorted(allowed))}, got '{key}'"
                )
            if not isinstance(arg, int) or isinstance(arg, bool) or arg < 0:
                raise SweepError(f"{source}: pruner: {key} must be an integer >= 0, got {arg!r}")
        return "median", dict(args)
    raise SweepError(
        f"{source}: pruner must be median, none or {{median: {{n_startup_trials: N, ...}}}},"
        f" got {value!r}"
    )


def _distributions(params: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """Optuna's distribution for each of the random search's (beast/tune/sweep.py)."""
    distributions = import_optuna().distributions
    result = {}
    for key, dist in params.items():
        kind, args = next(iter(dist.items()))
        if kind == "choice":
            result[key] = distributions.CategoricalDistribution(args)
        elif kind == "int_uniform":
            result[key] = distributions.IntDistribution(int(args[0]), int(args[1]))
        else:
            result[key] = distributions.FloatDistribution(
                args[0], args[1], log=kind == "log_uniform"
            )
    return result


def open_study(spec: SweepSpec, sweep_dir: str) -> optuna.Study:
    """The sweep's study in its storage file, created on first use."""
    optuna = import_optuna()
    # The heartbeat API is marked experimental since Optuna 2.9, and ask() warns that it is
    # meant for optimize(): we send the heartbeats optimize() would (_Search._run_trial).
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search: OptunaSpec = spec.optuna
    os.makedirs(sweep_dir, exist_ok=True)
    path = os.path.join(sweep_dir, search.storage)
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{os.path.abspath(path)}",
        # Several processes write one file: wait for SQLite's lock rather than fail.
        engine_kwargs={"connect_args": {"timeout": 60}},
        heartbeat_interval=_HEARTBEAT_SECONDS,
        grace_period=_GRACE_SECONDS,
        heartbeat_stale_trial_callback=_queue_again,
    )
    if search.pruner == "median":
        pruner = optuna.pruners.MedianPruner(**search.pruner_args)
    else:
        pruner = optuna.pruners.NopPruner()
    study = optuna.create_study(
        study_name=spec.name,
        storage=storage,
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )
    # Seeded by the trials so far too: a restarted search must not draw its first
    # process's random startup trials again.
    study.sampler = optuna.samplers.TPESampler(
        n_startup_trials=search.startup_trials, seed=search.seed + len(study.trials)
    )
    return study


def _trials_before(study: optuna.Study) -> str:
    """The trials a search starts from, as its first line says them: its runs (a trial
    queued again after an interrupt is its run's second Optuna trial, and counts once),
    and those queued to resume."""
    optuna = import_optuna()
    trials = study.get_trials(deepcopy=False)
    runs = len({t.user_attrs.get(_RUN_ATTR) for t in trials} - {None})
    queued = sum(t.state == optuna.trial.TrialState.WAITING for t in trials)
    said = f"{runs} trial{'' if runs == 1 else 's'} before"
    return said + (f", {queued} of them queued to resume" if queued else "")


def _queue_again(study: optuna.Study, trial: optuna.trial.FrozenTrial | optuna.Trial) -> None:
    """Queue a trial that did not end (its search stopped) to run again: same params, same
    run directory, so that it resumes the run."""
    study.enqueue_trial(trial.params, user_attrs={_RUN_ATTR: trial.user_attrs[_RUN_ATTR]})


class _Search:
    """The trials one process runs: `max_parallel` threads, each asking for a trial,
    running it, telling its end, until the budget is spent or the search is stopped."""

    def __init__(self, spec: SweepSpec, sweep_dir: str, slots: list, cpus_per_run: int) -> None:
        self.spec, self.search = spec, spec.optuna
        self.sweep_dir, self.slots, self.cpus_per_run = sweep_dir, slots, cpus_per_run
        self.study = open_study(spec, sweep_dir)
        self.distributions = _distributions(self.search.params)
        self.deadline = (
            math.inf if self.search.timeout is None else time.monotonic() + self.search.timeout
        )
        self.stop = threading.Event()  # set on Ctrl-C / SIGTERM: stop every trial now
        # Guards the budget check and the ask that follows it, across this process's threads.
        self.ask_lock = threading.Lock()
        self.poll_seconds = 0.5

    def _next_trial(self) -> optuna.Trial | None:
        """A trial to run (a queued one first), or None when the budget is spent."""
        optuna = import_optuna()
        with self.ask_lock:
            optuna.storages.fail_stale_trials(self.study)  # queues a dead search's trials
            trials = self.study.get_trials(deepcopy=False)
            waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
            started = {t.user_attrs.get(_RUN_ATTR) for t in trials} - {None}
            over = self.search.n_trials is not None and len(started) >= self.search.n_trials
            if self.stop.is_set() or time.monotonic() >= self.deadline or (over and not waiting):
                return None
            trial = self.study.ask(self.distributions)
            if _RUN_ATTR not in trial.user_attrs:
                trial.set_user_attr(_RUN_ATTR, f"trial{trial.number}")
            return trial

    def worker(self, slot: tuple[list[int] | None, str | None]) -> None:
        optuna = import_optuna()
        while (trial := self._next_trial()) is not None:
            try:
                self._run_trial(trial, slot)
            except BaseException:
                # Whatever broke here (the storage, this process), the trial must not stay
                # RUNNING in the storage while its heartbeat goes on elsewhere: it ends
                # FAIL and goes back to the queue, its run resumable.
                traceback.print_exc()
                if self.study._storage.get_trial(trial._trial_id).state.is_finished():
                    raise
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                _queue_again(self.study, trial)
                raise

    def _run_trial(self, trial: optuna.Trial, slot: tuple[list[int] | None, str | None]) -> None:
        optuna = import_optuna()
        name = trial.user_attrs[_RUN_ATTR]
        run = Run(name=name, flags={**self.spec.flags, **trial.params}, varying=trial.params)
        run_dir = os.path.join(self.sweep_dir, name)
        interval = self.spec.flags["eval_interval"]
        storage = self.study._storage  # the heartbeat is Optuna's, sent as optimize() does
        reported: set[int] = set()
        pruned = False
        last_beat = 0.0

        def should_stop() -> bool:
            nonlocal pruned, last_beat
            if time.monotonic() - last_beat >= _HEARTBEAT_SECONDS:
                storage.record_heartbeat(trial._trial_id)
                last_beat = time.monotonic()
            for evaluation in evaluations(run_dir):
                due = evaluation.step // interval * interval  # the step every trial shares
                if due not in reported:
                    reported.add(due)
                    trial.report(evaluation.mean_return, due)
                    pruned = pruned or trial.should_prune()
            return pruned or self.stop.is_set()

        print(f"[optuna] trial {trial.number} ({name}) started: {_describe(trial.params)}")
        returncode = drive(
            run,
            self.sweep_dir,
            slot=slot,
            cpus_per_run=self.cpus_per_run,
            should_stop=should_stop,
            poll_seconds=self.poll_seconds,
        )
        should_stop()  # the evaluations written since the last poll
        if is_finished(run_dir) and evaluations(run_dir):
            # Its logs reached total_steps (a stop for pruning may have caught it exiting).
            value = evaluations(run_dir)[-1].mean_return
            self.study.tell(trial, value)
            state = f"done: last evaluation {value:.1f}"
        elif pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            state = f"pruned at step {max(reported):,}"
        elif returncode == 0 or self.stop.is_set():  # stopped from outside (Ctrl-C, SIGTERM)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            _queue_again(self.study, trial)
            state = "interrupted: queued to resume"
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            state = f"failed (exit {returncode}; {os.path.join(run_dir, 'sweep.log')})"
        print(f"[optuna] trial {trial.number} ({name}) {state}", flush=True)


def _describe(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in params.items()
    )


def run_optuna(
    spec: SweepSpec,
    sweep_dir: str,
    *,
    slots: list[tuple[list[int] | None, str | None]],
    cpus_per_run: int,
    poll_seconds: float = 0.5,
) -> list[RunResult]:
    """Run the search's trials (len(slots) at a time) until its budget is spent; then the
    sweep's table, results.csv and returns.png over every trial of the study."""
    keep_sweep_file(spec, sweep_dir)
    search = _Search(spec, sweep_dir, slots, cpus_per_run)
    search.poll_seconds = poll_seconds
    budget = ", ".join(
        part
        for part in (
            f"{spec.optuna.n_trials} trials" if spec.optuna.n_trials else "",
            f"{spec.optuna.timeout:.0f} s" if spec.optuna.timeout else "",
        )
        if part
    )
    print(
        f"[optuna] {spec.name}: TPE over {', '.join(spec.optuna.params)}, {budget},"
        f" pruner {spec.optuna.pruner}, {len(slots)} at a time;"
        f" study in {os.path.join(sweep_dir, spec.optuna.storage)}"
        f" ({_trials_before(search.study)})",
        flush=True,
    )
    threads = [
        threading.Thread(target=search.worker, args=(slot,), name=f"optuna-trials-{i}")
        for i, slot in enumerate(slots)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for_threads(threads, search.stop)
    except KeyboardInterrupt:
        print("[optuna] interrupted: the trials stopped with checkpoints; rerun to resume")
        raise
    results = study_results(search.study, spec, sweep_dir)
    report(spec, sweep_dir, results)
    best = [r for r in results if r.extra.get("best")]
    if best:
        print(f"[optuna] best: {best[0].run.name} {_describe(best[0].run.varying)}")
    return results


def study_results(study: optuna.Study, spec: SweepSpec, sweep_dir: str) -> list[RunResult]:
    """One result per run directory of the study (a trial queued again shares its run's),
    described by its newest trial."""
    optuna = import_optuna()
    newest: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in study.get_trials(deepcopy=False):
        name = trial.user_attrs.get(_RUN_ATTR)
        if name is not None and trial.state != optuna.trial.TrialState.WAITING:
            newest[name] = trial
    try:
        best_number = study.best_trial.number
    except ValueError:  # no trial completed
        best_number = None
    states = {
        optuna.trial.TrialState.COMPLETE: "done",
        optuna.trial.TrialState.PRUNED: "pruned",
        optuna.trial.TrialState.FAIL: "failed",
        optuna.trial.TrialState.RUNNING: "running",
    }
    results = []
    for name, trial in sorted(newest.items(), key=lambda item: item[1].number):
        intermediate = trial.intermediate_values
        last = intermediate[max(intermediate)] if intermediate else math.nan
        value = trial.value if trial.value is not None else last
        run = Run(name=name, flags={**spec.flags, **trial.params}, varying=dict(trial.params))
        extra = {
            "trial": trial.number,  # the newest on the run (trialN: N is its first)
            "objective": round(value, 2) if math.isfinite(value) else "nan",
            "steps_evaluated": max(intermediate) if intermediate else 0,
            "best": trial.number == best_number,
        }
        status = states.get(trial.state, trial.state.name.lower())
        results.append(RunResult(run, status, *metrics(os.path.join(sweep_dir, name)), extra=extra))
    return results
