"""The Python API (beast/api.py, beast/util/references.py): `beast.train` and `beast.evaluate`
in this process and in scripts, envs and models given as objects, and the one-line
refusals of objects that actor processes cannot import."""

import collections
import csv
import dataclasses
import functools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid

import pytest
import yaml

import beast
from beast.api import _train_config
from beast.config import Config, ConfigError
from beast.run.parsing import config_from_flags, parse_args
from tests.support.api_objects import Holder, make_cartpole
from tests.support.runs import ROOT, read_csv, shm_entries, wait_until_gone
from tests.support.user_models import TinyActorCritic

# A short CartPole run: one actor with 2 envs, 2 rollouts of 10 steps per update.
SMALL = dict(num_actors=1, num_envs_per_actor=2, unroll_length=10, batch_size=2, num_threads=1)


def episode_returns(run_dir) -> list[float]:
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        return [float(row["return"]) for row in csv.DictReader(f)]


def run_script(path, *args, timeout=180, marker=None, cwd=None):
    """`python path args` as a user runs a script, with this checkout importable, from the
    script's directory unless `cwd` says otherwise."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        PYTHONUNBUFFERED="1",
        BEAST_TEST_MARKER=marker or uuid.uuid4().hex,
    )
    return subprocess.run(
        [sys.executable, str(path), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or os.path.dirname(str(path)),
    )


def last_json_line(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "flags, argv",
    [
        ({"env": "CartPole-v1"}, ["--env", "CartPole-v1"]),
        ({"env": "CartPole-v1", "algo": "ppo"}, ["--env", "CartPole-v1", "--algo", "ppo"]),
        (
            {"env": "PongNoFrameskip-v4", "total_steps": 1000, "compile": False},
            ["--env", "PongNoFrameskip-v4", "--total_steps", "1000", "--compile", "off"],
        ),
        (
            {"config": "configs/r2d2/atari.yaml", "env": "BreakoutNoFrameskip-v4"},
            ["--config", "configs/r2d2/atari.yaml", "--env", "BreakoutNoFrameskip-v4"],
        ),
        ({"env": "CartPole-v1", "config": "none"}, ["--env", "CartPole-v1", "--config", "none"]),
        # An env of no family by name: its spaces pick the file, or `family` does.
        (
            {"env": "tests.support.api_objects:make_cartpole"},
            ["--env", "tests.support.api_objects:make_cartpole"],
        ),
        (
            {"env": "tests.support.api_objects:make_cartpole", "algo": "ppo", "family": "mujoco"},
            [
                "--env",
                "tests.support.api_objects:make_cartpole",
                "--algo",
                "ppo",
                "--family",
                "mujoco",
            ],
        ),
        (
            {"env": "CartPole-v1", "num_actors": "auto", "learning_rate": 1},
            ["--env", "CartPole-v1", "--num_actors", "auto", "--learning_rate", "1"],
        ),
    ],
)
def test_keyword_arguments_make_the_config_the_command_line_makes(flags, argv):
    # The same defaults, tuned family file (chosen by env and algo) and validation.
    assert config_from_flags({**flags, "xpid": "x"}) == parse_args([*argv, "--xpid", "x"])


def test_a_config_given_whole_reads_no_file_whatever_family_picked_its_values():
    # train(result.config) of a run made with --family: its values, no second file.
    made = parse_args(["--algo", "ppo", "--env", "CartPole-v1", "--family", "mujoco"])
    again = _train_config(made, Config, {})
    assert again == dataclasses.replace(made, config=None, family="auto")


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: beast.train(env="CartPole-v1", totl_steps=10),
            "beast.train(): unknown argument 'totl_steps' (did you mean 'total_steps'?)",
        ),
        (
            lambda: beast.train(env="CartPole-v1", total_steps="10"),
            "beast.train(): argument 'total_steps' must be an integer, got '10' (str)",
        ),
        (
            lambda: beast.train(env="CartPole-v1", num_atoms=11),
            "beast.train(): 'num_atoms' is a flag of --algo c51 and rainbow, not of impala",
        ),
        (lambda: beast.train(env="CartPole-v1", batch_size=0), "--batch_size must be positive"),
        (
            lambda: beast.train(env="CartPole-v1", family="box2d"),
            "beast.train(): argument 'family' must be one of auto, atari, classic, mujoco,"
            " got 'box2d'",
        ),
        (lambda: beast.train(env="CartPole-v1", mode="test"), "beast.train() trains;"),
        (lambda: beast.train(42), "beast.train(): config must be a Config"),
        (lambda: beast.evaluate(), "beast.evaluate(): which run?"),
        (
            lambda: beast.evaluate("/tmp/x", xpid="y"),
            "beast.evaluate(): give the run as a directory, or as xpid=",
        ),
        (
            lambda: beast.evaluate(xpid="no-such-run", savedir="/nonexistent", episodes=2),
            "no checkpoint at /nonexistent/no-such-run/model.tar",
        ),
        (
            lambda: beast.evaluate("/nonexistent/run", num_test_episode=2),
            "beast.evaluate(): unknown argument 'num_test_episode' (did you mean"
            " 'num_test_episodes'?)",
        ),
    ],
)
def test_bad_arguments_raise_one_line_config_errors_naming_them(call, message):
    with pytest.raises(ConfigError) as raised:
        call()
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def _closure_env():
    def make():
        return make_cartpole()

    return make


class _LocalClassMaker:
    @staticmethod
    def make():
        class Local:
            pass

        return Local


@pytest.mark.parametrize(
    "argument, obj, message",
    [
        ("env", lambda: make_cartpole(), "env: a lambda (<lambda> in test_api) cannot be sent"),
        ("env", _closure_env(), "env: _closure_env.<locals>.make (in test_api) is defined inside"),
        ("model", _LocalClassMaker.make(), "model: _LocalClassMaker.make.<locals>.Local"),
        ("env", functools.partial(make_cartpole), "env=a partial object is not a function"),
        ("model", TinyActorCritic((4,), 2), "model=a TinyActorCritic object is not a function"),
        (
            "env",
            # A copy of make_cartpole under its name in another module: not found again.
            types.FunctionType(make_cartpole.__code__, {"__name__": "tests.support.api_objects"}),
            "env: make_cartpole is not found again as tests.support.api_objects:make_cartpole",
        ),
    ],
)
def test_objects_that_actors_cannot_import_are_refused_in_one_line(
    tmp_path, argument, obj, message
):
    with pytest.raises(ConfigError) as raised:
        beast.train(**{argument: obj}, savedir=tmp_path, xpid="refused")
    text = str(raised.value)
    assert message in text
    assert "define it at module level in an importable module" in text
    assert "\n" not in text
    assert not (tmp_path / "refused").exists()  # refused before anything started


def test_objects_become_import_paths_a_fresh_process_resolves():
    from beast.util.references import import_module, reference

    assert reference(make_cartpole, "env") == "tests.support.api_objects:make_cartpole"
    assert reference(Holder.Nested, "env") == "tests.support.api_objects:Holder.Nested"
    assert reference(TinyActorCritic, "model") == "tests.support.user_models:TinyActorCritic"
    code = (
        "from beast.util.references import import_module;"
        "print(import_module('tests.support.api_objects').Holder.Nested.__qualname__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=60,
    )
    assert out.stdout.strip() == "Holder.Nested", out.stderr
    assert import_module("json") is json


def test_train_then_evaluate_in_this_process(tmp_path):
    result = beast.train(env="CartPole-v1", total_steps=2000, savedir=tmp_path, xpid="acc", **SMALL)
    run_dir = str(tmp_path / "acc")
    assert result.run_dir == run_dir and result.xpid == "acc"
    assert result.finished and result.step >= 2000
    assert result.num_updates == len(read_csv(tmp_path / "acc" / "logs.csv"))
    returns = episode_returns(run_dir)
    assert result.episodes == len(returns) > 0
    assert result.mean_return == pytest.approx(statistics.fmean(returns[-100:]))
    assert result.seconds > 0
    # The tuned classic-control file was read, as `monobeast.py --env CartPole-v1` reads it.
    assert result.config.learning_rate == 0.0015 and result.config.config.endswith("classic.yaml")

    evaluation = beast.evaluate(result, episodes=3, seed=1)
    assert evaluation.run_dir == run_dir and evaluation.step == result.step
    assert len(evaluation.returns) == len(evaluation.lengths) == 3
    # CartPole pays 1 per step: a return is its episode's length.
    assert evaluation.returns == [float(n) for n in evaluation.lengths]
    assert evaluation.mean_return == statistics.fmean(evaluation.returns)
    assert evaluation.median_return == statistics.median(evaluation.returns)
    saved = json.loads((tmp_path / "acc" / "test.json").read_text())
    assert saved["returns"] == evaluation.returns
    # The same run found by xpid and savedir, with the same seed: the same episodes.
    again = beast.evaluate(xpid="acc", savedir=tmp_path, episodes=3, seed=1)
    assert again.returns == evaluation.returns


def train_objects(tmp_path, xpid, total_steps, **flags):
    """A short run of the env factory and the model class of tests/support/api_objects.py and
    tests/support/user_models.py."""
    return beast.train(
        env=make_cartpole,
        model=TinyActorCritic,
        total_steps=total_steps,
        savedir=tmp_path,
        xpid=xpid,
        **{**SMALL, **flags},
    )


def test_env_callable_and_model_class_train_evaluate_and_resume(tmp_path):
    result = train_objects(tmp_path, "objects", 3000)
    assert result.finished and result.step >= 3000 and result.episodes > 0
    # Recorded as readable import paths that --mode test and a resume read back.
    recorded = yaml.safe_load((tmp_path / "objects" / "config.yaml").read_text())
    assert recorded["env"] == "tests.support.api_objects:make_cartpole"
    assert recorded["model"] == "tests.support.user_models:TinyActorCritic"
    meta = json.loads((tmp_path / "objects" / "meta.json").read_text())
    assert meta["config"]["env"] == "tests.support.api_objects:make_cartpole"

    evaluation = beast.evaluate(result.run_dir, episodes=2)
    assert len(evaluation.returns) == 2 and all(r >= 8 for r in evaluation.returns)

    # The same objects resume the run; its config given back with a new total goes on.
    resumed = beast.train(result.config, total_steps=5000)
    assert resumed.run_dir == result.run_dir and resumed.step >= 5000
    assert resumed.num_updates > result.num_updates
    # Another env does not fit the checkpoint: refused in one line, as on the command line.
    with pytest.raises(
        ConfigError, match=r"cannot resume .*--env 'tests.support.api_objects:make_cart"
    ):
        beast.train(env=Holder.Nested, savedir=tmp_path, xpid="objects", **SMALL)


@pytest.mark.parametrize("mode", [{"serial": True}, {"policy": "central"}])
def test_env_and_model_objects_reach_serial_runs_and_central_inference(tmp_path, mode):
    result = train_objects(tmp_path, "mode", 1000, **mode)
    assert result.finished and result.num_updates > 0
    assert result.config.env == "tests.support.api_objects:make_cartpole"


def test_evaluate_takes_the_saved_runs_algorithm_flags(tmp_path):
    # --test_epsilon is DQN's: accepted because the run's config.yaml says --algo dqn (the
    # run has no checkpoint, so the error that follows is about that, not the flag).
    run_dir = tmp_path / "dqn-run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("algo: dqn\nenv: CartPole-v1\n")
    with pytest.raises(ConfigError, match="no checkpoint at"):
        beast.evaluate(run_dir, episodes=2, test_epsilon=0.0)
    owners = "r2d2, apex, dqn, c51 and rainbow"
    with pytest.raises(
        ConfigError, match=f"'test_epsilon' is a flag of --algo {owners}, not of impala"
    ):
        beast.evaluate(xpid="elsewhere", savedir=tmp_path, test_epsilon=0.0)


def test_train_from_another_thread_keeps_the_signal_handlers(tmp_path):
    # Ray Tune runs a trial's function in a thread: no signal handler can be set there.
    results, errors = [], []
    handler = signal.getsignal(signal.SIGINT)

    def trial():
        try:
            results.append(
                beast.train(
                    env="CartPole-v1", total_steps=1000, savedir=tmp_path, xpid="t", **SMALL
                )
            )
        except Exception as error:  # reported below, with the test's failure
            errors.append(error)

    thread = threading.Thread(target=trial)
    thread.start()
    thread.join(120)
    assert not errors, errors
    assert results[0].finished
    assert signal.getsignal(signal.SIGINT) is handler


def test_an_actor_importing_the_script_cannot_start_a_run(monkeypatch, tmp_path):
    # What forkserver's preparation of an actor looks like from inside the script it
    # runs again: a second run there would write over the real one's files.
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(ConfigError, match="while an actor process imported the script"):
        beast.train(env="CartPole-v1", savedir=tmp_path, xpid="nested")
    assert not (tmp_path / "nested").exists()


ACCEPTANCE_SCRIPT = """
import json
import sys

import beast

if __name__ == "__main__":
    result = beast.train(env="CartPole-v1", total_steps=2000, savedir=sys.argv[1], xpid="accept",
                         num_actors=1)
    evaluation = beast.evaluate(result.run_dir, episodes=3)
    print(json.dumps({"run_dir": result.run_dir, "step": result.step,
                      "returns": evaluation.returns}))
"""


def test_the_issue_acceptance_script(tmp_path):
    script = tmp_path / "accept.py"
    script.write_text(ACCEPTANCE_SCRIPT)
    marker = uuid.uuid4().hex
    out = run_script(script, tmp_path / "runs", marker=marker)
    assert out.returncode == 0, out.stderr[-3000:]
    assert wait_until_gone(marker) == []  # no actor or forkserver left behind
    reported = last_json_line(out.stdout)
    assert reported["run_dir"] == str(tmp_path / "runs" / "accept") and reported["step"] >= 2000
    assert len(reported["returns"]) == 3
    assert (tmp_path / "runs" / "accept" / "model.tar").is_file()


MAIN_SCRIPT = """
import json
import sys

import gymnasium
import torch
from torch import nn

import beast

print(f"script executed as {__name__}", file=sys.stderr, flush=True)


def make_env():
    return gymnasium.make("CartPole-v1")


class Net(nn.Module):
    def __init__(self, obs_shape, num_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_shape[0], 32), nn.Tanh())
        self.policy = nn.Linear(32, num_actions)
        self.value = nn.Linear(32, 1)

    def initial_state(self, batch_size):
        return ()

    def forward(self, inputs, core_state=()):
        T, B = inputs["obs"].shape[:2]
        x = self.body(inputs["obs"].flatten(0, 1).float())
        return {"policy_logits": self.policy(x).view(T, B, -1),
                "baseline": self.value(x).view(T, B)}, ()


if __name__ == "__main__":
    result = beast.train(env=make_env, model=Net, total_steps=2000, savedir=sys.argv[1],
                         xpid="main", num_actors=2, num_envs_per_actor=2, unroll_length=10,
                         batch_size=2, polybeast=sys.argv[2] == "polybeast")
    evaluation = beast.evaluate(result, episodes=2)
    print(json.dumps({"env": result.config.env, "model": result.config.model,
                      "returns": evaluation.returns}))
"""


def test_a_script_passes_its_own_functions_and_classes(tmp_path):
    script = tmp_path / "train_cartpole.py"
    script.write_text(MAIN_SCRIPT)
    out = run_script(script, tmp_path / "runs", "monobeast")
    assert out.returncode == 0, out.stderr[-3000:]
    reported = last_json_line(out.stdout)
    # Recorded under the script's module name, which any process can import.
    assert reported["env"] == "train_cartpole:make_env"
    assert reported["model"] == "train_cartpole:Net"
    assert len(reported["returns"]) == 2
    # Once as the script, once per actor by forkserver; never a second time by its name
    # (the running script is what `train_cartpole` resolves to, here and in actors). The
    # actors' lines may interleave, one running into the next ("... __mp_main__script
    # executed as ..."): counted, not split into lines, the known names matched first.
    names = r"script executed as (__main__|__mp_main__|\w+)"
    executions = collections.Counter(re.findall(names, out.stderr))
    assert executions == {"__main__": 1, "__mp_main__": 2}, out.stderr[-3000:]

    # The recorded paths rebuild the env and model in another program, given the path.
    tested = subprocess.run(
        [sys.executable, os.path.join(ROOT, "monobeast.py"), "--mode", "test"]
        + ["--savedir", str(tmp_path / "runs"), "--xpid", "main", "--num_test_episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)])),
        cwd=ROOT,
    )
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "on train_cartpole:make_env for 2 episodes" in tested.stdout


def test_a_script_passes_its_own_functions_and_classes_to_polybeast(tmp_path):
    # Ray's env servers import the script by its module name: Ray puts the script's
    # directory on their sys.path (the run starts elsewhere, in tmp_path's parent).
    script = tmp_path / "train_cartpole.py"
    script.write_text(MAIN_SCRIPT)
    marker = uuid.uuid4().hex
    out = run_script(script, tmp_path / "runs", "polybeast", cwd=tmp_path.parent, marker=marker)
    assert out.returncode == 0, out.stderr[-3000:]
    assert wait_until_gone(marker, timeout=15) == []  # no Ray process left behind
    reported = last_json_line(out.stdout)
    assert reported["env"] == "train_cartpole:make_env"
    assert reported["model"] == "train_cartpole:Net"
    assert len(reported["returns"]) == 2


def test_a_script_that_starts_training_unguarded_is_refused_in_one_line(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import beast\n\nbeast.train(env='CartPole-v1', total_steps=1000,"
        f" savedir={str(tmp_path)!r}, xpid='x')\n"
    )
    out = run_script(script)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.endswith(
        f'{script}:3 starts beast.train() outside `if __name__ == "__main__":`; actor'
        " processes import this script when they start, so put the training code under that"
        " guard"
    ), out.stderr[-2000:]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "how, where",
    [
        ("-c", "an interactive session or of a script that cannot be imported by its file name"),
        ("-", "a script read from standard input (`python -`)"),
    ],
    ids=["python -c", "python -"],
)
def test_objects_of_an_interactive_session_are_refused_in_one_line(tmp_path, how, where):
    # A notebook cell's function, or one of a script piped to `python -`, lives in a
    # __main__ that no other process can import.
    code = textwrap.dedent(
        """
        import beast
        def make_env():
            pass
        try:
            beast.train(env=make_env)
        except beast.ConfigError as error:
            print(error)
        """
    )
    out = subprocess.run(
        [sys.executable, how, *([code] if how == "-c" else [])],
        input=code if how == "-" else None,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=str(tmp_path),
    )
    assert out.stdout.strip() == (
        f"env: make_env is defined in __main__ of {where}, so actor processes cannot import"
        " it; define it at module level in an importable module (a .py file on sys.path) and"
        " pass it from there"
    ), out.stderr[-2000:]


def test_a_script_from_standard_input_trains(tmp_path):
    """`python - <<EOF` (shell scripts, CI steps): the actors, which fork from the fork
    server, must not try to run the script's '<stdin>' path as their main module."""
    code = textwrap.dedent(
        f"""
        import beast
        result = beast.train(
            env="CartPole-v1", total_steps=2000, savedir={str(tmp_path)!r}, xpid="stdin",
            num_actors=2, num_envs_per_actor=2, unroll_length=10, batch_size=2, num_threads=1,
        )
        print(result.step)
        """
    )
    marker = uuid.uuid4().hex
    out = subprocess.run(
        [sys.executable, "-"],
        input=code,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT, BEAST_TEST_MARKER=marker),
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 2000
    assert "Traceback" not in out.stderr and "replacement" not in out.stdout, out.stdout
    assert wait_until_gone(marker) == []


INTERRUPTED_SCRIPT = """
import json
import sys

import beast

if __name__ == "__main__":
    result = beast.train(env="CartPole-v1", total_steps=100_000_000, savedir=sys.argv[1],
                         xpid="stopped", num_actors=2, log_interval=0.5)
    print(json.dumps({"finished": result.finished, "step": result.step}))
"""


def test_an_interrupt_stops_the_run_cleanly_and_train_returns(tmp_path):
    # A notebook's interrupt is SIGINT to the kernel process alone (not to a group).
    script = tmp_path / "stopped.py"
    script.write_text(INTERRUPTED_SCRIPT)
    marker = uuid.uuid4().hex
    before = shm_entries()
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", BEAST_TEST_MARKER=marker)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        log = tmp_path / "stopped" / "logs.csv"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (log.exists() and len(read_csv(log)) > 2):
            time.sleep(0.2)
        assert log.exists(), "training never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    reported = last_json_line(out)
    assert reported["finished"] is False and 0 < reported["step"] < 100_000_000
    assert (tmp_path / "stopped" / "model.tar").is_file()
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()


TUNE_SCRIPT = """
import sys

from ray import tune

import beast

SAVEDIR = sys.argv[1]  # read here: a trial's own sys.argv is its Ray worker's


def trial(params):
    result = beast.train(env="CartPole-v1", total_steps=3000, learning_rate=params["lr"],
                         savedir=SAVEDIR, xpid=f"lr{params['lr']}", num_actors=1)
    return {"mean_return": result.mean_return, "finished": result.finished}


if __name__ == "__main__":
    space = {"lr": tune.grid_search([0.001, 0.003])}
    results = tune.Tuner(trial, param_space=space,
                         tune_config=tune.TuneConfig(max_concurrent_trials=1)).fit()
    print(sorted(r.metrics["finished"] for r in results), results.errors)
"""


@pytest.mark.slow
def test_ray_tune_trials_train(tmp_path):
    # Tune runs a trial function in a thread of a Ray actor (no signal handlers there).
    pytest.importorskip("ray.tune", exc_type=ImportError)  # pip install "ray[tune]"
    script = tmp_path / "tune_beast.py"
    script.write_text(TUNE_SCRIPT)
    out = run_script(script, tmp_path / "runs", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # Ray forwards its workers' output to stdout too, and may do so after the script's line.
    assert "[True, True] []" in out.stdout.splitlines(), out.stdout[-3000:]
    assert (tmp_path / "runs" / "lr0.003" / "model.tar").is_file()


def test_a_model_class_learns_cartpole(tmp_path):
    # IMPALA's classic-control settings with the user's network: 150k steps took 15-18 s on
    # 2 busy cores; the mean of the last 100 episodes reached 313, 214, 173, 179 (seeds 0-3).
    result = beast.train(
        env=make_cartpole,
        model=TinyActorCritic,
        config="configs/impala/classic.yaml",
        total_steps=150_000,
        savedir=tmp_path,
        xpid="learn",
        log_interval=5,
    )
    assert result.finished
    # A uniformly random policy scores about 22.
    assert result.mean_return >= 100, result
    assert math.isfinite(result.mean_return)
