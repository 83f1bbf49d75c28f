"""beast.export and beast.load_policy: a run's policy outside the engine acts as --mode test.

For every algorithm a short run (CartPole-v1; Pendulum-v1 for continuous actions; the Dict
versions for one algorithm of each kind) is played by `--mode test` itself
(`beast.trained.play`, the Q-networks' --test_epsilon set to 0) for 100 steps, recording what
its policy was given and the action it took. The run's policy from `beast.load_policy(run)`,
and from the TorchScript and ONNX (onnxruntime) files `beast.export` wrote, then gets the
same observations, rewards and done flags, carrying its own state (the last action and an
LSTM's state go round trip through the outputs): its actions must equal --mode test's,
exactly for discrete actions and within 1e-5 for continuous ones.

Runs are tiny (400 steps, 2 actors x 2 envs, in this process: tests/support/in_process.py), one per
case and module; seeded noise then spreads their weights until --mode test takes more than
one action in the 100 steps (a 400-step run's Q-network acts alike everywhere). Cases whose
code paths others already take run with `-m slow`.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import beast
from beast import envs
from beast.acting.inference import LocalInference
from beast.algos.policies import CategoricalPolicy
from beast.api import evaluate
from beast.config import ConfigError
from beast.outputs.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    save_best_checkpoint,
    save_checkpoint,
)
from beast.trained.export import main as export_main
from tests.support.in_process import run_main, run_monobeast
from tests.support.matrix import ALGO_FLAGS

STEPS = 100
ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")
SPREAD_TRIES = 10
# --mode test's module.
MODE_TEST = importlib.import_module("beast.trained.play")


@dataclasses.dataclass(frozen=True)
class Case:
    algo: str
    env: str = "CartPole-v1"
    flags: tuple[str, ...] = ()


CASES = {
    "impala_lstm": Case("impala", flags=("--use_lstm",)),
    # A feed-forward network fed the reward and last action: a state, and no done input.
    "impala_last_action_reward": Case("impala", flags=("--use_last_action_reward",)),
    "laser": Case("laser"),
    "ppo": Case("ppo"),
    "ppo_pendulum": Case("ppo", "Pendulum-v1", ("--normalize_obs",)),
    "a2c": Case("a2c"),
    "r2d2": Case("r2d2"),
    "apex": Case("apex"),
    "dqn": Case("dqn"),
    "c51": Case("c51"),
    "rainbow": Case("rainbow"),
    "ddpg": Case("ddpg", "Pendulum-v1"),
    "td3": Case("td3", "Pendulum-v1"),
    "sac": Case("sac", "Pendulum-v1", ("--normalize_obs",)),
    # A Dict observation for one algorithm of each kind: actor-critic, Q-network, squashed.
    "impala_dict": Case("impala", "DictCartPole-v1", ("--use_lstm", "--normalize_obs")),
    "dqn_dict": Case("dqn", "DictCartPole-v1"),
    "sac_dict": Case("sac", "DictPendulum-v1", ("--normalize_obs",)),
    # uint8 frames through AtariNet; the policy docs/export.md's script plays.
    "impala_pong": Case("impala", "PongNoFrameskip-v4"),
}
# Run by default: every acting rule (categorical, Gaussian, epsilon-greedy with Q-values
# and with a distribution, squashed), LSTMs of both kinds, --normalize_obs and Dict
# observations. The others share their acting and network with one of these.
DEFAULT_CASES = {
    "impala_lstm",
    "impala_last_action_reward",
    "ppo_pendulum",
    "r2d2",
    "rainbow",
    "sac_dict",
    "impala_dict",
}
# ONNX exports cost seconds each (torch.export): by default, an LSTM, a distributional
# Q-network and the Dict observations of both action kinds.
DEFAULT_ONNX_CASES = {"impala_lstm", "rainbow", "sac_dict", "impala_dict"}
FORMATS = ("run", "torchscript", "onnx")


def params():
    for name in CASES:
        for form in FORMATS:
            default = DEFAULT_ONNX_CASES if form == "onnx" else DEFAULT_CASES
            marks = () if name in default else (pytest.mark.slow,)
            yield pytest.param(name, form, id=f"{name}-{form}", marks=marks)


def train(savedir: str, name: str) -> str:
    case = CASES[name]
    argv = ["--algo", case.algo, "--env", case.env, "--savedir", savedir, "--xpid", name]
    argv += ["--num_actors", "2", "--num_envs_per_actor", "2", "--unroll_length", "10"]
    argv += ["--batch_size", "4", "--num_threads", "1", "--total_steps", "400"]
    argv += [*ALGO_FLAGS[case.algo], *case.flags]
    result = run_monobeast(argv)
    assert result.returncode == 0, result.stderr[-2000:]
    return os.path.join(savedir, name)


def spread_weights(state_dict: dict[str, torch.Tensor], seed: int) -> None:
    """Add noise of 3 times each weight's own scale to the network's weights and biases,
    so that the action depends on the observation (a 400-step run's Q-network takes one
    greedy action everywhere). Buffers (--normalize_obs's statistics, a schedule's
    epsilon) stay as they are."""
    generator = torch.Generator().manual_seed(seed)
    for key, value in state_dict.items():
        if "weight" in key or "bias" in key:
            scale = max(float(value.std()) if value.numel() > 1 else 0.0, 0.1)
            value.add_(3 * scale * torch.randn(value.shape, generator=generator))


class _Recorded(Exception):
    """Stops --mode test once it has played STEPS steps."""


@dataclasses.dataclass
class Recording:
    """What --mode test's policy was given at each step and the action it took."""

    obs: list[dict[str, np.ndarray]]  # the observation's leaves by field name
    reward: list[float]
    done: list[bool]
    last_action: list[np.ndarray]
    action: list[np.ndarray]  # as the env got it (clipped to a Box's bounds)


def record_mode_test(run_dir: str, case: Case, monkeypatch) -> Recording:
    """Play the run with `beast.trained.play` (--mode test) and record STEPS steps of its
    policy, through a LocalInference that keeps a copy of every call."""
    recording = Recording([], [], [], [], [])

    class RecordingPolicy(LocalInference):
        def act(self, inputs):
            if len(recording.action) == STEPS:
                raise _Recorded
            record = super().act(inputs)
            fields = {key: value[0].numpy().copy() for key, value in inputs.items()}
            recording.reward.append(float(fields.pop("reward")))
            recording.done.append(bool(fields.pop("done")))
            recording.last_action.append(fields.pop("last_action"))
            recording.obs.append(fields)
            recording.action.append(record["action"][0].copy())
            return record

    monkeypatch.setattr(MODE_TEST, "LocalInference", RecordingPolicy)
    q_network = case.algo in ("r2d2", "apex", "dqn", "c51", "rainbow")
    with pytest.raises(_Recorded):
        evaluate(run_dir, episodes=1000, **({"test_epsilon": 0.0} if q_network else {}))
    space = envs.make(case.env).action_space
    if hasattr(space, "low"):  # --mode test clips a Gaussian's draw to the bounds
        recording.action = [np.clip(a, space.low, space.high) for a in recording.action]
    return recording


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (run dir, its --mode test recording), trained and recorded on first use."""
    savedir = str(tmp_path_factory.mktemp("export"))
    built: dict[str, tuple[str, Recording]] = {}

    def get(name: str) -> tuple[str, Recording]:
        if name in built:
            return built[name]
        run_dir = train(savedir, name)
        trained = load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))
        # Spread the weights until --mode test takes more than one action in its STEPS
        # steps (an R2D2 whose last action feeds its LSTM can repeat itself for long) and,
        # on CartPole, ends an episode in them (the state carried through a reset): a
        # 400-step run's weights differ from run to run (its actors are processes).
        for seed in range(SPREAD_TRIES):
            checkpoint = copy.deepcopy(trained)
            spread_weights(checkpoint["model_state_dict"], seed)
            save_checkpoint(run_dir, checkpoint)
            with pytest.MonkeyPatch.context() as monkeypatch:
                recording = record_mode_test(run_dir, CASES[name], monkeypatch)
            varied = len({np.asarray(a).tobytes() for a in recording.action}) > 1
            ends = any(recording.done[1:]) or not CASES[name].env.endswith("CartPole-v1")
            if varied and ends:
                break
        built[name] = run_dir, recording
        return built[name]

    return get


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """(name, format) -> the file `beast.export` wrote for that run, on first use."""
    directory = tmp_path_factory.mktemp("exported")
    paths: dict[tuple[str, str], str] = {}

    def get(name: str, form: str) -> str:
        if form == "onnx":
            for package in ONNX_PACKAGES:
                pytest.importorskip(package, reason="ONNX export needs the export extra")
        if (name, form) not in paths:
            run_dir, _ = runs(name)
            paths[name, form] = beast.export(run_dir, form, output=directory / f"{name}.{form}")
        return paths[name, form]

    return get


def load(runs, exported, name: str, form: str) -> beast.Policy:
    """The policy of run `name`: from the run itself ("run"), or from its export."""
    if form == "run":
        return beast.load_policy(runs(name)[0])
    return beast.load_policy(exported(name, form))


def nested(obs: dict[str, np.ndarray]):
    """An observation as the env returns it: the Box's array, or the Dict of its leaves."""
    if list(obs) == ["obs"]:
        return obs["obs"]
    return {key.removeprefix("obs."): value for key, value in obs.items()}


def assert_actions_equal(actual, expected, discrete: bool) -> None:
    if discrete:
        np.testing.assert_array_equal(actual, expected)
    else:
        # float32 arithmetic in other kernels (torch's tanh vs numpy's, onnxruntime's
        # matmuls): a few ulps of actions of order 1.
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name, form", params())
def test_policy_acts_as_mode_test(runs, exported, name, form):
    _, recording = runs(name)
    policy = load(runs, exported, name, form)
    discrete = policy.signature.num_actions > 0
    # Not a constant policy; CartPole's episodes end within the steps (done, and the state
    # carried through the reset), Pendulum's last 200 and Pong's longer.
    assert len({np.asarray(a).tobytes() for a in recording.action}) > 1
    assert any(recording.done[1:]) == CASES[name].env.endswith("CartPole-v1")
    state, states = None, []
    for t in range(STEPS):
        states.append(state if state is not None else policy.initial_state())
        action, state = policy.act(
            nested(recording.obs[t]),
            None if t == 0 else state,
            reward=recording.reward[t],
            done=recording.done[t],
        )
        assert_actions_equal(action, recording.action[t], discrete)
        # The state it hands back holds the last action --mode test's next step reads, for
        # a network that reads it.
        if t + 1 < STEPS and "last_action" in [s.name for s in policy.signature.state]:
            assert_actions_equal(state[0][0].numpy(), recording.last_action[t + 1], discrete)

    # Any batch size: every step at once, each from the state it had, acts the same.
    batch_obs = {key: np.stack([obs[key] for obs in recording.obs]) for key in recording.obs[0]}
    batch_state = tuple(torch.cat(parts) for parts in zip(*states, strict=True))
    actions, next_state = policy.act(
        nested(batch_obs),
        batch_state,
        reward=np.array(recording.reward, dtype=np.float32),
        done=np.array(recording.done),
    )
    assert actions.shape == (STEPS, *policy.signature.action.shape)
    assert_actions_equal(actions, np.stack(recording.action), discrete)
    assert [s.shape[0] for s in next_state] == [STEPS] * len(policy.signature.state)


def test_lstm_state_goes_round_trip(runs, exported):
    """The LSTM's state is an input and an output: the same observation from a carried
    state and from the initial one gives other states, and done=True resets it."""
    _, recording = runs("impala_lstm")
    policy = load(runs, exported, "impala_lstm", "torchscript")
    assert [s.name for s in policy.signature.state] == [
        "last_action",
        "core_state_0",
        "core_state_1",
    ]
    obs = recording.obs[5]["obs"]
    _, first = policy.act(obs)
    _, second = policy.act(obs, first, reward=1.0)
    assert not torch.equal(first[1], second[1])
    _, reset = policy.act(obs, second, reward=0.0, done=True)
    _, fresh = policy.act(obs, (second[0], *policy.initial_state()[1:]), reward=0.0, done=True)
    torch.testing.assert_close(reset[1:], fresh[1:], rtol=0, atol=0)


def test_the_best_checkpoint_exports_on_request(runs, tmp_path):
    # On a copy of the module's run: its best checkpoint and policy_best.pt stay out of
    # the run the other tests share (test_bad_input_is_one_line_and_exit_2 needs it to
    # have no best checkpoint), whatever this test does.
    run_dir = str(tmp_path / "impala_lstm")
    shutil.copytree(runs("impala_lstm")[0], run_dir)
    best = load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))
    spread_weights(best["model_state_dict"], seed=1)
    save_best_checkpoint(run_dir, best)
    path = beast.export(run_dir, "torchscript", checkpoint="best")
    assert path == os.path.join(run_dir, "policy_best.pt")
    best_policy = beast.load_policy(path)
    assert best_policy.signature.checkpoint == "model_best.tar"
    latest = beast.load_policy(run_dir)
    assert latest.signature.checkpoint == "model.tar"
    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    assert not np.array_equal(best_policy.act(obs)[0], latest.act(obs)[0])
    np.testing.assert_array_equal(
        best_policy.act(obs)[0], beast.load_policy(run_dir, checkpoint="best").act(obs)[0]
    )


def test_exported_signature_names_dict_inputs(runs, exported):
    policy = load(runs, exported, "sac_dict", "torchscript")
    signature = policy.signature
    # SAC's network reads the observation alone: no reward, done or state.
    assert [s.name for s in signature.inputs] == ["obs.angle", "obs.velocity"]
    assert [s.name for s in signature.outputs] == ["action"]
    assert (signature.algo, signature.env, signature.xpid) == ("sac", "DictPendulum-v1", "sac_dict")
    assert (signature.action_low, signature.action_high) == ((-2.0,), (2.0,))


def test_onnx_inputs_are_named_with_a_batch_axis(exported):
    path = exported("impala_dict", "onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = {node.name: node.shape for node in session.get_inputs()}
    assert inputs["obs.position"] == ["batch", 2]
    assert inputs["core_state_0"] == ["batch", 1, 64]
    assert [node.name for node in session.get_outputs()][0] == "action"


def test_cli_writes_the_file_beside_the_run(runs):
    run_dir, _ = runs("impala_lstm")
    result = run_main(export_main, [run_dir, "--format", "torchscript"])
    assert result.returncode == 0, result.stderr
    path = os.path.join(run_dir, "policy.pt")
    assert result.stdout == f"[beast] wrote {path}\n"
    assert beast.load_policy(path).signature.xpid == "impala_lstm"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{run}", "--format", "tflite"], "unknown format 'tflite': use torchscript or onnx"),
        (["{tmp}", "--format", "torchscript"], "no checkpoint at {tmp}/model.tar: train the run"),
        (["{tmp}/nope", "--format", "torchscript"], "no run directory {tmp}/nope: pass"),
        (["{run}", "--format", "torchscript", "--checkpoint", "best"], "no best checkpoint at"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, argv, message):
    run_dir, _ = runs("impala_lstm")
    argv = [arg.format(run=run_dir, tmp=tmp_path) for arg in argv]
    result = run_main(export_main, argv)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"python -m beast.export: error: {message.format(tmp=tmp_path)}"
    )


@pytest.mark.parametrize("missing", ONNX_PACKAGES)
def test_missing_onnx_packages_are_one_line_and_exit_2(runs, monkeypatch, missing):
    for package in ONNX_PACKAGES:
        if package != missing:
            pytest.importorskip(package, reason="the others must be there to see this one")
    run_dir, _ = runs("impala_lstm")
    monkeypatch.setitem(sys.modules, missing, None)  # its import fails
    result = run_main(export_main, [run_dir, "--format", "onnx"])
    assert result.returncode == 2
    assert result.stderr == (
        f"python -m beast.export: error: ONNX export needs {missing}: pip install -e"
        " '.[export]' (onnx, onnxruntime, onnxscript)\n"
    )
    with pytest.raises(ConfigError, match=f"needs {missing}"):
        beast.export(run_dir, "onnx")


def test_loading_an_onnx_file_without_onnxruntime_or_a_foreign_file_is_one_line(
    exported, monkeypatch, tmp_path
):
    path = exported("impala_lstm", "onnx")
    foreign = tmp_path / "model.onnx"
    foreign.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="is no ONNX model: "):
        beast.load_policy(foreign)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ConfigError, match=r"is an ONNX file, which needs onnxruntime: pip"):
        beast.load_policy(path)


def test_a_policy_without_a_deterministic_action_is_one_line(runs, monkeypatch, tmp_path):
    run_dir, _ = runs("impala_lstm")
    monkeypatch.delattr(CategoricalPolicy, "deterministic_action")  # the base's refusal
    with pytest.raises(ConfigError) as refused:
        beast.export(run_dir, "torchscript", output=tmp_path / "p.pt")
    assert str(refused.value) == (
        f"cannot export {run_dir} to torchscript: CategoricalPolicy has no deterministic"
        " action, so its policy cannot be exported; define ActingRule.deterministic_action"
    )


@pytest.mark.slow
def test_the_docs_script_plays_pong_without_beast(exported, tmp_path):
    """docs/export.md's script, as it is written there, plays a Pong episode from an ONNX
    export with gymnasium, ale_py and onnxruntime, in a directory where beast cannot be
    imported."""
    path = exported("impala_pong", "onnx")
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "export.md")) as f:
        section = f.read().split("## Playing Pong without beast")[1]
    script = section.split("```python\n")[1].split("```")[0]
    assert not re.search(r"^\s*(import|from)\s+beast", script, re.MULTILINE)
    assert len([line for line in script.splitlines() if line.strip()]) <= 25
    (tmp_path / "play.py").write_text(script)
    result = subprocess.run(
        [sys.executable, "play.py", path],
        cwd=tmp_path,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.fullmatch(r"return -?\d+\.0\n", result.stdout)


# Runs with the tuned configs' defaults, shortened: (algo, env, total steps).
DEFAULT_RUNS = {
    "ppo_cartpole": ("ppo", "CartPole-v1", 512),
    "sac_pendulum": ("sac", "Pendulum-v1", 300),
    "impala_cartpole": ("impala", "CartPole-v1", 400),
}


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory):
    """name -> the run directory of DEFAULT_RUNS' run, trained on first use."""
    savedir = str(tmp_path_factory.mktemp("defaults"))
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            algo, env, steps = DEFAULT_RUNS[name]
            argv = ["--algo", algo, "--env", env, "--total_steps", str(steps)]
            result = run_monobeast([*argv, "--savedir", savedir, "--xpid", name])
            assert result.returncode == 0, result.stderr[-2000:]
            built[name] = os.path.join(savedir, name)
        return built[name]

    return get


def export_in_a_new_interpreter(run_dir: str) -> subprocess.CompletedProcess:
    """`python -m beast.export RUN_DIR --format onnx`: torch's ONNX function registry is
    built once a process, so only a new one shows what it prints."""
    return subprocess.run(
        [sys.executable, "-m", "beast.export", run_dir, "--format", "onnx"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("name", ["ppo_cartpole", "sac_pendulum"])
def test_a_feed_forward_policy_exports_with_the_observation_alone(default_runs, name):
    """PPO's and SAC's networks act on the observation: their ONNX files take `obs` and
    give `action`, as Stable-Baselines3's and CleanRL's exported policies do."""
    for package in ONNX_PACKAGES:
        pytest.importorskip(package, reason="ONNX export needs the export extra")
    import onnxruntime

    run_dir = default_runs(name)
    result = export_in_a_new_interpreter(run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    path = os.path.join(run_dir, "policy.onnx")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    size = 4 if name == "ppo_cartpole" else 3
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("obs", ["batch", size])]
    assert [o.name for o in session.get_outputs()] == ["action"]
    policy = beast.load_policy(path)
    assert policy.signature.state == () and policy.initial_state(3) == ()
    obs = np.random.default_rng(0).normal(size=(8, size)).astype(np.float32)
    action, state = policy.act(obs)
    assert state == ()
    assert_actions_equal(action, beast.load_policy(run_dir).act(obs)[0], size == 4)


def test_the_default_mlp_acts_on_the_observation_alone(default_runs):
    """IMPALA's classic-control network, a feed-forward mlp, no longer reads the reward
    and last action (--use_last_action_reward brings them back: the cases above)."""
    policy = beast.load_policy(default_runs("impala_cartpole"))
    assert [s.name for s in policy.signature.inputs] == ["obs"]
    assert [s.name for s in policy.signature.outputs] == ["action"]


def test_a_run_saved_before_the_flag_plays_as_it_was_trained(runs, tmp_path):
    """A run saved before --use_last_action_reward (its config has no such key) built its
    feed-forward mlp reading the reward and last action, as every built-in actor-critic
    did then: it loads with them and acts as it was trained."""
    run_dir, _ = runs("impala_last_action_reward")
    checkpoint = load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))
    del checkpoint["config"]["use_last_action_reward"]
    (tmp_path / "old").mkdir()
    save_checkpoint(str(tmp_path / "old"), checkpoint)
    old, trained = beast.load_policy(tmp_path / "old"), beast.load_policy(run_dir)
    assert [s.name for s in old.signature.inputs] == ["obs", "reward", "last_action"]
    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    np.testing.assert_array_equal(old.act(obs)[0], trained.act(obs)[0])


def test_onnx_export_prints_no_foreign_warnings(default_runs):
    """The exporter's registry warns of torchvision, which beast does not use ("torchvision
    is not installed. Skipping torchvision::nms", four lines): export prints its own line
    and nothing else."""
    for package in ONNX_PACKAGES:
        pytest.importorskip(package, reason="ONNX export needs the export extra")
    run_dir = default_runs("ppo_cartpole")
    result = export_in_a_new_interpreter(run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    assert result.stdout == f"[beast] wrote {os.path.join(run_dir, 'policy.onnx')}\n"
