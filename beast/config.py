"""Flags for monobeast: one dataclass of core flags, each algorithm's own, one parser.

Every hyperparameter is a field with its help text next to it. The core flags (what to
run, acting, inference, rollouts and batches, learner, model, optimizer, logging,
reliability) are `Config`'s fields; each algorithm adds its own (beast/algos: its
`Args` dataclass). `config_for(algo)` is `Config` with the algorithm's fields added,
so a run's config is one flat, frozen dataclass, and a flag of another algorithm is an
error that names the algorithm it belongs to. The command-line parser is generated from
the fields, so a flag cannot be documented in one place and defined in another: --help
lists the core flags, then the chosen --algo's under its own heading. Derived values
(the run's xpid, the number of rollout buffers) are filled in once by `finalize()`;
nothing mutates a config after that.

Values come from three places, later ones winning: the field defaults, a YAML file of
field values (`--config FILE`, or when none is given the tuned
`configs/<algo>/<family>.yaml` of `--family`, or else of the family `--env` belongs to:
Atari ids get atari.yaml, classic control classic.yaml, MuJoCo mujoco.yaml, and an env
whose id names no family the file its spaces suggest, `tuned_config`), then the
command-line flags. The start-up line says which file and why (`describe_defaults`). A
file's unknown keys and mistyped values are ConfigErrors naming the key and the file.
`--print_config` prints the merged config as YAML and exits. The Python API's keyword
arguments (`beast.train(env=...)`) go through `config_from_flags`: the same layers and
checks, for values that arrive typed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import importlib.util
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from beast.algos import ALGORITHMS, algorithm_class

if TYPE_CHECKING:
    from beast.envs import EnvSpec

__all__ = [
    "AUTO",
    "FAMILIES",
    "Config",
    "ConfigError",
    "TunedConfig",
    "algorithms_of",
    "build_parser",
    "check_value",
    "config_for",
    "config_from_dict",
    "config_from_flags",
    "config_to_yaml",
    "describe_defaults",
    "flag",
    "int_or_auto",
    "load_config_file",
    "parse_args",
    "tuned_config",
]

# configs/ at the root of the beast checkout (an editable install, as the README says).
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
# The value of --num_actors / --num_envs_per_actor that asks for a start-up measurement.
AUTO = "auto"
# Env families with tuned files, configs/<algo>/<family>.yaml (not every algorithm has all).
FAMILIES = ("atari", "classic", "mujoco")
# --wandb without the package (beast/logs.py says the same if its import fails).
WANDB_MISSING = "--wandb needs the wandb package: pip install wandb (or pip install -e '.[wandb]')"
# W&B refuses longer tags.
WANDB_TAG_LENGTH = 64


class ConfigError(ValueError):
    """A flag value that cannot work; the message is one line for the user."""


def flag(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field that is a flag: its default, its help text, and argparse extras
    (`choices=`). Config's fields and every algorithm's `Args` fields are made with it."""
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class Config:
    # What to run.
    env: str = flag(
        "PongNoFrameskip-v4",
        "Gymnasium id (Atari ids get DeepMind preprocessing) or package.module:ClassName.",
    )
    config: str | None = flag(
        None,
        "YAML file of flag values (defaults < file < flags). Default: the tuned"
        " configs/<algo>/<family>.yaml of --family, if any; 'none' for no file.",
    )
    family: str = flag(
        AUTO,
        "Which tuned configs/<algo>/<family>.yaml to start from when no --config is given."
        " auto: --env's family (Atari ids atari, classic control classic, MuJoCo mujoco);"
        " for an env whose id names none (package.module:Class, say), the one its spaces"
        " suggest: image observations atari, vector observations classic with Discrete"
        " actions and mujoco with Box actions. The start-up line says which and why.",
        choices=(AUTO, *FAMILIES),
    )
    mode: str = flag(
        "train", "train a policy, or test a saved checkpoint.", choices=("train", "test")
    )
    xpid: str | None = flag(
        None, "Experiment id; the run lives in SAVEDIR/XPID. Default: a timestamp."
    )
    savedir: str = flag("~/logs/beast", "Root directory for runs (logs, metadata, checkpoints).")
    seed: int = flag(0, "Seed for environments and for torch.")
    algo: str = flag(
        next(iter(ALGORITHMS)),  # the registry's first
        "Algorithm (beast/algos); each adds its own flags, listed under its name by"
        " `--algo NAME --help`, and picks its tuned configs/<algo>/<family>.yaml for --env.",
        choices=tuple(ALGORITHMS),
    )
    serial: bool = flag(
        False,
        "Run the learner and one actor's envs in this one process, taking turns, with no"
        " worker process or thread: for breakpoint() in an env or a model. Slower; the"
        " same algorithm.",
    )

    # Acting.
    num_actors: int | str = flag(
        2,
        "Actor processes. auto: every core but one with a GPU learner; with a CPU learner, the"
        " cores' share that the measured acting cost takes beside the measured learner cost"
        " (beast/autosize.py; a few seconds at start-up, the choice is logged).",
    )
    num_envs_per_actor: int | str = flag(
        8,
        "Environments each actor steps in a for-loop; one batched forward pass serves all of"
        " them. auto: the smallest of 1, 2, 4, 8, 16 whose measured acting cost per step is"
        " within 5% of the cheapest.",
    )
    episodic_life: bool = flag(False, "Atari: end the agent's episode at a life loss.")
    env_backend: str = flag(
        "auto",
        "How an actor steps its K envs (beast/envs/batch.py): loop (one after the other in"
        " Python; any env), ale_vector (ale-py's C++ AtariVectorEnv; Atari), envpool (EnvPool's"
        " C++ thread pool; Atari and the MuJoCo v5 locomotion tasks; pip install envpool). auto:"
        " the one measured fastest per CPU-second among those that preprocess --env exactly"
        " as loop does (docs/envs.md).",
        choices=("auto", "loop", "ale_vector", "envpool"),
    )

    # Inference (beast/inference.py).
    policy: str = flag(
        "auto",
        "Where actions are computed: local (each actor runs a CPU model copy) or central (actors"
        " post requests; inference threads in the learner process answer them in batches, on"
        " --actor_device). auto: central with a GPU, else local (faster on a CPU-only machine,"
        " see benchmarks/RESULTS.md).",
        choices=("auto", "local", "central"),
    )
    actor_device: str | None = flag(
        None,
        "--policy central: device of the inference model (cpu, cuda, cuda:N). Default: the"
        " learner's device.",
    )
    num_inference_threads: int = flag(
        1, "--policy central: inference threads, each serving its share of the actors."
    )
    max_inference_batch: int | None = flag(
        None,
        "--policy central: most requests (envs) per forward pass. Default: all"
        " (num_actors*num_envs_per_actor).",
    )
    inference_timeout_ms: float = flag(
        0.0,
        "--policy central: once a request is ready, how long a server waits for more before"
        " running a forward pass on what it has. 0: serve what is ready at once; batches then"
        " grow by themselves while a forward pass runs (on 2 CPU cores, 1 ms cost a fifth of"
        " central acting throughput, the first actor of each batch idling while the next"
        " stepped its envs).",
    )
    inference_sync_every: int = flag(
        1, "--policy central: refresh the inference model after at most this many updates."
    )
    num_env_splits: int | str = flag(
        AUTO,
        "Lanes per actor: its K envs split into this many groups that take turns, one lane's"
        " envs stepping while another's inference requests are served (Sample Factory's"
        " double-buffered sampling); must divide --num_envs_per_actor. auto: 2 with --policy"
        " central when K is even, else 1 (a local forward pass has no round trip to hide).",
    )

    # Rollouts and batches.
    total_steps: int = flag(20_000_000, "Agent steps (env steps after frame skip) to train for.")
    stop_step: int = flag(
        0,
        "Stop cleanly (a final checkpoint, exit 0) at this many agent steps, short of"
        " --total_steps, which schedules still count to; resuming goes on from there. PBT"
        " trains its members in such segments (beast/tune/pbt.py). 0: at --total_steps.",
    )
    batch_size: int = flag(
        8, "Rollouts per learner batch (or sequences, for algorithms that replay them)."
    )
    updates_per_sample: int = flag(
        1,
        "Replay algorithms: batches the learner samples at once (one priority draw, one"
        " gather, one priority update) and takes an update on each, in turn, before it"
        " publishes the weights; the updates per env step are unchanged. More cost less"
        " per update; each batch is still stratified over the whole replay, but its"
        " priorities are at most this many updates old.",
    )
    unroll_length: int = flag(80, "Steps per rollout (T); each rollout slot holds T+1 steps.")
    num_buffers: int | None = flag(
        None,
        "Rollout slots in shared memory. Needs at least num_actors*num_envs_per_actor+batch_size."
        " Default: num_actors*num_envs_per_actor + queued_batches*batch_size.",
    )
    queued_batches: int = flag(
        2,
        "Batches of full rollouts the actors may fill ahead of the learner (sets the default"
        " --num_buffers): fewer keeps the data closer to the learner's policy, more absorbs"
        " bursts.",
    )

    # Learner.
    num_learner_threads: int = flag(
        1, "Learner threads (the optimizer step is serialised by a lock)."
    )
    num_threads: int | None = flag(
        None,
        "torch intra-op threads in the learner. Default: CPU count, but 1 for a bf16 learner on"
        " a CPU whose cores the actors fill (its kernels stall when a thread loses its core).",
    )
    disable_cuda: bool = flag(False, "Learn on the CPU even when a GPU is present.")
    precision: str = flag(
        "auto",
        "Learner forward pass: fp32, or bf16 autocast (about 2x cheaper conv learner steps on"
        " CPUs with AVX512-BF16; the loss stays fp32); auto: bf16 for image models where bf16"
        " is native (AVX512-BF16 or AMX CPU, bf16 GPU), else fp32. With bf16, local-policy"
        " actors run their forward pass under bf16 autocast too where the CPU has native bf16"
        " (AtariNet, K=8: 2.7 -> 2.2 ms; Pong end to end 1,585 -> 1,675 steps/s on 2 cores).",
        choices=("auto", "fp32", "bf16"),
    )

    compile: str = flag(
        "auto",
        "Compile the learner's whole update (forward passes, losses, backward, optimizer"
        " steps, target updates) into one graph with torch.compile (beast/train_step.py):"
        " on, off, or auto: on where the run's updates save more time than compiling"
        " costs (the first steps measure the eager update; compiled graphs are cached in"
        " ~/.cache/beast/inductor, so a second run of a config compiles in seconds; auto"
        " keeps a compiled update only if it measures faster than the eager one, on keeps"
        " it regardless). A failed compilation is logged once and the learner goes on"
        " eagerly.",
        choices=("auto", "on", "off"),
    )

    # Model.
    model: str = flag(
        "auto",
        "Network: atari (IMPALA shallow), resnet (IMPALA deep), mlp (shared layers, fed the"
        " last action and reward too), separate_mlp (actor-critics: separate policy and value"
        " MLPs on the observation alone, as Stable-Baselines3's and CleanRL's); auto picks by"
        " obs shape (a Dict or Tuple: the multi-input model, a conv torso per image leaf and"
        " an MLP on the vectors); or package.module:Name, your own nn.Module class or"
        " factory, called as Name(obs_shape=..., num_actions=...), or Name(obs_shape=...,"
        " action_dim=...) for continuous actions (docs/models.md).",
    )
    use_lstm: bool = flag(
        False,
        "Add an LSTM core fed with the previous action and reward (some algorithms always"
        " have one, or never: their flags say).",
    )
    hidden_size: int | None = flag(
        None,
        "Width of the MLP layers (default 64) and of the LSTM (default 64 for mlp, else 256).",
    )
    activation: str | None = flag(
        None,
        "Hidden activation of the MLP models. Default: relu for mlp, tanh for separate_mlp.",
        choices=("relu", "tanh"),
    )
    log_std_init: float = flag(
        0.0,
        "Continuous actions: initial log standard deviation of the Gaussian policy (a learned"
        " vector, not a function of the state).",
    )
    normalize_obs: bool = flag(
        False,
        "Normalise vector observations by running mean and std, clipped to +-10 (SB3's"
        " VecNormalize); the statistics are part of the model (checkpoints, --mode test).",
    )
    normalize_reward: bool = flag(
        False,
        "Divide the rewards the loss sees by the running std of each env's discounted return"
        " (with --discounting), clipped to +-10 (SB3's VecNormalize); saved in checkpoints.",
    )

    # Optimizer. Defaults are the IMPALA paper's Atari settings (RMSProp, lr 6e-4,
    # eps 0.01); their batch of 32 x 20 steps equals our 8 x 80 steps.
    optimizer: str = flag("rmsprop", "Optimizer.", choices=("rmsprop", "adam"))
    learning_rate: float = flag(0.0006, "Learning rate.")
    lr_schedule: str = flag(
        "linear",
        "Learning rate: linear decay to 0 at total_steps, or constant.",
        choices=("linear", "constant"),
    )
    alpha: float = flag(0.99, "RMSProp smoothing constant.")
    momentum: float = flag(0.0, "RMSProp momentum.")
    epsilon: float = flag(0.01, "RMSProp / Adam epsilon.")
    grad_norm_clipping: float = flag(40.0, "Global gradient norm clip (0 disables).")

    # Logging, checkpoints, evaluation.
    log_interval: float = flag(5.0, "Seconds between console progress lines.")
    profile: bool = flag(
        False,
        "Print where time goes (actors: waiting for slots, inference, env step, slot writes;"
        " learner: waiting for a batch, forward, backward, optimizer, publishing) with every"
        " progress line and at the end.",
    )
    checkpoint_interval: float = flag(
        300.0, "Seconds between checkpoints (one is always written at the end)."
    )
    checkpoint_replay: bool = flag(
        True,
        "Save the algorithm's replay with each checkpoint (RUN_DIR/replay.tar, written"
        " atomically beside model.tar) and load it on resume; off: a resumed run starts with"
        " an empty replay.",
    )
    eval_interval: int = flag(
        0,
        "Evaluate the policy each time training passes a multiple of this many agent steps:"
        " a separate process plays --eval_episodes episodes with the --mode test policy on"
        " its own env, while training goes on; logged as eval_* columns of logs.csv and eval/"
        " scalars, and the best weights are kept in RUN_DIR/model_best.tar. 0: off.",
    )
    eval_episodes: int = flag(10, "Episodes per evaluation (--eval_interval).")
    num_test_episodes: int = flag(10, "Episodes to run in --mode test.")
    checkpoint: str = flag(
        "latest",
        "--mode test: the checkpoint to load: latest (model.tar) or best (model_best.tar, the"
        " best evaluation return of a run trained with --eval_interval).",
        choices=("latest", "best"),
    )
    record_video: bool = flag(
        False, "--mode test: write the first episode to RUN_DIR/episode.mp4 (needs .[video])."
    )
    wandb: bool = flag(
        False,
        "Log to Weights & Biases too: the TensorBoard scalars, the evaluations, the config and"
        " the git commit (needs `pip install wandb`); its files go to RUN_DIR/wandb.",
    )
    wandb_project: str = flag("beast", "--wandb: the W&B project.")
    wandb_entity: str | None = flag(None, "--wandb: the W&B entity (user or team).")
    wandb_group: str | None = flag(None, "--wandb: the W&B group of the run.")
    wandb_tags: str | None = flag(None, "--wandb: comma-separated W&B tags.")
    wandb_mode: str | None = flag(
        None,
        "--wandb: online or offline (sync later with `wandb sync RUN_DIR/wandb/offline-run-*`)."
        " Default: wandb's own setting (WANDB_MODE, `wandb offline`), else online.",
        choices=("online", "offline"),
    )

    # Reliability.
    resume: bool = flag(
        False,
        "Continue SAVEDIR/XPID from its checkpoint (re-running an xpid that has one does too).",
    )
    max_actor_restarts: int = flag(
        10, "Dead actors replaced within 60 s before the run stops instead (0: never replace)."
    )
    max_nonfinite_updates: int = flag(
        10, "Consecutive updates with a non-finite loss or gradient skipped before the run stops."
    )

    @property
    def run_dir(self) -> str:
        """SAVEDIR/XPID with ~ expanded; valid after finalize()."""
        return os.path.join(os.path.expanduser(self.savedir), str(self.xpid))

    @property
    def slots_in_use_by_actors(self) -> int:
        if self.actor_layout_is_auto:
            raise ValueError("the actor layout is measured at start-up (resolve it first)")
        return self.num_actors * self.num_envs_per_actor

    @property
    def actor_layout_is_auto(self) -> bool:
        return AUTO in (self.num_actors, self.num_envs_per_actor)

    @property
    def envs_per_learner(self) -> int | None:
        """Envs whose rollouts feed one learner: all of them here (None: not the same for
        every learner, polybeast)."""
        return self.slots_in_use_by_actors

    @property
    def envs_per_writer(self) -> int:
        """Envs of one process writing rollouts (an actor here; an env server in poly)."""
        return self.num_envs_per_actor

    def writer_lanes(self, policy: str) -> int:
        """Lanes each writer's envs are split into (--num_env_splits with `policy`)."""
        return self.env_splits(policy)

    def env_splits(self, policy: str) -> int:
        """--num_env_splits, auto resolved for the run's policy ("local" or "central")."""
        if self.num_env_splits != AUTO:
            return self.num_env_splits
        if self.actor_layout_is_auto:
            raise ValueError("the actor layout is measured at start-up (resolve it first)")
        return 2 if policy == "central" and self.num_envs_per_actor % 2 == 0 else 1

    def validate(self) -> None:
        """The core flags' cross-field checks, in one place (an algorithm's config class adds
        the algorithm's, `config_for`). Raises ConfigError."""
        for name in (
            "num_actors",
            "num_envs_per_actor",
            "total_steps",
            "batch_size",
            "updates_per_sample",
            "unroll_length",
            "num_learner_threads",
            "num_inference_threads",
            "inference_sync_every",
            "num_test_episodes",
            "eval_episodes",
            "max_nonfinite_updates",
            "queued_batches",
            "num_env_splits",
        ):
            if getattr(self, name) != AUTO and getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("num_buffers", "num_threads", "hidden_size", "max_inference_batch"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be positive, got {value}")
        for name in ("learning_rate", "log_interval", "checkpoint_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.inference_timeout_ms < 0:
            raise ConfigError(
                f"--inference_timeout_ms must be >= 0, got {self.inference_timeout_ms}"
            )
        if self.num_actors != AUTO and self.num_inference_threads > self.num_actors:
            raise ConfigError(
                f"--num_inference_threads {self.num_inference_threads} exceeds --num_actors"
                f" {self.num_actors}: each inference thread serves at least one actor"
            )
        if (
            AUTO not in (self.num_env_splits, self.num_envs_per_actor)
            and self.num_envs_per_actor % self.num_env_splits
        ):
            raise ConfigError(
                f"--num_env_splits {self.num_env_splits} does not divide --num_envs_per_actor"
                f" {self.num_envs_per_actor}: each lane steps the same number of envs"
            )
        if self.actor_device is not None and not re.fullmatch(
            r"cpu|cuda(:\d+)?", self.actor_device
        ):
            raise ConfigError(
                f"--actor_device must be cpu, cuda or cuda:N, got {self.actor_device!r}"
            )
        if self.stop_step < 0:
            raise ConfigError(f"--stop_step must be >= 0 (0: off), got {self.stop_step}")
        if self.eval_interval < 0:
            raise ConfigError(
                f"--eval_interval must be >= 0 (0 turns evaluation off), got {self.eval_interval}"
            )
        if self.wandb:
            self.validate_wandb()
        if self.max_actor_restarts < 0:
            raise ConfigError(f"--max_actor_restarts must be >= 0, got {self.max_actor_restarts}")
        for name in ("grad_norm_clipping", "momentum", "epsilon"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"--alpha must be in [0, 1), got {self.alpha}")
        if self.normalize_reward and not hasattr(self, "discounting"):
            raise ConfigError(
                f"--normalize_reward needs a discount, and --algo {self.algo} has no --discounting"
            )
        if self.num_buffers is not None and not self.actor_layout_is_auto:
            needed = self.slots_in_use_by_actors + self.batch_size
            if self.num_buffers < needed:
                raise ConfigError(
                    f"--num_buffers {self.num_buffers} is too small for"
                    f" --batch_size {self.batch_size}:"
                    f" {self.num_actors} actors x {self.num_envs_per_actor} envs hold"
                    f" {self.slots_in_use_by_actors} slots while the learner gathers a batch, so"
                    f" use --num_buffers >= {needed} or a smaller --batch_size"
                )

    def validate_wandb(self) -> None:
        """--wandb's flags, and that the package is there (found, not imported)."""
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(WANDB_MISSING)
        if not self.wandb_project.strip():
            raise ConfigError("--wandb_project must not be empty")
        for tag in self.wandb_tag_list:
            if not 0 < len(tag) <= WANDB_TAG_LENGTH:
                raise ConfigError(
                    f"--wandb_tags {self.wandb_tags!r}: each comma-separated tag must have 1 to"
                    f" {WANDB_TAG_LENGTH} characters"
                )

    @property
    def wandb_tag_list(self) -> list[str]:
        """--wandb_tags split at commas, each stripped of spaces."""
        return [tag.strip() for tag in self.wandb_tags.split(",")] if self.wandb_tags else []

    def return_discount(self) -> float | None:
        """Gamma of the discounted return env batches keep for --normalize_reward, or None."""
        return getattr(self, "discounting", None) if self.normalize_reward else None

    def default_num_buffers(self, slots_in_use_by_actors: int) -> int:
        """Rollout slots when --num_buffers is not given: the actors' own, plus
        --queued_batches batches of full rollouts waiting for the learner."""
        return slots_in_use_by_actors + self.queued_batches * self.batch_size

    def finalize(self) -> Config:
        """Fill in derived values once and validate; returns a new Config."""
        self.validate()
        xpid = self.xpid or time.strftime("beast-%Y%m%d-%H%M%S")
        num_buffers = self.num_buffers
        if num_buffers is None and not self.actor_layout_is_auto:
            num_buffers = self.default_num_buffers(self.slots_in_use_by_actors)
        return dataclasses.replace(self, xpid=xpid, num_buffers=num_buffers)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.cache
def config_for(algo: str, base: type[Config] = Config) -> type[Config]:
    """`base` (Config, or polybeast's subclass) with the fields of `algo`'s `Args` added:
    the config class of a run of that algorithm. Its `validate` runs `base`'s checks, then
    the algorithm's. KeyError for an unknown algorithm."""
    algorithm = algorithm_class(algo)
    own = [
        (f.name, f.type, field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(algorithm.Args)
    ]
    # Core flags whose defaults the algorithm replaces (`Algorithm.core_defaults`).
    core = {f.name: f for f in dataclasses.fields(base)}
    unknown = set(algorithm.core_defaults) - set(core)
    if unknown:
        raise KeyError(f"{algo}'s core_defaults name no core flag: {sorted(unknown)}")
    replaced = [
        (name, core[name].type, field(default=value, metadata=core[name].metadata))
        for name, value in algorithm.core_defaults.items()
    ]
    algo_field = next(f for f in dataclasses.fields(base) if f.name == "algo")

    def validate(self: Config) -> None:
        base.validate(self)
        algorithm.validate(self)

    return dataclasses.make_dataclass(
        f"{algorithm.__name__}{base.__name__}",
        [
            *own,
            *replaced,
            ("algo", algo_field.type, field(default=algo, metadata=algo_field.metadata)),
        ],
        bases=(base,),
        frozen=True,
        namespace={
            "validate": validate,
            "algorithm_fields": tuple(name for name, _, _ in own),
            "__module__": __name__,
        },
    )


def algorithms_of(key: str) -> tuple[str, ...]:
    """The algorithms that have a flag `key` of their own (an `Args` field), in the
    registry's order; () for a core flag or no flag at all."""
    return tuple(
        name
        for name in ALGORITHMS
        if any(f.name == key for f in dataclasses.fields(algorithm_class(name).Args))
    )


def _flag_of_another_algorithm(key: str, algo: str) -> str | None:
    """ "a flag of --algo laser, not of impala" when `key` is a flag of other algorithms
    than `algo` (all of them named), else None."""
    owners = algorithms_of(key)
    if not owners or algo in owners:
        return None
    names = ", ".join(owners[:-1]) + " and " + owners[-1] if len(owners) > 1 else owners[0]
    return f"a flag of --algo {names}, not of {algo}"


class _Parser(argparse.ArgumentParser):
    """argparse that reports an error as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_or_auto(text: str) -> int | str:
    """argparse type of the `int | str` fields: an integer, or "auto"."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def _arg_type(annotation: str) -> Any:
    base = annotation.replace(" | None", "")
    if base == "int | str":
        return int_or_auto
    return {"int": int, "float": float, "str": str, "bool": bool}[base]


def _add_flag(parser: Any, f: dataclasses.Field) -> None:
    kind = _arg_type(f.type)
    # argparse formats help with %-interpolation: a literal "20%" must reach it as "20%%".
    help_text = f.metadata["help"].replace("%", "%%")
    if kind is bool:
        parser.add_argument(
            f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default, help=help_text
        )
        return
    default_text = "" if f.default is None else f" (default: {f.default})"
    parser.add_argument(
        f"--{f.name}",
        type=kind,
        default=f.default,
        choices=f.metadata.get("choices"),
        help=help_text + default_text,
        metavar=f.name.upper() if "choices" not in f.metadata else None,
    )


def build_parser(
    prog: str | None = None, config_class: type[Config] = Config
) -> argparse.ArgumentParser:
    """One flag per field of `config_class` (a `config_for` class, or Config itself): the
    core flags, then the algorithm's under its own heading."""
    parser = _Parser(
        prog=prog,
        description=getattr(
            config_class, "parser_description", "beast: deep RL on one machine (MonoBeast)."
        )
        + " Defaults shown are the"
        " built-in ones; the --config file (by default the tuned one for --env's family)"
        " replaces them, and flags replace both. --print_config shows the result.",
        epilog=f"Algorithms: {', '.join(ALGORITHMS)}; `--algo NAME --help` lists NAME's flags.",
    )
    own = set(getattr(config_class, "algorithm_fields", ()))
    algo_fields = [f for f in dataclasses.fields(config_class) if f.name in own]
    for f in dataclasses.fields(config_class):
        if f.name not in own:
            _add_flag(parser, f)
    if algo_fields:
        algo = next(f for f in dataclasses.fields(config_class) if f.name == "algo").default
        algorithm = algorithm_class(algo)  # the config_for class's own algorithm
        group = parser.add_argument_group(f"--algo {algo}", algorithm.summary)
        for f in algo_fields:
            _add_flag(group, f)
    # Not a Config field: it asks for output, it does not configure the run.
    parser.add_argument(
        "--print_config",
        action="store_true",
        help="Print the merged config (defaults < config file < flags) as YAML and exit.",
    )
    return parser


@dataclass(frozen=True)
class TunedConfig:
    """The tuned file a run starts from when no --config is given (`tuned_config`)."""

    path: str | None  # configs/<algo>/<family>.yaml; None: the algorithm's built-in defaults
    reason: str  # why, for the start-up line: "vector observations, Discrete actions"


# How the start-up line names the families that --env's id gives.
_FAMILY_WORDS = {"atari": "an Atari game", "classic": "classic control", "mujoco": "a MuJoCo task"}


def tuned_config(
    env: str, algo: str, family: str = AUTO, spec: EnvSpec | None = None
) -> TunedConfig:
    """`algo`'s tuned configs/<algo>/<family>.yaml for a run of `env` with no --config.

    The family is `family` when it is not auto (--family); else the one `env`'s id
    belongs to (`beast.envs.env_family`: Atari, classic control, MuJoCo); else, for custom
    `module:Class` envs and ids of no tuned family, the one the env's spaces suggest
    (`beast.envs.spaces_family`: image observations atari, vector observations classic
    with Discrete actions, mujoco with Box actions). A user's own CartPole so starts from
    the settings CartPole-v1 does, not from the core defaults (IMPALA's Atari settings).
    Reading the spaces makes the env once (`beast.envs.probe_spec` says why) unless `spec`
    is given. `path` is None when `algo` has no file for the family (then its built-in
    defaults apply, `Algorithm.core_defaults` over Config's).

    Raises ConfigError for a --family that `algo` has no file for, EnvError for an env
    that cannot be made.
    """
    from beast import envs  # imports gymnasium and ale_py; only needed here

    if family != AUTO:
        path = _family_file(algo, family)
        if not os.path.isfile(path):
            have = [name for name in FAMILIES if os.path.isfile(_family_file(algo, name))]
            raise ConfigError(
                f"--family {family}: there is no configs/{algo}/{family}.yaml; --algo {algo}"
                f" has {', '.join(have) or 'no tuned files'} (or give --config FILE)"
            )
        return TunedConfig(path, f"--family {family}")
    family = envs.env_family(env)
    if family is not None:
        reason = f"{env} is {_FAMILY_WORDS[family]}"
    else:
        family, reason = envs.spaces_family(spec or envs.probe_spec(env))
    if family is None:
        return TunedConfig(None, f"{reason}: no tuned family")
    path = _family_file(algo, family)
    if not os.path.isfile(path):
        return TunedConfig(None, f"{reason}; no configs/{algo}/{family}.yaml")
    return TunedConfig(path, reason)


def _family_file(algo: str, family: str) -> str:
    return os.path.join(CONFIGS_DIR, algo, f"{family}.yaml")


def describe_defaults(config: Config, spec: EnvSpec) -> str:
    """For the start-up line: the file the run's values started from, and why, e.g.
    "defaults: configs/impala/classic.yaml (vector observations, Discrete actions)".

    Worked out again from the run's config and its env's `spec` (so no env is made): the
    tuned file `tuned_config` picks when the run's file is that one, else --config's.
    """
    tuned = tuned_config(config.env, config.algo, config.family, spec)
    if config.config == tuned.path:
        path, reason = tuned.path, tuned.reason
    else:
        path, reason = config.config, "--config none" if config.config is None else "--config"
    if path is None:
        return f"defaults: --algo {config.algo}'s built-in ({reason})"
    in_checkout = os.path.relpath(path, os.path.dirname(CONFIGS_DIR))
    return f"defaults: {path if in_checkout.startswith('..') else in_checkout} ({reason})"


def _resolve_config_path(path: str) -> str:
    """`path` as given, or inside the checkout when it is a relative path found only there.

    So `--config configs/impala/atari.yaml` works from any working directory.
    """
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded) or os.path.exists(expanded):
        return expanded
    in_checkout = os.path.join(os.path.dirname(CONFIGS_DIR), expanded)
    return in_checkout if os.path.exists(in_checkout) else expanded


# Keys a config file may not set: a file naming another file (or family of files) would
# hide where values come from.
_NOT_IN_FILES = frozenset({"config", "family"})
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_value(
    key: str,
    value: Any,
    source: str,
    config_class: type[Config] = Config,
    noun: str = "key",
) -> Any:
    """`value` for the Config field `key`, in the field's type, or a one-line ConfigError.

    Used for config files, sweep files and the Python API's keyword arguments, whose
    values arrive typed (by YAML, by Python) rather than parsed by argparse. `source` (a
    file name, `beast.train()`) starts every message, which calls `key` a `noun` ("key"
    in a file, "argument" in a call). Ints are accepted for float fields; strings that
    parse as floats too, because YAML 1.1 reads `6e-4` (no dot) as a string.
    """
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    if key not in fields or key in _NOT_IN_FILES:
        elsewhere = _flag_of_another_algorithm(str(key), fields["algo"].default)
        if elsewhere is not None:
            raise ConfigError(f"{source}: '{key}' is {elsewhere}")
        names = [name for name in fields if name not in _NOT_IN_FILES]
        close = difflib.get_close_matches(str(key), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{source}: unknown {noun} '{key}'{hint}")
    f = fields[key]
    if value is None and "None" in f.type:
        return None
    if isinstance(value, bool) and {"on", "off"} <= set(f.metadata.get("choices", ())):
        # YAML 1.1 reads on, off, true and false as booleans.
        value = "on" if value else "off"
    if f.type == "int | str":
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ConfigError(
            f"{source}: {noun} '{key}' must be an integer or auto, got {value!r}"
            f" ({type(value).__name__})"
        )
    kind = _arg_type(f.type)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and not ok and not isinstance(value, bool):
        if isinstance(value, int):
            value, ok = float(value), True
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                value, ok = float(value), True
    if not ok:
        raise ConfigError(
            f"{source}: {noun} '{key}' must be {_TYPE_NAMES[kind]}, got {value!r}"
            f" ({type(value).__name__})"
        )
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{source}: {noun} '{key}' must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


def load_config_file(path: str, config_class: type[Config] = Config) -> dict[str, Any]:
    """Read a YAML mapping of Config field names to values, each checked by check_value.

    Raises ConfigError (one line naming the file, and the key where there is one) for
    a missing file, invalid YAML, a key that is not a field, or a mistyped value.
    """
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of flag names to values, got {type(data).__name__}"
        )
    return {key: check_value(key, value, path, config_class) for key, value in data.items()}


def config_to_yaml(config: Config) -> str:
    """The config as a YAML file that `--config` reads back to the same values."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def _algo_named(algo: Any, config_file: str | None) -> Any:
    """The run's --algo: `algo` when given, else an explicit config file's `algo` key, else
    the default. A name that is not registered is returned as it is (the parser, or
    check_value, then reports it as an invalid choice)."""
    if algo is not None:
        return algo
    if config_file is not None and config_file.lower() != "none":
        with contextlib.suppress(OSError, yaml.YAMLError):
            with open(_resolve_config_path(config_file)) as f:
                data = yaml.safe_load(f)
            if isinstance(data, dict) and isinstance(data.get("algo"), str):
                return data["algo"]
    return Config.algo


def _chosen_algo(argv: Sequence[str]) -> str:
    """_algo_named for the command line's --algo and --config."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--algo")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    return _algo_named(known.algo, known.config)


def _config_file(config_file: str | None, family: str, env: str, algo: str) -> str | None:
    """The YAML file a run's values start from: --config's (None for "none"), else the tuned
    file of --family, or of `env`'s family, for `algo`, if any (`tuned_config`)."""
    if config_file is not None and family != AUTO:
        raise ConfigError(
            f"--config {config_file} and --family {family} both choose the file to start"
            " from; give one of them"
        )
    if config_file is not None and config_file.lower() == "none":
        return None
    if config_file is not None:
        return _resolve_config_path(config_file)
    return tuned_config(env, algo, family).path


def _validated(
    config: Config, path: str | None, file_values: Mapping[str, Any], given: set[str]
) -> Config:
    """`config` after validate(); an error about a value that came from the file at `path`
    rather than from the `given` flags names the file."""
    try:
        config.validate()
    except ConfigError as error:
        bad = str(error).split()[0].removeprefix("--")
        if path is not None and bad in file_values and bad not in given:
            raise ConfigError(f"{error} (set in {path})") from None
        raise
    return config


def parse_args(
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    config_class: type[Config] = Config,
) -> Config:
    """Parse flags (over a config file, over defaults) into a finalized config of the chosen
    algorithm: `config_for(algo, config_class)`.

    Raises ConfigError on a bad config file or bad combinations; argparse exits with
    status 2 on malformed flags, and `--print_config` prints the merged config and
    exits with status 0, as `--help` does.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    algo = _chosen_algo(argv)
    run_class = config_for(algo if algo in ALGORITHMS else Config.algo, config_class)
    parser = build_parser(prog or os.path.basename(sys.argv[0]), run_class)
    # A first pass finds --config, --family and --env (and reports malformed flags before
    # any file is read or env made); the second lets the file's values replace the
    # defaults while the flags given still win.
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown_flags(parser, unknown, run_class.algo)
    path = _config_file(namespace.config, namespace.family, namespace.env, namespace.algo)
    file_values: dict[str, Any] = {}
    if path is not None:
        file_values = load_config_file(path, run_class)
        parser.set_defaults(**file_values)
        namespace = parser.parse_args(argv)
    values = vars(namespace)
    print_config = values.pop("print_config")
    values["config"] = path
    given = {arg[2:].split("=")[0] for arg in argv if arg.startswith("--")}
    config = _validated(run_class(**values), path, file_values, given)
    if print_config:
        # Before finalize(): derived values stay unset, so the output works as a
        # --config file for new runs (no timestamp xpid pinned into it).
        sys.stdout.write(config_to_yaml(config))
        raise SystemExit(0)
    return config.finalize()


def _refuse_unknown_flags(parser: argparse.ArgumentParser, unknown: list[str], algo: str) -> None:
    """Exit 2 with one line on the arguments `parser` did not know: for a flag of other
    algorithms, whose it is ("--replay_ratio is a flag of --algo laser, not of impala");
    else argparse's own "unrecognized arguments"."""
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0]
        # A boolean flag's negative form, --no-NAME, belongs where NAME does.
        for key in (name, name.removeprefix("no-")):
            elsewhere = _flag_of_another_algorithm(key, algo)
            if elsewhere is not None:
                parser.error(f"--{key} is {elsewhere}")
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def config_from_flags(
    flags: Mapping[str, Any], config_class: type[Config] = Config, source: str = "beast.train()"
) -> Config:
    """`parse_args` for typed values, the Python API's keyword arguments: the same layers
    (defaults < the `config` file, or the tuned family file for `env` and `algo` < `flags`),
    the same validation, a finalized config of the chosen algorithm. Each value is checked
    as a config file's is (check_value): a wrong name or type is a one-line ConfigError
    that starts with `source` and names the argument."""
    flags = dict(flags)
    config_file = flags.pop("config", None)
    if config_file is not None and not isinstance(config_file, str):
        raise ConfigError(
            f"{source}: argument 'config' must be a YAML file name or 'none', got {config_file!r}"
        )
    family = flags.pop("family", AUTO)
    if family not in (AUTO, *FAMILIES):
        raise ConfigError(
            f"{source}: argument 'family' must be one of {', '.join((AUTO, *FAMILIES))},"
            f" got {family!r}"
        )
    algo = _algo_named(flags.get("algo"), config_file)
    run_class = config_for(algo if algo in ALGORITHMS else Config.algo, config_class)
    values = {
        key: check_value(key, value, source, run_class, noun="argument")
        for key, value in flags.items()
    }
    path = _config_file(config_file, family, values.get("env", run_class.env), run_class.algo)
    file_values = load_config_file(path, run_class) if path is not None else {}
    config = run_class(**{**file_values, **values, "config": path, "family": family})
    return _validated(config, path, file_values, set(values)).finalize()


def config_from_dict(values: Mapping[str, Any], base: type[Config] = Config) -> Config:
    """A saved run's config (a checkpoint's, a run's config.yaml) as its algorithm's class.

    Keys that are no fields (any more) are dropped and missing ones take their defaults,
    so a run saved by an older beast still loads for --mode test. ConfigError for an
    unknown algorithm.
    """
    algo = values.get("algo", Config.algo)
    if algo not in ALGORITHMS:
        raise ConfigError(f"the saved run's --algo {algo!r} is not one of {', '.join(ALGORITHMS)}")
    run_class = config_for(algo, base)
    names = {f.name for f in dataclasses.fields(run_class)}
    return run_class(**{key: value for key, value in values.items() if key in names})
