"""A compiled step replayed as one CUDA graph (beast/train_step/__init__.py): on CUDA
one replay launches every kernel of the update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves

from beast.train_step.graph import copied

__all__ = ["CudaGraphStep"]


class CudaGraphStep:
    """A compiled step replayed as one CUDA graph: the batch is copied into static input
    tensors, the graph replays every kernel of the step, the outputs are the graph's.

    The state tensors (flat buffers, steps, learning rates) are the step's own and keep
    their addresses, so the graph updates them in place. Warm-up runs go to copies of the
    state on a side stream (cuBLAS and the allocator set up outside the capture); the
    capture itself runs nothing. A batch of another shape runs the compiled step as is.

    The capture's error mode is thread-local: central inference, in threads of its own,
    copies observations to the GPU throughout, which CUDA's global mode forbids to every
    thread while any captures (the copy and the capture both failed, on Pong).
    """

    def __init__(self, step: Callable[..., tuple[Any, ...]], arguments: tuple[Any, ...]):
        *state, inputs = arguments
        self.step = step
        self.inputs = copied(inputs)
        self.shapes = _shapes(self.inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step(*copied(state), self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.outputs = step(*state, self.inputs)

    def __call__(self, *arguments: Any) -> tuple[Any, ...]:
        *state, inputs = arguments
        if _shapes(inputs) != self.shapes:
            return self.step(*state, inputs)
        for static, value in zip(tree_leaves(self.inputs), tree_leaves(inputs), strict=True):
            if isinstance(static, Tensor):
                static.copy_(value, non_blocking=True)
        self.graph.replay()
        return self.outputs


def _shapes(tree: Any) -> list[Any]:
    return [
        (leaf.shape, leaf.dtype) if isinstance(leaf, Tensor) else leaf for leaf in tree_leaves(tree)
    ]
