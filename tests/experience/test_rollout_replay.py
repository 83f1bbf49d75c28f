"""Contract of beast.experience.rollout_replay: FIFO overwrite order, uniform sampling without
replacement within a call, every field of a rollout kept together (behaviour
logits and initial recurrent state included), copies out, shared memory, and
concurrent add/sample without torn rollouts."""

from __future__ import annotations

import threading

import pytest
import torch

from beast.algos.policies import CategoricalPolicy
from beast.experience.rollout_replay import RolloutReplay
from beast.experience.rollout_slots import rollout_spec
from beast.fields import box_obs

UNROLL_LENGTH = 3
NUM_ACTIONS = 2


def make_spec():
    # An LSTM-like state of two tensors, so the core_state_i fields are exercised.
    return rollout_spec(
        unroll_length=UNROLL_LENGTH,
        obs=box_obs((5,), torch.uint8),
        record=CategoricalPolicy(NUM_ACTIONS).record_spec(),
        core_state_shapes=[(1, 6), (1, 6)],
    )


def make_batch(spec, ids):
    """A time-major batch (batch dim 1 for every field) whose rollout b has every
    element of every field equal to ids[b] (mod 2 for bool fields, 250 for obs)."""
    batch = {}
    for key, f in spec.items():
        columns = []
        for rollout_id in ids:
            value = rollout_id % 2 if f.dtype == torch.bool else rollout_id % 250
            columns.append(torch.full(f.shape, value).to(f.dtype))
        batch[key] = torch.stack(columns, dim=1)
    batch["rollout_id"] = torch.stack(
        [torch.full(spec["rollout_id"].shape, i, dtype=torch.int64) for i in ids], dim=1
    )
    return batch


def column_ids(batch):
    """The id of each column, checking that every field of the column agrees with it."""
    ids = batch["rollout_id"][0].tolist()
    for b, rollout_id in enumerate(ids):
        assert torch.all(batch["rollout_id"][:, b] == rollout_id)
        for key, tensor in batch.items():
            column = tensor.select(1, b)
            if tensor.dtype == torch.bool:
                expected = bool(rollout_id % 2)
            elif key == "rollout_id":
                expected = rollout_id
            else:
                expected = rollout_id % 250
            assert torch.all(column == expected), (key, rollout_id)
    return ids


def held_ids(replay):
    return sorted(column_ids(replay.sample(len(replay))))


def test_fifo_keeps_the_newest_and_overwrites_the_oldest():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=4)
    assert len(replay) == 0
    added: list[int] = []
    next_id = 0
    # Chunks of different sizes, wrapping around the ring several times.
    for size in (1, 2, 3, 1, 4, 2, 5):
        ids = list(range(next_id, next_id + size))
        next_id += size
        replay.add(make_batch(spec, ids))
        added += ids
        assert len(replay) == min(len(added), 4)
        assert held_ids(replay) == added[-4:]


def test_adding_more_than_capacity_at_once_keeps_the_last():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=3)
    replay.add(make_batch(spec, [0]))
    replay.add(make_batch(spec, list(range(1, 8))))
    assert held_ids(replay) == [5, 6, 7]
    # The next add overwrites the oldest of those, 5.
    replay.add(make_batch(spec, [8]))
    assert held_ids(replay) == [6, 7, 8]


def test_a_sample_keeps_each_rollouts_fields_together():
    # column_ids checks every field of every sampled column against its rollout's id:
    # observations, actions, behaviour logits and the initial recurrent state.
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=8)
    replay.add(make_batch(spec, list(range(11))))
    sample = replay.sample(5)
    assert set(sample) == set(spec)
    for key, f in spec.items():
        # Rollout fields [T+1, B, ...]; core-state fields [d0, B, ...], as the model's
        # state tensors have them: the batch at dim 1 either way.
        assert sample[key].shape == (f.shape[0], 5, *f.shape[1:]), key
        assert sample[key].dtype == f.dtype
    assert set(column_ids(sample)) <= set(range(3, 11))


def test_sampling_is_uniform_and_without_replacement_within_a_call():
    spec = make_spec()
    capacity, per_call, calls = 10, 3, 2000
    replay = RolloutReplay(spec, capacity=capacity, seed=0)
    replay.add(make_batch(spec, list(range(25))))  # wrapped: holds 15..24
    counts = dict.fromkeys(range(15, 25), 0)
    for _ in range(calls):
        ids = replay.sample(per_call)["rollout_id"][0].tolist()
        assert len(set(ids)) == per_call
        for rollout_id in ids:
            counts[rollout_id] += 1
    expected = calls * per_call / capacity
    chi_square = sum((count - expected) ** 2 / expected for count in counts.values())
    # Bound: the chi-square distribution's 0.999 quantile for 9 degrees of freedom is
    # 27.88: a uniform sampler exceeds it with probability 0.001 (this seed gives 8.9),
    # and one that drew a single row 20% more often than the others would add about 21
    # in expectation to the ~9 of chance.
    assert chi_square < 27.88, counts


def test_the_same_seed_samples_the_same_rollouts():
    spec = make_spec()
    replays = [RolloutReplay(spec, capacity=6, seed=7) for _ in range(2)]
    for replay in replays:
        replay.add(make_batch(spec, list(range(9))))
    for _ in range(5):
        assert column_ids(replays[0].sample(3)) == column_ids(replays[1].sample(3))


def test_a_sample_is_a_copy():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=2)
    replay.add(make_batch(spec, [0, 1]))
    sample = replay.sample(2)
    before = {key: value.clone() for key, value in sample.items()}
    replay.add(make_batch(spec, [2, 3]))  # overwrites both rows
    for key in before:
        assert torch.equal(sample[key], before[key])
    sample["obs"].fill_(99)
    assert 99 not in replay.tensors["obs"]


def test_memory_is_shared_and_counted():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=7)
    assert all(tensor.is_shared() for tensor in replay.tensors.values())
    per_rollout = sum(
        torch.Size(f.shape).numel() * torch.empty((), dtype=f.dtype).element_size()
        for f in spec.values()
    )
    assert replay.nbytes() == 7 * per_rollout


def test_bad_requests_raise():
    spec = make_spec()
    with pytest.raises(ValueError, match="capacity"):
        RolloutReplay(spec, capacity=0)
    replay = RolloutReplay(spec, capacity=4)
    with pytest.raises(ValueError, match="holding 0"):
        replay.sample(1)
    replay.add(make_batch(spec, [0, 1]))
    with pytest.raises(ValueError, match="cannot sample 3"):
        replay.sample(3)
    with pytest.raises(ValueError, match="cannot sample 0"):
        replay.sample(0)


def test_concurrent_adds_and_samples_never_tear_a_rollout(watchdog):
    # Two batch threads share one replay in the learner; a sample copying a row
    # while an add overwrites it would mix two rollouts' fields, which column_ids
    # detects.
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=5)
    replay.add(make_batch(spec, [0, 1]))
    errors: list[BaseException] = []

    def adder(start: int) -> None:
        try:
            for i in range(150):
                replay.add(make_batch(spec, [start + 2 * i, start + 2 * i + 1]))
        except BaseException as error:
            errors.append(error)

    def sampler() -> None:
        try:
            for _ in range(300):
                column_ids(replay.sample(2))
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=adder, args=(1000,)),
        threading.Thread(target=adder, args=(5000,)),
        threading.Thread(target=sampler),
        threading.Thread(target=sampler),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(replay) == 5


def write_while_adding(replay, spec, new_ids):
    """A checkpoint as `RolloutSource.save_replay` makes it, with an add of `new_ids`
    landing halfway through the write: the fields written before it hold the old rows,
    those after it the new ones. Returns the written tensors and the settled state."""
    tensors, state = replay.contents()
    written = {}
    for index, (key, tensor) in enumerate(tensors.items()):
        if index == len(tensors) // 2:
            replay.add(make_batch(spec, new_ids))
        written[key] = tensor.clone()
    return written, replay.settle(state)


def test_a_checkpoint_written_while_adding_restores_only_untouched_rollouts():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=5)
    replay.add(make_batch(spec, [0, 1, 2, 3, 4]))
    replay.add(make_batch(spec, [5, 6]))  # rows hold 5, 6, 2, 3, 4: row 2 the oldest
    written, state = write_while_adding(replay, spec, [7, 8])  # overwrites 2 and 3
    assert state["intact"].tolist() == [True, True, False, False, True]

    restored = RolloutReplay(spec, capacity=5)
    restored.restore(written, state)
    assert held_ids(restored) == [4, 5, 6]
    # The ring goes on after the kept rollouts, from the oldest: 4 goes first.
    restored.add(make_batch(spec, [9, 10, 11]))
    assert held_ids(restored) == [5, 6, 9, 10, 11]


def test_without_settling_a_torn_row_would_be_restored():
    # The hazard the settling removes: the same write restored without "intact" mixes
    # two rollouts' fields in a row, which column_ids catches.
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=3)
    replay.add(make_batch(spec, [0, 1, 2]))
    written, state = write_while_adding(replay, spec, [3])
    unsettled = {key: value for key, value in state.items() if key != "intact"}
    restored = RolloutReplay(spec, capacity=3)
    restored.restore(written, unsettled)
    with pytest.raises(AssertionError):
        held_ids(restored)


def test_a_filling_replay_checkpointed_quietly_restores_whole():
    spec = make_spec()
    replay = RolloutReplay(spec, capacity=6)
    replay.add(make_batch(spec, [0, 1, 2, 3]))
    tensors, state = replay.contents()
    written = {key: tensor.clone() for key, tensor in tensors.items()}
    state = replay.settle(state)
    assert state["intact"].tolist() == [True] * 4
    restored = RolloutReplay(spec, capacity=6)
    restored.restore(written, state)
    assert held_ids(restored) == [0, 1, 2, 3]
    restored.add(make_batch(spec, [4, 5, 6]))
    assert held_ids(restored) == [1, 2, 3, 4, 5, 6]
