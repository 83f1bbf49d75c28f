"""What a replay's writers count per write, and polybeast's staging of their steps.

Every replay writer (`beast.experience.replay_sink.SequenceWriter`,
`beast.experience.transition_replay.TransitionWriter`, and the env servers' staging) counts the
same things per write of its n envs: its env steps and the episodes that ended
(`StepTally`). Outside the learner process (polybeast) a writer stages its items with
those counts until a payload is ready for the sink's `commit` (`StagedSteps`), built by
the sink's `staging_recipe()` (`StagingRecipe`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["StagedSteps", "StagingRecipe", "StepTally"]


class StepTally:
    """What one write of n envs adds to its writer's counts, from the env batch's
    `sources` (`[n]` arrays at fixed addresses, updated in place between writes): its env
    steps, none for the first write (the envs' reset observations: no env step led to
    it), and the episodes that ended at it."""

    def __init__(self, sources: Mapping[str, np.ndarray]) -> None:
        self.num_envs = len(sources["reward"])
        self._episode_end = sources["episode_end"]
        self._episode_return = sources["episode_return"]
        self._episode_step = sources["episode_step"]
        self._first = True

    def take(self) -> tuple[int, list[tuple[float, int]]]:
        """(env steps, [(return, length) of each episode that ended]) of this write."""
        steps = 0 if self._first else self.num_envs
        self._first = False
        episodes = [
            (float(self._episode_return[i]), int(self._episode_step[i]))
            for i in np.flatnonzero(self._episode_end).tolist()
        ]
        return steps, episodes


class StagedSteps(abc.ABC):
    """Items a writer staged outside the learner process (polybeast), with their env steps
    and finished episodes, until `take_rollout` hands them over, every `publish_every`
    writes: the payload of a sink's `commit` (`ReplaySink.record_payload` reads its
    steps and episodes)."""

    def __init__(self, publish_every: int) -> None:
        self.publish_every = publish_every
        self._episodes: list[tuple[float, int]] = []
        self._env_steps = 0
        self._writes = 0

    def step(self, num_envs: int, episodes: Sequence[tuple[float, int]]) -> bool:
        """Count one write: `num_envs` env steps and the episodes that ended at it."""
        self._writes += 1
        self._env_steps += num_envs
        self._episodes += episodes
        return True

    def take_rollout(self) -> dict | None:
        """The payload for the sink's `commit` once `publish_every` writes were staged since
        the last one, else None."""
        if self._writes < self.publish_every:
            return None
        payload = {
            **self._take_items(),
            "episode_returns": [r for r, _ in self._episodes],
            "episode_steps": [n for _, n in self._episodes],
            "env_steps": self._env_steps,
        }
        self._episodes, self._env_steps, self._writes = [], 0, 0
        return payload

    @abc.abstractmethod
    def _take_items(self) -> dict:
        """The payload's staged items (the sink's own keys), cleared for the next one."""


class StagingRecipe(abc.ABC):
    """How to stage steps for a learner's replay outside its process (polybeast)."""

    def writer(
        self,
        sources: Mapping[str, np.ndarray],
        *,
        publish_every: int,
        first_id: int = 0,
        id_stride: int = 0,
    ) -> tuple[Any, StagedSteps]:
        """A writer for the n envs of `sources`, and the staging that hands what it wrote
        over every `publish_every` writes (`take_rollout`) for the sink's `commit`
        (`first_id`, `id_stride`: the rollout writer's, unused by a replay)."""
        return self._writer(sources, publish_every)

    @abc.abstractmethod
    def _writer(
        self, sources: Mapping[str, np.ndarray], publish_every: int
    ) -> tuple[Any, StagedSteps]:
        """`writer`'s writer and staging."""
