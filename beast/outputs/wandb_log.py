"""--wandb: the run in Weights & Biases, beside its TensorBoard files.

`start_wandb_run` opens the W&B run of a run directory: named after the xpid, with the
merged config and the git commit and dirty flag (`beast.outputs.logs.git_info`) as its config,
and its files in RUN_DIR/wandb. The W&B run id is kept in RUN_DIR/wandb_id, so that a
resumed run continues its W&B run rather than starting another. The scalars themselves
reach W&B through the run log's one writer (beast/outputs/logs.py `ScalarWriter`).

wandb is imported here only, and only with --wandb: a run without it neither imports the
package nor writes anything of W&B's. The mode (online, offline) is --wandb_mode, or by
default wandb's own setting (the WANDB_MODE variable, `wandb offline` in the directory),
so that a machine already set up for W&B needs no flag; offline runs are synced later
with `wandb sync RUN_DIR/wandb/offline-run-*`.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any

from beast.config import WANDB_MISSING, Config, ConfigError

__all__ = ["WANDB_ID_NAME", "WandbSettings", "start_wandb_run"]

# RUN_DIR's file holding the W&B run id.
WANDB_ID_NAME = "wandb_id"


@dataclass(frozen=True)
class WandbSettings:
    """--wandb's flags."""

    project: str
    entity: str | None
    group: str | None
    tags: tuple[str, ...]
    mode: str | None  # None: wandb's own setting

    @classmethod
    def from_config(cls, config: Config) -> WandbSettings | None:
        """The settings of a run with --wandb, else None."""
        if not config.wandb:
            return None
        return cls(
            project=config.wandb_project,
            entity=config.wandb_entity,
            group=config.wandb_group,
            tags=tuple(config.wandb_tag_list),
            mode=config.wandb_mode,
        )


def _run_id(run_dir: str) -> str:
    """The W&B run id of `run_dir`: the one it already has, or a new one (8 random hex
    digits, W&B's own length), kept there."""
    path = os.path.join(run_dir, WANDB_ID_NAME)
    if os.path.isfile(path):
        with open(path) as f:
            run_id = f.read().strip()
        if run_id:
            return run_id
    run_id = secrets.token_hex(4)
    with open(path, "w") as f:
        f.write(run_id + "\n")
    return run_id


def start_wandb_run(
    settings: WandbSettings, run_dir: str, config: dict[str, Any], git: dict[str, Any]
) -> Any:
    """The W&B run (`wandb.Run`) of `run_dir`; ConfigError (one line) when wandb is not
    installed or cannot start."""
    try:
        import wandb
    except ImportError as error:
        raise ConfigError(WANDB_MISSING) from error
    run_id = _run_id(run_dir)
    try:
        return wandb.init(
            project=settings.project,
            entity=settings.entity,
            group=settings.group,
            tags=list(settings.tags),
            name=str(config.get("xpid")),
            id=run_id,
            resume="allow",
            dir=run_dir,
            mode=settings.mode,
            config={**config, "git": git},
        )
    except Exception as error:  # no network, no login, a bad entity: say so in one line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"--wandb: cannot start the W&B run ({reason}); log in with `wandb login`, or"
            " run offline with --wandb_mode offline"
        ) from error
