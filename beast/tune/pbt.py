"""Population-based training (Jaderberg et al. 2017, "Population Based Training of Neural
Networks", arXiv:1711.09846): truncation selection, explore by perturbation.

    pbt:
      population: 4            # members, each a run in SAVEDIR/NAME/memberI
      interval: 50000          # agent steps per round
      fraction: 0.25           # each round the bottom fraction copies the top fraction
                               #   (0: no copies, the same population without PBT)
      perturb: [0.8, 1.2]      # an explored value is multiplied by one of these
      seed: 0                  # the draws, the copies' sources and the perturbations
      params:                  # the flags PBT explores: starting draws, random's syntax,
        learning_rate: {log_uniform: [0.0003, 0.003]}   # and the bounds of exploration
      members:                 # optional: the first members' own values (and seed)
        - {learning_rate: 0.05}

Each member is a monobeast run; member i's seed is --seed + i unless it sets one. The
population trains in rounds: each member trains to the next multiple of `interval`
(--stop_step: it stops there with a checkpoint, while its schedules still count to
total_steps; the last round ends at total_steps) and is scored by the mean return of its
training episodes of the round (the last 100). Then each member in the bottom
`fraction` (at least one, with fraction > 0) copies the checkpoint of a member drawn
from the top `fraction` (model, optimizer state, normalisation statistics and step
count; not the replay, which starts empty), takes that member's values of `params` and
perturbs each: numbers by a factor drawn from `perturb`, clamped to the draw's bounds; a
`choice` is drawn again. The next round resumes every run from its checkpoint with its
flags, so a new value acts on the learner at once. Every member trains total_steps
agent steps, copied steps included, as each run of the population without PBT does.

Only flags that a resumed run applies to the learner it restores may be explored
(`EXPLORABLE`); the others are refused in one line. Rounds run `max_parallel` members
at a time on this machine, or as Ray tasks on a cluster (`--ray_address`; the run
directories must be on a file system every node sees: a local cluster's are).

SAVEDIR/NAME/pbt.json holds the population after each round (a restarted sweep goes on
from the last round it finished; a member stopped inside a round resumes from its
checkpoint); SAVEDIR/NAME/lineage.csv holds every member's score, copies and values
round by round, and the results table shows each member's copies.
"""

from __future__ import annotations

import csv
import json
import math
import os
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from beast.config import Config
from beast.outputs.checkpoint import has_checkpoint, load_latest_checkpoint, save_checkpoint
from beast.run.parsing import config_from_flags
from beast.tune.runs import drive, read_rows, wait_for_threads
from beast.tune.sweep_runs import (
    Run,
    RunResult,
    SweepError,
    SweepSpec,
    check_distribution,
    check_section_keys,
    draw_value,
    format_value,
    is_finished,
    keep_sweep_file,
    metrics,
    report,
)

__all__ = [
    "EXPLORABLE",
    "Member",
    "PBTSpec",
    "Segment",
    "exploit_and_explore",
    "explore",
    "initial_members",
    "parse_pbt",
    "run_pbt",
    "run_segment",
]

# Flags a resumed run applies to the learner it restores, so that PBT may change them
# between rounds: the loss's weights and targets are built from the flags at start-up, and
# the optimizer's settings are the flags', not the checkpoint's
# (beast.run.resume.with_current_hyperparameters). Flags that shape the model, the
# optimizer's state, the buffers or the actors are left out.
EXPLORABLE = (
    "learning_rate",
    "epsilon",
    "grad_norm_clipping",
    "discounting",
    "entropy_cost",
    "baseline_cost",
    "clip_range",
    "gae_lambda",
)
# Episodes a member's score averages over, as the console's mean return.
_SCORE_WINDOW = 100
STATE_FILE = "pbt.json"
LINEAGE_FILE = "lineage.csv"


@dataclass(frozen=True)
class PBTSpec:
    """A parsed `pbt:` section."""

    population: int
    interval: int
    params: dict[str, dict[str, list[Any]]]
    fraction: float = 0.25
    perturb: tuple[float, ...] = (0.8, 1.2)
    seed: int = 0
    members: tuple[dict[str, Any], ...] = ()


@dataclass
class Member:
    """One run of the population and its values of the explored flags now."""

    name: str
    params: dict[str, Any]
    seed: int
    copies: list[str] = field(default_factory=list)  # "rR<-memberJ", oldest first


@dataclass(frozen=True)
class Segment:
    """A member's round: its exit code, score (nan without an episode) and step reached."""

    returncode: int
    score: float
    step: int


def parse_pbt(
    section: dict[str, Any], source: str, algo: str | None, flags: dict[str, Any]
) -> PBTSpec:
    """Check a `pbt:` section; SweepError naming the file and key."""
    known = {"population", "interval", "fraction", "perturb", "seed", "params", "members"}
    check_section_keys(section, known, source)
    for key in ("population", "interval"):
        value = section.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SweepError(f"{source}: {key} must be a positive integer, got {value!r}")
    population = section["population"]
    fraction = section.get("fraction", 0.25)
    if not isinstance(fraction, int | float) or not 0 <= fraction <= 0.5:
        raise SweepError(f"{source}: fraction must be in [0, 0.5], got {fraction!r}")
    perturb = section.get("perturb", [0.8, 1.2])
    if (
        not isinstance(perturb, list)
        or not perturb
        or not all(isinstance(f, int | float) and f > 0 for f in perturb)
    ):
        raise SweepError(f"{source}: perturb must be a list of positive factors, got {perturb!r}")
    seed = section.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SweepError(f"{source}: seed must be an integer, got {seed!r}")
    params: dict[str, dict[str, list[Any]]] = {}
    for key, dist in (section.get("params") or {}).items():
        if key not in EXPLORABLE:
            raise SweepError(
                f"{source}: '{key}' cannot change in a running learner, so PBT cannot explore"
                f" it; it explores {', '.join(EXPLORABLE)} (set fixed flags under 'flags')"
            )
        params[key] = check_distribution(key, dist, source, algo)
    if not params:
        raise SweepError(f"{source}: params is empty (the flags to explore, as random's)")
    overlap = set(params) & set(flags)
    if overlap:
        raise SweepError(f"{source}: '{sorted(overlap)[0]}' is set in more than one section")
    members = section.get("members") or []
    if not isinstance(members, list) or len(members) > population:
        raise SweepError(f"{source}: members must be a list of at most {population} mappings")
    for i, member in enumerate(members):
        if not isinstance(member, dict):
            raise SweepError(f"{source}: members[{i}] must be a mapping, got {member!r}")
        for key, value in member.items():
            if key not in params and key != "seed":
                raise SweepError(
                    f"{source}: members[{i}]: '{key}' is not explored; a member sets the"
                    f" explored flags ({', '.join(params)}) or its seed"
                )
            check_distribution(key, {"choice": [value]}, f"{source}: members[{i}]", algo)
    return PBTSpec(
        population=population,
        interval=section["interval"],
        params=params,
        fraction=float(fraction),
        perturb=tuple(float(f) for f in perturb),
        seed=seed,
        members=tuple(dict(member) for member in members),
    )


def initial_members(spec: SweepSpec) -> list[Member]:
    pbt: PBTSpec = spec.pbt
    rng = random.Random(pbt.seed)
    base_seed = spec.flags.get("seed", Config.seed)
    members = []
    for i in range(pbt.population):
        own = pbt.members[i] if i < len(pbt.members) else {}
        params = {key: draw_value(dist, rng) for key, dist in pbt.params.items()}
        params.update({key: value for key, value in own.items() if key != "seed"})
        members.append(Member(f"member{i}", params, own.get("seed", base_seed + i)))
    return members


def explore(params: dict[str, Any], spec: PBTSpec, rng: random.Random) -> dict[str, Any]:
    """`params` perturbed: numbers by a factor from `spec.perturb`, clamped to their draw's
    bounds (integers rounded); a choice drawn again."""
    explored = {}
    for key, value in params.items():
        kind, args = next(iter(spec.params[key].items()))
        if kind == "choice":
            explored[key] = rng.choice(args)
            continue
        low, high = args
        moved = min(max(value * rng.choice(spec.perturb), low), high)
        explored[key] = int(round(moved)) if kind == "int_uniform" else moved
    return explored


def member_run(spec: SweepSpec, member: Member) -> Run:
    return Run(
        name=member.name,
        flags={**spec.flags, **member.params, "seed": member.seed},
        varying=dict(member.params),
    )


def checkpoint_step(run_dir: str) -> int:
    """The step of the run's checkpoint (0 without one)."""
    if not has_checkpoint(run_dir):
        return 0
    return int(load_latest_checkpoint(run_dir)[0]["step"])


def round_score(run_dir: str, round_start: int) -> float:
    """Mean return of the run's training episodes consumed after `round_start` (the last
    _SCORE_WINDOW of them); nan without one."""
    returns = [
        float(row["return"])
        for row in read_rows(os.path.join(run_dir, "episodes.csv"))
        if row.get("return") and row.get("step") and int(float(row["step"])) > round_start
    ][-_SCORE_WINDOW:]
    return sum(returns) / len(returns) if returns else math.nan


def run_segment(
    run: Run,
    sweep_dir: str,
    round_start: int,
    boundary: int,
    slot: tuple[list[int] | None, str | None] = (None, None),
    cpus_per_run: int = 1,
    should_stop: Callable[[], bool] | None = None,
    poll_seconds: float = 0.5,
) -> Segment:
    """Train `run` from its checkpoint to `boundary` agent steps (--stop_step), unless it
    is there already; its round's Segment. A plain function of files, so that it runs as
    a Ray task too (should_stop: Ctrl-C, locally)."""
    run_dir = os.path.join(sweep_dir, run.name)
    returncode = 0
    if checkpoint_step(run_dir) < boundary and not is_finished(run_dir):
        segment = Run(run.name, {**run.flags, "stop_step": boundary}, run.varying)
        returncode = drive(
            segment,
            sweep_dir,
            slot=slot,
            cpus_per_run=cpus_per_run,
            should_stop=should_stop or (lambda: False),
            poll_seconds=poll_seconds,
        )
    return Segment(returncode, round_score(run_dir, round_start), checkpoint_step(run_dir))


class _LocalPool:
    """Segments on this machine: a thread per member, each waiting for a free slot."""

    def __init__(self, slots: list, cpus_per_run: int, poll_seconds: float) -> None:
        self.free: queue.Queue = queue.Queue()
        for slot in slots:
            self.free.put(slot)
        self.cpus_per_run, self.poll_seconds = cpus_per_run, poll_seconds
        self.stop = threading.Event()  # set on Ctrl-C / SIGTERM: stop every member now

    def run_round(
        self, runs: list[Run], sweep_dir: str, round_start: int, boundary: int
    ) -> list[Segment]:
        segments: list[Segment | None] = [None] * len(runs)

        def member(i: int) -> None:
            slot = self.free.get()
            try:
                if not self.stop.is_set():
                    segments[i] = run_segment(
                        runs[i],
                        sweep_dir,
                        round_start,
                        boundary,
                        slot,
                        self.cpus_per_run,
                        self.stop.is_set,
                        self.poll_seconds,
                    )
            finally:
                self.free.put(slot)

        threads = [
            threading.Thread(target=member, args=(i,), name=f"pbt-{run.name}")
            for i, run in enumerate(runs)
        ]
        for thread in threads:
            thread.start()
        wait_for_threads(threads, self.stop)
        # A member whose thread failed (its traceback is printed) counts as a failed run.
        return [segment or Segment(1, math.nan, 0) for segment in segments]

    def close(self) -> None:
        pass


class _RayPool:
    """Segments as Ray tasks of `cpus_per_run` CPUs each, wherever the cluster puts them."""

    def __init__(self, address: str, cpus_per_run: int, poll_seconds: float) -> None:
        try:
            import ray
        except ImportError:
            raise SweepError("--ray_address needs Ray: pip install -e '.[ray]'") from None
        self.ray = ray
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # Workers import beast from this checkout, whatever their working directory.
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address=address,
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            log_to_driver=False,
        )
        self.task = ray.remote(num_cpus=cpus_per_run, max_retries=0)(run_segment)
        self.cpus_per_run, self.poll_seconds = cpus_per_run, poll_seconds

    def run_round(
        self, runs: list[Run], sweep_dir: str, round_start: int, boundary: int
    ) -> list[Segment]:
        refs = [
            self.task.remote(
                run,
                sweep_dir,
                round_start,
                boundary,
                (None, None),
                self.cpus_per_run,
                None,
                self.poll_seconds,
            )
            for run in runs
        ]
        try:
            return self.ray.get(refs)
        except KeyboardInterrupt:
            # Cancelling raises KeyboardInterrupt in each task: `drive` stops its run cleanly.
            for ref in refs:
                self.ray.cancel(ref)
            self.ray.wait(refs, num_returns=len(refs), timeout=90)
            raise

    def close(self) -> None:
        self.ray.shutdown()


def _load_state(spec: SweepSpec, sweep_dir: str) -> tuple[int, list[Member]]:
    """(rounds finished, members) from pbt.json, or a new population."""
    path = os.path.join(sweep_dir, STATE_FILE)
    if not os.path.exists(path):
        return 0, initial_members(spec)
    with open(path) as f:
        state = json.load(f)
    members = [Member(**member) for member in state["members"]]
    if len(members) != spec.pbt.population:
        raise SweepError(
            f"{path} holds a population of {len(members)}, the sweep file {spec.pbt.population};"
            " use a new sweep name to start over"
        )
    return int(state["rounds"]), members


def _save_state(sweep_dir: str, rounds: int, members: list[Member]) -> None:
    path = os.path.join(sweep_dir, STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump({"rounds": rounds, "members": [vars(m) for m in members]}, f, indent=1)
    os.replace(path + ".tmp", path)


def _lineage(sweep_dir: str, rows: list[dict[str, Any]]) -> None:
    path = os.path.join(sweep_dir, LINEAGE_FILE)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["round", "step", "member", "score", "event", "source", "params"]
        )
        if new:
            writer.writeheader()
        writer.writerows(rows)


def _describe(params: dict[str, Any]) -> str:
    return ",".join(f"{key}={format_value(value)}" for key, value in params.items())


def exploit_and_explore(
    members: list[Member],
    scores: list[float],
    spec: PBTSpec,
    rng: random.Random,
    round_index: int,
    sweep_dir: str,
) -> list[dict[str, Any]]:
    """Each member of the bottom fraction copies a top member's checkpoint and explores
    its values (module docstring); the lineage rows of the copies."""
    if spec.fraction <= 0 or len(members) < 2:
        return []
    count = max(1, int(len(members) * spec.fraction))
    order = sorted(
        range(len(members)),
        key=lambda i: scores[i] if math.isfinite(scores[i]) else -math.inf,
        reverse=True,
    )
    top, bottom = order[:count], order[-count:]
    rows = []
    for i in bottom:
        source = members[rng.choice(top)]
        member = members[i]
        payload, _, _ = load_latest_checkpoint(os.path.join(sweep_dir, source.name))
        save_checkpoint(os.path.join(sweep_dir, member.name), payload)
        member.params = explore(source.params, spec, rng)
        member.copies.append(f"r{round_index}<-{source.name}")
        rows.append(
            {
                "round": round_index,
                "step": int(payload["step"]),
                "member": member.name,
                "score": scores[i],
                "event": "copied",
                "source": source.name,
                "params": _describe(member.params),
            }
        )
    return rows


def run_pbt(
    spec: SweepSpec,
    sweep_dir: str,
    *,
    slots: list[tuple[list[int] | None, str | None]],
    cpus_per_run: int,
    poll_seconds: float = 0.5,
    ray_address: str | None = None,
) -> list[RunResult]:
    """Train the population to total_steps in rounds (module docstring); the sweep's table,
    results.csv and returns.png, with each member's copies."""
    pbt: PBTSpec = spec.pbt
    keep_sweep_file(spec, sweep_dir)
    total_steps = config_from_flags(spec.flags, source=f"{spec.path}: flags").total_steps
    rounds = math.ceil(total_steps / pbt.interval)
    done, members = _load_state(spec, sweep_dir)
    # The draws of a round depend on the seed and the round alone, so a restart repeats them.
    pool: Any = (
        _RayPool(ray_address, cpus_per_run, poll_seconds)
        if ray_address is not None
        else _LocalPool(slots, cpus_per_run, poll_seconds)
    )
    where = f"Ray at {ray_address}" if ray_address else f"{len(slots)} at a time"
    print(
        f"[pbt] {spec.name}: {pbt.population} members, {rounds} rounds of {pbt.interval:,}"
        f" steps to {total_steps:,}, exploring {', '.join(pbt.params)}, {where}"
        + (f"; resuming after round {done}" if done else ""),
        flush=True,
    )
    try:
        for round_index in range(done, rounds):
            round_start = round_index * pbt.interval
            boundary = min(round_start + pbt.interval, total_steps)
            runs = [member_run(spec, member) for member in members]
            segments = pool.run_round(runs, sweep_dir, round_start, boundary)
            # A member whose run crashed gets one more try: it resumes from its checkpoint.
            again = [i for i, segment in enumerate(segments) if segment.returncode]
            if again:
                print(f"[pbt] {', '.join(runs[i].name for i in again)} failed: once more")
                retried = pool.run_round([runs[i] for i in again], sweep_dir, round_start, boundary)
                for i, segment in zip(again, retried, strict=True):
                    segments[i] = segment
            failed = [(m.name, s) for m, s in zip(members, segments, strict=True) if s.returncode]
            if failed:
                name, segment = failed[0]
                raise SweepError(
                    f"{name} failed in round {round_index} (exit {segment.returncode}); see"
                    f" {os.path.join(sweep_dir, name, 'sweep.log')}"
                )
            scores = [segment.score for segment in segments]
            rows = [
                {
                    "round": round_index,
                    "step": segment.step,
                    "member": member.name,
                    "score": segment.score,
                    "event": "trained",
                    "source": "",
                    "params": _describe(member.params),
                }
                for member, segment in zip(members, segments, strict=True)
            ]
            if round_index + 1 < rounds:
                rng = random.Random(f"{pbt.seed}:{round_index}")
                rows += exploit_and_explore(members, scores, pbt, rng, round_index, sweep_dir)
            _lineage(sweep_dir, rows)
            _save_state(sweep_dir, round_index + 1, members)
            print(
                f"[pbt] round {round_index} to step {boundary:,}: "
                + "; ".join(f"{m.name} {s:.1f}" for m, s in zip(members, scores, strict=True))
                + "".join(f"; {r['member']} <- {r['source']}" for r in rows if r["source"]),
                flush=True,
            )
    finally:
        pool.close()
    results = []
    for member in members:
        run_dir = os.path.join(sweep_dir, member.name)
        results.append(
            RunResult(
                member_run(spec, member),
                "done" if is_finished(run_dir) else "unfinished",
                *metrics(run_dir),
                extra={"seed": member.seed, "copies": " ".join(member.copies) or "-"},
            )
        )
    report(spec, sweep_dir, results)
    return results
