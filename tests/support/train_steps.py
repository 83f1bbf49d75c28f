"""Building one algorithm's update twice, eager and compiled, on tiny networks, and the
batches to step them with (tests/learning/test_train_step*.py).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch

from beast.algos.base import LearnerContext
from beast.algos.build import build_algorithm
from beast.envs.spec import EnvSpec
from beast.experience.contract import Batch
from beast.learning.learner import Stepper, TrainingProgress
from beast.run.parsing import parse_args
from beast.train_step import (
    ParameterGroup,
    StepLoss,
    TrainStep,
)

CARTPOLE = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), num_actions=2)


PENDULUM = EnvSpec(
    obs_shape=(3,),
    obs_dtype=np.dtype(np.float32),
    num_actions=0,
    action_shape=(1,),
    action_low=(-2.0,),
    action_high=(2.0,),
)


def build(
    algo: str,
    spec: EnvSpec,
    compile: str,
    *flags: str,
    clipping: float = 0.0,
    background: bool = False,
    device: str = "cpu",
    identity: str | None = None,
):
    """An algorithm's update on a tiny network, seeded: two builds start identical.
    `identity`: the run's step identity (beast/run/build.py `step_identity`)."""
    env = "Pendulum-v1" if spec.continuous else "CartPole-v1"
    config = parse_args(["--algo", algo, "--env", env, *flags])
    torch.manual_seed(0)
    algorithm = build_algorithm(config, spec)
    model = algorithm.build_model().to(device)
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=clipping,
        max_nonfinite_updates=3,
        lr_schedule="linear",
        total_steps=10_000,
        progress=progress,
    )
    lines: list[str] = []
    context = LearnerContext(
        device=torch.device(device),
        bf16=False,
        step=stepper,
        progress=progress,
        compile=compile,
        log=lines.append,
        compile_in_background=background,
        step_identity=identity,
    )
    update = algorithm.learner(model, context)
    update.log_lines = lines  # what the step said: why it is not compiled, if it is not
    return model, update, progress


def transition_batch(B: int, seed: int, *, continuous: bool) -> Batch:
    g = torch.Generator().manual_seed(seed)
    obs = 3 if continuous else 4
    action = (
        torch.rand(2, B, 1, generator=g) * 4 - 2
        if continuous
        else torch.randint(0, 2, (2, B), generator=g)
    )
    data = {
        "obs": torch.randn(2, B, obs, generator=g),
        "reward": torch.randn(2, B, generator=g),
        "done": torch.zeros(2, B, dtype=torch.bool),
        "last_action": torch.zeros(2, B, 1) if continuous else torch.zeros(2, B, dtype=torch.int64),
        "action": action,
        "n_step_rewards": torch.randn(3, B, generator=g),
        "n_steps": torch.randint(1, 4, (B,), generator=g),
        "terminal": torch.rand(B, generator=g) < 0.2,
    }
    return Batch(data=data, weights=torch.rand(B, generator=g) + 0.5)


def rollout_batch(T: int, B: int, seed: int, *, hidden: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(T + 1, B, generator=g) < 0.1
    data = {
        "obs": torch.randn(T + 1, B, 4, generator=g),
        "reward": torch.randn(T + 1, B, generator=g),
        "done": done,
        "terminated": done & (torch.rand(T + 1, B, generator=g) < 0.5),
        "truncated": torch.zeros(T + 1, B, dtype=torch.bool),
        "last_action": torch.randint(0, 2, (T + 1, B), generator=g),
        "action": torch.randint(0, 2, (T + 1, B), generator=g),
        "policy_logits": torch.randn(T + 1, B, 2, generator=g),
        "baseline": torch.randn(T + 1, B, generator=g),
        "mask": torch.ones(T + 1, B, dtype=torch.bool),
    }
    data["terminated"] = data["done"] & data["terminated"]
    if hidden:
        data["core_state_0"] = torch.randn(1, B, hidden, generator=g)
        data["core_state_1"] = torch.randn(1, B, hidden, generator=g)
    return Batch(data=data, weights=torch.rand(B, generator=g) + 0.5)


def assert_same_steps(eager, compiled, batches, progress_pair, *, priorities=False):
    """Both updates take each batch; after every step their parameters (and, for a
    prioritized replay, the priorities they return) agree to float tolerance."""
    (model_a, update_a), (model_b, update_b) = eager, compiled
    for i, batch in enumerate(batches):
        for progress in progress_pair:
            progress.step = 100 * i  # the linear learning-rate schedule moves
        torch.manual_seed(i)  # the noise SAC and TD3 draw outside the step
        info_a = update_a(copy.deepcopy(batch))
        torch.manual_seed(i)
        info_b = update_b(copy.deepcopy(batch))
        for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
            # float32 through a few steps of Adam: the two orders of summation differ
            # by rounding, ~1e-7 relative per step.
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        for key in info_a.stats:
            torch.testing.assert_close(
                torch.as_tensor(info_b.stats[key]).float(),
                torch.as_tensor(info_a.stats[key]).float(),
                rtol=1e-4,
                atol=1e-5,
                equal_nan=True,  # TD3's actor loss before its first actor update
            )
        if priorities:
            torch.testing.assert_close(info_b.priorities, info_a.priorities, rtol=1e-4, atol=1e-5)


def step_until_compiled(update, seconds: float = 30.0) -> None:
    """DQN steps on fresh batches until a background compilation is adopted."""
    deadline = time.monotonic() + seconds
    seed = 0
    while update.train_step.path != "compiled" and time.monotonic() < deadline:
        update(transition_batch(8, seed, continuous=False))
        seed += 1
    assert update.train_step.path == "compiled", update.log_lines


def pair(algo, spec, *flags, clipping=0.0, identity=None, compile="on", device="cpu"):
    """Two builds of one update from the same weights: eager on the CPU, and `compile`
    on `device`."""
    model_a, update_a, progress_a = build(algo, spec, "off", *flags, clipping=clipping)
    model_b, update_b, progress_b = build(
        algo, spec, compile, *flags, clipping=clipping, identity=identity, device=device
    )
    return (model_a, update_a), (model_b, update_b), (progress_a, progress_b)


def block_of(batches: list[Batch], device: str = "cpu") -> Batch:
    """The batches as one block, as a replay samples `--updates_per_sample` of them: cut
    along dim 0 of 1-D tensors and dim 1 of the others (interface.py `split_block`)."""
    return Batch(
        data={
            key: torch.cat([b.data[key] for b in batches], dim=0 if value.dim() == 1 else 1).to(
                device
            )
            for key, value in batches[0].data.items()
        },
        weights=torch.cat([b.weights for b in batches]).to(device),
        parts=len(batches),
    )


def scaled_linear_step(compile: str, *, max_nonfinite_updates: int = 3, proceed: bool = False):
    """A linear model's TrainStep on the loss mean(model(x) * scale) (Adam, lr 0.1), with
    a `proceed` where asked: (model, optimizer, progress, step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["initial_lr"] = 0.1
    progress = TrainingProgress()
    stepper = Stepper(
        grad_norm_clipping=0.0,
        max_nonfinite_updates=max_nonfinite_updates,
        lr_schedule="constant",
        total_steps=100,
        progress=progress,
    )

    def loss(inputs, train):
        value = (model(inputs["x"]).squeeze(-1) * inputs["scale"]).mean()
        return StepLoss(
            value, {"loss": value.detach()}, proceed=torch.tensor(True) if proceed else None
        )

    step = TrainStep(
        loss,
        modules={"model": model},
        groups=[ParameterGroup("model", optimizer)],
        stepper=stepper,
        compile=compile,
        log=lambda line: None,
    )
    return model, optimizer, progress, step
