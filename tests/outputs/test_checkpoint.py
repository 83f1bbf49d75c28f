"""A checkpoint that cannot be read is named for what is wrong with it (beast/outputs/
checkpoint.py), and the user is told what to do: an empty file, one cut short and one of
another kind, rather than torch.load's EOFError, "[Errno 22] Invalid argument" or its zip
reader's internal error. Saving, the fallback to model.prev.tar and the refusal of code
are tests/end_to_end/test_reliability.py's."""

import pytest
import torch

from beast.config import Config, ConfigError
from beast.outputs.checkpoint import (
    CHECKPOINT_NAME,
    PREVIOUS_CHECKPOINT_NAME,
    CheckpointError,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from beast.trained.play import load_test_checkpoint

# What each damage leaves of a checkpoint's bytes, and how it is named.
DAMAGES = {
    "empty": (lambda data: b"", "the file is empty (0 bytes), damaged since it was written"),
    "cut_in_half": (
        lambda data: data[: len(data) // 2],
        "the file is cut short ({size:,} bytes, its end missing), damaged since it was written",
    ),
    # The last bytes hold the zip's directory: a few missing is a file cut short too.
    "last_bytes_lost": (
        lambda data: data[:-10],
        "the file is cut short ({size:,} bytes, its end missing), damaged since it was written",
    ),
    "another_file": (
        lambda data: b"not a checkpoint\n",
        "the file is not a checkpoint (beast's are torch's zip files)",
    ),
}
# What torch.load's errors for these files say, which the user must not have to decode.
TORCH_WORDS = ("Errno", "EOFError", "zip archive", "central directory", "KeyError")


def damaged_run(tmp_path, damage: str, *, previous: bool = False):
    """A run directory whose model.tar (and model.prev.tar, with `previous`) has
    `damage`; returns model.tar's path."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    payload = {"model_state_dict": {"w": torch.ones(64)}, "step": 1, "config": {}}
    save_checkpoint(str(run_dir), payload)
    save_checkpoint(str(run_dir), payload)
    cut, _ = DAMAGES[damage]
    names = [CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME] if previous else [CHECKPOINT_NAME]
    for name in names:
        path = run_dir / name
        path.write_bytes(cut(path.read_bytes()))
    if not previous:
        (run_dir / PREVIOUS_CHECKPOINT_NAME).unlink()
    return run_dir / CHECKPOINT_NAME


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_named_as_such(tmp_path, damage):
    path = damaged_run(tmp_path, damage)
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(str(path))
    how = DAMAGES[damage][1].format(size=path.stat().st_size)
    assert str(raised.value) == f"cannot load checkpoint {path}: {how}"
    assert not any(word in str(raised.value) for word in TORCH_WORDS)


@pytest.mark.parametrize("damage", DAMAGES)
def test_both_damaged_files_are_named(tmp_path, damage):
    path = damaged_run(tmp_path, damage, previous=True)
    with pytest.raises(CheckpointError) as raised:
        load_latest_checkpoint(str(path.parent))
    message = str(raised.value)
    assert message.count("damaged since it was written") == (0 if damage == "another_file" else 2)
    assert str(path) in message and PREVIOUS_CHECKPOINT_NAME in message
    assert "\n" not in message


def test_mode_test_names_the_damage_and_what_to_do(tmp_path):
    path = damaged_run(tmp_path, "cut_in_half")
    config = Config(savedir=str(tmp_path), xpid="run")
    with pytest.raises(ConfigError) as raised:
        load_test_checkpoint(config)
    message = str(raised.value)
    assert message.startswith(f"cannot test {path.parent}: cannot load checkpoint {path}:")
    assert "the file is cut short" in message
    assert message.endswith("; restore the file from a copy, or train the run again")
