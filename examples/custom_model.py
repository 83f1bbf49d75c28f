"""A user's own network: an nn.Module class of yours, trained by beast.

    python examples/custom_model.py
    python monobeast.py --env CartPole-v1 --model examples.custom_model:MyActorCritic

beast builds it as `MyActorCritic(obs_shape=..., num_actions=...)` and checks at start-up
that it returns what the algorithm needs: for IMPALA (and LASER, PPO, A2C) with discrete
actions, `policy_logits` [T, B, num_actions] and `baseline` [T, B]. docs/models.md has
every algorithm's outputs, continuous actions and recurrent models.
"""

import math
import os

from torch import nn

import beast

# BEAST_EXAMPLE_STEPS shortens the run (the test suite runs every example so).
STEPS = int(os.environ.get("BEAST_EXAMPLE_STEPS", 200_000))


class MyActorCritic(nn.Module):
    """Two hidden layers shared by a policy head and a value head; feed-forward."""

    def __init__(self, obs_shape, num_actions, hidden_size=64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(obs_shape), hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
        )
        self.policy = nn.Linear(hidden_size, num_actions)
        self.value = nn.Linear(hidden_size, 1)

    def initial_state(self, batch_size):
        return ()  # feed-forward: no recurrent state

    def forward(self, inputs, core_state=()):
        obs = inputs["obs"]  # [T, B, *obs_shape]: T steps of B envs
        T, B = obs.shape[:2]
        x = self.body(obs.flatten(0, 1).float())
        outputs = {
            "policy_logits": self.policy(x).view(T, B, -1),
            "baseline": self.value(x).view(T, B),
        }
        return outputs, ()


if __name__ == "__main__":  # actor processes import this script too
    result = beast.train(env="CartPole-v1", model=MyActorCritic, total_steps=STEPS, xpid="my_net")
    print(f"trained {result.step:,} steps: mean return {result.mean_return:.2f}")
