"""Environments for beast: creation by name, Atari preprocessing, old-gym adapter, specs.

    env = make("PongNoFrameskip-v4", seed=0, episodic_life=True)
    spec = env_spec(env)   # EnvSpec(obs_shape=(4, 84, 84), obs_dtype=uint8, num_actions=6)

See `beast.envs.factory` for the names `make` accepts and the wrapper order.
"""

# Imported for their side effect: register "MaskedCartPole-v1", "DictCartPole-v1",
# "DictPendulum-v1" and "DictGridTarget-v0".
from beast.envs import dict_classic, grid_target, masked_cartpole  # noqa: F401
from beast.envs.adapters import OldGymAdapter
from beast.envs.factory import env_family, make, probe_spec, spaces_family
from beast.envs.spec import EnvError, EnvSpec, env_spec, images_not_stacked

__all__ = [
    "EnvError",
    "EnvSpec",
    "OldGymAdapter",
    "env_family",
    "env_spec",
    "images_not_stacked",
    "make",
    "probe_spec",
    "spaces_family",
]
