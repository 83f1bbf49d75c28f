"""Round trip of the native Batcher between two processes: post -> collect -> answer -> wake.

    python -m benchmarks.batcher_latency --round_trips 20000 --group_size 1

An actor process posts K requests and sleeps in `wait_answered`; the server (this
process's main thread, as an inference thread of the learner would be) sleeps in
`collect` and answers. The actor times post..wake with `perf_counter_ns`, so a round
trip includes both futex wakes, both scans and the Python calls on each side, but no
model. Two variants: "bare" (nothing else) and "tensors" (the actor writes its inputs
and checks its outputs; the server gathers with `index_select` and scatters, as an
inference thread does). Reported: median and 99th percentile after a warm-up, and, as
a yardstick, a `multiprocessing.Pipe` ping-pong of one small message between the same
two processes.

On a machine with fewer free cores than the two processes, a round trip also includes
the scheduler switching between them; the figure is then a context-switch cost more
than a batcher cost. The script runs torch with one intra-op thread on both sides: on a
small machine, OpenMP workers spinning after each tiny op take the core the other
process needs (on 2 cores that alone doubled the "tensors" round trip).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `beast` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

__all__ = ["measure_round_trip"]

# Unmeasured round trips first: page faults, CPU frequency ramp, branch predictors.
_WARMUP = 500


def _batcher_actor(batcher, inputs, outputs, latencies_ns, total: int, tensors: bool) -> None:
    torch.set_num_threads(1)  # as beast.acting.actor does
    for i in range(total):
        start = time.perf_counter_ns()
        if tensors:
            inputs.fill_(i)
        batcher.post(0)
        if not batcher.wait_answered(0, timeout=10.0):
            raise SystemExit("server did not answer within 10 s")
        if tensors and not bool((outputs == i).all()):
            raise SystemExit(f"round trip {i}: read a stale answer")
        latencies_ns[i] = time.perf_counter_ns() - start
    batcher.close()  # tells the server to stop


def _pipe_actor(conn, latencies_ns, total: int) -> None:
    for i in range(total):
        start = time.perf_counter_ns()
        conn.send_bytes(b"x")
        conn.recv_bytes()
        latencies_ns[i] = time.perf_counter_ns() - start
    conn.send_bytes(b"")


def _summary(latencies_ns: torch.Tensor) -> tuple[float, float]:
    """(median, p99) in microseconds of the measured (post-warm-up) round trips."""
    measured = sorted(latencies_ns[_WARMUP:].tolist())
    p99 = measured[min(len(measured) - 1, int(0.99 * len(measured)))]
    return statistics.median(measured) / 1e3, p99 / 1e3


def _batcher_round_trips(
    ctx: mp.context.BaseContext, total: int, group_size: int, tensors: bool
) -> torch.Tensor:
    from beast.native import Batcher, QueueClosed

    batcher = Batcher(num_groups=1, group_size=group_size)
    inputs = torch.zeros(group_size, dtype=torch.int64).share_memory_()
    outputs = torch.zeros(group_size, dtype=torch.int64).share_memory_()
    latencies = torch.zeros(total, dtype=torch.int64).share_memory_()
    actor = ctx.Process(
        target=_batcher_actor,
        args=(batcher, inputs, outputs, latencies, total, tensors),
        name="batcher-latency-actor",
        daemon=True,
    )
    actor.start()
    try:
        while True:
            try:
                indices = batcher.collect(0, group_size, timeout=1.0)
            except QueueClosed:
                break
            if len(indices) == 0:
                if not actor.is_alive():
                    break
                continue
            if tensors:  # what an inference thread does, minus the model
                outputs[indices] = inputs.index_select(0, indices)
            batcher.answer(indices)
    finally:
        actor.join(10.0)
        if actor.is_alive():
            actor.kill()
    if actor.exitcode != 0:
        raise RuntimeError(f"batcher latency actor exited with {actor.exitcode}")
    return latencies


def _pipe_round_trips(ctx: mp.context.BaseContext, total: int) -> torch.Tensor:
    latencies = torch.zeros(total, dtype=torch.int64).share_memory_()
    ours, theirs = ctx.Pipe()
    actor = ctx.Process(
        target=_pipe_actor, args=(theirs, latencies, total), name="pipe-latency-actor", daemon=True
    )
    actor.start()
    try:
        while ours.poll(10.0) and (message := ours.recv_bytes()):
            ours.send_bytes(message)
    finally:
        actor.join(10.0)
        if actor.is_alive():
            actor.kill()
    if actor.exitcode != 0:
        raise RuntimeError(f"pipe latency actor exited with {actor.exitcode}")
    return latencies


def measure_round_trip(
    round_trips: int = 20_000, group_size: int = 1, ctx: mp.context.BaseContext | None = None
) -> dict[str, float]:
    """Median and p99 round trip (microseconds) of the Batcher and of a Pipe.

    Args:
        round_trips: measured round trips, after `_WARMUP` unmeasured ones.
        group_size: requests per post (K envs of one actor); all are answered at once.
        ctx: multiprocessing context for the actor process (default: spawn).

    Returns:
        {"bare_median_us", "bare_p99_us", "tensors_median_us", "tensors_p99_us",
        "pipe_median_us", "pipe_p99_us"}.
    """
    ctx = ctx or mp.get_context("spawn")
    total = _WARMUP + round_trips
    runs = {
        "bare": _batcher_round_trips(ctx, total, group_size, tensors=False),
        "tensors": _batcher_round_trips(ctx, total, group_size, tensors=True),
        "pipe": _pipe_round_trips(ctx, total),
    }
    results: dict[str, float] = {}
    for name, latencies in runs.items():
        results[f"{name}_median_us"], results[f"{name}_p99_us"] = _summary(latencies)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round_trips", type=int, default=20_000, help="Measured round trips.")
    parser.add_argument("--group_size", type=int, default=1, help="Requests per post (K).")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # see the module docstring
    results = measure_round_trip(args.round_trips, args.group_size)
    print(f"round trips between two processes, {args.round_trips} after {_WARMUP} warm-up:")
    for name, label in [
        ("bare", f"Batcher, K={args.group_size}, post/wait and collect/answer only"),
        ("tensors", f"Batcher, K={args.group_size}, with index_select gather and scatter"),
        ("pipe", "multiprocessing.Pipe ping-pong"),
    ]:
        print(
            f"  {label}: median {results[name + '_median_us']:.1f} us,"
            f" p99 {results[name + '_p99_us']:.1f} us"
        )


if __name__ == "__main__":
    main()
