"""Training throughput with and without evaluation (--eval_interval), side by side.

    python -m benchmarks.eval_overhead --env CartPole-v1 --seconds 60 --warmup 15 \\
        --eval_interval 5000 --repeats 3 -- --num_actors 2

Each repeat runs monobeast.py twice, one after the other, with the same flags (those
after `--`): without evaluation, then with `--eval_interval` and `--eval_episodes`. Each
run's SPS is its steady state (benchmarks.monobeast_sps: learner steps between the first
row of logs.csv after `--warmup` seconds and the last one), and the run is stopped with
SIGINT. Prints each pair with the evaluations the second
run logged, then the medians and the ratio with / without. The evaluator is one more
process competing for the cores: on a machine whose cores the actors already fill, its
episodes cost training steps, which is what the ratio shows.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_throughput import machine_description
from benchmarks.monobeast_sps import measure_monobeast_sps


def count_evaluations(savedir: str) -> int:
    """The eval rows in the benchmarked run's logs.csv."""
    with open(Path(savedir) / "bench" / "logs.csv") as f:
        return sum(1 for row in csv.DictReader(f) if row.get("eval_step"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds ignored at the start")
    parser.add_argument("--eval_interval", type=int, default=5000)
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("flags", nargs="*", help="monobeast flags of both runs (after --)")
    args = parser.parse_args(argv)
    if args.seconds <= args.warmup or args.eval_interval <= 0 or args.repeats <= 0:
        parser.error("needs --seconds > --warmup, --eval_interval > 0 and --repeats > 0")

    evaluation = ["--eval_interval", str(args.eval_interval)]
    evaluation += ["--eval_episodes", str(args.eval_episodes)]
    print(machine_description(), flush=True)
    print(f"monobeast flags: {' '.join(args.flags) or '(defaults)'}; with: {' '.join(evaluation)}")
    without, with_eval = [], []
    for i in range(args.repeats):
        without.append(measure_monobeast_sps(args.env, args.seconds, args.warmup, args.flags))
        with tempfile.TemporaryDirectory() as savedir:
            flags = [*args.flags, *evaluation]
            with_eval.append(
                measure_monobeast_sps(args.env, args.seconds, args.warmup, flags, savedir)
            )
            evaluations = count_evaluations(savedir)
        print(
            f"[{i + 1}/{args.repeats}] without evaluation: {without[-1]:,.0f} steps/s; with:"
            f" {with_eval[-1]:,.0f} steps/s ({evaluations} evaluations logged)",
            flush=True,
        )
    median_without, median_with = statistics.median(without), statistics.median(with_eval)
    print(
        f"median without evaluation: {median_without:,.0f} steps/s; with:"
        f" {median_with:,.0f} steps/s; ratio with / without: {median_with / median_without:.3f}"
        f" ({args.repeats} repeats)"
    )


if __name__ == "__main__":
    main()
