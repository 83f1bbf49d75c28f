"""Start-up checks that stop a run in one line before anything is allocated: image leaves
that frame dedup cannot store, and a replay larger than the memory available.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from beast import envs
from beast.algos.base import Algorithm
from beast.config import ConfigError


def check_frame_stacks(algorithm: Algorithm, env: Any) -> None:
    """A one-line ConfigError when the algorithm's replay deduplicates frames and an image
    leaf of the env's observation is not a frame stack (`envs.images_not_stacked`): its
    steps could never be rebuilt (a transition replay would sample nothing, a sequence
    replay refuse every sequence)."""
    if not algorithm.experience().frame_dedup or not algorithm.spec.has_images():
        return
    not_stacked = envs.images_not_stacked(env, algorithm.spec)
    if not_stacked:
        spec, flag = algorithm.spec.obs_fields(), "--no-frame_dedup"
        leaves = ", ".join(f"{key} {spec[key].shape}" for key in not_stacked)
        raise ConfigError(
            f"--frame_dedup stores frame stacks once per frame, and {algorithm.config.env}'s"
            f" {leaves} are not frame stacks (obs_t[:-1] != obs_{{t-1}}[1:] in an episode);"
            f" pass {flag}"
        )


def available_memory() -> int:
    """Bytes of memory this machine can still give: MemAvailable (Linux), else physical."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# The share of the available memory a replay may take: the learner, the actors and the
# page cache need the rest.
REPLAY_MEMORY_SHARE = 0.8


def check_replay_fits(algorithm: Algorithm, model: nn.Module) -> None:
    """A one-line ConfigError, before anything is allocated (or a run directory made),
    when the algorithm's replay would take more than REPLAY_MEMORY_SHARE of the memory
    available: what it needs, and the --replay_size that would fit."""
    footprint = algorithm.experience().footprint(algorithm.experience_layout(model))
    if footprint is None:
        return
    budget = REPLAY_MEMORY_SHARE * available_memory()
    if footprint.nbytes > budget:
        stacks = algorithm.spec.has_images() and not footprint.frame_dedup
        hint = ", or store frames once with --frame_dedup" if stacks else ""
        raise ConfigError(
            f"a replay of {footprint.capacity:,} {footprint.unit} needs"
            f" {footprint.nbytes / 2**30:,.1f} GiB ({footprint.per_item:,.0f} B each), more"
            f" than {REPLAY_MEMORY_SHARE:.0%} of the {budget / REPLAY_MEMORY_SHARE / 2**30:,.1f}"
            f" GiB available; lower --replay_size to {int(budget // footprint.per_item):,} or"
            f" less{hint}"
        )
