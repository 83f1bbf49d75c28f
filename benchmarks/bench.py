"""Throughput of each stage of a run, measured alone and together, in one sitting.

    python -m benchmarks.bench throughput --env PongNoFrameskip-v4 --repeats 3 --write_results
    python -m benchmarks.bench inference --env PongNoFrameskip-v4 --repeats 3 --write_results

The figures are IMPALA's: its policy acts (beast/algos/policies.py `CategoricalPolicy`),
its actor-critic update learns (beast/algos/impala.py). A benchmark may name an
algorithm; the runtime (beast/) never imports this module.

`inference` compares the two policy modes (beast/acting/inference.py): env only; acting with
central and with local inference, first with `TrivialModel` (a forward pass that costs
nothing, so the ratio to env only is what the engine adds) and then with the real model;
one request's round trip through CentralInference, the Batcher and an idle inference
thread (p50, p99); and monobeast end to end with each `--policy`.

`throughput`:

One run measures, repeat after repeat, one after the other on the same machine:

- env only: random actions, the same preprocessing, one env per process and as many
  processes as actors (`benchmarks.env_throughput`);
- acting only: the real actor processes (`beast.acting.actor.run_actor`, started as
  `beast.run.runner` starts them) with the real model and no learning: a consumer thread
  hands every full rollout slot straight back to the free queue;
- learner only: one update exactly as a monobeast IMPALA run makes it (forward, IMPALA
  loss, and through the learner's `Stepper` backward, gradient clipping, the
  non-finite guards, the learning-rate schedule and the RMSProp step; then weight
  publishing) on synthetic batches shaped like real ones, no actors, for each variant
  (fp32, bf16 autocast, channels-last, torch.compile) at each torch thread count;
- end to end: `monobeast.py` itself (`benchmarks.monobeast_sps`).

It prints the medians and the ratios end-to-end / min(acting, learner) and
acting / env-only, and checks how far bf16 autocast moves the loss and the gradient
on a real batch captured from the actors. `--write_results` appends the figures to
`benchmarks/RESULTS.md`.

Steps are agent steps (4 emulator frames each on Atari). Learner steps/s is
T * B / (seconds per update).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `beast` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch import nn

from beast import envs
from beast.acting.inference import CentralInference, InferenceServer, InferenceTable
from beast.algos.base import LearnerContext
from beast.algos.build import config_for
from beast.algos.impala import ActorCriticUpdate, Impala, impala_loss
from beast.algos.policies import CategoricalPolicy
from beast.config import AUTO, Config, int_or_auto
from beast.experience.contract import Batch
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.fields import Field, box_obs, core_state_shapes
from beast.learning.learner import Stepper, TrainingProgress
from beast.models import build_model, copy_weights
from beast.run.acting_probe import ActorsWithoutLearner
from beast.run.measure import TrivialModel, synthetic_batch, torch_threads
from beast.run.plan import acting_bf16, select_precision
from beast.train_step.optim import build_optimizer

__all__ = [
    "ActingResult",
    "DEFAULT_LEARNER_VARIANTS",
    "LEARNER_VARIANTS",
    "LearnerStep",
    "LearnerTiming",
    "LearnerVariant",
    "PrecisionCheck",
    "compare_precision",
    "impala_algorithm",
    "learner_rollout_spec",
    "machine_summary",
    "measure_acting",
    "measure_inference_latency",
    "measure_learner",
]

ROOT = Path(__file__).resolve().parents[1]

# Hyperparameters of the learner step (optimizer, clipping, loss costs, non-finite guard):
# monobeast's IMPALA defaults (beast.config, beast/algos/impala.py), so that the optimizer
# and clipping cost what they cost in a run.
IMPALA_DEFAULTS = config_for("impala")()
# How often the acting benchmark's main thread checks that the actors are alive.
_ACTING_POLL_SECONDS = 0.1
# Longest wait for the actors' first rollout (process start, env creation, first forward).
_ACTING_START_TIMEOUT = 120.0
# Seconds actors get to exit after the queues close before they are killed (as the runner).
_ACTOR_JOIN_SECONDS = 5.0


def impala_algorithm(env_spec: envs.EnvSpec, **flags: object) -> Impala:
    """The IMPALA plug-in for `env_spec`, with monobeast's defaults but `flags` (its model,
    its policy, its model outputs)."""
    return Impala(dataclasses.replace(IMPALA_DEFAULTS, **flags), env_spec)


def _env_spec(env: str, seed: int) -> envs.EnvSpec:
    probe = envs.make(env, seed=seed)
    try:
        return envs.env_spec(probe)
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------
# Learner only.


@dataclass(frozen=True)
class LearnerVariant:
    """One way to run the learner's update.

    bf16: forward pass under `torch.autocast(dtype=torch.bfloat16)`; the loss and the
        optimizer stay float32 (logits and baseline are cast back before the loss).
    channels_last: model weights and the torso's input in channels-last memory format.
    compile: the whole update compiled (beast/train_step, --compile on). On CPU the
        generated code reads the torch thread count at run time (inductor
        `cpp.dynamic_threads`), so one compiled step serves every thread count measured.
    """

    name: str
    bf16: bool = False
    channels_last: bool = False
    compile: bool = False


LEARNER_VARIANTS: dict[str, LearnerVariant] = {
    v.name: v
    for v in (
        LearnerVariant("fp32"),
        LearnerVariant("bf16", bf16=True),
        LearnerVariant("channels_last", channels_last=True),
        LearnerVariant("bf16_channels_last", bf16=True, channels_last=True),
        LearnerVariant("compile", compile=True),
        LearnerVariant("compile_bf16", bf16=True, compile=True),
    )
}
DEFAULT_LEARNER_VARIANTS = ("fp32", "bf16", "channels_last", "bf16_channels_last", "compile")
# What `throughput` can measure (its --parts).
PARTS = ("env", "acting", "learner", "end_to_end")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


def _variant(name: str) -> LearnerVariant:
    try:
        return LEARNER_VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown learner variant {name!r}; expected one of {tuple(LEARNER_VARIANTS)}"
        ) from None


def _to_channels_last(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the torso's [N, C, H, W] input in channels-last layout."""
    return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])


def _batch_to(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


class LearnerStep:
    """One learner update as a monobeast IMPALA run makes it
    (`beast.learning.learner.Learner.step`),
    in a given variant.

    IMPALA's update (`beast.algos.impala.ActorCriticUpdate`: forward over [T+1, B], IMPALA
    loss in float32) through the run's `Stepper` (zero_grad, backward, global gradient
    norm clipping, the non-finite guards, the learning-rate schedule, the RMSProp step),
    then the weights copied in place into a separate actor model, and the loss
    statistics read out as Python floats (each a host sync, as in the learner). Only the
    batch hand-off is left out: synthetic batches are ready.

    Batches are the learner's: rollout fields `[T+1, B, ...]` and the recurrent state at
    their start as `core_state_i` fields (`beast.run.measure.synthetic_batch`, or
    `RolloutBuffers.gather`).

    Args:
        obs_shape, num_actions: the environment's.
        model: a `beast.models.MODEL_NAMES` name.
        variant: a `LEARNER_VARIANTS` name.
        device: where the learner runs ("cpu" or "cuda").
        seed: seeds the model's initialisation.
        initial_state: optional state_dict to start from (the same weights as the actors').
    """

    def __init__(
        self,
        *,
        obs_shape: Sequence[int],
        num_actions: int,
        model: str = "auto",
        use_lstm: bool = False,
        variant: str = "fp32",
        device: str = "cpu",
        seed: int = 0,
        initial_state: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.variant = _variant(variant)
        self.device = torch.device(device)
        self.obs_shape, self.num_actions = tuple(obs_shape), num_actions
        self.model_name, self.use_lstm = model, use_lstm
        config = IMPALA_DEFAULTS
        torch.manual_seed(seed)
        self.model = build_model(model, obs_shape, num_actions, use_lstm=use_lstm)
        if initial_state is not None:
            self.model.load_state_dict(initial_state)
        self.actor_model = copy.deepcopy(self.model)
        self.actor_model.share_memory()
        self.model.to(self.device)
        if self.variant.channels_last:
            if len(self.obs_shape) != 3:
                raise ValueError(
                    f"variant {variant!r} needs image observations [C, H, W], got obs_shape "
                    f"{self.obs_shape}"
                )
            self.model.to(memory_format=torch.channels_last)
            self.model.torso.register_forward_pre_hook(_to_channels_last)
        self.optimizer = build_optimizer(config, self.model)
        self.loss_fn = functools.partial(
            impala_loss,
            discounting=config.discounting,
            reward_clipping=config.reward_clipping,
            baseline_cost=config.baseline_cost,
            entropy_cost=config.entropy_cost,
        )
        progress = TrainingProgress()
        self.stepper = Stepper(
            grad_norm_clipping=config.grad_norm_clipping,
            max_nonfinite_updates=config.max_nonfinite_updates,
            lr_schedule=config.lr_schedule,
            total_steps=config.total_steps,
            progress=progress,
        )
        self.context = LearnerContext(
            device=self.device,
            bf16=self.variant.bf16,
            step=self.stepper,
            progress=progress,
            compile="on" if self.variant.compile else "off",
            log=lambda line: None,
        )
        self.update = ActorCriticUpdate(self.model, self.context, self.optimizer, self.loss_fn)

    def loss_and_grad_norm(
        self, batch: Mapping[str, torch.Tensor], max_norm: float | None = None
    ) -> tuple[dict[str, float], float]:
        """The forward and backward half of the update, without the optimizer step.

        The same update (forward pass, loss) with a step that only runs zero_grad,
        backward and clipping to `max_norm` (default the run's --grad_norm_clipping):
        leaves the clipped gradients in the parameters' `.grad`; returns the loss
        statistics and the gradient norm before clipping.
        """
        bound = self.stepper.grad_norm_clipping if max_norm is None else max_norm
        norms: list[float] = []

        def backward_only(loss, optimizers, parameters) -> bool:
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for p in parameters if p.requires_grad]
            # clip_grad_norm_ with an infinite bound just measures the norm.
            norms.append(float(nn.utils.clip_grad_norm_(params, bound if bound > 0 else math.inf)))
            return False

        context = dataclasses.replace(self.context, step=backward_only, compile="off")
        update = ActorCriticUpdate(self.model, context, self.optimizer, self.loss_fn)
        info = update(Batch(data=dict(batch)))
        return {key: float(value) for key, value in info.stats.items()}, norms[0]

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One whole update; returns the loss statistics and the gradient norm."""
        applied = self.stepper.steps_applied
        info = self.update(Batch(data=dict(batch)))
        # The learner publishes only a step that was taken (a non-finite one is skipped).
        if self.stepper.steps_applied > applied:
            copy_weights(self.actor_model, self.model)
        losses = {key: float(value) for key, value in info.stats.items()}
        losses["grad_norm"] = self.stepper.grad_norm
        return losses

    def timed(self, batch: Mapping[str, torch.Tensor], steps: int) -> list[float]:
        """Seconds taken by each of `steps` updates."""
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self(batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(time.perf_counter() - start)
        return times


@dataclass
class LearnerTiming:
    """Seconds per update of one variant at one thread count.

    step_seconds: every timed update; first_step_seconds: the untimed first one
    (compilation for `compile` variants); error: why the variant could not run.
    """

    variant: str
    num_threads: int
    samples_per_step: int  # T * B
    step_seconds: list[float] = field(default_factory=list)
    first_step_seconds: float | None = None
    error: str | None = None

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * statistics.median(self.step_seconds) if self.step_seconds else math.nan

    @property
    def steps_per_second(self) -> float:
        if not self.step_seconds:
            return math.nan
        return self.samples_per_step / statistics.median(self.step_seconds)


def _error_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def learner_rollout_spec(
    step: LearnerStep, unroll_length: int, obs_dtype: np.dtype | torch.dtype
) -> dict[str, Field]:
    """The rollout layout a run of `step`'s model fills: IMPALA's record, its core state."""
    return rollout_spec(
        unroll_length=unroll_length,
        obs=box_obs(step.obs_shape, obs_dtype),
        record=CategoricalPolicy(step.num_actions).record_spec(),
        core_state_shapes=core_state_shapes(step.model.initial_state(1)),
    )


def measure_learner(
    *,
    obs_shape: Sequence[int],
    obs_dtype: np.dtype | torch.dtype,
    num_actions: int,
    unroll_length: int,
    batch_size: int,
    variant: str = "fp32",
    num_threads: int = 1,
    steps: int = 3,
    model: str = "auto",
    use_lstm: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> LearnerTiming:
    """Time `steps` learner updates of one variant on a synthetic batch, after one untimed.

    A variant that fails to run (a `torch.compile` without a working compiler, say) is
    reported in `error` rather than raised: the benchmark goes on without it.

    Raises:
        ValueError: a non-positive size, an unknown variant or model, channels-last
            with vector observations.
    """
    _check_positive(
        unroll_length=unroll_length, batch_size=batch_size, num_threads=num_threads, steps=steps
    )
    _variant(variant)
    with torch_threads(num_threads):
        step = LearnerStep(
            obs_shape=obs_shape,
            num_actions=num_actions,
            model=model,
            use_lstm=use_lstm,
            variant=variant,
            device=device,
            seed=seed,
        )
        spec = learner_rollout_spec(step, unroll_length, obs_dtype)
        batch = _batch_to(synthetic_batch(spec, batch_size, num_actions, seed=seed), step.device)
        timing = LearnerTiming(variant, num_threads, unroll_length * batch_size)
        try:
            (timing.first_step_seconds,) = step.timed(batch, 1)
        except Exception as error:
            timing.error = _error_line(error)
            return timing
        timing.step_seconds = step.timed(batch, steps)
    return timing


# ---------------------------------------------------------------------------------------
# Acting only.


@dataclass
class ActingResult:
    """Agent steps/s of the actors alone, and optionally some rollouts they wrote.

    rollouts: the first `capture` full slots, gathered into one learner batch
    ([T+1, capture, ...], with the recurrent state at their start as `core_state_i`
    fields), or None when none was asked for.
    """

    steps_per_second: float
    rollouts: dict[str, torch.Tensor] | None = None


def measure_acting(
    *,
    env: str,
    num_actors: int,
    num_envs_per_actor: int,
    unroll_length: int,
    seconds: float,
    warmup_seconds: float = 3.0,
    model: str = "auto",
    use_lstm: bool = False,
    actor_model: nn.Module | None = None,
    num_buffers: int | None = None,
    seed: int = 0,
    capture: int = 0,
    policy: str = "local",
    inference_timeout_ms: float = 0.0,
    bf16: bool | None = None,
    num_env_splits: int | str = AUTO,
) -> ActingResult:
    """Agent steps/s of real actor processes with the real model and no learning.

    Actors start as `beast.run.runner.train` starts them (forkserver, the supervisor's
    `ActorPool` running `run_actor`, shared `RolloutBuffers`, a shared-memory model) and
    act with IMPALA's policy (`CategoricalPolicy`: a sample from the logits, stored with
    the logits and the baseline). A consumer thread here takes each full slot and puts
    it straight back on the free queue, so actors never wait on a learner.
    The clock starts at the first rollout plus `warmup_seconds` (process start, env
    creation, first forward pass are excluded); the figure is rollouts completed in the
    next `seconds`, times `unroll_length`, over the time between.

    Args:
        actor_model: the model to act with (shared memory is set up here); default a
            fresh IMPALA model `model` seeded with `seed`. A `beast.run.measure.TrivialModel`
            of IMPALA's outputs measures what the engine costs around a forward pass
            that costs nothing.
        policy: "local" (each actor runs the model) or "central" (an inference thread
            here serves the actors, as in a run with --policy central; one server thread,
            batches of up to all envs, `inference_timeout_ms` batch window).
        num_buffers: rollout slots; default twice the slots the actors hold at a time.
        capture: gather this many full slots into `ActingResult.rollouts`.
        bf16: act under bf16 autocast; None: as a monobeast run of `env` would (bf16
            for image models on a CPU with native bf16).
        num_env_splits: lanes per actor (monobeast's --num_env_splits; auto as there).

    Raises:
        ValueError: non-positive sizes or times.
        EnvError: `env` cannot be made.
        RuntimeError: an actor exited, or no rollout arrived in time.
    """
    _check_positive(
        num_actors=num_actors,
        num_envs_per_actor=num_envs_per_actor,
        unroll_length=unroll_length,
        seconds=seconds,
    )
    if warmup_seconds < 0 or capture < 0:
        raise ValueError("warmup_seconds and capture must be >= 0")
    if policy not in ("local", "central"):
        raise ValueError(f"policy must be local or central, got {policy!r}")
    spec = _env_spec(env, seed)
    algorithm = impala_algorithm(
        spec,
        env=env,
        seed=seed,
        model=model,
        use_lstm=use_lstm,
        num_actors=num_actors,
        num_envs_per_actor=num_envs_per_actor,
        unroll_length=unroll_length,
        num_env_splits=num_env_splits,
    )
    config = algorithm.config
    config.validate()  # monobeast's checks: the lanes must split K evenly
    if bf16 is None:
        cpu = torch.device("cpu")
        bf16 = acting_bf16(select_precision(config, cpu, spec, Impala), cpu)
    if actor_model is None:
        torch.manual_seed(seed)
        actor_model = algorithm.builtin_model()
    probe = ActorsWithoutLearner(
        algorithm,
        actor_model,
        num_buffers=num_buffers,
        policy=policy,
        bf16=bf16,
        inference_timeout_ms=inference_timeout_ms,
        capture=capture,
    )
    with probe:
        deadline = time.perf_counter() + _ACTING_START_TIMEOUT
        while not probe.arrivals:
            probe.check()
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no rollout from the actors in {_ACTING_START_TIMEOUT:.0f} s")
            time.sleep(_ACTING_POLL_SECONDS)
        start = probe.arrivals[0] + warmup_seconds
        end = start + seconds
        while time.perf_counter() < end or len(probe.captured) < capture:
            probe.check()
            time.sleep(_ACTING_POLL_SECONDS)
    # A fixed window: a rollout that straddles either end is counted or not at random,
    # so the estimate is unbiased; its noise is one rollout burst per end.
    done = sum(1 for t in probe.arrivals if start <= t < end)
    result = ActingResult(steps_per_second=done * unroll_length / seconds)
    if probe.captured:
        result.rollouts = probe.rollouts()
    return result


# ---------------------------------------------------------------------------------------
# Central inference: one request's round trip through the whole stack.

# Unmeasured round trips first: process start-up, page faults, CPU frequency ramp.
_LATENCY_WARMUP = 500


def _latency_actor(table: InferenceTable, total: int, latencies_ns: torch.Tensor) -> None:
    torch.set_num_threads(1)  # as beast.acting.actor does
    policy = CentralInference(table, 0, lambda: True)
    k = table.num_envs
    inputs = {
        "obs": torch.zeros_like(table.inputs["obs"][:k]),
        "reward": torch.zeros(k),
        "done": torch.zeros(k, dtype=torch.bool),
        "last_action": torch.zeros(k, dtype=torch.int64),
    }
    for i in range(total):
        start = time.perf_counter_ns()
        policy.act(inputs)
        latencies_ns[i] = time.perf_counter_ns() - start


def measure_inference_latency(
    env: str, round_trips: int = 5000, num_envs: int = 1, seed: int = 0
) -> tuple[float, float]:
    """p50 and p99 (microseconds) of `CentralInference.act` against an idle `InferenceServer`.

    One actor process posts `num_envs` requests of `env`'s observation shape and waits;
    an inference thread here collects, runs a `TrivialModel` of IMPALA's outputs on the
    rows, and through IMPALA's policy stores its outputs, samples and answers, as in a
    run. Everything but the model's cost is in it.
    """
    spec = _env_spec(env, seed)
    algorithm = impala_algorithm(spec, env=env, seed=seed)
    acting_policy = algorithm.acting_rule()
    model = TrivialModel(algorithm.model_outputs())
    table = InferenceTable(
        num_actors=1,
        num_envs=num_envs,
        obs=spec.obs_fields(),
        policy=acting_policy,
    )
    server = InferenceServer(
        table=table,
        policy=acting_policy,
        model=model,
        source=model,
        device=torch.device("cpu"),
        max_batch=num_envs,
        batch_window=0.0,
    )
    total = _LATENCY_WARMUP + round_trips
    latencies = torch.zeros(total, dtype=torch.int64).share_memory_()
    ctx = torch.multiprocessing.get_context("forkserver")
    actor = ctx.Process(target=_latency_actor, args=(table, total, latencies), daemon=True)
    with torch_threads(1):
        server.start()
        try:
            actor.start()
            actor.join(_ACTING_START_TIMEOUT + round_trips * 0.01)
            if actor.exitcode != 0:
                raise RuntimeError(f"latency actor exited with {actor.exitcode}")
        finally:
            if actor.is_alive():
                actor.kill()
            table.close()
            server.stop()
    measured = latencies[_LATENCY_WARMUP:].double() / 1000.0
    return float(measured.quantile(0.5)), float(measured.quantile(0.99))


# ---------------------------------------------------------------------------------------
# How much bf16 moves the loss and the gradient.


@dataclass(frozen=True)
class PrecisionCheck:
    """A variant's loss and gradient against float32's, same weights, same batch.

    loss_rel_diff: |L_variant - L_fp32| / |L_fp32| of the total loss.
    grad_norm_rel_diff: the same for the global gradient norm (before clipping).
    grad_rel_error: ||g_variant - g_fp32|| / ||g_fp32|| over all parameters.
    grad_cosine: cosine between g_variant and g_fp32.
    noise_cosine: for scale, the cosine between the float32 gradients of the batch's two
        halves (disjoint rollouts): how much the gradient moves from sampling alone.
    """

    variant: str
    loss_rel_diff: float
    grad_norm_rel_diff: float
    grad_rel_error: float
    grad_cosine: float
    noise_cosine: float


def _flat_grad(step: LearnerStep, batch: Mapping[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    # Unclipped (an infinite bound only measures the norm), so the gradients compare as computed.
    losses, _ = step.loss_and_grad_norm(batch, max_norm=math.inf)
    grads = [p.grad.detach().flatten().double() for p in step.model.parameters()]
    return losses["total_loss"], torch.cat(grads)


def _half_batch(batch: Mapping[str, torch.Tensor], part: slice) -> dict[str, torch.Tensor]:
    # Rollout fields are [T+1, B, ...] and core state [d0, B, ...]: the batch is dim 1.
    return {k: v[:, part] for k, v in batch.items()}


def compare_precision(
    reference: LearnerStep, variant: str, batch: Mapping[str, torch.Tensor]
) -> PrecisionCheck:
    """Loss and gradient of `variant` against `reference` (an fp32 `LearnerStep`).

    The variant gets a copy of the reference's current weights; neither takes a step.
    """
    if reference.variant.name != "fp32":
        raise ValueError(f"reference must be the fp32 variant, got {reference.variant.name!r}")
    batch_size = batch["reward"].shape[1]
    if batch_size < 2:
        raise ValueError("need a batch of at least 2 rollouts (the noise scale uses halves)")
    other = LearnerStep(
        obs_shape=reference.obs_shape,
        num_actions=reference.num_actions,
        model=reference.model_name,
        use_lstm=reference.use_lstm,
        variant=variant,
        device=str(reference.device),
        initial_state=reference.model.state_dict(),
    )
    loss_ref, grad_ref = _flat_grad(reference, batch)
    loss_var, grad_var = _flat_grad(other, batch)
    half = batch_size // 2
    _, grad_a = _flat_grad(reference, _half_batch(batch, slice(0, half)))
    _, grad_b = _flat_grad(reference, _half_batch(batch, slice(half, None)))
    cosine = torch.nn.functional.cosine_similarity
    norm_ref = grad_ref.norm()
    return PrecisionCheck(
        variant=variant,
        loss_rel_diff=abs(loss_var - loss_ref) / abs(loss_ref),
        grad_norm_rel_diff=float((grad_var.norm() - norm_ref).abs() / norm_ref),
        grad_rel_error=float((grad_var - grad_ref).norm() / norm_ref),
        grad_cosine=float(cosine(grad_var, grad_ref, dim=0)),
        noise_cosine=float(cosine(grad_a, grad_b, dim=0)),
    )


# ---------------------------------------------------------------------------------------
# The machine.


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return " ".join(flag for flag in wanted if flag in flags) or "none of AVX2/AVX-512/AMX"


def _git_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head or 'unknown'}{' (dirty)' if dirty else ''}"


def machine_summary() -> str:
    """CPU, cores, load, torch threads and versions: what every figure here depends on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for module in ("numpy", "gymnasium", "ale_py", "cv2"):
        with contextlib.suppress(ImportError):
            versions.append(f"{module} {__import__(module).__version__}")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (
        f"{cpu} ({_cpu_flags()}); nproc {usable} (cpu_count {os.cpu_count()}); load average "
        f"{load}; torch threads {torch.get_num_threads()} (interop "
        f"{torch.get_num_interop_threads()}); GPU {gpu}; {', '.join(versions)}; "
        f"beast {_git_revision()}"
    )


# ---------------------------------------------------------------------------------------
# The throughput command.


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _runs(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    return ", ".join(fmt.format(v) for v in values)


@dataclass
class _Figures:
    """Everything one `throughput` run measured."""

    env_only: list[float] = field(default_factory=list)
    acting: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)
    learner: dict[tuple[str, int], LearnerTiming] = field(default_factory=dict)
    gather_seconds: list[float] = field(default_factory=list)
    precision: list[tuple[str, PrecisionCheck]] = field(default_factory=list)


def _run_env_only(env: str, num_procs: int, seconds: float) -> float:
    from benchmarks.env_throughput import measure_env_throughput

    # measure_env_throughput sets OMP_NUM_THREADS=1 for its workers in this process's
    # environment; it must not leak into the actors and monobeast started later.
    saved = os.environ.get("OMP_NUM_THREADS")
    try:
        return measure_env_throughput(env, num_procs, seconds)
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _learner_line(timing: LearnerTiming) -> str:
    if timing.error:
        return f"{timing.variant:>18} @ {timing.num_threads} threads: failed: {timing.error}"
    first = timing.first_step_seconds
    note = f", first step {first:.1f} s" if first is not None else ""
    return (
        f"{timing.variant:>18} @ {timing.num_threads} threads: {timing.ms_per_step:7.0f} ms/step"
        f" = {timing.steps_per_second:6,.0f} steps/s (runs {_runs(timing.step_seconds, '{:.3f}')}"
        f"{note})"
    )


@dataclass
class _Session:
    """What the parts of one `throughput` run share."""

    args: argparse.Namespace
    spec: envs.EnvSpec
    actor_model: nn.Module  # the actors' model, reused by every acting repeat
    initial_weights: dict[str, torch.Tensor]  # its weights, where every learner starts
    steps: dict[str, LearnerStep]  # one learner per variant
    rollout: dict[str, Field]  # the rollout spec of the synthetic batch
    batch: dict[str, torch.Tensor]  # a synthetic learner batch, on the learner's device
    figures: _Figures


def throughput(args: argparse.Namespace) -> _Figures:
    """Run every part `args.repeats` times, interleaved; print as it goes."""
    variants = [_variant(name).name for name in args.variants]
    print(f"machine: {machine_summary()}", flush=True)
    print(
        f"env {args.env}: {args.num_actors} actors x {args.num_envs_per_actor} envs, "
        f"T={args.unroll_length}, B={args.batch_size}, model {args.model}; learner variants "
        f"{', '.join(variants)} at torch threads {', '.join(map(str, args.threads))} on "
        f"{args.device}; actors and env-only workers run 1 torch/OpenMP thread each",
        flush=True,
    )
    spec = _env_spec(args.env, args.seed)
    algorithm = impala_algorithm(spec, env=args.env, seed=args.seed, model=args.model)

    # One model for the actors and, through its weights, the learners: the captured
    # rollouts' behaviour logits then come from the learner's own policy, as in a run.
    torch.manual_seed(args.seed)
    actor_model = algorithm.builtin_model()
    initial_weights = copy.deepcopy(actor_model.state_dict())
    steps = {}
    for name in variants if "learner" in args.parts else ():
        try:
            steps[name] = LearnerStep(
                obs_shape=spec.obs_shape,
                num_actions=spec.num_actions,
                model=args.model,
                variant=name,
                device=args.device,
                initial_state=initial_weights,
            )
        except ValueError as error:
            print(f"learner variant {name} skipped: {error}", flush=True)
    rollout = rollout_spec(
        unroll_length=args.unroll_length,
        obs=spec.obs_fields(),
        record=algorithm.acting_rule().record_spec(),
        core_state_shapes=core_state_shapes(actor_model.initial_state(1)),
    )
    batch = _batch_to(
        synthetic_batch(rollout, args.batch_size, spec.num_actions, seed=args.seed),
        torch.device(args.device),
    )
    session = _Session(args, spec, actor_model, initial_weights, steps, rollout, batch, _Figures())
    for name in steps:
        for threads in args.threads:
            session.figures.learner[name, threads] = LearnerTiming(
                name, threads, args.unroll_length * args.batch_size
            )

    for repeat in range(args.repeats):
        tag = f"[{repeat + 1}/{args.repeats}]"
        if "env" in args.parts:
            env_only = _run_env_only(args.env, args.num_actors, args.seconds)
            session.figures.env_only.append(env_only)
            print(f"{tag} env only, {args.num_actors} procs: {env_only:,.0f} steps/s", flush=True)
        if "acting" in args.parts:
            _measure_acting_part(session, tag, capture=repeat == 0)
        if "learner" in args.parts:
            _measure_learner_part(session, tag)
        if "end_to_end" in args.parts and args.end_to_end_seconds > 0:
            _measure_end_to_end_part(session, tag)
    return session.figures


def _measure_acting_part(session: _Session, tag: str, capture: bool) -> None:
    args = session.args
    acting = measure_acting(
        env=args.env,
        num_actors=args.num_actors,
        num_envs_per_actor=args.num_envs_per_actor,
        unroll_length=args.unroll_length,
        seconds=args.seconds,
        warmup_seconds=args.warmup,
        actor_model=session.actor_model,
        seed=args.seed,
        capture=args.batch_size if capture else 0,
    )
    session.figures.acting.append(acting.steps_per_second)
    print(f"{tag} acting only: {acting.steps_per_second:,.0f} steps/s", flush=True)
    if acting.rollouts is not None and session.steps:
        _measure_precision(session, acting)


def _measure_learner_part(session: _Session, tag: str) -> None:
    args, figures = session.args, session.figures
    for threads in args.threads:
        with torch_threads(threads):
            for name, step in session.steps.items():
                timing = figures.learner[name, threads]
                if timing.error:
                    continue
                try:
                    if timing.first_step_seconds is None:
                        (timing.first_step_seconds,) = step.timed(session.batch, 1)
                    timing.step_seconds += step.timed(session.batch, args.learner_steps)
                except Exception as error:  # e.g. torch.compile without a compiler
                    timing.error = _error_line(error)
                print(f"{tag} learner {_learner_line(timing)}", flush=True)
            if threads == max(args.threads):
                figures.gather_seconds.append(_time_gather(session.rollout, args.batch_size))


def _measure_end_to_end_part(session: _Session, tag: str) -> None:
    from benchmarks.monobeast_sps import measure_monobeast_sps

    args = session.args
    flags = [
        "--num_actors",
        str(args.num_actors),
        "--num_envs_per_actor",
        str(args.num_envs_per_actor),
        "--unroll_length",
        str(args.unroll_length),
        "--batch_size",
        str(args.batch_size),
        "--model",
        args.model,
        "--seed",
        str(args.seed),
    ]
    sps = measure_monobeast_sps(args.env, args.end_to_end_seconds, args.end_to_end_warmup, flags)
    session.figures.end_to_end.append(sps)
    print(f"{tag} end to end (monobeast.py): {sps:,.0f} steps/s", flush=True)


def _time_gather(spec: Mapping[str, Field], batch_size: int) -> float:
    """Seconds for `RolloutBuffers.gather` of one batch: the batch thread's copy."""
    buffers = RolloutBuffers(spec, batch_size)
    try:
        buffers.gather(range(batch_size))
        start = time.perf_counter()
        buffers.gather(range(batch_size))
        return time.perf_counter() - start
    finally:
        buffers.close()


# Float32 updates between the two precision checks, so the second one is not at the
# initialisation (where the policy head's small gain makes the logits nearly zero).
_PRECISION_UPDATES = 10


def _measure_precision(session: _Session, acting: ActingResult) -> None:
    args = session.args
    others = [
        name
        for name in session.steps
        if name != "fp32" and not LEARNER_VARIANTS[name].compile  # compiled: same math
    ]
    reference = LearnerStep(
        obs_shape=session.spec.obs_shape,
        num_actions=session.spec.num_actions,
        model=args.model,
        device=args.device,
        initial_state=session.initial_weights,
    )
    batch = _batch_to(acting.rollouts, reference.device)
    for when in ("at initialisation", f"after {_PRECISION_UPDATES} fp32 updates"):
        if when != "at initialisation":
            for _ in range(_PRECISION_UPDATES):
                reference(batch)
        for name in others:
            check = compare_precision(reference, name, batch)
            session.figures.precision.append((when, check))
            print(
                f"precision {name} vs fp32 on a captured batch, {when}: loss rel diff "
                f"{check.loss_rel_diff:.2e}, grad norm rel diff {check.grad_norm_rel_diff:.2e}, "
                f"grad rel error {check.grad_rel_error:.2e}, grad cosine {check.grad_cosine:.5f}"
                f" (cosine between the two half-batches' fp32 gradients: "
                f"{check.noise_cosine:.3f})",
                flush=True,
            )


def _rate_row(label: str, values: Sequence[float]) -> str:
    best = max(values) if values else math.nan
    return f"| {label} | {_median(values):,.0f} | {best:,.0f} | {_runs(values)} |"


def _summary(args: argparse.Namespace, figures: _Figures) -> list[str]:
    """Markdown lines: the figures table, the ratios and the precision table.

    "best" is the fastest run. On a shared machine other work only ever slows a run
    down, so the best run is the better estimate of what the code costs, the median of
    what a user gets; both are shown, and the ratios are given for each.
    """
    lines = ["| figure | median | best | runs |", "|---|---|---|---|"]
    if figures.env_only:
        lines.append(
            _rate_row(
                f"env only, {args.num_actors} process(es), random actions (steps/s)",
                figures.env_only,
            )
        )
    if figures.acting:
        lines.append(
            _rate_row(
                f"acting only, {args.num_actors} actor(s) x {args.num_envs_per_actor} envs, "
                "real model, no learning (steps/s)",
                figures.acting,
            )
        )
    for (name, threads), timing in figures.learner.items():
        if timing.error:
            lines.append(f"| learner {name}, {threads} thread(s) | failed | | {timing.error} |")
            continue
        best = min(timing.step_seconds)
        first = (
            f"; first step {timing.first_step_seconds:.1f} s (compile)"
            if LEARNER_VARIANTS[name].compile and timing.first_step_seconds
            else ""
        )
        lines.append(
            f"| learner {name}, {threads} thread(s) (ms/update; steps/s) | "
            f"{timing.ms_per_step:,.0f}; {timing.steps_per_second:,.0f} | "
            f"{1000 * best:,.0f}; {timing.samples_per_step / best:,.0f} | "
            f"{_runs([1000 * s for s in timing.step_seconds])} ms{first} |"
        )
    if figures.gather_seconds:
        lines.append(
            f"| batch gather, B={args.batch_size} (ms) | "
            f"{1000 * _median(figures.gather_seconds):.1f} | "
            f"{1000 * min(figures.gather_seconds):.1f} | "
            f"{_runs([1000 * s for s in figures.gather_seconds], '{:.1f}')} |"
        )
    if figures.end_to_end:
        lines.append(_rate_row("end to end, monobeast.py (steps/s)", figures.end_to_end))
    lines += ["", *_ratios(args, figures)]
    lines.append(f"- {args.repeats} repeat(s), interleaved")
    if figures.precision:
        lines += [
            "",
            "bf16 / channels-last vs fp32, same weights, one batch of real rollouts from the "
            "actors (noise cosine: between the fp32 gradients of the batch's two halves):",
            "",
            "| variant | when | loss rel diff | grad norm rel diff | grad rel error "
            "| grad cosine | noise cosine |",
            "|---|---|---|---|---|---|---|",
        ]
        for when, c in figures.precision:
            lines.append(
                f"| {c.variant} | {when} | {c.loss_rel_diff:.2e} | {c.grad_norm_rel_diff:.2e} | "
                f"{c.grad_rel_error:.2e} | {c.grad_cosine:.5f} | {c.noise_cosine:.3f} |"
            )
    return lines


def _ratios(args: argparse.Namespace, figures: _Figures) -> list[str]:
    """The issue's ratios, from the medians and from the best runs."""
    # The learner monobeast runs by default: fp32 with every core's threads.
    threads = max(args.threads)
    fp32 = figures.learner.get(("fp32", threads))
    usable = [t for t in figures.learner.values() if not t.error and t.num_threads == threads]
    lines = []
    for kind, pick, pick_time in (("median", _median, _median), ("best", max, min)):
        figure = {
            "env": pick(figures.env_only) if figures.env_only else math.nan,
            "acting": pick(figures.acting) if figures.acting else math.nan,
            "e2e": pick(figures.end_to_end) if figures.end_to_end else math.nan,
            "learner": math.nan,
        }
        if fp32 is not None and not fp32.error:
            figure["learner"] = fp32.samples_per_step / pick_time(fp32.step_seconds)
        parts = []
        if figures.acting and figures.env_only:
            parts.append(f"acting / env only **{figure['acting'] / figure['env']:.3f}**")
        if figures.end_to_end and figures.acting and fp32 is not None and not fp32.error:
            bound = min(figure["acting"], figure["learner"])
            # Acting and learning share the cores: if neither overlapped the other, a step
            # would cost 1/acting + 1/learner seconds of the whole machine.
            shared = 1.0 / (1.0 / figure["acting"] + 1.0 / figure["learner"])
            parts.append(
                f"end to end / min(acting, learner fp32 @ {threads} threads) "
                f"**{figure['e2e'] / bound:.3f}** (min {bound:,.0f} steps/s)"
            )
            parts.append(
                f"end to end / (1/acting + 1/learner)^-1 **{figure['e2e'] / shared:.3f}** "
                f"({shared:,.0f} steps/s)"
            )
        if usable and fp32 is not None and not fp32.error:
            fastest = min(usable, key=lambda t: pick_time(t.step_seconds))
            speedup = pick_time(fp32.step_seconds) / pick_time(fastest.step_seconds)
            parts.append(
                f"fastest learner @ {threads} threads: {fastest.variant}, {speedup:.2f}x fp32"
            )
        if parts:
            lines.append(f"- {kind}s: " + "; ".join(parts))
    return lines


def inference(args: argparse.Namespace) -> list[str]:
    """Issue 3's figures, interleaved repeats: acting with a trivial policy (central and
    local) and with the real model, each run right after an env-only run it is divided
    by; one request's round trip; end to end with each policy. Returns the markdown
    summary."""
    print(f"machine: {machine_summary()}", flush=True)
    spec = _env_spec(args.env, args.seed)
    algorithm = impala_algorithm(spec, env=args.env, seed=args.seed)
    torch.manual_seed(args.seed)
    real_model = algorithm.builtin_model()
    trivial = TrivialModel(algorithm.model_outputs())
    acting_kinds = [
        ("central", "trivial", trivial),
        ("local", "trivial", trivial),
        ("central", "real", real_model),
        ("local", "real", real_model),
    ]
    env_only: list[float] = []
    acting: dict[tuple[str, str], list[float]] = {kind[:2]: [] for kind in acting_kinds}
    # Each acting run over the env-only run just before it: this VM's speed drifts by
    # 10-20% within minutes, which a ratio of medians taken minutes apart absorbs.
    paired: dict[tuple[str, str], list[float]] = {kind[:2]: [] for kind in acting_kinds}
    end_to_end: dict[str, list[float]] = {"central": [], "local": []}
    for repeat in range(args.repeats):
        tag = f"[{repeat + 1}/{args.repeats}]"
        for policy, label, model in acting_kinds:
            env_only.append(_run_env_only(args.env, args.num_actors, args.seconds))
            print(f"{tag} (a) env only, {args.num_actors} procs: {env_only[-1]:,.0f} steps/s")
            rate = measure_acting(
                env=args.env,
                num_actors=args.num_actors,
                num_envs_per_actor=args.num_envs_per_actor,
                unroll_length=args.unroll_length,
                seconds=args.seconds,
                warmup_seconds=args.warmup,
                actor_model=model,
                seed=args.seed,
                policy=policy,
                inference_timeout_ms=args.inference_timeout_ms,
                num_env_splits=args.num_env_splits,
            ).steps_per_second
            acting[policy, label].append(rate)
            paired[policy, label].append(rate / env_only[-1])
            print(
                f"{tag} acting, {policy} inference, {label} policy: {rate:,.0f} steps/s"
                f" ({paired[policy, label][-1]:.3f} of the env-only run before it)"
            )
        if args.end_to_end_seconds > 0:
            from benchmarks.monobeast_sps import measure_monobeast_sps

            for policy in end_to_end:
                flags = ["--num_actors", str(args.num_actors), "--policy", policy]
                flags += ["--num_envs_per_actor", str(args.num_envs_per_actor)]
                flags += ["--num_env_splits", str(args.num_env_splits)]
                sps = measure_monobeast_sps(
                    args.env, args.end_to_end_seconds, args.end_to_end_warmup, flags
                )
                end_to_end[policy].append(sps)
                print(f"{tag} end to end, --policy {policy}: {sps:,.0f} steps/s", flush=True)
    latency = {
        k: measure_inference_latency(args.env, args.round_trips, num_envs=k, seed=args.seed)
        for k in sorted({1, args.num_envs_per_actor})
    }
    for k, (p50, p99) in latency.items():
        print(
            f"round trip, {k} request(s) per post, idle trivial model: p50 {p50:.0f} us,"
            f" p99 {p99:.0f} us",
            flush=True,
        )

    lines = ["| figure | median | best | runs |", "|---|---|---|---|"]
    lines.append(_rate_row(f"(a) env only, {args.num_actors} processes (steps/s)", env_only))
    names = {"trivial": "trivial policy", "real": "real model"}
    for (policy, label), rates in acting.items():
        letter = {"central": "(b)", "local": "(c)"}[policy] if label == "trivial" else "   "
        lines.append(
            _rate_row(
                f"{letter} acting, {args.num_actors} x {args.num_envs_per_actor} envs, {policy}"
                f" inference, {names[label]} (steps/s)",
                rates,
            )
        )
    for policy, rates in end_to_end.items():
        if rates:
            lines.append(_rate_row(f"(e) end to end, monobeast --policy {policy}", rates))
    for k, (p50, p99) in latency.items():
        lines.append(
            f"| (d) round trip, {k} request(s) per post (us) | p50 {p50:.0f} | | p99 {p99:.0f} |"
        )
    ratios = [
        f"{policy} {label}: **{_median(pairs):.3f}** ({', '.join(f'{r:.3f}' for r in pairs)})"
        for (policy, label), pairs in paired.items()
    ]
    lines += [
        "",
        "- acting / env only, each acting run over the env-only run just before it"
        " (median, then each): " + "; ".join(ratios),
    ]
    lines.append(
        f"- {args.repeats} repeat(s), interleaved; batch window {args.inference_timeout_ms} ms"
    )
    return lines


def _write_results(
    path: Path, command: str, machine: str, loads: str, lines: list[str], title: str
) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    new = not path.exists()
    with open(path, "a") as f:
        if new:
            f.write(
                "# Measured throughput\n\nAppended by `python -m benchmarks.bench throughput "
                "--write_results`; see the project's measuring guide (BENCHMARKS.md) for what "
                "each figure means. Steps are agent steps (4 frames on Atari).\n"
            )
        f.write(f"\n## {now}: {title}\n\n")
        f.write(f"Command: `{command}`\n\nMachine: {machine}\n\nLoad average {loads}\n\n")
        f.write("\n".join(lines) + "\n")


def _csv(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        return [kind(item) for item in text.split(",") if item]

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("throughput", help="env, acting, learner and end-to-end steps/s")
    p.add_argument("--env", default="PongNoFrameskip-v4")
    p.add_argument("--model", default="auto", help="beast.models name")
    p.add_argument("--num_actors", type=int, default=2)
    p.add_argument("--num_envs_per_actor", type=int, default=8)
    p.add_argument("--unroll_length", type=int, default=80)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="learner-only device: cpu or cuda")
    p.add_argument("--seconds", type=float, default=10.0, help="measured s: env only, acting")
    p.add_argument("--warmup", type=float, default=3.0, help="acting warm-up after 1st rollout")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--learner_steps", type=int, default=3, help="timed updates per repeat")
    p.add_argument(
        "--threads",
        type=_csv(int),
        default=[1, os.cpu_count() or 1],
        help="torch thread counts for the learner, comma-separated",
    )
    p.add_argument(
        "--variants",
        type=_csv(str),
        default=list(DEFAULT_LEARNER_VARIANTS),
        help=f"learner variants, comma-separated, of {', '.join(LEARNER_VARIANTS)}",
    )
    p.add_argument(
        "--parts",
        type=_csv(str),
        default=list(PARTS),
        help=f"what to measure, comma-separated, of {', '.join(PARTS)}",
    )
    p.add_argument("--end_to_end_seconds", type=float, default=60.0, help="0 skips monobeast")
    p.add_argument("--end_to_end_warmup", type=float, default=20.0)
    p.add_argument("--write_results", action="store_true", help="append to RESULTS.md")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")

    p = commands.add_parser(
        "inference", help="central vs local inference: acting / env only, latency, end to end"
    )
    p.add_argument("--env", default="PongNoFrameskip-v4")
    p.add_argument("--num_actors", type=int, default=2)
    p.add_argument("--num_envs_per_actor", type=int, default=8)
    p.add_argument("--unroll_length", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=10.0, help="measured s: env only, acting")
    p.add_argument("--warmup", type=float, default=3.0, help="acting warm-up after 1st rollout")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--inference_timeout_ms",
        type=float,
        default=Config.inference_timeout_ms,
        help="batch window (default: monobeast's)",
    )
    p.add_argument(
        "--num_env_splits",
        type=int_or_auto,
        default=AUTO,
        help="lanes per actor (default: monobeast's auto)",
    )
    p.add_argument("--round_trips", type=int, default=5000, help="measured round trips")
    p.add_argument("--end_to_end_seconds", type=float, default=60.0, help="0 skips monobeast")
    p.add_argument("--end_to_end_warmup", type=float, default=20.0)
    p.add_argument("--write_results", action="store_true", help="append to RESULTS.md")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    return parser


def _check_throughput_args(args: argparse.Namespace) -> None:
    _check_positive(
        batch_size=args.batch_size,
        learner_steps=args.learner_steps,
    )
    for threads in args.threads:
        _check_positive(threads=threads)
    for name in args.variants:
        _variant(name)
    unknown = set(args.parts) - set(PARTS)
    if unknown or not args.parts:
        raise ValueError(f"--parts takes some of {', '.join(PARTS)}, got {args.parts}")
    if not args.threads or not args.variants:
        raise ValueError("--threads and --variants need at least one value")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no GPU")


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_positive(
            num_actors=args.num_actors,
            num_envs_per_actor=args.num_envs_per_actor,
            unroll_length=args.unroll_length,
            seconds=args.seconds,
            repeats=args.repeats,
        )
        if args.command == "throughput":
            _check_throughput_args(args)
        elif args.round_trips < 1 or args.inference_timeout_ms < 0:
            raise ValueError("--round_trips must be >= 1 and --inference_timeout_ms >= 0")
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    machine = machine_summary()
    lines = _summary(args, throughput(args)) if args.command == "throughput" else inference(args)
    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print("\n" + "\n".join(lines))
    print(f"\nload average before: {load_before}; after: {load_after}")
    if args.write_results:
        command = "python -m benchmarks.bench " + " ".join(argv)
        loads = f"before {load_before}, after {load_after} (1, 5, 15 min)"
        _write_results(args.results, command, machine, loads, lines, args.command)
        print(f"appended to {args.results}")


if __name__ == "__main__":
    main()
