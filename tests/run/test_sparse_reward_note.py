"""The start-up line's note for a task whose reward the defaults do not find (issue 43:
MountainCar-v0 must not fail silently; beast/config/families.py, `describe_defaults`)."""

import pytest

from beast.config import describe_defaults
from beast.envs import probe_spec
from beast.run.parsing import parse_args


@pytest.mark.parametrize(
    ("algo", "path"),
    [("impala", "configs/impala/classic.yaml"), ("ppo", "configs/ppo/classic.yaml")],
)
def test_mountain_car_says_its_reward_is_sparse_and_what_learns_it(algo, path):
    config = parse_args(["--algo", algo, "--env", "MountainCar-v0"])
    line = describe_defaults(config, probe_spec("MountainCar-v0"))
    assert line.startswith(f"defaults: {path} (MountainCar-v0 is classic control); ")
    assert "reward is sparse" in line
    assert "--algo dqn learns it" in line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # The algorithm that learns it: its defaults need no note.
        (
            ["--algo", "dqn"],
            "defaults: configs/dqn/classic.yaml (MountainCar-v0 is classic control)",
        ),
        # The user's own file: its settings are not the defaults the note measured.
        (
            ["--config", "configs/impala/classic.yaml"],
            "defaults: configs/impala/classic.yaml (--config)",
        ),
    ],
)
def test_no_note_for_dqn_or_a_given_config(argv, line):
    config = parse_args([*argv, "--env", "MountainCar-v0"])
    assert describe_defaults(config, probe_spec("MountainCar-v0")) == line


def test_no_note_for_a_task_the_defaults_learn():
    config = parse_args(["--env", "Acrobot-v1"])
    line = describe_defaults(config, probe_spec("Acrobot-v1"))
    assert line == "defaults: configs/impala/classic.yaml (Acrobot-v1 is classic control)"
