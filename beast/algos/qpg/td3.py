"""TD3 (Fujimoto et al. 2018) as a plug-in: DDPG's (beast/algos/qpg/ddpg.py) with clipped
double-Q targets, target policy smoothing and a delayed actor, as flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from beast.algos.qpg.ddpg import DDPG, DDPGArgs
from beast.config import ConfigError, flag

__all__ = ["TD3", "TD3Args"]


@dataclass(frozen=True)
class TD3Args(DDPGArgs):
    """TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor."""

    policy_delay: int = flag(2, "Critic updates per actor update (and per target-network update).")
    target_noise: float = flag(
        0.2, "Target policy smoothing: std of the noise on the target action (unit box)."
    )
    target_noise_clip: float = flag(0.5, "Target policy smoothing: the noise's clip.")
    num_critics: ClassVar[int] = 2

    @staticmethod
    def check(config: Any) -> None:
        DDPGArgs.check(config)
        if config.policy_delay < 1:
            raise ConfigError(f"--policy_delay must be >= 1, got {config.policy_delay}")
        if config.target_noise < 0 or config.target_noise_clip < 0:
            raise ConfigError("--target_noise and --target_noise_clip must be >= 0")


class TD3(DDPG):
    """TD3: DDPG with twin critics, target policy smoothing and delayed actor updates."""

    name = "td3"
    summary = (
        "TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor"
        " updates, on transition replay; continuous actions."
    )
    Args = TD3Args

    def describe_extra(self) -> list[str]:
        config = self.config
        return [
            f"action noise {config.action_noise:g}",
            f"target noise {config.target_noise:g} clipped to {config.target_noise_clip:g}",
            f"actor every {config.policy_delay} updates",
        ]
