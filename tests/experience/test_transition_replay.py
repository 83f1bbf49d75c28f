"""Contract of beast.experience.transition_replay: rings of steps, n-step windows, frame dedup.

Every test writes a random step stream with the env batch's semantics (beast/envs/batch.py):
row t's reward and terminated flag belong to the transition INTO row t; a stream's first
row is a reset (done); a terminated row is done and already holds the next episode's first
stack; a truncated row holds the old episode's final observation (not done) and the next
row is the reset (done, reward 0, neither flag); after any reset the 4-frame stack holds 4
copies of the first frame, then slides. The stacks the env returned are kept naively, one
per (env, absolute step), and whatever the replay gives back is compared with them and
with n-step windows computed here from the raw stream.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from beast.experience.transition_replay import (
    RingAppender,
    RingReplay,
    TransitionSink,
    ring_footprint,
    step_spec,
)
from beast.fields import Field, box_obs
from beast.native import SumTree

pytestmark = pytest.mark.usefixtures("watchdog")

STACK, H, W = 4, 6, 5
N_STEP = 3
NUM_ACTIONS = 6
RECORD = {"action": Field((), torch.int64)}
SPEC = step_spec(box_obs((STACK, H, W), torch.uint8), RECORD)
ROW_KEYS = ("reward", "done", "terminated", "truncated", "last_action", "action")


@dataclass
class Row:
    obs: np.ndarray  # uint8 [STACK, H, W], the stack the env returned
    reward: np.float32
    done: bool
    terminated: bool
    truncated: bool
    last_action: int
    action: int
    exact: bool  # the stack is its newest frames with the reset rule (by construction)


class EnvStream:
    """One env's steps, drawn at random: terminations, truncations (then a reset row), and
    envs recreated mid-episode (a bare done row). With ``p_inexact`` a reset row after a
    truncation is the ALE vector backend's restarted row: its stack is not 4 copies of
    its newest frame, and the next two rows slide from it."""

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        p_term: float = 0.1,
        p_trunc: float = 0.07,
        p_recreate: float = 0.03,
        p_inexact: float = 0.0,
    ) -> None:
        self.rng = rng
        self.p_term, self.p_trunc, self.p_recreate = p_term, p_trunc, p_recreate
        self.p_inexact = p_inexact
        self.rows: list[Row] = []
        self._reset_next = True  # the stream's first row is a reset
        self._stack: np.ndarray | None = None
        self._taint = 0  # rows left whose stack slides from an inexact restart

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, size=(H, W), dtype=np.uint8)

    def step(self) -> Row:
        rng = self.rng
        frame = self._frame()
        action = int(rng.integers(NUM_ACTIONS))
        last_action = self.rows[-1].action if self.rows else 0
        reward = np.float32(rng.standard_normal())
        done = terminated = truncated = False
        restart = self._reset_next
        self._reset_next = False
        if restart:
            reward = np.float32(0.0)
        else:
            u = rng.random()
            if u < self.p_term:
                terminated = True
            elif u < self.p_term + self.p_trunc:
                truncated = True
                self._reset_next = True
            elif u < self.p_term + self.p_trunc + self.p_recreate:
                restart = True  # env recreated mid-episode: done, no flag
        if restart or terminated:
            done = True
            if restart and self.rows and self.rows[-1].truncated and rng.random() < self.p_inexact:
                older = self._frame()
                stack = np.stack([older, older, older, frame])
                self._taint = STACK - 1
            else:
                stack = np.repeat(frame[None], STACK, axis=0)
                self._taint = 0
        else:
            stack = np.concatenate([self._stack[1:], frame[None]])
        exact = self._taint == 0
        self._taint = max(self._taint - 1, 0)
        self._stack = stack
        row = Row(stack, reward, done, terminated, truncated, last_action, action, exact)
        self.rows.append(row)
        return row


def step_arrays(rows: list[Row]) -> dict[str, np.ndarray]:
    """The `step_spec` fields of one step of n envs, as an appender takes them."""
    return {
        "obs": np.stack([r.obs for r in rows]),
        "reward": np.array([r.reward for r in rows], dtype=np.float32),
        "done": np.array([r.done for r in rows]),
        "terminated": np.array([r.terminated for r in rows]),
        "truncated": np.array([r.truncated for r in rows]),
        "last_action": np.array([r.last_action for r in rows], dtype=np.int64),
        "action": np.array([r.action for r in rows], dtype=np.int64),
    }


def expected_window(rows: list[Row], s: int, written: int):
    """The n-step window out of step s, from the raw stream: (rewards, k, terminal), or
    None when no transition starts at s (yet)."""
    if rows[s].truncated:
        return None  # the final observation: its action is never taken
    rewards = []
    for k in range(1, N_STEP + 1):
        if s + k >= written:
            return None  # not complete yet
        row = rows[s + k]
        if row.done and not row.terminated:
            return None  # env recreated mid-episode: the window is dropped
        rewards.append(row.reward)
        if row.terminated:
            return rewards, k, True
        if row.truncated:
            return rewards, k, False
    return rewards, N_STEP, False


def expected_transitions(replay: RingReplay, streams: list[EnvStream]) -> dict:
    """{(env, absolute step): window} of every transition the replay should sample now."""
    out = {}
    for e, stream in enumerate(streams):
        written = int(replay.written[e])
        # Steps the ring still holds whose stack's frames are all still there.
        first = max(0, written - replay.ring + replay.history)
        for s in range(first, written):
            window = expected_window(stream.rows, s, written)
            if window is None:
                continue
            _, k, terminal = window
            if replay.frame_dedup and not (
                stream.rows[s].exact and (terminal or stream.rows[s + k].exact)
            ):
                continue
            out[e, s] = window
    return out


def absolute_step(written: int, ring: int, slot: int) -> int:
    oldest = written - ring
    return oldest + (slot - oldest) % ring


def locate(replay: RingReplay, indices: torch.Tensor) -> list[tuple[int, int]]:
    """(env, absolute step) of replay slots."""
    written = replay.written.tolist()
    return [
        (e, absolute_step(written[e], replay.ring, slot))
        for e, slot in (divmod(i, replay.ring) for i in indices.tolist())
    ]


def sampleable(replay: RingReplay) -> set[tuple[int, int]]:
    """(env, absolute step) of every slot with a positive priority."""
    priorities = replay.tree.get(torch.arange(replay.capacity))
    return set(locate(replay, torch.nonzero(priorities > 0).flatten()))


def check_sample(replay: RingReplay, streams: list[EnvStream], sample, expected: dict) -> set:
    """Assert every sampled transition is the stream's, bit for bit; returns them."""
    batch = sample.batch
    seen = set()
    for b, (e, s) in enumerate(locate(replay, sample.indices)):
        assert (e, s) in expected, f"sampled env {e} step {s}, not a valid transition"
        seen.add((e, s))
        rewards, k, terminal = expected[e, s]
        rows = streams[e].rows
        assert int(batch["n_steps"][b]) == k, (e, s)
        assert bool(batch["terminal"][b]) == terminal, (e, s)
        want = np.zeros(N_STEP, dtype=np.float32)
        want[:k] = rewards
        assert torch.equal(batch["n_step_rewards"][:, b], torch.from_numpy(want)), (e, s)
        for t, step in enumerate((s, s + k)):
            assert torch.equal(batch["obs"][t, b], torch.from_numpy(rows[step].obs)), (e, s, t)
            for key in ROW_KEYS:
                assert batch[key][t, b].item() == getattr(rows[step], key), (e, s, t, key)
    assert bool((sample.weights > 0).all())
    return seen


def write_streams(appenders, streams, rng, ticks, on_tick=None):
    """Each tick, each appender writes one step of its envs with probability 0.75 (so the
    envs' written counts differ); `on_tick(tick)` after each tick."""
    for tick in range(ticks):
        for appender in appenders:
            if rng.random() < 0.75:
                envs = appender.envs.tolist()
                appender.append(step_arrays([streams[e].step() for e in envs]))
        if on_tick is not None:
            on_tick(tick)


def make_replay(*, ring=20, num_envs=3, **kwargs) -> RingReplay:
    kwargs.setdefault("n_step", N_STEP)
    return RingReplay(SPEC, num_envs=num_envs, capacity=ring * num_envs, **kwargs)


def minimal_ring(frame_dedup: bool) -> int:
    return N_STEP + (STACK - 1 if frame_dedup else 0) + 2


# 1. Randomised frame dedup and n-step windows.


@pytest.mark.parametrize("small", [False, True], ids=["ring20", "minring"])
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "per"])
@pytest.mark.parametrize("frame_dedup", [True, False], ids=["dedup", "nodedup"])
def test_samples_match_the_stream(frame_dedup, prioritized, small):
    """Samples from rings that wrapped many times are the env's stacks and rows, bit for
    bit, with the n-step windows of the raw stream; exactly the valid transitions are
    sampleable."""
    ring = minimal_ring(frame_dedup) if small else 20
    replay = make_replay(ring=ring, prioritized=prioritized, frame_dedup=frame_dedup)
    # Two appenders over disjoint env ranges, written at different times.
    appenders = [RingAppender(replay, 0, 1), RingAppender(replay, 1, 2)]
    rng = np.random.default_rng(1234 + 2 * frame_dedup + prioritized)
    streams = [EnvStream(rng) for _ in range(3)]
    generator = torch.Generator().manual_seed(5)
    seen: set = set()
    checks = 0

    def on_tick(tick):
        nonlocal seen, checks
        if tick < 30 or tick % 8:
            return
        expected = expected_transitions(replay, streams)
        assert sampleable(replay) == set(expected)
        if frame_dedup:
            for e in range(3):
                written = int(replay.written[e])
                steps = range(max(0, written - ring + replay.history), written)
                stacks = replay.observations(
                    "obs", torch.full((len(steps),), e), torch.tensor([s % ring for s in steps])
                )
                for s, stack in zip(steps, stacks, strict=True):
                    assert torch.equal(stack, torch.from_numpy(streams[e].rows[s].obs))
        for _ in range(2):
            sample = replay.sample(32, generator)
            seen |= check_sample(replay, streams, sample, expected)
            checks += 1
            if prioritized:
                td = torch.rand(32, generator=generator, dtype=torch.float64) * 3
                replay.update_priorities(sample.indices, td, sample.generations)

    write_streams(appenders, streams, rng, 320, on_tick)
    written = replay.written.tolist()
    assert min(written) > 10 * ring, written  # the rings wrapped many times
    assert written[0] != written[1]
    assert checks > 40
    # Windows of every kind were sampled: full, terminal, cut by a truncation; starting
    # at a reset row and at a terminated row.
    assert len(seen) > 100
    windows = [expected_window(streams[e].rows, s, written[e]) for e, s in seen]
    assert any(k == N_STEP and not terminal for _, k, terminal in windows)
    assert any(terminal for _, _, terminal in windows)
    assert any(k < N_STEP and not terminal for _, k, terminal in windows)
    assert any(streams[e].rows[s].terminated for e, s in seen)
    assert any(streams[e].rows[s].done and not streams[e].rows[s].terminated for e, s in seen)


# 2. Stacks that cannot be rebuilt.


@pytest.mark.parametrize("frame_dedup", [True, False], ids=["dedup", "nodedup"])
def test_unrebuildable_stacks_are_never_sampled(frame_dedup):
    """With frame dedup, a restarted row whose stack is not 4 copies of its frame (and the
    two rows sliding from it) never starts or bootstraps a sampled transition, and every
    other transition is sampled; without dedup, those are sampled too."""
    ring = 24
    replay = make_replay(ring=ring, prioritized=False, frame_dedup=frame_dedup)
    appenders = [RingAppender(replay, 0, 3)]
    rng = np.random.default_rng(99)
    streams = [EnvStream(rng, p_trunc=0.15, p_inexact=0.8) for _ in range(3)]
    generator = torch.Generator().manual_seed(0)
    excluded = covered = 0

    def on_tick(tick):
        nonlocal excluded, covered
        if tick < 30 or tick % 5:
            return
        expected = expected_transitions(replay, streams)
        assert sampleable(replay) == set(expected)
        # Uniform priorities and twice as many stratified draws as slots: every
        # sampleable slot holds a whole stratum, so each is drawn.
        sample = replay.sample(2 * replay.capacity, generator)
        seen = check_sample(replay, streams, sample, expected)
        assert seen == set(expected)
        covered += len(seen)
        for e, stream in enumerate(streams):
            written = int(replay.written[e])
            for s in range(max(0, written - ring + replay.history), written):
                window = expected_window(stream.rows, s, written)
                if window is None:
                    continue
                k, terminal = window[1], window[2]
                if not (stream.rows[s].exact and (terminal or stream.rows[s + k].exact)):
                    excluded += 1
                    assert ((e, s) in seen) == (not frame_dedup)

    write_streams(appenders, streams, rng, 300, on_tick)
    inexact = sum(not r.exact for stream in streams for r in stream.rows)
    assert inexact > 20
    assert excluded > 20
    assert covered > 1000


# 3. Bytes per stored Atari transition.


def test_atari_footprint(capsys):
    """Bytes per stored Atari transition (obs uint8 [4, 84, 84], int64 actions), with the
    sum-tree leaf: 7,110 with frame dedup, 28,278 without (0.251x); a 1M-transition replay
    takes 7.11e9 B (6.62 GiB) with dedup."""
    spec = step_spec(box_obs((4, 84, 84), torch.uint8), RECORD)
    dedup = ring_footprint(spec, frame_dedup=True)
    full = ring_footprint(spec, frame_dedup=False)
    ratio = dedup / full
    million = dedup * 1_000_000
    # The tree as allocated: leaves rounded up to a power of two, with inner nodes.
    tree_per_leaf = SumTree(1000)._tensor.numel() / 1000
    with capsys.disabled():
        print(
            f"\nAtari transition: {dedup:,} B with frame dedup, {full:,} B without"
            f" ({ratio:.3f}x); 1M transitions: {million / 2**30:.2f} GiB"
            f" (sum tree as allocated: {tree_per_leaf:.1f} B per slot)"
        )
    assert ratio <= 0.3
    assert million < 10 * 2**30
    assert dedup == 84 * 84 + 4 + 3 + 8 + 8 + 3 + 28
    # The stored fields are what a replay allocates per slot (all but the tree leaf).
    for frame_dedup, per_step in ((True, dedup), (False, full)):
        replay = RingReplay(spec, num_envs=2, capacity=16, n_step=N_STEP, frame_dedup=frame_dedup)
        assert replay.nbytes() == (per_step - 28) * replay.capacity


# 4. Stale samples.


def test_overwritten_samples_are_stale():
    """A sampled transition whose steps (or, with dedup, the frames its stack reads) were
    rewritten since has a new generation, and its priority update is dropped."""
    ring = 20
    replay = make_replay(ring=ring, prioritized=True, frame_dedup=True)
    appender = RingAppender(replay, 0, 3)
    rng = np.random.default_rng(7)
    streams = [EnvStream(rng, p_trunc=0.0, p_recreate=0.0, p_term=0.05) for _ in range(3)]
    write_streams([appender], streams, np.random.default_rng(1), 200)
    # Only the oldest slots are rewritten below: make sure they are in the batch.
    written = replay.written.tolist()
    sample = replay.sample(64, torch.Generator().manual_seed(3))
    before = replay.tree.get(sample.indices).clone()
    # Rewrite the next 6 steps of env 0 only: slots at steps written..written+5 and, for
    # dedup, the 3 after each.
    env0 = RingAppender(replay, 0, 1)
    for _ in range(6):
        env0.append(step_arrays([streams[0].step()]))
    touched = {(0, (written[0] + j) % ring) for j in range(6 + replay.history)}
    slots = [divmod(i, ring) for i in sample.indices.tolist()]
    stale = torch.tensor([slot in touched for slot in slots])
    assert stale.any() and (~stale).any(), "the batch should hold stale and fresh samples"
    generations = replay.tree.generations(sample.indices)
    assert torch.equal(generations != sample.generations, stale)
    middle = replay.tree.get(sample.indices).clone()
    assert torch.equal(middle[~stale], before[~stale])
    td = torch.linspace(0.5, 5.0, len(slots), dtype=torch.float64)
    # The last of a repeated index wins: give every copy of an index the same value.
    td = td[torch.unique(sample.indices, return_inverse=True)[1]]
    applied = replay.update_priorities(sample.indices, td, sample.generations)
    after = replay.tree.get(sample.indices)
    assert torch.equal(after[stale], middle[stale])
    assert torch.allclose(after[~stale], td[~stale].pow(replay.alpha))
    assert applied == int((~stale).sum())
    # A uniform replay keeps its priorities.
    uniform = make_replay(prioritized=False)
    RingAppender(uniform, 0, 3).append(step_arrays([EnvStream(rng).step() for _ in range(3)]))
    assert uniform.update_priorities(torch.tensor([0]), torch.tensor([5.0]), torch.tensor([1])) == 0


# 5. Checkpoints.


def filled_replay(seed: int, **kwargs):
    replay = make_replay(ring=20, prioritized=True, frame_dedup=True, **kwargs)
    appender = RingAppender(replay, 0, 3)
    rng = np.random.default_rng(seed)
    streams = [EnvStream(rng) for _ in range(3)]
    write_streams([appender], streams, np.random.default_rng(seed + 1), 150)
    sample = replay.sample(32, torch.Generator().manual_seed(seed))
    td = torch.rand(32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    replay.update_priorities(sample.indices, td * 4, sample.generations)
    return replay, appender, streams


def assert_same_samples(a: RingReplay, b: RingReplay, seed: int) -> None:
    for _ in range(5):
        x = a.sample(16, torch.Generator().manual_seed(seed))
        y = b.sample(16, torch.Generator().manual_seed(seed))
        seed += 1
        assert torch.equal(x.indices, y.indices)
        assert torch.equal(x.generations, y.generations)
        assert torch.equal(x.weights, y.weights)
        assert torch.equal(x.probabilities, y.probabilities)
        assert x.batch.keys() == y.batch.keys()
        for key in x.batch:
            assert torch.equal(x.batch[key], y.batch[key]), key


def as_written(tensors):
    """`contents`' tensors as a checkpoint reads them back: through torch.save and load."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_filling_replays_checkpoint_writes_its_rows_and_copies_nothing():
    """While the rings fill, `contents` gives views of the rows written, each on a
    storage that holds only them: torch.save writes a view's whole storage, and the copy
    made before held a second replay's worth of memory while the checkpoint was written
    (6.8 GB more for Rainbow's 1M replay on Pong)."""
    replay = make_replay(ring=20, prioritized=True, frame_dedup=True)
    rng = np.random.default_rng(5)
    write_streams(
        [RingAppender(replay, 0, 3)],
        [EnvStream(rng) for _ in range(3)],
        np.random.default_rng(6),
        15,
    )
    size = int(replay.written.max())
    assert 0 < size < replay.ring
    tensors, state = replay.contents()
    for key, rings in replay.tensors.items():
        start = rings.untyped_storage().data_ptr()
        end = start + rings.untyped_storage().nbytes()
        assert len(tensors[key]) == replay.num_envs
        for env, ring in enumerate(tensors[key]):
            assert start <= ring.data_ptr() < end, key  # a view of the replay, not a copy
            assert ring.untyped_storage().nbytes() == ring.numel() * ring.element_size()
            assert torch.equal(ring, rings[env, :size]), key
    restored = make_replay(ring=20, prioritized=True, frame_dedup=True)
    restored.restore(as_written(tensors), replay.settle(state))
    assert torch.equal(restored.written, replay.written)
    assert_same_samples(replay, restored, seed=7)


def test_checkpoint_round_trip():
    """contents -> settle -> restore into a fresh replay of the same layout samples the
    same batches; a replay of another capacity or layout refuses it."""
    replay, _, streams = filled_replay(11)
    tensors, state = replay.contents()
    saved = as_written(tensors)
    state = replay.settle(state)
    restored = make_replay(ring=20, prioritized=True, frame_dedup=True)
    restored.restore(saved, state)
    assert torch.equal(restored.written, replay.written)
    assert_same_samples(replay, restored, seed=100)
    sample = restored.sample(64, torch.Generator().manual_seed(1))
    check_sample(restored, streams, sample, expected_transitions(restored, streams))
    # A file from before the rings were saved as lists: each field one tensor [envs, ...].
    stacked = {key: torch.stack(t) if isinstance(t, list) else t for key, t in saved.items()}
    from_stacked = make_replay(ring=20, prioritized=True, frame_dedup=True)
    from_stacked.restore(stacked, state)
    assert_same_samples(replay, from_stacked, seed=100)

    other = make_replay(ring=21, prioritized=True, frame_dedup=True)
    with pytest.raises(ValueError, match="holds 60 transitions, this one 63"):
        other.restore(saved, state)
    plain = make_replay(ring=20, prioritized=True, frame_dedup=False)
    with pytest.raises(ValueError, match="fields"):
        plain.restore(saved, state)


def test_checkpoint_settles_writes_after_contents():
    """Steps written between `contents` and the rings reaching disk: `settle` makes their
    slots (and the stacks reading them) unsampleable, and the restored replay samples only
    transitions it holds whole."""
    replay, appender, streams = filled_replay(21)
    tensors, state = replay.contents()
    old_written = replay.written.clone()
    for _ in range(5):  # the writer goes on while the checkpoint is written
        appender.append(step_arrays([stream.step() for stream in streams]))
    saved = as_written(tensors)
    state = replay.settle(state)
    restored = make_replay(ring=20, prioritized=True, frame_dedup=True)
    restored.restore(saved, state)
    assert torch.equal(restored.written, old_written)
    # Truncate the streams to what the restored replay believes was written.
    for e, stream in enumerate(streams):
        stream.rows = stream.rows[: int(old_written[e])]
    expected = expected_transitions(restored, streams)
    rewritten = {
        (e, int(old_written[e]) - restored.ring + j) for e in range(3) for j in range(5 + 3)
    }
    assert sampleable(restored) == set(expected) - rewritten
    sample = restored.sample(128, torch.Generator().manual_seed(2))
    seen = check_sample(restored, streams, sample, expected)
    assert not seen & rewritten


# 6. polybeast: staged steps committed by the learner.


def make_sources(num_envs: int) -> dict[str, np.ndarray]:
    return {
        "obs": np.zeros((num_envs, STACK, H, W), dtype=np.uint8),
        "reward": np.zeros(num_envs, dtype=np.float32),
        "done": np.zeros(num_envs, dtype=bool),
        "terminated": np.zeros(num_envs, dtype=bool),
        "truncated": np.zeros(num_envs, dtype=bool),
        "last_action": np.zeros(num_envs, dtype=np.int64),
        "action": np.zeros(num_envs, dtype=np.int64),
        "episode_end": np.zeros(num_envs, dtype=bool),
        "episode_return": np.zeros(num_envs, dtype=np.float32),
        "episode_step": np.zeros(num_envs, dtype=np.int32),
    }


def test_staged_commits_match_direct_writes():
    """TransitionStaging + TransitionSink.commit (polybeast) fill the rings, tree and
    counters exactly as TransitionWriters (monobeast actors) do for the same steps."""
    rows_count, per_row, publish_every, steps = 2, 2, 7, 84
    num_envs = rows_count * per_row
    kwargs = dict(num_actors=rows_count, samples_per_insert=0, min_replay_size=0, batch_size=1)
    staged = TransitionSink(make_replay(ring=20, num_envs=num_envs, frame_dedup=True), **kwargs)
    direct = TransitionSink(make_replay(ring=20, num_envs=num_envs, frame_dedup=True), **kwargs)
    recipe = staged.staging_recipe()
    rng = np.random.default_rng(5)
    streams = [EnvStream(rng) for _ in range(num_envs)]
    sources = [make_sources(per_row) for _ in range(rows_count)]
    stagings = [recipe.writer(s, publish_every=publish_every)[0] for s in sources]
    writers = [
        direct.writer(r, sources[r], learner_pid=os.getpid(), lane=r) for r in range(rows_count)
    ]
    stop = threading.Event()
    commits = 0
    for _ in range(steps):
        for r in range(rows_count):
            envs = range(r * per_row, (r + 1) * per_row)
            rows = [streams[e].step() for e in envs]
            for key, value in step_arrays(rows).items():
                sources[r][key][...] = value
            ended = np.array([row.terminated or row.truncated for row in rows])
            sources[r]["episode_end"][...] = ended
            sources[r]["episode_return"][ended] = rng.standard_normal(int(ended.sum()))
            sources[r]["episode_step"][ended] = rng.integers(1, 100, int(ended.sum()))
            assert stagings[r].write()
            assert writers[r].write()
            payload = stagings[r].take_rollout()
            if payload is not None:
                assert staged.commit(payload, stop, r)
                commits += 1
    assert commits == rows_count * steps // publish_every
    a, b = staged.replay, direct.replay
    assert torch.equal(a.written, b.written)
    assert a.tensors.keys() == b.tensors.keys()
    for key in a.tensors:
        assert torch.equal(a.tensors[key], b.tensors[key]), key
    tree_a, tree_b = a.tree.state_dict(), b.tree.state_dict()
    assert torch.equal(tree_a["priorities"], tree_b["priorities"])
    assert torch.equal(tree_a["generations"], tree_b["generations"])
    for name in ("env_steps", "inserted", "episode_count", "episode_returns", "episode_lengths"):
        assert torch.equal(getattr(staged, name), getattr(direct, name)), name
    assert staged.inserted.tolist() == [steps * per_row] * rows_count
    assert staged.env_steps.tolist() == [(steps - 1) * per_row] * rows_count
    assert int(staged.episode_count.sum()) > 10
    expected = expected_transitions(a, streams)
    assert sampleable(a) == set(expected)
    check_sample(a, streams, a.sample(64, torch.Generator().manual_seed(0)), expected)


# 7. Rings too small for the windows.


@pytest.mark.parametrize("frame_dedup", [True, False], ids=["dedup", "nodedup"])
def test_ring_too_small_for_n_step(frame_dedup):
    least = minimal_ring(frame_dedup)
    make_replay(ring=least, frame_dedup=frame_dedup)  # the least is fine
    with pytest.raises(ValueError) as info:
        make_replay(ring=least - 1, frame_dedup=frame_dedup)
    message = str(info.value)
    assert f"ring of {least - 1} steps" in message
    assert f"{least} is the least for {N_STEP}-step windows" in message
    with pytest.raises(ValueError, match="n_step must be in"):
        make_replay(n_step=0)
