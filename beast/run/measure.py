"""Measurements the runtime itself takes (`--num_actors auto`, beast/run/autosize.py), which the
benchmarks (benchmarks/) reuse; the runtime never imports the benchmarks.

    torch_threads     a block with a given torch thread count
    TrivialModel      a model whose forward pass costs nothing, with an algorithm's outputs
    synthetic_batch   a learner batch of random rollouts, in the real layout
    learning_cost     CPU-seconds per agent step of one of an algorithm's updates
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from beast.algos.base import Algorithm, LearnerContext
from beast.experience.contract import Batch
from beast.experience.rollout_slots import RolloutBuffers
from beast.fields import Field
from beast.learning.learner import Stepper, TrainingProgress

__all__ = ["TrivialModel", "learning_cost", "synthetic_batch", "torch_threads"]

# Synthetic batch content, roughly Pong's: a point every ~20 steps, rare episode ends.
_REWARD_PROBABILITY = 0.05
_DONE_PROBABILITY = 0.01


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the body with `torch.set_num_threads(num_threads)`, then restore the old count."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be positive, got {num_threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TrivialModel(nn.Module):
    """A model whose forward pass costs next to nothing: zeros of an algorithm's outputs.

    With it, acting throughput measures the engine around the model (env stepping,
    writes, and for central inference the request round trips), not the model. The zero
    outputs are made once per input shape and returned again (policies copy outputs out,
    never write into them), so a forward pass runs no torch op at all. Zero logits are a
    uniform policy; zero Q-values a greedy one that picks action 0.

    Args:
        outputs: name -> per-env shape (`Algorithm.model_outputs()`).
    """

    def __init__(self, outputs: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.output_shapes = dict(outputs)
        self._outputs: dict[tuple, dict[str, torch.Tensor]] = {}

    def initial_state(self, batch_size: int, device=None) -> tuple[torch.Tensor, ...]:
        return ()

    def forward(self, inputs, core_state=()):
        reward = inputs["reward"]
        key = (*reward.shape[:2], reward.device)
        output = self._outputs.get(key)
        if output is None:
            output = self._outputs[key] = {
                name: torch.zeros((*key[:2], *shape), device=reward.device)
                for name, shape in self.output_shapes.items()
            }
        return output, ()


def synthetic_batch(
    spec: Mapping[str, Field], batch_size: int, num_actions: int, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A learner batch of `batch_size` random rollouts laid out as the learner gets it.

    The slots are filled in real `RolloutBuffers` and copied out with `gather`, so the
    batch has the real layout: rollout fields `[T+1, B, ...]`, core state `[d0, B, ...]`.
    Content is random but plausible: uniform pixels (or normal vectors), sparse +-1
    rewards, rare episode ends (no truncation), integer fields (actions) in
    [0, num_actions), `last_action[t] == action[t-1]`, normal float fields (logits).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    buffers = RolloutBuffers(spec, batch_size)
    for key, tensor in buffers.tensors.items():
        shape, dtype = tensor.shape, tensor.dtype
        if dtype == torch.uint8:
            tensor.copy_(torch.randint(0, 256, shape, dtype=dtype, generator=generator))
        elif dtype == torch.bool:
            if key != "truncated":
                tensor.copy_(torch.rand(shape, generator=generator) < _DONE_PROBABILITY)
        elif dtype.is_floating_point:
            tensor.copy_(torch.randn(shape, generator=generator))
        else:
            high = max(num_actions, 1)  # a continuous action space has no action count
            tensor.copy_(torch.randint(0, high, shape, dtype=dtype, generator=generator))
    tensors = buffers.tensors
    point = torch.rand(tensors["reward"].shape, generator=generator) < _REWARD_PROBABILITY
    tensors["reward"].copy_(point * torch.randn(point.shape, generator=generator).sign())
    tensors["last_action"][:, 1:] = tensors["action"][:, :-1]
    tensors["terminated"].copy_(tensors["done"])  # every episode end a termination
    tensors["rollout_id"].zero_()
    batch = buffers.gather(range(batch_size))
    buffers.close()
    return batch


def learning_cost(
    algorithm: Algorithm, *, bf16: bool, num_threads: int = 1, steps: int = 1
) -> float:
    """CPU-seconds per agent step of the algorithm's update on a synthetic batch of
    `--batch_size` rollouts of `--unroll_length` steps, on `num_threads` threads, after
    one untimed update. Algorithms that learn from rollouts only (the actor layout a
    replay's actors need is not measured here)."""
    config, spec = algorithm.config, algorithm.spec
    with torch_threads(num_threads):
        model = algorithm.build_model()
        progress = TrainingProgress()
        stepper = Stepper(
            grad_norm_clipping=config.grad_norm_clipping,
            max_nonfinite_updates=1_000_000,
            lr_schedule="constant",
            total_steps=1,
            progress=progress,
        )
        context = LearnerContext(
            device=torch.device("cpu"), bf16=bf16, step=stepper, progress=progress
        )
        update = algorithm.learner(model, context)
        item = algorithm.experience().measured_item(algorithm.experience_layout(model))
        if item is None:
            raise ValueError(f"{algorithm.name}'s experience is not measured on a batch")
        layout, steps_per_item = item
        batch = Batch(data=synthetic_batch(layout, config.batch_size, spec.num_actions))
        update(batch)
        start = time.perf_counter()
        for _ in range(steps):
            update(batch)
        elapsed = (time.perf_counter() - start) / steps
    # Wall-clock seconds on `num_threads` busy threads.
    return elapsed * num_threads / (steps_per_item * config.batch_size)
