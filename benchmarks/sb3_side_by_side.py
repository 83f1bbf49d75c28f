"""PPO beside Stable-Baselines3 on this machine, in one sitting, with rl-zoo3's settings.

    pip install -e ".[bench]"
    python -m benchmarks.sb3_side_by_side --repeats 3
    python -m benchmarks.sb3_side_by_side -- --no-synchronous --advantages vtrace

Two measurements per repeat, each a pair of runs, one after the other (the order
alternates between repeats, so neither side always runs on a cooler machine):

- CartPole-v1: wall-clock from launching the process to the first time the mean return
  of the last 100 finished episodes reaches `--threshold` (475), within the zoo's budget
  of 100k env steps. SB3 runs the zoo's tuned PPO (`SB3_CARTPOLE`); beast runs
  `monobeast.py --algo ppo --env CartPole-v1`, which picks configs/ppo/classic.yaml,
  the same settings. SB3's time is read in a callback; beast's is the logs.csv time of
  the update that consumed the episode, plus its start-up
  (`benchmarks.learning_checks.seconds_at_steps`: shutdown counts as start-up, which
  only makes beast look slower).
- HalfCheetah-v5: env steps per second of PPO over `--seconds` after `--warmup`
  seconds, SB3 with the zoo's HalfCheetah settings (`SB3_HALFCHEETAH`, VecNormalize),
  beast with configs/ppo/mujoco.yaml (the same).

The ratios SB3 time / beast time and beast SPS / SB3 SPS are given per pair and as
medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
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

from benchmarks.env_throughput import machine_description
from benchmarks.learning_checks import Check, summarize
from benchmarks.monobeast_sps import _CLEAN_ENVIRON, measure_monobeast_sps

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE_BUDGET = 100_000

# rl-baselines3-zoo, hyperparams/ppo.yml, CartPole-v1 (n_envs 8, 1e5 steps).
SB3_CARTPOLE: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": ("linear", 0.001),
    "clip_range": ("linear", 0.2),
}
# rl-baselines3-zoo, hyperparams/ppo.yml, HalfCheetah (normalize true, n_envs 1).
SB3_HALFCHEETAH: dict[str, Any] = {
    "batch_size": 64,
    "n_steps": 512,
    "gamma": 0.98,
    "learning_rate": 2.0633e-05,
    "ent_coef": 0.000401762,
    "clip_range": 0.1,
    "n_epochs": 20,
    "gae_lambda": 0.92,
    "max_grad_norm": 0.8,
    "vf_coef": 0.58096,
}


def _zoo_value(value: Any) -> Any:
    """The zoo's "lin_x": a function of SB3's progress_remaining (1 -> 0)."""
    if isinstance(value, tuple) and value[0] == "linear":
        start = value[1]
        return lambda progress_remaining: progress_remaining * start
    return value


def sb3_cartpole(seed: int, launched: float, threshold: float) -> dict[str, Any]:
    """One SB3 PPO CartPole run to the zoo's budget (in this process)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Threshold(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=100)
            self.reached: tuple[float, int] | None = None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            full = len(self.returns) == 100
            if self.reached is None and full and sum(self.returns) / 100 >= threshold:
                self.reached = (time.time() - launched, self.num_timesteps)
            return True

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    kwargs = {key: _zoo_value(value) for key, value in SB3_CARTPOLE.items()}
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    callback = Threshold()
    model.learn(total_timesteps=CARTPOLE_BUDGET, callback=callback)
    seconds, steps = callback.reached if callback.reached else (None, None)
    return {"seconds": seconds, "steps": steps, "wall_clock": time.time() - launched}


def sb3_halfcheetah(seed: int, warmup: float, seconds: float) -> dict[str, Any]:
    """SB3 PPO on HalfCheetah-v5 for warmup + seconds: its steady env steps/s."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    class Clock(BaseCallback):
        """(time since training began, env steps) at each rollout's end; stops the run."""

        def __init__(self) -> None:
            super().__init__()
            self.marks: list[tuple[float, int]] = []
            self.start = time.monotonic()

        def _on_step(self) -> bool:
            return time.monotonic() - self.start < warmup + seconds

        def _on_rollout_end(self) -> None:
            self.marks.append((time.monotonic() - self.start, self.num_timesteps))

    env = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed), gamma=0.98)
    policy_kwargs = {
        "log_std_init": -2,
        "ortho_init": False,
        "activation_fn": nn.ReLU,
        "net_arch": {"pi": [256, 256], "vf": [256, 256]},
    }
    model = PPO(
        "MlpPolicy",
        env,
        seed=seed,
        device="cpu",
        verbose=0,
        policy_kwargs=policy_kwargs,
        **SB3_HALFCHEETAH,
    )
    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    steady = [mark for mark in clock.marks if mark[0] >= warmup]
    if len(steady) < 2:
        raise RuntimeError(f"SB3 finished too few rollouts after {warmup}s warm-up")
    (t0, s0), (t1, s1) = steady[0], steady[-1]
    return {"sps": (s1 - s0) / (t1 - t0)}


def run_sb3(part: str, **kwargs: Any) -> dict[str, Any]:
    """An SB3 measurement in its own process, as a user runs it (imports included)."""
    argv = [sys.executable, "-m", "benchmarks.sb3_side_by_side", "--sb3", part]
    argv += ["--sb3_kwargs", json.dumps(kwargs)]
    result = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, env=_CLEAN_ENVIRON, timeout=3600
    )
    if result.returncode != 0:
        raise RuntimeError(f"SB3 {part} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def beast_cartpole(seed: int, threshold: float, flags: list[str]) -> dict[str, Any]:
    """monobeast.py --algo ppo --env CartPole-v1 (configs/ppo/classic.yaml) to 100k."""
    with tempfile.TemporaryDirectory() as savedir:
        argv = [sys.executable, str(ROOT / "monobeast.py"), "--algo", "ppo"]
        argv += ["--env", "CartPole-v1", "--seed", str(seed), "--total_steps"]
        argv += [str(CARTPOLE_BUDGET), "--savedir", savedir, "--xpid", "cartpole", *flags]
        launched = time.monotonic()
        result = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, env=_CLEAN_ENVIRON, timeout=3600
        )
        wall_clock = time.monotonic() - launched
        if result.returncode != 0:
            raise RuntimeError(f"beast CartPole failed: {result.stderr.strip()[-2000:]}")
        check = Check("ppo", "monobeast.py", "local", "CartPole-v1", CARTPOLE_BUDGET, threshold)
        outcome = summarize(check, seed, str(Path(savedir) / "cartpole"), wall_clock)
    seconds, steps = outcome.reached_seconds, outcome.reached_at
    return {"seconds": seconds, "steps": steps, "wall_clock": wall_clock}


def beast_halfcheetah(seed: int, warmup: float, seconds: float, flags: list[str]) -> dict[str, Any]:
    """monobeast.py --algo ppo --env HalfCheetah-v5 (configs/ppo/mujoco.yaml)."""
    flags = ["--algo", "ppo", "--seed", str(seed), *flags]
    return {"sps": measure_monobeast_sps("HalfCheetah-v5", warmup + seconds, warmup, flags)}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--parts", nargs="*", default=["cartpole", "halfcheetah"])
    parser.add_argument(
        "beast_flags", nargs="*", help="extra monobeast flags (after --), e.g. --no-synchronous"
    )
    parser.add_argument("--sb3", choices=["cartpole", "halfcheetah"], help=argparse.SUPPRESS)
    parser.add_argument("--sb3_kwargs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sb3:  # the child process of run_sb3
        worker = sb3_cartpole if args.sb3 == "cartpole" else sb3_halfcheetah
        print(json.dumps(worker(**json.loads(args.sb3_kwargs))), flush=True)
        return

    import stable_baselines3

    print(machine_description(), flush=True)
    print(
        f"stable-baselines3 {stable_baselines3.__version__}; beast flags:"
        f" {' '.join(args.beast_flags) or '(the configs)'}",
        flush=True,
    )
    speedups: dict[str, list[float]] = {part: [] for part in args.parts}
    for i in range(args.repeats):
        seed = i + 1
        sb3_first = i % 2 == 0
        if "cartpole" in args.parts:
            runs = {}
            for side in ("sb3", "beast") if sb3_first else ("beast", "sb3"):
                if side == "sb3":
                    runs[side] = run_sb3(
                        "cartpole", seed=seed, launched=time.time(), threshold=args.threshold
                    )
                else:
                    runs[side] = beast_cartpole(seed, args.threshold, args.beast_flags)
            ratio = _ratio(runs["sb3"]["seconds"], runs["beast"]["seconds"])
            if ratio is not None:
                speedups["cartpole"].append(ratio)
            print(
                f"[{i + 1}/{args.repeats}] CartPole-v1 PPO, seed {seed}, to {args.threshold:g}:"
                f" SB3 {_seconds(runs['sb3']['seconds'])} (step {runs['sb3']['steps']},"
                f" whole run {runs['sb3']['wall_clock']:.1f} s);"
                f" beast {_seconds(runs['beast']['seconds'])} (step {runs['beast']['steps']},"
                f" whole run {runs['beast']['wall_clock']:.1f} s);"
                f" SB3/beast {'n/a' if ratio is None else f'{ratio:.2f}'}",
                flush=True,
            )
        if "halfcheetah" in args.parts:
            sps = {}
            for side in ("sb3", "beast") if sb3_first else ("beast", "sb3"):
                if side == "sb3":
                    sps[side] = run_sb3(
                        "halfcheetah", seed=seed, warmup=args.warmup, seconds=args.seconds
                    )["sps"]
                else:
                    sps[side] = beast_halfcheetah(
                        seed, args.warmup, args.seconds, args.beast_flags
                    )["sps"]
            speedups["halfcheetah"].append(sps["beast"] / sps["sb3"])
            print(
                f"[{i + 1}/{args.repeats}] HalfCheetah-v5 PPO, {args.seconds:g} s after"
                f" {args.warmup:g} s: SB3 {sps['sb3']:,.0f} steps/s; beast"
                f" {sps['beast']:,.0f} steps/s; beast/SB3 {speedups['halfcheetah'][-1]:.2f}",
                flush=True,
            )
    for part, ratios in speedups.items():
        if ratios:
            what = "SB3 time / beast time" if part == "cartpole" else "beast SPS / SB3 SPS"
            print(
                f"median {part} {what}: {statistics.median(ratios):.2f}"
                f" over {len(ratios)} paired runs ({', '.join(f'{r:.2f}' for r in ratios)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
