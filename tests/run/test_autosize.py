"""--num_actors auto / --num_envs_per_actor auto: parsing, the choice rules on given
costs, and a real measurement and run on CartPole."""

import dataclasses
import os

import pytest
import torch

from beast import envs
from beast.algos.build import build_algorithm
from beast.config import AUTO, ConfigError
from beast.run import autosize
from beast.run.measure import TrivialModel
from beast.run.parsing import parse_args
from tests.support.in_process import run_monobeast
from tests.support.runs import CARTPOLE_SMALL


def auto_config(*flags):
    return parse_args(["--env", "CartPole-v1", *flags])


def test_auto_parses_from_flags_and_files_and_leaves_num_buffers_open(tmp_path):
    config = auto_config("--num_actors", "auto", "--num_envs_per_actor", "auto")
    assert config.num_actors == AUTO and config.num_envs_per_actor == AUTO
    assert config.num_buffers is None  # derived once the layout is measured
    path = tmp_path / "c.yaml"
    path.write_text("num_actors: auto\nnum_envs_per_actor: 4\n")
    config = parse_args(["--env", "CartPole-v1", "--config", str(path)])
    assert config.num_actors == AUTO and config.num_envs_per_actor == 4


def test_a_replay_algorithm_needs_numbers(monkeypatch):
    fake_costs(monkeypatch, {}, learning=0.0, cores=2)
    with pytest.raises(ConfigError, match="give numbers with --algo r2d2"):
        resolve(auto_config("--num_actors", "auto", "--algo", "r2d2"))


def test_parser_rejects_other_words(capsys):
    with pytest.raises(SystemExit) as info:
        auto_config("--num_envs_per_actor", "many")
    assert info.value.code == 2
    assert "expected an integer or auto, got 'many'" in capsys.readouterr().err


def fake_costs(monkeypatch, acting, learning, cores):
    calls = []

    def acting_cost(config, algorithm, model, num_envs, seconds=0.0):
        calls.append(num_envs)
        return acting[num_envs]

    monkeypatch.setattr(autosize, "acting_cost", acting_cost)
    monkeypatch.setattr(autosize, "learning_cost", lambda *args, **kwargs: learning)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    return calls


def resolve(config, device="cpu"):
    spec = envs.EnvSpec(obs_shape=(4,), obs_dtype=torch.float32, num_actions=2)
    lines = []
    algorithm = build_algorithm(config, spec)
    resolved = autosize.resolve_actor_layout(
        config, algorithm, torch.device(device), "central", "fp32", log=lines.append
    )
    return resolved, lines


def test_smallest_k_within_tolerance_and_cpu_share_of_actors(monkeypatch):
    # K=8 is within 5% of K=16, the cheapest; K=4 is not.
    acting = {1: 1.0, 2: 0.6, 4: 0.4, 8: 0.31, 16: 0.30}
    calls = fake_costs(monkeypatch, acting, learning=0.2, cores=8)
    config, lines = resolve(auto_config("--num_actors", "auto", "--num_envs_per_actor", "auto"))
    assert calls == list(autosize.ENV_CANDIDATES)  # K=8's cost is reused for num_actors
    assert config.num_envs_per_actor == 8
    # Actors' share 0.31 / 0.51 of 8 cores = 4.86 -> 5.
    assert config.num_actors == 5
    assert config.num_buffers == 5 * 8 + config.queued_batches * config.batch_size
    assert "auto: 8" in lines[0] and "auto: 5 of 8 cores" in lines[1]


def test_num_actors_only_measures_the_given_k_and_keeps_num_buffers(monkeypatch):
    calls = fake_costs(monkeypatch, {3: 0.1}, learning=10.0, cores=2)
    flags = ("--num_actors", "auto", "--num_envs_per_actor", "3", "--num_buffers", "50")
    config, _ = resolve(auto_config(*flags))
    assert calls == [3] and config.num_actors == 1  # at least one actor
    assert config.num_buffers == 50


def test_gpu_learner_leaves_one_core(monkeypatch):
    fake_costs(monkeypatch, {}, learning=0.0, cores=16)
    given = auto_config("--num_actors", "auto")
    config, lines = resolve(given, device="cuda")
    assert config.num_actors == 15 and config.num_envs_per_actor == given.num_envs_per_actor
    assert "cores less one" in lines[0]


def test_no_auto_is_returned_unchanged(monkeypatch):
    calls = fake_costs(monkeypatch, {}, learning=0.0, cores=2)
    config = auto_config()
    assert resolve(config)[0] is config and calls == []


def test_acting_cost_is_a_real_cpu_time_per_step():
    """Per-step cost falls as K grows for CartPole, where the policy call dominates."""
    config = dataclasses.replace(auto_config(), seed=1)
    spec = envs.EnvSpec(obs_shape=(4,), obs_dtype=torch.float32, num_actions=2)
    algorithm = build_algorithm(config, spec)
    model = TrivialModel(algorithm.model_outputs())
    one, eight = (autosize.acting_cost(config, algorithm, model, k, seconds=0.2) for k in (1, 8))
    # Order, not speed: eight envs share one policy call per step, so an agent step costs
    # less CPU than with one env (here 15-27 us against 39-69 us, 2.3-3.0 times less). A
    # CPU time, so a busy machine changes neither much.
    assert 0 < eight < one


def test_monobeast_logs_the_measured_layout(tmp_path):
    flags = ["--num_actors", "auto", "--num_envs_per_actor", "auto", "--total_steps", "3000"]
    result = run_monobeast([*CARTPOLE_SMALL, *flags, "--savedir", str(tmp_path), "--xpid", "auto"])
    assert result.returncode == 0, result.stderr
    assert "--num_envs_per_actor auto: " in result.stdout
    assert "--num_actors auto: " in result.stdout
    saved = (tmp_path / "auto" / "config.yaml").read_text()
    assert "num_actors: auto" not in saved  # the run records what it measured
