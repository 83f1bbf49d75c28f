"""Actor supervision: start actor processes, notice deaths, reclaim, replace.

A dead actor (exit, signal, exception in its env) is noticed at the next
`check()`, which the runner calls a few times a second. What it held in the
sink is reclaimed (`sink.reclaim`): every rollout slot it had claimed goes back
to the free queue. A slot it had finished was already on the full queue and is
no longer owned, so nothing half-written is ever handed to the learner, and the
rollout-id check (beast/buffers.py) would drop it if it were; a replay sequence
it was writing keeps priority 0 until overwritten.
With central inference, the dead actor's group of the request table is
reset too: requests it left are not served, and an answer in flight is not
credited to its replacement.
Then a replacement starts under the same index with fresh env seeds.

Errors are reported once: an actor that fails writes its traceback to a
shared error board and exits 1; the supervisor prints the first report of
each distinct traceback in full and later ones as one line. More than
`max_restarts` replacements within `RESTART_WINDOW_SECONDS` stop the run:
a broken environment must not restart forever.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch

from beast.actor import ERROR_BOARD_BYTES, ActorSettings, run_actor
from beast.inference import InferenceTable
from beast.profile import ACTOR_PHASES, shared_counters

__all__ = ["ActorPool", "RESTART_WINDOW_SECONDS"]

RESTART_WINDOW_SECONDS = 60.0


class ActorPool:
    def __init__(
        self,
        *,
        settings: ActorSettings,
        sink: Any,
        policy_source: torch.nn.Module | InferenceTable,
        num_actors: int,
        max_restarts: int,
        log: Callable[[str], None],
    ) -> None:
        # Actors fork from a server process that imported beast.actor (and torch)
        # once: fast restarts, and no fork of the multi-threaded learner process.
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["beast.actor"])
        self.settings = settings
        self.sink = sink
        self.policy_source = policy_source
        self.max_restarts = max_restarts
        self.log = log
        # One row per actor: a NUL-terminated UTF-8 traceback written by a failing actor.
        self.error_board = torch.zeros((num_actors, ERROR_BOARD_BYTES), dtype=torch.uint8)
        self.error_board.share_memory_()
        # Seconds per phase of each actor's loop (beast/profile.py), across restarts.
        self.phase_seconds = shared_counters(num_actors, ACTOR_PHASES)
        self.processes: list[mp.process.BaseProcess | None] = [None] * num_actors
        self.incarnations = [0] * num_actors
        self.restarts = 0
        self._recent_restarts: collections.deque[float] = collections.deque()
        self._reported_errors: set[str] = set()

    def start(self) -> None:
        for index in range(len(self.processes)):
            self._start(index)

    def _start(self, index: int) -> None:
        process = self.ctx.Process(
            target=run_actor,
            name=f"actor-{index}",
            args=(
                index,
                self.incarnations[index],
                self.settings,
                self.sink,
                self.policy_source,
                os.getpid(),
                self.error_board,
                self.phase_seconds,
            ),
        )
        process.start()
        self.processes[index] = process

    def _death_reason(self, index: int, exitcode: int | None) -> str:
        row = self.error_board[index].numpy().tobytes()
        report = row.split(b"\0", 1)[0].decode("utf-8", errors="replace")
        self.error_board[index].zero_()
        if report:
            summary = report.strip().splitlines()[-1]
            if report not in self._reported_errors:
                self._reported_errors.add(report)
                self.log(f"actor-{index} (env {self.settings.env}) failed:\n{report.rstrip()}")
            return f"raised {summary}"
        if exitcode is not None and exitcode < 0:
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"exited with code {exitcode}"

    def check(self) -> str | None:
        """Replace dead actors; returns why the run must stop, or None."""
        for index, process in enumerate(self.processes):
            if process is None or process.is_alive():
                continue
            process.join()
            reason = self._death_reason(index, process.exitcode)
            reclaimed = self.sink.reclaim(owner=index)
            if isinstance(self.policy_source, InferenceTable):
                self.policy_source.drop_requests(index)
            now = time.monotonic()
            while self._recent_restarts and now - self._recent_restarts[0] > RESTART_WINDOW_SECONDS:
                self._recent_restarts.popleft()
            if len(self._recent_restarts) >= self.max_restarts:
                self.processes[index] = None
                return (
                    f"actor-{index} {reason}; {len(self._recent_restarts)} actors were already"
                    f" replaced in the last {RESTART_WINDOW_SECONDS:.0f} s (--max_actor_restarts"
                    f" {self.max_restarts}), so the run stops"
                )
            self._recent_restarts.append(now)
            self.restarts += 1
            self.incarnations[index] += 1
            self.log(
                f"actor-{index} {reason}; reclaimed {reclaimed} slot(s), starting a replacement"
                f" (restart {self.restarts})"
            )
            self._start(index)
        return None

    def stop(self, timeout: float) -> None:
        """Join actors (the caller has closed the queues), then kill what is left."""
        deadline = time.monotonic() + timeout
        running = [p for p in self.processes if p is not None and p.pid is not None]
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in running:
            if process.is_alive():
                process.kill()
                process.join(1.0)
