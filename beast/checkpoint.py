"""Checkpoints: written atomically, loaded without running code.

A checkpoint is written to a temporary file in the same directory, flushed
and fsynced, then renamed over the old one: a crash or a full disk mid-write
leaves the previous checkpoint intact. Loading uses `weights_only=True`, so
a checkpoint from elsewhere can hold tensors and plain data but no code.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "model.tar"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; one line for the user."""


def save_checkpoint(path: str, payload: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as error:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise CheckpointError(
            f"cannot write checkpoint {path}: {error.strerror or error}"
        ) from error


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"cannot load checkpoint {path}: {reason}") from error
