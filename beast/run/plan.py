"""A run resolved once, at start-up: `plan_run` turns a config into a `RunPlan`, the env's
spec, the algorithm, its checked model, the device, the learner's precision and where
inference runs (--policy). Everything after it (the run's build, the runner, --serial,
polybeast's learners) reads the plan and resolves none of these again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from beast import envs
from beast.algos.base import Algorithm
from beast.algos.build import build_algorithm, build_checked_model
from beast.config import Config
from beast.envs.batch import check_backend
from beast.learning.thread_tuner import learner_threads
from beast.models import is_user_model
from beast.run.checks import check_frame_stacks, check_replay_fits
from beast.train_step import compilations_under_way, wait_for_compilations


def select_device(config: Config) -> torch.device:
    if not config.disable_cuda and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def select_policy(config: Config, device: torch.device) -> str:
    """--policy with auto resolved: central when the learner has a GPU, else local.

    On a CPU-only machine the two spend the same core-time on the forward pass, but
    central inference adds a round trip per step and runs the forward pass in the
    learner process, beside the learner's update; local measured faster on 2 cores
    (benchmarks/RESULTS.md). With a GPU, central moves that forward pass off the CPUs.
    """
    if config.policy != "auto":
        return config.policy
    return "central" if device.type == "cuda" else "local"


def cpu_bf16_native() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def select_precision(
    config: Config, device: torch.device, spec: envs.EnvSpec, algorithm: type[Algorithm]
) -> str:
    """The learner's precision, "fp32" or "bf16", with --precision auto resolved.

    auto picks bf16 for image models where bf16 is native, unless the algorithm says it
    must not (`Algorithm.bf16_auto`), or only for its built-in models (Q-learning, whose
    built-in models keep the Q-values in float32: `Algorithm.bf16_builtin_only`).
    Emulated bf16 (an older CPU) is slower than fp32, and so is a few-millisecond MLP
    update, where the casts cost more than the matmuls save. On a 2-core AVX512-BF16
    EPYC, bf16 cut the AtariNet update (T=80, B=8) from 909 to 413 ms at 1 thread, with
    gradients within 1.4% of fp32's (cosine 0.9999); see benchmarks/RESULTS.md.
    """
    if config.precision != "auto":
        return config.precision
    if not algorithm.bf16_auto or not spec.has_images():
        return "fp32"
    if algorithm.bf16_builtin_only and is_user_model(config.model):
        return "fp32"
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_bf16_native() else "fp32"


def acting_bf16(precision: str, device: torch.device) -> bool:
    """Whether acting forward passes on `device` run under bf16 autocast: in a bf16
    run, where `device` has native bf16 (AtariNet at K=8 on one CPU thread: 2.7 ->
    2.2 ms; Pong end to end 1,585 -> 1,675 steps/s, benchmarks/RESULTS.md)."""
    return precision == "bf16" and (device.type == "cuda" or cpu_bf16_native())


@dataclass(frozen=True)
class RunPlan:
    """A run as start-up resolved it, once (module docstring).

    config: with an "auto" actor layout resolved (beast/run/autosize.py).
    model: the algorithm's network, checked against what the algorithm needs, on the CPU;
        the learner's, once the run's build moves it to `device`.
    policy_mode: where acting runs, "local" (the actors' own copy) or "central" (the
        learner process's inference threads): --policy with auto resolved.
    """

    config: Config
    spec: envs.EnvSpec
    algorithm: Algorithm
    model: nn.Module
    device: torch.device
    precision: str
    policy_mode: str


def plan_run(config: Config) -> RunPlan:
    """Seed torch, probe the env's spec and --env_backend, build the algorithm and check its
    model, pick device, precision and policy mode, measure an "auto" actor layout
    (beast/run/autosize.py), set torch threads."""
    # Another run in this process (the Python API, the tests) may have left a compilation
    # exporting: torch's seeding and optimizers race with it (ModulesInUse).
    if compilations_under_way():
        print("[beast] waiting for another run's compilation in this process", flush=True)
        wait_for_compilations()
    torch.manual_seed(config.seed)
    probe = envs.make(config.env, seed=config.seed, episodic_life=config.episodic_life)
    try:
        spec = envs.env_spec(probe)
        # An --env_backend that cannot run --env (or is not installed) stops here, in one line.
        check_backend(config.env, config.env_backend)
        algorithm = build_algorithm(config, spec)
        check_frame_stacks(algorithm, probe)
    finally:
        probe.close()
    # Fail here, in one line, on a model that does not fit.
    model = build_checked_model(algorithm)
    check_replay_fits(algorithm, model)
    device = select_device(config)
    precision = select_precision(config, device, spec, type(algorithm))
    policy_mode = select_policy(config, device)
    if config.actor_layout_is_auto:
        from beast.run.autosize import resolve_actor_layout

        config = resolve_actor_layout(
            config,
            algorithm,
            device,
            policy_mode,
            precision,
            log=lambda line: print(f"[beast] {line}", flush=True),
        )
        # The measurement drew random numbers; the algorithm reads the layout.
        torch.manual_seed(config.seed)
        algorithm = build_algorithm(config, spec)
        model = build_checked_model(algorithm)
    num_parameters = sum(p.numel() for p in model.parameters())
    num_threads = learner_threads(config, device, precision, num_parameters)
    if num_threads:
        torch.set_num_threads(num_threads)
    return RunPlan(config, spec, algorithm, model, device, precision, policy_mode)
