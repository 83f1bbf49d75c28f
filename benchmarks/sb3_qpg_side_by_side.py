"""SAC (and TD3, DDPG) beside Stable-Baselines3, in one sitting, with rl-zoo3's settings.

    pip install -e ".[bench]"
    python -m benchmarks.sb3_qpg_side_by_side                      # both tasks, 3 pairs
    python -m benchmarks.sb3_qpg_side_by_side --task pendulum --runs 5
    python -m benchmarks.sb3_qpg_side_by_side --task halfcheetah --algo td3
    python -m benchmarks.sb3_qpg_side_by_side --quick              # smoke: 1 short pair each

Two measurements, `--runs` pairs each (seeds 1..N); in a pair SB3 and beast run one after
the other, never at once, the order alternating between pairs:

- pendulum: wall-clock to a mean of -200 over the last 20 training episodes on
  Pendulum-v1 (`--algo`'s zoo settings: SAC's hyperparams/sac.yml, learning_rate 1e-3
  over SB3's defaults; configs/<algo>/classic.yaml on beast's side), within 20k steps
  (30k for TD3 and DDPG). Both sides stop once they reach it. SB3's clock starts before
  the env and the model are built and a callback watches Monitor's episode returns;
  beast's starts at the launch of `monobeast.py` (start-up included), which this script
  watches through the run's episodes.csv, written at each update, and stops with SIGTERM
  (a checkpoint, as a user's Ctrl-C) once the mean is reached: the time is when the
  script saw it, never less than the truth.
- halfcheetah: env steps/s on HalfCheetah-v5 while training, at the same update-to-data
  ratio (1: SB3's train_freq 1, gradient_steps 1; beast's --utd_ratio 1), batch (256)
  and network widths (--algo's: SAC 256-256, TD3 and DDPG 400-300), one env each: the
  rate between env steps `--from_step` and `--to_step`, after 1,000 random steps (beast's
  from logs.csv's per-update times, SB3's from a callback's clock).

SB3 gets `--sb3_threads` torch threads (default 1, as beast's learner takes for models
this small: beast/engine.py learner_threads); beast's actor process runs beside its
learner on the other core. Medians per side and beast/SB3 ratios are printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.monobeast_sps import _CLEAN_ENVIRON
from benchmarks.sb3_side_by_side import ROOT, _ratio, _seconds, machine_description

TARGET = -200.0
WINDOW = 20  # episodes in the mean (the continuous-control issue's)
PENDULUM_BUDGET = {"sac": 20_000, "td3": 30_000, "ddpg": 30_000}
LEARNING_STARTS = 1_000  # halfcheetah: random steps before the measured stretch
QUICK = {"runs": 1, "target": -1000.0, "from_step": 1_200, "to_step": 1_500}

# rl-baselines3-zoo's Pendulum-v1 settings over SB3's defaults (hyperparams/<algo>.yml);
# configs/<algo>/classic.yaml holds the same on beast's side.
SB3_PENDULUM: dict[str, dict[str, Any]] = {
    "sac": {"learning_rate": 1e-3},
    "td3": {
        "gamma": 0.98,
        "buffer_size": 200_000,
        "learning_starts": 10_000,
        "learning_rate": 1e-3,
        "policy_kwargs": {"net_arch": [400, 300]},
    },
}
SB3_PENDULUM["ddpg"] = SB3_PENDULUM["td3"]
# SB3's networks on HalfCheetah (rl-zoo3: SAC's defaults, TD3/DDPG 400-300).
NET_ARCH = {"sac": [256, 256], "td3": [400, 300], "ddpg": [400, 300]}
NOISE_STD = 0.1  # the zoo's normal action noise for TD3 and DDPG


def sb3_run(
    algo: str,
    env_id: str,
    seed: int,
    total_steps: int,
    kwargs: dict[str, Any],
    threads: int,
    target: float | None,
    marks: tuple[int, ...],
) -> dict[str, Any]:
    """One SB3 run in this process: the time and step at which the mean of the last
    WINDOW episodes first reached `target` (then it stops), and the clock at each of
    `marks` (env steps)."""
    import numpy as np
    import torch
    from stable_baselines3 import DDPG, SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    class Watch(BaseCallback):
        def __init__(self, start: float) -> None:
            super().__init__()
            self.start = start
            self.window: deque[float] = deque(maxlen=WINDOW)
            self.reached: tuple[float, int] | None = None
            self.marks: dict[int, float] = {}

        def _on_step(self) -> bool:
            now = time.monotonic() - self.start
            if self.num_timesteps in marks:
                self.marks[self.num_timesteps] = now
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's
                    self.window.append(float(info["episode"]["r"]))
                    full = len(self.window) == WINDOW
                    if target is not None and full and sum(self.window) / WINDOW >= target:
                        self.reached = (now, self.num_timesteps)
                        return False
            return True

    if threads:
        torch.set_num_threads(threads)
    start = time.monotonic()
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    kwargs = dict(kwargs)
    if algo != "sac":
        dim = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), NOISE_STD * np.ones(dim))
    model = {"sac": SAC, "td3": TD3, "ddpg": DDPG}[algo](
        "MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs
    )
    callback = Watch(start)
    model.learn(total_timesteps=total_steps, callback=callback)
    return {
        "reached": callback.reached,
        "marks": {str(k): v for k, v in callback.marks.items()},
        "wall_clock": time.monotonic() - start,
        "env_steps": model.num_timesteps,
        "threads": torch.get_num_threads(),
    }


def run_sb3(**kwargs: Any) -> dict[str, Any]:
    """`sb3_run` in its own process, as a user runs it."""
    argv = [sys.executable, "-m", "benchmarks.sb3_qpg_side_by_side", "--sb3"]
    argv += ["--sb3_kwargs", json.dumps(kwargs)]
    result = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, env=_CLEAN_ENVIRON, timeout=7200
    )
    if result.returncode != 0:
        raise RuntimeError(f"SB3 failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def beast_run(
    algo: str,
    env_id: str,
    seed: int,
    total_steps: int,
    flags: list[str],
    target: float | None,
    marks: tuple[int, ...],
) -> dict[str, Any]:
    """monobeast.py with `flags`, timed from launch; stopped (SIGTERM) once the mean of
    the last WINDOW episodes reaches `target`. The clock at each of `marks` (env steps)
    comes from logs.csv (the logger's time plus the start-up before it)."""
    with tempfile.TemporaryDirectory() as savedir:
        run_dir = Path(savedir) / "run"
        argv = [sys.executable, str(ROOT / "monobeast.py"), "--algo", algo, "--env", env_id]
        argv += ["--seed", str(seed), "--total_steps", str(total_steps)]
        argv += ["--savedir", savedir, "--xpid", "run", "--log_interval", "30", *flags]
        launched = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_CLEAN_ENVIRON,
        )
        reached = None
        while proc.poll() is None:
            time.sleep(0.5)
            if target is None or reached is not None:
                continue
            episodes = _rows(run_dir / "episodes.csv")
            returns = [float(row["return"]) for row in episodes[-WINDOW:]]
            if len(returns) == WINDOW and sum(returns) / WINDOW >= target:
                reached = (time.monotonic() - launched, int(episodes[-1]["step"]))
                proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate()
        wall_clock = time.monotonic() - launched
        if proc.returncode != 0:
            raise RuntimeError(f"beast {algo} failed: {err.strip()[-2000:]}")
        logs = _rows(run_dir / "logs.csv")
        start_up = wall_clock - max((float(row["time"]) for row in logs), default=0.0)
        times: dict[str, float] = {}
        for mark in marks:
            row = next((r for r in logs if int(r["step"]) >= mark), None)
            if row is not None:
                times[str(mark)] = start_up + float(row["time"])
                times[f"{mark}_step"] = int(row["step"])
        threads = [line for line in out.splitlines() if "thread(s)" in line]
    return {
        "reached": reached,
        "marks": times,
        "wall_clock": wall_clock,
        "env_steps": int(logs[-1]["step"]) if logs else 0,
        "threads": threads[-1].rsplit("with ", 1)[-1] if threads else "?",
    }


def pendulum(args: argparse.Namespace) -> None:
    budget = PENDULUM_BUDGET[args.algo]
    print(
        f"\n## Pendulum-v1 {args.algo}: wall-clock to a mean of {args.target:g} over the last"
        f" {WINDOW} episodes, within {budget:,} steps, {args.runs} pair(s)"
    )
    print("| seed | side | to target | at step | wall-clock | threads |")
    print("|---|---|---|---|---|---|")
    times: dict[str, list[float]] = {"sb3": [], "beast": []}
    ratios = []
    for i in range(args.runs):
        seed, runs = i + 1, {}
        for side in ("sb3", "beast") if i % 2 == 0 else ("beast", "sb3"):
            if side == "sb3":
                runs[side] = run_sb3(
                    algo=args.algo,
                    env_id="Pendulum-v1",
                    seed=seed,
                    total_steps=budget,
                    kwargs=SB3_PENDULUM[args.algo],
                    threads=args.sb3_threads,
                    target=args.target,
                    marks=(),
                )
            else:
                runs[side] = beast_run(
                    args.algo, "Pendulum-v1", seed, budget, args.beast_flags, args.target, ()
                )
        for side in ("sb3", "beast"):
            run = runs[side]
            seconds, step = run["reached"] or (None, None)
            if seconds is not None:
                times[side].append(seconds)
            print(
                f"| {seed} | {side} | {_seconds(seconds)} | {step or '-'} |"
                f" {run['wall_clock']:.1f} s | {run['threads']} |",
                flush=True,
            )
        ratio = _ratio(
            (runs["beast"]["reached"] or (None,))[0], (runs["sb3"]["reached"] or (None,))[0]
        )
        if ratio is not None:
            ratios.append(ratio)
    for side in ("sb3", "beast"):
        median = f"{statistics.median(times[side]):.1f} s" if times[side] else "not reached"
        print(f"median time to {args.target:g}, {side}: {median} ({len(times[side])}/{args.runs})")
    if ratios:
        print(
            f"median beast/SB3 time to {args.target:g}: {statistics.median(ratios):.2f}"
            f" ({', '.join(f'{r:.2f}' for r in ratios)})",
            flush=True,
        )


def halfcheetah(args: argparse.Namespace) -> None:
    marks = (args.from_step, args.to_step)
    span = args.to_step - args.from_step
    print(
        f"\n## HalfCheetah-v5 {args.algo}: env steps/s between steps {args.from_step:,} and"
        f" {args.to_step:,}, 1 update per env step, batch 256, net_arch"
        f" {NET_ARCH[args.algo]}, {LEARNING_STARTS:,} random steps first, {args.runs} pair(s)"
    )
    print("| seed | side | steps/s | threads |")
    print("|---|---|---|---|")
    rates: dict[str, list[float]] = {"sb3": [], "beast": []}
    flags = ["--learning_starts", str(LEARNING_STARTS), "--utd_ratio", "1", "--batch_size"]
    flags += ["256", "--net_arch", ",".join(map(str, NET_ARCH[args.algo])), *args.beast_flags]
    sb3_kwargs = {
        "learning_starts": LEARNING_STARTS,
        "train_freq": 1,
        "gradient_steps": 1,
        "batch_size": 256,
        "policy_kwargs": {"net_arch": NET_ARCH[args.algo]},
    }
    for i in range(args.runs):
        seed, runs = i + 1, {}
        for side in ("sb3", "beast") if i % 2 == 0 else ("beast", "sb3"):
            if side == "sb3":
                runs[side] = run_sb3(
                    algo=args.algo,
                    env_id="HalfCheetah-v5",
                    seed=seed,
                    total_steps=args.to_step,
                    kwargs=sb3_kwargs,
                    threads=args.sb3_threads,
                    target=None,
                    marks=marks,
                )
                m = runs[side]["marks"]
                rate = span / (m[str(args.to_step)] - m[str(args.from_step)])
            else:
                runs[side] = beast_run(
                    args.algo, "HalfCheetah-v5", seed, args.to_step + 1, flags, None, marks
                )
                m = runs[side]["marks"]
                steps = m[f"{args.to_step}_step"] - m[f"{args.from_step}_step"]
                rate = steps / (m[str(args.to_step)] - m[str(args.from_step)])
            rates[side].append(rate)
        for side in ("sb3", "beast"):
            print(f"| {seed} | {side} | {rates[side][-1]:.1f} | {runs[side]['threads']} |")
    medians = {side: statistics.median(values) for side, values in rates.items()}
    print(
        f"median steps/s: SB3 {medians['sb3']:.1f}, beast {medians['beast']:.1f};"
        f" beast/SB3 {medians['beast'] / medians['sb3']:.2f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("pendulum", "halfcheetah", "both"), default="both")
    parser.add_argument("--algo", choices=tuple(PENDULUM_BUDGET), default="sac")
    parser.add_argument("--runs", type=int, default=None, help="paired runs, seeds 1..N (3)")
    parser.add_argument("--target", type=float, default=None, help=f"pendulum ({TARGET:g})")
    parser.add_argument("--from_step", type=int, default=None, help="halfcheetah (2,000)")
    parser.add_argument("--to_step", type=int, default=None, help="halfcheetah (5,000)")
    parser.add_argument("--sb3_threads", type=int, default=1, help="SB3's torch threads")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 short pair each")
    parser.add_argument("beast_flags", nargs="*", help="extra monobeast flags (after --)")
    parser.add_argument("--sb3", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sb3_kwargs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sb3:  # the child process of run_sb3
        print(json.dumps(sb3_run(**json.loads(args.sb3_kwargs))), flush=True)
        return
    defaults = QUICK if args.quick else {}
    defaults = {"runs": 3, "target": TARGET, "from_step": 2_000, "to_step": 5_000, **defaults}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    import stable_baselines3

    print(machine_description(), flush=True)
    print(f"stable-baselines3 {stable_baselines3.__version__}, pid {os.getpid()}", flush=True)
    if args.task in ("pendulum", "both"):
        pendulum(args)
    if args.task in ("halfcheetah", "both"):
        halfcheetah(args)


if __name__ == "__main__":
    main()
