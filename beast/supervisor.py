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
shared error board (beast/error_board.py) and exits 1; the supervisor prints
the first report of each distinct traceback in full and later ones as one
line. More than `max_restarts` replacements within `RESTART_WINDOW_SECONDS`
stop the run (`RestartWindow`): a broken environment must not restart forever.
The evaluator process (beast/evaluator.py) is supervised with the same board
and window, and stopped the same way (`stop_processes`).
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import multiprocessing.forkserver
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from beast.actor import ActorSettings, run_actor
from beast.error_board import ErrorBoard
from beast.inference import InferenceTable
from beast.profile import ACTOR_PHASES, shared_counters

__all__ = [
    "ActorPool",
    "RESTART_WINDOW_SECONDS",
    "RestartWindow",
    "start_actor_server",
    "stop_processes",
]

RESTART_WINDOW_SECONDS = 60.0


class RestartWindow:
    """Replacements of dead processes within the last RESTART_WINDOW_SECONDS, at most
    `max_restarts` of them."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.total = 0
        self._recent: collections.deque[float] = collections.deque()

    def allow(self) -> bool:
        """Whether one more replacement fits in the window; counts it if it does."""
        now = time.monotonic()
        while self._recent and now - self._recent[0] > RESTART_WINDOW_SECONDS:
            self._recent.popleft()
        if len(self._recent) >= self.max_restarts:
            return False
        self._recent.append(now)
        self.total += 1
        return True

    def refusal(self, what: str, kind: str) -> str:
        """Why the run stops when `allow` said no: `what` died ("actor-3 raised ..."), and
        that many `kind` ("actors") were already replaced."""
        return (
            f"{what}; {len(self._recent)} {kind} were already replaced in the last"
            f" {RESTART_WINDOW_SECONDS:.0f} s (--max_actor_restarts {self.max_restarts}),"
            " so the run stops"
        )


def stop_processes(processes: list[mp.process.BaseProcess], timeout: float) -> None:
    """Join `processes` (each already told to stop) for up to `timeout` seconds in all,
    then kill what is left."""
    deadline = time.monotonic() + timeout
    running = [p for p in processes if p.pid is not None]
    for process in running:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in running:
        if process.is_alive():
            process.kill()
            process.join(1.0)


def actor_context() -> mp.context.ForkServerContext:
    """Actors fork from a server process that imported beast.actor (and torch) once: fast
    restarts, and no fork of the multi-threaded learner process."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["beast.actor"])
    return ctx


def start_actor_server() -> None:
    """Start the actors' fork server now, so that its imports (1.4 s on the 2-core VM)
    overlap the run's own set-up (building the model and optimizers, whose first
    torch.optim call imports torch._dynamo: 1.1 s) instead of following it."""
    actor_context()
    multiprocessing.forkserver.ensure_running()


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
        self.ctx = actor_context()
        self.settings = settings
        self.sink = sink
        self.policy_source = policy_source
        self.log = log
        # One row per actor: a NUL-terminated UTF-8 traceback written by a failing actor.
        self.error_board = ErrorBoard(num_actors, log)
        # Seconds per phase of each actor's loop (beast/profile.py), across restarts.
        self.phase_seconds = shared_counters(num_actors, ACTOR_PHASES)
        self.processes: list[mp.process.BaseProcess | None] = [None] * num_actors
        self.incarnations = [0] * num_actors
        self.restart_window = RestartWindow(max_restarts)

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
                self.error_board.tensor,
                self.phase_seconds,
            ),
        )
        process.start()
        self.processes[index] = process

    def check(self) -> str | None:
        """Replace dead actors; returns why the run must stop, or None."""
        for index, process in enumerate(self.processes):
            if process is None or process.is_alive():
                continue
            process.join()
            reason = self.error_board.death_reason(
                index, process.exitcode, f"actor-{index} (env {self.settings.env})"
            )
            reclaimed = self.sink.reclaim(owner=index)
            if isinstance(self.policy_source, InferenceTable):
                self.policy_source.drop_requests(index)
            if not self.restart_window.allow():
                self.processes[index] = None
                return self.restart_window.refusal(f"actor-{index} {reason}", "actors")
            self.incarnations[index] += 1
            self.log(
                f"actor-{index} {reason}; reclaimed {reclaimed} slot(s), starting a replacement"
                f" (restart {self.restart_window.total})"
            )
            self._start(index)
        return None

    def stop(self, timeout: float) -> None:
        """Join actors (the caller has closed the queues), then kill what is left."""
        stop_processes([p for p in self.processes if p is not None], timeout)
