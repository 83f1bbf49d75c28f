"""The threads that feed a learner's slots from its env servers.

`ServerPool` creates one learner's share of the env servers as Ray actors
(restarted by Ray when their process or node dies, calls in flight retried
on the new process), spread over the cluster's nodes, and keeps track of
which process is behind each: a reply from a new incarnation is a restart,
logged once with both places, and too many restarts within a minute stop
the run.

Two feeders, one per `--policy`; each writes only whole rollouts into slots
(`beast.poly.rollouts.commit`), so a rollout lost with its server is simply
never written:

    RolloutReceiver   (local) keeps `--rollouts_in_flight` rollout requests
                      queued at each server, each carrying the latest weights
                      (an object-store reference, fetched by a server only
                      when its version is new), and commits replies as they
                      come.
    CentralInference  (central) keeps one step request per server in flight;
                      gathers the replies that are ready, runs one batched
                      forward pass for all of them on the learner's device,
                      records the step in each server's staged rollout,
                      commits rollouts that are complete, sends the actions.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from beast.buffers import Field, RolloutBuffers
from beast.inference import ActionBatch, sample_actions
from beast.poly.config import PolyConfig
from beast.poly.env_server import EnvServer, Incarnation, RolloutTimes
from beast.poly.rollouts import CommitTimes, RolloutStaging, check_rollout, commit

__all__ = ["CentralInference", "FeederStats", "RolloutReceiver", "ServerPool", "WeightsBroadcast"]

# How long a feeder waits on Ray before looking at its stop flag.
_POLL_SECONDS = 0.2
# Restarts counted against --max_actor_restarts within this window.
_RESTART_WINDOW_SECONDS = 60.0
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
    ) -> None:
        self.config = config
        self.indices = indices
        self.log = log
        self.handles: dict[int, object] = {}
        self.known: dict[int, Incarnation] = {}
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
            self.handles[index] = remote.remote(self.config, index)
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
        """Note a reply's incarnation; True (and a log line) when the server was restarted."""
        with self._lock:
            previous = self.known.get(info.server_index)
            if previous is not None and previous.token == info.token:
                return False
            self.known[info.server_index] = info
            if previous is None:
                return False
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

    rollouts: int = 0
    server_env_s: float = 0.0  # env.step inside servers
    server_policy_s: float = 0.0  # the servers' (or central) forward passes
    server_total_s: float = 0.0  # whole rollout() calls inside servers
    commit: CommitTimes = field(default_factory=CommitTimes)  # slots: waiting, copying
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
            f"learner process per rollout: {self.commit.copy_s / self.rollouts * 1e3:.2f} ms"
            f" copying into slots, {self.commit.wait_s / self.rollouts * 1e3:.2f} ms waiting"
            " for free slots"
        )
        return "; ".join(parts)


class _Feeder:
    """A named daemon thread that records its failure instead of dying silently."""

    name = "feeder"

    def __init__(self, pool: ServerPool, buffers: RolloutBuffers, stop: threading.Event) -> None:
        self.pool = pool
        self.buffers = buffers
        self.stop = stop
        self.failure: str | None = None
        self.stats = FeederStats()
        self._checked = False
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)

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

    def _commit(self, rollout: dict[str, np.ndarray]) -> bool:
        if not self._checked:
            why = check_rollout(self.buffers, rollout)
            if why is not None:
                raise ValueError(f"an env server's rollout does not fit: {why}")
            self._checked = True
        self.stats.rollouts += 1
        return commit(self.buffers, rollout, self.stop, self.stats.commit)

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
        buffers: RolloutBuffers,
        stop: threading.Event,
        weights: WeightsBroadcast,
        in_flight: int,
    ) -> None:
        super().__init__(pool, buffers, stop)
        self.weights = weights
        self.in_flight = in_flight

    def _run(self) -> None:
        pending: dict[object, int] = {}

        def submit(index: int) -> None:
            version, ref = self.weights.current()
            pending[self.pool.handles[index].rollout.remote(version, ref)] = index

        for index in self.pool.indices:
            for _ in range(self.in_flight):
                submit(index)
        ray = _ray()
        while not self.stop.is_set():
            start = time.perf_counter()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
            self.stats.wait_s += time.perf_counter() - start
            for ref in ready:
                index = pending.pop(ref)
                try:
                    info, rollout, times = ray.get(ref)
                except ray.exceptions.RayError as error:
                    if not _is_lost_actor(error):
                        self._server_failed(index, error)
                        return
                    self.pool.lost(index, error)
                    submit(index)  # queued until Ray has restarted the server
                    continue
                self.pool.saw(info)
                self._count(times)
                if not self._commit(rollout):
                    return
                submit(index)

    def _count(self, times: RolloutTimes) -> None:
        self.stats.server_env_s += times.env
        self.stats.server_policy_s += times.policy
        self.stats.server_total_s += times.total


@dataclass
class _ServerState:
    """What the central feeder keeps per server between steps."""

    staging: RolloutStaging
    state: tuple[torch.Tensor, ...]  # recurrent state for the next forward pass, [d0, K, ...]
    last_action: torch.Tensor  # [K]
    rollout_ids: torch.Tensor  # [K]
    token: str | None = None
    t: int = 0


class CentralInference(_Feeder):
    """--policy central: batched inference for all servers, rollouts built here."""

    name = "central-inference"

    def __init__(
        self,
        pool: ServerPool,
        buffers: RolloutBuffers,
        stop: threading.Event,
        model: nn.Module,
        spec: dict[str, Field],
        unroll_length: int,
        num_envs: int,
    ) -> None:
        super().__init__(pool, buffers, stop)
        self.model = model
        self.device = next(model.parameters()).device
        self.spec = spec
        self.unroll_length = unroll_length
        self.num_envs = num_envs
        self._next_id = 0

    def _fresh(self) -> _ServerState:
        k = self.num_envs
        ids = torch.arange(k, dtype=torch.int64) + self._next_id
        self._next_id += 1 << 32
        return _ServerState(
            staging=RolloutStaging(self.spec, k),
            state=tuple(s.to(self.device) for s in self.model.initial_state(k)),
            last_action=torch.zeros(k, dtype=torch.int64),
            rollout_ids=ids,
        )

    def _run(self) -> None:
        servers = {index: self._fresh() for index in self.pool.indices}
        pending: dict[object, int] = {}
        for index in self.pool.indices:
            pending[self.pool.handles[index].step.remote(None, None)] = index
        ray = _ray()
        T = self.unroll_length
        while not self.stop.is_set():
            start = time.perf_counter()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
            if ready:
                rest = [ref for ref in pending if ref not in ready]
                if rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            self.stats.wait_s += time.perf_counter() - start
            replies = []
            for ref in ready:
                index = pending.pop(ref)
                try:
                    info, out = ray.get(ref)
                except ray.exceptions.RayError as error:
                    if not _is_lost_actor(error):
                        self._server_failed(index, error)
                        return
                    self.pool.lost(index, error)
                    servers[index] = self._fresh()
                    pending[self.pool.handles[index].step.remote(None, None)] = index
                    continue
                server = servers[index]
                if info.token != server.token:
                    # First reply, or a new process behind the server: start a new
                    # rollout from its current envs; any partial one is dropped.
                    self.pool.saw(info)
                    if server.token is not None:
                        server = servers[index] = self._fresh()
                    server.token = info.token
                    server.t = 0
                replies.append((index, server, out))
            if not replies:
                continue
            start = time.perf_counter()
            inputs = {
                "obs": torch.from_numpy(np.concatenate([o["obs"] for _, _, o in replies])),
                "reward": torch.from_numpy(np.concatenate([o["reward"] for _, _, o in replies])),
                "done": torch.from_numpy(np.concatenate([o["done"] for _, _, o in replies])),
                "last_action": torch.cat([s.last_action for _, s, _ in replies]),
            }
            state_in = tuple(
                torch.cat([s.state[i] for _, s, _ in replies], dim=1)
                for i in range(len(replies[0][1].state))
            )
            with torch.no_grad():
                output, state_out = self.model(
                    {k: v.to(self.device).unsqueeze(0) for k, v in inputs.items()}, state_in
                )
            logits = output.policy_logits[0].float()
            actions = sample_actions(logits).cpu()
            logits, baseline = logits.cpu(), output.baseline[0].float().cpu()
            self.stats.server_policy_s += time.perf_counter() - start
            self.stats.steps += 1
            self.stats.batch_sizes.append(len(replies))
            k = self.num_envs
            for n, (index, server, out) in enumerate(replies):
                rows = slice(n * k, (n + 1) * k)
                step = ActionBatch(actions[rows], logits[rows], baseline[rows])
                own_state_in = tuple(s[:, rows].transpose(0, 1).cpu() for s in state_in)
                if server.t == 0:
                    server.staging.write_state(own_state_in)
                env_inputs = {key: inputs[key][rows] for key in ("obs", "reward", "done")}
                env_inputs["last_action"] = server.last_action
                env_outputs = {
                    key: torch.from_numpy(np.array(out[key]))
                    for key in ("episode_end", "episode_return", "episode_step")
                }
                server.staging.write_step(
                    server.t, env_inputs, env_outputs, step, server.rollout_ids
                )
                if server.t == T:
                    if not self._commit(server.staging.arrays()):
                        return
                    server.rollout_ids += k
                    server.staging.repeat_last_step(server.rollout_ids)
                    server.staging.write_state(own_state_in)
                    server.t = 1
                else:
                    server.t += 1
                server.state = tuple(s[:, rows] for s in state_out)
                server.last_action = step.action.clone()
                ref = self.pool.handles[index].step.remote(step.action.numpy(), server.token)
                pending[ref] = index
