"""The flags: `Config`, one frozen dataclass of the core flags with a documented field
each, `flag` (how a field and its help are declared, for the core and for each
algorithm's `Args`) and `ConfigError`, what bad input raises (one line for the user).
It imports no algorithm: the command line composes these flags with an algorithm's
(beast/algos/build.py `config_for`). The package docstring
(beast/config/__init__.py) says how values are layered.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "require_fraction",
    "require_nonnegative",
    "require_positive",
    "AUTO",
    "Config",
    "ConfigError",
    "FAMILIES",
    "WANDB_MISSING",
    "WANDB_TAG_LENGTH",
    "flag",
    "int_or_auto",
]


# The value of --num_actors / --num_envs_per_actor that asks for a start-up measurement.
AUTO = "auto"
# Env families with tuned files, configs/<algo>/<family>.yaml (not every algorithm has all).
FAMILIES = ("atari", "classic", "mujoco")
# --wandb without the package (beast/outputs/logs.py says the same if its import fails).
WANDB_MISSING = "--wandb needs the wandb package: pip install wandb (or pip install -e '.[wandb]')"
# Flags that name, place, log, checkpoint or supervise a run: what the run computes per
# step does not depend on them. The thread tuner's remembered counts
# (beast/learning/thread_tuner.py `setup_key`) and the compiled step's key before its trace
# (beast/run/build.py `step_identity`) leave them out, each with what else it may ignore.
RUN_NAMING_FLAGS = frozenset(
    {
        "mode",
        "xpid",
        "savedir",
        "seed",
        "log_interval",
        "checkpoint_interval",
        "checkpoint",
        "resume",
        "record_video",
        "wandb",
        "wandb_project",
        "wandb_entity",
        "wandb_group",
        "wandb_tags",
        "wandb_mode",
        "max_actor_restarts",
    }
)
# W&B refuses longer tags.
WANDB_TAG_LENGTH = 64


class ConfigError(ValueError):
    """A flag value that cannot work; the message is one line for the user."""


def require_positive(config: Any, *names: str) -> None:
    """ConfigError for the first flag of `names` that is set (not None, not auto) and not
    > 0 (`validate`, an algorithm's `check`)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value != AUTO and value <= 0:
            raise ConfigError(f"--{name} must be positive, got {value}")


def require_nonnegative(config: Any, *names: str) -> None:
    """ConfigError for the first flag of `names` that is < 0."""
    for name in names:
        if getattr(config, name) < 0:
            raise ConfigError(f"--{name} must be >= 0, got {getattr(config, name)}")


def require_fraction(config: Any, *names: str) -> None:
    """ConfigError for the first flag of `names` outside [0, 1] (discounts, exponents,
    probabilities)."""
    for name in names:
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"--{name} must be in [0, 1], got {getattr(config, name)}")


def flag(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field that is a flag: its default, its help text, and argparse extras
    (`choices=`). Config's fields and every algorithm's `Args` fields are made with it."""
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class Config:
    # Whether runs of this class can be --serial (polybeast's cannot): a config file's
    # `serial: true` is dropped where they cannot (beast/run/parsing.py).
    serial_capable: ClassVar[bool] = True

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
    # Its default and choices are the registry's (beast/algos): the command line's
    # config classes, which add each algorithm's own flags, set them (beast/run/parsing.py).
    algo: str = flag(
        "",
        "Algorithm (beast/algos); each adds its own flags, listed under its name by"
        " `--algo NAME --help`, and picks its tuned configs/<algo>/<family>.yaml for --env.",
    )
    serial: bool = flag(
        False,
        "Run the learner and one actor's envs in this one process, taking turns, with no"
        " worker process or thread: for breakpoint() in an env or a model, and faster"
        " where one env feeds an update per step (the SAC configs set it for one actor"
        " with one env and local acting). The same algorithm.",
    )

    # Acting.
    num_actors: int | str = flag(
        2,
        "Actor processes. auto: every core but one with a GPU learner; with a CPU learner, the"
        " cores' share that the measured acting cost takes beside the measured learner cost"
        " (beast/run/autosize.py; a few seconds at start-up, the choice is logged).",
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

    # Inference (beast/acting/inference.py).
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
        " publishes the weights; the Q-learners (DQN family, R2D2) take them in one call"
        " of their update (compiled: one graph). The updates per env step are unchanged."
        " More cost less per update; each batch is still stratified over the whole"
        " replay, but its priorities are at most this many updates old.",
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
        " steps, target updates) into one graph with torch.compile (beast/train_step):"
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
        "Network: atari (IMPALA shallow), resnet (IMPALA deep), mlp (shared layers),"
        " separate_mlp (actor-critics: separate policy and value MLPs, as Stable-Baselines3's"
        " and CleanRL's); auto picks by"
        " obs shape (a Dict or Tuple: the multi-input model, a conv torso per image leaf and"
        " an MLP on the vectors); or package.module:Name, your own nn.Module class or"
        " factory, called as Name(obs_shape=..., num_actions=...), or Name(obs_shape=...,"
        " action_dim=...) for continuous actions (docs/models.md).",
    )
    use_lstm: bool = flag(
        False,
        "Add an LSTM core, fed the last action and reward too (some algorithms always have"
        " one, or never: their flags say).",
    )
    use_last_action_reward: bool | None = flag(
        None,
        "Feed the network the last action and the reward (clipped to [-1, 1]) besides the"
        " observation, as TorchBeast's and R2D2's networks do, for what one observation does"
        " not show. Default: on for the image models (atari, resnet) and with --use_lstm,"
        " off for a feed-forward mlp, which acts on the observation alone (its exported"
        " policy takes the observation only). separate_mlp and the DDPG, TD3 and SAC"
        " networks read the observation alone; a model of your own reads what it reads.",
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
    # eps 0.01); their batch of 32 x 20 steps holds as many steps as our default 8 x 80
    # (configs/impala/atari.yaml takes 8 x 20: Pong reached +18 in half the steps).
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
        require_positive(
            self,
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
            "num_buffers",
            "num_threads",
            "hidden_size",
            "max_inference_batch",
            "learning_rate",
            "log_interval",
            "checkpoint_interval",
        )
        require_nonnegative(self, "inference_timeout_ms")
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
        require_nonnegative(self, "max_actor_restarts", "grad_norm_clipping", "momentum", "epsilon")
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

    @classmethod
    def flag_elsewhere(cls, key: str) -> str | None:
        """Whose flag `key` is when it is not this class's ("a flag of --algo laser, not of
        impala"), for messages; None here. The classes that compose the core flags with an
        algorithm's know the other algorithms (beast/algos/build.py `config_for`)."""
        return None


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
