"""Checkpoints: written atomically, the previous one kept, loaded without running code.

Saving writes a temporary file in the run directory, flushes and fsyncs it,
moves the current checkpoint to `model.prev.tar`, renames the new file to
`model.tar` and fsyncs the directory. A crash or a full disk at any point
leaves at least one complete checkpoint: the old `model.tar`, or
`model.prev.tar` if the crash fell between the two renames. Loading tries
`model.tar` first and falls back to `model.prev.tar` when the newest file
is missing or unreadable, and says so. Files are read with
`torch.load(weights_only=True)`: tensors and plain data, never code.

With --eval_interval, `model_best.tar` beside it holds the weights that scored the best
mean evaluation return so far (beast/run/evaluator.py), with the config, the step and the
returns, written with the same discipline (no previous copy is kept: the file it
replaces scored lower).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from typing import Any

import torch

__all__ = [
    "BEST_CHECKPOINT_NAME",
    "CHECKPOINT_NAME",
    "PREVIOUS_CHECKPOINT_NAME",
    "REPLAY_NAME",
    "CheckpointError",
    "has_checkpoint",
    "load_checkpoint",
    "load_latest_checkpoint",
    "load_replay_file",
    "save_best_checkpoint",
    "save_checkpoint",
    "save_replay_file",
]

CHECKPOINT_NAME = "model.tar"
PREVIOUS_CHECKPOINT_NAME = "model.prev.tar"
# The algorithm's replay (--checkpoint_replay): its contents; model.tar holds the small
# rest (priorities, counters) and a token that must match this file's.
REPLAY_NAME = "replay.tar"
# The weights with the best mean evaluation return (--eval_interval).
BEST_CHECKPOINT_NAME = "model_best.tar"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; one line for the user."""


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: str, payload: Any, *, keep_previous: str | None = None) -> None:
    """torch.save `payload` to a temporary file beside `path`, fsync it, move the old file
    to `keep_previous` (if given), rename the new one into place and fsync the directory.
    Raises OSError; a crash at any point leaves a complete file behind."""
    directory = os.path.dirname(path)
    tmp_path = None
    try:
        fd, tmp_path = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and os.path.exists(path):
            os.replace(path, keep_previous)
        os.replace(tmp_path, path)
        tmp_path = None
        _fsync_directory(directory)
    finally:
        if tmp_path is not None and os.path.exists(tmp_path):
            os.unlink(tmp_path)


def _install(
    path: str, payload: Any, what: str, intact: str, keep_previous: str | None = None
) -> str:
    """`_write_atomically`, an OSError made a one-line CheckpointError naming `what` was
    being written and what is `intact`; returns `path`."""
    try:
        _write_atomically(path, payload, keep_previous=keep_previous)
    except OSError as error:
        raise CheckpointError(
            f"cannot write {what} {path}: {error.strerror or error} ({intact} is intact)"
        ) from error
    return path


def save_checkpoint(run_dir: str, payload: dict[str, Any]) -> str:
    """Atomically install `payload` as RUN_DIR/model.tar; returns its path."""
    return _install(
        os.path.join(run_dir, CHECKPOINT_NAME),
        payload,
        "checkpoint",
        "the previous checkpoint",
        keep_previous=os.path.join(run_dir, PREVIOUS_CHECKPOINT_NAME),
    )


def save_best_checkpoint(run_dir: str, payload: dict[str, Any]) -> str:
    """Atomically install `payload` as RUN_DIR/model_best.tar; returns its path."""
    path = os.path.join(run_dir, BEST_CHECKPOINT_NAME)
    return _install(path, payload, "the best checkpoint", "the previous best")


def save_replay_file(run_dir: str, payload: dict[str, Any]) -> str:
    """Atomically write a replay's contents as RUN_DIR/replay.tar (written before the
    model.tar that names it, with the same discipline); returns its path."""
    path = os.path.join(run_dir, REPLAY_NAME)
    return _install(path, payload, "the replay", "the previous checkpoint")


def load_replay_file(run_dir: str) -> dict[str, Any] | None:
    """RUN_DIR/replay.tar's contents, memory-mapped; None when it is missing or unreadable."""
    path = os.path.join(run_dir, REPLAY_NAME)
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a torn or foreign file: the run starts with an empty replay
        return None


def _unreadable(path: str, error: Exception) -> str:
    """Why torch.load could not read the file at `path`, in words. An empty file, one cut
    short and one of another kind are named as such, rather than by what torch.load
    raises for them (EOFError, "[Errno 22] Invalid argument", its zip reader's internal
    error). Checkpoints are torch's zip files, whose directory is at the end: a file that
    starts as one and has no directory lost its end."""
    size = os.path.getsize(path)
    if size == 0:
        return "the file is empty (0 bytes), damaged since it was written"
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if not is_zip:
        return "the file is not a checkpoint (beast's are torch's zip files)"
    if not zipfile.is_zipfile(path):
        return (
            f"the file is cut short ({size:,} bytes, its end missing), damaged since it was written"
        )
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload of the checkpoint at `path`; CheckpointError, one line, when there is
    none or it cannot be read (saying how it is damaged) or is not beast's."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"cannot load checkpoint {path}: {_unreadable(path, error)}"
        ) from error
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
