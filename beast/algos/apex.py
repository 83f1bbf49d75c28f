"""Ape-X (Horgan et al. 2018, "Distributed Prioritized Experience Replay").

R2D2's learner and replay with a feed-forward dueling Q-network on n-step transitions:
a transition is stored as a sequence of ``n_step + 1`` rows (`SequenceReplay` with
``seq_len = n``, ``seq_overlap = n - 1``: every env step starts one), of which the loss
trains row 0 with a full n-step return, or with the shorter one an episode end leaves
(``truncate_at_end=False`` in `beast.algos.r2d2.n_step_double_q_targets`). The actors'
spread of epsilons is the paper's section 4.1 (`beast.algos.policies.actor_epsilons`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from beast.algos.r2d2 import R2D2, QLearningArgs
from beast.config import ConfigError, flag

__all__ = ["ApeX", "ApeXArgs"]


@dataclass(frozen=True)
class ApeXArgs(QLearningArgs):
    """Ape-X's defaults where the paper's differ from R2D2's (section 4.1; Atari)."""

    n_step: int = flag(3, "Rewards summed before bootstrapping from the target network.")
    priority_exponent: float = flag(
        0.6, "A transition of priority p is sampled with probability ~ p**this."
    )
    importance_sampling_exponent: float = flag(
        0.4, "A sample's loss is weighted by (N*P)**-this, normalised by the batch's max."
    )
    value_rescaling: bool = flag(
        False,
        "Learn h(Q), h(x) = sign(x)(sqrt(|x|+1)-1) + 0.001x (Pohlen et al. 2018), rather"
        " than Q; rewards still go through --reward_clipping.",
    )


class ApeX(R2D2):
    """Ape-X: a feed-forward dueling Q-network on prioritized n-step transitions."""

    name = "apex"
    summary = (
        "n-step double Q-learning with a feed-forward dueling network on prioritized"
        " transitions (Horgan et al. 2018)."
    )
    Args = ApeXArgs
    use_lstm = False
    # Each transition trains its first row only, with a full n-step return or an
    # episode end.
    truncate_at_end = False

    @classmethod
    def validate(cls, config: Any) -> None:
        QLearningArgs.check(config)
        if config.use_lstm:
            raise ConfigError(
                "--algo apex has a feed-forward Q-network; use --algo r2d2 for an LSTM"
            )

    def sequence_layout(self) -> tuple[int, int, int]:
        n = self.config.n_step
        return n, n - 1, 0
