"""torch.compile's settings for the learner's step (beast/train_step/__init__.py): the
backend, the guards kept, where compiled graphs persist between runs, and the
per-thread configuration every thread that compiles or runs a compiled step sets."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from beast.util.records import compile_cache_dir

__all__ = [
    "BACKEND",
    "configure_compiler",
    "first_line",
    "import_compiler",
    "inductor_patch",
    "lean_guards",
]

# torch.compile's backend: inductor generates the fused C++ (CPU) or Triton (CUDA) code.
BACKEND = "inductor"


def lean_guards() -> dict[str, Any]:
    """torch.compile's arguments that keep only the guards on the tensors passed in (their
    shapes, dtypes, devices), where this torch has them: the graph's Python constants
    (modules, hyperparameters, the kind of step) are its compiled function's own
    (`isolate_recompiles`: its own entries, never another step's or kind's), and
    evaluating guards on all of them cost about as much as a small network's step."""
    keep = getattr(torch.compiler, "keep_tensor_guards_unsafe", None)
    if keep is None or "isolate_recompiles" not in inspect.signature(torch.compile).parameters:
        return {}
    return {"isolate_recompiles": True, "options": {"guard_filter_fn": keep}}


def inductor_patch(**settings: Any) -> Any:
    """inductor's settings for the compilations inside the block."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(settings)


def configure_compiler() -> None:
    """Before a compilation, and in the thread that runs compiled steps (which may
    recompile): generated CPU kernels follow the torch thread count at run time
    (`cpp.dynamic_threads`: the learner's count is measured and may change), compiled
    graphs persist in `compile_cache_dir()`, and dynamo traces through LSTM modules
    (`allow_rnn`: a compiled step runs their cell arithmetic itself, beast/models/lstm.py
    `_lstm_steps`, and only reads their parameters). torch keeps these settings per
    thread (its config overrides are context variables), so every such thread sets them."""
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch writes its /tmp default into TORCHINDUCTOR_CACHE_DIR the first time anything
    # asks for the cache, so a user's own setting is one that differs from that default.
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache_dir()
    inductor_config.cpp.dynamic_threads = True
    # Compile in-process: no pool of compile workers to outlive a stopped run (and on a
    # machine whose cores the run uses, no faster).
    inductor_config.compile_threads = 1
    torch._dynamo.config.allow_rnn = True


def import_compiler() -> None:
    """Import the compiler's modules in the calling thread, before a compilation thread
    starts. Two threads importing modules that import each other can each be handed the
    other's half-initialised module: a compilation whose run was stopped at once, while
    the stop's checkpoint imported torch._dynamo, failed on a `torch.ops.prims` not yet
    filled in (and the process then aborted at exit)."""
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._prims  # noqa: F401
    import torch.export  # noqa: F401
    import torch.fx.experimental.proxy_tensor  # noqa: F401


def first_line(error: BaseException) -> str:
    """An error's first line, cut short, for the one log line a failure gets."""
    return (str(error).strip().splitlines() or [""])[0][:240]
