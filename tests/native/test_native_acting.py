"""beast.native.acting: the native softmax sampler and step copies.

The sampler is checked against softmax probabilities computed here in float64 from
the definition, p_a = exp(l_a) / sum_b exp(l_b), by chi-square over many draws.
"""

import multiprocessing as mp

import numpy as np
import pytest
import torch

from beast.native.acting import SoftmaxSampler, StepCopies, sample_softmax

CHI2_999_5DOF = 20.52  # chi-square 0.999 quantile, 5 degrees of freedom


def softmax(logits: np.ndarray) -> np.ndarray:
    finite = np.where(np.isneginf(logits), -np.inf, logits.astype(np.float64))
    weights = np.exp(finite - finite.max())
    return weights / weights.sum()


def chi_square(actions: np.ndarray, probabilities: np.ndarray) -> float:
    counts = np.bincount(actions, minlength=len(probabilities)).astype(np.float64)
    expected = len(actions) * probabilities
    possible = expected > 0
    assert counts[~possible].sum() == 0, "an action of probability 0 was drawn"
    return float(((counts[possible] - expected[possible]) ** 2 / expected[possible]).sum())


@pytest.mark.parametrize("offset", [0.0, 1000.0, -80.0])
def test_bound_sampler_follows_the_softmax(offset):
    """60k draws through one SoftmaxSampler over a [K, A] array: each row's counts
    fit its softmax, including an action of probability 1e-4 and shifted logits."""
    torch.manual_seed(0)
    probabilities = np.array([0.5, 0.25, 0.15, 0.0699, 0.03, 0.0001])
    rows = 4
    logits = np.tile(np.log(probabilities) + offset, (rows, 1)).astype(np.float32)
    logits[1] = logits[0][::-1]  # a different distribution per row
    actions = np.zeros(rows, dtype=np.int64)
    sampler = SoftmaxSampler(logits, actions)
    draws = 15_000
    history = np.empty((draws, rows), dtype=np.int64)
    for i in range(draws):
        sampler.sample()
        history[i] = actions
    for row in range(rows):
        statistic = chi_square(history[:, row], softmax(logits[row]))
        assert statistic < CHI2_999_5DOF, (row, statistic)


def test_sample_softmax_never_draws_minus_infinity_and_handles_degenerate_rows():
    torch.manual_seed(1)
    masked = np.array([[-np.inf, 0.0, -np.inf, 1.0, -np.inf, -np.inf]], np.float32)
    draws = np.concatenate([sample_softmax(masked) for _ in range(20_000)])
    assert chi_square(draws, softmax(masked[0])) < CHI2_999_5DOF
    degenerate = np.array(
        [
            [0.0, np.nan, 1.0],  # NaN: the first non-finite entry, as argmax gives it
            [0.0, 1.0, np.inf],  # +inf: certain
            [-np.inf, -np.inf, -np.inf],  # nothing possible: action 0
        ],
        np.float32,
    )
    assert sample_softmax(degenerate).tolist() == [1, 2, 0]


def test_streams_follow_torch_seed_and_differ_between_samplers():
    logits = np.zeros((8, 18), np.float32)

    def draws(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        result = []
        for _ in range(2):
            actions = np.zeros(8, np.int64)
            sampler = SoftmaxSampler(logits, actions)
            sampler.sample()
            result.append(actions.tolist())
        return result

    first, again, other = draws(3), draws(3), draws(4)
    assert first == again
    assert first != other
    assert first[0] != first[1]  # two samplers, two streams
    explicit = [np.zeros(8, np.int64) for _ in range(2)]
    for actions in explicit:
        SoftmaxSampler(logits, actions, seed=7).sample()
    assert explicit[0].tolist() == explicit[1].tolist()


def _child_draws(seed: int, queue: mp.Queue) -> None:
    torch.manual_seed(seed)
    queue.put(sample_softmax(np.zeros((16, 18), np.float32)).tolist())


def test_forked_children_seed_their_streams_from_their_own_torch_seed():
    torch.manual_seed(0)
    sample_softmax(np.zeros((1, 2), np.float32))  # the parent's stream exists before fork
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    results = []
    for seed in (1, 2, 1):
        child = ctx.Process(target=_child_draws, args=(seed, queue))
        child.start()
        results.append(queue.get(timeout=30))
        child.join(30)
    assert results[0] != results[1]
    assert results[0] == results[2]


def test_sampler_refuses_arrays_it_cannot_use():
    actions = np.zeros(2, np.int64)
    with pytest.raises(TypeError, match="float32"):
        SoftmaxSampler(np.zeros((2, 3), np.float64), actions)
    with pytest.raises(TypeError, match="int64"):
        SoftmaxSampler(np.zeros((2, 3), np.float32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="3 entries for 2 rows"):
        SoftmaxSampler(np.zeros((2, 3), np.float32), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        SoftmaxSampler(np.zeros((3, 2), np.float32).T, actions)
    with pytest.raises(ValueError, match="shape"):
        sample_softmax(np.zeros((2, 0), np.float32))


def test_step_copies_write_each_source_into_its_row():
    slots = np.zeros((3, 5, 2), np.float32)  # 3 slots of 5 steps
    flags = np.zeros((3, 5), np.bool_)
    values = np.array([[1, 2], [3, 4]], np.float32)  # 2 envs
    done = np.array([True, False])
    copies = StepCopies(
        [
            (slots[2], values[0:1]),  # env 0 -> slot 2
            (slots[0], values[1:2]),  # env 1 -> slot 0
            (flags[2], done[0:1]),
            (flags[0], done[1:2]),
        ]
    )
    copies.run(3)
    values += 10  # sources are read at each run
    done[:] = [False, True]
    copies.run(4)
    expected = np.zeros((3, 5, 2), np.float32)
    expected[2, 3], expected[0, 3] = [1, 2], [3, 4]
    expected[2, 4], expected[0, 4] = [11, 12], [13, 14]
    np.testing.assert_array_equal(slots, expected)
    assert flags[2].tolist() == [False, False, False, True, False]
    assert flags[0].tolist() == [False, False, False, False, True]
    row = np.zeros(2, np.float32)
    StepCopies([(row[None], values[1])]).run()
    assert row.tolist() == [13, 14]


def test_step_copies_refuse_bad_pairs_and_steps():
    dst = np.zeros((4, 3), np.int64)
    copies = StepCopies([(dst, np.ones(3, np.int64))])
    with pytest.raises(IndexError, match="0..3"):
        copies.run(4)
    with pytest.raises(IndexError):
        copies.run(-1)
    assert not dst.any()
    with pytest.raises(TypeError, match="int64"):
        StepCopies([(dst, np.ones(3, np.int32))])
    with pytest.raises(ValueError, match="no step"):
        StepCopies([(dst, np.ones(4, np.int64))])
    with pytest.raises(ValueError, match="C-contiguous"):
        StepCopies([(np.zeros((3, 4), np.int64).T, np.ones(3, np.int64))])
