"""Envs and models as a user passes them to `beast.train(env=..., model=...)`: objects
defined at module level of an importable module, which actor processes import by
`module:qualname` (beast/util/references.py). Used by tests/end_to_end/test_api.py."""

from __future__ import annotations

import gymnasium


def make_cartpole() -> gymnasium.Env:
    """An env factory: a function with no arguments that returns a gymnasium.Env."""
    return gymnasium.make("CartPole-v1")


class Holder:
    """A class nested in a class is found again as `tests.support.api_objects:Holder.Nested`."""

    class Nested(gymnasium.Wrapper):
        def __init__(self) -> None:
            super().__init__(gymnasium.make("CartPole-v1"))
