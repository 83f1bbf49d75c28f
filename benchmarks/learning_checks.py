"""The learning checks, as a report: each algorithm's bar in each mode, one run after the other.

    python -m benchmarks.learning_checks                       # every check, seed 1
    python -m benchmarks.learning_checks --only r2d2 --seeds 1 2 3
    python -m benchmarks.learning_checks --only impala-monobeast-local --savedir /tmp/checks
    python -m benchmarks.learning_checks --only ppo-monobeast-local -- --no-synchronous

Each check is a real run of monobeast.py or polybeast.py with the shipped
configs/<algo>/classic.yaml for its env, from start to --total_steps. The report gives,
per run: the agent step at which the mean return of the last 100 finished episodes (20
for Pendulum) first reached the bar (and the wall-clock from launch to it), the best such
mean, the mean of the last 100 (20) episodes at the end, and the wall-clock of the whole
run (start-up included). The means count every env's episodes, exploring ones included (Ape-X's
spread of epsilons).

tests/end_to_end/test_learning.py asserts the same bars (`-m slow`) from the same table.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Check:
    """One algorithm's bar in one mode: the best mean of `window` consecutive episodes
    within `total_steps`, or with `final`, the mean of the last `window` episodes at the
    end (the continuous-control issue's criterion)."""

    algo: str
    script: str  # monobeast.py or polybeast.py
    policy: str  # local or central
    env: str
    total_steps: int
    bar: float
    window: int = 100
    final: bool = False
    flags: tuple[str, ...] = ()  # for an env with no tuned config family

    @property
    def name(self) -> str:
        name = f"{self.algo}-{self.script.removesuffix('beast.py')}beast-{self.policy}"
        if self.env in ("CartPole-v1", "MaskedCartPole-v1"):
            return name
        return f"{name}-{self.env.rpartition(':')[2]}"  # a module:Class env by its class


# The issues' bars: IMPALA CartPole >= 475 within 500k (issue 43's, for the default run;
# 450 before); LASER 450 within 300k; R2D2
# MaskedCartPole (no velocities: only a recurrent agent balances it) >= 400 within 1M;
# Ape-X CartPole >= 450 within 1M; PPO CartPole >= 475 within 100k, A2C within 500k;
# PPO HalfCheetah-v5 >= 1,500 within 1M (about an hour on 2 cores: local policy only).
# Each in monobeast with a local and a central policy, LASER, R2D2 and PPO in polybeast too.
BOTH = ("local", "central")
CHECKS = [
    Check(algo, script, policy, env, steps, bar)
    for algo, env, steps, bar, scripts, policies in (
        ("impala", "CartPole-v1", 500_000, 475.0, ("monobeast.py",), BOTH),
        ("laser", "CartPole-v1", 300_000, 450.0, ("monobeast.py", "polybeast.py"), BOTH),
        ("r2d2", "MaskedCartPole-v1", 1_000_000, 400.0, ("monobeast.py", "polybeast.py"), BOTH),
        ("apex", "CartPole-v1", 1_000_000, 450.0, ("monobeast.py",), BOTH),
        ("ppo", "CartPole-v1", 100_000, 475.0, ("monobeast.py", "polybeast.py"), BOTH),
        ("a2c", "CartPole-v1", 500_000, 475.0, ("monobeast.py",), BOTH),
        ("ppo", "HalfCheetah-v5", 1_000_000, 1500.0, ("monobeast.py",), ("local",)),
        ("dqn", "CartPole-v1", 100_000, 475.0, ("monobeast.py",), ("local",)),
        ("c51", "CartPole-v1", 100_000, 475.0, ("monobeast.py",), ("local",)),
        ("rainbow", "CartPole-v1", 100_000, 475.0, ("monobeast.py",), ("local",)),
    )
    for script in scripts
    for policy in policies
    if script == "monobeast.py" or policy == "local"
]
# Continuous control on Pendulum-v1 (200-step episodes): the mean of the last 20
# episodes at the end, SAC >= -200 within 20k steps, TD3 >= -250 and DDPG >= -300 within
# 30k, one actor with one env (configs/<algo>/classic.yaml).
CHECKS += [
    Check(algo, "monobeast.py", "local", "Pendulum-v1", steps, bar, window=20, final=True)
    for algo, steps, bar in (
        ("sac", 20_000, -200.0),
        ("td3", 30_000, -250.0),
        ("ddpg", 30_000, -300.0),
    )
]

# Dict observations: DictCartPole-v1 is CartPole-v1 with its observation split into a
# position and a velocity leaf, learned through the multi-input model with the classic
# configs: IMPALA and PPO to a mean of 400 over 100 episodes. DictGridTarget-v0 mixes an
# image leaf and a vector leaf (beast/envs/grid_target.py: a return of 1 reaches the
# target, random moves average 0.2): IMPALA to a mean of 0.95, with these flags (the env
# has no config family).
CHECKS += [
    Check(algo, "monobeast.py", policy, "DictCartPole-v1", steps, 400.0)
    for algo, steps in (("impala", 500_000), ("ppo", 100_000))
    for policy in BOTH
]
GRID_TARGET_FLAGS = (
    *("--num_actors", "2", "--num_envs_per_actor", "8", "--unroll_length", "20"),
    *("--batch_size", "8", "--learning_rate", "0.0006", "--entropy_cost", "0.01"),
    *("--discounting", "0.97"),
)
CHECKS.append(
    Check(
        "impala",
        "monobeast.py",
        "local",
        "DictGridTarget-v0",
        300_000,
        0.95,
        flags=GRID_TARGET_FLAGS,
    )
)

# A user's own env: CartPole-v1 as a class with no Gymnasium id (tests/support/user_envs.py), with
# no flags but the checks' own: its spaces (vector observations, Discrete actions) pick
# configs/<algo>/classic.yaml, CartPole-v1's file, and it gets CartPole-v1's budgets.
# The bars: IMPALA 475 (issue 43's; 400 before), PPO 475.
CHECKS += [
    Check(algo, "monobeast.py", "local", "tests.support.user_envs:CustomCartPole", steps, bar)
    for algo, steps, bar in (("impala", 500_000, 475.0), ("ppo", 100_000, 475.0))
]

# Issue 43: the default run (IMPALA, configs/impala/classic.yaml, no flag but --env) on
# Acrobot-v1 (-1 a step until the tip swings above the bar, 500-step limit), by its id and
# as a user's class, which picks the same file from its spaces: a mean of 100 episodes
# >= -100 within 500k steps.
CHECKS += [
    Check("impala", "monobeast.py", "local", env, 500_000, -100.0)
    for env in ("Acrobot-v1", "tests.support.user_envs:CustomAcrobot")
]
# MountainCar-v0 (sparse: -1 a step until a goal random actions rarely reach in 200 steps)
# defeats IMPALA's and PPO's classic defaults; the start-up line names DQN's instead
# (beast/config/families.py), and this check holds it to that: -110 (the task's 'solved')
# within its config's own 100k steps.
CHECKS.append(Check("dqn", "monobeast.py", "local", "MountainCar-v0", 100_000, -110.0))


@dataclass(frozen=True)
class Outcome:
    check: Check
    seed: int
    reached_at: int | None  # agent step where the 100-episode mean first reached the bar
    reached_seconds: float | None  # wall-clock from launch to that step
    best: float  # best mean of `window` consecutive episodes
    last: float  # mean of the last `window` episodes
    wall_clock: float  # seconds, the whole run
    episodes: int

    @property
    def passed(self) -> bool:
        return (self.last if self.check.final else self.best) >= self.check.bar


def read_episodes(run_dir: str) -> list[tuple[int, float]]:
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        return [(int(row["step"]), float(row["return"])) for row in csv.DictReader(f)]


def seconds_at_steps(run_dir: str, wall_clock: float) -> dict[int, float]:
    """Wall-clock from launch to each learner update's step: logs.csv's time (from the
    logger's start) plus the start-up, taken as the whole run's `wall_clock` minus the
    last row's time (so the shutdown counts as start-up: never less than the truth)."""
    with open(os.path.join(run_dir, "logs.csv")) as f:
        times = {int(row["step"]): float(row["time"]) for row in csv.DictReader(f)}
    start_up = wall_clock - max(times.values(), default=0.0)
    return {step: start_up + seconds for step, seconds in times.items()}


def summarize(check: Check, seed: int, run_dir: str, wall_clock: float) -> Outcome:
    """The outcome of a finished run from its episodes.csv and logs.csv."""
    episodes = read_episodes(run_dir)
    returns = [r for _, r in episodes]
    size = check.window
    if len(returns) < size:
        nan = float("nan")
        return Outcome(check, seed, None, None, nan, nan, wall_clock, len(returns))
    window, reached = 0.0, None
    best = -float("inf")
    for i, episode_return in enumerate(returns):
        window += episode_return - (returns[i - size] if i >= size else 0.0)
        if i < size - 1:
            continue
        best = max(best, window / size)
        if reached is None and window / size >= check.bar:
            reached = episodes[i][0]
    seconds = None
    if reached is not None:
        seconds = seconds_at_steps(run_dir, wall_clock).get(reached)
    last = sum(returns[-size:]) / size
    return Outcome(check, seed, reached, seconds, best, last, wall_clock, len(returns))


def run_check(
    check: Check, seed: int, savedir: str, timeout: float = 3600, flags: Sequence[str] = ()
) -> Outcome:
    """Run `check` with `seed` (and extra `flags`) to its total_steps; raises RuntimeError
    on a failed run."""
    xpid = f"{check.name}-seed{seed}"
    argv = [
        sys.executable,
        os.path.join(ROOT, check.script),
        "--algo",
        check.algo,
        "--env",
        check.env,
        "--policy",
        check.policy,
        "--total_steps",
        str(check.total_steps),
        "--seed",
        str(seed),
        "--num_threads",
        "1",
        "--log_interval",
        "30",
        "--savedir",
        savedir,
        "--xpid",
        xpid,
        *check.flags,
        *flags,
    ]
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall_clock = time.monotonic() - start
    if result.returncode != 0:
        raise RuntimeError(f"{xpid} failed ({result.returncode}): {result.stderr[-2000:]}")
    return summarize(check, seed, os.path.join(savedir, xpid), wall_clock)


def row(outcome: Outcome) -> str:
    check = outcome.check
    reached = "not reached"
    if outcome.reached_at is not None:
        reached = f"{outcome.reached_at:,} ({outcome.reached_seconds:.0f} s)"
    bar = f"{check.bar:g} in {check.total_steps:,}"
    if check.window != 100 or check.final:
        bar += f" ({'last' if check.final else 'best'} {check.window})"
    return (
        f"| {check.name} | {check.env} | {bar} |"
        f" {outcome.seed} | {reached} | {outcome.best:.4g} | {outcome.last:.4g} |"
        f" {outcome.wall_clock:,.0f} s | {'yes' if outcome.passed else 'NO'} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning_checks")
    parser.add_argument("--only", nargs="*", default=[], help="check names or algorithms")
    parser.add_argument("--seeds", nargs="*", type=int, default=[1])
    parser.add_argument("--savedir", default=None, help="default: a temporary directory")
    parser.add_argument("flags", nargs="*", help="extra flags for every run (after --)")
    args = parser.parse_args(argv)
    checks = [c for c in CHECKS if not args.only or c.name in args.only or c.algo in args.only]
    if not checks:
        parser.error(f"no check matches {args.only}; checks: {', '.join(c.name for c in CHECKS)}")
    savedir = args.savedir or tempfile.mkdtemp(prefix="beast-learning-")
    print(
        f"# learning checks, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()},"
        f" nproc {os.cpu_count()}, runs in {savedir}"
        + (f", extra flags: {' '.join(args.flags)}" if args.flags else ""),
        flush=True,
    )
    print(
        "| check | env | bar | seed | reached at step (wall-clock) | best mean | last mean |"
        " wall-clock | passed |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for check in checks:
        for seed in args.seeds:
            print(row(run_check(check, seed, savedir, flags=args.flags)), flush=True)


if __name__ == "__main__":
    main()
