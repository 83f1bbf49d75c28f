"""DQN beside Stable-Baselines3 on CartPole-v1, in one sitting, with rl-zoo3's settings.

    pip install -e ".[bench]"
    python -m benchmarks.sb3_dqn_side_by_side                  # 3 paired runs, 100k, 475
    python -m benchmarks.sb3_dqn_side_by_side --runs 5 --total_steps 50000
    python -m benchmarks.sb3_dqn_side_by_side --quick          # smoke test: 10k, 50, 1 run
    python -m benchmarks.sb3_dqn_side_by_side -- --no-dueling  # extra monobeast flags

`--runs` pairs, seeds 1..N; in each pair SB3 and beast run one after the other, never
at once (the order alternates between pairs, so neither side always runs on a cooler
machine):

- SB3: rl-baselines3-zoo's tuned CartPole-v1 DQN (hyperparams/dqn.yml, `SB3_DQN`), one
  Monitor-wrapped env, on the CPU, in its own process, but over `--total_steps` (100k)
  instead of the zoo's 50k, so both sides get the same budget; exploration_fraction is
  scaled to keep the zoo's 8,000-step epsilon decay (0.16 x 50k = 0.08 x 100k). It gets
  1 torch thread unless `--sb3_threads` says otherwise (0: torch's default, the CPU
  count), as beast's learner picks for an MLP this small (thread_tuner.learner_threads): with
  2 threads on 2 cores busy with other work, SB3's updates ran ~30x slower. Its
  clock starts at its process's launch, as beast's (benchmarks.peers); a callback reads
  each finished episode's return (Monitor's info["episode"], what fills ep_info_buffer).
- beast: `monobeast.py --algo dqn --env CartPole-v1 --seed S --total_steps N`, which
  picks configs/dqn/classic.yaml: the zoo's schedule (32 samples per env step, target
  copied before each 128 updates, the same epsilon decay, batch, buffer and network
  width) with double Q, the dueling head, 3-step returns, a prioritized replay and Adam
  at 1e-3, which the config explains. Its clock starts at the process launch: start-up
  included. Its times are read from the run directory: episodes.csv (step, return,
  length: each episode stamped with the learner update that consumed it) and logs.csv
  (step, time from the logger's start, per update), with
  `benchmarks.learning_checks.summarize` / `seconds_at_steps` as for PPO (the shutdown,
  final checkpoint included, counts as start-up: never less than the truth).

Per run: the wall-clock (and env step) at which the mean return of the last 100
training episodes (exploring ones included) first reaches each `--threshold` (475, the
issue's bar, and 200, which SB3 reaches with the zoo's settings), or "not reached"
within the budget; the final mean of the last 100; the whole run's wall-clock;
env steps/s over it. Then the medians per side, and the ratio beast time / SB3 time to
the threshold for each pair where both reached it (below 1: beast got there sooner).
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

from benchmarks.learning_checks import Check, seconds_at_steps, summarize
from benchmarks.monobeast_sps import _CLEAN_ENVIRON, learner_threads
from benchmarks.peers import algorithm, run_peer, set_threads, threads_held
from benchmarks.sb3_side_by_side import ROOT, _ratio, _seconds, machine_description

BUDGET = 100_000
THRESHOLDS = (475.0, 200.0)  # the bar, and one SB3 reaches with the zoo's settings
EPS_DECAY_STEPS = 8_000  # the zoo's 0.16 x 5e4; configs/dqn/classic.yaml's eps_decay_steps
QUICK = {"total_steps": 10_000, "threshold": [50.0], "runs": 1}  # under a minute on 2 cores

# rl-baselines3-zoo, hyperparams/dqn.yml, CartPole-v1 (n_timesteps 5e4, n_envs 1);
# exploration_fraction is set from EPS_DECAY_STEPS and the budget (0.16 at 5e4).
SB3_DQN: dict[str, Any] = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}


def _mean100(returns: list[float]) -> float:
    return sum(returns[-100:]) / 100 if len(returns) >= 100 else math.nan


def peer_dqn(
    library: str,
    launched: float,
    seed: int,
    total_steps: int,
    thresholds: list[float],
    threads: int,
) -> dict[str, Any]:
    """One DQN CartPole run of SB3 or SBX (`library`) over `total_steps` with the zoo's
    settings, in this process (benchmarks.peers runs it; `threads`: SB3's torch threads,
    0 for torch's default): the time from `launched` and the env step at which the mean
    of the last 100 training episodes first reached each threshold, the best such mean.

    SBX's DQN takes the same arguments, with these differences: its Q-network has two
    hidden layers of net_arch[0] units whatever the list's length (here [256, 256], the
    same), it does not clip gradients (SB3's max_grad_norm 10, which the zoo leaves at
    its default), and it trains at a constant learning rate (the zoo's is constant)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    set_threads(library, threads)
    dqn = algorithm(library, "DQN")

    class Threshold(BaseCallback):
        """Each training episode's return; the first time the last 100 average >= each
        threshold."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: list[float] = []
            self.window: deque[float] = deque(maxlen=100)
            self.reached: dict[float, tuple[float, int]] = {}
            self.best = math.nan

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's, as in ep_info_buffer
                    self.returns.append(float(info["episode"]["r"]))
                    self.window.append(self.returns[-1])
                    if len(self.window) < 100:
                        continue
                    mean = sum(self.window) / 100
                    self.best = mean if math.isnan(self.best) else max(self.best, mean)
                    for threshold in thresholds:
                        if threshold not in self.reached and mean >= threshold:
                            now = time.monotonic() - launched
                            self.reached[threshold] = (now, self.num_timesteps)
            return True

    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = dqn(
        "MlpPolicy",
        env,
        exploration_fraction=EPS_DECAY_STEPS / total_steps,
        seed=seed,
        device="cpu",
        verbose=0,
        **SB3_DQN,
    )
    callback = Threshold()
    model.learn(total_timesteps=total_steps, callback=callback)
    return {
        "reached": {str(t): callback.reached.get(t, (None, None)) for t in thresholds},
        "best": callback.best,
        "final": _mean100(callback.returns),
        "episodes": len(callback.returns),
        "env_steps": model.num_timesteps,
        "threads": threads_held(),
    }


def run_peer_dqn(library: str, xla_flags: str = "", **kwargs: Any) -> dict[str, Any]:
    """`peer_dqn` in its own process (benchmarks.peers.run_peer), with env steps/s over the
    whole run, launch to exit."""
    run = run_peer(peer_dqn, library, xla_flags, **kwargs)
    return {**run, "sps": run["env_steps"] / run["wall_clock"]}


def beast_dqn(
    seed: int, total_steps: int, thresholds: list[float], flags: list[str]
) -> dict[str, Any]:
    """monobeast.py --algo dqn --env CartPole-v1 (configs/dqn/classic.yaml), timed from launch."""
    with tempfile.TemporaryDirectory() as savedir:
        argv = [sys.executable, str(ROOT / "monobeast.py"), "--algo", "dqn"]
        argv += ["--env", "CartPole-v1", "--seed", str(seed), "--total_steps", str(total_steps)]
        argv += ["--savedir", savedir, "--xpid", "cartpole", *flags]
        launched = time.monotonic()
        result = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, env=_CLEAN_ENVIRON, timeout=3600
        )
        wall_clock = time.monotonic() - launched
        if result.returncode != 0:
            raise RuntimeError(f"beast DQN failed: {result.stderr.strip()[-2000:]}")
        run_dir = str(Path(savedir) / "cartpole")
        reached = {}
        for threshold in thresholds:
            check = Check("dqn", "monobeast.py", "local", "CartPole-v1", total_steps, threshold)
            outcome = summarize(check, seed, run_dir, wall_clock)
            reached[str(threshold)] = (outcome.reached_seconds, outcome.reached_at)
        env_steps = max(seconds_at_steps(run_dir, wall_clock), default=0)
    return {
        "reached": reached,
        "best": outcome.best,
        "final": outcome.last,
        "episodes": outcome.episodes,
        "wall_clock": wall_clock,
        "env_steps": env_steps,
        "sps": env_steps / wall_clock,
        "threads": f"learner {learner_threads(result.stdout)}",
    }


def _row(name: str, run: dict[str, Any], threshold: float) -> str:
    seconds, steps = run["reached"][str(threshold)]
    steps = "-" if steps is None else f"{steps:,}"
    return (
        f"| {name:<5} | {threshold:>6g} | {_seconds(seconds):>11} | {steps:>9} |"
        f" {run['final']:>10.1f} | {run['episodes']:>8,} | {run['wall_clock']:>8.1f} s |"
        f" {run['sps']:>8,.0f} |"
    )


HEADER = (
    "| side  | thresh | to thresh.  | at step   | final m100 | episodes | wall-clock | env st/s |\n"
    "|-------|--------|-------------|-----------|------------|----------|------------|----------|"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="paired runs, seeds 1..N (3)")
    parser.add_argument(
        "--threshold",
        type=float,
        nargs="+",
        default=None,
        help=f"means of 100 to time ({' '.join(f'{t:g}' for t in THRESHOLDS)})",
    )
    parser.add_argument("--total_steps", type=int, default=None, help=f"budget ({BUDGET:,})")
    parser.add_argument(
        "--sb3_threads",
        type=int,
        default=1,
        help="SB3's torch threads; 0: torch's default (CPU count), as a bare SB3 script runs."
        " Default 1: what beast's learner picks for an MLP this small (learner_threads)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 10k steps, threshold 50, 1 run (unless given explicitly)",
    )
    parser.add_argument(
        "beast_flags", nargs="*", help="extra monobeast flags (after --), e.g. --no-dueling"
    )
    args = parser.parse_args(argv)
    defaults = (
        QUICK if args.quick else {"total_steps": BUDGET, "threshold": list(THRESHOLDS), "runs": 3}
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import stable_baselines3

    print(machine_description(), flush=True)
    print(
        f"stable-baselines3 {stable_baselines3.__version__}; CartPole-v1 DQN, {args.runs}"
        f" paired run(s), {args.total_steps:,} env steps each, thresholds"
        f" {', '.join(f'{t:g}' for t in args.threshold)}"
        f" (mean of the last 100 training episodes); SB3 exploration_fraction"
        f" {EPS_DECAY_STEPS / args.total_steps:.3g}; beast flags:"
        f" {' '.join(args.beast_flags) or '(configs/dqn/classic.yaml)'}",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {"sb3": [], "beast": []}
    ratios: dict[float, list[float]] = {t: [] for t in args.threshold}
    for i in range(args.runs):
        seed = i + 1
        runs: dict[str, dict[str, Any]] = {}
        for side in ("sb3", "beast") if i % 2 == 0 else ("beast", "sb3"):
            if side == "sb3":
                runs[side] = run_peer_dqn(
                    "sb3",
                    seed=seed,
                    total_steps=args.total_steps,
                    thresholds=args.threshold,
                    threads=args.sb3_threads,
                )
            else:
                runs[side] = beast_dqn(seed, args.total_steps, args.threshold, args.beast_flags)
            results[side].append(runs[side])
        print(
            f"\n[{i + 1}/{args.runs}] seed {seed} (ran {' then '.join(runs)}; threads:"
            f" SB3 {runs['sb3']['threads']}; beast {runs['beast']['threads']})",
            flush=True,
        )
        print(HEADER)
        for threshold in args.threshold:
            print(_row("SB3", runs["sb3"], threshold))
            print(_row("beast", runs["beast"], threshold))
            key = str(threshold)
            ratio = _ratio(runs["beast"]["reached"][key][0], runs["sb3"]["reached"][key][0])
            if ratio is not None:
                ratios[threshold].append(ratio)
            shown = "n/a" if ratio is None else f"{ratio:.2f}"
            print(f"beast/SB3 time to {threshold:g}: {shown}", flush=True)

    print(f"\nmedians over {args.runs} run(s):")
    print(HEADER)
    for threshold in args.threshold:
        key = str(threshold)
        for side, name in (("sb3", "SB3"), ("beast", "beast")):
            reached = [run["reached"][key] for run in results[side] if run["reached"][key][0]]
            median = {
                k: statistics.median(run[k] for run in results[side])
                for k in ("final", "episodes", "wall_clock", "sps")
            }
            # Time to threshold: over the runs that reached it ("not reached" if none did).
            median["reached"] = {
                key: (
                    statistics.median(r[0] for r in reached) if reached else None,
                    round(statistics.median(r[1] for r in reached)) if reached else None,
                )
            }
            median["episodes"] = round(median["episodes"])
            print(f"{_row(name, median, threshold)} (reached in {len(reached)}/{args.runs})")
        paired = ratios[threshold]
        if paired:
            print(
                f"median beast/SB3 time to {threshold:g}: {statistics.median(paired):.2f}"
                f" over {len(paired)} pair(s) where both reached it"
                f" ({', '.join(f'{r:.2f}' for r in paired)})",
                flush=True,
            )
        else:
            print(f"beast/SB3 time to {threshold:g}: n/a (no pair where both reached it)")


if __name__ == "__main__":
    main()
