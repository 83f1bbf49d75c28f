"""Prioritized sequence replay in shared memory (R2D2, Ape-X).

Sequences of ``seq_len`` steps, declared once as a spec (field -> per-sequence
shape, dtype, the `beast.experience.rollout_slots` way) and stored as ONE shared-memory block
per field, ``[capacity, ...]``, so actor processes write into the same memory
the learner samples from. A native `SumTree` (beast/native/sum_tree.c) holds
the priorities: O(log capacity) inserts, updates and samples, safe across
processes.

A sequence has ``L = seq_len + 1`` rows: ``seq_len`` steps and the step after
the last, which only supplies its reward, done and bootstrap value (the T + 1
of `beast.experience.rollout_slots` rollouts). Row t (the rollout alignment of
`beast.experience.rollout_slots`):

    obs          [L, *obs_shape]  the observation x_t (a Dict or Tuple: one field per
                                  leaf, "obs.position" ..., beast/fields.py)
    reward       float32 [L]      received on the transition into row t
    done         bool [L]         row t starts a new episode
    terminated   bool [L]         the transition into row t ended the episode
                                  in a terminal state (no bootstrap)
    truncated    bool [L]         x_t is a time-limited episode's final
                                  observation (bootstrap from it)
    last_action  int64 [L]        the action taken before x_t (as "action")
    action       int64 [L]        a_t, taken at x_t (the policy's record: Q-learning's
                                  actions are discrete)
    mask         bool [L]         row t is a real step of this sequence's
                                  episode (False: terminal row, padding)
    core_state_i float32 [...]    recurrent state at the sequence's start

`SequenceBuilder` cuts one env's steps into such sequences; R2D2 section 2.3:
"fixed-length (m = 80) sequences ..., with adjacent sequences overlapping each
other by 40 time steps, and never crossing episode boundaries".

Priorities, sampling and weights are PER's (Schaul et al. 2016; alpha = 0.9 and
beta = 0.6 in R2D2), shared with the transition replay: beast/experience/prioritized.py.

Frame deduplication (``frame_dedup=True``, Atari): consecutive 4-frame stacks
share 3 frames, so a sequence stores its ``L + 3`` distinct 84x84 frames
instead of ``L`` stacks and rebuilds the stacks at sample time, about a
quarter of the bytes (see `replay_footprint`). It applies to every image leaf
of the observation ([k, H, W]: the Box itself, or a Dict's image leaves), each
stored under its own frames field ("frames" for "obs", "frames.image" for
"obs.image"); other leaves are stored whole.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from beast.experience.prioritized import ReplaySample, SumTreeReplay, scaled_priorities
from beast.experience.rollout_slots import env_step_spec, time_major_spec
from beast.fields import (
    OBS_KEY,
    Field,
    core_state_key,
    is_core_state,
    is_obs_key,
    leading_rows,
    shared_zeros,
)
from beast.native import SumTree

__all__ = [
    "ENV_KEYS",
    "PrioritizedReplay",
    "ReplayFootprint",
    "ReplaySample",
    "SequenceBuilder",
    "field_nbytes",
    "replay_footprint",
    "sequence_spec",
    "stacked_image_keys",
    "step_keys",
    "step_spec",
    "storage_spec",
]

# The env batch's per-step fields a sequence keeps besides the observation's leaves
# (episode statistics go to the sink's rings instead); the policy's record
# (`ActingRule.record_spec`: "action", ...) joins them.
ENV_KEYS = ("reward", "done", "terminated", "truncated", "last_action")
# The stored field that replaces "obs" under frame deduplication (and "frames.image"
# replaces "obs.image": `frames_key`).
FRAMES_KEY = "frames"


def frames_key(key: str) -> str:
    """The stored field of an image leaf's deduplicated frames: "obs" -> "frames",
    "obs.image" -> "frames.image"."""
    return FRAMES_KEY + key[len(OBS_KEY) :]


def env_fields(env_step: Mapping[str, Field]) -> dict[str, Field]:
    """The fields of an env step (`beast.experience.rollout_slots.env_step_spec`) that
    replays store: the observation's leaves and `ENV_KEYS`."""
    return {key: f for key, f in env_step.items() if is_obs_key(key) or key in ENV_KEYS}


def step_spec(obs: Mapping[str, Field], record: Mapping[str, Field]) -> dict[str, Field]:
    """The per-step fields a replay stores (a sequence's rows, a ring's steps): the
    observation's (`EnvSpec.obs_fields()`), the env's (`ENV_KEYS`) and the policy's
    record."""
    return {**env_fields(env_step_spec(obs, record["action"])), **record}


def sequence_spec(
    *,
    seq_len: int,
    obs: Mapping[str, Field],
    record: Mapping[str, Field],
    core_state_shapes: Sequence[Sequence[int]] = (),
) -> dict[str, Field]:
    """The layout of one replayed sequence: ``seq_len + 1`` rows (module docstring).

    ``obs`` is the observation's fields (`EnvSpec.obs_fields()`); ``record`` is the
    policy's per-step record; ``core_state_shapes`` are the per-env recurrent-state
    shapes (`beast.fields.core_state_shapes`); the state stored is the one at the
    sequence's first row.
    """
    seq_len = operator.index(seq_len)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    rows = seq_len + 1
    mask = {"mask": Field((rows,), torch.bool)}
    return time_major_spec(step_spec(obs, record), rows, mask, core_state_shapes)


def step_keys(spec: Mapping[str, Field]) -> tuple[str, ...]:
    """The fields a sequence's rows copy from each step: all but mask and the state."""
    return tuple(key for key in spec if key != "mask" and not is_core_state(key))


def _seq_len(spec: Mapping[str, Field]) -> int:
    """seq_len of a `sequence_spec`: its rows minus the bootstrap row."""
    return spec["mask"].shape[0] - 1


def image_keys(spec: Mapping[str, Field], leading: int) -> list[str]:
    """The image leaves of a replay spec whose fields have `leading` axes before one
    observation (a sequence's rows: 1; a ring's step: 0): what frame dedup stores."""
    return [key for key, f in spec.items() if is_obs_key(key) and len(f.shape) == leading + 3]


def stacked_image_keys(spec: Mapping[str, Field], leading: int) -> list[str]:
    """`image_keys` for frame dedup, which needs at least one: ValueError naming the
    observation's shapes when there is none (`leading` as in `image_keys`)."""
    keys = image_keys(spec, leading)
    if not keys:
        shapes = {key: f.shape for key, f in spec.items() if is_obs_key(key)}
        layout = "[L, k, H, W]" if leading else "[k, H, W]"
        raise ValueError(
            f"frame_dedup needs frame-stacked image observations {layout}, got {shapes}"
        )
    return keys


def storage_spec(spec: Mapping[str, Field], frame_dedup: bool) -> dict[str, Field]:
    """What the replay stores per sequence: the spec, or with ``frame_dedup`` the
    spec with each image leaf [L, k, H, W] replaced by its frames [L + k - 1, H, W]
    (`frames_key`).

    Frame t + k - 1 is the newest frame of obs_t, and frames 0..k-2 the older
    frames of obs_0, so obs_t = frames[t : t + k].
    """
    out = dict(spec)
    if frame_dedup:
        for key in stacked_image_keys(spec, leading=1):
            obs = out.pop(key)
            rows, stack, *frame_shape = obs.shape
            out[frames_key(key)] = Field((rows + stack - 1, *frame_shape), obs.dtype)
    return out


def field_nbytes(field: Field) -> int:
    """Bytes one value of `field` takes."""
    return math.prod(field.shape) * torch.empty((), dtype=field.dtype).element_size()


class ReplayFootprint(NamedTuple):
    """Memory a replay needs, in bytes.

    per_sequence: one stored sequence, every field.
    per_stored_step: per_sequence / (seq_len + 1), per row kept in replay.
    per_env_step: per_sequence / (seq_len - seq_overlap): overlapping
        sequences store each env step about (seq_len + 1) / (seq_len -
        overlap) times, so this is the cost of one step of experience.
    """

    per_sequence: int
    per_stored_step: float
    per_env_step: float


def replay_footprint(
    spec: Mapping[str, Field], *, frame_dedup: bool, seq_overlap: int = 0
) -> ReplayFootprint:
    """Bytes per stored sequence and step of ``spec``, with or without frame dedup."""
    seq_len = _seq_len(spec)
    if not 0 <= seq_overlap < seq_len:
        raise ValueError(f"seq_overlap must be in [0, {seq_len}), got {seq_overlap}")
    per_sequence = sum(field_nbytes(f) for f in storage_spec(spec, frame_dedup).values())
    return ReplayFootprint(
        per_sequence=per_sequence,
        per_stored_step=per_sequence / (seq_len + 1),
        per_env_step=per_sequence / (seq_len - seq_overlap),
    )


class SequenceBuilder:
    """Cuts one env's step stream into replay sequences; pure, one per env.

    Feed every step (row) the env produces, in order, with the recurrent
    state the actor held when it processed that row (before the row's
    observation went in; what the model's state was after the previous row).
    Returns a finished sequence (a dict matching ``spec``, tensors the caller
    owns) or None.

    Windows start at the first row of an episode and every ``stride =
    seq_len - seq_overlap`` rows after it; a window is emitted when it has
    ``seq_len + 1`` rows (its steps and the next one). When an episode ends
    in a terminal state (a row with terminated arrives: its observation is
    already the next episode's first, beast/envs/batch.py), the open window
    is completed with that row as its terminal row (mask False: it carries
    the last transition's reward and terminated flag) and padded (zeros,
    done and terminated True, mask False); the row then starts the next
    episode's first window. When an episode is truncated (a row with
    truncated arrives: the episode's final observation, whose action is
    never taken), that row completes the window as its terminal row (mask
    False; targets bootstrap from its observation), and the reset row after
    it starts the next window. So sequences never cross an episode boundary
    (R2D2 section 2.3), padding is masked, and the state stored with an
    episode's first window is whatever the actor held (the model zeroes it
    at a done row anyway).

    Coverage: a step is trained in rows [burn_in, seq_len) of a window, and
    the next window starts ``stride`` rows later, so with burn_in =
    seq_overlap (R2D2: 80, 40, 40) every step is trained in exactly one
    sequence, except an episode's first burn_in steps, which are only ever
    burn-in (as in R2D2). At an episode end only the oldest open window is
    emitted: it holds every step of the episode's tail. Ape-X: seq_len = n,
    seq_overlap = n - 1 makes every step row 0 of one window. A stream that
    stops mid-window (actor shutdown) loses that window.
    """

    def __init__(self, spec: Mapping[str, Field], seq_len: int, seq_overlap: int) -> None:
        self.spec = dict(spec)
        self.seq_len = operator.index(seq_len)
        self.seq_overlap = operator.index(seq_overlap)
        if _seq_len(spec) != self.seq_len:
            raise ValueError(f"spec is for seq_len {_seq_len(spec)}, not {self.seq_len}")
        if not 0 <= self.seq_overlap < self.seq_len:
            raise ValueError(f"seq_overlap must be in [0, {self.seq_len}), got {seq_overlap}")
        self.stride = self.seq_len - self.seq_overlap
        self.rows = self.seq_len + 1
        missing = [k for k in (*ENV_KEYS, "action", "mask") if k not in spec]
        if not any(is_obs_key(key) for key in spec):
            missing.append(OBS_KEY)
        if missing:
            raise ValueError(f"spec lacks fields {missing}")
        self.step_keys = step_keys(spec)
        self._rows = {
            key: torch.zeros(self.spec[key].shape, dtype=self.spec[key].dtype)
            for key in (*self.step_keys, "mask")
        }
        self.num_core_state = sum(is_core_state(key) for key in spec)
        # The state at every row of the window, since row `stride` becomes the
        # next window's first.
        self._states = [
            torch.zeros((self.rows, *spec[core_state_key(i)].shape), dtype=torch.float32)
            for i in range(self.num_core_state)
        ]
        self._count = 0  # rows in the open window

    def reset(self) -> None:
        """Drop the open window (the env was recreated mid-episode)."""
        self._count = 0

    def _write(
        self, row: int, step: Mapping[str, Tensor], core_state: Sequence[Tensor], *, mask: bool
    ) -> None:
        for key in self.step_keys:
            self._rows[key][row] = torch.as_tensor(step[key])
        self._rows["mask"][row] = mask
        for buffer, state in zip(self._states, core_state, strict=True):
            buffer[row] = state

    def _emit(self) -> dict[str, Tensor]:
        """The open window as a sequence, padded past its last row."""
        count = self._count
        sequence = {key: rows.clone() for key, rows in self._rows.items()}
        if count < self.rows:
            for rows in sequence.values():
                rows[count:] = 0
            sequence["done"][count:] = True
            sequence["terminated"][count:] = True
        for i, buffer in enumerate(self._states):
            sequence[core_state_key(i)] = buffer[0].clone()
        return sequence

    def append(
        self, step: Mapping[str, Tensor], core_state: Sequence[Tensor] = ()
    ) -> dict[str, Tensor] | None:
        """Add one row; returns the sequence it completed, if any.

        Args:
            step: the `step_keys` of one row, per env (obs [*obs_shape],
                the record's shapes for the rest; tensors, arrays or numbers).
            core_state: one tensor per core_state field of the spec, per env
                (the model's state for this env, batch dim removed).
        """
        if len(core_state) != self.num_core_state:
            raise ValueError(
                f"got {len(core_state)} core state tensors, the spec has {self.num_core_state}"
            )
        sequence = None
        if bool(step["truncated"]):
            # The episode's final observation: the open window's terminal row. The
            # reset row that follows starts the next window.
            if self._count == 0:
                return None  # no open window to complete
            self._write(self._count, step, core_state, mask=False)
            self._count += 1
            sequence = self._emit()
            self._count = 0
            return sequence
        if self._count > 0 and bool(step["done"]):
            if bool(step["terminated"]):
                # This row ends the open window's episode: its terminal row.
                self._write(self._count, step, core_state, mask=False)
                self._count += 1
                sequence = self._emit()
            # (A done row that no truncated row announced, with no termination, would
            # join two episodes: the open window is dropped instead.)
            self._count = 0
        self._write(self._count, step, core_state, mask=True)
        self._count += 1
        if self._count == self.rows:
            # rows >= 2, so this cannot be the row that just emitted above.
            sequence = self._emit()
            # The next window starts `stride` rows in; it shares the last
            # seq_overlap + 1 rows (with no overlap, the bootstrap row).
            keep = self.rows - self.stride
            for rows in (*self._rows.values(), *self._states):
                rows[:keep] = rows[self.stride :].clone()
            self._count = keep
        return sequence


class PrioritizedReplay(SumTreeReplay):
    """Prioritized sequence replay shared by actor processes and the learner.

    Args:
        spec: per-sequence layout, `sequence_spec`.
        capacity: sequences held; the oldest is overwritten first (a ring).
        alpha: priority exponent (R2D2: 0.9).
        beta: importance-sampling exponent (R2D2: 0.6).
        frame_dedup: store frame-stacked observations once per frame (see
            the module docstring); needs obs [L, k, H, W].
        priorities: min_priority, default_priority (`SumTreeReplay`), both > 0.

    Writers (any process): ``replay.add(sequence)``; a slot still being written is
    skipped by other writers' claims, so capacity must exceed the number of writers
    adding at once, which any useful replay does by orders of magnitude. Learner:
    ``s = replay.sample(B, generator)``, loss, then
    ``replay.update_priorities(s.indices, new_priorities, s.generations)``.
    """

    unit = "sequences"  # what it holds, for messages and log columns

    def __init__(
        self,
        spec: Mapping[str, Field],
        capacity: int,
        *,
        alpha: float = 0.9,
        beta: float = 0.6,
        frame_dedup: bool = False,
        **priorities: float,
    ) -> None:
        super().__init__(alpha=alpha, beta=beta, **priorities)
        if not self.min_priority > 0 or not self.default_priority > 0:
            raise ValueError("min_priority and default_priority must be > 0")
        self.frame_dedup = frame_dedup
        self.spec = dict(spec)
        self.seq_len = _seq_len(spec)
        self.capacity = operator.index(capacity)
        self.storage = storage_spec(spec, frame_dedup)
        # The image leaves stored as frames, by their frames field.
        self.deduplicated = {frames_key(key): key for key in image_keys(spec, leading=1)}
        if not frame_dedup:
            self.deduplicated = {}
        self.tree = SumTree(self.capacity)
        self.tensors = {
            key: shared_zeros((self.capacity, *f.shape), f.dtype) for key, f in self.storage.items()
        }

    def __len__(self) -> int:
        """Slots written (or being written): min(sequences added, capacity)."""
        return min(self.tree.stats().claims, self.capacity)

    def add(self, sequence: Mapping[str, Tensor], priority: float | None = None) -> int:
        """Store one sequence (fields as in the spec); returns its slot.

        Enters with ``priority`` (before the exponent) when the actor computed
        one, else with the largest priority currently stored. Safe to call from
        several processes at once: each gets its own slot from the sum tree,
        which keeps the slot unsampleable until its data is fully written.
        """
        for key, field in self.spec.items():
            if tuple(sequence[key].shape) != field.shape:
                raise ValueError(
                    f"{key} has shape {tuple(sequence[key].shape)}, expected {field.shape}"
                )
        if self.frame_dedup:
            self._check_frame_stacks(sequence)
        index, generation = self.tree.claim()
        try:
            self._write(index, sequence)
        except BaseException:
            self.tree.commit(index, generation, 0.0)  # released, never sampled
            raise
        if priority is None:
            scaled = self.new_priority()
        else:
            given = torch.tensor([float(priority)], dtype=torch.float64)
            scaled = float(scaled_priorities(given, self.alpha, self.min_priority)[0])
        self.tree.commit(index, generation, scaled)
        return index

    def _write(self, index: int, sequence: Mapping[str, Tensor]) -> None:
        for key, tensor in self.tensors.items():
            leaf = self.deduplicated.get(key)
            if leaf is not None:
                obs = torch.as_tensor(sequence[leaf])
                stack = obs.shape[1]
                tensor[index, : stack - 1] = obs[0, :-1]
                tensor[index, stack - 1 :] = obs[:, -1]
            else:
                tensor[index] = torch.as_tensor(sequence[key])

    def _check_frame_stacks(self, sequence: Mapping[str, Tensor]) -> None:
        """Deduplication is exact only for sliding frame stacks: for every real
        row t >= 1, obs_t[:-1] must equal obs_{t-1}[1:]. The terminal row and
        padding are exempt: no loss reads their observations (a terminal row's
        Q-values never bootstrap), so they are stored by their newest frame only."""
        mask = torch.as_tensor(sequence["mask"]).bool()
        rows = mask[1:].nonzero().flatten() + 1
        for leaf in self.deduplicated.values():
            obs = torch.as_tensor(sequence[leaf])
            if len(rows) and not torch.equal(obs[rows, :-1], obs[rows - 1, 1:]):
                raise ValueError(
                    f"frame_dedup: observations {leaf} are not sliding frame stacks"
                    " (obs_t[:-1] != obs_{t-1}[1:] at some step); store them without"
                    " frame_dedup"
                )

    def _gather(self, indices: Tensor) -> dict[str, Tensor]:
        """The sequences in slots `indices`, time-major (`ReplaySample.batch`)."""
        batch: dict[str, Tensor] = {}
        for key, tensor in self.tensors.items():
            # [B, ...] -> [L, B, ...]; for core states [B, d0, ...] -> [d0, B, ...].
            rows = tensor.index_select(0, indices)
            leaf = self.deduplicated.get(key)
            if leaf is not None:
                stack = self.spec[leaf].shape[1]
                # [B, L + k - 1, H, W] -> windows [B, L, H, W, k] -> [B, L, k, H, W].
                rows = rows.unfold(1, stack, 1).permute(0, 1, 4, 2, 3)
                key = leaf
            batch[key] = rows.transpose(0, 1).contiguous()
        return batch

    def contents(self) -> tuple[dict[str, Tensor], dict[str, object]]:
        """A checkpoint of the replay in two parts: the stored sequences (views of the
        written slots, to be saved before anything else is read) and a function's worth
        of small state; call `settle` on the state once the tensors are written.

        Actors may still be adding while the tensors are written out: `settle` gives
        priority 0 to every slot whose generation changed since this call, so a restored
        replay never samples a sequence that was half overwritten in the file.
        """
        size = len(self)
        tensors = {key: leading_rows(tensor, size) for key, tensor in self.tensors.items()}
        return tensors, {"capacity": self.capacity, "size": size, "tree": self.tree.state_dict()}

    def restore(self, tensors: Mapping[str, Tensor], state: Mapping[str, object]) -> None:
        """Load `contents`' two parts into this (empty, same-layout) replay, before any
        writer starts. ValueError (one line) when the layout or capacity differ."""
        self._check_saved(tensors, state, self.tensors)
        size = int(state["size"])
        for key, tensor in self.tensors.items():
            saved = tensors[key]
            if tuple(saved.shape) != (size, *tensor.shape[1:]) or saved.dtype != tensor.dtype:
                raise ValueError(
                    f"the saved replay's {key} is {saved.dtype} {tuple(saved.shape)}, this one"
                    f" stores {tensor.dtype} {tuple(tensor.shape[1:])} per sequence"
                )
        for key, tensor in self.tensors.items():
            tensor[:size] = tensors[key]
        self.tree.load_state_dict(state["tree"])
