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
  (30k for TD3 and DDPG). Both sides stop once they reach it. Both clocks start at the
  launch of the side's process (start-up included): SB3's in its own process
  (benchmarks.peers), where a callback watches Monitor's episode returns; beast's at
  the launch of `monobeast.py`, which this script
  watches through the run's episodes.csv, written at each update, and stops with SIGTERM
  (a checkpoint, as a user's Ctrl-C) once the mean is reached: the time is when the
  script saw it, never less than the truth.
- halfcheetah: env steps/s on HalfCheetah-v5 while training, at the same update-to-data
  ratio (1: SB3's train_freq 1, gradient_steps 1; beast's --utd_ratio 1), batch (256)
  and network widths (--algo's: SAC 256-256, TD3 and DDPG 400-300), one env each: the
  rate between env steps `--from_step` and `--to_step`, after 1,000 random steps (beast's
  from logs.csv's per-update times, SB3's from a callback's clock).

SB3 gets `--sb3_threads` torch threads (default 1, as beast's learner takes for models
this small: beast/run/plan.py learner_threads); beast's actor process runs beside its
learner on the other core. Medians per side and beast/SB3 ratios are printed at the end.
`python -m benchmarks.races` races SBX as well.
"""

from __future__ import annotations

import argparse
import csv
import math
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

from benchmarks.monobeast_sps import _CLEAN_ENVIRON, learner_threads
from benchmarks.peers import algorithm, run_peer, set_threads, threads_held
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


def peer_run(
    library: str,
    launched: float,
    algo: str,
    env_id: str,
    seed: int,
    total_steps: int,
    kwargs: dict[str, Any],
    threads: int,
    target: float | None,
    marks: list[int],
    window: int = WINDOW,
) -> dict[str, Any]:
    """One SAC, TD3 or DDPG run of SB3 or SBX (`library`) in this process
    (benchmarks.peers runs it): the time from `launched` and the step at which the mean
    of the last `window` episodes first reached `target` (then it stops), the best such
    mean, and the clock at each of `marks` (env steps).

    SBX's SAC, TD3 and DDPG take SB3's arguments used here (SAC's defaults are SB3's:
    net_arch [256, 256], log_std_init -3, ent_coef auto from 1.0); SBX has no
    optimize_memory_usage or target_update_interval (SB3's default, 1, is what SBX does)
    and its gSDE is partial (neither side uses gSDE here)."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    set_threads(library, threads)
    model_class = algorithm(library, algo.upper())

    class Watch(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.window: deque[float] = deque(maxlen=window)
            self.reached: tuple[float, int] | None = None
            self.best = math.nan
            self.marks: dict[str, float] = {}

        def _on_step(self) -> bool:
            now = time.monotonic() - launched
            if self.num_timesteps in marks:
                self.marks[str(self.num_timesteps)] = now
                self.marks[f"{self.num_timesteps}_step"] = self.num_timesteps
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's
                    self.window.append(float(info["episode"]["r"]))
                    if len(self.window) < window:
                        continue
                    mean = sum(self.window) / window
                    self.best = mean if math.isnan(self.best) else max(self.best, mean)
                    if target is not None and mean >= target:
                        self.reached = (now, self.num_timesteps)
                        return False
            return True

    env = make_vec_env(env_id, n_envs=1, seed=seed)
    kwargs = dict(kwargs)
    if algo != "sac":
        dim = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), NOISE_STD * np.ones(dim))
    model = model_class("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    callback = Watch()
    model.learn(total_timesteps=total_steps, callback=callback)
    return {
        "reached": callback.reached,
        "best": callback.best,
        "marks": callback.marks,
        "env_steps": model.num_timesteps,
        "threads": threads_held(),
    }


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def best_mean(returns: list[float], window: int) -> float:
    """The best mean of `window` consecutive returns; nan when there are fewer."""
    if window <= 0 or len(returns) < window:
        return math.nan
    total = sum(returns[:window])
    best = total
    for i in range(window, len(returns)):
        total += returns[i] - returns[i - window]
        best = max(best, total)
    return best / window


def marked_rate(marks: dict[str, float], from_step: int, to_step: int) -> float:
    """Env steps/s between two of a run's `marks`: `marks[str(s)]` is the time (seconds)
    at the first record at or after step s, and `marks[f"{s}_step"]` the step of that
    record (beast logs one per update, not per env step; a peer's are exact)."""
    steps = marks[f"{to_step}_step"] - marks[f"{from_step}_step"]
    return steps / (marks[str(to_step)] - marks[str(from_step)])


def beast_run(
    algo: str,
    env_id: str,
    seed: int,
    total_steps: int,
    flags: list[str],
    target: float | None,
    marks: tuple[int, ...],
    window: int = WINDOW,
) -> dict[str, Any]:
    """monobeast.py with `flags`, timed from launch; stopped (SIGTERM) once the mean of
    the last `window` episodes reaches `target`. The clock at each of `marks` (env steps)
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
            returns = [float(row["return"]) for row in episodes[-window:]]
            if len(returns) == window and sum(returns) / window >= target:
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
        returns = [float(row["return"]) for row in _rows(run_dir / "episodes.csv")]
    return {
        "reached": reached,
        "best": best_mean(returns, window),
        "marks": times,
        "wall_clock": wall_clock,
        "env_steps": int(logs[-1]["step"]) if logs else 0,
        "threads": f"learner {learner_threads(out)}",
    }


def halfcheetah_beast_flags(algo: str) -> list[str]:
    """beast's HalfCheetah flags over configs/<algo>/mujoco.yaml: the measured settings."""
    flags = ["--learning_starts", str(LEARNING_STARTS), "--utd_ratio", "1", "--batch_size"]
    return [*flags, "256", "--net_arch", ",".join(map(str, NET_ARCH[algo]))]


def halfcheetah_peer_kwargs(algo: str) -> dict[str, Any]:
    """The same settings in SB3's (and SBX's) arguments."""
    return {
        "learning_starts": LEARNING_STARTS,
        "train_freq": 1,
        "gradient_steps": 1,
        "batch_size": 256,
        "policy_kwargs": {"net_arch": NET_ARCH[algo]},
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
                runs[side] = run_peer(
                    peer_run,
                    "sb3",
                    algo=args.algo,
                    env_id="Pendulum-v1",
                    seed=seed,
                    total_steps=budget,
                    kwargs=SB3_PENDULUM[args.algo],
                    threads=args.sb3_threads,
                    target=args.target,
                    marks=[],
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
    marks = [args.from_step, args.to_step]
    print(
        f"\n## HalfCheetah-v5 {args.algo}: env steps/s between steps {args.from_step:,} and"
        f" {args.to_step:,}, 1 update per env step, batch 256, net_arch"
        f" {NET_ARCH[args.algo]}, {LEARNING_STARTS:,} random steps first, {args.runs} pair(s)"
    )
    print("| seed | side | steps/s | threads |")
    print("|---|---|---|---|")
    rates: dict[str, list[float]] = {"sb3": [], "beast": []}
    for i in range(args.runs):
        seed, runs = i + 1, {}
        for side in ("sb3", "beast") if i % 2 == 0 else ("beast", "sb3"):
            if side == "sb3":
                runs[side] = run_peer(
                    peer_run,
                    "sb3",
                    algo=args.algo,
                    env_id="HalfCheetah-v5",
                    seed=seed,
                    total_steps=args.to_step,
                    kwargs=halfcheetah_peer_kwargs(args.algo),
                    threads=args.sb3_threads,
                    target=None,
                    marks=marks,
                )
            else:
                flags = [*halfcheetah_beast_flags(args.algo), *args.beast_flags]
                runs[side] = beast_run(
                    args.algo, "HalfCheetah-v5", seed, args.to_step + 1, flags, None, marks
                )
            rates[side].append(marked_rate(runs[side]["marks"], args.from_step, args.to_step))
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
    args = parser.parse_args(argv)
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
