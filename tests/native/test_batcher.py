"""Batcher contract: the request table of central inference (beast/native/batcher.c).

In the manner of scalable_agent's dynamic-batcher tests, this file lists the
whole contract: layout, min/max batch, batch window, collect timeout, close,
out-of-order answering, waking exactly the served actors, round-robin
fairness, many actors and servers moving 10k requests, processes, an actor
killed mid-request, and a server that stops answering. Single-process tests
run against both the native `Batcher` and the pure-Python reference
`PyBatcher`; a randomised test checks that the two agree call by call. Every
test runs under a SIGALRM watchdog (the alarm also interrupts a blocked
native wait), so a hang fails the test.
"""

import multiprocessing as mp
import pickle
import queue
import random
import signal
import threading
import time

import pytest
import torch

from beast.native import Batcher, BatcherStats, IndexQueue, PyBatcher, QueueClosed

# Every test here blocks in native code: a hang must fail, not stall the suite.
pytestmark = pytest.mark.usefixtures("watchdog")

IMPLS = [Batcher, PyBatcher]
# Seconds before the watchdog fails a test; a spawned child alone needs ~3 s
# to import torch on a loaded 2-core machine.
# Generous bound for "promptly": wakes take microseconds, but a loaded machine
# deschedules processes for seconds. Tests check outcomes and order (woken by what,
# never early); this bound only tells late from never, below the watchdog's 30 s.
PROMPT_SECONDS = 10.0
# How long an actor that must NOT be woken is watched before we believe it.
ASLEEP_SECONDS = 0.2


def _wait_until_asleep(pid=None, tid=None):
    """Poll /proc until a process (main thread) or one of our threads sleeps;
    after it announced it is about to block, that sleep is the futex wait."""
    path = f"/proc/self/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    while True:
        with open(path) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                return
        time.sleep(0.001)


def _requests(group, round_, count):
    """Distinct int64 request payloads: no two (group, round, env) share one."""
    return torch.arange(count, dtype=torch.int64) + group * 10_000_000 + round_ * 100


def _inference(obs):
    """The 'model' of these tests: any injective map shows a misrouted answer."""
    return obs * 2 + 1


# Children (module level so that spawn and forkserver can pickle them).


def _actor(batcher, group, obs, actions, rounds, seed, done):
    """Post random-count requests `rounds` times, checking every answer."""
    rng = random.Random(seed)
    first = batcher.slots(group).start
    for round_ in range(rounds):
        count = rng.randint(1, batcher.group_size)
        payload = _requests(group, round_, count)
        obs[first : first + count] = payload
        batcher.post(group, count)
        if not batcher.wait_answered(group, timeout=10):
            raise SystemExit(f"group {group} round {round_}: not answered")
        if not torch.equal(actions[first : first + count], _inference(payload)):
            raise SystemExit(f"group {group} round {round_}: wrong answer")
    done.put(group)


def _post_and_wait(batcher, group, ready, woken):
    """Post, announce it, then sleep until answered; report how it ended."""
    batcher.post(group)
    ready.put(group)
    try:
        woken.put(1 if batcher.wait_answered(group) else 0)
    except QueueClosed:
        woken.put(2)


def _collect_until_closed(batcher, server, ready, woken):
    ready.put(server)
    try:
        batcher.collect(server, 1)
    except QueueClosed:
        woken.put(3)


def _serve(batcher, server, obs, actions, max_batch, seed, batch_sizes):
    """An inference thread: gather, 'forward', scatter, then answer the batch
    in random order and random pieces, until the batcher closes."""
    rng = random.Random(seed)
    while True:
        try:
            indices = batcher.collect(server, max_batch, min_batch=1, timeout=0.05)
        except QueueClosed:
            return
        if len(indices) == 0:
            continue
        batch_sizes.append(len(indices))
        actions[indices] = _inference(obs.index_select(0, indices))
        order = indices[torch.randperm(len(indices))].tolist()
        while order:
            cut = rng.randint(1, len(order))
            batcher.answer(order[:cut])
            order = order[cut:]


# Layout and arguments, both implementations.


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("num_groups", "group_size", "num_servers"), [(1, 1, 1), (7, 3, 3)])
def test_layout_partitions_slots_and_groups(impl, num_groups, group_size, num_servers):
    b = impl(num_groups, group_size, num_servers)
    assert (b.num_groups, b.group_size, b.num_servers) == (num_groups, group_size, num_servers)
    assert b.num_slots == num_groups * group_size
    slots = [s for g in range(num_groups) for s in b.slots(g)]
    assert slots == list(range(b.num_slots))
    # Contiguous, non-empty ranges that cover every group exactly once.
    ranges = [b.server_groups(i) for i in range(num_servers)]
    assert [g for r in ranges for g in r] == list(range(num_groups))
    assert all(len(r) >= 1 for r in ranges)
    assert all(b.server_of(g) == i for i, r in enumerate(ranges) for g in r)
    assert all(b.pending(g) == 0 for g in range(num_groups))
    assert b.stats == BatcherStats(0, 0, 0, 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_invalid_arguments(impl):
    for sizes in [(0, 1), (1, 0), (-1, 2), (2, 2, 0), (2, 2, 3), (2**13, 2**12)]:
        with pytest.raises(ValueError):
            impl(*sizes)
    with pytest.raises(TypeError):
        impl(2.0, 1)
    b = impl(2, 3)
    for call in [
        lambda: b.post(2),
        lambda: b.post(-1),
        lambda: b.post(0, 0),
        lambda: b.post(0, 4),
        lambda: b.wait_answered(0, timeout=-1),
        lambda: b.collect(1, 1),
        lambda: b.collect(0, 0),
        lambda: b.collect(0, 2, min_batch=3),
        lambda: b.collect(0, 2, min_batch=0),
        lambda: b.collect(0, 2, batch_window=-1),
        lambda: b.collector(1, 1),
        lambda: b.collector(0, 2, min_batch=3),
        lambda: b.answer([6]),
        lambda: b.answer([-1]),
        lambda: b.reset_group(2),
        lambda: b.pending(2),
    ]:
        with pytest.raises(ValueError):
            call()
    assert b.stats == BatcherStats(0, 0, 0, 0)


# The request life cycle, both implementations.


@pytest.mark.parametrize("impl", IMPLS)
def test_post_collect_answer_round_trip(impl):
    b = impl(3, 4)
    assert b.wait_answered(1, timeout=0)  # nothing posted: nothing to wait for
    b.post(1)
    b.post(2, 2)  # only the first 2 envs of group 2
    assert (b.pending(1), b.pending(2)) == (4, 2)
    assert not b.wait_answered(1, timeout=0)
    indices = b.collect(0, 100, timeout=0)
    assert indices.dtype == torch.int64
    assert indices.tolist() == [4, 5, 6, 7, 8, 9]  # ascending, for index_select
    assert b.collect(0, 100, timeout=0).numel() == 0  # taken: not collected twice
    b.answer(indices)
    assert b.wait_answered(1, timeout=0) and b.wait_answered(2, timeout=0)
    assert b.stats == BatcherStats(posted=6, answered=6, dropped=0, stale=0)
    b.post(1)  # answered groups may post again
    assert b.collect(0, 100, timeout=0).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_collector_collects_as_collect_does(impl):
    """A server loop's collector: the same batches as collect; with the native Batcher
    each batch is a view of one buffer, so it is answered before the next collect."""
    b = impl(3, 2)
    collect = b.collector(0, 4)
    assert collect(0).numel() == 0  # nothing ready: times out at once
    b.post(2)
    b.post(0)
    first = collect(0)
    assert first.tolist() == [0, 1, 4, 5]
    b.answer(first)
    b.post(1, 1)
    second = collect(None)
    assert second.tolist() == [2]
    b.answer(second)
    assert b.stats == BatcherStats(posted=5, answered=5, dropped=0, stale=0)
    if impl is Batcher:
        assert first.data_ptr() == second.data_ptr()  # reused: no allocation per batch


@pytest.mark.parametrize("impl", IMPLS)
def test_post_before_answered_raises(impl):
    b = impl(1, 2)
    b.post(0)
    with pytest.raises(RuntimeError, match="not all answered"):
        b.post(0)
    b.answer(b.collect(0, 1, timeout=0))  # half answered is still pending
    with pytest.raises(RuntimeError, match="not all answered"):
        b.post(0, 1)
    assert b.pending(0) == 1 and b.stats.posted == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_answer_with_a_bad_index_changes_nothing(impl):
    b = impl(2, 2)
    b.post(0)
    indices = b.collect(0, 2, timeout=0)
    with pytest.raises(ValueError, match="slot indices"):
        b.answer([0, 1, 4])
    assert b.pending(0) == 2
    b.answer(indices)
    assert b.pending(0) == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_order_answers_wake_a_group_only_when_all_are_answered(impl):
    b = impl(3, 2)
    for group in range(3):
        b.post(group)
    indices = b.collect(0, 6, timeout=0)
    assert indices.tolist() == list(range(6))
    b.answer([5, 0, 3])  # one slot of each group, out of order
    assert [b.pending(g) for g in range(3)] == [1, 1, 1]
    b.answer([4])
    assert [b.pending(g) for g in range(3)] == [1, 1, 0]
    b.answer(torch.tensor([1]))
    assert [b.pending(g) for g in range(3)] == [0, 1, 0]
    b.answer([1])  # answering twice is ignored (stale), never double-credited
    assert [b.pending(g) for g in range(3)] == [0, 1, 0]
    b.answer([2])
    assert [b.pending(g) for g in range(3)] == [0, 0, 0]
    assert b.stats == BatcherStats(posted=6, answered=6, dropped=0, stale=1)


@pytest.mark.parametrize("impl", IMPLS)
def test_max_batch_takes_groups_round_robin(impl):
    b = impl(4, 2)
    for group in range(4):
        b.post(group)
    # A batch may split a group; the next one resumes inside it.
    assert b.collect(0, 3, timeout=0).tolist() == [0, 1, 2]
    assert b.collect(0, 3, timeout=0).tolist() == [3, 4, 5]
    b.answer([0, 1])
    b.post(0)  # group 0 is ready again at once, but groups 3 waited longer
    assert b.collect(0, 2, timeout=0).tolist() == [6, 7]
    assert b.collect(0, 2, timeout=0).tolist() == [0, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_an_actor_that_reposts_at_once_cannot_starve_the_others(impl):
    b = impl(3, 1)
    for group in range(3):
        b.post(group)
    served = []
    for _ in range(9):
        (index,) = b.collect(0, 1, timeout=0).tolist()
        served.append(index)
        b.answer([index])
        b.post(index)
    assert served == [0, 1, 2] * 3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("timeout", [0.0, 0.2])
def test_collect_times_out_with_an_empty_batch(impl, timeout):
    b = impl(2, 2)
    start = time.monotonic()
    indices = b.collect(0, 4, timeout=timeout)
    elapsed = time.monotonic() - start
    assert indices.dtype == torch.int64 and indices.shape == (0,)
    # Never early (CLOCK_MONOTONIC on both sides); late by scheduler noise.
    assert timeout <= elapsed < timeout + PROMPT_SECONDS


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_window_returns_a_partial_batch_when_it_ends(impl):
    b = impl(4, 1)
    b.post(0)
    start = time.monotonic()
    indices = b.collect(0, 4, timeout=0, batch_window=0.2)
    elapsed = time.monotonic() - start
    assert indices.tolist() == [0]
    # The window runs from the first request taken, not from the call.
    assert 0.2 <= elapsed < 0.2 + PROMPT_SECONDS


def _post_later(b, groups, delay):
    def post():
        time.sleep(delay)
        for group in groups:
            b.post(group)

    thread = threading.Thread(target=post, name="late-poster")
    thread.start()
    return thread


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("min_batch", "late_groups", "expected"),
    [
        (2, [1], [0, 1]),  # min_batch reached: returns before the window ends
        (None, [1, 2, 3], [0, 1, 2, 3]),  # max_batch reached (min defaults to max)
    ],
)
def test_batch_window_ends_early_at_min_or_max_batch(impl, min_batch, late_groups, expected):
    b = impl(5, 1)
    b.post(0)
    poster = _post_later(b, late_groups, delay=0.05)
    start = time.monotonic()
    indices = b.collect(0, 4, min_batch=min_batch, timeout=0, batch_window=60)
    elapsed = time.monotonic() - start
    poster.join(5)
    assert indices.tolist() == expected
    assert elapsed < PROMPT_SECONDS  # far from the 60 s window


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_collect_does_not_wait_for_more(impl):
    b = impl(4, 1)
    b.post(2)
    start = time.monotonic()
    assert b.collect(0, 4, min_batch=1, timeout=5, batch_window=60).tolist() == [2]
    assert time.monotonic() - start < PROMPT_SECONDS  # far from the 60 s window


@pytest.mark.parametrize("impl", IMPLS)
def test_post_wakes_a_blocked_collect_and_only_its_server_serves_it(impl):
    b = impl(4, 1, num_servers=2)
    got, tids = queue.Queue(), queue.Queue()

    def server(index):
        tids.put(threading.get_native_id())
        got.put((index, b.collect(index, 4, min_batch=1, timeout=5).tolist()))

    threads = [threading.Thread(target=server, args=(i,), name=f"server-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for _ in threads:
        _wait_until_asleep(tid=tids.get(timeout=5))
    b.post(3)  # group 3 belongs to server 1
    assert got.get(timeout=PROMPT_SECONDS) == (1, [3])
    b.post(0)
    assert got.get(timeout=PROMPT_SECONDS) == (0, [0])
    for thread in threads:
        thread.join(5)


@pytest.mark.parametrize("impl", IMPLS)
def test_answering_wakes_exactly_the_served_actors(impl):
    # Blocked actors must not hold the GIL either: the server runs meanwhile.
    b = impl(3, 2)
    woken, tids = queue.Queue(), queue.Queue()

    def actor(group):
        b.post(group)
        tids.put(threading.get_native_id())
        woken.put((group, b.wait_answered(group, timeout=10)))

    threads = [threading.Thread(target=actor, args=(g,), name=f"actor-{g}") for g in range(3)]
    for thread in threads:
        thread.start()
    for _ in threads:
        _wait_until_asleep(tid=tids.get(timeout=5))
    indices = b.collect(0, 6, timeout=0)
    assert indices.tolist() == list(range(6))
    b.answer([2, 3])  # all of group 1
    assert woken.get(timeout=PROMPT_SECONDS) == (1, True)
    b.answer([0])  # half of group 0: still asleep, like group 2
    with pytest.raises(queue.Empty):
        woken.get(timeout=ASLEEP_SECONDS)
    b.answer([5, 1, 4])
    assert sorted([woken.get(timeout=PROMPT_SECONDS), woken.get(timeout=PROMPT_SECONDS)]) == [
        (0, True),
        (2, True),
    ]
    for thread in threads:
        thread.join(5)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_server_that_stops_answering_makes_wait_time_out(impl):
    b = impl(1, 2)
    b.post(0)
    b.collect(0, 2, timeout=0)  # taken, never answered: the server "died"
    start = time.monotonic()
    assert b.wait_answered(0, timeout=0.2) is False
    elapsed = time.monotonic() - start
    assert 0.2 <= elapsed < 0.2 + PROMPT_SECONDS
    assert b.pending(0) == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_reset_group_drops_requests_and_ignores_late_answers(impl):
    b = impl(2, 2)
    b.post(0)
    taken = b.collect(0, 1, timeout=0)  # slot 0 TAKEN, slot 1 still READY
    b.reset_group(0)  # its actor died
    assert b.pending(0) == 0
    assert b.collect(0, 4, timeout=0).numel() == 0  # slot 1 is not served
    b.post(0)  # the replacement actor
    b.answer(taken)  # the old batch lands late: must not count for the new actor
    assert b.pending(0) == 2 and not b.wait_answered(0, timeout=0)
    fresh = b.collect(0, 4, timeout=0)
    assert fresh.tolist() == [0, 1]
    b.answer(fresh)
    assert b.wait_answered(0, timeout=0)
    assert b.stats == BatcherStats(posted=4, answered=2, dropped=2, stale=1)


@pytest.mark.parametrize("impl", IMPLS)
def test_close_wakes_blocked_actors_and_servers(impl):
    b = impl(3, 1, num_servers=3)
    outcomes, tids = queue.Queue(), queue.Queue()

    def actor(group):
        b.post(group)
        tids.put(threading.get_native_id())
        try:
            b.wait_answered(group)
        except QueueClosed:
            outcomes.put(("actor", group))

    def server(index):
        tids.put(threading.get_native_id())
        try:
            b.collect(index, 1)
        except QueueClosed:
            outcomes.put(("server", index))

    # Groups 0 and 1 sleep unanswered; server 2's group never posts.
    threads = [threading.Thread(target=actor, args=(g,), name=f"actor-{g}") for g in range(2)]
    threads.append(threading.Thread(target=server, args=(2,), name="server-2"))
    for thread in threads:
        thread.start()
    for _ in threads:
        _wait_until_asleep(tid=tids.get(timeout=5))
    b.close()
    b.close()  # idempotent
    for thread in threads:
        thread.join(PROMPT_SECONDS)
        assert not thread.is_alive()
    assert sorted(outcomes.get_nowait() for _ in threads) == [
        ("actor", 0),
        ("actor", 1),
        ("server", 2),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_after_close_only_answer_and_reset_work(impl):
    b = impl(2, 1)
    b.post(0)
    taken = b.collect(0, 1, timeout=0)
    b.close()
    for call in [
        lambda: b.post(1),
        lambda: b.wait_answered(0, 0),
        lambda: b.collect(0, 1, timeout=0),
    ]:
        with pytest.raises(QueueClosed):
            call()
    b.answer(taken)  # a server finishing its last batch is not an error
    b.reset_group(1)
    assert b.pending(0) == 0


class _Interrupt(Exception):
    pass


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
@pytest.mark.parametrize("call", ["wait_answered", "collect"])
def test_signals_run_their_handler_during_a_blocked_call(impl, call):
    # A handler that returns: the wait resumes with the time left. One that
    # raises (Ctrl-C): the exception comes out of the blocked call.
    b = impl(1, 1)
    if call == "wait_answered":
        b.post(0)

    def blocked(timeout):
        if call == "wait_answered":
            return b.wait_answered(0, timeout=timeout)
        return b.collect(0, 1, timeout=timeout).numel() > 0

    def wake():  # what ends the blocked call: an answer, or a request to collect
        if call == "wait_answered":
            b.answer(b.collect(0, 1, timeout=0))
        else:
            b.post(0)

    handled = []

    def on_signal(signum, frame):
        handled.append(signum)
        if len(handled) == 2:
            raise _Interrupt

    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:
        # Signalled once asleep, then woken by the work it waits for (60 s: past the
        # watchdog, so a call that ended early at the signal cannot pass).
        signaller = _signal_main_when_asleep(wake, handled)
        assert blocked(60) is True and handled == [signal.SIGUSR1]
        signaller.join(5)
        if call == "wait_answered":
            b.post(0)  # a new request, unanswered
        signaller = _signal_main_when_asleep()
        with pytest.raises(_Interrupt):
            blocked(None)  # no timeout: only the signal ends it (the watchdog a hang)
        signaller.join(5)
    finally:
        signal.signal(signal.SIGUSR1, previous)


# Many actors, several servers, random everything.


@pytest.mark.parametrize("impl", IMPLS)
def test_many_actors_and_two_servers_lose_and_duplicate_nothing(impl):
    num_actors, group_size, rounds = 8, 4, 500  # ~10k requests (mean count 2.5)
    b = impl(num_actors, group_size, num_servers=2)
    obs = torch.zeros(b.num_slots, dtype=torch.int64)
    actions = torch.zeros(b.num_slots, dtype=torch.int64)
    done, batch_sizes = queue.Queue(), []
    servers = [
        threading.Thread(
            target=_serve, args=(b, i, obs, actions, 6, i, batch_sizes), name=f"server-{i}"
        )
        for i in range(2)
    ]
    actors = [
        threading.Thread(
            target=_actor, args=(b, g, obs, actions, rounds, 100 + g, done), name=f"actor-{g}"
        )
        for g in range(num_actors)
    ]
    for thread in servers + actors:
        thread.start()
    for thread in actors:
        thread.join(20)
    b.close()
    for thread in servers:
        thread.join(5)
    # Every actor checked every answer; an actor that saw a wrong or missing
    # one exited early and is missing here.
    assert sorted(done.get_nowait() for _ in range(done.qsize())) == list(range(num_actors))
    stats = b.stats
    assert stats.posted == stats.answered == sum(batch_sizes) >= 9000
    assert stats.dropped == stats.stale == 0
    assert max(batch_sizes) <= 6


def test_actor_processes_and_two_server_threads(processes, forkserver):
    num_actors, group_size, rounds = 4, 4, 300
    b = Batcher(num_actors, group_size, num_servers=2)
    obs = torch.zeros(b.num_slots, dtype=torch.int64).share_memory_()
    actions = torch.zeros(b.num_slots, dtype=torch.int64).share_memory_()
    done, batch_sizes = IndexQueue(num_actors), []
    servers = [
        threading.Thread(
            target=_serve, args=(b, i, obs, actions, 8, i, batch_sizes), name=f"server-{i}"
        )
        for i in range(2)
    ]
    for thread in servers:
        thread.start()
    for g in range(num_actors):
        processes.start(forkserver, _actor, b, g, obs, actions, rounds, g, done, name=f"actor-{g}")
    try:
        finished = sorted(done.get(timeout=20) for _ in range(num_actors))
    finally:
        b.close()
        for thread in servers:
            thread.join(5)
    assert finished == list(range(num_actors))
    for process in processes:
        process.join(5)
        assert process.exitcode == 0
    stats = b.stats
    assert stats.posted == stats.answered == sum(batch_sizes)
    assert stats.dropped == stats.stale == 0


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_match_reference(seed):
    rng = random.Random(seed)
    num_groups = rng.randint(1, 5)
    sizes = (num_groups, rng.randint(1, 4), rng.randint(1, num_groups))
    native, reference = Batcher(*sizes), PyBatcher(*sizes)
    num_slots = native.num_slots
    taken = []  # every index ever collected, to answer (again) later
    close_step = rng.randint(300, 900)  # past the end for some seeds: never closed

    def outcome(b, op, args, kwargs):
        try:
            result = getattr(b, op)(*args, **kwargs)
        except Exception as e:
            return "raised", type(e)
        return "ok", result.tolist() if isinstance(result, torch.Tensor) else result

    for step in range(500):
        op = rng.choices(
            ["post", "collect", "answer", "reset_group", "pending", "wait_answered", "stats"],
            weights=[10, 8, 8, 1, 2, 2, 1],
        )[0]
        args, kwargs = (), {}
        if step == close_step:
            op = "close"
        elif op == "stats":
            assert native.stats == reference.stats, f"step {step}"
            continue
        elif op == "post":
            count = rng.choice([None, rng.randint(0, sizes[1] + 1)])  # sometimes invalid
            args = (rng.randint(0, num_groups), count)  # group num_groups is invalid
        elif op == "collect":
            max_batch = rng.randint(1, num_slots + 1)
            min_batch = rng.choice([None, rng.randint(1, max_batch)])
            args = (rng.randrange(sizes[2]), max_batch)
            kwargs = {"min_batch": min_batch, "timeout": 0}
        elif op == "answer":
            pick = rng.sample(taken, min(len(taken), rng.randint(0, 4)))
            if rng.random() < 0.05:
                pick.append(rng.choice([num_slots, -1]))  # invalid: nothing changes
            args = (pick,)
        elif op in ("reset_group", "pending"):
            args = (rng.randrange(num_groups),)
        elif op == "wait_answered":
            args = (rng.randrange(num_groups), 0)
        expected = outcome(reference, op, args, kwargs)
        assert outcome(native, op, args, kwargs) == expected, f"step {step}: {op}{args}{kwargs}"
        if op == "collect" and expected[0] == "ok":
            taken.extend(expected[1])
    assert native.stats == reference.stats


# Native only: pickling, processes, an actor killed mid-request.


def test_plain_pickle_is_refused():
    # Plain pickle copies the bytes: a private table nobody else would see.
    with pytest.raises(RuntimeError, match="multiprocessing"):
        pickle.loads(pickle.dumps(Batcher(1, 1)))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_actor_in_a_child_process_is_served(method, processes, forkserver):
    ctx = forkserver if method == "forkserver" else mp.get_context(method)
    b = Batcher(2, 3)
    obs = torch.zeros(b.num_slots, dtype=torch.int64).share_memory_()
    actions = torch.zeros(b.num_slots, dtype=torch.int64).share_memory_()
    done = IndexQueue(1)
    child = processes.start(ctx, _actor, b, 1, obs, actions, 50, 0, done, name=f"actor-{method}")
    served = 0
    while done.qsize() == 0:
        indices = b.collect(0, 6, min_batch=1, timeout=0.05)
        if len(indices):
            actions[indices] = _inference(obs.index_select(0, indices))
            b.answer(indices)
            served += len(indices)
        assert child.is_alive() or done.qsize() > 0, f"actor exited with {child.exitcode}"
    assert done.get(timeout=0) == 1
    child.join(10)
    assert child.exitcode == 0
    assert b.stats.answered == served == b.stats.posted


def test_close_wakes_an_actor_and_a_server_in_other_processes(processes, forkserver):
    b = Batcher(2, 1, num_servers=2)
    ready, woken = IndexQueue(2), IndexQueue(2)
    actor = processes.start(forkserver, _post_and_wait, b, 0, ready, woken, name="actor")
    server = processes.start(forkserver, _collect_until_closed, b, 1, ready, woken, name="srv")
    for _ in range(2):
        ready.get(timeout=20)
    _wait_until_asleep(pid=actor.pid)
    _wait_until_asleep(pid=server.pid)
    b.close()
    assert sorted(woken.get(timeout=PROMPT_SECONDS) for _ in range(2)) == [2, 3]
    for child in (actor, server):
        child.join(10)
        assert child.exitcode == 0


def test_actor_killed_mid_request_neither_hangs_the_server_nor_misleads_its_successor(
    processes, forkserver
):
    b = Batcher(2, 2)
    ready, woken = IndexQueue(2), IndexQueue(2)

    # Killed with its requests READY: reset drops them; the server sleeps
    # on, undisturbed, and times out instead of waiting for the dead actor.
    doomed = processes.start(forkserver, _post_and_wait, b, 0, ready, woken, name="doomed-0")
    ready.get(timeout=20)
    _wait_until_asleep(pid=doomed.pid)
    doomed.kill()
    doomed.join(5)
    b.reset_group(0)
    assert b.collect(0, 4, min_batch=1, timeout=0.1).numel() == 0

    # Killed with its requests TAKEN: the late answer is ignored, and the
    # successor is woken by its own answer only.
    doomed = processes.start(forkserver, _post_and_wait, b, 0, ready, woken, name="doomed-1")
    ready.get(timeout=20)
    old_batch = b.collect(0, 4, min_batch=1, timeout=5)
    assert old_batch.tolist() == [0, 1]
    _wait_until_asleep(pid=doomed.pid)
    doomed.kill()
    doomed.join(5)
    b.reset_group(0)
    successor = processes.start(forkserver, _post_and_wait, b, 0, ready, woken, name="heir")
    ready.get(timeout=20)
    _wait_until_asleep(pid=successor.pid)
    b.answer(old_batch)
    with pytest.raises(queue.Empty):
        woken.get(timeout=ASLEEP_SECONDS)
    b.answer(b.collect(0, 4, min_batch=1, timeout=5))
    assert woken.get(timeout=PROMPT_SECONDS) == 1
    successor.join(10)
    assert successor.exitcode == 0
    assert b.stats == BatcherStats(posted=6, answered=2, dropped=4, stale=2)
