"""beast, Stable-Baselines3 and SBX raced with rl-zoo3's settings, each timed from its launch.

    pip install -e ".[bench]"
    python -m benchmarks.races                      # the four races, seeds 1, 4 and 5
    python -m benchmarks.races --only dqn_cartpole,sac_pendulum --seeds 1
    python -m benchmarks.races --beast_flags "--compile on --updates_per_sample 4"
    python -m benchmarks.races --quick              # smoke test: every side, tiny budgets

The learner-bound races of BENCHMARKS.md's P6 (issue 24), each from the side-by-side
script that holds its settings and says where they come from:

- dqn_cartpole (benchmarks.sb3_dqn_side_by_side): DQN on CartPole-v1 over 100k env
  steps: rl-zoo3's settings on the peers (128 updates of 64 per 256 env steps),
  configs/dqn/classic.yaml on beast's (32 samples per env step: the same
  update-to-data ratio). Two figures: the wall-clock from launch to a mean of 200 over
  the last 100 training episodes, and env steps/s over the whole run (env steps /
  wall-clock from launch to exit: start-up, jit compilation and shutdown included).
- sac_pendulum (benchmarks.sb3_qpg_side_by_side): SAC on Pendulum-v1 to a mean of -200
  over the last 20 episodes within 20k steps (zoo: learning_rate 1e-3 over SB3's
  defaults; configs/sac/classic.yaml); every side stops when it gets there.
- ppo_cartpole (benchmarks.sb3_side_by_side): PPO on CartPole-v1 to a mean of 475 over
  the last 100 episodes within 100k steps (zoo: 8 envs, n_steps 32, 20 epochs, linear
  schedules; configs/ppo/classic.yaml).
- sac_halfcheetah (benchmarks.sb3_qpg_side_by_side): SAC on HalfCheetah-v5, env steps/s
  between env steps 2,000 and 5,000 at one update per env step, batch 256, 256-256
  networks, after 1,000 random steps. SB3 runs at 1 and at 2 torch threads: the issue
  compares beast with SB3 at its better setting.

Sides: beast (`monobeast.py` with the race's flags, then `--beast_flags`), SB3 at each
of `--sb3_threads` torch threads (default 1; 1 and 2 in sac_halfcheetah), and SBX
(`--sides` picks some). beast races twice per seed (`--beast_cache`): with a cold
compile cache (`BEAST_COMPILE_CACHE` an empty folder: its first run on a machine, its
update's package built during the race, its thread count measured) and with a warm one
(`--warm_cache`, by default the user's own, `beast.util.records.compile_cache_dir`,
filled first by one untimed run of the race's command: every later run of the same
settings, whatever the seed, loads the package at its first update).
One at a time, never two at once; from one seed to the next the order of the sides
rotates, so with as many seeds as sides each goes first once. Every side is a process
of its own, timed from its launch (benchmarks.peers says how, and how SBX's XLA uses
threads: JAX_PLATFORMS=cpu, XLA_FLAGS from `--xla_flags`).

Output: the machine and versions, then per race one row per run as it finishes (seed,
side, wall-clock to the threshold and the env step there, or "not reached", the best
mean of the race's window of episodes, env steps, the whole run's wall-clock, env
steps/s, threads); then per side the medians over seeds (a run that did not reach the
threshold counts as slower than any that did, so the median is "not reached" when most
did not); then, for each of the race's figures, beast / each peer as the ratio of the
medians and as the median of the per-seed ratios, beast / SB3 at its better thread
setting when SB3 ran at several, and beast / the faster peer (the one with the better
median). Time: below 1, beast is faster (P6 asks <= 0.5); steps/s: above 1, beast is
faster (P6 asks >= 2 x SB3 and ahead of SBX).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beast.util.records import compile_cache_dir
from benchmarks import sb3_dqn_side_by_side as dqn
from benchmarks import sb3_qpg_side_by_side as qpg
from benchmarks import sb3_side_by_side as ppo
from benchmarks.env_throughput import machine_description
from benchmarks.monobeast_sps import _CLEAN_ENVIRON
from benchmarks.peers import DISTRIBUTIONS, NAMES, run_peer

ROOT = Path(__file__).resolve().parents[1]
TIME, RATE = "time", "rate"  # a race's figures: wall-clock to the threshold, env steps/s
DEFAULT_SEEDS = (1, 4, 5)
CACHE_VARIABLE = "BEAST_COMPILE_CACHE"


@dataclass(frozen=True)
class Side:
    """One racer: beast, or a peer library with SB3's torch threads (0: torch's default)."""

    library: str  # "beast", "sb3" or "sbx"
    threads: int = 1
    cache: str = ""  # beast's compile cache: "cold" or "warm" ("": as it is)

    @property
    def label(self) -> str:
        if self.library == "beast":
            return f"beast ({self.cache} cache)" if self.cache else "beast"
        if self.library == "sbx":
            return NAMES["sbx"]
        count = "torch default" if self.threads == 0 else f"{self.threads} thr"
        return f"{NAMES['sb3']} ({count})"


@dataclass(frozen=True)
class Run:
    """One side's run in a race, in the units every race reports."""

    side: str  # Side.label
    seed: int
    seconds: float | None  # launch to the threshold; None: not reached (or no threshold)
    step: int | None  # env step at the threshold
    best: float  # best mean of the race's window of episodes; nan: too few episodes
    env_steps: int
    wall_clock: float  # seconds, launch to exit
    rate: float  # env steps/s: the race's measured stretch, else env_steps / wall_clock
    threads: str


@dataclass(frozen=True)
class Race:
    """A race's settings; `run` runs one side of it with one seed."""

    name: str
    algo: str
    env: str
    title: str  # the settings, for the race's heading
    figures: tuple[str, ...]
    threshold: float | None  # mean return to reach (TIME), None for a rate-only race
    window: int  # episodes in the mean
    budget: int  # env steps at most (a rate race: the last measured step)
    run: Callable[[Race, Side, int, Settings], Run]
    from_step: int = 0  # a rate race: the first measured step
    beast_flags: tuple[str, ...] = ()  # beast's flags over its config for this race
    sb3_threads: tuple[int, ...] = (1,)
    quick: dict[str, Any] = field(default_factory=dict)  # overrides under --quick


@dataclass(frozen=True)
class Settings:
    """What the command line adds to every race."""

    beast_flags: tuple[str, ...] = ()
    xla_flags: str = ""
    warm_cache: str = ""  # beast's warm compile cache ("": the user's own)


def _dqn_cartpole(race: Race, side: Side, seed: int, settings: Settings) -> Run:
    thresholds = [race.threshold]
    if side.library == "beast":
        run = dqn.beast_dqn(seed, race.budget, thresholds, list(settings.beast_flags))
    else:
        run = dqn.run_peer_dqn(
            side.library,
            settings.xla_flags,
            seed=seed,
            total_steps=race.budget,
            thresholds=thresholds,
            threads=side.threads,
        )
    seconds, step = run["reached"][str(race.threshold)]
    return Run(
        side.label,
        seed,
        seconds,
        step,
        run["best"],
        run["env_steps"],
        run["wall_clock"],
        run["sps"],
        run["threads"],
    )


def _sac_pendulum(race: Race, side: Side, seed: int, settings: Settings) -> Run:
    if side.library == "beast":
        flags = list(settings.beast_flags)
        run = qpg.beast_run(
            "sac", "Pendulum-v1", seed, race.budget, flags, race.threshold, (), race.window
        )
    else:
        run = run_peer(
            qpg.peer_run,
            side.library,
            settings.xla_flags,
            algo="sac",
            env_id="Pendulum-v1",
            seed=seed,
            total_steps=race.budget,
            kwargs=qpg.SB3_PENDULUM["sac"],
            threads=side.threads,
            target=race.threshold,
            marks=[],
            window=race.window,
        )
    seconds, step = run["reached"] or (None, None)
    rate = run["env_steps"] / run["wall_clock"]
    return Run(
        side.label,
        seed,
        seconds,
        step,
        run["best"],
        run["env_steps"],
        run["wall_clock"],
        rate,
        run["threads"],
    )


def _ppo_cartpole(race: Race, side: Side, seed: int, settings: Settings) -> Run:
    if side.library == "beast":
        flags = list(settings.beast_flags)
        run = ppo.beast_cartpole(seed, race.threshold, flags, race.budget)
    else:
        run = run_peer(
            ppo.peer_cartpole,
            side.library,
            settings.xla_flags,
            seed=seed,
            threshold=race.threshold,
            threads=side.threads,
            total_steps=race.budget,
        )
    rate = run["env_steps"] / run["wall_clock"]
    return Run(
        side.label,
        seed,
        run["seconds"],
        run["steps"],
        run["best"],
        run["env_steps"],
        run["wall_clock"],
        rate,
        run["threads"],
    )


def _sac_halfcheetah(race: Race, side: Side, seed: int, settings: Settings) -> Run:
    marks = [race.from_step, race.budget]
    if side.library == "beast":
        flags = [*race.beast_flags, *settings.beast_flags]
        # One step past the last mark: beast logs per update, the last row is at or after it.
        run = qpg.beast_run("sac", "HalfCheetah-v5", seed, race.budget + 1, flags, None, marks)
    else:
        run = run_peer(
            qpg.peer_run,
            side.library,
            settings.xla_flags,
            algo="sac",
            env_id="HalfCheetah-v5",
            seed=seed,
            total_steps=race.budget,
            kwargs=qpg.halfcheetah_peer_kwargs("sac"),
            threads=side.threads,
            target=None,
            marks=marks,
        )
    rate = qpg.marked_rate(run["marks"], race.from_step, race.budget)
    return Run(
        side.label,
        seed,
        None,
        None,
        math.nan,
        run["env_steps"],
        run["wall_clock"],
        rate,
        run["threads"],
    )


# Quick budgets: each side starts, learns a little and stops (a minute or two in all on
# 2 cores). Thresholds a short run can cross, so both outcomes' paths get exercised.
RACES = {
    race.name: race
    for race in (
        Race(
            "dqn_cartpole",
            "dqn",
            "CartPole-v1",
            "128 updates of 64 per 256 env steps",
            (TIME, RATE),
            threshold=200.0,
            window=100,
            budget=dqn.BUDGET,
            run=_dqn_cartpole,
            quick={"threshold": 50.0, "budget": 10_000},
        ),
        Race(
            "sac_pendulum",
            "sac",
            "Pendulum-v1",
            "rl-zoo3's learning_rate 1e-3 over SB3's defaults",
            (TIME,),
            threshold=qpg.TARGET,
            window=qpg.WINDOW,
            budget=qpg.PENDULUM_BUDGET["sac"],
            run=_sac_pendulum,
            quick={"threshold": -1500.0, "window": 5, "budget": 1_500},
        ),
        Race(
            "ppo_cartpole",
            "ppo",
            "CartPole-v1",
            "8 envs, n_steps 32, 20 epochs of batches of 256",
            (TIME,),
            threshold=475.0,
            window=100,
            budget=ppo.CARTPOLE_BUDGET,
            run=_ppo_cartpole,
            quick={"threshold": 30.0, "budget": 10_000},
        ),
        Race(
            "sac_halfcheetah",
            "sac",
            "HalfCheetah-v5",
            "1 update per env step, batch 256, 256-256 networks,"
            f" {qpg.LEARNING_STARTS:,} random steps first",
            (RATE,),
            threshold=None,
            window=0,
            budget=5_000,
            from_step=2_000,
            run=_sac_halfcheetah,
            beast_flags=tuple(qpg.halfcheetah_beast_flags("sac")),
            sb3_threads=(1, 2),
            quick={"from_step": 1_100, "budget": 1_250},
        ),
    )
}


def sides(
    race: Race,
    sb3_threads: Sequence[int] | None,
    libraries: Sequence[str] = ("beast", "sb3", "sbx"),
    caches: Sequence[str] = ("cold", "warm"),
) -> list[Side]:
    """beast with each compile cache (`caches`), SB3 at each thread count
    (`sb3_threads`, else the race's), then SBX: those of `libraries`."""
    counts = race.sb3_threads if sb3_threads is None else sb3_threads
    racers = [
        *(Side("beast", cache=cache) for cache in caches),
        *(Side("sb3", n) for n in counts),
        Side("sbx"),
    ]
    return [side for side in racers if side.library in libraries]


@contextlib.contextmanager
def beast_cache(side: Side, settings: Settings) -> Iterator[None]:
    """beast's runs inside the block see the side's compile cache (`Side.cache`): a new
    empty folder (cold; removed after), the warm one, or the environment's as it is."""
    if side.library != "beast" or not side.cache:
        yield
        return
    before = _CLEAN_ENVIRON.get(CACHE_VARIABLE)
    with contextlib.ExitStack() as stack:
        if side.cache == "cold":
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="beast-cold-"))
        else:
            folder = settings.warm_cache or compile_cache_dir()
        _CLEAN_ENVIRON[CACHE_VARIABLE] = folder
        try:
            yield
        finally:
            if before is None:
                _CLEAN_ENVIRON.pop(CACHE_VARIABLE, None)
            else:
                _CLEAN_ENVIRON[CACHE_VARIABLE] = before


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """`items` started at index `shift` (mod their count): the running order of a seed."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def median_seconds(values: Sequence[float | None]) -> float | None:
    """The median time to a threshold, a run that did not reach it (None) counting as
    slower than any that did; None if that median is one of them."""
    median = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(median) else median


def figure_value(run: Run, figure: str) -> float | None:
    return run.seconds if figure == TIME else run.rate


def side_median(runs: Sequence[Run], figure: str) -> float | None:
    """A side's median `figure` over its runs (TIME: median_seconds)."""
    values = [figure_value(run, figure) for run in runs]
    return median_seconds(values) if figure == TIME else statistics.median(values)


def faster(medians: dict[str, float | None], figure: str) -> str | None:
    """The label with the better median (TIME: the least; RATE: the most), None if no
    side has one (no peer reached the threshold)."""
    known = {label: value for label, value in medians.items() if value is not None}
    if not known:
        return None
    pick = min if figure == TIME else max
    return pick(known, key=known.__getitem__)


def paired_ratios(
    runs: Sequence[Run], peer: str, figure: str, ours_label: str = "beast"
) -> list[float]:
    """`ours_label` (a beast side) / `peer` per seed, over the seeds where both have the
    figure."""
    by_seed: dict[int, dict[str, Run]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, {})[run.side] = run
    ratios = []
    for pair in by_seed.values():
        if ours_label not in pair or peer not in pair:
            continue
        ours, theirs = figure_value(pair[ours_label], figure), figure_value(pair[peer], figure)
        if ours is not None and theirs:
            ratios.append(ours / theirs)
    return ratios


def _value(value: float | None, figure: str) -> str:
    if figure == TIME:
        return "not reached" if value is None else f"{value:.1f} s"
    return "-" if value is None or math.isnan(value) else f"{value:,.1f} steps/s"


def _mean(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def header(race: Race) -> str:
    timed = race.threshold is not None
    to = f"to {race.threshold:g} | at step | best m{race.window} | " if timed else ""
    columns = f"| seed | side | {to}env steps | wall-clock | steps/s | threads |"
    return f"{columns}\n|{'---|' * columns.count(' | ')}---|"


def row(race: Race, run: Run) -> str:
    timed = ""
    if race.threshold is not None:
        step = "-" if run.step is None else f"{run.step:,}"
        timed = f"{_value(run.seconds, TIME)} | {step} | {_mean(run.best)} | "
    return (
        f"| {run.seed} | {run.side} | {timed}{run.env_steps:,} | {run.wall_clock:.1f} s |"
        f" {run.rate:,.1f} | {run.threads} |"
    )


def summary(race: Race, labels: Sequence[str], runs: Sequence[Run]) -> list[str]:
    """The medians per side and beast's ratios to each peer, as printed lines."""
    seeds = len({run.seed for run in runs})
    lines = [f"medians over {seeds} seed(s):"]
    for label in labels:
        own = [run for run in runs if run.side == label]
        if not own:
            lines.append(f"- {label}: no run finished")
            continue
        parts = []
        if race.threshold is not None:
            reached = sum(run.seconds is not None for run in own)
            parts.append(
                f"to {race.threshold:g} {_value(side_median(own, TIME), TIME)}"
                f" (reached {reached}/{len(own)})"
            )
        parts.append(f"{_value(side_median(own, RATE), RATE)}")
        lines.append(f"- {label}: {', '.join(parts)}")
    for figure in race.figures:
        what = f"time to {race.threshold:g}" if figure == TIME else "steps/s"
        medians = {
            label: side_median([r for r in runs if r.side == label], figure)
            for label in labels
            if any(r.side == label for r in runs)
        }
        beasts = [label for label in medians if label.startswith("beast")]
        peers = {label: value for label, value in medians.items() if label not in beasts}
        # beast cold against warm: what a first run on a machine pays for its build.
        if len(beasts) == 2:
            lines.append(_ratio_line(what, beasts[0], beasts[1], medians, runs, figure))
        for label in beasts:
            ours = medians[label]
            for peer in peers:
                lines.append(_ratio_line(what, label, peer, medians, runs, figure))
            # With several SB3 sides (thread counts), SB3 at its better setting as well.
            sb3 = {p: v for p, v in peers.items() if p.startswith(f"{NAMES['sb3']} (")}
            groups = [("SB3 at its better thread setting", sb3)] if len(sb3) > 1 else []
            for name, group in [*groups, ("the faster peer", peers)] if peers else ():
                best = faster(group, figure)
                if best is None:
                    lines.append(f"{what}, {label} / {name}: n/a (no median)")
                    continue
                theirs = group[best]
                ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "n/a"
                lines.append(f"{what}, {label} / {name} ({best}): {ratio}")
    return lines


def _ratio_line(
    what: str,
    ours: str,
    theirs: str,
    medians: dict[str, float | None],
    runs: Sequence[Run],
    figure: str,
) -> str:
    """`ours` / `theirs` of the medians and per seed, as a printed line."""
    a, b = medians.get(ours), medians.get(theirs)
    of_medians = f"{a / b:.2f}" if a is not None and b else "n/a"
    ratios = paired_ratios(runs, theirs, figure, ours)
    per_seed = (
        f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
        if ratios
        else "n/a"
    )
    return f"{what}, {ours} / {theirs}: {of_medians} (medians); per seed: {per_seed}"


def run_race(race: Race, seeds: Sequence[int], racers: Sequence[Side], settings: Settings) -> None:
    """Every side with every seed, the order rotating from seed to seed; prints as it goes.
    A side that fails is reported in its row and left out of the medians."""
    detail = f"{race.algo.upper()} {race.env}, {race.title}"
    if race.threshold is not None:
        detail += f"; to a mean of {race.threshold:g} over the last {race.window} episodes"
    if RATE in race.figures and race.threshold is None:
        detail += f"; steps/s between env steps {race.from_step:,} and {race.budget:,}"
    else:
        detail += f"; within {race.budget:,} env steps"
    print(f"\n## {race.name}: {detail}\n\n{header(race)}", flush=True)
    runs = []
    warm = [side for side in racers if side.library == "beast" and side.cache == "warm"]
    if warm and seeds:
        # One untimed run fills the warm cache: its package, its thread count.
        with beast_cache(warm[0], settings):
            try:
                race.run(race, warm[0], seeds[0], settings)
                print(f"(the warm cache filled by an untimed run, seed {seeds[0]})", flush=True)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"(the warm-up run failed: {str(error).strip()[-300:]})", flush=True)
    for i, seed in enumerate(seeds):
        for side in rotated(racers, i):
            try:
                with beast_cache(side, settings):
                    runs.append(race.run(race, side, seed, settings))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                lines = str(error).strip().splitlines()
                print(f"| {seed} | {side.label} | failed: {lines[-1] if lines else error} |")
                continue
            print(row(race, runs[-1]), flush=True)
    print("\n" + "\n".join(summary(race, [side.label for side in racers], runs)), flush=True)


def beast_flags_error(race: Race, flags: Sequence[str]) -> str | None:
    """Why monobeast.py refuses `flags` on `race`'s command line (its one line), or None:
    checked with --print_config (about 2 s) before any race runs, not an hour into one."""
    argv = [sys.executable, str(ROOT / "monobeast.py"), "--algo", race.algo, "--env", race.env]
    argv += [*race.beast_flags, *flags, "--print_config"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"monobeast.py exited with {result.returncode}"


def versions() -> str:
    """The peers' and the shared libraries' versions (from their metadata: jax is never
    imported here) and beast's commit."""
    names = [DISTRIBUTIONS["sb3"], DISTRIBUTIONS["sbx"], "jax", "jaxlib", "flax", "torch"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return f"{', '.join(found)}; beast {commit or '?'}"


def _ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of non-negative integers ("1,4,5")."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1,4,5") from None
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r} has a negative number")
    return values


def _race_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in RACES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown race(s) {', '.join(unknown) or repr(text)}; races: {', '.join(RACES)}"
        )
    return names


def _libraries(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in ("beast", "sb3", "sbx")]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown side(s) {unknown or text!r}: beast, sb3, sbx")
    return names


def _caches(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names or any(name not in ("cold", "warm") for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: cold, warm or cold,warm")
    return names


def split_flags(text: str) -> tuple[str, ...]:
    """Run flags given as one string ("--compile on --updates_per_sample 4"), split as a
    shell would; argparse's error (one line, exit code 2) where they cannot be."""
    try:
        return tuple(shlex.split(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"cannot split {text!r}: {error}") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.races", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--only",
        type=_race_names,
        default=tuple(RACES),
        help=f"comma-separated races (all: {','.join(RACES)})",
    )
    parser.add_argument(
        "--seeds",
        type=_ints,
        default=None,
        help="comma-separated seeds (1,4,5; --quick: 1)",
    )
    parser.add_argument(
        "--sb3_threads",
        type=_ints,
        default=None,
        help="SB3's torch threads, one SB3 side per count (default: 1, and 1,2 for"
        " sac_halfcheetah; 0: torch's default, the CPU count)",
    )
    parser.add_argument(
        "--beast_flags",
        type=split_flags,
        default=(),
        help="extra monobeast.py flags for beast's side, one string: --beast_flags \"--compile"
        ' on --updates_per_sample 4" (a single flag: --beast_flags=--no-dueling)',
    )
    parser.add_argument(
        "--xla_flags",
        default="",
        help="XLA_FLAGS for SBX's process, e.g. --xla_flags=--xla_cpu_multi_thread_eigen=false"
        " (default: XLA's own)",
    )
    parser.add_argument(
        "--sides",
        type=_libraries,
        default=("beast", "sb3", "sbx"),
        help="comma-separated libraries that race (default: beast,sb3,sbx)",
    )
    parser.add_argument(
        "--beast_cache",
        type=_caches,
        default=("cold", "warm"),
        help="beast's compile caches, one beast side each: cold (an empty folder per run)"
        " and warm (filled by an untimed run first); default: cold,warm",
    )
    parser.add_argument(
        "--warm_cache",
        default="",
        help="the warm compile cache's folder (default: the user's, ~/.cache/beast/inductor"
        " or $BEAST_COMPILE_CACHE)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: one seed, tiny budgets, low thresholds"
    )
    args = parser.parse_args(argv)
    if args.seeds is None:
        args.seeds = (1,) if args.quick else DEFAULT_SEEDS
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    races = [RACES[name] for name in args.only]
    if args.quick:
        races = [replace(race, **race.quick) for race in races]
    for race in races if args.beast_flags else ():
        error = beast_flags_error(race, args.beast_flags)
        if error is not None:
            print(
                f"python -m benchmarks.races: --beast_flags in {race.name}: {error}",
                file=sys.stderr,
            )
            raise SystemExit(2)
    settings = Settings(args.beast_flags, args.xla_flags, args.warm_cache)
    print(machine_description(), flush=True)
    print(versions(), flush=True)
    print(
        f"races {', '.join(args.only)}; seeds {', '.join(map(str, args.seeds))}"
        f"{' (quick: smoke-test budgets)' if args.quick else ''}; beast flags:"
        f" {shlex.join(args.beast_flags) or '(the configs)'}; SBX: JAX_PLATFORMS=cpu,"
        f" XLA_FLAGS={args.xla_flags or '(unset)'}; beast's compile cache:"
        f" {', '.join(args.beast_cache)} (warm: {args.warm_cache or compile_cache_dir()})",
        flush=True,
    )
    for race in races:
        racers = sides(race, args.sb3_threads, args.sides, args.beast_cache)
        run_race(race, args.seeds, racers, settings)


if __name__ == "__main__":
    main()
