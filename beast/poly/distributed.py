"""Several learners: torch.distributed data parallelism for beast's Learner.

Each learner process (a Ray actor, see beast/poly/trainer.py) runs the
unchanged `beast.learning.learner.Learner` on batches from its own env servers and
gives a `GradientReducer` to its `Stepper` as the `reduce_gradients` hook. On
every optimizer step, after the backward pass and before the step, every
learner calls it (it is a collective: all of them, every step, finite or not;
an algorithm takes the same steps on every learner). It

1. all-reduces two flags with MAX: "my loss or gradient is not finite" and
   "I was asked to stop". Every learner then takes the same decision: skip
   the update everywhere if any learner's is non-finite, and make this the
   last update everywhere if any learner was asked to stop (the learners
   then end together, as at total_steps, and none is left waiting in a
   collective for a peer that quit);
2. all-reduces the gradients with SUM, flattened into one buffer (one
   collective instead of one per parameter);
3. clips the combined gradient by global norm (the Learner is built with
   clipping off, so that clipping applies to the combined gradient, as one
   learner on all the data would clip it).

Why SUM and not the mean: IMPALA's losses are sums over T and B
(beast/algos/impala.py), so the gradient of one learner on the concatenated
batch of N learners is the sum of theirs. (A loss that is a mean over its batch,
as R2D2's, gets N times the step of one learner on the concatenated batch; its
learning rate is the knob, as with DDP's per-GPU batch sizes.) Summing makes N learners with
`--batch_size B` exactly one learner with batch N*B (up to float rounding),
which is what tests/poly/test_polybeast.py checks; DDP averages because its
losses are means, which amounts to the same thing.

Every learner starts from rank 0's parameters (broadcast at start), steps
with identical combined gradients and identical optimizer state, so the
parameters stay bit-identical across learners; only rank 0 checkpoints.
Backends: gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["GradientReducer", "broadcast_parameters", "init_process_group"]


def init_process_group(
    init_method: str, rank: int, world_size: int, device: torch.device, timeout_s: float
) -> None:
    """Join the learners' process group (gloo on CPU, NCCL on GPU).

    `timeout_s` bounds every collective: a learner whose peer died fails after
    it instead of hanging.
    """
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def broadcast_parameters(tensors: Iterable[torch.Tensor]) -> None:
    """Overwrite every learner's tensors with rank 0's, in place."""
    with torch.no_grad():
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


class GradientReducer:
    """The Learner's `reduce_gradients` hook; see the module docstring.

    Args:
        grad_norm_clipping: global norm bound for the combined gradient (0: none).
        stop_requested: set when this learner should stop; read at each update.
        on_last_update: called (in the learner thread, lock held) when the learners
            agreed that this update is the last one.
    """

    def __init__(
        self,
        grad_norm_clipping: float,
        stop_requested: threading.Event,
        on_last_update: Callable[[], None],
    ) -> None:
        self.grad_norm_clipping = grad_norm_clipping
        self.stop_requested = stop_requested
        self.on_last_update = on_last_update
        self.global_grad_norm = float("nan")  # of the combined gradient, before clipping

    def __call__(self, params: list[torch.Tensor], finite: bool) -> bool:
        """All-reduce `params`' gradients (an optimizer step's parameters) across learners,
        after agreeing on finiteness and on a stop; see the module docstring."""
        flags = torch.tensor([0.0 if finite else 1.0, 1.0 if self.stop_requested.is_set() else 0.0])
        flags = flags.to(params[0].device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        all_finite, stop = bool(flags[0] == 0), bool(flags[1] > 0)
        if stop:
            self.on_last_update()
        if not all_finite:
            return False
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            if p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
        max_norm = self.grad_norm_clipping if self.grad_norm_clipping > 0 else float("inf")
        norm = nn.utils.clip_grad_norm_(params, max_norm)
        self.global_grad_norm = float(norm)
        # Every learner sees the same combined gradient, so this agrees everywhere.
        return bool(torch.isfinite(norm))
