"""Dict and Tuple observations end to end.

Each leaf is one field (beast/fields.py) in every buffer: rollout slots, the central
request table, sequence and transition replays (an image leaf's frames deduplicated),
and the model gets them back nested, as a dict (a tuple for a Tuple). Here every leaf
of a nested observation is followed from an env batch through each buffer and
compared with what the env returned; the model is checked to receive the nested
structure; the observation normaliser keeps statistics per float leaf. Then every
algorithm trains on a Dict env through its entry point (monobeast local, resumed with
--serial; central for IMPALA, R2D2, PPO and SAC; polybeast local and central), and
`--mode test` plays its checkpoint. Bad input: one line, exit 2.
"""

from __future__ import annotations

import functools
import json
import os
import threading

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

import monobeast
from beast.acting.actor import env_sources, policy_inputs
from beast.acting.inference import CentralInference, InferenceTable, LocalInference, record_arrays
from beast.algos.normalize import ObservationNormalizer
from beast.algos.policies import CategoricalPolicy
from beast.envs.batch import make_env_batch
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.experience.sequence_replay import PrioritizedReplay, SequenceBuilder, sequence_spec
from beast.experience.transition_replay import RingAppender, RingReplay, step_spec
from beast.fields import Field
from beast.models import build_model
from tests.support.central import make_server
from tests.support.matrix import ALGO_FLAGS, COMMON, LAYOUT, entry, ray_address  # noqa: F401
from tests.support.runs import assert_refused_in_one_line

# --- A nested observation whose every value says where it came from -----------------

EPISODE_LENGTH = 6
NUM_ACTIONS = 2


class StackedDictEnv(gymnasium.Env):
    """A Dict holding an image leaf of two stacked frames and a Tuple of vectors.

        "image"     uint8 [2, 3, 3]  frames (t-1, t) of the episode, frame -1 repeating
                                     frame 0 after a reset (as Atari's stack does)
        "state"     (float32 [2], float64 [])  (env, t) and the episode's number

    Every frame is distinct across envs (seeded 0, 1, ...), episodes and steps, so a leaf
    copied to the wrong row, step or buffer is caught. Episodes terminate after
    EPISODE_LENGTH steps.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (2, 3, 3), dtype=np.uint8),
                "state": spaces.Tuple(
                    (
                        spaces.Box(-1e6, 1e6, (2,), dtype=np.float32),
                        spaces.Box(-1e6, 1e6, (), dtype=np.float64),
                    )
                ),
            }
        )
        self.action_space = spaces.Discrete(NUM_ACTIONS)
        self.env_index, self.episode, self.t = 0, -1, 0

    def _frame(self, t: int) -> np.ndarray:
        value = (self.env_index * 97 + self.episode * 13 + max(t, 0)) % 255 + 1
        return np.full((3, 3), value, dtype=np.uint8)

    def _observation(self) -> dict:
        return {
            "image": np.stack([self._frame(self.t - 1), self._frame(self.t)]),
            "state": (
                np.array([self.env_index, self.t], dtype=np.float32),
                np.float64(self.episode),
            ),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.env_index = seed
        self.episode += 1
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        return self._observation(), 1.0, self.t >= EPISODE_LENGTH, False, {}


ENV = f"{__name__}:StackedDictEnv"
LEAVES = ("obs.image", "obs.state[0]", "obs.state[1]")
POLICY = CategoricalPolicy(NUM_ACTIONS)


def stepped(num_envs: int, steps: int, on_step=None) -> list[dict[str, np.ndarray]]:
    """`steps` steps of `num_envs` StackedDictEnvs; each step's observation arrays (copied,
    before `on_step(batch, sources)` is called with the batch and everything a writer
    reads)."""
    seen = []
    with make_env_batch(ENV, num_envs, 0, False) as batch:
        last_action = np.zeros(num_envs, dtype=np.int64)
        record = record_arrays(POLICY, num_envs)
        sources = {**env_sources(batch, last_action), **record}
        for t in range(steps):
            record["action"][:] = t % NUM_ACTIONS
            seen.append({key: array.copy() for key, array in batch.obs_arrays.items()})
            if on_step is not None:
                on_step(batch, sources)
            np.copyto(last_action, record["action"])
            batch.step(record["action"])
    return seen


STEP0 = stepped(num_envs=1, steps=1)[0]
FIELDS = {key: Field(a.shape[1:], torch.from_numpy(a).dtype) for key, a in STEP0.items()}


def test_the_env_batch_has_one_array_per_leaf():
    seen = stepped(num_envs=2, steps=EPISODE_LENGTH + 2)
    assert tuple(seen[0]) == LEAVES
    # Env 1, step 2 of its first episode: frames 1 and 2, state (1, 2), episode 0.
    assert seen[2]["obs.image"][1, :, 0, 0].tolist() == [97 + 1 + 1, 97 + 2 + 1]
    assert seen[2]["obs.state[0]"][1].tolist() == [1.0, 2.0]
    assert seen[2]["obs.state[1]"].dtype == np.float32  # float64 leaf stored as float32
    # A termination resets in the same step: the next episode's first stack.
    assert seen[EPISODE_LENGTH]["obs.state[1]"].tolist() == [1.0, 1.0]


def test_rollout_slots_carry_every_leaf():
    num_envs, unroll = 2, 4
    spec = rollout_spec(unroll_length=unroll, obs=FIELDS, record=POLICY.record_spec())
    assert [key for key in spec if key.startswith("obs")] == list(LEAVES)
    buffers = RolloutBuffers(spec, num_buffers=2 * num_envs)
    writers = []

    def write(batch, sources):
        if not writers:
            writers.append(
                buffers.writer(0, sources, first_id=0, id_stride=num_envs, learner_pid=os.getpid())
            )
        assert writers[0].write(())

    seen = stepped(num_envs, unroll + 1, write)
    slots = [buffers.full_queue.get(timeout=1) for _ in range(num_envs)]
    data = buffers.gather(slots)
    for key in LEAVES:
        expected = torch.from_numpy(np.stack([step[key] for step in seen]))  # [T+1, K, ...]
        assert torch.equal(data[key], expected), key
    buffers.close()


def test_sequence_replay_stores_image_frames_once_and_rebuilds_every_leaf():
    seq_len, overlap = 4, 2
    spec = sequence_spec(seq_len=seq_len, obs=FIELDS, record=POLICY.record_spec())
    replay = PrioritizedReplay(spec, capacity=64, frame_dedup=True)
    # The image leaf is stored as its L + 1 frames; the vectors as they are.
    assert replay.storage["frames.image"].shape == (seq_len + 2, 3, 3)
    assert "obs.image" not in replay.tensors and "obs.state[0]" in replay.tensors
    num_envs = 2
    builders = [SequenceBuilder(spec, seq_len, overlap) for _ in range(num_envs)]
    stored: dict[int, dict[str, torch.Tensor]] = {}

    def append(batch, sources):
        for e, builder in enumerate(builders):
            sequence = builder.append({key: sources[key][e] for key in builder.step_keys})
            if sequence is not None:
                stored[replay.add(sequence)] = sequence

    stepped(num_envs, 5 * EPISODE_LENGTH, append)
    assert len(stored) >= 10
    sample = replay.sample(32, torch.Generator().manual_seed(0))
    for column, index in enumerate(sample.indices.tolist()):
        original = stored[index]
        real = original["mask"]  # padding rows are stored by their newest frame only
        for key in LEAVES:
            got = sample.batch[key][:, column]
            assert torch.equal(got[real], original[key][real]), key


def test_transition_replay_stores_image_frames_once_and_rebuilds_every_leaf():
    num_envs, n_step = 2, 2
    spec = step_spec(FIELDS, POLICY.record_spec())
    replay = RingReplay(
        spec, num_envs=num_envs, capacity=num_envs * 64, n_step=n_step, frame_dedup=True
    )
    assert replay.storage["frames.image"].shape == (3, 3)
    assert replay.stacks == {"obs.image": 2}
    appender = RingAppender(replay, 0, num_envs)
    seen = stepped(num_envs, 40, lambda batch, sources: appender.append(sources))
    sample = replay.sample(64, torch.Generator().manual_seed(0))
    assert (sample.weights > 0).all()  # every stack rebuilt exactly: all sampleable
    envs, positions = sample.indices // replay.ring, sample.indices % replay.ring
    for column, (e, s) in enumerate(zip(envs.tolist(), positions.tolist(), strict=True)):
        k = int(sample.batch["n_steps"][column])
        for key in LEAVES:
            for row, step in ((0, s), (1, s + k)):
                expected = torch.from_numpy(seen[step][key][e, ...])
                assert torch.equal(sample.batch[key][row, column], expected), (key, row)


class RecordingModel(torch.nn.Module):
    """A model that keeps the observation of each call (to check what models get)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.seen: list = []
        self._lock = threading.Lock()  # guards seen: server threads call concurrently

    def initial_state(self, batch_size, device=None):
        return self.model.initial_state(batch_size)

    def forward(self, inputs, core_state=()):
        with self._lock:
            self.seen.append(inputs["obs"])
        return self.model(inputs, core_state)


def nested_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    shapes = {"image": (2, 3, 3), "state": ((2,), ())}
    return build_model("mlp", shapes, NUM_ACTIONS, use_lstm=True, hidden_size=16).eval()


def assert_nested(obs, num_envs: int) -> None:
    """What a model gets for [1, n] steps of StackedDictEnv: its structure, nested."""
    assert isinstance(obs, dict) and set(obs) == {"image", "state"}
    assert isinstance(obs["state"], tuple) and len(obs["state"]) == 2
    assert obs["image"].shape == (1, num_envs, 2, 3, 3) and obs["image"].dtype == torch.uint8
    assert obs["state"][0].shape == (1, num_envs, 2) and obs["state"][1].shape == (1, num_envs)


def act_at_once(policies, batch, sources) -> None:
    """Each (central, local) policy pair acts on the env batch's step from its own thread,
    all at once; the central outputs and states must equal the local ones."""
    inputs = policy_inputs(batch, sources["last_action"])
    errors: list[BaseException] = []

    def act(central: CentralInference, local: LocalInference) -> None:
        try:
            expected = {k: torch.from_numpy(v.copy()) for k, v in local.act(inputs).items()}
            got = {k: torch.from_numpy(v.copy()) for k, v in central.act(inputs).items()}
            torch.testing.assert_close(got["policy_logits"], expected["policy_logits"])
            for mine, theirs in zip(central.state, local.state, strict=True):
                torch.testing.assert_close(mine, theirs)
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=act, args=pair) for pair in policies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    if errors:
        raise errors[0]


def test_central_policy_serves_dict_observations_as_the_local_policy_does(watchdog):
    """Actors' envs through the request table, one leaf per input field: the server's
    model gets the observation nested, and every env's outputs and recurrent states
    equal the actor-side model's, from contiguous rows and from rows with a gap."""
    num_actors, num_envs = 3, 2
    source = nested_model(seed=0)
    table = InferenceTable(
        num_actors=num_actors,
        num_envs=num_envs,
        obs=FIELDS,
        policy=POLICY,
        initial_state=source.initial_state(1),
    )
    assert set(LEAVES) < set(table.inputs)
    served = RecordingModel(nested_model(seed=1))  # synced from `source` at start
    # The window outlasts both actors' posts: they make one batch.
    server = make_server(table, served, source, policy=POLICY, batch_window=0.2)
    server.start()
    local = RecordingModel(source)
    try:
        for posting in ((0, 1), (0, 2)):  # rows [0, 4): contiguous; actors 0 and 2: a gap
            policies = [
                (CentralInference(table, i, lambda: True), LocalInference(local, POLICY, num_envs))
                for i in posting
            ]
            stepped(num_envs, EPISODE_LENGTH + 2, functools.partial(act_at_once, policies))
    finally:
        table.close()
        server.stop()
    assert server.error is None
    for obs in local.seen:
        assert_nested(obs, num_envs)
    for obs in served.seen:
        assert_nested(obs, obs["image"].shape[1])
    assert num_envs * 2 in {obs["image"].shape[1] for obs in served.seen}


def test_the_normaliser_keeps_statistics_per_float_leaf():
    normaliser = ObservationNormalizer(RecordingModel(nested_model(0)), FIELDS)
    assert normaliser.keys == ("obs.state[0]", "obs.state[1]")  # not the uint8 image
    state = normaliser.state_dict()
    assert "leaf_rms.0.mean" in state and "leaf_rms.1.var" in state and "obs_rms.mean" not in state
    generator = torch.Generator().manual_seed(0)
    batch = {
        "obs.image": torch.randint(0, 255, (5, 4, 2, 3, 3), dtype=torch.uint8),
        "obs.state[0]": torch.randn((5, 4, 2), generator=generator) * 3 + 1,
        "obs.state[1]": torch.randn((5, 4), generator=generator) - 7,
    }
    normaliser.observe(batch)
    for key, rms in normaliser.statistics().items():
        rows = batch[key][1:].double().reshape(-1, *batch[key].shape[2:])  # row 0 repeats
        # Float64 moments merged into the initial (0, 1) prior of weight 1e-4.
        torch.testing.assert_close(rms.mean, rows.mean(0), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(rms.var, rows.var(0, unbiased=False), rtol=1e-3, atol=1e-3)
    obs = {"image": batch["obs.image"], "state": (batch["obs.state[0]"], batch["obs.state[1]"])}
    normalised = normaliser.normalize(obs)
    assert normalised["image"] is obs["image"]  # images pass as they are
    rms = normaliser.statistics()["obs.state[1]"]
    expected = (obs["state"][1] - rms.mean.float()) / torch.sqrt(rms.var + 1e-8).float()
    torch.testing.assert_close(normalised["state"][1], expected.clamp(-10, 10))


# --- Every algorithm through its entry point ----------------------------------------

TOTAL_STEPS = 2000
# DictCartPole-v1 (CartPole split into position and velocity) unless the algorithm needs
# continuous actions: DictPendulum-v1.
CONTINUOUS = ("sac", "td3", "ddpg")
# The default run takes one algorithm per kind of experience and acting (rollouts,
# synchronous rollouts, sequences with recurrent state, prioritized transitions with
# distributional Q, the squashed Gaussian); the rest share those paths and run with
# `-m slow`, as do the central cells that the local policy's kind already covers.
DEFAULT_ALGOS = ("impala", "ppo", "r2d2", "rainbow", "sac")
DEFAULT_CENTRAL = ("r2d2", "sac")
CENTRAL = ("impala", "r2d2", "ppo", "sac")


def default_or_slow(algos, default) -> list:
    return [
        pytest.param(algo, marks=[] if algo in default else [pytest.mark.slow]) for algo in algos
    ]


def dict_env(algo: str) -> str:
    return "DictPendulum-v1" if algo in CONTINUOUS else "DictCartPole-v1"


def train(tmp_path, script: str, algo: str, xpid: str, steps: int, *flags: str) -> str:
    argv = ["--algo", algo, "--env", dict_env(algo), *COMMON, *LAYOUT[script]]
    argv += ["--total_steps", str(steps)]  # the last --total_steps counts
    argv += [*ALGO_FLAGS[algo], *flags, "--savedir", str(tmp_path), "--xpid", xpid]
    result = entry(script, argv)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"reached total_steps {steps:,}" in output
    return output


def play_checkpoint(tmp_path, xpid: str) -> dict:
    argv = ["--mode", "test", "--savedir", str(tmp_path), "--xpid", xpid]
    assert monobeast.main([*argv, "--num_test_episodes", "1"]) == 0
    return json.loads((tmp_path / xpid / "test.json").read_text())


@pytest.mark.parametrize("algo", default_or_slow(ALGO_FLAGS, DEFAULT_ALGOS))
def test_every_algorithm_trains_on_dict_observations_resumes_serially_and_tests(tmp_path, algo):
    """monobeast local, then the run resumed from its checkpoint with --serial (one
    process), then --mode test on the final checkpoint."""
    output = train(tmp_path, "monobeast.py", algo, algo, TOTAL_STEPS)
    assert "obs.position (2,) float32" in output or "obs.angle (2,) float32" in output
    saved = torch.load(tmp_path / algo / "model.tar", weights_only=True)["step"]
    output = train(tmp_path, "monobeast.py", algo, algo, 2 * TOTAL_STEPS, "--serial")
    assert f"resuming {algo} from" in output and f"at step {saved:,}" in output
    summary = play_checkpoint(tmp_path, algo)
    assert summary["episodes"] == 1


@pytest.mark.parametrize("algo", default_or_slow(CENTRAL, DEFAULT_CENTRAL))
def test_central_inference_on_dict_observations(tmp_path, algo):
    train(tmp_path, "monobeast.py", algo, algo, TOTAL_STEPS, "--policy", "central")
    assert play_checkpoint(tmp_path, algo)["episodes"] == 1


@pytest.mark.parametrize("policy", [pytest.param("local", marks=pytest.mark.slow), "central"])
def test_polybeast_on_dict_observations(tmp_path, request, policy):
    address = request.getfixturevalue("ray_address")
    flags = ("--policy", policy, "--ray_address", address)
    train(tmp_path, "polybeast.py", "impala", policy, TOTAL_STEPS, *flags)
    assert play_checkpoint(tmp_path, policy)["episodes"] == 1


def test_image_and_vector_leaves_train_through_the_multi_input_model(tmp_path):
    """DictGridTarget-v0: a conv torso on the 1x16x16 image leaf, an MLP on the position."""
    argv = ["--env", "DictGridTarget-v0", *COMMON, *LAYOUT["monobeast.py"]]
    argv += ["--savedir", str(tmp_path), "--xpid", "grid"]
    result = entry("monobeast.py", argv)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "obs.image (1, 16, 16) uint8, obs.position (2,) float32" in result.stdout
    assert play_checkpoint(tmp_path, "grid")["episodes"] == 1


# --- Bad input: one line, exit 2 -----------------------------------------------------


class GridLeafEnv(StackedDictEnv):
    """A Dict with a 2-D leaf: storable, but no built-in torso encodes it."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"grid": spaces.Box(0, 1, (5, 5), np.float32)})

    def _observation(self) -> dict:
        return {"grid": np.zeros((5, 5), dtype=np.float32)}


class CameraLeafEnv(GridLeafEnv):
    """A Dict with an RGB image leaf: an image, but not a frame stack."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"camera": spaces.Box(0, 255, (3, 4, 4), np.uint8)})

    def _observation(self) -> dict:
        return {"camera": self.np_random.integers(0, 256, (3, 4, 4), dtype=np.uint8)}


def test_frame_stacks_are_told_from_other_images():
    from beast.envs import env_spec, images_not_stacked, make

    for env_id, expected in (
        ("PongNoFrameskip-v4", []),  # Atari's 4-frame stack (a Box: its one leaf)
        (ENV, []),  # StackedDictEnv's image slides by a frame a step
        ("DictGridTarget-v0", []),  # one channel: nothing to slide
        (f"{__name__}:CameraLeafEnv", ["obs.camera"]),
    ):
        env = make(env_id, seed=0)
        assert images_not_stacked(env, env_spec(env)) == expected, env_id


class DiscreteLeafEnv(GridLeafEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"room": spaces.Discrete(4)})


class TextLeafEnv(GridLeafEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"note": spaces.Text(16)})


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["--env", "tests.end_to_end.test_dict_observations:GridLeafEnv"],
            "observation leaf obs.grid has shape (5, 5): the multi-input model encodes",
        ),
        (
            ["--env", "tests.end_to_end.test_dict_observations:DiscreteLeafEnv"],
            "observation leaf obs.room is Discrete(4): beast stores Box leaves; one-hot",
        ),
        (
            ["--env", "tests.end_to_end.test_dict_observations:TextLeafEnv"],
            "observation leaf obs.note is Text(",
        ),
        (
            ["--env", "tests.end_to_end.test_dict_observations:CameraLeafEnv", "--algo", "dqn"],
            "obs.camera (3, 4, 4) are not frame stacks (obs_t[:-1] != obs_{t-1}[1:] in an"
            " episode); pass --no-frame_dedup",
        ),
        (
            ["--env", "DictCartPole-v1", "--model", "atari"],
            "the atari model reads one image observation; for Dict or Tuple observations",
        ),
    ],
)
def test_dict_observations_beast_cannot_use_are_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, argv, fragment)
