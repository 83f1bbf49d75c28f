"""Masked CartPole: CartPole-v1 dynamics, positions only, makeable by name."""

import numpy as np
import pytest

from beast.envs import env_spec, make
from beast.envs.masked_cartpole import ENV_ID, MaskedCartPole

NAMES = [ENV_ID, "beast.envs.masked_cartpole:MaskedCartPole"]


@pytest.mark.parametrize("name", NAMES)
def test_makeable_by_name_with_positions_only(name):
    env = make(name, seed=3)
    spec = env_spec(env)
    assert spec.obs_shape == (2,) and spec.obs_dtype == np.float32 and spec.num_actions == 2
    obs, _ = env.reset()
    assert obs.shape == (2,) and obs.dtype == np.float32


def test_observations_are_cartpoles_positions():
    """Same seed, same actions: the masked env shows exactly CartPole's entries 0 and 2,
    ends on the same step, and reports episode statistics."""
    masked = make(ENV_ID, seed=7)
    full = make("CartPole-v1", seed=7)
    obs_m, _ = masked.reset()
    obs_f, _ = full.reset()
    rng = np.random.default_rng(0)
    for _ in range(500):
        np.testing.assert_array_equal(obs_m, obs_f[[0, 2]])
        action = int(rng.integers(2))
        obs_m, r_m, term_m, trunc_m, info_m = masked.step(action)
        obs_f, r_f, term_f, trunc_f, _ = full.step(action)
        assert (r_m, term_m, trunc_m) == (r_f, term_f, trunc_f)
        if term_m or trunc_m:
            assert "episode" in info_m
            break
    else:
        pytest.fail("random CartPole play never ended in 500 steps")


def test_zero_mode_keeps_the_shape():
    env = MaskedCartPole(mode="zero")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4,) and obs[1] == 0.0 and obs[3] == 0.0
    obs, *_ = env.step(1)
    assert obs[1] == 0.0 and obs[3] == 0.0 and obs[0] != 0.0
    assert env.observation_space.contains(obs)
    with pytest.raises(ValueError, match="mode"):
        MaskedCartPole(mode="half")
