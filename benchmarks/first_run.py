"""A run's first time on a machine against its later runs: one `monobeast.py` command,
from launch to exit, with an empty compile cache and with a warm one, alternated.

    python -m benchmarks.first_run                    # issue 43's SAC Pendulum command
    python -m benchmarks.first_run --repeats 5 -- --algo dqn --env CartPole-v1 --total_steps 20000

A cold run has `BEAST_COMPILE_CACHE` an empty folder of its own: its update's package is
built in the background while the learner steps eagerly, and its learner's thread count
is measured. A warm run shares one folder, filled first by an untimed run of the same
command: it loads the package at its first update and reads the thread count. Both
kinds run one at a time, alternated (cold, warm, cold, ...), so that a drift in the
machine's load reaches both. Printed per run: the wall-clock, the build's line from the
run's log and the load average; then the medians and cold / warm, as the ratio of the
medians and per pair. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

__all__ = ["main"]

DEFAULT_COMMAND = ("--algo", "sac", "--env", "Pendulum-v1", "--total_steps", "6000")


def _run(flags: Sequence[str], cache: str, savedir: str) -> tuple[float, str]:
    """One run from launch to exit: its seconds, and its log's line about the update."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "monobeast.py", *flags, "--savedir", savedir],
        env=dict(os.environ, BEAST_COMPILE_CACHE=cache),
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"the run failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    update = next(
        (line for line in result.stdout.splitlines() if "the learner's update is" in line), ""
    )
    return seconds, update.removeprefix("[beast] ")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind")
    parser.add_argument("--seed", type=int, default=1, help="every run's --seed")
    parser.add_argument("flags", nargs="*", help="monobeast.py's flags, after --")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    flags = [*(args.flags or DEFAULT_COMMAND), "--seed", str(args.seed)]
    print(f"python monobeast.py {' '.join(flags)}; cold and warm alternated", flush=True)
    walls: dict[str, list[float]] = {"cold": [], "warm": []}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    with tempfile.TemporaryDirectory(prefix="beast-first-run-") as scratch:
        warm = os.path.join(scratch, "warm")
        os.mkdir(warm)
        _run(flags, warm, os.path.join(scratch, "runs"))  # fills the warm cache, untimed
        for repeat in range(args.repeats):
            for kind in ("cold", "warm"):
                cache = tempfile.mkdtemp(dir=scratch) if kind == "cold" else warm
                load = os.getloadavg()[0]
                seconds, update = _run(flags, cache, os.path.join(scratch, "runs"))
                walls[kind].append(seconds)
                print(
                    f"{kind} #{repeat + 1}: {seconds:.1f} s; {update};"
                    f" load {load:.2f} -> {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    cold, warm = statistics.median(walls["cold"]), statistics.median(walls["warm"])
    pairs = ", ".join(f"{c / w:.2f}" for c, w in zip(walls["cold"], walls["warm"], strict=True))
    print(f"medians: cold {cold:.1f} s, warm {warm:.1f} s; cold / warm {cold / warm:.2f}")
    print(f"cold / warm per pair: {pairs}")


if __name__ == "__main__":
    main()
