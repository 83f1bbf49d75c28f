"""polybeast SPS next to monobeast SPS with the same total envs, in one sitting.

    python -m benchmarks.polybeast_sps --env PongNoFrameskip-v4 --seconds 120 --repeats 1

Each repeat runs, one after the other, real training runs of the same
algorithm settings for `--seconds` each:

    monobeast           --num_actors N --num_envs_per_actor K
    polybeast local     --num_env_servers N --num_envs_per_server K --policy local
    polybeast central   the same with --policy central

(`--policies` picks which polybeast modes run). SPS is steady state, as in
benchmarks.monobeast_sps: learner steps between the first `logs.csv` row
after `--warmup` seconds and the last. Runs are stopped with SIGINT, as a
user would. polybeast prints where its time went (the feeder line: share of
env stepping and policy in the servers, the central forward pass, the
learner process's copy of each rollout into slots); it is echoed here,
with the CPU each role used over the steady window (learner process, actors
or env servers, Ray's own processes), read from /proc for every process
carrying the run's marker. On a shared machine SPS also measures how much
CPU the scheduler gave the run, so steps per CPU second is printed beside
it, and the load average before and after every run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_throughput import machine_description
from benchmarks.monobeast_sps import bench_argv, steady_sps

ROOT = Path(__file__).resolve().parents[1]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


_TICKS = os.sysconf("SC_CLK_TCK")


def _category(pid: int, main_pid: int, cmdline: str) -> str:
    if pid == main_pid:
        return "learner process"
    if "ray::EnvServer" in cmdline:
        return "env servers"
    if "forkserver" in cmdline:  # monobeast's actors and their forkserver
        return "actors"
    if any(name in cmdline for name in ("raylet", "gcs_server", "ray/_private", "ray::")):
        return "ray system"
    return "other"


def cpu_seconds(marker: str, main_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process carrying `marker`, by role."""
    totals: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        role = _category(pid, main_pid, cmdline)
        totals[role] = totals.get(role, 0.0) + used
    return totals


def measure(
    entry: str, env: str, seconds: float, warmup: float, flags: list[str]
) -> tuple[float, str, dict[str, float]]:
    """One training run of `entry`: (steady SPS, its feeder line or '', CPU use by role).

    CPU use is in cores (CPU seconds per second) over the steady window: on a
    shared machine SPS alone says how much CPU a run got from the scheduler as
    much as how fast it is, so steps per CPU second is reported beside it.
    """
    marker = f"beast-bench-{os.getpid()}-{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as savedir:
        proc = subprocess.Popen(
            bench_argv(entry, env, savedir, flags),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=dict(os.environ, BEAST_BENCH_MARKER=marker),
        )
        # Output is read by a thread: a full pipe would stall the run.
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            time.sleep(warmup)
            start, cpu_start = time.monotonic(), cpu_seconds(marker, proc.pid)
            time.sleep(max(0.0, seconds - warmup))
            window = time.monotonic() - start
            cpu_end = cpu_seconds(marker, proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
            reader.join(10)
        out = "".join(chunks)
        if proc.returncode not in (0, 130):
            raise RuntimeError(f"{entry} failed ({proc.returncode}): {out.strip()[-2000:]}")
        feeder = re.findall(r"feeder: (.*)", out)
        cores = {
            role: (cpu_end[role] - cpu_start.get(role, 0.0)) / window for role in sorted(cpu_end)
        }
        sps = steady_sps(Path(savedir) / "bench" / "logs.csv", warmup)
        return sps, (feeder or [""])[-1], cores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds ignored at the start")
    parser.add_argument("--num_actors", type=int, default=2, help="N: actors / env servers")
    parser.add_argument("--num_envs", type=int, default=8, help="K: envs per actor / server")
    parser.add_argument("--policies", default="local,central", help="polybeast modes to run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("flags", nargs="*", help="flags for every run (after --)")
    args = parser.parse_args(argv)

    print(machine_description(), flush=True)
    n, k = args.num_actors, args.num_envs
    runs = {"monobeast": ("monobeast.py", ["--num_actors", str(n), "--num_envs_per_actor", str(k)])}
    for policy in args.policies.split(","):
        runs[f"polybeast {policy}"] = (
            "polybeast.py",
            ["--num_env_servers", str(n), "--num_envs_per_server", str(k), "--policy", policy],
        )
    print(f"{n} x {k} envs; flags for every run: {' '.join(args.flags) or '(none)'}", flush=True)
    results: dict[str, list[float]] = {name: [] for name in runs}
    per_cpu: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(args.repeats):
        for name, (entry, flags) in runs.items():
            before = _load()
            sps, feeder, cores = measure(
                entry, args.env, args.seconds, args.warmup, flags + args.flags
            )
            used = sum(cores.values())
            results[name].append(sps)
            per_cpu[name].append(sps / used if used else float("nan"))
            print(
                f"[{i + 1}/{args.repeats}] {name}: {sps:,.0f} steps/s on {used:.2f} cores"
                f" = {per_cpu[name][-1]:,.0f} steps per CPU second"
                f" (load average before {before}, after {_load()})\n    CPU by role (cores): "
                + ", ".join(f"{role} {value:.2f}" for role, value in cores.items())
                + (f"\n    {feeder}" if feeder else ""),
                flush=True,
            )
    mono = statistics.median(results["monobeast"])
    mono_per_cpu = statistics.median(per_cpu["monobeast"])
    for name, values in results.items():
        median, median_per_cpu = statistics.median(values), statistics.median(per_cpu[name])
        print(
            f"median {name}: {median:,.0f} steps/s (ratio to monobeast {median / mono:.3f}),"
            f" {median_per_cpu:,.0f} steps per CPU second"
            f" (ratio {median_per_cpu / mono_per_cpu:.3f})"
        )


if __name__ == "__main__":
    main()
