"""An actor's per-step work besides the env and the model, in one native call each.

`SoftmaxSampler` draws actions from softmax(logits) of fixed arrays; `sample_softmax`
does it for any float32 array; `StepCopies` runs a fixed list of memory copies (a
step's fields into K rollout slots, or an actor's inputs into its request rows).

Why native: an actor steps its K envs for milliseconds between two policy steps, which
evicts the interpreter's and torch's code from the caches, so every call after the env
step runs cold. Measured in an actor's loop (Pong, K=8, 2-core EPYC): sampling with
four torch ops cost ~60 us per step there (~15 us hot), and the step's ten slot writes
through numpy ~78 us. Each is now one call into acting.c (see acting.h).

Random streams: each sampler has its own xoshiro256** stream, seeded from torch's
global generator when it is created; `sample_softmax` draws from one stream per thread,
seeded from torch's generator at the thread's first draw (a forked child starts its
streams afresh). So `torch.manual_seed` makes acting reproducible, and processes that
seed torch differently (as actors do) draw differently.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from beast.native._ext import ffi, lib

__all__ = ["SoftmaxSampler", "StepCopies", "sample_softmax"]

_UINT32_MAX = 2**32 - 1


def _torch_seed() -> int:
    """64 random bits from torch's global generator."""
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)) & (2**64 - 1)


def _new_rng(seed: int | None) -> object:
    rng = ffi.new("struct beast_rng *")
    lib.beast_rng_seed(rng, _torch_seed() if seed is None else seed & (2**64 - 1))
    return rng


def _logits_and_actions(logits: np.ndarray, actions: np.ndarray) -> tuple[int, int]:
    """(rows, num_actions) after checking the arrays the native sampler reads and writes."""
    if not isinstance(logits, np.ndarray) or logits.dtype != np.float32 or logits.ndim != 2:
        raise TypeError(f"logits must be a float32 numpy array [rows, num_actions], got {logits!r}")
    if not isinstance(actions, np.ndarray) or actions.dtype != np.int64:
        raise TypeError(f"actions must be an int64 numpy array, got {actions!r}")
    if not (logits.flags.c_contiguous and actions.flags.c_contiguous):
        raise ValueError("logits and actions must be C-contiguous")
    rows, num_actions = logits.shape
    if actions.size != rows:
        raise ValueError(f"actions has {actions.size} entries for {rows} rows of logits")
    if num_actions < 1 or rows > _UINT32_MAX or num_actions > _UINT32_MAX:
        raise ValueError(f"cannot sample from logits of shape {logits.shape}")
    if not actions.flags.writeable:
        raise ValueError("actions must be writeable")
    return rows, num_actions


class SoftmaxSampler:
    """actions[i] ~ softmax(logits[i]) for two fixed arrays, one native call per `sample`.

    The draw is by inverse CDF in double precision: exact up to rounding, -inf logits
    never drawn. A row holding NaN or +inf gets its first such entry (as argmax-based
    samplers do); the learner then reports the non-finite loss.

    Args:
        logits: float32 [rows, num_actions], C-contiguous; read at each `sample`.
        actions: int64 [rows], C-contiguous; written at each `sample`.
        seed: the stream's seed; default drawn from torch's global generator.
    """

    def __init__(self, logits: np.ndarray, actions: np.ndarray, seed: int | None = None) -> None:
        self._rows, self._num_actions = _logits_and_actions(logits, actions)
        self._arrays = (logits, actions)  # the pointers below live as long as these
        self._logits = ffi.cast("const float *", logits.ctypes.data)
        self._actions = ffi.cast("int64_t *", actions.ctypes.data)
        self._rng = _new_rng(seed)

    def sample(self) -> None:
        lib.beast_sample_softmax(
            self._rng, self._logits, self._rows, self._num_actions, self._actions
        )


class _ThreadStreams(threading.local):
    rng = None  # made at a thread's first draw, from torch's generator as it is then


_streams = _ThreadStreams()


def _thread_rng() -> object:
    rng = _streams.rng
    if rng is None:
        rng = _streams.rng = _new_rng(None)
    return rng


def _forget_streams_after_fork() -> None:
    global _streams
    _streams = _ThreadStreams()


os.register_at_fork(after_in_child=_forget_streams_after_fork)


def sample_softmax(logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """int64 [rows] actions, row i drawn from softmax(logits[i]) (float32 [rows, A]).

    As `SoftmaxSampler`, for arrays that change from call to call; each thread draws
    from its own stream. `out`: a C-contiguous int64 [rows] array to write (returned).
    """
    logits = np.ascontiguousarray(logits)
    if out is None:
        out = np.empty(logits.shape[:1], dtype=np.int64)
    rows, num_actions = _logits_and_actions(logits, out)
    lib.beast_sample_softmax(
        _thread_rng(),
        ffi.cast("const float *", logits.ctypes.data),
        rows,
        num_actions,
        ffi.cast("int64_t *", out.ctypes.data),
    )
    return out


class StepCopies:
    """A fixed list of copies run in order by one native call: `run(t)` copies each
    pair's `src` into `dst[t]`.

    A rollout slot's field is [T+1, ...]: with `dst` that slot's field and `src` the
    env's row of the step's values, `run(t)` writes step t. With a one-step `dst`
    (`row[None]`), `run()` is a plain copy.

    Args:
        pairs: (dst, src) numpy arrays, both C-contiguous, of one dtype, with
            `dst[0].nbytes == src.nbytes`. The arrays are kept alive here.
    """

    def __init__(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        if len(pairs) > _UINT32_MAX:
            raise ValueError(f"too many copies: {len(pairs)}")
        self._arrays = [array for pair in pairs for array in pair]
        self._copies = ffi.new("struct beast_copy[]", max(len(pairs), 1))
        self._count = len(pairs)
        self._max_step = _UINT32_MAX
        for i, (dst, src) in enumerate(pairs):
            if dst.dtype != src.dtype:
                raise TypeError(f"copy {i}: dst is {dst.dtype}, src is {src.dtype}")
            if not (dst.flags.c_contiguous and src.flags.c_contiguous and dst.flags.writeable):
                raise ValueError(f"copy {i}: dst and src must be C-contiguous, dst writeable")
            if dst.ndim < 1 or len(dst) < 1 or dst[0].nbytes != src.nbytes:
                raise ValueError(
                    f"copy {i}: dst {dst.shape} has no step of src's shape {src.shape}"
                )
            copy = self._copies[i]
            copy.dst = ffi.cast("void *", dst.ctypes.data)
            copy.src = ffi.cast("const void *", src.ctypes.data)
            copy.nbytes = src.nbytes
            copy.dst_step = dst[0].nbytes
            self._max_step = min(self._max_step, len(dst) - 1)

    def run(self, step: int = 0) -> None:
        if step < 0 or lib.beast_copy_run(self._copies, self._count, step, self._max_step):
            raise IndexError(f"step {step} is outside the destinations' 0..{self._max_step}")
