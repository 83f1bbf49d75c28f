"""Contract of beast.envs: make(), Atari preprocessing, episodic life, stats, seeding, adapter.

Custom-env paths are built from this module's own `__name__`, so `make("<this module>:Cls")`
imports a real module path however pytest imported the file.
"""

from __future__ import annotations

import cv2
import gymnasium
import numpy as np
import pytest
import torch
from ale_py.env import AtariEnv
from gymnasium import spaces

from beast.envs import EnvError, EnvSpec, OldGymAdapter, env_spec, make
from beast.fields import Field

# --- Hand-written environments -------------------------------------------------------


class OldDiscrete:
    """Duck-typed old gym Discrete space (no gym import)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.shape = ()
        self.dtype = np.int64


class OldBox:
    """Duck-typed old gym Box space."""

    def __init__(self, low: float, high: float, shape: tuple[int, ...]) -> None:
        self.low = np.full(shape, low)
        self.high = np.full(shape, high)
        self.shape = shape
        self.dtype = np.float64


class OldStyleEnv:
    """Old gym API: bare reset, 4-tuple step, seed(), old spaces; float64 list obs.

    Observation `[t, seed]`; reward = action; the episode ends after 5 steps, as a
    termination if the last action was 1, else as a time-limit truncation.
    """

    length = 5

    def __init__(self) -> None:
        self.observation_space = OldBox(-1e6, 1e6, (2,))
        self.action_space = OldDiscrete(2)
        self.seeded_with = -1
        self.t = 0

    def seed(self, seed: int) -> list[int]:
        self.seeded_with = seed
        return [seed]

    def reset(self) -> list[float]:
        self.t = 0
        return [0.0, float(self.seeded_with)]

    def step(self, action: int) -> tuple[list[float], float, bool, dict]:
        self.t += 1
        done = self.t >= self.length
        info = {"TimeLimit.truncated": True} if done and action == 0 else {}
        return [float(self.t), float(self.seeded_with)], float(action), done, info


def make_old_style_env() -> OldStyleEnv:
    """Factory-function form of a custom env path."""
    return OldStyleEnv()


class CountdownEnv(gymnasium.Env):
    """Rewards 1, 2, ..., `length`, then terminates; float64 observations."""

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float64)
        self.action_space = spaces.Discrete(3)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], dtype=np.float64), float(self.t), self.t >= self.length, False, {}


def make_truncated_countdown() -> gymnasium.Env:
    """A long countdown cut to 3 steps by a time limit: ends by truncation, r = 1+2+3."""
    return gymnasium.wrappers.TimeLimit(CountdownEnv(length=100), max_episode_steps=3)


class NestedObsEnv(CountdownEnv):
    """A Dict holding a Tuple holding a Dict, float64 and uint8 leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, shape=(1, 4, 4), dtype=np.uint8),
                "arm": spaces.Tuple(
                    (
                        spaces.Box(-1, 1, shape=(2,), dtype=np.float64),
                        spaces.Dict({"grip": spaces.Box(0, 1, shape=(), dtype=np.float64)}),
                    )
                ),
            }
        )

    def observation(self) -> dict:
        return {
            "image": np.full((1, 4, 4), self.t, dtype=np.uint8),
            "arm": (np.array([self.t, -self.t], dtype=np.float64), {"grip": np.float64(0.5)}),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation(), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return self.observation(), reward, terminated, truncated, info


# Dict observations beast cannot store, each with what its one-line error says.
UNSTORABLE_OBS = {
    "discrete_leaf": (spaces.Dict({"x": spaces.Discrete(3)}), "one-hot encode it"),
    "text_leaf": (spaces.Dict({"note": spaces.Text(8)}), "its size varies"),
    "sequence_leaf": (
        spaces.Tuple((spaces.Sequence(spaces.Box(0, 1, (2,))),)),
        "its size varies",
    ),
    "dotted_key": (spaces.Dict({"a.b": spaces.Box(0, 1, (1,))}), "without '.', '[' or ']'"),
    "empty_dict": (spaces.Dict({"x": spaces.Dict({})}), "empty Dict"),
    "empty_box": (spaces.Dict({"x": spaces.Box(0, 1, (0,))}), "empty Box"),
}


def make_unstorable_obs_env(case: str) -> gymnasium.Env:
    env = CountdownEnv()
    env.observation_space = UNSTORABLE_OBS[case][0]
    return env


class BoxActionEnv(CountdownEnv):
    """CountdownEnv with a Box action space (set by the subclasses below)."""

    action_bounds: tuple = (-1.0, 1.0)
    action_shape: tuple = (2,)
    action_dtype = np.float32

    def __init__(self) -> None:
        super().__init__()
        low, high = self.action_bounds
        self.action_space = spaces.Box(low, high, shape=self.action_shape, dtype=self.action_dtype)


class InfiniteBoxActionEnv(BoxActionEnv):
    action_bounds = (-np.inf, np.inf)


class MatrixBoxActionEnv(BoxActionEnv):
    action_shape = (2, 3)


class IntegerBoxActionEnv(BoxActionEnv):
    action_bounds = (0, 3)
    action_dtype = np.int64


def needs_arguments(length: int) -> CountdownEnv:
    return CountdownEnv(length)


def make_bare_breakout() -> AtariEnv:
    return AtariEnv("breakout", frameskip=1, repeat_action_probability=0.0)


def make_skipping_breakout() -> AtariEnv:
    return AtariEnv("breakout", frameskip=4, repeat_action_probability=0.0)


def make_short_pong() -> AtariEnv:
    """Pong truncated by the ALE after 200 frames (50 agent steps, less the no-ops)."""
    return AtariEnv(
        "pong", frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=200
    )


def make_ram_pong() -> AtariEnv:
    return AtariEnv("pong", obs_type="ram")


def path(name: str) -> str:
    return f"{__name__}:{name}"


def run_episode(env: gymnasium.Env, actions) -> tuple[list[dict], list[float]]:
    """Step `actions` from a reset; return the per-step infos and rewards."""
    env.reset()
    infos, rewards = [], []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        infos.append(info)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return infos, rewards


# --- Specs ----------------------------------------------------------------------------


def test_cartpole_spec_and_float32_observations():
    env = make("CartPole-v1", seed=0)
    assert env_spec(env) == EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), num_actions=2)
    obs, _ = env.reset()
    assert obs.dtype == np.float32
    obs, *_ = env.step(0)
    assert obs.dtype == np.float32 and obs.shape == (4,)


def test_float64_observations_are_cast_to_float32():
    env = make(path("CountdownEnv"))
    assert env_spec(env).obs_dtype == np.float32
    assert env.reset()[0].dtype == np.float32
    assert env.step(0)[0].dtype == np.float32


def test_pong_spec_and_steps():
    env = make("PongNoFrameskip-v4", seed=0)
    assert env_spec(env) == EnvSpec(
        obs_shape=(4, 84, 84), obs_dtype=np.dtype(np.uint8), num_actions=6
    )
    obs, _ = env.reset()
    for action in [0, 1, 2, 3, 4, 5] * 3:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert obs.flags.c_contiguous
        assert not (terminated or truncated) and "episode" not in info
    assert obs.max() > 0  # real screen content, not an empty buffer


@pytest.mark.parametrize(
    ("name", "sticky"), [("PongNoFrameskip-v4", 0.0), ("ALE/Pong-v5", 0.25), ("Pong-v4", 0.0)]
)
def test_atari_ids_skip_frames_only_once(name, sticky):
    """The underlying AtariEnv never skips; the id's sticky-action probability is kept."""
    env = make(name)
    atari = env.unwrapped
    assert atari._frameskip == 1
    assert atari.ale.getFloat("repeat_action_probability") == pytest.approx(sticky)
    assert env_spec(env).obs_shape == (4, 84, 84)


def test_bare_atari_env_from_factory_is_preprocessed():
    env = make(path("make_bare_breakout"), episodic_life=True)
    assert env_spec(env) == EnvSpec((4, 84, 84), np.dtype(np.uint8), 4)


def test_frame_skipping_atari_env_from_factory_is_refused():
    with pytest.raises(EnvError) as err:
        make(path("make_skipping_breakout"))
    assert "create it with frameskip=1" in assert_one_line(err)


def test_ram_atari_env_is_not_pixel_preprocessed():
    env = make(path("make_ram_pong"))
    assert env_spec(env) == EnvSpec((128,), np.dtype(np.uint8), 6)


def test_atari_truncation_ends_a_real_episode():
    env = make(path("make_short_pong"), episodic_life=True)
    env.reset()
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 100:
        _, _, terminated, truncated, info = env.step(0)
        steps += 1
    assert (terminated, truncated) == (False, True)
    assert info["episode"]["l"] == steps
    # 200 frames at 4 per step, less the 1..30 no-op frames taken at reset.
    assert 43 <= steps <= 50


def test_frame_stack_shifts_by_one_frame():
    env = make("BreakoutNoFrameskip-v4", seed=1)
    obs, _ = env.reset()
    # After reset the stack holds copies of the first frame.
    assert all(np.array_equal(obs[0], obs[i]) for i in range(1, 4))
    rng = np.random.default_rng(0)
    for _ in range(30):
        next_obs, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
        assert not (terminated or truncated)
        np.testing.assert_array_equal(next_obs[:-1], obs[1:])
        obs = next_obs
    # Observations are fresh arrays: keeping one does not see later frames.
    kept = obs.copy()
    env.step(1)
    np.testing.assert_array_equal(obs, kept)


def test_atari_frames_match_independent_reference():
    """Newest frame == resize(max(last two raw grayscale frames)) of a frame-by-frame env."""
    seed = 5
    env = make("PongNoFrameskip-v4", seed=seed)
    obs, _ = env.reset()

    ref = gymnasium.make("PongNoFrameskip-v4", obs_type="grayscale")
    frame, _ = ref.reset(seed=seed)
    # Same seed -> same np_random -> same no-op count as the preprocessing drew.
    for _ in range(int(ref.unwrapped.np_random.integers(1, 31))):
        frame, *_ = ref.step(0)

    def resize(image):
        return cv2.resize(image, (84, 84), interpolation=cv2.INTER_AREA)

    np.testing.assert_array_equal(obs[-1], resize(frame))
    rng = np.random.default_rng(1)
    for _ in range(40):
        action = int(rng.integers(6))
        frames, total = [], 0.0
        for _ in range(4):
            frame, reward, *_ = ref.step(action)
            frames.append(frame)
            total += reward
        obs, reward, *_ = env.step(action)
        np.testing.assert_array_equal(obs[-1], resize(np.maximum(frames[-2], frames[-1])))
        assert reward == total  # raw, unclipped sum over the 4 frames


# --- Episodic life and episode statistics ---------------------------------------------


def test_episodic_life_soft_reset_and_whole_game_stats():
    env = make("BreakoutNoFrameskip-v4", seed=3, episodic_life=True)
    rng = np.random.default_rng(3)
    _, info = env.reset()
    lives = info["lives"]
    assert lives == 5
    life_losses, steps, score = 0, 0, 0.0
    for _ in range(20_000):  # a random Breakout game lasts a few hundred steps
        _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
        steps += 1
        score += reward
        if not (terminated or truncated):
            assert "episode" not in info
            continue
        if info["lives"] > 0:  # life lost: agent episode ends, game does not
            assert terminated and "episode" not in info
            assert info["lives"] == lives - 1
            life_losses += 1
            frame_number = info["episode_frame_number"]
            _, reset_info = env.reset()
            assert reset_info["lives"] == info["lives"]  # no full reset
            assert reset_info["episode_frame_number"] > frame_number  # same game goes on
            lives = reset_info["lives"]
            continue
        # Real game over: statistics cover the whole game in agent steps.
        assert info["episode"] == {"r": pytest.approx(score), "l": steps}
        assert isinstance(info["episode"]["l"], int)
        assert isinstance(info["episode"]["r"], float)
        break
    else:
        pytest.fail("Breakout game did not end")
    assert life_losses == 4
    _, info = env.reset()  # after game over: a real reset
    assert info["lives"] == 5 and info["episode_frame_number"] < 100


def test_without_episodic_life_a_life_loss_does_not_terminate():
    env = make("BreakoutNoFrameskip-v4", seed=4)
    rng = np.random.default_rng(4)
    env.reset()
    for step in range(1, 20_000):
        _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
        if terminated or truncated:
            assert info["lives"] == 0 and info["episode"]["l"] == step
            return
    pytest.fail("Breakout game did not end")


def test_episode_stats_on_known_rewards():
    env = make(path("CountdownEnv"))
    for _ in range(2):  # counters restart on reset
        infos, rewards = run_episode(env, [0] * 10)
        assert rewards == [1.0, 2.0, 3.0, 4.0]
        assert all("episode" not in info for info in infos[:-1])
        assert infos[-1]["episode"] == {"r": 10.0, "l": 4}


def test_episode_stats_reported_on_truncation():
    env = make(path("make_truncated_countdown"))
    infos, _ = run_episode(env, [0] * 10)
    assert len(infos) == 3
    assert infos[-1]["episode"] == {"r": 6.0, "l": 3}


# --- Seeding --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["CartPole-v1", "PongNoFrameskip-v4", "ALE/Breakout-v5"])
def test_same_seed_same_trajectory(name):
    """Same seed and actions -> identical observations and rewards (sticky actions too)."""

    def trajectory(seed):
        env = make(name, seed=seed)
        obs, _ = env.reset()
        observations, rewards = [obs], []
        actions = np.random.default_rng(0).integers(env.action_space.n, size=60)
        for action in actions:
            obs, reward, terminated, truncated, _ = env.step(int(action))
            observations.append(obs)
            rewards.append(reward)
            if terminated or truncated:
                break
        return observations, rewards

    obs_a, rewards_a = trajectory(11)
    obs_b, rewards_b = trajectory(11)
    assert rewards_a == rewards_b
    assert len(obs_a) == len(obs_b)
    for a, b in zip(obs_a, obs_b, strict=True):
        np.testing.assert_array_equal(a, b)


def test_seed_applies_to_first_reset_and_action_space_only():
    first = [make("CartPole-v1", seed=s).reset()[0] for s in (1, 1, 2)]
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])

    env = make("CartPole-v1", seed=1)
    a, _ = env.reset()
    b, _ = env.reset()  # continues the RNG stream, not a re-seed
    assert not np.array_equal(a, b)

    env_x, env_y = make("CartPole-v1", seed=3), make("CartPole-v1", seed=3)
    samples = [env_x.action_space.sample() for _ in range(20)]
    assert samples == [env_y.action_space.sample() for _ in range(20)]


# --- Old gym API ----------------------------------------------------------------------


def test_old_gym_adapter_api_and_space_conversion():
    env = OldGymAdapter(OldStyleEnv())
    assert env.action_space == spaces.Discrete(2)
    assert isinstance(env.observation_space, spaces.Box)
    assert env.observation_space.shape == (2,)

    obs, info = env.reset(seed=9)
    assert isinstance(obs, np.ndarray) and info == {}
    np.testing.assert_array_equal(obs, [0.0, 9.0])  # env.seed(9) was called

    # Ends with action 1: a real termination.
    for t in range(1, 6):
        obs, reward, terminated, truncated, info = env.step(1)
        assert reward == 1.0
        np.testing.assert_array_equal(obs, [t, 9.0])
    assert (terminated, truncated) == (True, False)
    # Ends with action 0 and TimeLimit.truncated: a truncation.
    env.reset()
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(0)
    assert (terminated, truncated) == (False, True)


@pytest.mark.parametrize("attr", ["OldStyleEnv", "make_old_style_env"])
def test_make_wraps_old_gym_env_from_module_path(attr):
    env = make(path(attr), seed=7)
    assert env.unwrapped.__class__ is OldGymAdapter
    assert env_spec(env) == EnvSpec(obs_shape=(2,), obs_dtype=np.dtype(np.float32), num_actions=2)
    obs, _ = env.reset()
    assert obs.dtype == np.float32
    np.testing.assert_array_equal(obs, [0.0, 7.0])  # stored seed used by the first reset
    infos, rewards = run_episode(env, [1, 0, 1, 1, 1])
    assert infos[-1]["episode"] == {"r": 4.0, "l": 5}


def test_make_uses_gymnasium_env_from_module_path_as_is():
    env = make("gymnasium.envs.classic_control.cartpole:CartPoleEnv")
    assert type(env.unwrapped).__name__ == "CartPoleEnv"
    assert env_spec(env).num_actions == 2


# --- Errors ---------------------------------------------------------------------------


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and message
    return message


def test_unknown_id_suggests_close_ids():
    with pytest.raises(EnvError) as err:
        make("PongNoFrameskp-v4")
    message = assert_one_line(err)
    assert "unknown environment 'PongNoFrameskp-v4'" in message
    assert "'PongNoFrameskip-v4'" in message
    assert err.value.__suppress_context__  # no chained gymnasium traceback


def test_unknown_id_without_close_match():
    with pytest.raises(EnvError) as err:
        make("Zzzzzzzzzz-v0")
    assert "not a registered Gymnasium id" in assert_one_line(err)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("no_such_package.envs:MyEnv", "cannot import module 'no_such_package.envs'"),
        (path("NoSuchClass"), "has no attribute 'NoSuchClass'"),
        (path("needs_arguments"), "must be callable with no arguments"),
        (":MyEnv", "not a valid custom env path"),
    ],
)
def test_bad_module_paths(name, expected):
    with pytest.raises(EnvError) as err:
        make(name)
    assert expected in assert_one_line(err)


def test_box_action_space_gives_a_continuous_spec():
    spec = env_spec(make("Pendulum-v1"))
    assert spec.continuous and spec.num_actions == 0
    assert (spec.action_shape, spec.action_low, spec.action_high) == ((1,), (-2.0,), (2.0,))
    assert spec.action_field() == Field((1,), torch.float32)
    assert spec.describe_actions() == "Box(1) actions in [-2, 2]"
    assert not env_spec(make("CartPole-v1")).continuous
    # What an env is given: clipped to the bounds, as float32.
    clipped = spec.clip_actions(np.array([[-5.0], [0.5], [3.0]]))
    assert clipped.dtype == np.float32 and clipped[:, 0].tolist() == [-2.0, 0.5, 2.0]


@pytest.mark.parametrize(
    ("env_class", "expected"),
    [
        ("InfiniteBoxActionEnv", "has infinite bounds"),
        ("MatrixBoxActionEnv", "needs a 1-D vector of actions"),
        ("IntegerBoxActionEnv", "continuous actions are floats"),
    ],
)
def test_box_action_spaces_beast_cannot_use_are_refused(env_class, expected):
    with pytest.raises(EnvError) as err:
        env_spec(make(path(env_class)))
    assert expected in assert_one_line(err)


def test_nested_observations_get_one_field_per_leaf():
    env = make(path("NestedObsEnv"))
    spec = env_spec(env)
    assert spec.nested and spec.obs_shape is None
    # Depth first in the space's order (gymnasium sorts Dict keys); floats as float32.
    assert spec.obs_fields() == {
        "obs.arm[0]": Field((2,), torch.float32),
        "obs.arm[1].grip": Field((), torch.float32),
        "obs.image": Field((1, 4, 4), torch.uint8),
    }
    assert spec.model_obs_shape() == {"arm": ((2,), {"grip": ()}), "image": (1, 4, 4)}
    assert spec.has_images()
    assert spec.describe_obs() == (
        "obs.arm[0] (2,) float32, obs.arm[1].grip () float32, obs.image (1, 4, 4) uint8"
    )
    obs, _ = env.reset()
    leaves = spec.split_obs(obs)
    assert list(leaves) == list(spec.obs_fields())
    assert leaves["obs.arm[1].grip"] == 0.5 and leaves["obs.image"] is obs["image"]
    with pytest.raises(EnvError) as err:
        spec.split_obs({"image": obs["image"]})
    assert "without its leaf obs.arm[0]" in assert_one_line(err)


def test_box_observations_keep_their_one_field():
    spec = env_spec(make("CartPole-v1"))
    assert not spec.nested
    assert spec.obs_fields() == {"obs": Field((4,), torch.float32)}
    assert spec.model_obs_shape() == (4,) and not spec.has_images()
    assert spec.describe_obs() == "(4,) float32"


@pytest.mark.parametrize("case", sorted(UNSTORABLE_OBS))
def test_observations_beast_cannot_store_are_refused(case):
    with pytest.raises(EnvError) as err:
        env_spec(make_unstorable_obs_env(case))
    message = assert_one_line(err)
    assert UNSTORABLE_OBS[case][1] in message and "obs" in message


def test_dict_envs_are_registered_with_their_family():
    from beast.envs import env_family

    cartpole = env_spec(make("DictCartPole-v1"))
    assert cartpole.obs_fields() == {
        "obs.position": Field((2,), torch.float32),
        "obs.velocity": Field((2,), torch.float32),
    }
    pendulum = env_spec(make("DictPendulum-v1"))
    assert pendulum.continuous and list(pendulum.obs_fields()) == ["obs.angle", "obs.velocity"]
    grid = env_spec(make("DictGridTarget-v0"))
    assert grid.obs_fields()["obs.image"] == Field((1, 16, 16), torch.uint8)
    assert (env_family("DictCartPole-v1"), env_family("DictPendulum-v1")) == ("classic",) * 2
    assert env_family("DictGridTarget-v0") is None
    # The same dynamics as CartPole-v1: its observation, split.
    box, split = make("CartPole-v1", seed=3), make("DictCartPole-v1", seed=3)
    x, d = box.reset()[0], split.reset()[0]
    for step in range(20):
        assert np.array_equal(x[[0, 2]], d["position"]) and np.array_equal(x[[1, 3]], d["velocity"])
        x, d = box.step(step % 2)[0], split.step(step % 2)[0]


def test_episodic_life_needs_atari():
    with pytest.raises(EnvError) as err:
        make("CartPole-v1", episodic_life=True)
    assert "only applies to Atari" in assert_one_line(err)


@pytest.mark.parametrize(
    "name, family",
    [
        ("PongNoFrameskip-v4", "atari"),
        ("ALE/Breakout-v5", "atari"),
        ("CartPole-v1", "classic"),
        ("Acrobot-v1", "classic"),
        ("MaskedCartPole-v1", "classic"),  # beast's CartPole without velocities
        ("HalfCheetah-v5", "mujoco"),
        ("Hopper-v5", "mujoco"),
        ("LunarLander-v3", None),  # not tuned: no family config
        ("tests.envs.test_envs:OldStyleEnv", None),
        ("NoSuchEnv-v0", None),
    ],
)
def test_env_family_picks_the_tuned_config_family(name, family):
    from beast.envs import env_family

    assert env_family(name) == family


IMAGE = (4, 84, 84)


@pytest.mark.parametrize(
    "spec, family, words",
    [
        (EnvSpec(IMAGE, np.dtype(np.uint8), 6), "atari", "image observations, Discrete actions"),
        (
            EnvSpec((4,), np.dtype(np.float32), 2),
            "classic",
            "vector observations, Discrete actions",
        ),
        (
            EnvSpec((3,), np.dtype(np.float32), 0, (1,), (-2.0,), (2.0,)),
            "mujoco",
            "vector observations, Box actions",
        ),
        (
            EnvSpec(IMAGE, np.dtype(np.uint8), 0, (2,), (-1.0,) * 2, (1.0,) * 2),
            "atari",  # images first, whatever the actions
            "image observations, Box actions",
        ),
        (
            EnvSpec(None, None, 2, nested_obs=(("obs.x", Field((2,), torch.float32)),)),
            "classic",
            "nested vector observations, Discrete actions",
        ),
        # No family's model fits: an image in a Dict, a 2-D Box.
        (
            EnvSpec(None, None, 2, nested_obs=(("obs.image", Field(IMAGE, torch.uint8)),)),
            None,
            "observations (obs.image (4, 84, 84) uint8), Discrete actions",
        ),
        (
            EnvSpec((5, 5), np.dtype(np.float32), 2),
            None,
            "observations ((5, 5) float32), Discrete actions",
        ),
    ],
)
def test_spaces_family_picks_by_observations_then_actions(spec, family, words):
    from beast.envs import spaces_family

    assert spaces_family(spec) == (family, words)


def test_probe_spec_reads_an_envs_spaces():
    from beast.envs import probe_spec

    assert probe_spec("tests.envs.test_envs:CountdownEnv") == EnvSpec((1,), np.dtype(np.float32), 3)
    with pytest.raises(EnvError, match="unknown environment"):
        probe_spec("NoSuchEnv-v0")
