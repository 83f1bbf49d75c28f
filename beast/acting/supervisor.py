"""Actor supervision: start actor processes, notice deaths, reclaim, replace.

A dead actor (exit, signal, exception in its env) is noticed at the next
`check()`, which the runner calls a few times a second. What it held in the
sink is reclaimed (`sink.reclaim`): every rollout slot it had claimed goes back
to the free queue. A slot it had finished was already on the full queue and is
no longer owned, so nothing half-written is ever handed to the learner, and the
rollout-id check (beast/experience/rollout_slots.py) would drop it if it were; a replay sequence
it was writing keeps priority 0 until overwritten.
With central inference, the dead actor's group of the request table is
reset too: requests it left are not served, and an answer in flight is not
credited to its replacement.
Then a replacement starts under the same index with fresh env seeds.

Nothing is reclaimed before the process is seen dead by the kernel's account (a
pidfd, `WorkerProcess`), never on multiprocessing's word alone: actors fork from
a fork server, and multiprocessing learns of their exit through a pipe from that
server, so when the server dies it reports every actor dead (exit code 255)
while they still run. A dead fork server is replaced instead: its actors (which
the kernel kills with it, `beast.util.threads.die_with_fork_server`) are seen dead,
their slots reclaimed, and replacements start through a new server. That is
bounded like actor restarts; a server that cannot be started stops the run
with one line.

Errors are reported once: an actor that fails writes its traceback to a
shared error board (beast/acting/error_board.py) and exits 1; the supervisor prints
the first report of each distinct traceback in full and later ones as one
line. More than `max_restarts` replacements within `RESTART_WINDOW_SECONDS`
stop the run (`RestartWindow`): a broken environment must not restart forever.
The evaluator process (beast/run/evaluator.py) is supervised with the same board
and window, and stopped the same way (`stop_workers`).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from beast.acting.actor import ActorSettings, run_actor
from beast.acting.error_board import ErrorBoard
from beast.acting.fork_server import actor_context
from beast.acting.inference import InferenceTable
from beast.experience.contract import Sink
from beast.util.profile import ACTOR_PHASES, shared_counters
from beast.util.threads import process_alive

__all__ = [
    "ActorPool",
    "ForkServerError",
    "RESTART_WINDOW_SECONDS",
    "RestartWindow",
    "WorkerProcess",
    "start_worker",
    "stop_workers",
]

RESTART_WINDOW_SECONDS = 60.0
# Seconds a process killed with SIGKILL gets to be gone before the run gives up on it.
_KILL_WAIT_SECONDS = 5.0
# Tries to start a process while the fork server dies under it (each try after the first
# goes through a new server), and the pause between them.
_START_TRIES = 3
_START_RETRY_SECONDS = 0.2


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


class ForkServerError(RuntimeError):
    """The actors' fork server failed to start a process; the message says so in one
    line."""


class _Watch:
    """Whether process `pid` has exited, whoever its parent is: a pidfd (Linux >= 5.3),
    or /proc where the kernel has none (a reused pid then reads as alive)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
        except (AttributeError, OSError):
            pass  # no pidfd here

    def exited(self, timeout: float = 0.0) -> bool:
        """Whether it has exited, waiting up to `timeout` seconds for it to."""
        deadline = time.monotonic() + timeout
        while not self._gone:
            if self._fd is not None:
                left = max(0.0, deadline - time.monotonic())
                self._gone = bool(select.select([self._fd], [], [], left)[0])
                break
            self._gone = not process_alive(self.pid)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        return self._gone

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            elif not self._gone:
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def _missing_main_file_hidden() -> Iterator[None]:
    """Hide a `__main__.__file__` that names no file while a process starts.

    A script read from standard input (`python - <<EOF`) has `__file__` '<stdin>'; a
    child started by the fork server would be told to run that path as its main module,
    and fail (FileNotFoundError). Actors need no main module: what a run sends them
    names importable modules only (beast/util/references.py refuses objects defined in such
    a script, in one line, before any process starts).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or os.path.isfile(os.path.join(mp.process.ORIGINAL_DIR or "", path)):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class WorkerProcess:
    """A process started through the actors' fork server, watched by the kernel's
    account (module docstring): its own exit, and its fork server's."""

    def __init__(
        self, ctx: mp.context.ForkServerContext, target: Callable, name: str, args: Sequence
    ) -> None:
        self.process = ctx.Process(target=target, name=name, args=tuple(args))
        self.name = name
        self._watch: _Watch | None = None
        self._server: _Watch | None = None

    def start(self) -> None:
        """Start it; ForkServerError when the fork server fails meanwhile."""
        try:
            with _missing_main_file_hidden():
                self.process.start()
        except (OSError, EOFError) as error:  # the server died under the request
            raise ForkServerError(
                f"the fork server failed to start {self.name} ({type(error).__name__}: {error})"
            ) from error
        pid = self.process.pid
        self._watch = _Watch(pid)
        server = _parent_pid(pid)
        if server is not None and not self._watch.exited():
            self._server = _Watch(server)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exited(self, timeout: float = 0.0) -> bool:
        """Whether the process is gone, waiting up to `timeout` seconds for it to go."""
        return self._watch is not None and self._watch.exited(timeout)

    def server_gone(self) -> bool:
        """Whether the fork server it came from has exited (it runs on, or is dying)."""
        return self._server is not None and self._server.exited()

    def exitcode(self) -> int | None:
        """Once `exited`: its exit code (negative: killed by that signal), or None when
        the fork server, which reports it, died first."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code == 255 and self.server_gone():
            return None  # multiprocessing's code for "the fork server's pipe closed"
        return code

    def kill(self) -> None:
        if self._watch is not None:
            self._watch.kill()

    def close(self) -> None:
        """Forget it: it must have exited."""
        self.process.join(1.0)
        for watch in (self._watch, self._server):
            if watch is not None:
                watch.close()


def stop_workers(workers: Sequence[WorkerProcess], timeout: float) -> None:
    """Wait for `workers` (each already told to stop) for up to `timeout` seconds in all,
    kill what is left, and forget them."""
    deadline = time.monotonic() + timeout
    started = [worker for worker in workers if worker.pid is not None]
    for worker in started:
        worker.exited(max(0.0, deadline - time.monotonic()))
    for worker in started:
        if not worker.exited():
            worker.kill()
            worker.exited(_KILL_WAIT_SECONDS)
    for worker in started:
        worker.close()


def start_worker(make: Callable[[], WorkerProcess]) -> WorkerProcess:
    """`make()` started, trying again through a new fork server when the one it used died
    under the request; ForkServerError after `_START_TRIES` failures."""
    tries = 1
    while True:
        worker = make()
        try:
            worker.start()
            return worker
        except ForkServerError:
            if tries == _START_TRIES:
                raise
        tries += 1
        time.sleep(_START_RETRY_SECONDS)


class ActorPool:
    def __init__(
        self,
        *,
        settings: ActorSettings,
        sink: Sink,
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
        # Seconds per phase of each actor's loop (beast/util/profile.py), across restarts.
        self.phase_seconds = shared_counters(num_actors, ACTOR_PHASES)
        self.workers: list[WorkerProcess | None] = [None] * num_actors
        # Which process of each actor runs now (`beast.experience.rollout_slots.owner_id`, env
        # seeds); each
        # start adds 1, so the first is 0.
        self.incarnations = [-1] * num_actors
        self.restart_window = RestartWindow(max_restarts)
        self.server_window = RestartWindow(max_restarts)

    def start(self) -> None:
        """Start every actor; ForkServerError when one cannot be started."""
        for index in range(len(self.workers)):
            self._start(index)

    def _start(self, index: int) -> None:
        def make() -> WorkerProcess:
            # A try that failed may have forked a child before its server died (the
            # kernel kills it with the server): the next try is another process.
            self.incarnations[index] += 1
            return WorkerProcess(
                self.ctx,
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

        self.workers[index] = start_worker(make)

    def _retire(self, index: int) -> int:
        """Reclaim what dead actor `index` held and forget its process; returns the rollout
        slots reclaimed."""
        reclaimed = self.sink.reclaim(index, self.incarnations[index])
        if isinstance(self.policy_source, InferenceTable):
            self.policy_source.drop_requests(index)
        worker = self.workers[index]
        if worker is not None:
            worker.close()
        self.workers[index] = None
        return reclaimed

    def check(self) -> str | None:
        """Replace dead actors, and every actor of a fork server that died; returns why the
        run must stop, or None."""
        try:
            if any(worker is not None and worker.server_gone() for worker in self.workers):
                failure = self._replace_fork_server()
                if failure:
                    return failure
            for index, worker in enumerate(self.workers):
                # An actor whose server died since is the next check's, with the others.
                if worker is None or worker.server_gone() or not worker.exited():
                    continue
                reason = self.error_board.death_reason(
                    index, worker.exitcode(), f"actor-{index} (env {self.settings.env})"
                )
                reclaimed = self._retire(index)
                if not self.restart_window.allow():
                    return self.restart_window.refusal(f"actor-{index} {reason}", "actors")
                self.log(
                    f"actor-{index} {reason}; reclaimed {reclaimed} slot(s), starting a"
                    f" replacement (restart {self.restart_window.total})"
                )
                self._start(index)
        except ForkServerError as error:
            return f"{error}, so the run stops"
        return None

    def _replace_fork_server(self) -> str | None:
        """The fork server died: wait for its actors to be gone (killing any it left
        running), reclaim what they held, start their replacements through a new server."""
        orphans = [
            index
            for index, worker in enumerate(self.workers)
            if worker is not None and worker.server_gone()
        ]
        for index in orphans:
            self.workers[index].kill()
        reclaimed = 0
        for index in orphans:
            worker = self.workers[index]
            if not worker.exited(_KILL_WAIT_SECONDS):
                return (
                    f"the actors' fork server died and actor-{index} (pid {worker.pid}) still"
                    f" runs {_KILL_WAIT_SECONDS:.0f} s after SIGKILL, so the run stops"
                )
            # Reported if it had failed first; it is replaced with the others either way.
            self.error_board.death_reason(
                index, worker.exitcode(), f"actor-{index} (env {self.settings.env})"
            )
            reclaimed += self._retire(index)
        if not self.server_window.allow():
            return self.server_window.refusal("the actors' fork server died", "fork servers")
        self.log(
            f"the actors' fork server died; reclaimed {reclaimed} slot(s), starting a new"
            f" server and {len(orphans)} replacement actor(s) (server restart"
            f" {self.server_window.total})"
        )
        for index in orphans:
            self._start(index)
        return None

    def stop(self, timeout: float) -> None:
        """Wait for the actors (the caller has closed the sink), then kill what is left."""
        stop_workers([worker for worker in self.workers if worker is not None], timeout)
