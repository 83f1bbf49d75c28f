"""Sampling and update throughput of the native SumTree vs a pure-NumPy sum tree.

    python -m benchmarks.sum_tree --capacity 1048576 --batch_sizes 64,512,4096

Both trees have the same layout (an implicit binary tree, float64, leaves padded to a
power of two) and do the same work per call: ``sample`` maps a batch of draws in [0, 1]
to leaves by descending from the root (never into an empty subtree), and returns
indices and priorities; ``update`` writes a batch of leaves and recomputes every
ancestor from its children. The NumPy tree is the strongest pure-NumPy version we could
write: one vectorised step per tree level for the whole batch, so its cost is ~log2(n)
NumPy calls per batch rather than a Python loop per draw. The native tree also takes a
process-shared lock and reports generations; that cost is included.

Reported per batch size: median draws (or leaf updates) per second of this process's CPU
time over `--repeats` interleaved runs of at least `--seconds` of wall-clock time each,
the ratio native / NumPy, and the same ratio in wall-clock time. CPU time is the headline
because the development machine is shared: a process descheduled half the time halves
its wall-clock rate without the code changing. Both run on one thread (torch's intra-op
threads set to 1; NumPy uses none here). Draws and indices are generated before timing;
both sides get the same ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `beast` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from beast.native import SumTree

__all__ = ["NumPySumTree", "measure"]


class NumPySumTree:
    """A sum tree in NumPy, vectorised over the batch: the baseline of this benchmark."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.leaves = 1
        while self.leaves < capacity:
            self.leaves *= 2
        self.depth = self.leaves.bit_length() - 1
        self.sums = np.zeros(2 * self.leaves)

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaves, then recompute their ancestors level by level (each once)."""
        nodes = indices + self.leaves
        self.sums[nodes] = priorities
        for _ in range(self.depth):
            nodes = np.unique(nodes // 2)
            self.sums[nodes] = self.sums[2 * nodes] + self.sums[2 * nodes + 1]

    def sample(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Leaves whose cumulative ranges hold draws * total: (indices, priorities, total)."""
        total = self.sums[1]
        if not total > 0:
            raise ValueError("every priority is 0")
        target = draws * total
        nodes = np.ones(len(draws), dtype=np.int64)
        for _ in range(self.depth):
            left = self.sums[2 * nodes]
            right = self.sums[2 * nodes + 1]
            go_right = (target >= left) & (right > 0)
            target = np.where(go_right, target - left, target)
            nodes = 2 * nodes + go_right
        return nodes - self.leaves, self.sums[nodes], total


def measure(fn: Callable[[int], None], num_inputs: int, seconds: float) -> tuple[float, float]:
    """Calls per second of fn(i), i cycling over the prepared inputs, over >= seconds of
    wall-clock time: (per wall-clock second, per second of this process's CPU time)."""
    for i in range(min(20, num_inputs)):  # warm-up: page faults, caches
        fn(i)
    calls = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while True:
        for i in range(num_inputs):
            fn(i)
        calls += num_inputs
        elapsed = time.perf_counter() - wall
        if elapsed >= seconds:
            return calls / elapsed, calls / (time.process_time() - cpu)


# Prepared inputs per figure, cycled through (fresh draws, not one batch over and over).
_NUM_INPUTS = 64


def _workloads(
    native: SumTree, reference: NumPySumTree, batch: int, capacity: int, rng: np.random.Generator
) -> dict[str, tuple[Callable[[int], object], Callable[[int], object]]]:
    """For each op, (native call, NumPy call) on the i-th of _NUM_INPUTS prepared inputs."""
    # Stratified draws, as replay makes them.
    draws = [(np.arange(batch) + rng.random(batch)) / batch for _ in range(_NUM_INPUTS)]
    draws_t = [torch.from_numpy(d) for d in draws]
    indices = [rng.integers(0, capacity, batch) for _ in range(_NUM_INPUTS)]
    values = [rng.uniform(0.0, 10.0, batch) for _ in range(_NUM_INPUTS)]
    indices_t = [torch.from_numpy(i) for i in indices]
    values_t = [torch.from_numpy(v) for v in values]
    # Same answers before timing anything.
    a, b = native.sample(draws_t[0]), reference.sample(draws[0])
    assert np.array_equal(a.indices.numpy(), b[0]), "the two trees sample differently"
    return {
        "sample": (
            lambda i: native.sample(draws_t[i]),
            lambda i: reference.sample(draws[i]),
        ),
        "update": (
            lambda i: native.update(indices_t[i], values_t[i]),
            lambda i: reference.update(indices[i], values[i]),
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=2**20, help="leaves in each tree")
    parser.add_argument(
        "--batch_sizes", default="64,512,4096", help="comma-separated draws (updates) per call"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum time per run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    rng = np.random.default_rng(args.seed)
    priorities = rng.uniform(0.0, 10.0, args.capacity) ** 0.9
    native, reference = SumTree(args.capacity), NumPySumTree(args.capacity)
    native.update(torch.arange(args.capacity), torch.from_numpy(priorities))
    reference.update(np.arange(args.capacity), priorities)
    assert native.total() == reference.sums[1], "the two trees disagree"

    print(
        f"sum tree, capacity {args.capacity:,}; load average "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + f"; nproc {os.cpu_count()}; torch {torch.__version__}, numpy {np.__version__}"
    )
    print(
        f"{'op':<7} {'batch':>6} {'native /s':>12} {'numpy /s':>12} {'native/numpy':>13}"
        f" {'(wall-clock)':>13}"
    )
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        figures = _workloads(native, reference, batch, args.capacity, rng)
        for op, (native_fn, numpy_fn) in figures.items():
            rates: dict[str, list[tuple[float, float]]] = {"native": [], "numpy": []}
            for _ in range(args.repeats):  # interleaved, so load drifts hit both alike
                rates["native"].append(measure(native_fn, _NUM_INPUTS, args.seconds))
                rates["numpy"].append(measure(numpy_fn, _NUM_INPUTS, args.seconds))
            wall = {k: batch * statistics.median(r[0] for r in v) for k, v in rates.items()}
            cpu = {k: batch * statistics.median(r[1] for r in v) for k, v in rates.items()}
            print(
                f"{op:<7} {batch:>6} {cpu['native']:>12,.0f} {cpu['numpy']:>12,.0f}"
                f" {cpu['native'] / cpu['numpy']:>12.1f}x"
                f" {wall['native'] / wall['numpy']:>12.1f}x"
            )


if __name__ == "__main__":
    main()
