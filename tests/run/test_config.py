"""Config: flags and YAML files parse to typed fields, bad values are one-line ConfigErrors."""

import dataclasses
import os

import pytest
import yaml

from beast.algos import ALGORITHMS, algorithm_class
from beast.algos.build import config_for
from beast.config import (
    CONFIGS_DIR,
    Config,
    ConfigError,
    config_to_yaml,
    describe_defaults,
    load_config_file,
)
from beast.envs import EnvError, probe_spec
from beast.run.parsing import build_parser, parse_args


def test_defaults_are_valid_and_finalized():
    config = parse_args([])
    assert config.env == "PongNoFrameskip-v4"
    assert config.xpid  # filled in once
    assert (
        config.num_buffers == config.num_actors * config.num_envs_per_actor + 2 * config.batch_size
    )


def test_queued_batches_set_the_default_num_buffers():
    slots = 2 * 4  # configs/impala/classic.yaml: 2 actors x 4 envs, one queued batch
    assert parse_args(["--env", "CartPole-v1"]).num_buffers == slots + 1 * 8
    config = parse_args(["--env", "CartPole-v1", "--queued_batches", "3", "--batch_size", "4"])
    assert config.num_buffers == slots + 3 * 4
    # An explicit --num_buffers wins.
    assert parse_args(["--env", "CartPole-v1", "--num_buffers", "30"]).num_buffers == 30


def test_num_env_splits_auto_splits_central_actors_in_two():
    config = parse_args(["--num_envs_per_actor", "8"])
    assert (config.env_splits("central"), config.env_splits("local")) == (2, 1)
    odd = parse_args(["--num_envs_per_actor", "5"])
    assert odd.env_splits("central") == 1  # lanes must be equal
    assert parse_args(["--num_env_splits", "4"]).env_splits("local") == 4


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
        (["--queued_batches", "0"], "--queued_batches must be positive"),
        (["--num_env_splits", "0"], "--num_env_splits must be positive"),
        (["--num_env_splits", "3"], "--num_env_splits 3 does not divide --num_envs_per_actor 8"),
        (
            ["--algo", "apex", "--env", "CartPole-v1", "--use_lstm"],
            "--algo apex trains a feed-forward Q-network",
        ),
        (["--algo", "r2d2", "--burn_in", "80"], "--burn_in must be in [0, --seq_len 80)"),
    ],
)
def test_bad_values_raise_one_line(argv, fragment):
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_parser_errors_exit_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--batch_size", "two"], prog="monobeast.py")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value" in err


def test_run_dir_expands_user(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    config = Config(savedir="~/runs", xpid="a").finalize()
    assert config.run_dir == "/home/someone/runs/a"


# --- Config files: defaults < file < flags; the env picks the family's tuned file. ---


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_env_picks_the_family_config():
    atari = parse_args(["--env", "PongNoFrameskip-v4"])
    assert atari.config == os.path.join(CONFIGS_DIR, "impala", "atari.yaml")
    assert (atari.optimizer, atari.learning_rate, atari.total_steps) == (
        "rmsprop",
        6e-4,
        10_000_000,
    )
    assert (atari.batch_size, atari.unroll_length) == (8, 20)
    classic = parse_args(["--env", "CartPole-v1"])
    assert classic.config == os.path.join(CONFIGS_DIR, "impala", "classic.yaml")
    assert (classic.optimizer, classic.learning_rate, classic.discounting) == ("adam", 0.0015, 0.98)
    assert (classic.unroll_length, classic.baseline_cost) == (20, 0.25)


CUSTOM_CARTPOLE = "tests.support.user_envs:CustomCartPole"


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_a_custom_env_starts_from_its_registered_twins_config(algo):
    # CartPole-v1 as a user's class has no family by name; its vector observations and
    # Discrete actions pick the file CartPole-v1's id does: the same run but for --env.
    custom = parse_args(["--algo", algo, "--env", CUSTOM_CARTPOLE, "--xpid", "x"])
    twin = parse_args(["--algo", algo, "--env", "CartPole-v1", "--xpid", "x"])
    assert custom.config == twin.config == os.path.join(CONFIGS_DIR, algo, "classic.yaml")
    assert dataclasses.replace(custom, env="CartPole-v1") == twin


@pytest.mark.parametrize(
    "algo, env, family",
    [
        ("impala", CUSTOM_CARTPOLE, "classic"),
        ("ppo", "tests.support.user_envs:CustomPendulum", "mujoco"),  # Box actions
        ("sac", "tests.support.user_envs:CustomPendulum", "mujoco"),
        ("impala", "tests.support.user_envs:CustomImages", "atari"),
        ("dqn", "tests.support.user_envs:CustomImages", "atari"),
    ],
)
def test_an_env_of_no_family_by_name_gets_the_file_its_spaces_suggest(algo, env, family):
    config = parse_args(["--algo", algo, "--env", env])
    assert config.config == os.path.join(CONFIGS_DIR, algo, f"{family}.yaml")


def test_spaces_without_a_tuned_file_get_the_algorithms_built_in_defaults():
    # IMPALA has no mujoco.yaml for Box actions; the Dict of an image and a vector of
    # DictGridTarget-v0 fits no family's model.
    for algo, env in (
        ("impala", "tests.support.user_envs:CustomPendulum"),
        ("impala", "DictGridTarget-v0"),
        ("ppo", "DictGridTarget-v0"),
    ):
        config = parse_args(["--algo", algo, "--env", env])
        assert config.config is None
        assert config.learning_rate == config_for(algo).learning_rate  # the field default


def test_an_unknown_env_is_one_env_error_when_its_spaces_are_read():
    with pytest.raises(EnvError, match="unknown environment 'NoSuchEnv-v0'"):
        parse_args(["--env", "NoSuchEnv-v0"])
    # A --config (or --family) needs no spaces: the env is first made at start-up.
    assert parse_args(["--env", "NoSuchEnv-v0", "--config", "none"]).config is None


def test_family_and_config_override_the_choice(tmp_path):
    forced = parse_args(["--algo", "ppo", "--env", CUSTOM_CARTPOLE, "--family", "mujoco"])
    assert forced.config == os.path.join(CONFIGS_DIR, "ppo", "mujoco.yaml")
    assert forced.family == "mujoco" and forced.normalize_obs  # mujoco.yaml's
    assert parse_args(["--env", CUSTOM_CARTPOLE, "--config", "none"]).config is None
    path = write(tmp_path, "learning_rate: 0.01\n")
    assert parse_args(["--env", CUSTOM_CARTPOLE, "--config", path]).learning_rate == 0.01


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--family", "mujoco"],
            "--family mujoco: there is no configs/impala/mujoco.yaml; --algo impala has"
            " atari, classic (or give --config FILE)",
        ),
        (
            ["--family", "classic", "--config", "none"],
            "--config none and --family classic both choose the file to start from; give one",
        ),
    ],
)
def test_bad_family_choices_are_one_line(argv, message):
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "argv, env, line",
    [
        (
            [],
            CUSTOM_CARTPOLE,
            "defaults: configs/impala/classic.yaml (vector observations, Discrete actions)",
        ),
        (
            ["--algo", "sac"],
            "tests.support.user_envs:CustomPendulum",
            "defaults: configs/sac/mujoco.yaml (vector observations, Box actions)",
        ),
        (
            [],
            "tests.support.user_envs:CustomPendulum",
            "defaults: --algo impala's built-in (vector observations, Box actions; no"
            " configs/impala/mujoco.yaml)",
        ),
        (
            [],
            "DictGridTarget-v0",
            "defaults: --algo impala's built-in (observations (obs.image (1, 16, 16) uint8,"
            " obs.position (2,) float32), Discrete actions: no tuned family)",
        ),
        (
            [],
            "CartPole-v1",
            "defaults: configs/impala/classic.yaml (CartPole-v1 is classic control)",
        ),
        (
            ["--algo", "ppo", "--family", "mujoco"],
            CUSTOM_CARTPOLE,
            "defaults: configs/ppo/mujoco.yaml (--family mujoco)",
        ),
        (
            ["--config", "none"],
            CUSTOM_CARTPOLE,
            "defaults: --algo impala's built-in (--config none)",
        ),
        (
            ["--config", "configs/ppo/classic.yaml"],
            CUSTOM_CARTPOLE,
            "defaults: configs/ppo/classic.yaml (--config)",
        ),
    ],
)
def test_the_start_up_line_names_the_defaults_and_why(argv, env, line):
    config = parse_args([*argv, "--env", env])
    assert describe_defaults(config, probe_spec(env)) == line


def test_a_config_file_outside_the_checkout_is_named_as_given(tmp_path):
    path = write(tmp_path, "learning_rate: 0.01\n")
    config = parse_args(["--env", "CartPole-v1", "--config", path])
    assert describe_defaults(config, probe_spec("CartPole-v1")) == f"defaults: {path} (--config)"


def test_precedence_defaults_then_file_then_flags(tmp_path):
    path = write(tmp_path, "learning_rate: 0.01\nbatch_size: 4\nuse_lstm: true\n")
    config = parse_args(["--config", path, "--env", "CartPole-v1", "--batch_size", "2"])
    assert config.config == path
    assert config.learning_rate == 0.01  # file over default (and over the family file)
    assert config.batch_size == 2  # flag over file
    assert config.use_lstm is True
    assert config.optimizer == Config.optimizer  # classic.yaml is not read under --config
    assert parse_args(["--config", path, "--no-use_lstm"]).use_lstm is False


def test_config_none_uses_the_field_defaults():
    config = parse_args(["--env", "CartPole-v1", "--config", "none"])
    assert config.config is None and config.optimizer == Config.optimizer


def test_relative_config_path_resolves_inside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = parse_args(["--config", "configs/impala/classic.yaml"])
    assert config.config == os.path.join(CONFIGS_DIR, "impala", "classic.yaml")
    assert config.optimizer == "adam"


def test_yaml_floats_without_a_dot_and_ints_for_floats(tmp_path):
    # YAML 1.1 reads 6e-4 as a string; an int for a float field is a float.
    values = load_config_file(write(tmp_path, "learning_rate: 6e-4\ngrad_norm_clipping: 40\n"))
    assert values == {"learning_rate": 6e-4, "grad_norm_clipping": 40.0}
    assert isinstance(values["grad_norm_clipping"], float)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("lerning_rate: 0.1\n", "unknown key 'lerning_rate' (did you mean 'learning_rate'?)"),
        ("config: other.yaml\n", "unknown key 'config'"),
        ("num_actors: two\n", "key 'num_actors' must be an integer or auto, got 'two' (str)"),
        ("num_actors: 2.5\n", "key 'num_actors' must be an integer or auto"),
        ("num_envs_per_actor: true\n", "key 'num_envs_per_actor' must be an integer or auto"),
        ("unroll_length: auto\n", "key 'unroll_length' must be an integer"),
        ("use_lstm: 1\n", "key 'use_lstm' must be true or false"),
        ("batch_size: true\n", "key 'batch_size' must be an integer"),
        ("learning_rate: fast\n", "key 'learning_rate' must be a number"),
        ("optimizer: sgd\n", "key 'optimizer' must be one of rmsprop, adam, got 'sgd'"),
        ("env: null\n", "key 'env' must be a string"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_config_files_name_the_key_and_file(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", path])
    message = str(info.value)
    assert fragment in message and path in message
    assert "\n" not in message


def test_missing_config_file():
    with pytest.raises(ConfigError, match="cannot read config file /no/such.yaml"):
        parse_args(["--config", "/no/such.yaml"])


def test_cross_field_error_from_a_file_names_the_file(tmp_path):
    path = write(tmp_path, "num_actors: 0\n")
    with pytest.raises(ConfigError, match=r"--num_actors must be positive, got 0 \(set in "):
        parse_args(["--config", path])
    # The same mistake made by a flag does not blame the file.
    with pytest.raises(ConfigError) as info:
        parse_args(["--config", path, "--num_actors", "-1"])
    assert "set in" not in str(info.value)


def test_print_config_prints_the_merged_yaml_and_exits_0(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--env", "CartPole-v1", "--seed", "7", "--print_config"])
    assert info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["seed"] == 7 and printed["optimizer"] == "adam"
    assert printed["xpid"] is None  # not finalized: reusable as a config file
    # The printed YAML (less the file pointers) reads back to the same config.
    del printed["config"], printed["family"]
    path = write(tmp_path, yaml.safe_dump(printed))
    again = parse_args(["--config", path, "--xpid", "x"])
    assert again.seed == 7 and again.learning_rate == 0.0015 and again.discounting == 0.98


def test_shipped_configs_load_and_validate():
    checked = []
    for algo in os.listdir(CONFIGS_DIR):
        folder = os.path.join(CONFIGS_DIR, algo)
        if algo == "sweeps" or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            values = load_config_file(os.path.join(folder, name), config_for(algo))
            config_for(algo)(**values).validate()  # raises ConfigError on a bad file
            checked.append(algo)
    # Every algorithm ships its tuned configs, and each file was checked.
    assert set(checked) == set(ALGORITHMS)
    assert len(checked) == sum(
        len(os.listdir(os.path.join(CONFIGS_DIR, algo))) for algo in ALGORITHMS
    )


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_each_algorithm_has_its_flags_and_defaults(algo):
    config = parse_args(["--algo", algo, "--env", "CartPole-v1"])
    assert config.algo == algo
    assert config.config.endswith(os.path.join("configs", algo, "classic.yaml"))
    names = {f.name for f in dataclasses.fields(config)}
    assert set(config_for(algo).algorithm_fields) <= names
    assert {f.name for f in dataclasses.fields(Config)} <= names


def test_a_flag_of_another_algorithm_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--algo", "impala", "--replay_ratio", "1"], prog="monobeast.py")
    assert info.value.code == 2
    expected = "monobeast.py: error: --replay_ratio is a flag of --algo laser, not of impala\n"
    assert capsys.readouterr().err == expected
    path = tmp_path / "c.yaml"
    path.write_text("replay_ratio: 1.0\n")
    expected = "'replay_ratio' is a flag of --algo laser, not of impala"
    with pytest.raises(ConfigError, match=expected):
        parse_args(["--config", str(path)])


def owners_of_flags() -> dict[str, list[str]]:
    """Every algorithm-specific flag -> the algorithms that have it, read from their Args."""
    owners: dict[str, list[str]] = {}
    for algo in ALGORITHMS:
        for f in dataclasses.fields(algorithm_class(algo).Args):
            owners.setdefault(f.name, []).append(algo)
    return owners


MISPLACED = [
    (name, algo, owners)
    for name, owners in owners_of_flags().items()
    for algo in ALGORITHMS
    if algo not in owners
]


@pytest.mark.parametrize("name, algo, owners", MISPLACED, ids=[f"{n}-{a}" for n, a, _ in MISPLACED])
def test_every_algorithm_flag_given_to_another_algorithm_names_its_owners(
    name, algo, owners, capsys
):
    field = next(f for f in dataclasses.fields(config_for(owners[0])) if f.name == name)
    # A boolean flag takes no value (its --no- form too); others any value at all.
    forms = [[f"--{name}"], [f"--no-{name}"]] if field.type == "bool" else [[f"--{name}", "1"]]
    names = ", ".join(owners[:-1]) + " and " + owners[-1] if len(owners) > 1 else owners[0]
    for flag_args in forms:
        with pytest.raises(SystemExit) as info:
            parse_args(["--algo", algo, "--env", "CartPole-v1", *flag_args], prog="monobeast.py")
        assert info.value.code == 2
        assert capsys.readouterr().err == (
            f"monobeast.py: error: --{name} is a flag of --algo {names}, not of {algo}\n"
        )


def test_an_unknown_flag_is_still_argparses_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--env", "CartPole-v1", "--lerning_rate", "1"], prog="monobeast.py")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "monobeast.py: error: unrecognized arguments: --lerning_rate 1\n"


def test_a_config_file_picks_its_algorithm(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: r2d2\nseq_len: 10\nburn_in: 2\nseq_overlap: 5\n")
    config = parse_args(["--config", str(path)])
    assert (config.algo, config.seq_len, config.burn_in) == ("r2d2", 10, 2)


def test_help_groups_the_algorithms_flags_under_it():
    text = build_parser("monobeast.py", config_for("r2d2")).format_help()
    options = text.partition("\noptions:\n")[2]  # after the usage line, which lists all
    core, _, group = options.partition("\n--algo r2d2:\n")
    assert "--seq_len" in group and "--seq_len" not in core
    assert "--learning_rate" in core and "--entropy_cost" not in text
    assert "`--algo NAME --help` lists NAME's" in " ".join(text.split())


def test_config_to_yaml_round_trips():
    config = parse_args(["--env", "CartPole-v1", "--xpid", "r"])
    assert yaml.safe_load(config_to_yaml(config)) == config.to_dict()


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_help_lists_every_flag(algo):
    # argparse %-formats help texts: one with a literal "%" used to crash --help.
    text = build_parser("monobeast.py", config_for(algo)).format_help()
    for f in dataclasses.fields(config_for(algo)):
        assert f"--{f.name}" in text


@pytest.mark.parametrize(
    "flags, serial",
    [
        ([], True),  # the SAC configs' own setting: one actor, one env, local acting
        (["--policy", "central"], False),
        (["--num_envs_per_actor", "4"], False),
        (["--num_actors", "2"], False),
        (["--no-serial"], False),
        (["--serial", "--num_envs_per_actor", "4"], True),  # asked for: it decides
    ],
)
def test_a_config_files_serial_gives_way_to_flags_that_need_actor_processes(flags, serial):
    """configs/sac/*.yaml set `serial: true` for one actor with one env (taking turns is
    faster there); flags asking for more actors or envs or for central inference turn it
    off, as --no-serial does, and polybeast never takes it."""
    from beast.poly.config import parse_poly_args

    for env in ("Pendulum-v1", "HalfCheetah-v5"):
        assert parse_args(["--algo", "sac", "--env", env, *flags]).serial is serial
    assert not parse_poly_args(["--algo", "sac", "--env", "Pendulum-v1"]).serial
    # An algorithm whose file does not set it stays parallel.
    assert not parse_args(["--algo", "td3", "--env", "Pendulum-v1"]).serial
