"""The threads that feed a learner's slots from its env servers.

`ServerPool` creates one learner's share of the env servers as Ray actors
(restarted by Ray when their process or node dies, calls in flight retried
on the new process), spread over the cluster's nodes, and keeps track of
which process is behind each: a reply from a new incarnation is a restart,
logged once with both places, and too many restarts within a minute stop
the run.

Two feeders, one per `--policy`; each commits only whole payloads into the
learner's sink (`sink.commit`: whole rollouts into the rollout slots, or the
sequences, episodes and step counts of T steps into the replay), so what is
lost with its server is simply never written:

    RolloutReceiver   (local) keeps `--rollouts_in_flight` rollout requests
                      queued at each server, each carrying the latest weights
                      (an object-store reference, fetched by a server only
                      when its version is new), and commits replies as they
                      come.
    CentralInference  (central) keeps one step request per server in flight;
                      gathers the replies that are ready, runs one batched
                      forward pass for all of them on the learner's device,
                      acts with the algorithm's policy, writes the step with
                      the same writer a server would use, commits what is
                      complete, sends the actions.

With synchronous rollouts (beast/experience/rollout_source.py `RolloutSource`) a server's next
rollout
waits for the update its last one feeds: both feeders hold a server back once its
rollout is committed, until the learner frees that rollout's slots (the update is out),
and meanwhile serve the others; the receiver then asks for one rollout at a time, with
the weights of every update.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from beast.acting.inference import record_arrays
from beast.algos.base import ActingRule, as_outputs
from beast.experience.contract import Sink
from beast.fields import map_inputs, model_inputs
from beast.poly.config import PolyConfig
from beast.poly.env_server import EnvServer, Incarnation, RolloutTimes

__all__ = ["CentralInference", "FeederStats", "RolloutReceiver", "ServerPool", "WeightsBroadcast"]

# How long a feeder waits on Ray before looking at its stop flag.
_POLL_SECONDS = 0.2
# Restarts counted against --max_actor_restarts within this window.
_RESTART_WINDOW_SECONDS = 60.0
# How often a feeder looks at held servers (synchronous rollouts) with nothing in flight.
_HELD_POLL_SECONDS = 0.0005
# How long to wait for the servers' first reply (their envs are built) at start.
_START_TIMEOUT_SECONDS = 300.0


def _ray():
    import ray

    return ray


def _is_lost_actor(error: BaseException) -> bool:
    """True for Ray's "the actor's process or node is gone" errors (not env bugs)."""
    exceptions = _ray().exceptions
    return isinstance(error, exceptions.RayActorError | exceptions.ActorUnavailableError)


def _task_error_line(error: BaseException) -> str:
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return str(error).strip().splitlines()[-1]


class ServerPool:
    """One learner's env servers, their placement and their restarts."""

    def __init__(
        self,
        config: PolyConfig,
        indices: list[int],
        log: Callable[[str], None],
        recipe: Any,
    ) -> None:
        """recipe: the learner's experience's `staging_recipe()`, for the servers."""
        self.config = config
        self.indices = indices
        self.log = log
        self.recipe = recipe
        self.handles: dict[int, object] = {}
        self.known: dict[int, Incarnation] = {}
        # Tokens of the processes each server has had before its current one: a reply
        # from one (sent before a restart, taken after the new process's first) is no
        # restart, and must not count as one (a restart count can stop the run).
        self._retired: dict[int, set[str]] = collections.defaultdict(set)
        self.restarts: collections.deque[float] = collections.deque()
        self.total_restarts = 0
        # Guards known/restarts: feeders report from their thread, the monitor reads.
        self._lock = threading.Lock()

    def start(self) -> None:
        """Create the servers (spread across nodes) and wait until each is up."""
        ray = _ray()
        remote = ray.remote(EnvServer).options(
            num_cpus=self.config.cpus_per_env_server,
            # Ray restarts a server whose process or node died, and retries the calls
            # in flight on the new one; ServerPool bounds restarts per minute instead.
            max_restarts=-1,
            max_task_retries=-1,
            scheduling_strategy="SPREAD",
        )
        for index in self.indices:
            self.handles[index] = remote.remote(self.config, index, self.recipe)
        refs = {self.handles[i].info.remote(): i for i in self.indices}
        try:
            infos = ray.get(list(refs), timeout=_START_TIMEOUT_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"env servers did not start within {_START_TIMEOUT_SECONDS:.0f} s: the cluster"
                f" may lack the resources ({self.config.cpus_per_env_server} CPU per server)"
            ) from None
        except ray.exceptions.RayError as error:
            raise RuntimeError(
                f"an env server could not start: {_task_error_line(error)}"
            ) from None
        for info in infos:
            self.known[info.server_index] = info
            self.log(
                f"env server {info.server_index}: node {info.node_id[:12]} ({info.hostname}),"
                f" pid {info.pid}, {self.config.servers_envs} envs"
            )

    def saw(self, info: Incarnation) -> bool:
        """Note a reply's incarnation; True (and a log line) when the server was restarted:
        a process not seen before behind it."""
        with self._lock:
            previous = self.known.get(info.server_index)
            retired = self._retired[info.server_index]
            if (previous is not None and previous.token == info.token) or info.token in retired:
                return False
            self.known[info.server_index] = info
            if previous is None:
                return False
            retired.add(previous.token)
            self.restarts.append(time.monotonic())
            self.total_restarts += 1
        self.log(
            f"env server {info.server_index} restarted by Ray: was node {previous.node_id[:12]}"
            f" ({previous.hostname}) pid {previous.pid}, now node {info.node_id[:12]}"
            f" ({info.hostname}) pid {info.pid}; the rollout it was stepping is dropped"
        )
        return True

    def lost(self, index: int, error: BaseException) -> None:
        """A call failed because the server's process or node is gone (Ray restarts it)."""
        self.log(
            f"env server {index} lost ({type(error).__name__}); Ray restarts it, its"
            " rollout in flight is dropped"
        )

    def check(self) -> str | None:
        """Why the run must stop (too many restarts within a minute), or None."""
        with self._lock:
            now = time.monotonic()
            while self.restarts and now - self.restarts[0] > _RESTART_WINDOW_SECONDS:
                self.restarts.popleft()
            if len(self.restarts) > self.config.max_actor_restarts:
                return (
                    f"{len(self.restarts)} env-server restarts within"
                    f" {_RESTART_WINDOW_SECONDS:.0f} s (more than --max_actor_restarts"
                    f" {self.config.max_actor_restarts}); check the nodes and the env"
                )
        return None


class WeightsBroadcast:
    """The learner's latest weights in Ray's object store, refreshed every N updates.

    `actor_model` is the CPU model the Learner publishes into (under its lock)
    after every update; a snapshot is taken under the same lock, so a server
    never loads half of one update and half of the next.
    """

    def __init__(
        self,
        actor_model: nn.Module,
        lock: threading.Lock,
        num_updates: Callable[[], int],
        interval: int,
    ) -> None:
        self.actor_model = actor_model
        self.lock = lock
        self.num_updates = num_updates
        self.interval = interval
        self.version = -1
        self._updates_at_version = 0
        self._ref: list = []

    def current(self) -> tuple[int, list]:
        """(version, [ObjectRef of a {name: numpy array} state dict])."""
        updates = self.num_updates()
        if self.version < 0 or updates - self._updates_at_version >= self.interval:
            with self.lock:
                state = {
                    k: v.detach().cpu().numpy().copy()
                    for k, v in self.actor_model.state_dict().items()
                }
            self._ref = [_ray().put(state)]
            self.version += 1
            self._updates_at_version = updates
        return self.version, self._ref


@dataclass
class FeederStats:
    """Where time goes, summed over a run (the throughput note's breakdown)."""

    rollouts: int = 0  # payloads committed
    server_env_s: float = 0.0  # env.step inside servers
    server_policy_s: float = 0.0  # the servers' (or central) forward passes
    server_total_s: float = 0.0  # whole rollout() calls inside servers
    commit_s: float = 0.0  # the learner process committing payloads (waits included)
    wait_s: float = 0.0  # the feeder waiting for Ray replies
    steps: int = 0  # central: step replies handled
    batch_sizes: list[int] = field(default_factory=list)

    def line(self) -> str:
        if not self.rollouts:
            return "no rollout received"
        parts = [f"{self.rollouts} rollouts"]
        if self.server_total_s:
            parts.append(
                f"servers: {self.server_env_s / self.server_total_s:.0%} env,"
                f" {self.server_policy_s / self.server_total_s:.0%} policy,"
                f" {self.server_total_s / self.rollouts * 1e3:.1f} ms per rollout"
            )
        if self.steps:
            parts.append(
                f"central: {self.server_policy_s / self.steps * 1e3:.2f} ms forward per batch,"
                f" mean batch {np.mean(self.batch_sizes):.1f} servers"
            )
        parts.append(
            f"learner process: {self.commit_s / self.rollouts * 1e3:.2f} ms per rollout"
            " committing (waiting for room included)"
        )
        return "; ".join(parts)


class _HeldServers:
    """Servers whose committed rollout waits for the update it feeds (synchronous rollouts):
    each is let go once the learner has freed its lane's slots, i.e. published that
    update's weights."""

    def __init__(self, sink: Sink, rows: dict[int, int], num_envs: int, synchronous: bool):
        self.sink, self.rows, self.num_envs = sink, rows, num_envs
        self.synchronous = synchronous
        self.waiting: list[int] = []

    def hold(self, index: int) -> bool:
        """Hold server `index` after its commit; False when rollouts are not synchronous."""
        if self.synchronous:
            self.waiting.append(index)
        return self.synchronous

    def release_ready(self, go: Callable[[int], None]) -> None:
        """Call `go(index)` for each held server whose lane is free again."""
        for index in list(self.waiting):
            if self.sink.lane_has_room(self.rows[index], self.num_envs):
                self.waiting.remove(index)
                go(index)


class _Feeder:
    """A named daemon thread that records its failure instead of dying silently."""

    name = "feeder"

    def __init__(
        self, pool: ServerPool, sink: Sink, stop: threading.Event, synchronous: bool = False
    ) -> None:
        self.pool = pool
        self.sink = sink
        self.stop = stop
        self.failure: str | None = None
        self.stats = FeederStats()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        # The sink's row of each server (a replay's counters): its place in the pool.
        self._rows = {index: row for row, index in enumerate(pool.indices)}
        self.held = _HeldServers(sink, self._rows, pool.config.servers_envs, synchronous)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the learner's monitor
            self.failure = f"{self.name} failed: {type(error).__name__}: {error}"
            self.pool.log(f"{self.name} failed:\n" + "".join(traceback.format_exception(error)))
            self.stop.set()

    def _run(self) -> None:
        raise NotImplementedError

    def _replies(
        self,
        pending: dict[object, int],
        send: Callable[[int], None],
        restart: Callable[[int], None],
        *,
        every_ready: bool = False,
    ) -> Iterator[list[tuple[int, Any]]]:
        """The servers' replies to the `pending` calls (ref -> server index), a round at a
        time, until the run stops or a server fails (an env bug, `_server_failed`). A
        round waits up to _POLL_SECONDS for one reply (with `every_ready`, takes every
        other one ready by then too) and yields [(index, reply)]. A server Ray lost is
        `restart`ed: its next call queued until Ray has restarted it. Held servers whose
        lane is free again get their next call (`send`)."""
        ray = _ray()
        while not self.stop.is_set():
            self.held.release_ready(send)
            if not pending:
                time.sleep(_HELD_POLL_SECONDS)
                continue
            start = time.perf_counter()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
            if every_ready and ready:
                rest = [ref for ref in pending if ref not in ready]
                if rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            self.stats.wait_s += time.perf_counter() - start
            replies = []
            for ref in ready:
                index = pending.pop(ref)
                try:
                    replies.append((index, ray.get(ref)))
                except ray.exceptions.RayError as error:
                    if not _is_lost_actor(error):
                        self._server_failed(index, error)
                        return
                    self.pool.lost(index, error)
                    restart(index)
            yield replies

    def _commit(self, index: int, payload: Any) -> bool:
        start = time.perf_counter()
        self.stats.rollouts += 1
        committed = self.sink.commit(payload, self.stop, self._rows[index])
        self.stats.commit_s += time.perf_counter() - start
        return committed

    def _server_failed(self, index: int, error: BaseException) -> None:
        """An env bug (an exception in the server's code): stop the run, say why once."""
        self.pool.log(f"env server {index} failed:\n{str(error).rstrip()}")
        self.failure = f"env server {index} failed: {_task_error_line(error)}"
        self.stop.set()


class RolloutReceiver(_Feeder):
    """--policy local: whole rollouts from the servers into slots."""

    name = "rollout-receiver"

    def __init__(
        self,
        pool: ServerPool,
        sink: Sink,
        stop: threading.Event,
        weights: WeightsBroadcast,
        in_flight: int,
        synchronous: bool = False,
    ) -> None:
        super().__init__(pool, sink, stop, synchronous)
        self.weights = weights
        self.in_flight = 1 if synchronous else in_flight

    def _run(self) -> None:
        pending: dict[object, int] = {}

        def submit(index: int) -> None:
            version, ref = self.weights.current()
            pending[self.pool.handles[index].rollout.remote(version, ref)] = index

        for index in self.pool.indices:
            for _ in range(self.in_flight):
                submit(index)
        for replies in self._replies(pending, submit, submit):
            for index, (info, payload, times) in replies:
                self.pool.saw(info)
                self._count(times)
                if not self._commit(index, payload):
                    return
                if not self.held.hold(index):
                    submit(index)

    def _count(self, times: RolloutTimes) -> None:
        self.stats.server_env_s += times.env
        self.stats.server_policy_s += times.policy
        self.stats.server_total_s += times.total


class _ServerState:
    """What the central feeder keeps per server between steps: the server's step as the
    writer reads it (fixed arrays), the policy's record and its bound act, the recurrent
    state, and the writer with its staging."""

    def __init__(self, feeder: CentralInference, index: int, first_id: int) -> None:
        k = feeder.num_envs
        self.token: str | None = None
        self.sources: dict[str, np.ndarray] | None = None  # made from the first reply
        self.record = record_arrays(feeder.policy, k)
        self.last_action = np.zeros_like(self.record["action"])
        rows = slice(index * k, (index + 1) * k)
        self.act = feeder.policy.bind(
            self.record, {key: value[rows] for key, value in feeder.params.items()}
        )
        self.state = tuple(s.to(feeder.device) for s in feeder.model.initial_state(k))
        self.first_id = first_id
        self.writer: Any = None
        self.staging: Any = None

    def take_reply(self, feeder: CentralInference, out: dict[str, np.ndarray]) -> None:
        """Copy a server's reply into the fixed arrays the writer reads."""
        if self.sources is None:
            self.sources = {key: np.array(value) for key, value in out.items()}
            self.sources["last_action"] = self.last_action
            self.writer, self.staging = feeder.recipe.writer(
                {**self.sources, **self.record},
                publish_every=feeder.unroll_length,
                first_id=self.first_id,
                id_stride=feeder.num_envs,
            )
            return
        for key, value in out.items():
            np.copyto(self.sources[key], value)


class CentralInference(_Feeder):
    """--policy central: batched inference for all servers, payloads built here."""

    name = "central-inference"

    def __init__(
        self,
        pool: ServerPool,
        sink: Sink,
        stop: threading.Event,
        model: nn.Module,
        policy: ActingRule,
        num_envs: int,
        synchronous: bool = False,
    ) -> None:
        super().__init__(pool, sink, stop, synchronous)
        self.model = model
        self.policy = policy
        self.device = next(model.parameters()).device
        self.recipe = sink.staging_recipe()
        self.unroll_length = pool.config.unroll_length
        self.num_envs = num_envs
        # The policy's per-env parameters over all the run's envs (server s: rows s*K...).
        self.params = policy.env_params(pool.config.servers * num_envs)
        self._next_id = 0

    def _fresh(self, index: int) -> _ServerState:
        self._next_id += 1 << 32
        return _ServerState(self, index, self._next_id)

    def _run(self) -> None:
        torch.set_grad_enabled(False)  # for this thread: serving never backpropagates
        servers = {index: self._fresh(index) for index in self.pool.indices}
        pending: dict[object, int] = {}

        def first_step(index: int) -> None:
            pending[self.pool.handles[index].step.remote(None, None)] = index

        def restart(index: int) -> None:
            servers[index] = self._fresh(index)
            first_step(index)

        def send(index: int) -> None:
            server = servers[index]
            ref = self.pool.handles[index].step.remote(server.record["action"].copy(), server.token)
            pending[ref] = index

        for index in self.pool.indices:
            first_step(index)
        for ready in self._replies(pending, send, restart, every_ready=True):
            replies = []
            for index, (info, out) in ready:
                server = servers[index]
                if info.token != server.token:
                    # First reply, or a new process behind the server: start afresh from
                    # its current envs; anything staged for the old one is dropped.
                    self.pool.saw(info)
                    if server.token is not None:
                        server = servers[index] = self._fresh(index)
                    server.token = info.token
                server.take_reply(self, out)
                replies.append((index, server))
            if not replies:
                continue
            start = time.perf_counter()
            inputs = model_inputs(
                {
                    key: torch.from_numpy(np.concatenate([s.sources[key] for _, s in replies]))
                    for key in replies[0][1].sources
                }
            )
            state_in = tuple(
                torch.cat([s.state[i] for _, s in replies], dim=1)
                for i in range(len(replies[0][1].state))
            )
            outputs, state_out = self.model(
                map_inputs(lambda v: v.to(self.device).unsqueeze(0), inputs), state_in
            )
            outputs = as_outputs(outputs)
            self.stats.server_policy_s += time.perf_counter() - start
            self.stats.steps += 1
            self.stats.batch_sizes.append(len(replies))
            k = self.num_envs
            for n, (index, server) in enumerate(replies):
                rows = slice(n * k, (n + 1) * k)
                server.act({key: value[:, rows] for key, value in outputs.items()})
                server.writer.write(tuple(s[:, rows].transpose(0, 1).cpu() for s in state_in))
                server.state = tuple(s[:, rows] for s in state_out)
                np.copyto(server.last_action, server.record["action"])
                payload = server.staging.take_rollout()
                if payload is not None:
                    if not self._commit(index, payload):
                        return
                    if self.held.hold(index):
                        continue
                send(index)
