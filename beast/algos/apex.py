"""Ape-X (Horgan et al. 2018, "Distributed Prioritized Experience Replay").

The DQN family's learner (beast/algos/dqn.py) with the paper's choices: a dueling
double-Q network on 3-step returns from a prioritized transition replay (exponents 0.6
and 0.4), and many envs, each exploring with its own fixed epsilon (section 4.1:
``eps_i = 0.4 ** (1 + 7 i / (N - 1))``, `beast.algos.policies.actor_epsilons`) rather
than one annealed schedule. Actors write every step once into their env's ring
(beast/experience/transition_replay.py), and run free of the learner unless
--samples_per_insert asks them to wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from beast.algos.dqn import DQN, DQNArgs
from beast.config import flag

__all__ = ["ApeX", "ApeXArgs"]


@dataclass(frozen=True)
class ApeXArgs(DQNArgs):
    """Ape-X's defaults where the paper's differ from DQN's (section 4.1; Atari)."""

    n_step: int = flag(3, "Rewards summed before bootstrapping from the target network.")
    prioritized_replay: bool = flag(
        True, "Sample transitions by priority |TD| (Schaul et al. 2016), else uniformly."
    )
    target_update_period: int = flag(
        2500, "Learner updates between target-network updates (see --tau)."
    )
    samples_per_insert: float = flag(
        0.0,
        "Transitions the learner samples per env step; actors wait when they run ahead,"
        " so the ratio holds whatever the machine's speed; 0 (Ape-X): actors never wait.",
    )
    exploration: str = flag(
        "per_env",
        "per_env: Ape-X's fixed spread of epsilons (--eps_base, --eps_alpha); linear: every"
        " env's epsilon follows --eps_start -> --eps_end over --eps_decay_steps env steps.",
        choices=("linear", "per_env"),
    )


class ApeX(DQN):
    """Ape-X: prioritized n-step double Q-learning with a dueling network and per-env
    exploration rates."""

    name = "apex"
    summary = (
        "n-step double Q-learning with a dueling network on prioritized transitions and"
        " per-env epsilons (Horgan et al. 2018)."
    )
    Args = ApeXArgs
