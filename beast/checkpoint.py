"""Checkpoints: written atomically, the previous one kept, loaded without running code.

Saving writes a temporary file in the run directory, flushes and fsyncs it,
moves the current checkpoint to `model.prev.tar`, renames the new file to
`model.tar` and fsyncs the directory. A crash or a full disk at any point
leaves at least one complete checkpoint: the old `model.tar`, or
`model.prev.tar` if the crash fell between the two renames. Loading tries
`model.tar` first and falls back to `model.prev.tar` when the newest file
is missing or unreadable, and says so. Files are read with
`torch.load(weights_only=True)`: tensors and plain data, never code.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_NAME",
    "PREVIOUS_CHECKPOINT_NAME",
    "CheckpointError",
    "has_checkpoint",
    "load_checkpoint",
    "load_latest_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_NAME = "model.tar"
PREVIOUS_CHECKPOINT_NAME = "model.prev.tar"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; one line for the user."""


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str, payload: dict[str, Any]) -> str:
    """Atomically install `payload` as RUN_DIR/model.tar; returns its path."""
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    tmp_path = None
    try:
        fd, tmp_path = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=run_dir)
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            os.replace(path, os.path.join(run_dir, PREVIOUS_CHECKPOINT_NAME))
        os.replace(tmp_path, path)
        tmp_path = None
        _fsync_directory(run_dir)
    except OSError as error:
        raise CheckpointError(
            f"cannot write checkpoint {path}: {error.strerror or error}"
            " (the previous checkpoint is intact)"
        ) from error
    finally:
        if tmp_path is not None and os.path.exists(tmp_path):
            os.unlink(tmp_path)
    return path


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"cannot load checkpoint {path}: {reason}") from error
    if not isinstance(payload, dict) or "model_state_dict" not in payload:
        raise CheckpointError(f"{path} is not a beast checkpoint")
    return payload


def has_checkpoint(run_dir: str) -> bool:
    return any(
        os.path.isfile(os.path.join(run_dir, name))
        for name in (CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME)
    )


def load_latest_checkpoint(
    run_dir: str, map_location: str | torch.device = "cpu"
) -> tuple[dict[str, Any], str, str | None]:
    """(payload, path it came from, why the newest one was skipped or None)."""
    newest = os.path.join(run_dir, CHECKPOINT_NAME)
    previous = os.path.join(run_dir, PREVIOUS_CHECKPOINT_NAME)
    try:
        return load_checkpoint(newest, map_location), newest, None
    except CheckpointError as newest_error:
        if not os.path.isfile(previous):
            raise
        try:
            return load_checkpoint(previous, map_location), previous, str(newest_error)
        except CheckpointError as previous_error:
            raise CheckpointError(f"{newest_error}; and {previous_error}") from previous_error
