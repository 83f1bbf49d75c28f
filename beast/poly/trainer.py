"""PolyBeast training: one or more learners fed by env servers on Ray.

`train(config)` starts (or joins) Ray, then runs the learners:

- one learner (the default) runs in the driver process itself, as monobeast's
  does: Ctrl-C and SIGTERM reach it directly;
- with `--num_learners N > 1`, Ray starts N `LearnerNode` actors (one CPU,
  and one GPU each when the driver sees one): rank 0 pinned to the driver's
  node, where the run directory is, the others spread. They form a
  torch.distributed group (beast/poly/distributed.py) through a file store
  on a private instance (no TCP store, which would listen on every
  interface) or a TCP store on rank 0's node in a cluster. Ray rather than
  torchrun starts them because Ray already places processes on the
  cluster's nodes and owns the env servers: one launcher, one way to stop.

A `LearnerNode` holds what monobeast's learner process holds, built by the same
code (beast/run/plan.py and build.py, through the algorithm registry): the algorithm's sink and
source (rollout slots, or a replay that stays in this process), the learner, the
model, the algorithm's state, checkpoints and run log (rank 0), plus its share of
the env servers (servers r, r+N, r+2N, ...) and the feeder thread that commits
what they produce into the sink (beast/poly/feeders.py). The learning code is
monobeast's; only who writes into the sink differs. With --eval_interval, rank 0
also runs monobeast's evaluator process (beast/run/evaluator.py) on its own node.

Shutdown, however the run ends: the learner stops, the feeder stops, the
slot queues close, rank 0 writes the final checkpoint, then `ray_session`
shuts Ray down: a private instance's processes all exit, and on a cluster
the env servers die with their owner (the driver, or a learner actor the
driver kills). With several learners a stop is agreed at an update
(see GradientReducer), so no learner is left in a collective.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from typing import Any

import torch

from beast import envs
from beast.config import ConfigError, describe_defaults
from beast.envs.batch import check_backend
from beast.learning.learner import UpdateStats
from beast.outputs.checkpoint import CheckpointError
from beast.poly.cluster import ray_session
from beast.poly.config import PolyConfig
from beast.poly.distributed import GradientReducer, broadcast_parameters, init_process_group
from beast.poly.feeders import CentralInference, RolloutReceiver, ServerPool, WeightsBroadcast
from beast.run.build import Run, build_run
from beast.run.evaluator import Evaluation, build_evaluator, describe_evaluation
from beast.run.lifecycle import (
    TrainingError,
    learner_failure,
    open_run_log,
    report,
)
from beast.run.plan import plan_run, select_device
from beast.run.resume import load_resume_payload, restore
from beast.util.interrupts import raise_if_stop_requested, raise_keyboard_interrupt, stop_on_signals

__all__ = ["LearnerNode", "train"]

# How often the monitor loop checks on the learner, feeder and servers.
_MONITOR_SECONDS = 0.5
# Seconds learner threads get to finish an update in flight.
_LEARNER_STOP_SECONDS = 3.0
# Seconds a feeder thread gets to notice the stop flag.
_FEEDER_STOP_SECONDS = 5.0
# Several learners: how long a stop request waits for the learners to agree on a
# last update before each stops on its own (no update is coming: servers lost).
_AGREED_STOP_SECONDS = 10.0
# Several learners: bound on each collective, so a learner whose peer died fails.
_COLLECTIVE_TIMEOUT_SECONDS = 120.0
# Several learners: how long Ray gets to forward their last lines to the driver.
_LOG_FLUSH_SECONDS = 1.0
# Several learners: how long the driver waits for them to finish after a stop.
_LEARNERS_STOP_SECONDS = 60.0


class _Console:
    """A RunLog's print() for learners other than rank 0 (Ray forwards their stdout)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def print(self, message: str) -> None:
        print(f"[beast learner {self.rank}] {message}", flush=True)


class LearnerNode:
    """One learner with its slots, its env servers and the thread that feeds it."""

    def __init__(
        self,
        config: PolyConfig,
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.init_method = init_method
        self.stop_requested = threading.Event()
        self._agreed_stop = threading.Event()

    def request_stop(self) -> None:
        """Ask this learner to stop (the driver's Ctrl-C, with several learners)."""
        self.stop_requested.set()

    def run(self) -> str | None:
        """Train until total_steps or a stop; returns why the run failed, or None."""
        config, rank, world = self.config, self.rank, self.world_size
        plan = plan_run(config)
        config, spec, device, precision = plan.config, plan.spec, plan.device, plan.precision
        if world > 1:
            if config.ray_address is None:
                # Gloo's connections on loopback too (a private instance is one machine).
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            init_process_group(self.init_method, rank, world, device, _COLLECTIVE_TIMEOUT_SECONDS)
        # Each learner counts its own batches; together they consume total_steps.
        local_total = max(1, config.total_steps // world)
        log: Any = open_run_log(config) if rank == 0 else _Console(rank)
        reducer = None
        if world > 1:
            reducer = GradientReducer(
                config.grad_norm_clipping,
                self.stop_requested,
                lambda: self._last_update(run),
            )
        servers = list(range(rank, config.servers, world))
        pools: list[ServerPool] = []
        evaluator: Evaluation | None = None

        def on_update(stats: UpdateStats) -> None:
            if rank != 0:
                return
            losses = dict(stats.losses)
            if reducer is not None:
                losses["grad_norm"] = reducer.global_grad_norm
            # This learner's servers (all of them with one learner), in logs.csv too.
            losses["env_server_restarts"] = pools[0].total_restarts if pools else 0
            run_stats = UpdateStats(
                step=stats.step * world,
                num_updates=stats.num_updates,
                losses=losses,
                episode_returns=stats.episode_returns,
                episode_steps=stats.episode_steps,
            )
            log.record(run_stats)
            if evaluator is not None:
                evaluator.after_update(run_stats)

        run = build_run(
            plan,
            num_writers=len(servers),
            on_update=on_update,
            log=log.print,
            total_steps=local_total,
            reduce_gradients=reducer,
        )
        payload: Any = None
        if rank == 0:
            try:
                payload = load_resume_payload(config)
            except ConfigError as error:
                if world == 1:
                    raise
                payload = {"error": str(error)}  # the other learners must hear of it too
        if world > 1:
            box = [payload]
            torch.distributed.broadcast_object_list(box, src=0)
            payload = box[0]
            if isinstance(payload, dict) and "error" in payload:
                raise ConfigError(payload["error"])
        if payload is not None:
            checkpoint_payload, path, skipped, changed = payload
            # Each learner keeps its own replay; only a lone learner's is in the checkpoint.
            replay_line = restore(
                run, checkpoint_payload, path, progress_divisor=world, with_replay=world == 1
            )
            if skipped:
                log.print(f"the newest checkpoint is unusable ({skipped}); using the previous one")
            log.print(
                f"resuming {config.xpid} from {path} at step {run.progress.step * world:,}"
                + (f"; changed flags: {', '.join(changed)}" if changed else "")
                + (f"; {replay_line}" if replay_line else "")
            )
        if world > 1:
            broadcast_parameters(list(run.model.state_dict().values()))
            run.learner.publish()
        if rank == 0:
            log.start_from(run.progress.step * world)  # SPS counts this run's steps only
        central = plan.policy_mode == "central"
        if central:
            run.actor_model.to(device)  # the feeder's forward passes run on the device
        learner = run.learner

        def checkpoint(wait: float | None = None) -> None:
            if rank != 0:
                return
            saved = run.save(step_multiplier=world, timeout=wait)
            if saved is None:
                log.print("an update is stuck (a learner peer is gone): no final checkpoint")
            elif not saved:
                log.print("the model has non-finite weights: keeping the previous checkpoint")

        log.print(
            f"learner {rank}/{world} on {device} in {precision}"
            f" ({torch.get_num_threads()} thread(s)): env {config.env} (obs {spec.describe_obs()},"
            f" {spec.describe_actions()}), {run.describe()},"
            f" policy {plan.policy_mode}; {describe_defaults(config, spec)}"
        )
        if run.progress.step >= local_total:
            log.print(
                f"already at total_steps {config.total_steps:,}; raise --total_steps to go on"
            )
            if rank == 0:
                log.close()
            return None
        if rank == 0:
            evaluator = build_evaluator(run, log, run.progress.step * world)
            if evaluator is not None:
                log.print(describe_evaluation(config))

        pool = ServerPool(config, servers, log.print, run.sink.staging_recipe())
        pools.append(pool)
        stop = threading.Event()
        # Synchronous rollouts (beast/experience/rollout_source.py RolloutSource): a server's next
        # rollout
        # must act with the weights of the update its last one fed, so it is asked for
        # once that update is out, with those weights.
        synchronous = getattr(run.source, "synchronous", False)
        if central:
            feeder: Any = CentralInference(
                pool,
                run.sink,
                stop,
                run.actor_model,
                run.policy,
                config.servers_envs,
                synchronous=synchronous,
            )
        else:
            weights = WeightsBroadcast(
                run.actor_model,
                learner.lock,
                lambda: learner.progress.num_updates,
                1 if synchronous else config.weights_interval,
            )
            feeder = RolloutReceiver(
                pool, run.sink, stop, weights, config.rollouts_in_flight, synchronous
            )
        failure: str | None = None
        try:
            pool.start()
            feeder.start()
            if evaluator is not None:
                evaluator.start()
            learner.start()
            failure = self._monitor(run, pool, feeder, evaluator, log, checkpoint)
            if failure is None and evaluator is not None:
                learner.stop(_LEARNER_STOP_SECONDS)  # its last update may hand a snapshot
                evaluator.finish(run.progress.step * world, self.stop_requested.is_set)
        except KeyboardInterrupt:
            log.print("interrupted: stopping env servers and learner, writing a final checkpoint")
        except CheckpointError as error:
            failure = str(error)
        except RuntimeError as error:  # servers that cannot start
            failure = str(error)
        finally:
            if threading.current_thread() is threading.main_thread():
                # A bounded shutdown that a second Ctrl-C must not cut short.
                _ignore_signals((signal.SIGINT, signal.SIGTERM))
            try:
                learner.stop(_LEARNER_STOP_SECONDS)
                stop.set()
                run.source.close()
                feeder.join(_FEEDER_STOP_SECONDS)
                if evaluator is not None:
                    evaluator.close()
                # The servers die with their owner (this process's Ray connection, or
                # this learner actor); killing them here, with calls in flight, only
                # made Ray log a retry warning per call.
                log.print(
                    f"feeder: {feeder.stats.line()}; env-server restarts: {pool.total_restarts}"
                )
                checkpoint(wait=_LEARNER_STOP_SECONDS)
                if rank == 0:
                    log.print(
                        f"checkpoint at step {run.progress.step * world:,} in {config.run_dir}"
                    )
            except CheckpointError as error:
                failure = failure or str(error)
            finally:
                if rank == 0:
                    log.close()
                if world > 1 and torch.distributed.is_initialized():
                    torch.distributed.destroy_process_group()
        return failure

    def _last_update(self, run: Run) -> None:
        """Several learners agreed that the update in progress is the last one."""
        learner = run.learner
        learner.total_steps = min(learner.total_steps, run.progress.step + 1)
        self._agreed_stop.set()

    def _monitor(
        self, run: Run, pool: ServerPool, feeder, evaluator: Evaluation | None, log, checkpoint
    ) -> str | None:
        """Progress lines, periodic checkpoints, evaluation results, restarts and failures;
        until the end."""
        config, learner = self.config, run.learner
        last_line = last_checkpoint = time.monotonic()
        stop_asked_at: float | None = None
        while not learner.finished.wait(_MONITOR_SECONDS):
            raise_if_stop_requested()
            failure = (
                feeder.failure
                or pool.check()
                or (evaluator.check() if evaluator is not None else None)
            )
            if failure:
                return failure
            now = time.monotonic()
            if self.stop_requested.is_set():
                if self.world_size == 1:
                    raise KeyboardInterrupt
                stop_asked_at = stop_asked_at or now
                if now - stop_asked_at > _AGREED_STOP_SECONDS:
                    log.print("no update to agree a stop on: stopping this learner alone")
                    return None
            if self.rank == 0 and now - last_line >= config.log_interval:
                report(run, log)
                last_line = now
            if self.rank == 0 and now - last_checkpoint >= config.checkpoint_interval:
                checkpoint()
                last_checkpoint = now
        failure = learner_failure(run, log)
        if failure:
            return failure
        if self.rank == 0:
            log.report_progress()
            if self._agreed_stop.is_set():
                log.print("the learners agreed to stop")
            else:
                log.print(f"reached total_steps {config.total_steps:,}")
        return None


def _ignore_signals(signums) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run_learner_actors(config: PolyConfig) -> str | None:
    """Several learners as Ray actors; returns the first failure, or None."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    world = config.num_learners
    num_gpus = 1 if select_device(config).type == "cuda" else 0
    if config.ray_address is None:
        store = tempfile.NamedTemporaryFile(prefix="beast-dist-", delete=False)  # noqa: SIM115
        store.close()
        os.unlink(store.name)  # the file store creates it; it must not exist yet
        init_method = f"file://{store.name}"
    else:
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
    remote = ray.remote(LearnerNode)
    here = ray.get_runtime_context().get_node_id()
    nodes = [
        remote.options(
            num_cpus=1,
            num_gpus=num_gpus,
            max_concurrency=2,  # run() in one thread, request_stop() in another
            scheduling_strategy=(
                NodeAffinitySchedulingStrategy(node_id=here, soft=False) if rank == 0 else "SPREAD"
            ),
        ).remote(config, rank, world, init_method)
        for rank in range(world)
    ]
    runs = [node.run.remote() for node in nodes]
    try:
        results = ray.get(runs)
    except KeyboardInterrupt:
        print(f"[beast] interrupted: stopping {world} learners", flush=True)
        for node in nodes:
            node.request_stop.remote()
        done, _ = ray.wait(runs, num_returns=len(runs), timeout=_LEARNERS_STOP_SECONDS)
        results = [ray.get(ref) for ref in done]
    except ray.exceptions.RayError as error:
        for node in nodes:
            node.request_stop.remote()
        return f"a learner failed: {str(error).strip().splitlines()[-1]}"
    finally:
        if init_method.startswith("file://"):
            path = init_method.removeprefix("file://")
            if os.path.exists(path):
                os.unlink(path)
    for node in nodes:
        ray.kill(node, no_restart=True)
    # Ray forwards the learners' stdout asynchronously: let their last lines arrive.
    time.sleep(_LOG_FLUSH_SECONDS)
    failures = [result for result in results if result]
    return failures[0] if failures else None


def train(config: PolyConfig) -> None:
    """Train until total_steps; returns normally after a clean shutdown."""
    # Fail on a bad env before starting Ray (seconds) and any process.
    probe = envs.make(config.env, seed=config.seed, episodic_life=config.episodic_life)
    probe.close()
    check_backend(config.env, config.env_backend)
    previous = stop_on_signals()
    failure: str | None = None
    try:
        with ray_session(config) as where:
            if previous:
                # ray.init installs a SIGTERM handler that exits without a checkpoint.
                signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
            try:
                print(
                    f"[beast] polybeast on {where}: {config.servers} env servers x"
                    f" {config.servers_envs} envs, {config.num_learners} learner(s)",
                    flush=True,
                )
                if config.num_learners == 1:
                    failure = LearnerNode(config).run()
                else:
                    failure = _run_learner_actors(config)
            except KeyboardInterrupt:
                print("[beast] interrupted", flush=True)
            finally:
                # Shutting Ray down must not be cut short by a second Ctrl-C.
                _ignore_signals(previous)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if failure:
        raise TrainingError(failure)
