"""Figures a run measured, kept on disk for the next run of the same setup.

`--compile auto` keeps what compiling a step cost and gained (beast/train_step/auto.py
`StepRecord`) and the thread tuner the thread count it measured best
(beast/learning/thread_tuner.py): both are a JSON file of {key: entry} beside the compiled
graphs (`compile_cache_dir`), read and written here. The thread tuner's keys and those
under which packages are recorded (beast/train_step/package.py `known_step_key`) hold
`source_digest`: what one version of beast measured or recorded is not taken for
another's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
from typing import Any

__all__ = ["compile_cache_dir", "read_record", "record_path", "source_digest", "write_record"]


def compile_cache_dir() -> str:
    """Where inductor keeps compiled graphs between runs: a second run of a config loads
    its graphs from here instead of compiling them. $BEAST_COMPILE_CACHE, else
    ~/.cache/beast/inductor (torch's default is under /tmp, which a reboot empties)."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "beast", "inductor")
    return os.environ.get("BEAST_COMPILE_CACHE", default)


def record_path(name: str) -> str:
    """The record file `name` (say "beast_steps.json") beside the compiled graphs."""
    return os.path.join(compile_cache_dir(), name)


def read_record(name: str, key: str) -> dict[str, Any]:
    """The entry under `key`, or {} when there is none (no file, a foreign or broken
    one: a record is a hint, never a reason to fail a run)."""
    try:
        with open(record_path(name)) as file:
            entry = json.load(file).get(key, {})
    except (OSError, ValueError, AttributeError):
        return {}
    return entry if isinstance(entry, dict) else {}


def write_record(name: str, key: str, entry: dict[str, Any]) -> None:
    """Set `key` to `entry` in the shared file, written to a temporary name and renamed
    (runs of a sweep may write at once: the last write wins, a reader never sees half a
    file). A read-only home keeps nothing, silently."""
    path = record_path(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path) as file:
                known = json.load(file)
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        known[key] = entry
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            json.dump(known, file)
        os.replace(temporary, path)
    except OSError:
        pass


@functools.cache
def source_digest() -> bytes:
    """A digest of every Python file of beast (5 ms): a key holding it names what one
    version of beast's code built or measured, never taken for another's."""
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.digest()
