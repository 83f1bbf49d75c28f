"""Observation leaves as fields (beast/fields.py): names, nesting, model inputs."""

from __future__ import annotations

import pytest
import torch

from beast.fields import (
    box_obs,
    flatten_obs,
    is_obs_key,
    map_inputs,
    model_inputs,
    nest_obs,
    obs_key,
    obs_path,
)


@pytest.mark.parametrize(
    "path, key",
    [
        ((), "obs"),
        (("position",), "obs.position"),
        ((0,), "obs[0]"),
        (("arm", 1, "joints"), "obs.arm[1].joints"),
        ((2, 0), "obs[2][0]"),
        (("0",), "obs.0"),  # a Dict key that looks like an index stays a key
    ],
)
def test_leaf_names_round_trip(path, key):
    assert obs_key(path) == key
    assert obs_path(key) == path
    assert is_obs_key(key)


@pytest.mark.parametrize("key", ["obsx", "obs.", "obs[x]", "obs[0", "observation", "frames"])
def test_other_names_are_no_leaves(key):
    with pytest.raises(ValueError):
        obs_path(key)


@pytest.mark.parametrize("key", ["obsx", "observation", "frames", "frames.image", "reward"])
def test_other_fields_are_not_observations(key):
    assert not is_obs_key(key)


def test_nest_and_flatten_are_inverse():
    fields = {
        "obs.arm[0]": 1,
        "obs.arm[1].grip": 2,
        "obs.image": 3,
        "reward": 4,  # not a leaf: ignored
    }
    nested = nest_obs(fields)
    assert nested == {"arm": (1, {"grip": 2}), "image": 3}
    assert isinstance(nested["arm"], tuple)
    assert flatten_obs(nested) == {k: v for k, v in fields.items() if k != "reward"}
    # A Box is its one field, the value itself.
    assert nest_obs({"obs": 5, "reward": 0}) == 5 and flatten_obs(5) == {"obs": 5}
    # Shapes are leaves when told so.
    shapes = {"a": (2,), "b": ((1, 4, 4), ())}
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)  # noqa: E731
    assert flatten_obs(shapes, is_leaf=is_shape) == {
        "obs.a": (2,),
        "obs.b[0]": (1, 4, 4),
        "obs.b[1]": (),
    }
    with pytest.raises(KeyError):
        nest_obs({"reward": 1})


def test_model_inputs_nest_the_leaves_of_any_mapping():
    batch = {
        "obs.position": torch.zeros(3, 2, 2),
        "obs.velocity": torch.ones(3, 2, 2),
        "reward": torch.zeros(3, 2),
        "done": torch.zeros(3, 2, dtype=torch.bool),
        "last_action": torch.zeros(3, 2, dtype=torch.int64),
        "action": torch.zeros(3, 2, dtype=torch.int64),  # the record: not an input
    }
    inputs = model_inputs(batch)
    assert set(inputs) == {"obs", "reward", "done", "last_action"}
    assert inputs["obs"]["velocity"] is batch["obs.velocity"]
    first = map_inputs(lambda value: value[:1], inputs)
    assert first["obs"]["position"].shape == (1, 2, 2) and first["reward"].shape == (1, 2)


def test_box_obs_is_the_one_field():
    assert box_obs((4, 84, 84), torch.uint8)["obs"].shape == (4, 84, 84)
