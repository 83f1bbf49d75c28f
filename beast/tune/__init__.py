"""Searches that tune themselves, as modes of `python -m beast.sweep`: an Optuna search
(beast/tune/optuna_search.py) and population-based training (beast/tune/pbt.py), both
over monobeast runs driven through their files (beast/tune/runs.py).

From Python (a notebook too), as from the command line:

    from beast.tune.sweep_runs import load_sweep, run_sweep
    results = run_sweep(load_sweep("configs/sweeps/ppo_cartpole_optuna.yaml"))
"""

from __future__ import annotations

import shlex
import signal

from beast.tune.sweep_runs import Run, RunResult, SweepSpec, command

__all__ = ["run_tuner"]


def run_tuner(
    spec: SweepSpec,
    sweep_dir: str,
    *,
    slots: list[tuple[list[int] | None, str | None]],
    cpus_per_run: int,
    dry_run: bool = False,
    poll_seconds: float = 0.5,
    ray_address: str | None = None,
) -> list[RunResult]:
    """Run the sweep's `optuna` or `pbt` search (beast.tune.sweep.run_sweep's dispatch); with
    dry_run print what it would start. SIGTERM stops it as Ctrl-C does: every run
    checkpoints, and a rerun resumes."""
    if dry_run:
        _print_plan(spec, sweep_dir, cpus_per_run)
        return []
    from beast.util.interrupts import stop_on_signals

    handlers = stop_on_signals()
    try:
        if spec.optuna is not None:
            from beast.tune.optuna_search import run_optuna

            return run_optuna(
                spec, sweep_dir, slots=slots, cpus_per_run=cpus_per_run, poll_seconds=poll_seconds
            )
        from beast.tune.pbt import run_pbt

        return run_pbt(
            spec,
            sweep_dir,
            slots=slots,
            cpus_per_run=cpus_per_run,
            poll_seconds=poll_seconds,
            ray_address=ray_address,
        )
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _print_plan(spec: SweepSpec, sweep_dir: str, cpus_per_run: int) -> None:
    if spec.optuna is not None:
        search = spec.optuna
        print(
            f"[optuna] would run trials of {', '.join(search.params)}"
            f" (n_trials {search.n_trials}, timeout {search.timeout}) in {sweep_dir}, each:"
        )
        print(shlex.join(command(Run("trialN", dict(spec.flags), {}), sweep_dir, cpus_per_run)))
        return
    from beast.tune.pbt import initial_members, member_run

    for member in initial_members(spec):
        print(shlex.join(command(member_run(spec, member), sweep_dir, cpus_per_run)))
