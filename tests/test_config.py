"""Config: flags parse to typed fields, bad values are one-line ConfigErrors."""

import pytest

from beast.config import Config, ConfigError, parse_args


def test_defaults_are_valid_and_finalized():
    config = parse_args([])
    assert config.env == "PongNoFrameskip-v4"
    assert config.xpid  # filled in once
    assert (
        config.num_buffers == config.num_actors * config.num_envs_per_actor + 2 * config.batch_size
    )


def test_flags_parse_with_types():
    config = parse_args(
        [
            "--env",
            "CartPole-v1",
            "--num_actors",
            "3",
            "--learning_rate",
            "1e-3",
            "--use_lstm",
            "--xpid",
            "x",
            "--num_buffers",
            "40",
        ]
    )
    assert (config.num_actors, config.learning_rate, config.use_lstm) == (3, 1e-3, True)
    assert config.xpid == "x" and config.num_buffers == 40
    assert parse_args(["--no-use_lstm"]).use_lstm is False


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--num_actors", "0"], "--num_actors must be positive"),
        (["--batch_size", "-4"], "--batch_size must be positive"),
        (["--unroll_length", "0"], "--unroll_length must be positive"),
        (["--num_buffers", "10", "--batch_size", "8"], "--num_buffers 10 is too small"),
        (["--discounting", "1.5"], "--discounting must be in [0, 1]"),
    ],
)
def test_bad_values_raise_one_line(argv, fragment):
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_parser_errors_exit_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--num_actors", "two"], prog="monobeast.py")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value" in err


def test_run_dir_expands_user(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    config = Config(savedir="~/runs", xpid="a").finalize()
    assert config.run_dir == "/home/someone/runs/a"
