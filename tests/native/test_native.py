"""IndexQueue contract: FIFO, timeouts, close, capacity, processes, owner death, owner
marks and reclaim.

Single-process contract tests run against both the native `IndexQueue` and
the pure-Python reference `PyIndexQueue`; a randomised test checks that the
two agree operation by operation. Every test runs under a SIGALRM watchdog
(the alarm also interrupts a blocked native get), so a hang fails the test.
"""

import importlib
import multiprocessing as mp
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time

import pytest

from beast.native import NO_OWNER, IndexQueue, PyIndexQueue, QueueClosed, SlotOwners

# Every test here blocks in native code: a hang must fail, not stall the suite.
pytestmark = pytest.mark.usefixtures("watchdog")

IMPLS = [IndexQueue, PyIndexQueue]
# Seconds before the watchdog fails a test; a spawned child alone needs ~3 s
# to import torch on a loaded 2-core machine.
# Generous bound for "promptly": wakes take microseconds, but a loaded machine
# deschedules processes for seconds. Tests check outcomes and order (woken by what,
# never early); this bound only tells late from never, below the watchdog's 30 s.
PROMPT_SECONDS = 10.0
# Marks the end of the work for a forwarding worker.
SENTINEL = -1


def _state(stat_path):
    with open(stat_path) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_for_state(stat_path, state):
    """Poll a /proc stat file until the task is in `state` (watchdog-bounded)."""
    while _state(stat_path) != state:
        time.sleep(0.001)


def _wait_until_asleep(pid=None, tid=None):
    """Wait until a process (main thread) or one of our threads sleeps; after
    it announced it is about to call get, that sleep is the futex wait."""
    path = f"/proc/self/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    _wait_for_state(path, "S")


# Children (module level so that spawn and forkserver can pickle them).


def _forward(src, dst, count):
    for _ in range(count):
        dst.put(src.get(timeout=10))


def _forward_until_sentinel(src, dst):
    while (index := src.get(timeout=10)) != SENTINEL:
        dst.put(index)


def _report_close(q, ready, woken):
    ready.put(0)
    try:
        q.get()
    except QueueClosed:
        woken.put(0)
        return
    raise SystemExit("get returned a value from a closed queue")


def _block_in_get(q, ready):
    ready.put(0)
    q.get()


def _churn(q):
    while True:
        q.put(q.get())


def _put_all(q, indices):
    for index in indices:
        q.put(index)


def _drain(q):
    items = []
    while True:
        try:
            items.append(q.get(timeout=0))
        except queue.Empty:
            return items


# Single-process contract, both implementations.


@pytest.mark.parametrize("impl", IMPLS)
def test_fifo_order_and_qsize(impl):
    q = impl(5)
    assert q.capacity == 5 and q.qsize() == 0
    for index in [3, 0, 2**31 - 1, -(2**31), 3]:
        q.put(index)
    assert q.qsize() == 5
    assert [q.get(timeout=0) for _ in range(5)] == [3, 0, 2**31 - 1, -(2**31), 3]
    assert q.qsize() == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_wraps_around_the_ring(impl):
    q = impl(3)
    for i in range(10):
        q.put(i)
        q.put(i + 100)
        assert [q.get(timeout=0), q.get(timeout=0)] == [i, i + 100]


@pytest.mark.parametrize("impl", IMPLS)
def test_put_on_full_queue_raises(impl):
    q = impl(2)
    q.put(0)
    q.put(1)
    with pytest.raises(RuntimeError, match="full"):
        q.put(2)
    assert q.qsize() == 2 and q.get(timeout=0) == 0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("timeout", [0.0, 0.2])
def test_get_times_out_with_queue_empty(impl, timeout):
    q = impl(1)
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=timeout)
    elapsed = time.monotonic() - start
    # Never early: both sides use CLOCK_MONOTONIC and the deadline is taken
    # after `start`. Late by up to PROMPT_SECONDS of scheduler noise.
    assert timeout <= elapsed < timeout + PROMPT_SECONDS


@pytest.mark.parametrize("impl", IMPLS)
def test_huge_timeouts_are_accepted(impl):
    q = impl(2)
    q.put(1)
    q.put(2)
    assert [q.get(timeout=float("inf")), q.get(timeout=1e30)] == [1, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_invalid_arguments(impl):
    for capacity in [0, -1]:
        with pytest.raises(ValueError):
            impl(capacity)
    with pytest.raises(TypeError):
        impl(2.0)
    q = impl(2)
    for index in [2**31, -(2**31) - 1]:
        with pytest.raises(ValueError):
            q.put(index)
    with pytest.raises(TypeError):
        q.put(1.0)
    with pytest.raises(ValueError):
        q.get(timeout=-1)
    assert q.qsize() == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_put_and_get_after_close_raise(impl):
    q = impl(2)
    q.put(1)
    q.close()
    q.close()  # idempotent
    with pytest.raises(QueueClosed):
        q.put(2)
    # Closing abandons queued values: consumers stop at once on shutdown.
    with pytest.raises(QueueClosed):
        q.get(timeout=0)
    assert q.qsize() == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_close_wakes_every_blocked_thread(impl):
    q = impl(1)
    outcomes, tids = queue.Queue(), queue.Queue()

    def getter():
        tids.put(threading.get_native_id())
        try:
            q.get(timeout=60)  # past the watchdog: only close can end it in the test
        except QueueClosed:
            outcomes.put("closed")

    threads = [threading.Thread(target=getter, name=f"getter-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    for _ in threads:
        _wait_until_asleep(tid=tids.get(timeout=5))
    q.close()
    for thread in threads:
        thread.join(PROMPT_SECONDS)
        assert not thread.is_alive()
    assert [outcomes.get_nowait() for _ in threads] == ["closed"] * 3


@pytest.mark.parametrize("impl", IMPLS)
def test_put_wakes_blocked_getter_without_holding_the_gil(impl):
    # If the blocked get held the GIL, this thread could not run `put` until
    # the get timed out, and the getter would see queue.Empty.
    q = impl(1)
    got, tids = queue.Queue(), queue.Queue()

    def getter():
        tids.put(threading.get_native_id())
        got.put(q.get(timeout=60))  # past the watchdog: only the put can end it in the test

    thread = threading.Thread(target=getter, name="getter")
    thread.start()
    _wait_until_asleep(tid=tids.get(timeout=5))
    q.put(7)
    assert got.get(timeout=PROMPT_SECONDS) == 7
    thread.join(5)


def _signal_main_when_asleep(then=None, handled=None) -> threading.Thread:
    """A thread that sends SIGUSR1 to the main thread once it sleeps (in the call the test
    makes next), then, with `then`, waits for the handler to have run and the main
    thread to sleep again, and calls `then` (which wakes it). Order, not timers: a
    signal timed to arrive mid-call arrives before or after it on a loaded machine."""
    main = threading.main_thread()

    def run():
        _wait_until_asleep(tid=main.native_id)
        signal.pthread_kill(main.ident, signal.SIGUSR1)
        if then is not None:
            while not handled:
                time.sleep(0.001)
            _wait_until_asleep(tid=main.native_id)
            then()

    thread = threading.Thread(target=run, name="signaller", daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("impl", IMPLS)
def test_signal_during_get_runs_handler_then_keeps_waiting(impl):
    handled = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(signum))
    try:
        q = impl(1)
        signaller = _signal_main_when_asleep(lambda: q.put(7), handled)
        # Woken by the put, not by the signal: the handler ran and the get went on
        # waiting (60 s: past the watchdog, so a get that ended early cannot pass).
        assert q.get(timeout=60) == 7
        assert handled == [signal.SIGUSR1]
        signaller.join(5)
    finally:
        signal.signal(signal.SIGUSR1, previous)


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("impl", IMPLS)
def test_raising_signal_handler_interrupts_blocked_get(impl):
    # What makes Ctrl-C work on a learner blocked on an empty full-queue.
    def raise_interrupt(signum, frame):
        raise _Interrupt

    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    try:
        q = impl(1)
        signaller = _signal_main_when_asleep()
        with pytest.raises(_Interrupt):
            q.get()  # no timeout: only the signal ends it (the watchdog a hang)
        signaller.join(5)
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("impl", IMPLS)
def test_marked_moves_record_the_holder_and_contents_lists_the_queue(impl):
    owners, q = SlotOwners(4), impl(4)
    for index in range(4):
        q.put(index)
    assert q.get(timeout=0, owners=owners, owner=7) == 0
    assert q.get(timeout=0, owners=owners, owner=2**40) == 1  # ids are int64
    assert owners.held() == {0: 7, 1: 2**40} and owners.held_by(7) == [0]
    q.put(0, owners=owners)  # back on a queue: no holder
    assert owners.held() == {1: 2**40}
    assert q.contents() == [2, 3, 0]
    with pytest.raises(ValueError):
        q.put(4, owners=owners)  # not one of the marks' slots
    with pytest.raises(ValueError):
        q.get(timeout=0, owners=owners, owner=-2)
    with pytest.raises(TypeError):
        q.get(timeout=0, owners=owners.tensor, owner=1)
    assert q.contents() == [2, 3, 0]  # the failed calls moved nothing
    q.close()
    assert q.contents() == [2, 3, 0]  # still reported after close


@pytest.mark.parametrize("impl", IMPLS)
def test_get_marked_leaves_an_index_outside_the_marks_queued(impl):
    owners, q = SlotOwners(2), impl(2)
    q.put(5)
    with pytest.raises(ValueError):
        q.get(timeout=0, owners=owners, owner=1)
    assert q.contents() == [5] and owners.held() == {}


@pytest.mark.parametrize("impl", IMPLS)
def test_reclaim_returns_a_dead_owners_slot_exactly_once(impl):
    """The four states a dead owner can leave a slot in (index_queue.h, "Owner marks")."""
    owners, free, full = SlotOwners(4), impl(4), impl(4)
    for index in range(4):
        free.put(index)
    held = free.get(timeout=0, owners=owners, owner=3)  # taken: on no queue
    published = free.get(timeout=0, owners=owners, owner=3)
    full.put(published)  # died after the push, before clearing its mark
    owners.tensor[free.contents()[0]] = 3  # died after marking, before the pop
    mine, other = free.contents()
    assert owners.held() == {held: 3, published: 3, mine: 3}
    assert free.reclaim(held, 3, owners, full)
    assert not free.reclaim(published, 3, owners, full)
    assert not free.reclaim(mine, 3, owners, full)
    assert not free.reclaim(other, 3, owners, full)  # never its own: untouched
    assert owners.held() == {}
    assert sorted(free.contents() + full.contents()) == [0, 1, 2, 3]
    # Another owner's slot is not reclaimed for this one.
    taken = free.get(timeout=0, owners=owners, owner=4)
    assert not free.reclaim(taken, 3, owners, full) and owners.held() == {taken: 4}
    with pytest.raises(ValueError):
        free.reclaim(taken, NO_OWNER, owners, full)
    free.close()
    with pytest.raises(QueueClosed):
        free.reclaim(taken, 4, owners, full)
    assert owners.held() == {taken: 4}  # a closed queue changes nothing


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_reference(seed):
    rng = random.Random(seed)
    capacity = rng.randint(1, 6)
    native, reference = IndexQueue(capacity), PyIndexQueue(capacity)
    close_step = rng.randint(200, 600)  # past the end for some seeds: never closed

    # Owner marks of 8 slots for each, and a second queue each for reclaim.
    marks = {native: SlotOwners(8), reference: SlotOwners(8)}
    full = {native: IndexQueue(8), reference: PyIndexQueue(8)}

    def call(q, op, args):
        if op in ("get_marked", "put_marked"):
            *rest, owner = args
            return getattr(q, op.split("_")[0])(*rest, owners=marks[q], owner=owner)
        if op == "reclaim":
            return q.reclaim(*args, marks[q], full[q])
        return getattr(q, op)(*args)

    def outcome(q, op, args):
        try:
            return "ok", call(q, op, args)
        except Exception as e:
            return "raised", type(e)

    ops = ["put", "get", "put_marked", "get_marked", "reclaim", "qsize", "contents", "capacity"]
    for step in range(400):
        op = rng.choices(ops, weights=[10, 10, 5, 5, 3, 2, 2, 1])[0]
        if step == close_step:
            op = "close"
        if op == "put":
            # Mostly valid int32, sometimes just outside the range.
            args = (rng.choice([rng.randint(-(2**31), 2**31 - 1), 2**31, rng.randint(0, 9)]),)
        elif op == "get":
            args = (0,)
        elif op == "put_marked":
            args = (rng.randint(0, 9), rng.choice([NO_OWNER, rng.randint(0, 2)]))
        elif op == "get_marked":
            args = (0, rng.randint(0, 2))
        elif op == "reclaim":
            args = (rng.randint(0, 9), rng.randint(0, 2))
        else:
            args = ()
        if op == "capacity":
            assert native.capacity == reference.capacity
            continue
        expected = outcome(reference, op, args)
        assert outcome(native, op, args) == expected, f"step {step}: {op}{args}"
        assert marks[native].held() == marks[reference].held(), f"step {step}: {op}{args}"
        if rng.random() < 0.05:  # the reclaim queues move too
            index = rng.randint(0, 7)
            assert outcome(full[native], "put", (index,)) == outcome(
                full[reference], "put", (index,)
            )


# Native only: pickling, processes, owner death.


@pytest.mark.parametrize("make", [IndexQueue, SlotOwners])
def test_plain_pickle_is_refused(make):
    # Plain pickle copies the bytes: a private queue (or marks) nobody else would see.
    with pytest.raises(RuntimeError, match="multiprocessing"):
        pickle.loads(pickle.dumps(make(2)))


def test_missing_extension_says_how_to_build(monkeypatch):
    monkeypatch.setitem(sys.modules, "beast.native._ext", None)  # import of it fails
    monkeypatch.delitem(sys.modules, "beast.native")
    with pytest.raises(ImportError, match=r"run `pip install -e \.`"):
        importlib.import_module("beast.native")


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_put_and_get_across_a_child_process(method, processes, forkserver):
    ctx = forkserver if method == "forkserver" else mp.get_context(method)
    to_child, from_child = IndexQueue(8), IndexQueue(8)
    processes.start(ctx, _forward, to_child, from_child, 20, name=f"forwarder-{method}")
    received = []
    for index in range(20):
        to_child.put(index)
        received.append(from_child.get(timeout=20))
    assert received == list(range(20))
    processes[0].join(10)
    assert processes[0].exitcode == 0


def test_close_wakes_a_getter_blocked_in_another_process(processes, forkserver):
    q, ready, woken = IndexQueue(1), IndexQueue(1), IndexQueue(1)
    child = processes.start(forkserver, _report_close, q, ready, woken, name="closed-getter")
    ready.get(timeout=20)
    _wait_until_asleep(pid=child.pid)
    q.close()
    woken.get(timeout=PROMPT_SECONDS)
    child.join(10)
    assert child.exitcode == 0


@pytest.mark.parametrize(
    ("impl", "workers"),
    [(IndexQueue, "threads"), (PyIndexQueue, "threads"), (IndexQueue, "processes")],
)
def test_many_producers_and_consumers_lose_and_duplicate_nothing(
    impl, workers, processes, forkserver
):
    count = 10_000
    src, dst = impl(count + 3), impl(count)  # + room for the sentinels
    if workers == "threads":
        consumers = [
            threading.Thread(target=_forward_until_sentinel, args=(src, dst), name=f"consumer-{i}")
            for i in range(3)
        ]
        for consumer in consumers:
            consumer.start()
    else:
        consumers = [
            processes.start(forkserver, _forward_until_sentinel, src, dst, name=f"consumer-{i}")
            for i in range(2)
        ]
    # Two producers interleave their puts with the consumers' gets.
    producers = [
        threading.Thread(
            target=_put_all, args=(src, range(start, count, 2)), name=f"producer-{start}"
        )
        for start in range(2)
    ]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(10)
    for _ in consumers:
        src.put(SENTINEL)
    for consumer in consumers:
        consumer.join(20)
        assert not consumer.is_alive()
    assert sorted(_drain(dst)) == list(range(count))


def test_child_killed_while_waiting_does_not_block_survivors(processes, forkserver):
    q, ready = IndexQueue(4), IndexQueue(1)
    child = processes.start(forkserver, _block_in_get, q, ready, name="doomed-getter")
    ready.get(timeout=20)
    _wait_until_asleep(pid=child.pid)
    child.kill()
    child.join(5)
    # The dead waiter still counts as a sleeper; a live one must still wake.
    got, tids = queue.Queue(), queue.Queue()

    def getter():
        tids.put(threading.get_native_id())
        got.put(q.get(timeout=5))

    thread = threading.Thread(target=getter, name="survivor")
    thread.start()
    _wait_until_asleep(tid=tids.get(timeout=5))
    q.put(3)
    assert got.get(timeout=PROMPT_SECONDS) == 3
    thread.join(5)
    q.put(1)
    q.put(2)
    assert [q.get(timeout=0), q.get(timeout=0)] == [1, 2]
    assert q.owner_deaths == 0


def test_child_killed_holding_the_lock_is_recovered(processes, forkserver):
    """SIGKILL a child inside a queue call; the survivors recover the lock.

    The child moves indices around in a loop. We SIGSTOP it repeatedly; when
    a probe call from another thread then blocks, the child is stopped
    holding the lock, and we SIGKILL it there.
    """
    q = IndexQueue(8)
    for index in range(8):
        q.put(index)
    child = processes.start(forkserver, _churn, q, name="churner")
    stat = f"/proc/{child.pid}/stat"
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "never caught the child holding the lock"
        os.kill(child.pid, signal.SIGSTOP)
        _wait_for_state(stat, "T")
        probe = threading.Thread(target=q.qsize, name="probe", daemon=True)
        probe.start()
        probe.join(0.02)
        if probe.is_alive():
            probe.join(0.5)  # a second look: blocked, not merely slow to start
            if probe.is_alive():
                break
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.001)
    child.kill()
    child.join(5)
    probe.join(PROMPT_SECONDS)
    assert not probe.is_alive(), "survivor still blocked on a dead owner's lock"
    assert q.owner_deaths == 1
    # The ring is intact: at most the one index the child was moving is lost.
    items = _drain(q)
    assert len(items) == len(set(items)) >= 7 and set(items) <= set(range(8))
    q.put(42)
    assert q.get(timeout=0) == 42 and q.qsize() == 0
