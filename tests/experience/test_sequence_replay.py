"""Contract of beast.experience.sequence_replay: sequence building, prioritized sampling, weights,
dedup.

SequenceBuilder is checked against the R2D2 layout on random streams with
episode ends (windows every seq_len - overlap steps, never crossing an
episode, terminal row plus masked padding, the state at each window's
start, and every step trained exactly once when burn-in equals the
overlap). PrioritizedReplay is checked for its sampling law (P = p^alpha /
sum p^alpha, the weights of an independent loop reference), the
generation guard, frame deduplication (bit-identical batches), and writers
in other processes.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from beast.experience.prioritized import importance_weights, stratified_draws, stratified_parts
from beast.experience.sequence_replay import (
    PrioritizedReplay,
    SequenceBuilder,
    replay_footprint,
    sequence_spec,
    storage_spec,
)
from beast.fields import Field, box_obs

pytestmark = pytest.mark.usefixtures("watchdog")


# The policy's record, as an epsilon-greedy policy's: the action alone.
RECORD = {"action": Field((), torch.int64)}


def vector_spec(seq_len, obs_size=3, state_shapes=((1, 4),)):
    return sequence_spec(
        seq_len=seq_len,
        obs=box_obs((obs_size,), np.float32),
        record=RECORD,
        core_state_shapes=state_shapes,
    )


def random_stream(num_steps, seed, end_prob=0.04, frames=None):
    """Steps as an actor writes them: row s of the stream carries a unique id in
    its reward (s + 1) and obs, its episode id, and a state equal to its id.
    done marks the first row of every episode after the first (and row 0). Half
    the episode ends are terminations (the episode's next row is the reset one,
    `terminated`), half truncations (a row of the old episode with `truncated`,
    its final observation, then the reset row, `done` only: beast/envs/batch.py)."""
    rng = random.Random(seed)
    episode, steps, truncating = 0, [], False
    for s in range(num_steps):
        done = s == 0 or truncating or rng.random() < end_prob
        terminated = done and s > 0 and not truncating
        truncated = False
        if terminated and rng.random() < 0.5:
            # This row becomes the old episode's final observation instead.
            done = terminated = False
            truncated = True
        truncating = truncated
        if done and s > 0:
            episode += 1
        steps.append(
            {
                "obs": torch.tensor([s, episode, 0.0]),
                "reward": float(s + 1),
                "done": done,
                "terminated": terminated,
                "truncated": truncated,
                "last_action": s % 5,
                "action": (s + 1) % 5,
                "_episode": episode,
                "_state": torch.full((1, 4), float(s)),
            }
        )
    return steps


def build_all(builder, stream):
    sequences = []
    for step in stream:
        out = builder.append(step, (step["_state"],))
        if out is not None:
            sequences.append(out)
    return sequences


@pytest.mark.parametrize("seq_len, overlap", [(8, 4), (5, 2), (6, 0), (4, 3), (2, 1), (1, 0)])
@pytest.mark.parametrize("seed", range(3))
def test_builder_layout(seq_len, overlap, seed):
    stream = random_stream(400, seed)
    builder = SequenceBuilder(vector_spec(seq_len), seq_len, overlap)
    sequences = build_all(builder, stream)
    stride = seq_len - overlap
    episode_start = {}
    for s, step in enumerate(stream):
        episode_start.setdefault(step["_episode"], s)
    for seq in sequences:
        ids = [int(r) - 1 for r in seq["reward"]]  # stream index of each row
        mask = seq["mask"].tolist()
        real = [i for i, m in zip(ids, mask, strict=True) if m]
        assert mask[0] and real == list(range(real[0], real[0] + len(real)))  # contiguous
        # Starts at its episode's first step plus a multiple of the stride.
        episode = stream[real[0]]["_episode"]
        assert (real[0] - episode_start[episode]) % stride == 0
        # Never crosses an episode: every real row is of one episode, and only
        # row 0 may start it.
        assert {stream[i]["_episode"] for i in real} == {episode}
        assert not seq["done"][1 : len(real)].any()
        assert not (seq["terminated"][1 : len(real)].any() or seq["truncated"][: len(real)].any())
        assert seq["done"][0].item() == stream[real[0]]["done"]
        # The stored state is the one fed with the first row.
        assert torch.equal(seq["core_state_0"], stream[real[0]]["_state"])
        if len(real) < seq_len + 1:
            # Terminal row, unmasked: the next episode's first step (a termination), or
            # this episode's final observation (a truncation); then padding, terminal.
            terminal = len(real)
            step = stream[ids[terminal]]
            assert ids[terminal] == real[-1] + 1 and (step["terminated"] or step["truncated"])
            assert seq["truncated"][terminal].item() == step["truncated"]
            assert seq["terminated"][terminal].item() == step["terminated"]
            assert (step["_episode"] == episode) == step["truncated"]
            assert seq["terminated"][terminal + 1 :].all() and not seq["mask"][terminal:].any()
            assert (seq["reward"][terminal + 1 :] == 0).all()
            assert (seq["obs"][terminal + 1 :] == 0).all()
        for key in ("obs", "last_action", "action"):
            for row, i in enumerate(real):
                assert torch.equal(
                    seq[key][row], torch.as_tensor(stream[i][key]).to(seq[key].dtype)
                )


@pytest.mark.parametrize("seq_len, overlap", [(8, 4), (6, 3), (10, 5)])
def test_every_step_trained_exactly_once_with_burn_in_equal_to_overlap(seq_len, overlap):
    """R2D2's layout: with burn_in = overlap and k-step targets at the sequence
    end, each step after an episode's first `burn_in` steps is trained (a real
    row in [burn_in, seq_len), so with a row after it) in exactly one
    sequence, and that row after it is its true successor (or the terminal
    row)."""
    burn_in = overlap
    stream = random_stream(600, 0, end_prob=0.03)
    sequences = build_all(SequenceBuilder(vector_spec(seq_len), seq_len, overlap), stream)
    trained = {}
    for seq in sequences:
        ids = [int(r) - 1 for r in seq["reward"]]
        mask = seq["mask"].tolist()
        for row in range(burn_in, seq_len):
            if mask[row]:
                assert ids[row + 1] == ids[row] + 1
                trained[ids[row]] = trained.get(ids[row], 0) + 1
    assert set(trained.values()) == {1}
    # Which steps: all but the first burn_in of each episode, up to the last
    # window that was closed (the stream's open window is not emitted yet).
    last = max(trained)
    starts = [s for s, step in enumerate(stream) if step["done"]]
    untrained = {s + k for s in starts for k in range(burn_in)}
    # A truncated row is an episode's final observation: no action was taken from it.
    untrained |= {s for s, step in enumerate(stream) if step["truncated"]}
    expected = {s for s in range(last + 1) if s not in untrained}
    assert set(trained) == expected


def test_builder_checks_and_reset():
    spec = vector_spec(4)
    with pytest.raises(ValueError, match="seq_overlap"):
        SequenceBuilder(spec, 4, 4)
    with pytest.raises(ValueError, match="seq_len"):
        SequenceBuilder(spec, 5, 1)
    builder = SequenceBuilder(spec, 4, 1)
    stream = random_stream(4, 0, end_prob=0.0)
    with pytest.raises(ValueError, match="core state"):
        builder.append(stream[0], ())
    for step in stream:
        assert builder.append(step, (step["_state"],)) is None
    builder.reset()
    # After a reset the next window starts afresh: 5 more rows, one sequence.
    more = random_stream(10, 1, end_prob=0.0)[5:]
    outs = [builder.append(step, (step["_state"],)) for step in more]
    assert outs[:4] == [None] * 4
    assert outs[4]["reward"].tolist() == [6.0, 7.0, 8.0, 9.0, 10.0]
    # The next window starts 3 steps in: it shares 2 rows with this one.
    outs = [
        builder.append(step, (step["_state"],)) for step in random_stream(13, 1, end_prob=0.0)[10:]
    ]
    assert outs[:2] == [None, None] and outs[2]["reward"].tolist() == [9.0, 10.0, 11.0, 12.0, 13.0]


# Replay.


def filled_sequence(spec, value, mask_rows=None):
    """Every field of a sequence set to `value` (state and obs too)."""
    seq = {}
    for key, field in spec.items():
        seq[key] = torch.full(field.shape, value).to(field.dtype)
    seq["mask"] = torch.ones(spec["mask"].shape, dtype=torch.bool)
    if mask_rows is not None:
        seq["mask"][mask_rows:] = False
    return seq


def test_sample_layout_is_time_major():
    spec = vector_spec(6, obs_size=3, state_shapes=((1, 4), (1, 4)))
    replay = PrioritizedReplay(spec, 10)
    for v in range(3):
        replay.add(filled_sequence(spec, float(v)))
    assert len(replay) == 3
    sample = replay.sample(5, torch.Generator().manual_seed(0))
    batch = sample.batch
    assert batch["obs"].shape == (7, 5, 3) and batch["reward"].shape == (7, 5)
    assert batch["core_state_0"].shape == (1, 5, 4) and batch["core_state_1"].shape == (1, 5, 4)
    assert batch["action"].dtype == torch.int64 and batch["mask"].dtype == torch.bool
    for b, index in enumerate(sample.indices.tolist()):
        assert (batch["obs"][:, b] == index).all() and (batch["core_state_0"][:, b] == index).all()
    assert sample.weights.dtype == torch.float32 and sample.weights.max() == 1.0


def test_new_sequences_enter_with_the_max_priority():
    spec = vector_spec(4)
    replay = PrioritizedReplay(spec, 8, alpha=0.5)
    replay.add(filled_sequence(spec, 0.0))
    assert replay.tree.get([0]).item() == 1.0  # default_priority ** alpha
    replay.add(filled_sequence(spec, 1.0), priority=16.0)
    assert replay.tree.get([1]).item() == 4.0  # 16 ** 0.5
    replay.add(filled_sequence(spec, 2.0))
    assert replay.tree.get([2]).item() == 4.0  # the max
    # The max of what is stored now, not a running max.
    replay.update_priorities([1, 2], [1.0, 0.25], replay.tree.generations([1, 2]))
    replay.add(filled_sequence(spec, 3.0))
    assert replay.tree.get([3]).item() == 1.0


def test_sampling_law_and_weights_match_reference():
    """P(i) = p_i^alpha / sum_j p_j^alpha, and the weights equal an independent
    loop over (N P(i))^-beta / max."""
    spec = vector_spec(3)
    capacity, alpha, beta = 50, 0.9, 0.6
    replay = PrioritizedReplay(spec, capacity, alpha=alpha, beta=beta)
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.01, 5.0, capacity)
    for i in range(capacity):
        replay.add(filled_sequence(spec, float(i)), priority=float(priorities[i]))
    generator = torch.Generator().manual_seed(0)
    scaled = priorities**alpha
    expected_probs = scaled / scaled.sum()
    counts = np.zeros(capacity)
    for _ in range(100):
        sample = replay.sample(100, generator)
        np.testing.assert_allclose(
            sample.probabilities.numpy(), expected_probs[sample.indices.numpy()], rtol=1e-12
        )
        # Reference weights, written out as a loop.
        probs = sample.probabilities.tolist()
        raw = [(capacity * p) ** -beta for p in probs]
        expected_weights = [w / max(raw) for w in raw]
        np.testing.assert_allclose(sample.weights.numpy(), expected_weights, rtol=1e-6)
        counts += np.bincount(sample.indices.numpy(), minlength=capacity)
    # 1e4 draws: each count within 5 binomial sigmas (plus 1) of its expectation.
    expected = 1e4 * expected_probs
    sigma = np.sqrt(expected * (1 - expected_probs))
    assert (np.abs(counts - expected) <= 5 * sigma + 1).all()


def test_importance_weights_reference_and_checks():
    probabilities = torch.tensor([0.1, 0.4, 0.05, 0.2], dtype=torch.float64)
    n = 37  # any N: it cancels in the normalisation
    raw = [(n * p) ** -0.6 for p in probabilities.tolist()]
    np.testing.assert_allclose(
        importance_weights(probabilities, 0.6).numpy(), [w / max(raw) for w in raw], rtol=1e-6
    )
    assert importance_weights(probabilities, 0.0).tolist() == [1.0] * 4
    assert importance_weights(probabilities, 1.0).max() == 1.0
    with pytest.raises(ValueError):
        importance_weights(probabilities, 1.5)
    with pytest.raises(ValueError):
        importance_weights(torch.tensor([0.0, 1.0]), 0.5)


def test_stratified_draws_cover_each_slice():
    draws = stratified_draws(1000, torch.Generator().manual_seed(0))
    assert draws.dtype == torch.float64
    assert (torch.floor(draws * 1000) == torch.arange(1000)).all()


def test_stratified_parts_stratify_each_batch_over_the_whole_mass():
    """A block of 4 batches of 250: 1000 strata, batch i takes strata i, i + 4, ...: each
    batch has one draw in every 250th of the mass, as a batch drawn alone does."""
    draws = stratified_parts(250, 4, torch.Generator().manual_seed(0))
    strata = torch.floor(draws * 1000).long()
    assert sorted(strata.tolist()) == list(range(1000))
    for i, part in enumerate(strata.view(4, 250)):
        assert part.tolist() == list(range(i, 1000, 4))
        assert (torch.floor(part / 4) == torch.arange(250)).all()


def test_a_block_of_batches_keeps_each_batchs_weights_and_law():
    """parts=3: every batch's importance weights are normalised over that batch alone (the
    reference loop of one batch), and the probabilities are the sampling law's."""
    spec = vector_spec(3)
    capacity, alpha, beta = 40, 0.7, 0.5
    replay = PrioritizedReplay(spec, capacity, alpha=alpha, beta=beta)
    priorities = np.random.default_rng(1).uniform(0.01, 5.0, capacity)
    for i in range(capacity):
        replay.add(filled_sequence(spec, float(i)), priority=float(priorities[i]))
    sample = replay.sample(10, torch.Generator().manual_seed(0), parts=3)
    assert sample.indices.shape == (30,) and sample.batch["obs"].shape[1] == 30
    scaled = priorities**alpha
    np.testing.assert_allclose(
        sample.probabilities.numpy(), (scaled / scaled.sum())[sample.indices.numpy()], rtol=1e-12
    )
    for part in range(3):
        probs = sample.probabilities[part * 10 : (part + 1) * 10].tolist()
        raw = [(capacity * p) ** -beta for p in probs]
        np.testing.assert_allclose(
            sample.weights[part * 10 : (part + 1) * 10].numpy(),
            [w / max(raw) for w in raw],
            rtol=1e-6,
        )
        assert float(sample.weights[part * 10 : (part + 1) * 10].max()) == 1.0


def test_update_after_overwrite_is_dropped_and_ring_order():
    spec = vector_spec(3)
    replay = PrioritizedReplay(spec, 3, alpha=1.0)
    for v in range(3):
        replay.add(filled_sequence(spec, float(v)))
    sample = replay.sample(3, torch.Generator().manual_seed(0))
    assert sorted(set(sample.indices.tolist())) == [0, 1, 2]
    # Slot 0 is overwritten (the ring's oldest) before the learner reports back.
    assert replay.add(filled_sequence(spec, 9.0)) == 0
    applied = replay.update_priorities(sample.indices, torch.full((3,), 5.0), sample.generations)
    slot0 = (sample.indices == 0).sum().item()
    assert applied == 3 - slot0
    assert replay.tree.get([0]).item() == 1.0  # the new data keeps its entry priority
    assert replay.tree.get([1, 2]).tolist() == [5.0, 5.0]
    assert len(replay) == 3
    with pytest.raises(ValueError, match="finite"):
        replay.update_priorities([1], [float("nan")], replay.tree.generations([1]))


def test_zero_td_priorities_are_floored():
    spec = vector_spec(3)
    replay = PrioritizedReplay(spec, 2, alpha=0.5, min_priority=1e-4)
    replay.add(filled_sequence(spec, 0.0))
    replay.update_priorities([0], [0.0], replay.tree.generations([0]))
    assert replay.tree.get([0]).item() == pytest.approx(1e-2)  # (1e-4) ** 0.5
    replay.sample(1)  # still sampleable


def test_empty_replay_cannot_be_sampled_and_shapes_are_checked():
    spec = vector_spec(3)
    replay = PrioritizedReplay(spec, 4)
    with pytest.raises(ValueError, match="priority"):
        replay.sample(2)
    bad = filled_sequence(spec, 0.0)
    bad["obs"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="obs"):
        replay.add(bad)


# Frame deduplication.


def atari_like_stream(num_steps, seed, frame_shape=(6, 5), stack=4):
    """Sliding frame stacks as beast's FrameStack makes them: the reset frame
    repeated after a reset, then one new frame per step."""
    rng = np.random.default_rng(seed)
    steps, frames = [], None
    for s in range(num_steps):
        frame = torch.from_numpy(rng.integers(0, 256, frame_shape, dtype=np.uint8))
        done = s == 0 or rng.random() < 0.05
        # A reset fills the stack with its first frame; a step slides it.
        frames = [frame] * stack if done else [*frames[1:], frame]
        steps.append(
            {
                "obs": torch.stack(frames),
                "reward": float(s),
                "done": done,
                "terminated": done and s > 0,
                "truncated": False,
                "last_action": 0,
                "action": int(rng.integers(0, 3)),
                "_state": torch.full((1, 2), float(s)),
            }
        )
    return steps


def test_frame_dedup_rebuilds_identical_batches():
    seq_len, overlap = 8, 4
    spec = sequence_spec(
        seq_len=seq_len,
        obs=box_obs((4, 6, 5), np.uint8),
        record=RECORD,
        core_state_shapes=[(1, 2)],
    )
    sequences = build_all(SequenceBuilder(spec, seq_len, overlap), atari_like_stream(300, 0))
    plain = PrioritizedReplay(spec, 64)
    dedup = PrioritizedReplay(spec, 64, frame_dedup=True)
    assert "frames" in dedup.tensors and "obs" not in dedup.tensors
    for seq in sequences[:64]:
        plain.add(seq)
        dedup.add(seq)
    a = plain.sample(32, torch.Generator().manual_seed(1))
    b = dedup.sample(32, torch.Generator().manual_seed(1))
    assert torch.equal(a.indices, b.indices)
    for key in a.batch:
        if key != "obs":
            assert torch.equal(a.batch[key], b.batch[key]), key
    # Observations are identical on every real row (terminal rows and padding
    # are stored by their newest frame only; no loss reads them).
    mask = a.batch["mask"]
    assert torch.equal(a.batch["obs"][mask], b.batch["obs"][mask])
    assert b.batch["obs"].shape == a.batch["obs"].shape and b.batch["obs"].is_contiguous()


def test_frame_dedup_rejects_non_sliding_stacks():
    spec = sequence_spec(seq_len=4, obs=box_obs((4, 3, 3), np.uint8), record=RECORD)
    replay = PrioritizedReplay(spec, 4, frame_dedup=True)
    seq = filled_sequence(spec, 0)
    seq["obs"] = torch.randint(0, 255, (5, 4, 3, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="sliding"):
        replay.add(seq)
    with pytest.raises(ValueError, match="frame-stacked"):
        PrioritizedReplay(vector_spec(4), 4, frame_dedup=True)


def test_replay_footprint_atari():
    """R2D2 on Atari: 80-step sequences (81 rows) of uint8 [4, 84, 84], LSTM state 2 x 512."""
    spec = sequence_spec(
        seq_len=80,
        obs=box_obs((4, 84, 84), np.uint8),
        record=RECORD,
        core_state_shapes=[(1, 512)] * 2,
    )
    # Per sequence: everything but obs is reward 324 + done, terminated and truncated
    # 3 * 81 + last_action 648 + action 648 + mask 81 + state 4096 = 6040 bytes.
    plain = replay_footprint(spec, frame_dedup=False, seq_overlap=40)
    assert plain.per_sequence == 81 * 4 * 84 * 84 + 6040
    dedup = replay_footprint(spec, frame_dedup=True, seq_overlap=40)
    assert dedup.per_sequence == 84 * 84 * 84 + 6040
    assert dedup.per_stored_step == pytest.approx(dedup.per_sequence / 81)
    assert dedup.per_env_step == pytest.approx(dedup.per_sequence / 40)
    assert plain.per_stored_step / dedup.per_stored_step > 3.8
    assert storage_spec(spec, True)["frames"].shape == (84, 84, 84)


# Processes.


def _writer(replay, first, count):
    """Add sequences whose every field holds one id, as fast as possible."""
    for value in range(first, first + count):
        replay.add(filled_sequence(replay.spec, float(value % 200)))


def test_writers_in_other_processes_and_no_torn_sample_counts(processes, forkserver):
    """Two child processes add while the parent samples. A slot rewritten
    while the parent copied it may mix two sequences; such a sample must come
    back with weight 0, and every sample with weight > 0 must be one sequence."""
    spec = vector_spec(16, obs_size=64)
    replay = PrioritizedReplay(spec, 8)
    replay.add(filled_sequence(spec, 0.0))
    children = [
        processes.start(forkserver, _writer, replay, 1000 * i, 1500, name=f"writer-{i}")
        for i in range(2)
    ]
    generator = torch.Generator().manual_seed(0)
    samples = 0
    while any(child.is_alive() for child in children) or samples < 50:
        sample = replay.sample(8, generator)
        samples += 1
        for b in range(8):
            if sample.weights[b] > 0:
                values = torch.cat(
                    [sample.batch[k][:, b].flatten().float() for k in ("obs", "reward")]
                )
                assert (values == values[0]).all(), "a torn sequence was sampled with weight > 0"
    for child in children:
        child.join(10)
        assert child.exitcode == 0
    assert replay.tree.stats().claims == 1 + 2 * 1500
    assert len(replay) == 8
