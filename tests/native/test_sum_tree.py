"""SumTree contract: sampling law, float64 sums, generations, processes, owner death.

Single-process contract tests run against both the native `SumTree` and the
pure-Python reference `PySumTree`; a randomised test checks that the two
agree bit for bit, operation by operation. Sampling frequencies are checked
against priorities with a chi-square test at a fixed seed. The process tests
hammer one tree from several children (claims, updates, samples) and check
that the total is still exactly the sum of the leaves; one kills a child
while it holds the tree's lock. Checkpoints: a state_dict restored into a
fresh tree (in this process or shared with a child) samples, claims and
reports exactly as the saved tree does.
"""

import io
import math
import os
import pickle
import random
import signal
import threading
import time

import numpy as np
import pytest
import torch

from beast.native import PySumTree, SumTree

pytestmark = pytest.mark.usefixtures("watchdog")

IMPLS = [SumTree, PySumTree]


def rebuilt_total(leaves):
    """The total a fresh tree computes for these leaf values.

    Every internal node is always recomputed from its children, so a tree's
    total is a pure function of its leaves, whatever sequence of updates led
    there: a total that differs from this one (even in the last bit) means the
    sums above the leaves are corrupt.
    """
    fresh = PySumTree(len(leaves))
    fresh.update(range(len(leaves)), leaves)
    return fresh.total()


def chi_square_critical(df, z=3.0902):
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.0902 is the
    standard normal's 0.999 quantile, so a correct sampler fails 1 run in 1000
    (never, at the fixed seeds below). Accurate to well under 1% for df >= 30."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


# Children (module level so that forkserver can pickle them).


def _hammer(tree, seed, iterations, errors):
    """Claim, update and sample at random; report any sample that breaks the law."""
    rng = random.Random(seed)
    capacity = tree.capacity
    for _ in range(iterations):
        op = rng.random()
        if op < 0.3:
            index, generation = tree.claim()
            tree.commit(index, generation, rng.uniform(0.0, 10.0))
        elif op < 0.6:
            indices = [rng.randrange(capacity) for _ in range(8)]
            # Magnitudes from 1e-6 to 1e6, as priorities**alpha get in practice.
            tree.update(indices, [10.0 ** rng.uniform(-6, 6) for _ in indices])
        else:
            try:
                sample = tree.sample([rng.random() for _ in range(16)])
            except ValueError:
                continue  # every priority 0 for a moment (all slots just claimed)
            if not (sample.priorities > 0).all() or (sample.priorities > sample.total).any():
                errors.put(f"bad sample {sample}")
    errors.put(None)


def _sample_and_report(tree, draws, results):
    sample = tree.sample(draws)
    # Lists, not tensors: torch sends a queued tensor as a file descriptor the
    # parent must fetch from this process, which may have exited by then.
    results.put(
        (
            sample.indices.tolist(),
            sample.generations.tolist(),
            sample.priorities.tolist(),
            sample.total,
        )
    )


def _churn(tree):
    rng = random.Random(0)
    while True:
        tree.update([rng.randrange(tree.capacity) for _ in range(64)], [1.0] * 64)


# Single-process contract, both implementations.


@pytest.mark.parametrize("impl", IMPLS)
def test_new_tree_is_all_zero_and_cannot_be_sampled(impl):
    tree = impl(10)
    assert tree.capacity == 10
    assert tree.total() == 0.0 and tree.max() == 0.0
    assert tree.get(range(10)).tolist() == [0.0] * 10
    assert tree.generations(range(10)).tolist() == [0] * 10
    with pytest.raises(ValueError, match="every priority"):
        tree.sample([0.5])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8, 13, 64])
def test_sample_inverts_the_cumulative_sum(impl, capacity):
    """Draw u lands on the leaf whose cumulative range holds u * total (exact
    here: small integers are exact in float64)."""
    tree = impl(capacity)
    priorities = [float(i % 3 + 1) for i in range(capacity)]
    tree.update(range(capacity), priorities)
    total = sum(priorities)
    assert tree.total() == total and tree.max() == max(priorities)
    bounds = np.cumsum([0.0, *priorities])
    # Just inside each leaf's range, both ends.
    draws, expected = [], []
    for i in range(capacity):
        draws += [bounds[i] / total, (bounds[i + 1] - 0.5) / total]
        expected += [i, i]
    sample = tree.sample(draws)
    assert sample.indices.tolist() == expected
    assert sample.priorities.tolist() == [priorities[i] for i in expected]
    assert sample.total == total
    assert sample.indices.dtype == torch.int64 and sample.priorities.dtype == torch.float64


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_priority_leaves_are_never_sampled(impl):
    """Even at u = 1 (target == total) and with zeros at the right edge, where a
    descent that ignored empty subtrees would walk into them."""
    tree = impl(7)
    tree.update([0, 2, 3], [0.1, 0.2, 0.3])  # 1, 4, 5, 6 stay 0
    draws = torch.linspace(0.0, 1.0, 10001, dtype=torch.float64)
    sample = tree.sample(draws)
    assert set(sample.indices.tolist()) == {0, 2, 3}
    assert tree.sample([1.0]).indices.tolist() == [3]
    assert tree.sample([0.0]).indices.tolist() == [0]
    # Draws a rounding error below 1 still land on the last nonzero leaf.
    assert tree.sample([1.0 - 1e-16, 0.9999999999]).indices.tolist() == [3, 3]


@pytest.mark.parametrize("impl", IMPLS)
def test_update_repeated_index_keeps_last_value_and_max_follows_decreases(impl):
    tree = impl(4)
    assert tree.update([1, 1, 2], [5.0, 2.0, 3.0]) == 3
    assert tree.get([1, 2]).tolist() == [2.0, 3.0]
    assert tree.max() == 3.0
    tree.update([2], [0.5])
    assert tree.max() == 2.0  # the max of the current leaves, not a running max
    assert tree.total() == 2.5


@pytest.mark.parametrize("impl", IMPLS)
def test_invalid_arguments_raise_and_change_nothing(impl):
    tree = impl(4)
    tree.update([0, 1], [1.0, 2.0])
    bad_batches = [
        ([0, 4], [3.0, 3.0]),  # index out of range
        ([0, -1], [3.0, 3.0]),
        ([0, 1], [3.0, -1.0]),  # negative priority
        ([0, 1], [3.0, math.nan]),
        ([0, 1], [3.0, math.inf]),
    ]
    for indices, priorities in bad_batches:
        with pytest.raises(ValueError):
            tree.update(indices, priorities)
        # The valid first entry of the batch was not written either.
        assert tree.get([0, 1]).tolist() == [1.0, 2.0] and tree.total() == 3.0
    with pytest.raises(ValueError, match="entries"):
        tree.update([0, 1], [1.0])
    with pytest.raises(TypeError, match="integers"):
        tree.update(torch.tensor([0.0]), [1.0])
    for draw in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            tree.sample([0.5, draw])
    with pytest.raises(ValueError):
        tree.get([4])
    for capacity in (0, -1, 2**28 + 1):
        with pytest.raises(ValueError, match="capacity"):
            impl(capacity)


@pytest.mark.parametrize("impl", IMPLS)
def test_claims_walk_the_ring_and_generations_guard_updates(impl):
    tree = impl(3)
    tree.update(range(3), [1.0, 1.0, 1.0])
    claims = []
    for _ in range(4):
        index, generation = tree.claim()
        claims.append((index, generation))
        assert tree.get([index]).tolist() == [0.0]  # unsampleable while written
        assert tree.commit(index, generation, 2.0)
    # Slots 0, 1, 2, 0; each claim bumps the slot's generation.
    assert claims == [(0, 1), (1, 1), (2, 1), (0, 2)]
    assert tree.stats().claims == 4
    # A priority for slot 0's first generation, computed before the ring came
    # round to it again, is dropped.
    assert tree.update([0, 1], [5.0, 6.0], [1, 1]) == 1
    assert tree.get([0, 1]).tolist() == [2.0, 6.0]
    sample = tree.sample([0.0])
    assert sample.indices.tolist() == [0] and sample.generations.tolist() == [2]
    for _ in range(3):
        tree.commit(*tree.claim(), 1.0)  # slots 1, 2, 0
    assert tree.update(sample.indices, [9.0], sample.generations) == 0
    assert tree.get([0]).tolist() == [1.0]


@pytest.mark.parametrize("impl", IMPLS)
def test_claims_skip_slots_still_being_written(impl):
    """A writer lapped by others keeps its slot: they skip it, so no two writers
    ever interleave their rows in one slot."""
    tree = impl(3)
    slow = tree.claim()  # slot 0, not committed yet
    assert [tree.claim()[0] for _ in range(2)] == [1, 2]
    with pytest.raises(RuntimeError, match="capacity larger than the number of concurrent"):
        tree.claim()  # all three held
    assert tree.commit(1, 1, 1.0) and tree.commit(2, 1, 1.0)
    assert [tree.claim()[0] for _ in range(2)] == [1, 2]  # slot 0 skipped
    assert tree.commit(*slow, 3.0)
    assert tree.claim() == (0, 2)
    with pytest.raises(ValueError):
        tree.commit(5, 1, 1.0)
    with pytest.raises(ValueError):
        tree.commit(0, 2, -1.0)


def _claim_and_stop(tree, ready):
    tree.claim()
    ready.set()
    time.sleep(60)


def test_a_dead_writer_frees_its_slot(forkserver):
    """A writer killed between claim and commit does not hold its slot forever;
    its half-written data is never sampled."""
    tree = SumTree(2)
    tree.commit(*tree.claim(), 1.0)  # slot 0
    ready = forkserver.Event()
    child = forkserver.Process(target=_claim_and_stop, args=(tree, ready))
    child.start()
    try:
        assert ready.wait(30)
        assert tree.get([1]).tolist() == [0.0]
        assert tree.claim()[0] == 0  # slot 1 held by the live child
        tree.commit(0, 2, 1.0)
    finally:
        child.kill()
        child.join(10)
    assert tree.claim() == (1, 2)


@pytest.mark.parametrize("impl", IMPLS)
def test_sums_do_not_drift_over_many_updates(impl):
    """After 20k random updates spanning 12 orders of magnitude the total is
    bit-identical to a fresh tree's over the same leaves, and within 1e-12 of
    the exactly rounded sum (math.fsum): float64 partial sums of 1000 terms err
    by at most ~log2(1000) * eps relative."""
    rng = np.random.default_rng(0)
    capacity = 1000
    tree = impl(capacity)
    for _ in range(200):
        indices = rng.integers(0, capacity, 100)
        tree.update(indices, 10.0 ** rng.uniform(-6, 6, 100))
    leaves = tree.get(range(capacity)).tolist()
    assert tree.total() == rebuilt_total(leaves)
    assert tree.total() == pytest.approx(math.fsum(leaves), rel=1e-12)
    assert tree.max() == max(leaves)


@pytest.mark.parametrize("impl", IMPLS)
def test_sampling_frequencies_match_priorities_chi_square(impl):
    """1e5 stratified draws over 200 leaves against p_i / total.

    Priorities span 0.05 to 5 (a factor of 100) and some are 0; the smallest
    nonzero expected count is 1e5 * 0.05 / ~500 = 10, above the 5 a
    chi-square test needs. The zero leaves must never appear.
    """
    rng = np.random.default_rng(1)
    capacity, draws_count = 200, 100_000
    priorities = rng.uniform(0.05, 5.0, capacity)
    zeros = rng.choice(capacity, 10, replace=False)
    priorities[zeros] = 0.0
    tree = impl(capacity)
    tree.update(range(capacity), priorities)
    # Stratified, as replay draws them: one uniform per equal slice of [0, 1).
    draws = (np.arange(draws_count) + rng.random(draws_count)) / draws_count
    counts = np.bincount(tree.sample(draws).indices.numpy(), minlength=capacity)
    assert counts[zeros].sum() == 0
    nonzero = priorities > 0
    expected = draws_count * priorities[nonzero] / priorities.sum()
    statistic = float((((counts[nonzero] - expected) ** 2) / expected).sum())
    df = int(nonzero.sum()) - 1
    assert statistic < chi_square_critical(df), (statistic, df)
    # Stratification makes the counts far tighter than multinomial: the
    # statistic sits well below df, its multinomial mean.
    assert statistic < df


def test_plain_uniform_draws_pass_chi_square_too():
    """Unstratified draws: the multinomial case the chi-square law describes."""
    rng = np.random.default_rng(2)
    capacity, draws_count = 100, 100_000
    priorities = rng.uniform(0.1, 3.0, capacity)
    tree = SumTree(capacity)
    tree.update(range(capacity), priorities)
    counts = np.bincount(tree.sample(rng.random(draws_count)).indices.numpy(), minlength=capacity)
    expected = draws_count * priorities / priorities.sum()
    statistic = float((((counts - expected) ** 2) / expected).sum())
    assert statistic < chi_square_critical(capacity - 1), statistic


@pytest.mark.parametrize("seed", range(3))
def test_random_operations_match_reference(seed):
    """Native and reference trees agree bit for bit on every result."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 7, 64, 100])
    native, reference = SumTree(capacity), PySumTree(capacity)
    for _ in range(500):
        op = rng.random()
        if op < 0.2:
            claimed = native.claim()
            assert claimed == reference.claim()
            priority = rng.random()
            assert native.commit(*claimed, priority) == reference.commit(*claimed, priority)
        elif op < 0.6:
            n = rng.randrange(1, 10)
            indices = [rng.randrange(capacity) for _ in range(n)]
            priorities = [
                rng.choice([0.0, rng.random(), 10.0 ** rng.uniform(-8, 8)]) for _ in indices
            ]
            generations = None
            if rng.random() < 0.5:
                generations = reference.generations(indices).tolist()
                generations = [g + (rng.random() < 0.3) for g in generations]
            assert native.update(indices, priorities, generations) == reference.update(
                indices, priorities, generations
            )
        else:
            draws = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(rng.randrange(1, 20))]
            if reference.total() == 0.0:
                with pytest.raises(ValueError):
                    native.sample(draws)
                continue
            a, b = native.sample(draws), reference.sample(draws)
            assert a.indices.tolist() == b.indices.tolist()
            assert a.generations.tolist() == b.generations.tolist()
            assert a.priorities.tolist() == b.priorities.tolist() and a.total == b.total
        assert native.stats() == reference.stats()
    everything = range(capacity)
    assert native.get(everything).tolist() == reference.get(everything).tolist()
    assert native.generations(everything).tolist() == reference.generations(everything).tolist()


def test_threads_share_one_tree():
    """Concurrent updates and samples from threads (cffi releases the GIL
    around each C call): the total still matches the leaves exactly."""
    tree = SumTree(257)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            tree.update(rng.integers(0, 257, 16), rng.uniform(0, 1, 16))
            tree.sample(rng.random(8))

    threads = [threading.Thread(target=work, args=(s,), name=f"updater-{s}") for s in range(4)]
    tree.update([0], [1.0])
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tree.total() == rebuilt_total(tree.get(range(257)).tolist())


# Checkpoints: state_dict / load_state_dict.


def _random_history(tree, seed, steps=300):
    """Updates (some generation-guarded), committed claims and a few claims left
    uncommitted; the same seed gives the same calls on any implementation."""
    rng = random.Random(seed)
    capacity = tree.capacity
    pending = []
    for _ in range(steps):
        op = rng.random()
        if op < 0.3:
            index, generation = tree.claim()
            # Never all slots held: the next claim would find none free.
            if rng.random() < 0.1 and len(pending) < capacity - 1:
                pending.append((index, generation))
            else:
                tree.commit(
                    index, generation, rng.choice([0.0, rng.random(), 10.0 ** rng.uniform(-8, 8)])
                )
        else:
            indices = [rng.randrange(capacity) for _ in range(rng.randrange(1, 8))]
            priorities = [rng.choice([0.0, 10.0 ** rng.uniform(-8, 8)]) for _ in indices]
            generations = tree.generations(indices).tolist() if rng.random() < 0.5 else None
            tree.update(indices, priorities, generations)
    # Slots still mid-write would make the original skip them on its next
    # claims while a restored tree (no writers) would not: commit them here,
    # and let test_restore_frees_slots_claimed_but_not_committed cover that case.
    for index, generation in pending:
        tree.commit(index, generation, rng.random())


def _assert_same_tree(a, b, draws):
    """Every observable of a and b is equal, bit for bit."""
    everything = range(a.capacity)
    assert a.stats() == b.stats()
    assert a.get(everything).tolist() == b.get(everything).tolist()
    assert a.generations(everything).tolist() == b.generations(everything).tolist()
    x, y = a.sample(draws), b.sample(draws)
    assert x.indices.tolist() == y.indices.tolist()
    assert x.generations.tolist() == y.generations.tolist()
    assert x.priorities.tolist() == y.priorities.tolist() and x.total == y.total


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("capacity", [1, 5, 64, 100])
def test_state_dict_round_trip_restores_every_observable(impl, capacity):
    """Save through torch.save / torch.load(weights_only=True), restore into a
    fresh tree: totals, leaves, generations, samples and the next claims equal
    the original's, and both keep agreeing under the same further calls."""
    original = impl(capacity)
    _random_history(original, seed=capacity)
    if original.total() == 0.0:
        original.update([0], [1.0])  # so that both can be sampled
    state = original.state_dict()
    assert state["priorities"].dtype == torch.float64 and state["priorities"].shape == (capacity,)
    assert state["generations"].dtype == torch.int64 and state["generations"].shape == (capacity,)
    assert type(state["claims"]) is int and type(state["cursor"]) is int
    assert state["claims"] == original.stats().claims
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    restored = impl(capacity)
    restored.load_state_dict(loaded)
    draws = torch.linspace(0.0, 1.0, 257, dtype=torch.float64)
    _assert_same_tree(original, restored, draws)
    # The internal sums were rebuilt exactly as updates would have left them.
    assert restored.total() == rebuilt_total(restored.get(range(capacity)).tolist())
    for _ in range(capacity + 2):  # once round the ring and a bit
        claimed = original.claim()
        assert restored.claim() == claimed
        assert original.commit(*claimed, 0.5) and restored.commit(*claimed, 0.5)
    _assert_same_tree(original, restored, draws)
    # The state is a copy, not a view of the tree.
    original.update([0], [123.0])
    assert state["priorities"][0].item() != 123.0


@pytest.mark.parametrize("impl", IMPLS)
def test_restore_frees_slots_claimed_but_not_committed(impl):
    """Writers are not part of the state: a slot mid-write when saved is saved
    with priority 0 (never sampled) and is free to claim after the restore."""
    original = impl(3)
    original.update(range(3), [1.0, 2.0, 3.0])
    assert original.claim() == (0, 1)  # never committed
    original.commit(*original.claim(), 5.0)  # slot 1
    restored = impl(3)
    restored.claim()  # slot 0 held in the tree restored into, too: released
    restored.load_state_dict(original.state_dict())
    assert restored.get(range(3)).tolist() == [0.0, 5.0, 3.0]
    assert restored.sample([0.0, 1.0]).indices.tolist() == [1, 2]
    assert original.claim() == restored.claim() == (2, 1)
    # The original still has a writer in slot 0 and skips it; the restored one
    # does not.
    assert original.claim() == (1, 2)
    assert restored.claim() == (0, 2)


@pytest.mark.parametrize("impl", IMPLS)
def test_load_state_dict_rejects_bad_states_and_changes_nothing(impl):
    tree = impl(4)
    tree.update(range(4), [1.0, 2.0, 3.0, 4.0])
    tree.commit(*tree.claim(), 7.0)
    before = tree.state_dict()
    good = impl(4).state_dict()
    good["priorities"] = torch.tensor([0.5, 0.0, 2.0, 1.0], dtype=torch.float64)

    def bad(**changes):
        return {**good, **changes}

    cases = [
        (impl(5).state_dict(), r"tensor \[4\]"),  # a tree of another capacity
        (bad(priorities=torch.tensor([0.5, -1.0, 2.0, 1.0], dtype=torch.float64)), "finite"),
        (bad(priorities=torch.tensor([0.5, math.nan, 2.0, 1.0], dtype=torch.float64)), "finite"),
        (bad(priorities=torch.tensor([0.5, math.inf, 2.0, 1.0], dtype=torch.float64)), "finite"),
        (bad(priorities=good["priorities"].float()), "float64"),
        (bad(generations=good["generations"].to(torch.int32)), "int64"),
        (bad(generations=[0, 0, 0, 0]), "int64"),
        (bad(claims=-1), "claims"),
        (bad(cursor=2**64), "cursor"),
        (bad(cursor=1.0), "cursor"),
        ({k: v for k, v in good.items() if k != "cursor"}, "keys"),
        (bad(extra=1), "keys"),
    ]
    for state, match in cases:
        with pytest.raises(ValueError, match=match):
            tree.load_state_dict(state)
        after = tree.state_dict()
        assert after["priorities"].tolist() == before["priorities"].tolist()
        assert after["generations"].tolist() == before["generations"].tolist()
        assert (after["claims"], after["cursor"]) == (before["claims"], before["cursor"])
        assert tree.total() == 16.0 and tree.max() == 7.0
    tree.load_state_dict(good)  # the same calls with a good state do apply
    assert tree.get(range(4)).tolist() == [0.5, 0.0, 2.0, 1.0] and tree.total() == 3.5


@pytest.mark.parametrize("seed", range(3))
def test_state_dicts_match_reference_and_load_across_implementations(seed):
    """Native and reference trees export equal states after the same calls, and
    each restores the other's state into a tree that keeps agreeing with it."""
    capacity = random.Random(seed).choice([1, 7, 64, 100])
    native, reference = SumTree(capacity), PySumTree(capacity)
    _random_history(native, seed)
    _random_history(reference, seed)
    a, b = native.state_dict(), reference.state_dict()
    assert a.keys() == b.keys()
    for key in ("priorities", "generations"):
        assert a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist()
    assert (a["claims"], a["cursor"]) == (b["claims"], b["cursor"])

    native_from_reference, reference_from_native = SumTree(capacity), PySumTree(capacity)
    native_from_reference.load_state_dict(b)
    reference_from_native.load_state_dict(a)
    _random_history(native_from_reference, seed + 100)
    _random_history(reference_from_native, seed + 100)
    native_from_reference.update([0], [1.0])
    reference_from_native.update([0], [1.0])
    _assert_same_tree(
        native_from_reference, reference_from_native, torch.rand(64, dtype=torch.float64)
    )


def test_restored_tree_samples_the_same_in_a_child(processes, forkserver):
    """A tree restored from a checkpoint, then shared with a child process,
    samples there exactly as the saved tree does here."""
    capacity = 100
    original = SumTree(capacity)
    _random_history(original, seed=7)
    restored = SumTree(capacity)
    restored.load_state_dict(original.state_dict())
    draws = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results = forkserver.Queue()
    child = processes.start(
        forkserver, _sample_and_report, restored, draws, results, name="restored-sampler"
    )
    indices, generations, priorities, total = results.get(timeout=25)
    child.join(5)
    assert child.exitcode == 0
    expected = original.sample(draws)
    assert indices == expected.indices.tolist()
    assert generations == expected.generations.tolist()
    assert priorities == expected.priorities.tolist() and total == expected.total


# Processes.


def test_plain_pickle_is_refused():
    tree = SumTree(4)
    with pytest.raises(RuntimeError, match="multiprocessing"):
        pickle.loads(pickle.dumps(tree))


def test_concurrent_claims_updates_and_samples_never_corrupt_the_total(processes, forkserver):
    """Four processes claim, update and sample one tree at once.

    Afterwards the total is bit-identical to a fresh tree's over the final
    leaves (no lost or half-applied propagation), every claim is counted, and
    no child ever drew a zero-priority leaf or one above the total.
    """
    capacity, workers, iterations = 1000, 4, 1500
    tree = SumTree(capacity)
    tree.update(range(capacity), [1.0] * capacity)
    errors = forkserver.Queue()
    for seed in range(workers):
        processes.start(forkserver, _hammer, tree, seed, iterations, errors, name=f"hammer-{seed}")
    reports = [errors.get(timeout=25) for _ in range(workers)]
    assert reports == [None] * workers
    for process in processes:
        process.join(5)
        assert process.exitcode == 0
    leaves = tree.get(range(capacity)).tolist()
    assert tree.total() == rebuilt_total(leaves)
    assert tree.max() == max(leaves)
    # Each child's claims, replayed: 30% of iterations on average; at least some.
    assert tree.stats().claims > workers * iterations * 0.2
    assert tree.owner_deaths == 0


def test_child_killed_holding_the_lock_is_recovered(processes, forkserver):
    """SIGKILL a child inside an update; the survivors recover the lock and the
    rebuilt sums match the leaves.

    As in test_native: SIGSTOP the child repeatedly until a probe call from
    another thread blocks (the child is stopped holding the lock), then kill it.
    """
    tree = SumTree(4096)
    child = processes.start(forkserver, _churn, tree, name="churner")
    stat = f"/proc/{child.pid}/stat"

    def state():
        with open(stat) as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "never caught the child holding the lock"
        os.kill(child.pid, signal.SIGSTOP)
        while state() != "T":
            time.sleep(0.001)
        probe = threading.Thread(target=tree.total, name="probe", daemon=True)
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
    probe.join(1.0)
    assert not probe.is_alive(), "survivor still blocked on a dead owner's lock"
    assert tree.owner_deaths == 1
    leaves = tree.get(range(4096)).tolist()
    assert tree.total() == rebuilt_total(leaves) == sum(leaves)  # all 0.0 or 1.0: exact
    tree.update([0], [0.5])
    assert tree.total() == rebuilt_total(tree.get(range(4096)).tolist())
