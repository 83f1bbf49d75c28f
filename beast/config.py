"""Flags for monobeast: one dataclass, one parser, one validate().

Every hyperparameter is a field of `Config` with its help text next to it.
The command-line parser is generated from the fields, so a flag cannot be
documented in one place and defined in another. Derived values (the run's
xpid, the number of rollout buffers) are filled in once by `finalize()`;
nothing mutates a config after that.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Config", "ConfigError", "parse_args", "build_parser"]


class ConfigError(ValueError):
    """A flag value that cannot work; the message is one line for the user."""


def _flag(default: Any, help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class Config:
    # What to run.
    env: str = _flag(
        "PongNoFrameskip-v4",
        "Gymnasium id (Atari ids get DeepMind preprocessing) or package.module:ClassName.",
    )
    mode: str = _flag(
        "train", "train a policy, or test a saved checkpoint.", choices=("train", "test")
    )
    xpid: str | None = _flag(
        None, "Experiment id; the run lives in SAVEDIR/XPID. Default: a timestamp."
    )
    savedir: str = _flag("~/logs/beast", "Root directory for runs (logs, metadata, checkpoints).")
    seed: int = _flag(0, "Seed for environments and for torch.")

    # Acting.
    num_actors: int = _flag(2, "Actor processes.")
    num_envs_per_actor: int = _flag(
        8,
        "Environments each actor steps in a for-loop; one batched forward pass serves all of them.",
    )
    episodic_life: bool = _flag(False, "Atari: end the agent's episode at a life loss.")

    # Rollouts and batches.
    total_steps: int = _flag(20_000_000, "Agent steps (env steps after frame skip) to train for.")
    batch_size: int = _flag(8, "Rollouts per learner batch.")
    unroll_length: int = _flag(80, "Steps per rollout (T); each rollout slot holds T+1 steps.")
    num_buffers: int | None = _flag(
        None,
        "Rollout slots in shared memory. Needs at least num_actors*num_envs_per_actor+batch_size."
        " Default: num_actors*num_envs_per_actor + 2*batch_size.",
    )

    # Learner.
    num_learner_threads: int = _flag(
        1, "Learner threads (the optimizer step is serialised by a lock)."
    )
    num_threads: int | None = _flag(
        None, "torch intra-op threads in the learner. Default: CPU count."
    )
    disable_cuda: bool = _flag(False, "Learn on the CPU even when a GPU is present.")

    # Model.
    model: str = _flag(
        "auto",
        "Network: atari (IMPALA shallow), resnet (IMPALA deep), mlp; auto picks by obs shape.",
        choices=("auto", "atari", "resnet", "mlp"),
    )
    use_lstm: bool = _flag(False, "Add an LSTM core fed with the previous action and reward.")
    hidden_size: int | None = _flag(
        None,
        "Width of the MLP layers (default 64) and of the LSTM (default 64 for mlp, else 256).",
    )

    # Loss (IMPALA, Espeholt et al. 2018).
    entropy_cost: float = _flag(0.01, "Entropy regularisation weight.")
    baseline_cost: float = _flag(0.5, "Baseline (value) loss weight.")
    discounting: float = _flag(0.99, "Discount factor gamma.")
    reward_clipping: str = _flag(
        "abs_one", "Reward clipping in the loss.", choices=("abs_one", "none")
    )

    # Optimizer. Defaults are the IMPALA paper's Atari settings (RMSProp, lr 6e-4,
    # eps 0.01); their batch of 32 x 20 steps equals our 8 x 80 steps.
    optimizer: str = _flag("rmsprop", "Optimizer.", choices=("rmsprop", "adam"))
    learning_rate: float = _flag(0.0006, "Learning rate.")
    lr_schedule: str = _flag(
        "linear",
        "Learning rate: linear decay to 0 at total_steps, or constant.",
        choices=("linear", "constant"),
    )
    alpha: float = _flag(0.99, "RMSProp smoothing constant.")
    momentum: float = _flag(0.0, "RMSProp momentum.")
    epsilon: float = _flag(0.01, "RMSProp / Adam epsilon.")
    grad_norm_clipping: float = _flag(40.0, "Global gradient norm clip (0 disables).")

    # Logging, checkpoints, evaluation.
    log_interval: float = _flag(5.0, "Seconds between console progress lines.")
    checkpoint_interval: float = _flag(
        300.0, "Seconds between checkpoints (one is always written at the end)."
    )
    num_test_episodes: int = _flag(10, "Episodes to run in --mode test.")

    @property
    def run_dir(self) -> str:
        """SAVEDIR/XPID with ~ expanded; valid after finalize()."""
        return os.path.join(os.path.expanduser(self.savedir), str(self.xpid))

    @property
    def slots_in_use_by_actors(self) -> int:
        return self.num_actors * self.num_envs_per_actor

    def validate(self) -> None:
        """All cross-field checks, in one place. Raises ConfigError."""
        for name in (
            "num_actors",
            "num_envs_per_actor",
            "total_steps",
            "batch_size",
            "unroll_length",
            "num_learner_threads",
            "num_test_episodes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("num_buffers", "num_threads", "hidden_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be positive, got {value}")
        for name in ("learning_rate", "log_interval", "checkpoint_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("entropy_cost", "baseline_cost", "grad_norm_clipping", "momentum", "epsilon"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.discounting <= 1.0:
            raise ConfigError(f"--discounting must be in [0, 1], got {self.discounting}")
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"--alpha must be in [0, 1), got {self.alpha}")
        if self.num_buffers is not None:
            needed = self.slots_in_use_by_actors + self.batch_size
            if self.num_buffers < needed:
                raise ConfigError(
                    f"--num_buffers {self.num_buffers} is too small for"
                    f" --batch_size {self.batch_size}:"
                    f" {self.num_actors} actors x {self.num_envs_per_actor} envs hold"
                    f" {self.slots_in_use_by_actors} slots while the learner gathers a batch, so"
                    f" use --num_buffers >= {needed} or a smaller --batch_size"
                )

    def finalize(self) -> Config:
        """Fill in derived values once and validate; returns a new Config."""
        self.validate()
        xpid = self.xpid or time.strftime("beast-%Y%m%d-%H%M%S")
        num_buffers = self.num_buffers or self.slots_in_use_by_actors + 2 * self.batch_size
        return dataclasses.replace(self, xpid=xpid, num_buffers=num_buffers)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Parser(argparse.ArgumentParser):
    """argparse that reports an error as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _arg_type(annotation: str) -> type:
    base = annotation.replace(" | None", "")
    return {"int": int, "float": float, "str": str, "bool": bool}[base]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="beast: IMPALA on one machine (MonoBeast).")
    for f in dataclasses.fields(Config):
        kind = _arg_type(f.type)
        help_text = f.metadata["help"]
        if kind is bool:
            parser.add_argument(
                f"--{f.name}",
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=help_text,
            )
            continue
        default_text = "" if f.default is None else f" (default: {f.default})"
        parser.add_argument(
            f"--{f.name}",
            type=kind,
            default=f.default,
            choices=f.metadata.get("choices"),
            help=help_text + default_text,
            metavar=f.name.upper() if "choices" not in f.metadata else None,
        )
    return parser


def parse_args(argv: Sequence[str] | None = None, prog: str | None = None) -> Config:
    """Parse flags into a finalized Config. Raises ConfigError on bad combinations."""
    parser = build_parser(prog or os.path.basename(sys.argv[0]))
    namespace = parser.parse_args(argv)
    return Config(**vars(namespace)).finalize()
