"""Transition replay: each env step stored once, in its env's ring (DQN family, Ape-X).

rlpyt's n-step and frame buffers: a replay of transitions does not store transitions.
Every env has a ring of ``R = capacity // num_envs`` steps in shared memory, one block
per field ``[num_envs, R, ...]``; an env's step is written once, and a transition is the
index of the step it starts at. What the learner trains on is built when it samples:

    rows          obs, reward, done, last_action and the policy's record at the
                  transition's step s and at its bootstrap step s + k: ``[2, B, ...]``
                  (one forward pass of [T=2, B] gives Q(x_s) and Q(x_{s+k}))
    n_step_rewards float32 [n, B]: r_{s+1} ... r_{s+n}, 0 past the k rewards taken
    n_steps       int64 [B]: k, the rewards in the return (n, or fewer at an episode end)
    terminal      bool [B]: the window ended in a terminal state: no bootstrap

with the alignment of beast's rollouts (beast/experience/sequence_replay.py): row t's reward and
terminated flag belong to the transition INTO row t, so the transition out of step s
takes ``reward[s + 1]``. A window stops at a terminated row (no bootstrap), or at a
truncated row (the time-limited episode's final observation: bootstrap from it, and it
starts no transition, since its action is never taken); a done row that neither
announced (an env recreated mid-episode) drops the windows still open.

Frame deduplication (``frame_dedup=True``, Atari): a step stores only the newest 84x84
frame of its 4-frame stack (of each image leaf of the observation, for a Dict: each
under its own frames field, `beast.experience.sequence_replay.frames_key`), and the stack
of step s is rebuilt from steps s-3 ... s, where frames older than the latest episode start (a done
row) repeat that row's frame, as the env's frame stack does after a reset
(beast/envs/atari.py `FrameStack`). The
writer rebuilds every step's stack as the learner would and compares it with the real
one: a step whose stack is not rebuilt exactly (the ALE vector backend's row after a
truncation, whose stack holds the reset frame it never returned) is marked, and no
transition starting there, or bootstrapping from there, is ever sampled (a window that
ends in a terminal state bootstraps from nothing: its next observation is never read).
So the stacks a loss reads are the env's stacks, bit for bit
(tests/experience/test_transition_replay.py).

Validity and concurrency: the sum tree (beast/native/sum_tree.c) has one leaf per ring
slot. A slot's priority is 0 until its window is complete (n steps, or an episode end),
then the largest priority in the tree (prioritized) or 1 (uniform). Before a writer
rewrites slot p it invalidates slot p, and with frame dedup slots p+1 ... p+3 too, whose
stacks read the frame at p (priority 0, generation bumped: `SumTree.invalidate`). A
window reads only slots written after its first, so any overwrite of a sampled
transition's steps bumps its slot's generation: a sample copied while that happened
gets weight 0, and a priority computed for it is dropped, as for sequences.

Memory: about 7.1 KB per Atari step with frame dedup (one frame, the flags, two int64
actions), 28.3 KB without: 0.25x (`ring_footprint`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from beast.experience.prioritized import SumTreeReplay
from beast.experience.replay_sink import ReplayRow, ReplaySink
from beast.experience.sequence_replay import (
    field_nbytes,
    frames_key,
    image_keys,
    stacked_image_keys,
    step_spec,
)
from beast.experience.staging import StagedSteps, StagingRecipe, StepTally
from beast.fields import Field, leading_rows, shared_zeros
from beast.native import SumTree
from beast.util.profile import PhaseClock

__all__ = [
    "RingAppender",
    "RingReplay",
    "TransitionSink",
    "TransitionStaging",
    "TransitionStagingRecipe",
    "TransitionWriter",
    "rebuild_stacks",
    "ring_footprint",
    "step_spec",
]

# Per-slot fields the writer sets when the slot's window closes, and the exactness mark.
WINDOW_FIELDS = {
    "n_steps": Field((), torch.uint8),
    "terminal": Field((), torch.bool),
    "exact": Field((), torch.bool),
}


def _storage_spec(spec: Mapping[str, Field], frame_dedup: bool) -> dict[str, Field]:
    """The spec with, under frame dedup, each image leaf [k, H, W] replaced by its newest
    frame [H, W], plus the per-slot window fields."""
    out = dict(spec)
    if frame_dedup:
        for key in stacked_image_keys(spec, leading=0):
            obs = out.pop(key)
            out[frames_key(key)] = Field(obs.shape[1:], obs.dtype)
    out.update(WINDOW_FIELDS)
    return out


def ring_footprint(spec: Mapping[str, Field], frame_dedup: bool) -> int:
    """Bytes one stored step (one transition) takes: every stored field and its sum-tree
    leaf (float64 sum and max, int64 generation, int32 writer pid; the tree's inner nodes
    and power-of-two rounding add up to 48 B more per slot)."""
    return sum(field_nbytes(f) for f in _storage_spec(spec, frame_dedup).values()) + 28


def rebuild_stacks(
    frames: Tensor, done: Tensor, envs: Tensor, positions: Tensor, stack: int
) -> Tensor:
    """The frame stacks of steps (envs[i], positions[i]): uint8 [N, stack, H, W].

    Column j (oldest first) is the newest frame stored at ring position
    ``positions - (stack - 1) + j``, except that columns older than the newest done row
    among them repeat that row's frame (the env's stack after a reset).

    Args:
        frames: [E, R, H, W], the newest frame of every stored step.
        done: bool [E, R], the step starts an episode.
        envs, positions: int64 [N], the steps to rebuild.
    """
    ring = frames.shape[1]
    cols = torch.arange(stack)
    slots = (positions.unsqueeze(1) - (stack - 1) + cols) % ring  # [N, S]
    rows = envs.unsqueeze(1).expand_as(slots)
    starts = done[rows, slots]
    # The newest column that starts an episode (0 when none does: nothing older is read).
    newest_start = (cols * starts).amax(dim=1, keepdim=True)
    source = torch.maximum(cols.unsqueeze(0), newest_start)
    return frames[rows, slots.gather(1, source)]


class RingReplay(SumTreeReplay):
    """Per-env rings of steps with a sum tree over their transitions (module docstring).

    Args:
        spec: per-step fields, `step_spec`.
        num_envs: envs writing (each its own ring).
        capacity: transitions held in all; each env's ring holds capacity // num_envs.
        n_step: rewards summed before bootstrapping.
        prioritized: sample by priority (PER), else uniformly.
        alpha: priority exponent (PER: 0.6).
        beta: importance-sampling exponent (PER: 0.4); `sample` can override it.
        frame_dedup: store the newest frame of each frame stack only.
        priorities: min_priority, default_priority (`SumTreeReplay`).
    """

    unit = "transitions"  # what it holds, for messages and log columns

    def __init__(
        self,
        spec: Mapping[str, Field],
        *,
        num_envs: int,
        capacity: int,
        n_step: int,
        prioritized: bool = True,
        alpha: float = 0.6,
        beta: float = 0.4,
        frame_dedup: bool = False,
        **priorities: float,
    ) -> None:
        super().__init__(alpha=alpha, beta=beta, prioritized=prioritized, **priorities)
        if n_step < 1 or n_step > 255:
            raise ValueError(f"n_step must be in [1, 255], got {n_step}")
        self.frame_dedup = frame_dedup
        self.spec = dict(spec)
        self.num_envs = num_envs
        self.n_step = n_step
        # The image leaves stored as their newest frame, and their stacks' depths.
        self.stacks = {key: spec[key].shape[0] for key in image_keys(spec, leading=0)}
        if not frame_dedup:
            self.stacks = {}
        self.history = max(self.stacks.values(), default=1) - 1
        self.ring = capacity // num_envs
        needed = n_step + self.history + 2
        if self.ring < needed:
            raise ValueError(
                f"a replay of {capacity} transitions gives each of {num_envs} envs a ring of"
                f" {self.ring} steps; {needed} is the least for {n_step}-step windows"
            )
        self.storage = _storage_spec(spec, frame_dedup)
        self.tensors = {
            key: shared_zeros((num_envs, self.ring, *f.shape), f.dtype)
            for key, f in self.storage.items()
        }
        self.written = shared_zeros((num_envs,), torch.int64)  # steps each env wrote
        self.tree = SumTree(num_envs * self.ring)
        # The same memory with one row per slot (slot = env * R + position).
        self._flat = {key: t.flatten(0, 1) for key, t in self.tensors.items()}
        self._reward_offsets = torch.arange(1, n_step + 1).unsqueeze(1)

    @property
    def capacity(self) -> int:
        return self.num_envs * self.ring

    def __len__(self) -> int:
        """Steps stored (each the start of at most one transition)."""
        return int(self.written.clamp(max=self.ring).sum())

    def observations(self, key: str, envs: Tensor, positions: Tensor) -> Tensor:
        """Observation leaf `key` of steps (envs[i], positions[i]): [N, *shape]."""
        stack = self.stacks.get(key)
        if stack is None:
            return self.tensors[key][envs, positions]
        return rebuild_stacks(
            self.tensors[frames_key(key)], self.tensors["done"], envs, positions, stack
        )

    def _gather(self, indices: Tensor) -> dict[str, Tensor]:
        """The transitions starting at slots `indices`, built from the rings (module
        docstring). Fields are read through their flat [E * R, ...] views, one slot index
        per row (`index_select`: a tenth of the cost of indexing [env, position] pairs)."""
        batch_size = len(indices)
        ring, flat = self.ring, self._flat
        envs, starts = indices // ring, indices % ring
        n_steps = flat["n_steps"].index_select(0, indices).long()
        rows = torch.stack([starts, (starts + n_steps) % ring])  # [2, B]
        row_slots = (envs * ring + rows).flatten()  # [2 * B]
        batch: dict[str, Tensor] = {}
        for key in self.spec:
            if key in self.stacks:
                row_envs = envs.unsqueeze(0).expand_as(rows)
                obs = self.observations(key, row_envs.flatten(), rows.flatten())
            else:
                obs = flat[key].index_select(0, row_slots)
            batch[key] = obs.view(2, batch_size, *obs.shape[1:])
        offsets = self._reward_offsets  # [n, 1]
        window = envs * ring + (starts + offsets) % ring  # [n, B]
        rewards = flat["reward"].index_select(0, window.flatten()).view_as(window)
        batch["n_step_rewards"] = torch.where(offsets <= n_steps, rewards, 0.0)
        batch["n_steps"] = n_steps
        batch["terminal"] = flat["terminal"].index_select(0, indices)
        return batch

    def contents(self) -> tuple[dict[str, Tensor], dict[str, object]]:
        """A checkpoint in two parts, as `PrioritizedReplay.contents`: the rings (each
        field a list of the envs' rings, views to be written first) and the small state;
        `settle` the state once they are written."""
        written = self.written.clone()
        # Only the ring positions some env has written: a replay that is still filling
        # saves what it holds, not its capacity (views of those rows alone, no copy).
        size = min(self.ring, int(written.max()))
        tensors: dict[str, Any] = {
            key: [leading_rows(ring, size) for ring in rings] for key, rings in self.tensors.items()
        }
        tensors["written"] = written
        return tensors, {"capacity": self.capacity, "tree": self.tree.state_dict()}

    def restore(self, tensors: Mapping[str, Tensor], state: Mapping[str, object]) -> None:
        """Load `contents`' two parts into this (empty, same-layout) replay, before any
        writer starts. ValueError (one line) when the layout or capacity differ."""
        mine = {**self.tensors, "written": self.written}
        self._check_saved(tensors, state, mine)
        written = tensors["written"]
        if written.shape != self.written.shape or written.dtype != self.written.dtype:
            raise ValueError(
                f"the saved replay's written is {written.dtype} {tuple(written.shape)}, this"
                f" one holds {self.written.dtype} {tuple(self.written.shape)}"
            )
        size = min(self.ring, int(written.max()))
        # Each field the envs' rings, as `contents` saves them (a list; an older file's
        # tensor [num_envs, size, ...] iterates the same way).
        rings = {key: list(tensors[key]) for key in self.tensors}
        for key, tensor in self.tensors.items():
            shape = (size, *tensor.shape[2:])
            if len(rings[key]) != self.num_envs or any(
                ring.shape != shape or ring.dtype != tensor.dtype for ring in rings[key]
            ):
                raise ValueError(
                    f"the saved replay's {key} is not {self.num_envs} rings of {tensor.dtype}"
                    f" {shape}"
                )
        self.written.copy_(written)
        for key, tensor in self.tensors.items():
            for env, ring in enumerate(rings[key]):
                tensor[env, :size] = ring
        self.tree.load_state_dict(state["tree"])


class RingAppender:
    """Appends the steps of envs [first_env, first_env + n) to their rings and commits each
    transition once its window is complete (module docstring). One per writer; the rings'
    only writer."""

    def __init__(self, replay: RingReplay, first_env: int, num_envs: int) -> None:
        if first_env < 0 or first_env + num_envs > replay.num_envs:
            raise ValueError(
                f"envs [{first_env}, {first_env + num_envs}) are not in the replay's"
                f" {replay.num_envs} rings"
            )
        self.replay = replay
        self.envs = torch.arange(first_env, first_env + num_envs)
        # numpy views of the shared tensors: a step's few small writes cost less through
        # numpy than through torch's dispatch (an actor stepping one CartPole writes
        # thousands a second, and this was 40% of its time).
        self._env_rows = self.envs.numpy()
        self._arrays = {key: t.numpy() for key, t in replay.tensors.items()}
        self._written = replay.written.numpy()
        # Transitions still open per env: they start at the last `open` steps.
        self.open = np.zeros(num_envs, dtype=np.int64)
        self._slots_ahead = np.arange(replay.history + 1)

    def append(self, step: Mapping[str, np.ndarray]) -> int:
        """Store one step of the n envs (`step_spec` fields, `[n, ...]` arrays); returns
        how many transitions became sampleable."""
        replay, arrays, rows = self.replay, self._arrays, self._env_rows
        ring, n = replay.ring, replay.n_step
        pos = self._written[rows] % ring
        slots = (pos[:, None] + self._slots_ahead) % ring
        replay.tree.invalidate((rows[:, None] * ring + slots).ravel())
        self._written[rows] += 1
        for key in replay.spec:
            if key in replay.stacks:
                arrays[frames_key(key)][rows, pos] = step[key][:, -1]
            else:
                arrays[key][rows, pos] = step[key]
        exact = np.ones(len(rows), dtype=bool)
        for key in replay.stacks:
            rebuilt = replay.observations(key, self.envs, torch.from_numpy(pos)).numpy()
            exact &= (rebuilt == step[key]).reshape(len(rows), -1).all(axis=1)
        arrays["exact"][rows, pos] = exact

        done = np.asarray(step["done"], dtype=bool)
        terminated = np.asarray(step["terminated"], dtype=bool)
        truncated = np.asarray(step["truncated"], dtype=bool)
        steady = ~(done | truncated)
        # Closed windows as (env index, start, k, terminal) columns: a steady env's n-step
        # window, and at an episode's end every window still open.
        index = np.flatnonzero(steady & (self.open == n))
        closed = [(index, pos[index] - n, np.full(len(index), n), np.zeros(len(index), bool))]
        self.open[steady] = np.minimum(self.open[steady] + 1, n)
        for i in np.flatnonzero(~steady).tolist():
            if terminated[i] or truncated[i]:
                k = np.arange(1, int(self.open[i]) + 1)
                closed.append((np.full(len(k), i), pos[i] - k, k, np.full(len(k), terminated[i])))
            # A terminated row is also the next episode's first step; a truncated one
            # (the final observation) starts nothing; a bare done row starts afresh.
            self.open[i] = 0 if truncated[i] else 1
        if len(closed) > 1:
            return self._commit(*(np.concatenate(column) for column in zip(*closed, strict=True)))
        return self._commit(*closed[0])

    def _commit(
        self, index: np.ndarray, start: np.ndarray, k: np.ndarray, terminal: np.ndarray
    ) -> int:
        if not len(index):
            return 0
        replay, arrays, ring = self.replay, self._arrays, self.replay.ring
        env = self._env_rows[index]
        start %= ring
        arrays["n_steps"][env, start] = k
        arrays["terminal"][env, start] = terminal
        exact = arrays["exact"]
        valid = exact[env, start] & (terminal | exact[env, (start + k) % ring])
        count = int(np.count_nonzero(valid))
        if count:
            slots = env[valid] * ring + start[valid]
            replay.tree.update(slots, np.full(count, replay.new_priority()))
        return count


class TransitionSink(ReplaySink):
    """A `ReplaySink` of transitions: each actor appends its envs' steps to their rings
    (`RingAppender`); env j of writer lane l is ring l * K + j (K envs per lane)."""

    def __init__(self, replay: RingReplay, **kwargs: Any) -> None:
        super().__init__(replay, **kwargs)
        # An actor writes one step of each of its envs at once (at most all of them).
        self.largest_insert = replay.num_envs
        # polybeast: the learner's appender per env server row (its envs' open windows).
        self._appenders: dict[int, RingAppender] = {}

    def describe(self) -> str:
        replay = self.replay
        per_step = ring_footprint(replay.spec, replay.frame_dedup)
        kind = "prioritized" if replay.prioritized else "uniform"
        rings = f"{replay.num_envs} ring{'s' if replay.num_envs > 1 else ''}"
        return (
            f"{kind} replay of {replay.capacity:,} transitions ({rings} of {replay.ring:,}"
            f" steps, {self.nbytes() / 2**20:,.0f} MiB, {per_step:,} B per"
            f" step{', frame dedup' if replay.frame_dedup else ''}), {replay.n_step}-step"
            f" windows, learning from {self.min_replay_size:,}"
        )

    def _writer(
        self,
        row: ReplayRow,
        sources: Mapping[str, np.ndarray],
        lane: int,
        clock: PhaseClock | None,
    ) -> TransitionWriter:
        """Appends the n envs of `sources` to the rings of writer lane `lane`. A replacement
        writes on where its dead predecessor stopped: `RingAppender` opens no window over a
        step it did not write itself."""
        num_envs = len(sources["reward"])
        appender = RingAppender(self.replay, lane * num_envs, num_envs)
        return TransitionWriter(row, appender, sources, clock)

    def staging_recipe(self) -> TransitionStagingRecipe:
        return TransitionStagingRecipe(tuple(self.replay.spec))

    def commit(self, payload: Mapping, stop: threading.Event, row: int) -> bool:
        steps = payload["steps"]
        if steps:
            appender = self._appenders.get(row)
            num_envs = len(steps["reward"][0])
            if appender is None:
                appender = self._appenders[row] = RingAppender(
                    self.replay, row * num_envs, num_envs
                )
            for w in range(len(steps["reward"])):
                if not self.wait_for_room(num_envs, stop.is_set):
                    return False
                appender.append({key: value[w] for key, value in steps.items()})
                self.inserted[row] += num_envs
        self.record_payload(payload, row)
        return True


class TransitionWriter:
    """An actor's side of a `TransitionSink`: one step of its n envs at a time, from the
    arrays the env batch and the policy fill in place, rate-limited and counted through
    the actor's `ReplayRow` as a sequence writer is; `write(state)` ignores the recurrent
    state (feed-forward models only)."""

    def __init__(
        self,
        row: ReplayRow,
        appender: RingAppender,
        sources: Mapping[str, np.ndarray],
        clock: PhaseClock | None,
    ) -> None:
        self.row, self.appender, self.clock = row, appender, clock
        self.num_envs = len(sources["reward"])
        self._step = {key: sources[key] for key in row.sink.replay.spec}
        self._tally = StepTally(sources)

    def write(self, state: Sequence[Tensor] = ()) -> bool:
        """Write the current step; False when the run is shutting down."""
        n = self.num_envs
        if not self.row.wait_for_room(n, self.clock):
            return False
        self.appender.append(self._step)
        self.row.count_inserts(n)
        tally = self._tally.take()
        if self.clock is not None:
            self.clock.mark("slot_write")
        return self.row.step(*tally)


@dataclass(frozen=True)
class TransitionStagingRecipe(StagingRecipe):
    """How to stage steps for a learner's transition replay outside its process
    (polybeast): the per-step fields to copy."""

    keys: tuple[str, ...]

    def _writer(
        self, sources: Mapping[str, np.ndarray], publish_every: int
    ) -> tuple[TransitionStaging, TransitionStaging]:
        """A writer that is also its own staging: it copies each step, for
        `TransitionSink.commit`."""
        staging = TransitionStaging(self.keys, sources, publish_every)
        return staging, staging


class TransitionStaging(StagedSteps):
    """Steps of n envs copied until `take_rollout` hands them over (polybeast), as "steps"
    (each field stacked, [writes, n, ...])."""

    def __init__(
        self, keys: Sequence[str], sources: Mapping[str, np.ndarray], publish_every: int
    ) -> None:
        super().__init__(publish_every)
        self.sources = sources
        self.keys = tuple(keys)
        self._steps: list[dict[str, np.ndarray]] = []
        self._tally = StepTally(sources)

    def write(self, state: Sequence[Tensor] = ()) -> bool:
        self._steps.append({key: np.array(self.sources[key]) for key in self.keys})
        return self.step(*self._tally.take())

    def _take_items(self) -> dict:
        steps = {key: np.stack([s[key] for s in self._steps]) for key in self.keys}
        self._steps = []
        return {"steps": steps}
