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
  the same settings. Both are timed from the launch of their process: SB3's time is
  read in a callback (benchmarks.peers explains the clock); beast's is the logs.csv
  time of the update that consumed the episode, plus its start-up
  (`benchmarks.learning_checks.seconds_at_steps`: shutdown counts as start-up, which
  only makes beast look slower).
- HalfCheetah-v5: env steps per second of PPO over `--seconds` after `--warmup`
  seconds, SB3 with the zoo's HalfCheetah settings (`SB3_HALFCHEETAH`, VecNormalize),
  beast with configs/ppo/mujoco.yaml (the same).

SB3 gets `--sb3_threads` torch threads (default 1). The ratios SB3 time / beast time
and beast SPS / SB3 SPS are given per pair and as medians over the repeats.
`python -m benchmarks.races` races SBX as well.
"""

from __future__ import annotations

import argparse
import math
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
from benchmarks.learning_checks import Check, seconds_at_steps, summarize
from benchmarks.monobeast_sps import _CLEAN_ENVIRON, learner_threads, measure_monobeast_sps
from benchmarks.peers import algorithm, run_peer, set_threads, threads_held

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


def peer_cartpole(
    library: str,
    launched: float,
    seed: int,
    threshold: float,
    threads: int,
    total_steps: int = CARTPOLE_BUDGET,
) -> dict[str, Any]:
    """One PPO CartPole run of SB3 or SBX (`library`) with the zoo's settings over
    `total_steps`, in this process (benchmarks.peers runs it): the time from `launched`
    and the env step at which the mean return of the last 100 episodes first reached
    `threshold`, and the best such mean.

    SBX's PPO takes the same arguments, with its own defaults where the zoo sets none:
    ortho_init False (SB3: True; SBX's True would only scale the policy's last layer
    by 0.01), separate Adam optimizers (eps 1e-5, each clipped to max_grad_norm) for
    the policy and the value function where SB3 has one for their summed loss;
    clip_range_vf is not supported (the zoo leaves it unset)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    set_threads(library, threads)
    ppo = algorithm(library, "PPO")

    class Threshold(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=100)
            self.reached: tuple[float, int] | None = None
            self.best = math.nan

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
                    if len(self.returns) < 100:
                        continue
                    mean = sum(self.returns) / 100
                    self.best = mean if math.isnan(self.best) else max(self.best, mean)
                    if self.reached is None and mean >= threshold:
                        self.reached = (time.monotonic() - launched, self.num_timesteps)
            return True

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    kwargs = {key: _zoo_value(value) for key, value in SB3_CARTPOLE.items()}
    model = ppo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    callback = Threshold()
    model.learn(total_timesteps=total_steps, callback=callback)
    seconds, steps = callback.reached if callback.reached else (None, None)
    return {
        "seconds": seconds,
        "steps": steps,
        "best": callback.best,
        "env_steps": model.num_timesteps,
        "threads": threads_held(),
    }


def peer_halfcheetah(
    library: str, launched: float, seed: int, warmup: float, seconds: float, threads: int
) -> dict[str, Any]:
    """SB3's PPO on HalfCheetah-v5 for warmup + seconds of training: its steady env
    steps/s (`launched` is unused: the rate is between two points after warm-up). SB3
    only: the zoo's policy_kwargs name torch's ReLU."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    if library != "sb3":
        raise ValueError(f"PPO HalfCheetah runs SB3 only, not {library}")
    set_threads(library, threads)
    ppo = algorithm(library, "PPO")

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
    model = ppo(
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
        raise RuntimeError(f"{library} finished too few rollouts after {warmup}s warm-up")
    (t0, s0), (t1, s1) = steady[0], steady[-1]
    return {"sps": (s1 - s0) / (t1 - t0), "threads": threads_held()}


def beast_cartpole(
    seed: int, threshold: float, flags: list[str], total_steps: int = CARTPOLE_BUDGET
) -> dict[str, Any]:
    """monobeast.py --algo ppo --env CartPole-v1 (configs/ppo/classic.yaml) over
    `total_steps`, timed from launch."""
    with tempfile.TemporaryDirectory() as savedir:
        argv = [sys.executable, str(ROOT / "monobeast.py"), "--algo", "ppo"]
        argv += ["--env", "CartPole-v1", "--seed", str(seed), "--total_steps"]
        argv += [str(total_steps), "--savedir", savedir, "--xpid", "cartpole", *flags]
        launched = time.monotonic()
        result = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, env=_CLEAN_ENVIRON, timeout=3600
        )
        wall_clock = time.monotonic() - launched
        if result.returncode != 0:
            raise RuntimeError(f"beast CartPole failed: {result.stderr.strip()[-2000:]}")
        run_dir = str(Path(savedir) / "cartpole")
        check = Check("ppo", "monobeast.py", "local", "CartPole-v1", total_steps, threshold)
        outcome = summarize(check, seed, run_dir, wall_clock)
        env_steps = max(seconds_at_steps(run_dir, wall_clock), default=0)
    return {
        "seconds": outcome.reached_seconds,
        "steps": outcome.reached_at,
        "best": outcome.best,
        "env_steps": env_steps,
        "wall_clock": wall_clock,
        "threads": f"learner {learner_threads(result.stdout)}",
    }


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
    parser.add_argument(
        "--sb3_threads", type=int, default=1, help="SB3's torch threads (0: torch's default)"
    )
    args = parser.parse_args(argv)

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
                    runs[side] = run_peer(
                        peer_cartpole,
                        "sb3",
                        seed=seed,
                        threshold=args.threshold,
                        threads=args.sb3_threads,
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
                    sps[side] = run_peer(
                        peer_halfcheetah,
                        "sb3",
                        seed=seed,
                        warmup=args.warmup,
                        seconds=args.seconds,
                        threads=args.sb3_threads,
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
