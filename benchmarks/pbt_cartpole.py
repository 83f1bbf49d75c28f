"""PBT against the same population without it: configs/sweeps/impala_cartpole_pbt.yaml
run as it is and with `fraction: 0` (no copies: the same members, rounds and total env
steps), for each seed; prints each member's mean return over its last 100 training
episodes, and whether every PBT member ends at or above the best member without PBT.

    python -m benchmarks.pbt_cartpole [--seeds 1 2 3] [--savedir DIR]

One population at a time (each runs `max_parallel` members at once).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import yaml

from beast.tune.sweep import load_sweep, run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "configs", "sweeps", "impala_cartpole_pbt.yaml")


def population(base: dict, seed: int, pbt: bool, directory: str) -> str:
    """The sweep file of one population: `seed` for the runs and PBT's draws."""
    data = copy.deepcopy(base)
    data["name"] = f"{'pbt' if pbt else 'no_pbt'}_seed{seed}"
    data["flags"]["seed"] = seed
    data["pbt"]["seed"] = seed
    if not pbt:
        data["pbt"]["fraction"] = 0.0
    path = os.path.join(directory, f"{data['name']}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--savedir", default=os.path.expanduser("~/logs/beast/pbt_cartpole"))
    args = parser.parse_args(argv)
    os.makedirs(args.savedir, exist_ok=True)
    with open(SWEEP) as f:
        base = yaml.safe_load(f)
    lines = []
    everyone_above = True
    for seed in args.seeds:
        returns = {}
        for pbt in (False, True):
            spec = load_sweep(population(base, seed, pbt, args.savedir))
            results = run_sweep(spec, savedir=args.savedir)
            returns[pbt] = [
                (r.run.name, r.mean_return, r.extra.get("copies", "-")) for r in results
            ]
        best_without = max(mean for _, mean, _ in returns[False])
        worst_with = min(mean for _, mean, _ in returns[True])
        everyone_above &= worst_with >= best_without
        lines.append(
            f"seed {seed}: without PBT "
            + ", ".join(f"{name} {mean:.1f}" for name, mean, _ in returns[False])
            + "; with PBT "
            + ", ".join(f"{name} {mean:.1f} ({copies})" for name, mean, copies in returns[True])
            + f"; every PBT member >= the best without: {worst_with >= best_without}"
        )
    print("\n".join(lines))
    return 0 if everyone_above else 1


if __name__ == "__main__":
    sys.exit(main())
