"""Faults with real processes: what dies, and that nothing is lost, doubled or left behind.

The rollout-slot protocol (beast/experience/rollout_slots.py) is checked first on its own: a process
writing rollouts is SIGKILLed again and again, sometimes inside a queue call, and after
each death every slot must be on a queue or marked as the dead writer's, and exactly
once on a queue after `reclaim`.

Then whole runs (monobeast in this process, tests/support/in_process.py, so that the run's
slots and replays can be inspected after it; its actors are real processes of the fork
server): the fork server killed mid-run, every actor killed at once again and again,
actors killed at random while they publish rollouts, sequences and transitions, and a
polybeast env server killed. After each: the slot census is exact, every process the
run started is gone, and /dev/shm holds nothing new. What a replay holds after kills
is checked against CartPole's own dynamics: a sequence or a transition window whose
steps do not follow from each other was written by two writers, or half-written.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

import beast.run.runner
from beast.acting.supervisor import ActorPool
from beast.algos.policies import CategoricalPolicy
from beast.experience.rollout_slots import RolloutBuffers, owner_id, rollout_spec
from beast.fields import box_obs, is_core_state
from beast.native import NO_OWNER, IndexQueue
from beast.util.interrupts import raise_if_stop_requested, raise_keyboard_interrupt, stop_on_signals
from beast.util.threads import process_alive
from tests.support.in_process import run_monobeast, run_polybeast
from tests.support.runs import shm_entries

# --- The slot protocol, one writer killed again and again --------------------------------

UNROLL = 2  # a publish every second write: as many publishes as possible per second


def _write_rollouts(buffers, sources, incarnation, learner_pid, started):
    """Child: actor 0's `incarnation`-th process, writing rollouts until it is killed."""
    writer = buffers.writer(
        0, sources, first_id=0, id_stride=1, learner_pid=learner_pid, incarnation=incarnation
    )
    started.put(0)
    while writer.write(()):
        pass


def _move_slots(buffers, incarnation, started):
    """Child: `_Slots`' two marked queue calls and nothing else, taking a free slot and
    handing it on, so that a stop lands in one within a few tries. It hands the slot back
    to the free queue rather than to the full one: it never waits for a learner, and the
    marks and the reclaim are the same."""
    holder = owner_id(0, incarnation)
    started.put(0)
    while True:
        index = buffers.free_queue.get(owners=buffers.slot_owner, owner=holder)
        buffers.free_queue.put(index, owners=buffers.slot_owner, owner=NO_OWNER)


class _Learner(threading.Thread):
    """Takes full slots and frees them, as `RolloutSource` does; `pause` stops it between
    two slots, so that it holds none while the test counts them."""

    def __init__(self, buffers: RolloutBuffers) -> None:
        super().__init__(name="learner", daemon=True)
        self.buffers = buffers
        self.running = threading.Event()
        self.paused = threading.Event()
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            if not self.running.is_set():
                self.paused.set()
                self.running.wait(0.01)
                continue
            self.paused.clear()
            try:
                self.buffers.free(self.buffers.take_full(0.01))
            except queue.Empty:
                continue

    def pause(self) -> None:
        self.running.clear()
        self.paused.clear()
        assert self.paused.wait(5), "the learner thread did not pause"

    def resume(self) -> None:
        self.running.set()


def _holding_a_lock(pid: int, queues: list[IndexQueue]) -> bool:
    """Stop `pid`; True (left stopped) when it holds one of `queues`' locks, else it is
    let go on. A probe call that blocks tells."""
    os.kill(pid, signal.SIGSTOP)
    while _proc_state(pid) != "T":
        time.sleep(0.0005)
    for q in queues:
        probe = threading.Thread(target=q.qsize, name="probe", daemon=True)
        probe.start()
        probe.join(0.002)
        if probe.is_alive():
            probe.join(0.2)  # a second look: blocked, not merely slow to start
            if probe.is_alive():
                return True
    os.kill(pid, signal.SIGCONT)
    return False


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.usefixtures("watchdog")  # a hang must fail, not stall the suite
def test_a_writer_killed_anywhere_loses_and_doubles_no_slot():
    """20 SIGKILLs of a slot writer: a rollout writer at random instants, or (every other
    one) a process doing only a writer's queue calls, while it holds a queue's lock. After
    each, every slot is on a queue or marked as the dead writer's (both, for the one it
    was moving, which reclaim resolves), and after `reclaim` each is on a queue once."""
    spec = rollout_spec(
        unroll_length=UNROLL,
        obs=box_obs((2,), np.float32),
        record=CategoricalPolicy(2).record_spec(),
    )
    sources = {
        key: torch.zeros((1, *field.shape[1:]), dtype=field.dtype).numpy()
        for key, field in spec.items()
        if key != "rollout_id" and not is_core_state(key)
    }
    num_slots = 16
    buffers = RolloutBuffers(spec, num_slots)
    queues = [buffers.free_queue, buffers.full_queue]
    learner = _Learner(buffers)
    learner.start()
    # Fork: the children need only numpy and the native queue, and start in milliseconds.
    # The learner thread is paused while they fork.
    ctx = torch.multiprocessing.get_context("fork")
    rng = random.Random(0)
    reclaimed = 0
    for incarnation in range(20):
        started = IndexQueue(1)
        in_lock = incarnation % 2 == 1
        if in_lock:
            target, args = _move_slots, (buffers, incarnation, started)
        else:
            target, args = _write_rollouts, (buffers, sources, incarnation, os.getpid(), started)
        child = ctx.Process(target=target, args=args, name=f"writer-{incarnation}", daemon=True)
        child.start()
        started.get(timeout=10)
        learner.resume()
        if in_lock:
            deadline = time.monotonic() + 5
            while not _holding_a_lock(child.pid, queues) and time.monotonic() < deadline:
                time.sleep(rng.uniform(0, 0.001))
        else:
            time.sleep(rng.uniform(0, 0.02))
        child.kill()
        child.join(5)
        learner.pause()
        census = buffers.census()
        assert census.lost == [] and census.doubled == [], (incarnation, census)
        assert census.free + census.full + census.held == num_slots, census
        reclaimed += buffers.reclaim(0, incarnation)
        census = buffers.census()
        assert census.lost == [] and census.doubled == [] and census.held == 0, census
        assert census.free + census.full == num_slots, census
        assert buffers.slot_owner.held() == {}
    recovered = sum(q.owner_deaths for q in queues)
    learner.stopped = True
    learner.join(5)
    assert recovered >= 6, f"only {recovered} kills landed inside a queue call"
    print(f"20 writer kills ({recovered} inside a queue call), {reclaimed} slots reclaimed")


# --- Whole runs ---------------------------------------------------------------------------

# A short IMPALA CartPole run, logging often: the fault threads watch logs.csv for progress.
SMALL_RUN = ["--env", "CartPole-v1", "--num_actors", "3", "--num_envs_per_actor", "2"]
SMALL_RUN += ["--unroll_length", "5", "--batch_size", "4", "--num_threads", "1"]
# Runs end by SIGINT, or by a fault.
SMALL_RUN += ["--log_interval", "0.3", "--checkpoint_interval", "1000", "--total_steps", str(10**9)]
# Seconds a fault thread waits for the run to get somewhere.
PROGRESS_SECONDS = 60.0


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.fixture
def pools(monkeypatch) -> list[ActorPool]:
    """The ActorPool of each run this test starts in its process, recorded."""
    recorded: list[ActorPool] = []

    class RecordedPool(ActorPool):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            recorded.append(self)

    monkeypatch.setattr(beast.run.runner, "ActorPool", RecordedPool)
    return recorded


class Faults:
    """What a fault thread sees of a run in this process (`run_with_faults`): its actors,
    its progress; and what it did to them."""

    def __init__(self, pools: list[ActorPool], log: str) -> None:
        self._pools = pools
        self._log = log
        self.seen: set[int] = set()  # every process of the run it saw (actors, servers)
        self.killed: set[int] = set()
        # Set when the run has returned: what the thread waits for will not come, and a
        # Ctrl-C from it would interrupt whatever the test process runs next.
        self.run_over = threading.Event()

    def _still_running(self, waiting_for: str) -> None:
        assert not self.run_over.is_set(), f"the run ended while waiting for {waiting_for}"

    def _pool(self) -> ActorPool:
        deadline = time.monotonic() + PROGRESS_SECONDS
        while not self._pools:
            self._still_running("its actor pool")
            assert time.monotonic() < deadline, "the run built no actor pool"
            time.sleep(0.05)
        return self._pools[-1]

    def actor_pids(self, other_than: set[int] = frozenset()) -> list[int]:
        """The pids of every actor, once each is started and none is in `other_than`."""
        pool = self._pool()
        deadline = time.monotonic() + PROGRESS_SECONDS
        while True:
            pids = [worker.pid if worker else None for worker in pool.workers]
            if None not in pids and not set(pids) & other_than:
                self.seen.update(pids)
                return pids
            self._still_running(f"its actors to (re)start: {pids}")
            assert time.monotonic() < deadline, f"actors not all (re)started: {pids}"
            time.sleep(0.05)

    def rows(self) -> int:
        try:
            with open(self._log) as f:
                return max(0, sum(1 for _ in f) - 1)
        except FileNotFoundError:
            return 0

    def wait_for_rows(self, count: int) -> None:
        deadline = time.monotonic() + PROGRESS_SECONDS
        while self.rows() < count:
            self._still_running(f"{count} rows in {self._log}")
            assert time.monotonic() < deadline, f"{self._log} did not reach {count} rows"
            time.sleep(0.05)

    def wait_for_progress(self) -> None:
        """Until the run logs two more rows: it trains on."""
        self.wait_for_rows(self.rows() + 2)

    @property
    def kills(self) -> int:
        return len(self.killed)

    def kill(self, pid: int) -> None:
        self.seen.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.killed.add(pid)

    @staticmethod
    def stop_run() -> None:
        """Ctrl-C, as a user stops a run."""
        os.kill(os.getpid(), signal.SIGINT)


def run_with_faults(
    main: Callable[[list[str]], subprocess.CompletedProcess],
    argv: list[str],
    faults: Faults,
    inject: Callable[[Faults], None],
) -> subprocess.CompletedProcess:
    """`main(argv)` (tests/support/in_process.py) while `inject(faults)` runs in a thread; returns
    the run's CompletedProcess. Checks what every run must leave: no traceback, nothing new
    in /dev/shm, no process the thread saw still alive."""
    before = shm_entries()
    failure: list[BaseException] = []

    def thread() -> None:
        try:
            inject(faults)
        except BaseException as error:
            failure.append(error)
            if not faults.run_over.is_set():
                Faults.stop_run()
        # A run going on long after the thread is done (a lost stop) would hang the suite:
        # it fails the test, and is stopped again until it ends.
        if not faults.run_over.wait(PROGRESS_SECONDS):
            failure.append(
                AssertionError(f"the run went on {PROGRESS_SECONDS:.0f} s after its faults")
            )
            while not faults.run_over.wait(5.0):
                Faults.stop_run()

    # The run swaps in its own SIGINT handler and puts this one back when it ends: a stop
    # that lands after that must not interrupt the test.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    injector = threading.Thread(target=thread, name="faults", daemon=True)
    try:
        injector.start()
        try:
            result = main(argv)
        finally:
            faults.run_over.set()
        injector.join(PROGRESS_SECONDS)
    finally:
        signal.signal(signal.SIGINT, previous)
    # A run that died first says why here, where the thread would only say it ended.
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    if failure:
        raise failure[0]
    deadline = time.monotonic() + 30  # a bound on leftovers, not on speed
    while (alive := [pid for pid in faults.seen if process_alive(pid)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert alive == [], f"processes of the run still alive: {alive}"
    assert shm_entries() - before == set()
    return result


def run_monobeast_with_faults(
    argv: list[str], tmp_path, pools: list[ActorPool], inject: Callable[[Faults], None]
) -> tuple[subprocess.CompletedProcess, Faults]:
    """monobeast with `argv`, its run "x" in `tmp_path`, under `run_with_faults`."""
    faults = Faults(pools, str(tmp_path / "x" / "logs.csv"))
    argv = [*argv, "--savedir", str(tmp_path), "--xpid", "x"]
    return run_with_faults(run_monobeast, argv, faults, inject), faults


def assert_slots_exact(pool: ActorPool) -> None:
    """Every rollout slot once on a queue or held by a (dead) actor: none lost, none
    doubled."""
    census = pool.sink.census()
    assert census.lost == [] and census.doubled == [], census
    assert census.free + census.full + census.held == pool.sink.num_buffers, census


def test_killed_fork_server_is_replaced_until_the_restart_limit_stops_the_run(tmp_path, pools):
    """The fork server SIGKILLed three times with --max_actor_restarts 2: twice its actors
    are replaced through a new one and the run trains on; the third time the run stops
    with one line and a final checkpoint."""

    def inject(faults: Faults) -> None:
        faults.wait_for_rows(1)
        pids: set[int] = set()
        for kill in range(3):
            current = faults.actor_pids(other_than=pids)
            pids = set(current)
            server = _parent_pid(current[0])
            assert server is not None and server != os.getpid()
            faults.kill(server)
            if kill < 2:
                faults.actor_pids(other_than=pids)
                faults.wait_for_progress()

    argv = [*SMALL_RUN, "--max_actor_restarts", "2"]
    result, faults = run_monobeast_with_faults(argv, tmp_path, pools, inject)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "monobeast.py: error: the actors' fork server died; 2 fork servers were already"
        " replaced in the last 60 s (--max_actor_restarts 2), so the run stops\n"
    )
    assert len(re.findall(r"fork server died; reclaimed \d+ slot", result.stdout)) == 2
    assert "starting a replacement" not in result.stdout  # not counted as actor deaths
    assert (tmp_path / "x" / "model.tar").is_file()
    assert_slots_exact(pools[0])
    print(f"survived {faults.kills - 1} fork-server kills; the 3rd stopped the run")


def test_every_actor_killed_at_once_again_and_again_is_replaced(tmp_path, pools):
    """Three rounds of SIGKILL to all 3 actors at once, 9 restarts under
    --max_actor_restarts 10: each round is replaced and the run trains on."""

    def inject(faults: Faults) -> None:
        faults.wait_for_rows(1)
        pids: set[int] = set()
        for _ in range(3):
            current = faults.actor_pids(other_than=pids)
            pids = set(current)
            for pid in current:
                faults.kill(pid)
            faults.actor_pids(other_than=pids)
            faults.wait_for_progress()
        faults.stop_run()

    argv = [*SMALL_RUN, "--max_actor_restarts", "10"]
    result, faults = run_monobeast_with_faults(argv, tmp_path, pools, inject)
    assert result.returncode == 0, result.stderr
    assert faults.kills == 9
    assert result.stdout.count("killed by SIGKILL; reclaimed") == 9
    assert_slots_exact(pools[0])
    print(f"survived {faults.kills} actor kills, 3 at a time")


@pytest.mark.parametrize("mode", [[], ["--serial", "--num_actors", "1"]], ids=["threads", "serial"])
def test_a_stop_whose_interrupt_was_dropped_still_stops_the_run(tmp_path, pools, mode):
    """A stop signal's KeyboardInterrupt can be raised inside a finalizer, where Python
    prints it and drops it (CI: an R2D2 run trained on for 17 minutes after the test's
    Ctrl-C, its stderr saying "Exception ignored in: <Finalize object, dead>"). The flag
    the handler sets stops the run all the same, with its final checkpoint."""

    def inject(faults: Faults) -> None:
        faults.wait_for_rows(1)
        with contextlib.suppress(KeyboardInterrupt):  # dropped, as a finalizer drops it
            raise_keyboard_interrupt(signal.SIGINT, None)

    # Bounded, should the stop be lost: the run then ends at total_steps.
    argv = [*SMALL_RUN, *mode, "--total_steps", "400000"]
    started = time.monotonic()
    result, _ = run_monobeast_with_faults(argv, tmp_path, pools, inject)
    assert result.returncode == 0, result.stderr
    assert "interrupted" in result.stdout, result.stdout[-2000:]
    assert (tmp_path / "x" / "model.tar").is_file()
    print(f"stopped after {time.monotonic() - started:.1f} s")


def test_a_dropped_stop_is_the_main_threads_run_until_the_next_run_starts():
    """The flag a stop signal sets stops the run in the main thread, whose handlers took
    the signal; a run in another thread (Ray Tune's trial, beast.train in a thread) keeps
    going, and the next run in the main thread starts afresh."""
    with contextlib.suppress(KeyboardInterrupt):
        raise_keyboard_interrupt(signal.SIGINT, None)
    raised = []

    def in_a_thread() -> None:
        try:
            raise_if_stop_requested()
        except KeyboardInterrupt:
            raised.append("thread")

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert raised == []
    with pytest.raises(KeyboardInterrupt):
        raise_if_stop_requested()
    previous = stop_on_signals()
    try:
        raise_if_stop_requested()  # cleared for the new run
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def cartpole_step(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """CartPole-v1's next observations from `obs` float [N, 4] (x, x_dot, theta,
    theta_dot) and `action` int [N]: the cart-pole equations of Barto, Sutton & Anderson
    (1983) under Gymnasium's constants, one explicit Euler step of tau = 0.02 s."""
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass, polemass_length = masscart + masspole, masspole * length
    x, x_dot, theta, theta_dot = np.asarray(obs, dtype=np.float64).T
    force = np.where(np.asarray(action) == 1, force_mag, -force_mag)
    cos, sin = np.cos(theta), np.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
    theta_acc = (gravity * sin - cos * temp) / (
        length * (4.0 / 3.0 - masspole * cos**2 / total_mass)
    )
    x_acc = temp - polemass_length * theta_acc * cos / total_mass
    return np.stack(
        [
            x + tau * x_dot,
            x_dot + tau * x_acc,
            theta + tau * theta_dot,
            theta_dot + tau * theta_acc,
        ],
        axis=1,
    )


def assert_steps_follow(obs, action, follows) -> int:
    """obs[i, 1] is CartPole's step from obs[i, 0] under action[i] wherever `follows[i]`;
    returns how many pairs were checked. (float32 observations of a float64 state:
    one step of the equations moves a rounding error of 1e-7 by far less than 1e-4; a
    pair from two different episodes or writers differs by 1e-2 or more.)"""
    obs, action, follows = (np.asarray(a) for a in (obs, action, follows))
    expected = cartpole_step(obs[follows, 0], action[follows])
    np.testing.assert_allclose(obs[follows, 1], expected, atol=1e-4)
    return int(follows.sum())


def check_sequences(replay) -> int:
    """Every sequence that can be sampled (priority > 0) is one writer's consecutive steps;
    and no slot stays claimed by a dead writer (each can be claimed again)."""
    live = torch.nonzero(replay.tree.get(torch.arange(replay.capacity)) > 0).flatten()
    obs, action = replay.tensors["obs"][live], replay.tensors["action"][live]
    done, mask = replay.tensors["done"][live], replay.tensors["mask"][live]
    pairs = assert_steps_follow(
        torch.stack([obs[:, :-1], obs[:, 1:]], dim=2).flatten(0, 1),
        action[:, :-1].flatten(),
        (mask[:, :-1] & ~done[:, 1:]).flatten(),
    )
    claimed = {replay.tree.claim()[0] for _ in range(replay.capacity)}
    assert claimed == set(range(replay.capacity))
    return pairs


def check_transitions(replay) -> int:
    """Every transition that can be sampled (priority > 0) spans its ring's consecutive
    steps from one writer: each step of its window follows from the one before."""
    ring = replay.ring
    live = torch.nonzero(replay.tree.get(torch.arange(replay.capacity)) > 0).flatten()
    envs, starts = live // ring, live % ring
    steps = replay.tensors["n_steps"][envs, starts].long()
    offsets = torch.arange(replay.n_step)
    rows = (starts[:, None] + offsets) % ring  # [N, n]: the window's steps but its last
    following = (rows + 1) % ring
    env_rows = envs[:, None].expand_as(rows)
    obs = replay.tensors["obs"]
    return assert_steps_follow(
        torch.stack([obs[env_rows, rows], obs[env_rows, following]], dim=2).flatten(0, 1),
        replay.tensors["action"][env_rows, rows].flatten(),
        ((offsets < steps[:, None]) & ~replay.tensors["done"][env_rows, following]).flatten(),
    )


EXPERIENCES = {
    # Rollouts, with central inference: the request table's groups are reset too.
    "rollouts": (["--policy", "central"], None),
    "sequences": (
        ["--algo", "r2d2", "--replay_size", "200", "--min_replay_size", "20"]
        + ["--samples_per_insert", "0.5", "--seq_len", "10", "--seq_overlap", "5"]
        + ["--burn_in", "5"],
        check_sequences,
    ),
    "transitions": (
        ["--algo", "dqn", "--replay_size", "400", "--learning_starts", "20"]
        + ["--samples_per_insert", "0.5"],
        check_transitions,
    ),
}


KILLS = 20  # actors killed in each run of the test below


@pytest.mark.parametrize("experience", EXPERIENCES)
def test_actors_killed_at_random_while_they_publish(tmp_path, pools, experience):
    """20 SIGKILLs at random instants, 0.05-0.3 s apart (counted, not timed: the test
    stops the run after the last): whatever an actor was doing (taking slots, publishing
    a rollout, inserting a sequence or a transition, waiting for central inference), its
    replacement takes over and nothing it held is lost, doubled or left half-written
    where the learner can sample it."""
    flags, check = EXPERIENCES[experience]
    rng = random.Random(0)

    def inject(faults: Faults) -> None:
        faults.wait_for_rows(1)
        while faults.kills < KILLS:
            time.sleep(rng.uniform(0.05, 0.3))
            pool = faults._pool()
            pids = [worker.pid for worker in pool.workers if worker and worker.pid]
            faults.seen.update(pids)
            pids = [pid for pid in pids if pid not in faults.killed]
            if pids:
                faults.kill(rng.choice(pids))
        faults.actor_pids(other_than=faults.killed)  # every kill seen and replaced
        faults.stop_run()

    argv = [*SMALL_RUN, *flags, "--max_actor_restarts", "1000"]
    result, faults = run_monobeast_with_faults(argv, tmp_path, pools, inject)
    assert result.returncode == 0, result.stderr
    assert faults.kills == KILLS, faults.kills
    restarts = result.stdout.count("killed by SIGKILL")
    assert restarts == faults.kills, (faults.kills, restarts)
    if check is None:
        assert_slots_exact(pools[0])
        checked = "slots"
    else:
        checked = f"{check(pools[0].sink.replay)} step pairs"
    print(f"{experience}: survived {faults.kills} actor kills ({checked} checked)")


@pytest.fixture(scope="module")
def ray_address():
    """A Ray head for the polybeast run here, which joins it with --ray_address."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    yield cluster.address
    cluster.shutdown()


def test_killed_env_servers_are_restarted_and_the_learner_trains_on(
    tmp_path, monkeypatch, ray_address
):
    """Both of polybeast's env servers SIGKILLed at once: Ray restarts them, the learner
    drops what it had in flight from them and trains on; its rollout slots stay exact."""
    import beast.poly.trainer
    from beast.poly.feeders import ServerPool

    runs, server_pools = [], []
    build = beast.poly.trainer.build_run

    def build_run(*args, **kwargs):
        runs.append(build(*args, **kwargs))
        return runs[-1]

    class RecordedServers(ServerPool):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            server_pools.append(self)

    monkeypatch.setattr(beast.poly.trainer, "build_run", build_run)
    monkeypatch.setattr(beast.poly.trainer, "ServerPool", RecordedServers)

    def inject(faults: Faults) -> None:
        faults.wait_for_rows(1)
        pids = {index: info.pid for index, info in server_pools[0].known.items()}
        for pid in pids.values():
            faults.kill(pid)
        deadline = time.monotonic() + PROGRESS_SECONDS
        while any(server_pools[0].known[index].pid == pid for index, pid in pids.items()):
            assert time.monotonic() < deadline, "the env servers were not all restarted"
            time.sleep(0.05)
        faults.wait_for_progress()
        faults.stop_run()

    argv = ["--env", "CartPole-v1", "--num_env_servers", "2", "--num_envs_per_server", "2"]
    argv += ["--unroll_length", "5", "--batch_size", "4", "--num_threads", "1"]
    argv += ["--log_interval", "0.3", "--total_steps", str(10**9), "--ray_address", ray_address]
    argv += ["--savedir", str(tmp_path), "--xpid", "x"]
    faults = Faults([], str(tmp_path / "x" / "logs.csv"))
    result = run_with_faults(run_polybeast, argv, faults, inject)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(re.findall(r"env server \d restarted by Ray", result.stdout)) == 2
    census = runs[0].sink.census()
    assert census.lost == [] and census.doubled == [] and census.held == 0, census
    print(f"survived {faults.kills} env-server kills")
