"""Learner update time alone and with the actors running beside it, per variant and thread count.

    python -m benchmarks.learner_contention --env PongNoFrameskip-v4 --variants fp32,bf16

`benchmarks.bench throughput` times the learner on an idle machine. In a run the actors
share the cores with it, and some kernels suffer far more than others from a core
taken away mid-operation (a parallel region waits for its slowest thread). This
measures, in one sitting: each variant's update alone, then with `--num_actors`
acting-only actors stepping real envs (`benchmarks.bench.measure_acting` in a thread),
then alone again. Prints every update's milliseconds and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beast import envs
from beast.run.measure import synthetic_batch, torch_threads
from benchmarks import bench


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--num_actors", type=int, default=2)
    parser.add_argument("--num_envs_per_actor", type=int, default=8)
    parser.add_argument("--unroll_length", type=int, default=80)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--variants", default="fp32,bf16", help="benchmarks.bench learner variants")
    parser.add_argument("--threads", default="1,2", help="torch thread counts")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per block")
    parser.add_argument("--repeats", type=int, default=2, help="blocks with the actors running")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    threads = [int(t) for t in args.threads.split(",")]

    print(f"machine: {bench.machine_summary()}", flush=True)
    probe = envs.make(args.env)
    spec = envs.env_spec(probe)
    probe.close()
    steps = {
        name: bench.LearnerStep(
            obs_shape=spec.obs_shape, num_actions=spec.num_actions, variant=name
        )
        for name in variants
    }
    rollout = bench.learner_rollout_spec(
        next(iter(steps.values())), args.unroll_length, spec.obs_dtype
    )
    batch = synthetic_batch(rollout, args.batch_size, spec.num_actions)
    for step in steps.values():
        step(batch)  # warm-up (and compilation)

    def block(times: dict[tuple[str, int], list[float]]) -> None:
        for num_threads in threads:
            with torch_threads(num_threads):
                for name, step in steps.items():
                    times.setdefault((name, num_threads), []).extend(step.timed(batch, args.steps))

    alone: dict[tuple[str, int], list[float]] = {}
    busy: dict[tuple[str, int], list[float]] = {}
    block(alone)
    acting: list[bench.ActingResult] = []
    # Long enough to cover the busy blocks; measured from the first rollout on.
    seconds_needed = (
        3.0 * args.repeats * sum(statistics.median(v) * args.steps for v in alone.values())
    )
    actors = threading.Thread(
        target=lambda: acting.append(
            bench.measure_acting(
                env=args.env,
                num_actors=args.num_actors,
                num_envs_per_actor=args.num_envs_per_actor,
                unroll_length=args.unroll_length,
                seconds=max(10.0, seconds_needed),
                warmup_seconds=0.0,
            )
        ),
        name="actors",
    )
    actors.start()
    time.sleep(5.0)  # process start and env creation
    for _ in range(args.repeats):
        block(busy)
    actors.join()
    block(alone)
    for key in alone:
        name, num_threads = key
        print(
            f"{name:>18} @ {num_threads} threads: alone median "
            f"{1000 * statistics.median(alone[key]):,.0f} ms "
            f"({', '.join(f'{1000 * s:.0f}' for s in alone[key])}); with {args.num_actors} "
            f"actors median {1000 * statistics.median(busy[key]):,.0f} ms "
            f"({', '.join(f'{1000 * s:.0f}' for s in busy[key])})",
            flush=True,
        )
    if acting:
        print(f"acting steps/s while the learner ran: {acting[0].steps_per_second:,.0f}")


if __name__ == "__main__":
    main()
