"""Flag blocks that the replay-based algorithms' `Args` share (beast/algos/base.py),
declared once: `ReplayArgs` (DDPG, TD3, SAC and the Q-learners) and `QLearningArgs` (R2D2,
the DQN family and Ape-X). An algorithm whose defaults differ gives an inherited flag its
own default with `with_default`, which keeps the flag's help and choices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from beast.algos.impala import REWARD_CLIPPING_MODES
from beast.algos.q_learning import check_q_learning_args
from beast.config import flag

__all__ = ["QLearningArgs", "ReplayArgs", "with_default"]


def with_default(base: type, name: str, value: Any) -> Any:
    """The flag `name` of the `Args` dataclass `base`, with the default `value`: for a
    subclass whose algorithm's default differs (its help and choices are the base's)."""
    inherited = next(f for f in dataclasses.fields(base) if f.name == name)
    return dataclasses.field(default=value, metadata=inherited.metadata)


@dataclass(frozen=True)
class ReplayArgs:
    """Flags of an algorithm that learns from a replay with n-step targets."""

    discounting: float = flag(0.99, "Discount factor gamma.")
    replay_size: int = flag(
        1000,
        "Items the replay keeps, in shared memory (transitions: each env step once, in its"
        " env's ring; sequences: seq_len+1 steps each); the startup line prints the total.",
    )
    n_step: int = flag(5, "Rewards summed before bootstrapping from the target network(s).")


@dataclass(frozen=True)
class QLearningArgs(ReplayArgs):
    """Flags of n-step double Q-learning on a prioritized replay (beast/algos/q_learning.py):
    R2D2's defaults; the DQN family's differ (beast/algos/dqn.py)."""

    reward_clipping: str = flag(
        "abs_one", "Reward clipping in the targets.", choices=REWARD_CLIPPING_MODES
    )
    target_update_period: int = flag(
        2500, "Learner updates between target-network updates (the DQN family: see --tau)."
    )
    priority_exponent: float = flag(
        0.9, "Prioritized replay: an item of priority p is sampled with probability ~ p**this."
    )
    importance_sampling_exponent: float = flag(
        0.6,
        "Prioritized replay: a sample's loss is weighted by (N*P)**-this, normalised by the"
        " batch's max.",
    )
    samples_per_insert: float = flag(
        0.0,
        "Items the learner samples per item inserted (beyond the replay's minimum and one"
        " batch of slack): actors pause when they run ahead, so learning per env step does"
        " not depend on the machine's speed; 0: actors never pause.",
    )
    eps_base: float = flag(
        0.4,
        "Env i of all N envs of all actors explores with epsilon"
        " eps_base**(1 + eps_alpha*i/(N-1)) (Ape-X; the DQN family with --exploration"
        " per_env).",
    )
    eps_alpha: float = flag(7.0, "The spread of the envs' epsilons, see --eps_base.")
    test_epsilon: float = flag(0.001, "--mode test: the greedy policy's epsilon.")
    value_rescaling: bool = flag(
        True,
        "Learn h(Q), h(x) = sign(x)(sqrt(|x|+1)-1) + 0.001x (Pohlen et al. 2018), rather"
        " than Q; rewards still go through --reward_clipping.",
    )
    frame_dedup: bool = flag(
        False,
        "Frame-stacked image observations (Atari): store each frame once and rebuild the"
        " stacks when sampling, about a quarter of the replay's memory; other observations"
        " are stored whole.",
    )

    @staticmethod
    def check(config: Any) -> None:
        check_q_learning_args(config)
