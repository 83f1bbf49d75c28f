"""End-to-end monobeast SPS against env-only SPS, side by side in one sitting.

    python -m benchmarks.monobeast_sps --env PongNoFrameskip-v4 --seconds 90 --repeats 2

Each repeat measures, one after the other: the env alone with random actions
in `--env_procs` processes (benchmarks.env_throughput), then a real
`monobeast.py` training run (extra flags after `--`) for `--seconds`. The
run's SPS is steady state: learner steps between the first `logs.csv` row
after `--warmup` seconds and the last row, divided by the time between
them. The run is then stopped with SIGINT, as a user would. Prints every
figure, the medians and the ratio end-to-end / env-only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_throughput import machine_description, measure_env_throughput

ROOT = Path(__file__).resolve().parents[1]


def steady_sps(logs_csv: Path, warmup: float) -> float:
    with open(logs_csv) as f:
        rows = [(float(r["time"]), int(r["step"])) for r in csv.DictReader(f)]
    steady = [row for row in rows if row[0] >= warmup]
    if len(steady) < 2:
        raise RuntimeError(f"too few learner updates after {warmup}s warm-up in {logs_csv}")
    (t0, s0), (t1, s1) = steady[0], steady[-1]
    return (s1 - s0) / (t1 - t0)


# The environment monobeast runs in: the env-only benchmark sets OMP_NUM_THREADS=1
# for its workers, which must not leak into the learner.
_CLEAN_ENVIRON = dict(os.environ)


def learner_threads(stdout: str) -> int | None:
    """The learner's torch threads: the thread tuner's choice where the run said one
    ("learner threads: 2 (agent steps/s ..."; beast/learning/thread_tuner.py), else the count it
    started with ("learner on cpu in fp32 with 1 thread(s)"; beast/run/runner.py); None if
    neither line is there."""
    found = re.findall(r"learner threads: (\d+) \(", stdout) or re.findall(
        r"learner on \S+ in \S+ with (\d+) thread", stdout
    )
    return int(found[-1]) if found else None


def bench_argv(entry: str, env: str, savedir: str, flags: list[str]) -> list[str]:
    """The command line of a benchmarked training run: `entry` (monobeast.py or
    polybeast.py) as run xpid "bench" in `savedir`, long enough never to finish."""
    return [
        sys.executable,
        str(ROOT / entry),
        "--env",
        env,
        "--savedir",
        savedir,
        "--xpid",
        "bench",
        "--total_steps",
        "1000000000",
        "--log_interval",
        "30",
        *flags,
    ]


# How long a run may take to stop cleanly after SIGINT (final checkpoint included).
_EXIT_TIMEOUT = 60


def measure_monobeast_sps(
    env: str, seconds: float, warmup: float, flags: list[str], savedir: str | None = None
) -> float:
    """Steady-state SPS of a monobeast run of `seconds`, stopped with SIGINT; the run
    lives in `savedir`/bench when given (kept), else in a temporary directory."""
    kept = contextlib.nullcontext(savedir) if savedir is not None else None
    with kept or tempfile.TemporaryDirectory() as savedir:
        proc = subprocess.Popen(
            bench_argv("monobeast.py", env, savedir, flags),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=_CLEAN_ENVIRON,
        )
        try:
            time.sleep(seconds)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=_EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the run and its actors: no orphans
                proc.communicate()
                raise RuntimeError(
                    f"monobeast did not stop within {_EXIT_TIMEOUT} s of SIGINT (killed it):"
                    f" {' '.join(proc.args)}"
                ) from None
        if proc.returncode not in (0, 130):
            raise RuntimeError(f"monobeast failed ({proc.returncode}): {err.strip()[-2000:]}")
        return steady_sps(Path(savedir) / "bench" / "logs.csv", warmup)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--seconds", type=float, default=90.0, help="length of each monobeast run")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds ignored at the start")
    parser.add_argument("--env_seconds", type=float, default=15.0)
    parser.add_argument("--env_procs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("flags", nargs="*", help="monobeast flags (after --)")
    args = parser.parse_args(argv)

    print(machine_description(), flush=True)
    print(f"monobeast flags: {' '.join(args.flags) or '(defaults)'}", flush=True)
    env_sps, engine_sps = [], []
    for i in range(args.repeats):
        env_sps.append(measure_env_throughput(args.env, args.env_procs, args.env_seconds))
        print(
            f"[{i + 1}/{args.repeats}] env only, {args.env_procs} procs: {env_sps[-1]:,.0f}"
            " steps/s",
            flush=True,
        )
        engine_sps.append(measure_monobeast_sps(args.env, args.seconds, args.warmup, args.flags))
        print(
            f"[{i + 1}/{args.repeats}] monobeast end to end: {engine_sps[-1]:,.0f} steps/s",
            flush=True,
        )
    env_median, engine_median = statistics.median(env_sps), statistics.median(engine_sps)
    print(
        f"median env only: {env_median:,.0f} steps/s; median monobeast: {engine_median:,.0f}"
        f" steps/s; ratio monobeast / env only: {engine_median / env_median:.3f}"
        f" ({args.repeats} repeats)"
    )


if __name__ == "__main__":
    main()
