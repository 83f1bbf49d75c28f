import os

import gymnasium
from custom_model import MyActorCritic  # examples/custom_model.py: an nn.Module class

import beast

# BEAST_EXAMPLE_STEPS shortens the run (the test suite runs every example so).
STEPS = int(os.environ.get("BEAST_EXAMPLE_STEPS", 200_000))


def make_env():  # at module level: actor processes import it
    return gymnasium.make("CartPole-v1")


if __name__ == "__main__":  # actor processes import this script too
    result = beast.train(
        env=make_env,
        model=MyActorCritic,
        total_steps=STEPS,
        config="configs/impala/classic.yaml",
        xpid="cartpole",
    )
    print(result.run_dir, result.step, result.mean_return)
    print(beast.evaluate(result, episodes=10).mean_return)
