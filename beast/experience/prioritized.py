"""What the sum-tree replays share: PER's priorities, stratified draws and weights.

`beast.experience.sequence_replay.PrioritizedReplay` (sequences, R2D2) and
`beast.experience.transition_replay.RingReplay` (transitions, the DQN family and Ape-X) keep one
leaf per stored item in a native `SumTree` (beast/native/sum_tree.c) and sample and
checkpoint it the same way (`SumTreeReplay`); only what an item is, and how a batch is
gathered from drawn slots, is theirs.

Priorities (Schaul et al. 2016, PER section 3.3 and 3.4): an item (a sequence, a
transition) with priority p is sampled with probability ``P = p^alpha / sum p^alpha``
(alpha = 0.9 in R2D2), and its loss weighted by ``w = (N P)^-beta``, divided by the
batch's largest w so weights only ever scale updates down (beta = 0.6). New items enter
with the largest priority in the replay unless the actor gives one. Each slot has a
generation, bumped on every overwrite: a priority update for a sample whose slot was
overwritten meanwhile is dropped, and a sample whose slot was overwritten while being
copied out gets weight 0. A uniform replay (``prioritized=False``) keeps every complete
item at priority 1 and weight 1.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from beast.native import SumTree, SumTreeSample

__all__ = [
    "ReplaySample",
    "SumTreeReplay",
    "draw_weights",
    "importance_weights",
    "scaled_priorities",
    "stratified_draws",
    "stratified_parts",
]


def stratified_draws(batch_size: int, generator: torch.Generator | None = None) -> Tensor:
    """float64 [B] draws ``(k + U[0, 1)) / B``, one in each of B equal slices of [0, 1).

    PER (appendix B.2.1) splits the priority mass into B equal ranges and
    samples one entry from each: the batch covers high and low priorities
    alike, with the same marginal law as B independent draws.
    """
    batch_size = operator.index(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    offsets = torch.rand(batch_size, generator=generator, dtype=torch.float64)
    return (torch.arange(batch_size, dtype=torch.float64) + offsets) / batch_size


def stratified_parts(batch_size: int, parts: int, generator: torch.Generator | None) -> Tensor:
    """`parts` batches of `batch_size` draws at once, each stratified over the whole mass:
    ``parts * batch_size`` strata, batch i taking strata i, i + parts, i + 2 parts, ...
    (so that each batch covers high and low priorities alike, as one drawn alone does).
    float64 [parts * batch_size], batch i at [i * batch_size, (i + 1) * batch_size)."""
    draws = stratified_draws(parts * batch_size, generator)
    return draws.view(batch_size, parts).t().reshape(-1)


def importance_weights(probabilities: Tensor, beta: float) -> Tensor:
    """PER's importance-sampling weights, normalised by their max: float32 [B].

    ``w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (P(i) / min_j P(j))^-beta``
    over the batch (as seed_rl and R2D2 normalise), so N cancels and the
    largest weight is exactly 1: weights only scale updates down, which keeps
    the step size bounded (PER section 3.4).

    Args:
        probabilities: float [..., B], each sample's probability of being drawn
            (positive); leading axes are separate batches, each normalised alone.
        beta: the exponent, in [0, 1]; 0 gives all ones.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    probabilities = probabilities.double()
    if not bool((probabilities > 0).all()):
        raise ValueError("probabilities must be positive")
    smallest = probabilities.min(dim=-1, keepdim=True).values
    return (probabilities / smallest).pow(-beta).float()


def scaled_priorities(td_priorities: Tensor, alpha: float, min_priority: float) -> Tensor:
    """``max(p, min_priority) ** alpha`` in float64 on the CPU, what a sum tree stores for
    priorities p from a loss; ValueError for a negative or non-finite one."""
    td_priorities = torch.as_tensor(td_priorities).detach().cpu().double()
    if not bool(torch.isfinite(td_priorities).all()) or bool((td_priorities < 0).any()):
        raise ValueError("td_priorities must be finite and >= 0")
    return td_priorities.clamp(min=min_priority).pow(alpha)


def draw_weights(
    tree: SumTree, drawn: SumTreeSample, beta: float, parts: int
) -> tuple[Tensor, Tensor]:
    """(importance weights [B], probabilities [B]) of a stratified draw of `parts` batches
    (`stratified_parts`), the weights normalised batch by batch and 0 for every slot a
    writer claimed after it was drawn (it may have changed the rows mid-copy: claims
    bump the generation before any write)."""
    fresh = tree.generations(drawn.indices) == drawn.generations
    probabilities = drawn.priorities / drawn.total
    weights = importance_weights(probabilities.view(parts, -1), beta).view(-1) * fresh
    return weights, probabilities


class ReplaySample(NamedTuple):
    """A sampled batch.

    indices: int64 [B], replay slots (pass back to `update_priorities`).
    generations: int64 [B], the slots' generations when sampled (ditto).
    batch: the spec's fields time-major, [L, B, ...]; core_state_i fields
        [d0, B, ...] (the batch at dim 1, as models hold their state).
    weights: float32 [B], importance weights normalised by their max; 0 for
        a sample whose slot was overwritten while it was copied out.
    probabilities: float64 [B], the probability each sample was drawn with.
    """

    indices: Tensor
    generations: Tensor
    batch: dict[str, Tensor]
    weights: Tensor
    probabilities: Tensor


class SumTreeReplay(abc.ABC):
    """A replay whose items are the leaves of a native `SumTree` (module docstring).

    Subclasses set `tree`, `tensors` (their shared blocks), `capacity` and `unit`, and
    gather a batch from drawn slots (`_gather`). Picklable to multiprocessing children:
    the same memory and sum tree.

    Args:
        alpha: priority exponent.
        beta: importance-sampling exponent; `sample` can override it per call (e.g.
            annealed towards 1).
        min_priority: floor for priorities before the exponent, so an item whose TD
            errors all came out 0 still gets replayed now and then (PER's epsilon).
        default_priority: the priority of the first items, while every stored priority
            is still 0 (PER uses 1).
        prioritized: sample by priority (PER), else uniformly.
    """

    unit: str  # what it holds, for messages and log columns
    tree: SumTree
    tensors: dict[str, Tensor]
    capacity: int

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        min_priority: float = 1e-6,
        default_priority: float = 1.0,
        prioritized: bool = True,
    ) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.alpha, self.beta = alpha, beta
        self.min_priority, self.default_priority = min_priority, default_priority
        self.prioritized = prioritized

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def new_priority(self) -> float:
        """A new item's priority after the exponent: 1 in a uniform replay, else PER's:
        the largest in the tree, or `default_priority` scaled while every priority is
        still 0."""
        if not self.prioritized:
            return 1.0
        scaled = self.tree.max()
        if scaled > 0.0:
            return scaled
        default = torch.tensor([self.default_priority], dtype=torch.float64)
        return float(scaled_priorities(default, self.alpha, self.min_priority)[0])

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        *,
        beta: float | None = None,
        parts: int = 1,
    ) -> ReplaySample:
        """Draw ``batch_size`` items by priority (stratified over the priority mass), in
        the subclass's layout (`_gather`); with `parts`, that many batches at once, one
        after another along the batch axis (`stratified_parts`), their importance
        weights normalised batch by batch.

        Raises ValueError while the replay holds no sampleable item.
        """
        beta = (self.beta if beta is None else beta) if self.prioritized else 0.0
        drawn = self.tree.sample(stratified_parts(batch_size, parts, generator))
        batch = self._gather(drawn.indices)
        # Weighed after the copy: a slot claimed meanwhile gets weight 0 (`draw_weights`).
        weights, probabilities = draw_weights(self.tree, drawn, beta, parts)
        return ReplaySample(drawn.indices, drawn.generations, batch, weights, probabilities)

    @abc.abstractmethod
    def _gather(self, indices: Tensor) -> dict[str, Tensor]:
        """The batch of the items in slots `indices` (int64 [B]), as `ReplaySample.batch`."""

    def update_priorities(self, indices: Tensor, td_priorities: Tensor, generations: Tensor) -> int:
        """Set sampled items' priorities (before the exponent) from the loss.

        Only slots whose generation still matches are changed (the rest were overwritten
        since they were sampled). Returns how many were; a uniform replay keeps its
        priorities (returns 0). Raises ValueError for a negative or non-finite priority.
        """
        if not self.prioritized:
            return 0
        scaled = scaled_priorities(td_priorities, self.alpha, self.min_priority)
        return self.tree.update(indices, scaled, generations)

    def settle(self, state: dict[str, object]) -> dict[str, object]:
        """`state` (from `contents`, its "tree" the `SumTree.state_dict()` taken with the
        contents) with priority 0 for every slot whose generation has changed since:
        writers may overwrite slots while the contents are written out, and a restored
        replay must never sample one that is half overwritten in the file."""
        saved = dict(state["tree"])
        changed = saved["generations"] != self.tree.state_dict()["generations"]
        saved["priorities"] = torch.where(changed, 0.0, saved["priorities"])
        return {**state, "tree": saved}

    def _check_saved(
        self, tensors: Mapping[str, Tensor], state: Mapping[str, object], fields: Mapping
    ) -> None:
        """ValueError (one line) when a saved replay (`contents`' two parts) holds another
        number of items than this one, or other fields than `fields`."""
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"the saved replay holds {state['capacity']} {self.unit}, this one {self.capacity}"
            )
        if set(tensors) != set(fields):
            raise ValueError(
                f"the saved replay's fields {sorted(tensors)} differ from {sorted(fields)}"
            )
