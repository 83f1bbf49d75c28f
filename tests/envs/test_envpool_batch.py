"""Contract of the "envpool" env batch backend (beast/envs/envpool_batch.py).

Against beast's own pipeline: Atari frames, rewards, flags and episode statistics equal
the loop backend's pixel for pixel and step for step wherever both are deterministic
(one no-op start, no sticky actions), episodic life and time limits included; MuJoCo
dynamics equal Gymnasium's from a shared state. Then the EnvBatch contract at
terminations and truncations, seeds, and the user-facing paths: an unsupported env, a
missing EnvPool (one line, exit 2 from monobeast.py) and a short monobeast run.

Everything that needs EnvPool is skipped without it (it is the `envpool` extra, not part
of `test`: about 740 MB installed, for an optional backend).
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from beast.envs import EnvError, envpool_batch, factory
from beast.envs import batch as env_batch
from beast.envs.batch import EnvBatch, check_backend, make_env_batch, resolve_backend
from tests.support.env_batches import (
    outputs,
    play_games,
    random_actions,
    register_atari,
    step_both,
)
from tests.support.runs import (
    ROOT,
    assert_refused_in_one_line,
    read_csv,
    run,
    shm_entries,
    wait_until_gone,
)

try:
    import envpool
except ImportError:
    envpool = None

requires_envpool = pytest.mark.skipif(envpool is None, reason="envpool is not installed")


def both(name: str, num_envs: int, episodic_life: bool = False) -> tuple[EnvBatch, EnvBatch]:
    """A loop batch and an envpool batch of `name`, seeded alike."""
    loop = make_env_batch(name, num_envs, 0, episodic_life, backend="loop")
    try:
        pool = make_env_batch(name, num_envs, 0, episodic_life, backend="envpool")
    except BaseException:
        loop.close()
        raise
    return loop, pool


def assert_same_history(history) -> None:
    for t, (expected, actual) in enumerate(history):
        for array, value in expected.items():
            np.testing.assert_array_equal(actual[array], value, err_msg=f"{array} at step {t}")


@pytest.fixture
def one_noop(monkeypatch):
    """One no-op frame at every reset, in both backends: EnvPool cannot have none (it
    crashes on noop_max=0) and beast draws 1..NOOP_MAX, so 1 makes both deterministic."""
    monkeypatch.setattr(factory, "NOOP_MAX", 1)


# --- Which envs, and the user-facing errors --------------------------------------------


# An id EnvPool runs is said supported only where EnvPool imports; an id it cannot run is
# refused before EnvPool is imported, so those cases run without it.
@pytest.mark.parametrize(
    "name, supported",
    [
        pytest.param("PongNoFrameskip-v4", True, marks=requires_envpool),
        pytest.param("Pong-v4", True, marks=requires_envpool),
        pytest.param("ALE/Breakout-v5", True, marks=requires_envpool),
        pytest.param("HalfCheetah-v5", True, marks=requires_envpool),
        pytest.param("Humanoid-v5", True, marks=requires_envpool),
        ("HalfCheetah-v4", False),  # EnvPool has a v4, but only v5 is checked here
        ("InvertedPendulum-v5", False),
        ("CartPole-v1", False),
        ("tests.envs.test_env_batch:CountdownEnv", False),
    ],
)
def test_supported_ids(name, supported):
    assert envpool_batch.envpool_supports(name) is supported
    if not supported:
        with pytest.raises(EnvError, match="envpool env backend cannot run this env"):
            check_backend(name, "envpool")


@pytest.mark.parametrize("override", [{"mode": 1}, {"difficulty": 1}, {"obs_type": "ram"}])
def test_atari_variants_it_cannot_reproduce_are_refused(register_id, override):
    env_id = register_atari(register_id, "BeastTest/PongVariant-v0", "pong", **override)
    assert not envpool_batch.envpool_supports(env_id)


def test_mujoco_ids_with_other_arguments_are_refused(register_id):
    env_id = register_id(
        "BeastTest/HeavyCheetah-v5",
        entry_point="gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv",
        kwargs={"ctrl_cost_weight": 1.0},
    )
    assert "ctrl_cost_weight" in envpool_batch.envpool_support(env_id)


@requires_envpool
def test_episodic_life_is_refused_outside_atari():
    with pytest.raises(EnvError, match="episodic_life=True only applies to Atari"):
        make_env_batch("HalfCheetah-v5", 1, 0, True, backend="envpool")


def test_auto_picks_envpool_for_mujoco_from_8_envs():
    """The measured rule (beast/envs/batch.py, AUTO_ENVPOOL_MIN_ENVS): EnvPool for MuJoCo
    batches of 8 envs or more, where it was faster per CPU-second; never for Atari,
    where it was slower; never without EnvPool."""
    cheetah = "envpool" if envpool is not None else "loop"
    assert resolve_backend("HalfCheetah-v5", "auto", 8) == cheetah
    assert resolve_backend("HalfCheetah-v5", "auto", 4) == "loop"
    assert resolve_backend("PongNoFrameskip-v4", "auto", 64) == "loop"
    assert resolve_backend("CartPole-v1", "auto", 64) == "loop"


def test_auto_follows_the_table_per_family(monkeypatch):
    monkeypatch.setattr(env_batch, "AUTO_PREFERS_ALE_VECTOR", False)
    monkeypatch.setattr(env_batch, "AUTO_ENVPOOL_MIN_ENVS", {"atari": 4, "mujoco": 2})
    use_envpool = "envpool" if envpool is not None else "loop"
    for name, fewest in (("PongNoFrameskip-v4", 4), ("HalfCheetah-v5", 2)):
        assert resolve_backend(name, "auto", fewest) == use_envpool
        assert resolve_backend(name, "auto", fewest - 1) == "loop"
    assert resolve_backend("CartPole-v1", "auto", 64) == "loop"


def test_without_envpool_auto_uses_the_loop_and_envpool_says_how_to_install(monkeypatch):
    monkeypatch.setattr(env_batch, "AUTO_ENVPOOL_MIN_ENVS", {"atari": 1, "mujoco": 1})
    missing = "the envpool env backend needs EnvPool, which cannot be imported (...): pip"
    monkeypatch.setattr(envpool_batch, "_import_envpool", lambda: missing)
    assert resolve_backend("PongNoFrameskip-v4", "auto", 8) == "loop"
    with pytest.raises(EnvError, match="needs EnvPool.*pip"):
        make_env_batch("PongNoFrameskip-v4", 1, 0, False, backend="envpool")


def test_monobeast_without_envpool_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """EnvPool missing: an `envpool` package on PYTHONPATH that fails to import as a
    missing one does stands in for it, whether or not the real one is installed."""
    shadow = tmp_path / "shadow" / "envpool"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'envpool'\", name='envpool')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow.parent), ROOT]))
    argv = ["--env", "PongNoFrameskip-v4", "--env_backend", "envpool"]
    assert_refused_in_one_line(tmp_path, argv, "pip install envpool", process=True)


def test_monobeast_refuses_an_env_envpool_cannot_run(tmp_path):
    argv = ["--env", "CartPole-v1", "--env_backend", "envpool"]
    assert_refused_in_one_line(tmp_path, argv, "envpool env backend cannot run this env")


# --- Atari against the loop --------------------------------------------------------------


@requires_envpool
@pytest.mark.parametrize("name", ["PongNoFrameskip-v4", "ALE/Breakout-v5", "full action space"])
def test_specs_match_the_loop(register_id, name):
    if name == "full action space":
        name = register_atari(register_id, "BeastTest/PongFull-v0", "pong", full_action_space=True)
    loop, pool = both(name, 2)
    with loop, pool:
        assert pool.spec == loop.spec
        for array, value in outputs(loop).items():
            mine = getattr(pool, array)
            assert (mine.shape, mine.dtype) == (value.shape, value.dtype), array
        assert pool.done.all() and not pool.episode_end.any()


@requires_envpool
@pytest.mark.parametrize(
    "name, steps", [("BreakoutNoFrameskip-v4", 460), ("PongNoFrameskip-v4", 920)]
)
def test_same_frames_rewards_and_episodes_as_the_loop(one_noop, name, steps):
    """Exact equality, pixels included: the same ALE palette, max-pool and INTER_AREA
    resize in C++. A game over resets in the same step in both (EnvPool's terminal frame
    is replaced by the next game's first); the step counts reach one per env."""
    loop, pool = both(name, 2)
    with loop, pool:
        np.testing.assert_array_equal(pool.obs, loop.obs)
        history = step_both(loop, pool, random_actions(loop.spec.num_actions, 2, steps))
    assert_same_history(history)
    episode_ends = np.array([expected["episode_end"] for expected, _ in history])
    assert episode_ends.any(axis=0).all(), "every env should finish a game in this test"


@requires_envpool
def test_episodic_life_plays_the_loops_games_exactly(one_noop):
    """Through every lost life (beast's soft reset: a 4-frame no-op whose frame starts the
    next agent episode, counted in the score, not in the steps) and game over: the same
    frames, flags and statistics as the loop's, step for step."""
    loop, pool = both("BreakoutNoFrameskip-v4", 2, episodic_life=True)
    with loop, pool:
        history = step_both(loop, pool, random_actions(4, 2, 1000))
    assert_same_history(history)
    lives_lost = sum(int((e["done"] & ~e["episode_end"]).sum()) for e, _ in history)
    games = sum(int(e["episode_end"].sum()) for e, _ in history)
    assert games >= 2 and lives_lost >= 4 * games, (games, lives_lost)


@requires_envpool
@pytest.mark.parametrize("limit", ["agent steps", "frames"])
def test_truncation_matches_the_loop(one_noop, register_id, limit):
    """A TimeLimit (agent steps) truncates both at the same step, and the rows that
    follow (the final observation, then the reset row with reward 0 and `done`) are
    identical. A frame limit (100 frames) too, but for the newest frame of the final
    observation: the loop's ALE counts the no-op frame and plays 3 frames in the last
    step, EnvPool counts agent steps after the no-op and plays 4."""
    if limit == "frames":
        env_id = register_atari(
            register_id, "BeastTest/PongShort-v0", "pong", max_num_frames_per_episode=100
        )
        length = 25
    else:
        env_id = register_atari(register_id, "BeastTest/PongSteps-v0", "pong", max_episode_steps=10)
        length = 10
    loop, pool = both(env_id, 2)
    with loop, pool:
        # Two episodes and their reset rows, and a few steps of the third.
        history = step_both(loop, pool, random_actions(6, 2, 2 * (length + 1) + 3))
    for t, (expected, actual) in enumerate(history):
        final = t % (length + 1) == length - 1
        for array, value in expected.items():
            got, want = actual[array], value
            if final and array == "obs" and limit == "frames":
                got, want = got[:, :-1], want[:, :-1]
            np.testing.assert_array_equal(got, want, err_msg=f"{array} at step {t}")
        reset_row = t % (length + 1) == length
        assert actual["truncated"].all() == final and actual["episode_end"].all() == final
        assert actual["done"].all() == reset_row and not actual["terminated"].any()
        if reset_row:
            assert not actual["reward"].any()
    assert history[length - 1][1]["episode_step"].tolist() == [length, length]


@requires_envpool
@pytest.mark.parametrize("episodic_life", [False, True])
def test_statistics_are_whole_games(episodic_life):
    """Breakout, default no-op starts: each game's reported return and length are the sum
    of its rows' rewards and its agent steps (the soft reset's no-op, with episodic life,
    scores nothing in Breakout: the ball is not in play). One `done` per life with
    episodic life (5 lives), one per game without."""
    with make_env_batch("BreakoutNoFrameskip-v4", 2, 0, episodic_life, backend="envpool") as b:
        records = play_games(b, games=2)
    for record in records:
        assert record["episode_return"] == record["reward_sum"]
        assert record["episode_step"] == record["steps"]
        assert record["dones"] == (5 if episodic_life else 1)


@requires_envpool
def test_terminated_rows_already_show_the_next_games_first_frame():
    """Beast's contract: the obs returned with `terminated` is the next episode's first
    (a fresh stack: four copies of one frame), the reward is the last step's own."""
    seen = 0
    with make_env_batch("BreakoutNoFrameskip-v4", 4, 1, False, backend="envpool") as batch:
        rng = np.random.default_rng(0)
        while seen < 4:
            batch.step(rng.integers(4, size=4))
            for i in np.flatnonzero(batch.terminated):
                assert batch.done[i] and batch.episode_end[i] and not batch.truncated[i]
                frames = batch.obs[i]
                assert all(np.array_equal(frames[j], frames[-1]) for j in range(3))
                seen += 1


@requires_envpool
def test_same_seed_same_games_env_i_seeded_with_first_seed_plus_i():
    """Sticky actions and no-op starts on (ALE/Pong-v5): only seeds make runs agree. Env 1
    of a batch seeded s plays as env 0 of one seeded s + 1; seeds past the C int range
    are folded into it."""
    actions = np.zeros((60, 2), dtype=np.int64)  # the same actions in every env

    def frames(first_seed: int, num_envs: int = 2) -> np.ndarray:
        with make_env_batch("ALE/Pong-v5", num_envs, first_seed, False, backend="envpool") as b:
            out = [b.obs.copy()]
            for row in actions[:, :num_envs]:
                b.step(row)
                out.append(b.obs.copy())
        return np.stack(out)

    big = 2**40
    first = frames(big)
    np.testing.assert_array_equal(first, frames(big))
    np.testing.assert_array_equal(first[:, 1], frames(big + 1, num_envs=1)[:, 0])
    assert not np.array_equal(first[:, 0], first[:, 1]), "another seed should play otherwise"


# --- MuJoCo ---------------------------------------------------------------------------

# Positions the v5 observations leave out (x; x and y), which the dynamics do not read.
HIDDEN_POSITIONS = {
    "HalfCheetah-v5": 1,
    "Hopper-v5": 1,
    "Walker2d-v5": 1,
    "Ant-v5": 2,
    "Humanoid-v5": 2,
}


@requires_envpool
@pytest.mark.parametrize("name", sorted(HIDDEN_POSITIONS))
def test_mujoco_steps_as_gymnasium_from_a_shared_state(name):
    """The EnvPool task and settings the backend uses, started from Gymnasium's env put
    in EnvPool's reset state: 40 random actions give the same observations, rewards and
    terminations. Tolerances (relative to the largest |obs|): measured 1e-16..2e-9 over
    4 seeds for four of the tasks, growing with the steps as chaotic contact dynamics
    amplify rounding (two builds of MuJoCo); Humanoid's 50-iteration PGS solver grows it
    to 2e-5. Rewards are EnvPool's float32 (rounding 6e-8 relative)."""
    assert set(HIDDEN_POSITIONS.values()) and name in envpool_batch.MUJOCO_TASKS.values()
    task = envpool_batch._task(name)
    obs_tolerance, reward_tolerance = (1e-3, 1e-4) if name == "Humanoid-v5" else (1e-7, 1e-6)
    for seed in range(2):
        pool = envpool.make_gymnasium(
            task.task_id, num_envs=1, num_threads=1, seed=seed, **task.settings
        )
        # Gymnasium's env itself, float64 observations; made by beast's make, which keeps
        # MuJoCo's known model warnings out of stderr and MUJOCO_LOG.TXT.
        reference = factory.make(name, seed=seed).unwrapped
        try:
            obs, _ = pool.reset()
            reference.reset(seed=seed)
            model = reference.model
            hidden = HIDDEN_POSITIONS[name]
            shown = model.nq - hidden
            qpos = np.concatenate([np.zeros(hidden), obs[0, :shown]])
            reference.set_state(qpos, obs[0, shown : shown + model.nv].copy())
            rng = np.random.default_rng(seed)
            for t in range(40):
                action = rng.uniform(-1, 1, size=(1, model.nu))
                obs, reward, terminated, _, _ = pool.step(action)
                want, want_reward, want_terminated, _, _ = reference.step(action[0])
                scale = max(1.0, float(np.abs(want).max()))
                assert np.abs(obs[0] - want).max() <= obs_tolerance * scale, (seed, t)
                assert abs(reward[0] - want_reward) <= reward_tolerance * max(1, abs(want_reward))
                assert bool(terminated[0]) == want_terminated, (seed, t)
                if want_terminated:
                    break
        finally:
            pool.close()
            reference.close()


@requires_envpool
def test_halfcheetah_reset_noise_is_gymnasiums():
    """HalfCheetah-v5 resets to qpos + U(-0.1, 0.1) and qvel + 0.1 N(0, 1) (Gymnasium's
    reset_model, reset_noise_scale 0.1); init qpos and qvel are 0 in the shown joints.
    128 envs: 1,024 uniform and 1,152 normal draws. Their standard deviations (0.0577 and
    0.1) have sampling sds of about 0.0009 and 0.002; the bounds are 5 of those."""
    with make_env_batch("HalfCheetah-v5", 128, 7, False, backend="envpool") as batch:
        qpos, qvel = batch.obs[:, :8], batch.obs[:, 8:]
    assert np.abs(qpos).max() <= 0.1
    assert abs(qpos.std() - 0.1 / np.sqrt(3)) < 0.0045
    assert abs(qvel.std() - 0.1) < 0.01 and np.abs(qvel).max() > 0.2  # normal, not uniform


@requires_envpool
def test_mujoco_flags_and_statistics_match_the_loop_at_a_time_limit(register_id):
    """HalfCheetah-v5 with a 5-step limit: the loop and EnvPool truncate at the same
    rows, the final observation is kept, the reset row follows (done, reward 0), and
    each episode's statistics are the sums of its rows."""
    env_id = register_id(
        "BeastTest/HalfCheetahShort-v5",
        entry_point="gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv",
        max_episode_steps=5,
    )
    loop, pool = both(env_id, 2)
    with loop, pool:
        assert pool.spec == loop.spec and pool.obs.dtype == np.float32
        rng = np.random.default_rng(0)
        actions = rng.uniform(-1, 1, size=(15, 2, 6)).astype(np.float32)
        history = step_both(loop, pool, actions)
    returns = np.zeros(2)
    for t, (expected, actual) in enumerate(history):
        for flag in ("done", "terminated", "truncated", "episode_end"):
            np.testing.assert_array_equal(actual[flag], expected[flag], err_msg=f"{flag} {t}")
        returns += actual["reward"]
        if t % 6 == 4:  # the final observation: not a reset state
            assert actual["truncated"].all() and np.abs(actual["obs"]).max() > 0.2
            np.testing.assert_allclose(actual["episode_return"], returns, rtol=1e-6)
            assert actual["episode_step"].tolist() == [5, 5]
        if t % 6 == 5:
            assert actual["done"].all() and not actual["reward"].any()
            assert np.abs(actual["obs"][:, :8]).max() <= 0.1  # a reset state
            returns[:] = 0.0


@requires_envpool
def test_mujoco_terminations_reset_in_the_same_step():
    """Hopper-v5 falls under random actions: the obs returned with `terminated` is a
    fresh reset state (init qpos [z=1.25, 0...] and qvel 0, each + U(-0.005, 0.005)), and
    the episode's statistics are the sums of its rows (EnvPool's float32 rewards)."""
    returns, steps, falls = np.zeros(4), np.zeros(4, dtype=int), 0
    with make_env_batch("Hopper-v5", 4, 0, False, backend="envpool") as batch:
        rng = np.random.default_rng(0)
        while falls < 6:
            batch.step(rng.uniform(-1, 1, size=(4, 3)).astype(np.float32))
            returns += batch.reward
            steps += 1
            for i in np.flatnonzero(batch.terminated):
                assert batch.done[i] and batch.episode_end[i] and not batch.truncated[i]
                assert abs(batch.obs[i, 0] - 1.25) <= 0.005 + 1e-6
                assert np.abs(batch.obs[i, 1:]).max() <= 0.005 + 1e-6
                assert batch.episode_return[i] == pytest.approx(returns[i], rel=1e-5)
                assert batch.episode_step[i] == steps[i]
                returns[i], steps[i] = 0.0, 0
                falls += 1


# --- End to end ---------------------------------------------------------------------------


@requires_envpool
def test_monobeast_trains_pong_on_envpool(tmp_path):
    marker = uuid.uuid4().hex
    before = shm_entries()
    argv = ["--env", "PongNoFrameskip-v4", "--env_backend", "envpool", "--num_actors", "1"]
    argv += ["--num_envs_per_actor", "4", "--unroll_length", "10", "--batch_size", "2"]
    argv += ["--total_steps", "200", "--num_threads", "1", "--compile", "off"]
    result = run([*argv, "--savedir", str(tmp_path), "--xpid", "pong"], marker=marker)
    assert result.returncode == 0, result.stderr
    assert "1 actors x 4 envs (envpool env batches)" in result.stdout
    assert int(read_csv(tmp_path / "pong" / "logs.csv")[-1]["step"]) >= 200
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()
