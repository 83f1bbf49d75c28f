"""An Optuna search with beast's own search mode: the search is examples/optuna_search.yaml
(TPE, trials pruned on their evaluations, resumable), each trial a monobeast run.

    pip install -e ".[tune]"
    python examples/optuna_search.py

At the end: the trials' table, SAVEDIR/optuna_search/results.csv and returns.png.
"""

import dataclasses
import os

from beast.tune.sweep import load_sweep, run_sweep

SEARCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optuna_search.yaml")

if __name__ == "__main__":
    spec = load_sweep(SEARCH)
    if "BEAST_EXAMPLE_STEPS" in os.environ:  # the test suite's short search: one trial
        steps = int(os.environ["BEAST_EXAMPLE_STEPS"])
        flags = {**spec.flags, "total_steps": steps, "eval_interval": steps}
        spec = dataclasses.replace(
            spec, flags=flags, optuna=dataclasses.replace(spec.optuna, n_trials=1)
        )
    run_sweep(spec)  # prints each trial, the table and the best trial
