"""Flags for polybeast: monobeast's Config plus the cluster's.

`PolyConfig` subclasses `beast.config.Config`, so every algorithm flag, the
YAML configs (`--config`, the tuned family file that `--env` picks) and
`validate()` are monobeast's; the parser is generated from the subclass's
fields by the same code. Env servers default to the actor layout of the
config: `--num_env_servers` to `--num_actors` and `--num_envs_per_server`
to `--num_envs_per_actor`, so the tuned files (CartPole: 2 x 4 envs) mean
the same number of environments in both entry points.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from beast.config import AUTO, Config, ConfigError, flag, require_nonnegative, require_positive
from beast.run.parsing import parse_args

__all__ = ["PolyConfig", "parse_poly_args"]


@dataclass(frozen=True)
class PolyConfig(Config):
    serial_capable: ClassVar[bool] = False
    parser_description: ClassVar[str] = (
        "beast: deep RL across machines on Ray (PolyBeast): env servers as Ray actors,"
        " one or more learners."
    )

    # Redefined from Config: in polybeast the policy runs in env servers or in the learner.
    policy: str = flag(
        "auto",
        "Where actions are computed: local (each env server runs a CPU copy of the model and"
        " ships whole rollouts of T+1 steps x K envs; weights are broadcast through Ray's"
        " object store) or central (env servers ship K observations per step, the learner"
        " batches all servers' into one forward pass). auto: local, measured faster here"
        " (docs/polybeast.md).",
        choices=("auto", "local", "central"),
    )

    # Cluster.
    ray_address: str | None = flag(
        None,
        "Address of a running Ray cluster to join (HOST:PORT of `ray start --head`, or auto)."
        " Default: start a private Ray instance on this machine, bound to 127.0.0.1.",
    )
    num_env_servers: int | None = flag(
        None, "Env-server Ray actors, spread across the cluster's nodes. Default: --num_actors."
    )
    num_envs_per_server: int | None = flag(
        None, "Environments each env server steps in a loop (K). Default: --num_envs_per_actor."
    )
    cpus_per_env_server: float = flag(
        1.0, "Ray CPU resources each env server reserves (placement only; may be fractional)."
    )
    num_learners: int = flag(
        1,
        "Data-parallel learners (torch.distributed: gloo on CPU, NCCL on GPU), each fed by its"
        " own share of the env servers; gradients are combined every update, rank 0 writes"
        " the checkpoint and the logs. With more than 1, Ray starts them as actors.",
    )
    weights_interval: int = flag(
        1,
        "--policy local: broadcast the learner's weights to env servers every this many updates.",
    )
    rollouts_in_flight: int = flag(
        2,
        "--policy local: rollout requests queued per env server, so a server starts its next"
        " rollout while the previous one travels.",
    )

    @property
    def slots_in_use_by_actors(self) -> int:
        # The receiver holds the K slots of one rollout at a time while it copies it in.
        return self.servers_envs

    @property
    def envs_per_learner(self) -> int | None:
        if self.servers % self.num_learners:
            return None
        return self.servers // self.num_learners * self.servers_envs

    @property
    def envs_per_writer(self) -> int:
        return self.servers_envs

    def writer_lanes(self, policy: str) -> int:
        return 1  # an env server steps its envs as one batch

    @property
    def servers(self) -> int:
        return self.num_env_servers or self.num_actors

    @property
    def servers_envs(self) -> int:
        return self.num_envs_per_server or self.num_envs_per_actor

    def validate(self) -> None:
        if self.actor_layout_is_auto:
            raise ConfigError(
                "--num_actors / --num_envs_per_actor auto are measured on monobeast's machine;"
                " polybeast needs numbers (or --num_env_servers and --num_envs_per_server)"
            )
        require_positive(
            self,
            "num_env_servers",
            "num_envs_per_server",
            "num_learners",
            "weights_interval",
            "rollouts_in_flight",
        )
        require_nonnegative(self, "cpus_per_env_server")
        if self.serial:
            raise ConfigError("--serial is monobeast's (one process); polybeast runs on Ray")
        if self.num_env_splits not in (AUTO, 1):
            raise ConfigError(
                "--num_env_splits splits monobeast's actors into lanes; polybeast's env"
                " servers step their envs as one batch (leave it at auto or 1)"
            )
        if self.servers < self.num_learners:
            raise ConfigError(
                f"--num_env_servers {self.servers} is fewer than --num_learners"
                f" {self.num_learners}: each learner needs at least one env server"
            )
        if self.ray_address is not None and not re.fullmatch(
            r"auto|(ray://)?[\w.\-\[\]:]+:\d+", self.ray_address
        ):
            raise ConfigError(
                f"--ray_address must be HOST:PORT (the head's `ray start` address) or auto,"
                f" got {self.ray_address!r}"
            )
        if self.num_buffers is not None and self.num_buffers < self.servers_envs + self.batch_size:
            raise ConfigError(
                f"--num_buffers {self.num_buffers} is too small: the receiver holds one"
                f" rollout's {self.servers_envs} slots while the learner gathers"
                f" --batch_size {self.batch_size}; use --num_buffers >="
                f" {self.servers_envs + self.batch_size}"
            )
        # Monobeast's checks; --num_inference_threads <= --num_actors is its concern only.
        super().validate()

    def finalize(self) -> PolyConfig:
        finalized = super().finalize()
        # Room for the rollouts of every server queued at once, so that a burst from
        # the servers does not wait on the learner (default only; flags win).
        num_buffers = self.num_buffers or self.default_num_buffers(
            self.rollouts_in_flight * self.servers_envs
        )
        return dataclasses.replace(
            finalized,
            num_env_servers=self.servers,
            num_envs_per_server=self.servers_envs,
            num_buffers=num_buffers,
            # --policy auto is local here, on any learner device: an env server steps its
            # envs beside its own copy of the model, on its own machine's cores.
            policy="local" if self.policy == AUTO else self.policy,
        )


def parse_poly_args(argv: Sequence[str] | None = None, prog: str | None = None) -> PolyConfig:
    """`beast.config.parse_args` for PolyConfig (with the chosen --algo's flags added):
    defaults < config file < flags."""
    config = parse_args(argv, prog, PolyConfig)
    assert isinstance(config, PolyConfig)
    return config
