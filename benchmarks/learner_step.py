"""Milliseconds per learner update, eager against compiled (beast/train_step/).

    python -m benchmarks.learner_step                      # every case, 1 thread, CPU
    python -m benchmarks.learner_step --only dqn,sac --threads 2
    python -m benchmarks.learner_step --beside 1           # with an acting process busy
    python -m benchmarks.learner_step --only td3_pendulum --flags "--updates_per_sample 1"
    python -m benchmarks.learner_step --device cuda        # + the CUDA-graph replay

Each case is a real algorithm's update (its shipped config for the env, the network its
config builds, its optimizers, targets and priorities) on a synthetic batch laid out as
its experience is (rollouts, sequences, transitions). The eager and the compiled update
start from the same weights and run alternately in this process: `--repeats` timings of
`--updates` updates each, the median reported, and the ratio. The compiled update is
timed after its compilation (whose seconds are printed: cached graphs load in seconds).

`--beside N` starts N processes that step the case's env with random actions (an
actor's CPU load, its wake-ups included) for the whole measurement, to see the update
beside acting as a run has it. Timings are wall-clock; on CUDA each timing ends with a
synchronisation.

Cases: dqn (256-256, batch 64), ppo_cartpole (64-64 separate MLPs, the 256-step
minibatch), ppo_halfcheetah, sac_halfcheetah and sac_pendulum (256-256, batch 256),
td3_pendulum (400-300, batch 256: its block of 4 trains the critic alone, then critic
and actor, by turns), impala_atari (T=80, B=8), ppo_atari, r2d2_atari, rainbow_atari,
user_model (DQN on CartPole with `UserQNetwork` below, as `--model
benchmarks.learner_step:UserQNetwork`). `--flags` adds run flags to every case's
(`--updates_per_sample 1`: one step a call).
"""

from __future__ import annotations

import argparse
import copy
import math
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from beast import envs
from beast.algos.base import LearnerContext
from beast.algos.build import build_algorithm, build_checked_model
from beast.experience.contract import Batch
from beast.experience.rollout_slots import rollout_spec
from beast.experience.sequence_replay import sequence_spec
from beast.experience.specs import Rollouts, SequenceReplay, TransitionReplay
from beast.experience.transition_replay import step_spec
from beast.fields import Field, core_state_shapes
from beast.learning.learner import Stepper, TrainingProgress
from beast.run.measure import synthetic_batch
from beast.run.parsing import parse_args
from beast.train_step import auto as compile_auto
from benchmarks.races import split_flags

__all__ = ["CASES", "UserQNetwork", "main"]


class UserQNetwork(nn.Module):
    """A Q-network as a user writes one (docs/models.md): a 256-256 MLP with layer norm and
    a dueling head, no beast base class."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        size = int(np.prod(obs_shape))
        self.body = nn.Sequential(
            nn.Linear(size, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()
        )
        self.value = nn.Linear(256, 1)
        self.advantage = nn.Linear(256, num_actions)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        obs = inputs["obs"]
        T, B = obs.shape[:2]
        x = self.body(obs.flatten(0, 1).flatten(1).float())
        advantage = self.advantage(x)
        q = self.value(x) + advantage - advantage.mean(dim=1, keepdim=True)
        return {"q_values": q.view(T, B, -1)}, ()


@dataclass(frozen=True)
class Case:
    """An update to time: the flags of its run (its env's shipped config applies)."""

    name: str
    argv: tuple[str, ...]
    actor_env: str  # what `--beside` processes step


CASES = {
    case.name: case
    for case in (
        Case("dqn", ("--algo", "dqn", "--env", "CartPole-v1"), "CartPole-v1"),
        Case("ppo_cartpole", ("--algo", "ppo", "--env", "CartPole-v1"), "CartPole-v1"),
        Case("ppo_halfcheetah", ("--algo", "ppo", "--env", "HalfCheetah-v5"), "HalfCheetah-v5"),
        Case("sac_halfcheetah", ("--algo", "sac", "--env", "HalfCheetah-v5"), "HalfCheetah-v5"),
        Case("sac_pendulum", ("--algo", "sac", "--env", "Pendulum-v1"), "Pendulum-v1"),
        Case("td3_pendulum", ("--algo", "td3", "--env", "Pendulum-v1"), "Pendulum-v1"),
        Case("impala_atari", ("--env", "PongNoFrameskip-v4"), "PongNoFrameskip-v4"),
        Case(
            "ppo_atari",
            ("--algo", "ppo", "--env", "PongNoFrameskip-v4"),
            "PongNoFrameskip-v4",
        ),
        Case(
            "r2d2_atari",
            ("--algo", "r2d2", "--env", "PongNoFrameskip-v4"),
            "PongNoFrameskip-v4",
        ),
        Case(
            "rainbow_atari",
            ("--algo", "rainbow", "--env", "PongNoFrameskip-v4"),
            "PongNoFrameskip-v4",
        ),
        Case(
            "user_model",
            (
                "--algo",
                "dqn",
                "--env",
                "CartPole-v1",
                "--model",
                "benchmarks.learner_step:UserQNetwork",
            ),
            "CartPole-v1",
        ),
    )
}


def _random(shape: Sequence[int], dtype: torch.dtype, high: int, g: torch.Generator):
    if dtype == torch.uint8:
        return torch.randint(0, 256, tuple(shape), dtype=dtype, generator=g)
    if dtype == torch.bool:
        return torch.rand(tuple(shape), generator=g) < 0.01
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), generator=g).clamp(-1.0, 1.0).to(dtype)
    return torch.randint(0, max(high, 1), tuple(shape), dtype=dtype, generator=g)


def synthetic(algorithm, model: nn.Module, batch_size: int, seed: int = 0) -> Batch:
    """A batch of `batch_size` laid out as the algorithm's experience hands the learner."""
    spec, experience = algorithm.spec, algorithm.experience()
    record = algorithm.acting_rule().record_spec()
    states = core_state_shapes(model.initial_state(1))
    g = torch.Generator().manual_seed(seed)
    actions = spec.num_actions
    if isinstance(experience, Rollouts):
        layout = rollout_spec(
            unroll_length=experience.unroll_length,
            obs=spec.obs_fields(),
            record=record,
            core_state_shapes=states,
        )
        return Batch(data=synthetic_batch(layout, batch_size, actions, seed=seed))
    if isinstance(experience, SequenceReplay):
        layout = sequence_spec(
            seq_len=experience.seq_len,
            obs=spec.obs_fields(),
            record=record,
            core_state_shapes=states,
        )
        data = {}
        for key, f in layout.items():
            # Rows [L, B, ...]; a core state [d0, B, ...]: the batch axis second either way.
            data[key] = _random((f.shape[0], batch_size, *f.shape[1:]), f.dtype, actions, g)
        data["mask"] = torch.ones_like(data["mask"])
        return Batch(data=data, weights=torch.rand(batch_size, generator=g) + 0.5)
    assert isinstance(experience, TransitionReplay)
    layout: dict[str, Field] = step_spec(spec.obs_fields(), record)
    data = {k: _random((2, batch_size, *f.shape), f.dtype, actions, g) for k, f in layout.items()}
    n = experience.n_step
    data["n_step_rewards"] = torch.randn(n, batch_size, generator=g)
    data["n_steps"] = torch.randint(1, n + 1, (batch_size,), generator=g)
    data["terminal"] = torch.rand(batch_size, generator=g) < 0.01
    return Batch(data=data, weights=torch.rand(batch_size, generator=g) + 0.5)


class GradientRecorder:
    """A learner's stepper that only differentiates: the flat gradient of the last loss
    (zeros for a parameter it does not reach), and no step (beast/learning/learner.py `Stepper`)."""

    grad_norm_clipping = 0.0

    def __call__(self, loss: torch.Tensor, optimizers: Sequence, params: Sequence) -> bool:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.loss = float(loss)
        self.grad = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]
        ).double()
        return False


class Timed:
    """One update of a case, built as a run builds it, on a device, eager or compiled."""

    def __init__(
        self,
        case: Case,
        compile: str,
        device: torch.device,
        cuda_graphs: bool,
        *,
        bf16: bool = False,
        stepper: Any = None,
    ):
        config = parse_args([*case.argv, "--compile", compile])
        probe = envs.make(config.env, seed=0)
        try:
            spec = envs.env_spec(probe)
        finally:
            probe.close()
        torch.manual_seed(0)
        self.algorithm = build_algorithm(config, spec)
        self.model = build_checked_model(self.algorithm).to(device)
        progress = TrainingProgress(step=1)
        stepper = stepper or Stepper(
            grad_norm_clipping=config.grad_norm_clipping,
            max_nonfinite_updates=10**9,
            lr_schedule=config.lr_schedule,
            total_steps=config.total_steps,
            progress=progress,
        )
        self.lines: list[str] = []
        context = LearnerContext(
            device=device,
            bf16=bf16,
            step=stepper,
            progress=progress,
            compile=compile,
            log=self.lines.append,
            optimizer_steps=None,
        )
        self.update = self.algorithm.learner(self.model, context)
        self.update.train_step.cuda_graphs = cuda_graphs
        # A replay's block of --updates_per_sample batches, as its learner samples them.
        replay = not isinstance(self.algorithm.experience(), Rollouts)
        parts = config.updates_per_sample if replay else 1
        batch = synthetic(self.algorithm, self.model, config.batch_size * parts)
        self.batch = Batch(
            data={k: v.to(device) for k, v in batch.data.items()},
            weights=None if batch.weights is None else batch.weights.to(device),
            parts=parts,
        )
        self.device = device

    def __call__(self) -> None:
        """One learner update: a block in one call where the update takes blocks, else
        each of its batches in turn (beast/learning/learner.py `Learner.step`)."""
        batch = copy.copy(self.batch)
        if batch.parts == 1 or self.update.block(batch) is None:
            for part in batch.split():
                self.update(part)

    def warm(self) -> None:
        """Run until every kind of step is compiled (or decided eager) and timed against
        eager: their compilations untimed. A kind called once an update (PPO's targets)
        is decided after `EAGER_PROBES` updates and timed over as many more."""
        step = self.update.train_step
        for update in range(40):
            self()
            if step.decision.mode == "off":
                if update >= 19:
                    break
            elif update > 2 * compile_auto.EAGER_PROBES and step.settled:
                break
        before = self.update.train_step.steps_taken
        self()
        self.sync()
        self.steps_per_update = self.update.train_step.steps_taken - before

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, updates: int, clock: Callable[[], float]) -> float:
        """Seconds per update over `updates` updates, by `clock`."""
        self.sync()
        start = clock()
        for _ in range(updates):
            self()
        self.sync()
        return (clock() - start) / updates


def gradient_parity(case: Case, device: torch.device, print_line: Callable) -> None:
    """bf16 against fp32 on one batch from the same weights, as the IMPALA check in
    benchmarks/bench.py measures it: the loss's relative difference, the gradient's
    relative error and cosine, and, for scale, the cosine between the fp32 gradients of
    the batch's two halves (what sampling alone moves a gradient by)."""
    recorders = {"fp32": GradientRecorder(), "bf16": GradientRecorder()}
    runs = {
        name: Timed(case, "off", device, False, bf16=name == "bf16", stepper=recorder)
        for name, recorder in recorders.items()
    }
    for run in runs.values():
        run()
    fp32, bf16 = recorders["fp32"], recorders["bf16"]
    reference, other = fp32.grad, bf16.grad
    halves = []
    for half in Batch(runs["fp32"].batch.data, runs["fp32"].batch.weights, parts=2).split():
        runs["fp32"].update(half)
        halves.append(fp32.grad)
    cosine = torch.nn.functional.cosine_similarity
    print_line(
        f"{case.name:16s} bf16 vs fp32: loss {abs(bf16.loss - fp32.loss) / abs(fp32.loss):.2e}"
        f" relative, gradient relative error"
        f" {float((other - reference).norm() / reference.norm()):.3f}, cosine"
        f" {float(cosine(other, reference, dim=0)):.4f}; two half batches' fp32 gradients:"
        f" cosine {float(cosine(halves[0], halves[1], dim=0)):.4f}"
    )


def _acting_load(env_id: str, stop: multiprocessing.synchronize.Event) -> None:
    torch.set_num_threads(1)
    env = envs.make(env_id, seed=0)
    env.reset(seed=0)
    while not stop.is_set():
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()


def _time_every_compiled_step() -> None:
    """The benchmark times the compiled step whatever it gains: no going back to eager
    when it is slower, as a run would (beast/train_step/)."""
    compile_auto.KEEP_COMPILED_BELOW = math.inf


def measure(
    case: Case,
    *,
    device: torch.device,
    bf16: bool,
    updates: int,
    repeats: int,
    clock: Callable[[], float],
    print_line: Callable,
) -> dict[str, float]:
    variants = {"eager": ("off", False), "compiled": ("on", False)}
    if device.type == "cuda":
        variants["cuda graph"] = ("on", True)
    runs = {
        name: Timed(case, mode, device, graphs, bf16=bf16)
        for name, (mode, graphs) in variants.items()
    }
    started = time.perf_counter()
    for run in runs.values():
        run.warm()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run.time(updates, clock))
    medians = {name: statistics.median(values) for name, values in times.items()}
    eager = medians["eager"]
    # PPO's update is many minibatch steps: per optimizer step too.
    steps = runs["eager"].steps_per_update
    parts = []
    for name, seconds in medians.items():
        spread = f"{min(times[name]) * 1e3:.2f}-{max(times[name]) * 1e3:.2f}"
        per_step = f", {seconds / steps * 1e3:.3f} ms a step" if steps > 1 else ""
        parts.append(f"{name} {seconds * 1e3:.2f} ms ({spread}{per_step})")
    compiled = runs["compiled"].update.train_step
    ratio = eager / medians["compiled"]
    print_line(
        f"{case.name:16s} " + ", ".join(parts) + f"; x{ratio:.2f}; compile"
        f" {compiled.compile_seconds:.1f} s ({compiled.path});"
        f" {time.perf_counter() - started:.0f} s in all"
    )
    return medians


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--updates", type=int, default=50, help="updates per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per variant")
    parser.add_argument("--beside", type=int, default=0, help="acting processes beside it")
    parser.add_argument(
        "--flags",
        type=split_flags,
        default=(),
        help='run flags added to every case\'s, e.g. "--updates_per_sample 1"',
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "bf16"),
        help="the learner's (bf16: autocast, as --precision bf16 runs it)",
    )
    parser.add_argument(
        "--parity",
        action="store_true",
        help="instead of timing: each case's bf16 gradient against its fp32 one",
    )
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="wall-clock, or the thread's CPU time (one thread on a CPU shared with other"
        " work: what the update costs when it has its core, not the waits for one)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.clock == "cpu" and (args.threads != 1 or device.type != "cpu"):
        raise SystemExit("--clock cpu times one thread on the CPU: use --threads 1 --device cpu")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), device {device},"
        f" {args.beside} acting process(es) beside; median of {args.repeats} timings of"
        f" {args.updates} updates, {args.clock} clock",
        flush=True,
    )
    _time_every_compiled_step()
    if args.parity:
        for name in names:
            gradient_parity(CASES[name], device, lambda line: print(line, flush=True))
        return
    context = multiprocessing.get_context("spawn")
    for name in names:
        case = replace(CASES[name], argv=CASES[name].argv + args.flags)
        stop = context.Event()
        actors = [
            context.Process(target=_acting_load, args=(case.actor_env, stop), daemon=True)
            for _ in range(args.beside)
        ]
        for actor in actors:
            actor.start()
        try:
            measure(
                case,
                device=device,
                bf16=args.precision == "bf16",
                updates=args.updates,
                repeats=args.repeats,
                clock=clock,
                print_line=lambda line: print(line, flush=True),
            )
        finally:
            stop.set()
            for actor in actors:
                actor.join(timeout=5)


if __name__ == "__main__":
    main()
