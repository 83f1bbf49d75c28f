"""Contract of beast.envs.batch: the loop and ale_vector backends and their equivalence.

The contract (both backends): arrays obs [K, *obs_shape], reward f32, done, terminated
and truncated bool, episode_end bool, episode_return f32, episode_step i32, updated in
place; `done` starts True; a termination resets in the same step (the obs returned with
`terminated` and `done` is the next episode's first), a truncation in the next (the obs
returned with `truncated` is the episode's final one, and the next step returns the
reset obs with `done`, ignoring the action); episode statistics are set on the step a
real episode ends and kept until the next; episodic life ends the agent's episode at a
lost life without ending the game. The ale_vector tests compare it with the
loop backend frame for frame where both are deterministic (no-op starts off, no sticky
actions) and by statistics where they are not; they are skipped when the installed
ale-py has no AtariVectorEnv.
"""

from __future__ import annotations

import os

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from beast.envs import EnvError, factory
from beast.envs import batch as env_batch
from beast.envs.batch import (
    AleVectorEnvBatch,
    LoopEnvBatch,
    ale_vector_supports,
    make_env_batch,
)
from tests.support.env_batches import outputs, play_games, random_actions, register_atari, step_both

requires_ale_vector = pytest.mark.skipif(
    env_batch.AtariVectorEnv is None, reason="the installed ale-py has no AtariVectorEnv"
)
try:
    import envpool
except ImportError:
    envpool = None
requires_envpool = pytest.mark.skipif(envpool is None, reason="envpool is not installed")

# --- Hand-written environments -------------------------------------------------------


class CountdownEnv(gymnasium.Env):
    """Rewards 1, 2, 3 then terminates; observation [t] (0 after reset)."""

    length = 3

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t], dtype=np.float32)
        return obs, float(self.t), self.t >= self.length, False, {}


class TimeLimitedEnv(CountdownEnv):
    """Rewards 1, 2, 3, then a time limit cuts the episode (truncated, not terminated)."""

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, False, terminated, info


class NanRewardEnv(CountdownEnv):
    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, float("nan"), terminated, truncated, info


class WrongShapeEnv(CountdownEnv):
    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return np.zeros(2, dtype=np.float32), reward, terminated, truncated, info


class DictTimeLimitedEnv(TimeLimitedEnv):
    """TimeLimitedEnv observing {"count": float64 [t], "frame": uint8 [1, 2, 2] of t}."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict(
            {
                "count": spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float64),
                "frame": spaces.Box(0, 255, shape=(1, 2, 2), dtype=np.uint8),
            }
        )

    def _split(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {"count": obs.astype(np.float64), "frame": np.full((1, 2, 2), obs[0], np.uint8)}

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return self._split(obs), info

    def step(self, action):
        obs, *rest = super().step(action)
        return self._split(obs), *rest


class DictWrongShapeEnv(DictTimeLimitedEnv):
    def step(self, action):
        obs, *rest = super().step(action)
        return {**obs, "frame": np.zeros((2, 2), np.uint8)}, *rest


def path(name: str) -> str:
    return f"{__name__}:{name}"


# --- The contract, on the loop backend --------------------------------------------------


def test_arrays_shapes_dtypes_and_first_state():
    with make_env_batch(path("CountdownEnv"), 3, 0, False) as batch:
        assert isinstance(batch, LoopEnvBatch)
        assert batch.obs_shape == (1,) and batch.num_envs == 3
        assert batch.spec.num_actions == 2
        expected = {
            "obs": ((3, 1), np.float32),
            "reward": ((3,), np.float32),
            "done": ((3,), np.bool_),
            "terminated": ((3,), np.bool_),
            "truncated": ((3,), np.bool_),
            "episode_end": ((3,), np.bool_),
            "episode_return": ((3,), np.float32),
            "episode_step": ((3,), np.int32),
        }
        for name, (shape, dtype) in expected.items():
            array = getattr(batch, name)
            assert (array.shape, array.dtype) == (shape, dtype), name
        # The first observation starts an episode.
        assert batch.done.all() and not batch.episode_end.any()
        assert not batch.terminated.any() and not batch.truncated.any()


def test_done_step_returns_next_episodes_first_obs_and_its_own_reward():
    with make_env_batch(path("CountdownEnv"), 2, 0, False) as batch:
        seen = []
        for _ in range(4):
            batch.step(np.zeros(2, dtype=np.int64))
            seen.append(outputs(batch))
        assert [s["reward"][0] for s in seen] == [1.0, 2.0, 3.0, 1.0]
        assert [bool(s["done"][0]) for s in seen] == [False, False, True, False]
        assert [bool(s["terminated"][0]) for s in seen] == [False, False, True, False]
        assert not any(s["truncated"].any() for s in seen)
        # Step 3 ends the episode: its obs is already the reset obs [0].
        assert [float(s["obs"][0, 0]) for s in seen] == [1.0, 2.0, 0.0, 1.0]
        assert [bool(s["episode_end"][0]) for s in seen] == [False, False, True, False]
        # The episode's statistics are set on its last step and kept afterwards.
        assert seen[2]["episode_return"][0] == 6.0 and seen[2]["episode_step"][0] == 3
        assert seen[3]["episode_return"][0] == 6.0 and seen[3]["episode_step"][0] == 3


def test_truncation_returns_the_final_obs_then_resets_at_the_next_step():
    """A time limit's last step keeps the final observation (targets bootstrap from it);
    the step after it resets the env, whatever the action, with reward 0 and `done`."""
    with make_env_batch(path("TimeLimitedEnv"), 2, 0, False) as batch:
        seen = []
        for _ in range(6):
            batch.step(np.ones(2, dtype=np.int64))
            seen.append(outputs(batch))
        assert [float(s["obs"][0, 0]) for s in seen] == [1.0, 2.0, 3.0, 0.0, 1.0, 2.0]
        assert [s["reward"][0] for s in seen] == [1.0, 2.0, 3.0, 0.0, 1.0, 2.0]
        assert [bool(s["truncated"][0]) for s in seen] == [False, False, True, False, False, False]
        assert [bool(s["done"][0]) for s in seen] == [False, False, False, True, False, False]
        assert not any(s["terminated"].any() for s in seen)
        # The statistics arrive with the final observation, the episode's last step.
        assert [bool(s["episode_end"][0]) for s in seen] == [False, False, True] + [False] * 3
        assert seen[2]["episode_return"][0] == 6.0 and seen[2]["episode_step"][0] == 3


def test_dict_observations_fill_one_array_per_leaf():
    """A Dict's leaves each get their [K, ...] array (float leaves as float32), and a
    truncation's final observation and the reset after it reach every leaf."""
    with make_env_batch(path("DictTimeLimitedEnv"), 2, 0, False) as batch:
        assert batch.obs is None and batch.obs_shape is None
        arrays = batch.obs_arrays
        assert {key: (a.shape, a.dtype) for key, a in arrays.items()} == {
            "obs.count": ((2, 1), np.float32),
            "obs.frame": ((2, 1, 2, 2), np.uint8),
        }
        ids = {key: id(a) for key, a in arrays.items()}
        counts, frames = [], []
        for _ in range(5):
            batch.step(np.ones(2, dtype=np.int64))
            counts.append(float(arrays["obs.count"][1, 0]))
            frames.append(arrays["obs.frame"][1].copy())
        assert counts == [1.0, 2.0, 3.0, 0.0, 1.0]  # the final observation, then the reset
        assert [int(f.min()) for f in frames] == [int(f.max()) for f in frames] == [1, 2, 3, 0, 1]
        assert {key: id(a) for key, a in batch.obs_arrays.items()} == ids


def test_a_dict_leaf_of_the_wrong_shape_is_named():
    with (
        make_env_batch(path("DictWrongShapeEnv"), 2, 0, False) as batch,
        pytest.raises(ValueError, match=r"leaf obs\.frame of shape \(2, 2\) from step"),
    ):
        batch.step(np.ones(2, dtype=np.int64))


def test_arrays_are_updated_in_place():
    """Actors keep torch.from_numpy views of the arrays, so `step` must not rebind them."""
    with make_env_batch(path("CountdownEnv"), 2, 0, False) as batch:
        before = outputs(batch)
        ids = {name: id(getattr(batch, name)) for name in before}
        batch.step(np.ones(2, dtype=np.int64))
        assert {name: id(getattr(batch, name)) for name in before} == ids


@pytest.mark.parametrize("episodic_life", [False, True])
def test_loop_batch_stacks_atari_frames_in_its_rows_as_make_stacks_them(episodic_life):
    """The loop batch has each Atari env's frame stack live in the env's row of `obs`
    (no copy per step); what it shows must be what `make`'s envs return, which still
    hand out fresh arrays."""
    name, k = "PongNoFrameskip-v4", 2
    rng = np.random.default_rng(0)
    with make_env_batch(name, k, 5, episodic_life, backend="loop") as batch:
        address = batch.obs.ctypes.data
        references = [factory.make(name, seed=5 + i, episodic_life=episodic_life) for i in range(k)]
        expected = [env.reset()[0] for env in references]
        for step in range(250):
            for i in range(k):
                np.testing.assert_array_equal(batch.obs[i], expected[i], err_msg=f"step {step}")
            actions = rng.integers(6, size=k)
            batch.step(actions)
            for i, env in enumerate(references):
                previous = expected[i]
                expected[i], reward, terminated, truncated, _ = env.step(int(actions[i]))
                assert not np.shares_memory(previous, expected[i])
                assert batch.reward[i] == reward
                if terminated or truncated:
                    expected[i] = env.reset()[0]
        assert batch.obs.ctypes.data == address
        for env in references:
            env.close()


def test_non_finite_reward_names_the_env():
    with (
        make_env_batch(path("NanRewardEnv"), 2, 0, False) as batch,
        pytest.raises(ValueError, match="NanRewardEnv.*non-finite reward"),
    ):
        batch.step(np.zeros(2, dtype=np.int64))


def test_wrong_observation_shape_names_the_env():
    with (
        make_env_batch(path("WrongShapeEnv"), 2, 0, False) as batch,
        pytest.raises(ValueError, match=r"WrongShapeEnv.*shape \(2,\) from step"),
    ):
        batch.step(np.zeros(2, dtype=np.int64))


def test_actions_must_be_k_integers():
    with make_env_batch(path("CountdownEnv"), 2, 0, False) as batch:
        batch.step(np.zeros((1, 2), dtype=np.int64))  # time-major [T=1, K] is fine
        with pytest.raises(ValueError, match="expected 2 integer actions"):
            batch.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(ValueError, match="expected 2 integer actions"):
            batch.step(np.zeros(2, dtype=np.float32))


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown env batch backend"):
        make_env_batch("CartPole-v1", 2, 0, False, backend="threads")
    with pytest.raises(ValueError, match="num_envs"):
        make_env_batch("CartPole-v1", 0, 0, False)
    with pytest.raises(EnvError, match="episodic_life"):
        make_env_batch("CartPole-v1", 2, 0, True)


class CloseCountingEnv(CountdownEnv):
    """Counts the close() calls its instances get."""

    closes = 0

    def close(self):
        type(self).closes += 1
        super().close()


def test_close_is_idempotent():
    batch = make_env_batch(path("CloseCountingEnv"), 2, 0, False)
    before = CloseCountingEnv.closes  # the batch may have probed a spec with one
    batch.close()
    assert CloseCountingEnv.closes - before == 2  # each env closed
    batch.close()
    assert CloseCountingEnv.closes - before == 2  # and not again


# --- Backend choice ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, supported",
    [
        ("PongNoFrameskip-v4", True),
        ("Pong-v4", True),
        ("ALE/Breakout-v5", True),
        ("CartPole-v1", False),
        (path("CountdownEnv"), False),
        ("NoSuchEnv-v0", False),
    ],
)
def test_ale_vector_supports_registered_pixel_atari_ids(name, supported):
    assert ale_vector_supports(name) is (supported and env_batch.AtariVectorEnv is not None)


@pytest.mark.parametrize("name", ["CartPole-v1", path("CountdownEnv")])
def test_non_atari_envs_always_use_the_loop(monkeypatch, name):
    monkeypatch.setattr(env_batch, "AUTO_PREFERS_ALE_VECTOR", True)
    with make_env_batch(name, 2, 0, False) as batch:
        assert isinstance(batch, LoopEnvBatch)
    with pytest.raises(EnvError, match="ale_vector env backend cannot run"):
        make_env_batch(name, 2, 0, False, backend="ale_vector")


@pytest.mark.parametrize("prefers", [True, False])
def test_auto_follows_the_measured_preference_for_atari(monkeypatch, prefers):
    monkeypatch.setattr(env_batch, "AUTO_PREFERS_ALE_VECTOR", prefers)
    with make_env_batch("PongNoFrameskip-v4", 2, 0, False) as batch:
        use_ale = prefers and env_batch.AtariVectorEnv is not None
        assert isinstance(batch, AleVectorEnvBatch if use_ale else LoopEnvBatch)


def test_without_atari_vector_env_auto_falls_back_to_the_loop(monkeypatch):
    monkeypatch.setattr(env_batch, "AUTO_PREFERS_ALE_VECTOR", True)
    monkeypatch.setattr(env_batch, "AtariVectorEnv", None)
    with make_env_batch("PongNoFrameskip-v4", 2, 0, False) as batch:
        assert isinstance(batch, LoopEnvBatch)
    with pytest.raises(EnvError, match="no AtariVectorEnv"):
        make_env_batch("PongNoFrameskip-v4", 2, 0, False, backend="ale_vector")


@requires_ale_vector
@pytest.mark.parametrize("override", [{"mode": 1}, {"difficulty": 1}, {"obs_type": "ram"}])
def test_ids_the_vector_env_cannot_reproduce_use_the_loop(monkeypatch, register_id, override):
    monkeypatch.setattr(env_batch, "AUTO_PREFERS_ALE_VECTOR", True)
    env_id = register_atari(register_id, "BeastTest/PongVariant-v0", "pong", **override)
    assert not ale_vector_supports(env_id)
    with make_env_batch(env_id, 1, 0, False) as batch:
        assert isinstance(batch, LoopEnvBatch)
    with pytest.raises(EnvError, match="ale_vector env backend cannot run"):
        make_env_batch(env_id, 1, 0, False, backend="ale_vector")


# --- ale_vector against the loop ----------------------------------------------------------


@requires_ale_vector
@pytest.mark.parametrize("name", ["PongNoFrameskip-v4", "ALE/Breakout-v5", "full action space"])
def test_specs_match_the_loop(register_id, name):
    if name == "full action space":
        name = register_atari(register_id, "BeastTest/PongFull-v0", "pong", full_action_space=True)
    with (
        make_env_batch(name, 2, 0, False, backend="loop") as loop,
        make_env_batch(name, 2, 0, False, backend="ale_vector") as ale,
    ):
        assert ale.spec == loop.spec
        assert ale.obs_shape == loop.obs_shape == (4, 84, 84)
        for array in ("obs", "reward", "done", "episode_end", "episode_return", "episode_step"):
            mine, theirs = getattr(ale, array), getattr(loop, array)
            assert (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype), array
        assert ale.done.all() and not ale.episode_end.any()


@requires_ale_vector
@pytest.mark.parametrize(
    "name, steps", [("BreakoutNoFrameskip-v4", 460), ("PongNoFrameskip-v4", 860)]
)
def test_same_frames_rewards_and_episodes_as_the_loop(monkeypatch, name, steps):
    """No-op starts and sticky actions off: the emulators play identical games.

    Exact equality, pixels included: both read the ALE's grayscale palette, max-pool
    the same two frames and resize with OpenCV's INTER_AREA; the padding of the stack
    after a reset is replaced by copies of the first frame, as in beast's FrameStack.
    The step counts reach at least one game over per env with these actions.
    """
    monkeypatch.setattr(factory, "NOOP_MAX", 0)
    with (
        make_env_batch(name, 2, 0, False, backend="loop") as loop,
        make_env_batch(name, 2, 0, False, backend="ale_vector") as ale,
    ):
        np.testing.assert_array_equal(ale.obs, loop.obs)
        actions = random_actions(loop.spec.num_actions, 2, steps)
        history = step_both(loop, ale, actions)
    for t, (expected, actual) in enumerate(history):
        for array, value in expected.items():
            np.testing.assert_array_equal(actual[array], value, err_msg=f"{array} at step {t}")
    episode_ends = np.array([expected["episode_end"] for expected, _ in history])
    assert episode_ends.any(axis=0).all(), "every env should finish a game in this test"


@requires_ale_vector
@pytest.mark.parametrize("limit", ["frames", "agent steps"])
def test_truncation_matches_the_loop(monkeypatch, register_id, limit):
    """A frame limit (the ALE's) and a TimeLimit (agent steps) both end a real episode."""
    monkeypatch.setattr(factory, "NOOP_MAX", 0)
    if limit == "frames":  # 100 frames: 25 agent steps
        env_id = register_atari(
            register_id, "BeastTest/PongShort-v0", "pong", max_num_frames_per_episode=100
        )
    else:
        env_id = register_atari(register_id, "BeastTest/PongSteps-v0", "pong", max_episode_steps=10)
    length = 25 if limit == "frames" else 10
    with (
        make_env_batch(env_id, 2, 0, False, backend="loop") as loop,
        make_env_batch(env_id, 2, 0, False, backend="ale_vector") as ale,
    ):
        history = step_both(loop, ale, random_actions(loop.spec.num_actions, 2, length + 1))
    # Identical up to the truncated step. There, the newest frame of the ALE's final_obs
    # differs from the loop's in a few pixels (41 and 29 of 7,056 when measured: the ALE
    # seems to return the final frame without max-pooling); the older three match.
    for t, (expected, actual) in enumerate(history[:length]):
        final = t == length - 1
        for array, value in expected.items():
            got, want = actual[array], value
            if final and array == "obs":
                assert (got[:, -1] != want[:, -1]).mean() < 0.01
                got, want = got[:, :-1], want[:, :-1]
            np.testing.assert_array_equal(got, want, err_msg=f"{array} at step {t}")
        ended = t == length - 1
        assert actual["truncated"].all() == ended and actual["episode_end"].all() == ended
        assert not actual["done"].any() and not actual["terminated"].any()
    assert history[length - 1][1]["episode_step"].tolist() == [length, length]
    # Then both start a new episode; the ALE's is one step in (it reset at the truncation
    # and cannot hold one env back), so only the flags agree.
    for outputs_after in history[length]:
        assert outputs_after["done"].all() and not outputs_after["truncated"].any()


@requires_ale_vector
def test_episodic_life_matches_the_loop_up_to_the_first_lost_life(monkeypatch):
    """Identical until a life is lost; then the loop's soft reset plays a 4-frame no-op
    that the vector env cannot, so the games drift apart. At that step both report
    `done` without `episode_end` and restart the frame stack from one frame."""
    monkeypatch.setattr(factory, "NOOP_MAX", 0)
    with (
        make_env_batch("BreakoutNoFrameskip-v4", 1, 0, True, backend="loop") as loop,
        make_env_batch("BreakoutNoFrameskip-v4", 1, 0, True, backend="ale_vector") as ale,
    ):
        rng = np.random.default_rng(1)
        for t in range(1000):
            actions = rng.integers(loop.spec.num_actions, size=1)
            loop.step(actions)
            ale.step(actions)
            for array in ("reward", "done", "episode_end"):
                np.testing.assert_array_equal(getattr(ale, array), getattr(loop, array))
            if loop.done[0]:
                break
            np.testing.assert_array_equal(ale.obs, loop.obs, err_msg=f"obs at step {t}")
        assert loop.done[0] and not loop.episode_end[0], "a life should be lost first"
        for batch in (loop, ale):
            frames = batch.obs[0]
            assert all(np.array_equal(frames[i], frames[-1]) for i in range(3))


@requires_ale_vector
@pytest.mark.parametrize("backend", ["loop", "ale_vector"])
def test_episodic_life_ends_agent_episodes_at_each_life_and_reports_whole_games(
    monkeypatch, backend
):
    """Breakout has 5 lives: 5 `done`s per game, one `episode_end`, whole-game stats.

    The statistics cover whole games (every step's reward and every agent step since
    the game started); the loop's soft-reset no-ops are game time but not agent steps,
    and score nothing in Breakout (the ball is not in play), so both sums are exact.
    """
    monkeypatch.setattr(factory, "NOOP_MAX", 0)
    with make_env_batch("BreakoutNoFrameskip-v4", 2, 0, True, backend=backend) as batch:
        records = play_games(batch, games=2)
    for record in records:
        assert record["dones"] == 5
        assert record["episode_return"] == record["reward_sum"]
        assert record["episode_step"] == record["steps"]


@requires_ale_vector
def test_statistics_match_the_loop_with_no_op_starts_and_sticky_actions():
    """ALE/Breakout-v5 as configured (sticky actions 0.25, no-op starts): no frame-exact
    comparison is possible (different RNGs), so compare random-play statistics.

    8 envs, one game each, per backend. Random-play Breakout: return sd ~1.3 and length
    sd ~45 agent steps per game, so the difference of two 8-game means has sd ~0.65 and
    ~23; the bounds are about 2.5 and 3 of those. Seeded, so the outcome is fixed.
    """
    means = {}
    for backend in ("loop", "ale_vector"):
        with make_env_batch("ALE/Breakout-v5", 8, 0, False, backend=backend) as batch:
            returns, lengths = [None] * 8, [None] * 8
            rng = np.random.default_rng(5)
            while any(r is None for r in returns):
                batch.step(rng.integers(batch.spec.num_actions, size=8))
                for i in np.flatnonzero(batch.episode_end):
                    if returns[i] is None:
                        returns[i] = float(batch.episode_return[i])
                        lengths[i] = int(batch.episode_step[i])
            means[backend] = (np.mean(returns), np.mean(lengths))
    assert abs(means["loop"][0] - means["ale_vector"][0]) < 1.6, means
    assert abs(means["loop"][1] - means["ale_vector"][1]) < 70, means


@requires_ale_vector
def test_same_seed_same_trajectory_and_large_seeds_fold():
    """Sticky actions and no-op starts on: only the seeds make two runs agree. Seeds
    beyond the ALE's C int range are folded into it rather than refused."""
    actions = random_actions(6, 2, 50)
    runs = []
    for first_seed in (2**40, 2**40, 1):
        with make_env_batch("ALE/Pong-v5", 2, first_seed, False, backend="ale_vector") as b:
            frames = [b.obs.copy()]
            for row in actions:
                b.step(row)
                frames.append(b.obs.copy())
            runs.append(np.stack(frames))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2]), "another seed should play another game"


# The C++ backends, and the threads each starts with num_threads=2 (EnvPool: one more).
CPP_BACKENDS = [
    pytest.param("ale_vector", 2, marks=requires_ale_vector),
    pytest.param("envpool", 3, marks=requires_envpool),
]


@pytest.mark.parametrize("backend, threads_started", CPP_BACKENDS)
def test_out_of_range_actions_raise_instead_of_hanging_or_crashing(backend, threads_started):
    """The ALE vector env's worker would skip a bad action and never answer; EnvPool's
    would read past its action set."""
    with make_env_batch("PongNoFrameskip-v4", 2, 0, False, backend=backend) as batch:
        with pytest.raises(ValueError, match=r"must be in 0\.\.5"):
            batch.step(np.array([0, 6]))
        with pytest.raises(ValueError, match=r"must be in 0\.\.5"):
            batch.step(np.array([-1, 0]))
        batch.step(np.array([5, 0]))


@pytest.mark.parametrize("backend, threads_started", CPP_BACKENDS)
def test_arrays_are_updated_in_place_and_close_stops_the_threads(backend, threads_started):
    threads = len(os.listdir("/proc/self/task"))
    batch = make_env_batch("PongNoFrameskip-v4", 4, 0, False, backend=backend, num_threads=2)
    assert len(os.listdir("/proc/self/task")) == threads + threads_started
    ids = {name: id(getattr(batch, name)) for name in outputs(batch)}
    batch.step(np.zeros(4, dtype=np.int32))
    assert {name: id(getattr(batch, name)) for name in ids} == ids
    batch.close()
    batch.close()
    assert len(os.listdir("/proc/self/task")) == threads
