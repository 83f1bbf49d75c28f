"""torch.compile's settings for the learner's step (beast/train_step/__init__.py): the
backend, the guards kept, where compiled graphs persist between runs, and the
per-thread configuration every thread that compiles or runs a compiled step sets."""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

import torch

from beast.util.records import compile_cache_dir

__all__ = [
    "BACKEND",
    "configure_build",
    "configure_compiler",
    "first_line",
    "probe_instruction_sets",
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


def configure_build() -> None:
    """In a package build's child (beast/train_step/package.py), before its build: what
    made a cold build of a SAC Pendulum step cost more than the step's own compilation
    (the 2-core VM, CPU seconds, benchmarks/RESULTS.md 2026-12-07):

    - The instruction-set probes: inductor compiles and loads a test program per vector
      instruction set the CPU's flags list (AVX2, AVX-512: 1.8-2.9 CPU s each, 6-7 s in
      all, again in every empty cache). The flags already say what the CPU runs, and
      torch's own kernels were picked by them (`cpp.vec_isa_ok`); the probes of the
      extensions (AVX-512 BF16, VNNI, AMX: 0.4 s each) still run, before the child
      has its program (`probe_instruction_sets`), while the learner traces the step.
    - The C++ wrapper and the kernels, compiled one after the other: 7.5-10.7 and
      1.4-5.5 CPU s. They are independent objects until the link, so the wrapper
      compiles beside the kernels (`_wrapper_beside_kernels`).
    - Precompiled headers: inductor keeps them in /tmp, outside any cache beast names,
      writes them in place and never checks one it finds; a build stopped while writing
      one (a stopped run stops its build's compilers) left a truncated header that gcc
      then ignored, silently, in every later build (each paying the parse it was meant
      to save, 1-2 s), and a fresh machine pays 5-6 s a header before its first build.
      The build's compilers parse the headers themselves."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.vec_isa_ok = True
    inductor_config.aot_inductor.precompile_headers = False
    _wrapper_beside_kernels()


def probe_instruction_sets() -> None:
    """inductor's remaining instruction-set probes (each a small C++ compile and load, in
    child processes), now: a build's child runs them while it waits for its program,
    instead of when the first kernel's code needs them."""
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.pick_vec_isa()


def _wrapper_beside_kernels() -> None:
    """inductor compiles an ahead-of-time package's C++ wrapper (`*.wrapper.o`), then its
    kernels (`*.kernel.o`), then links them (`*.wrapper.so`): the wrapper's compile goes
    to a thread of its own, which the kernels' compile waits for before it returns (and
    the link before it starts). Other compiles (the probes') are left alone."""
    from torch._inductor import cpp_builder

    build = cpp_builder.CppBuilder.build
    pending: list[tuple[threading.Thread, list[BaseException]]] = []

    def finish_pending() -> None:
        while pending:
            thread, errors = pending.pop()
            thread.join()
            if errors:
                raise errors[0]

    def build_in_parallel(self: Any) -> Any:
        target = self.get_target_file_path()
        if target.endswith(".wrapper.o") and not pending:
            errors: list[BaseException] = []

            def compile_wrapper() -> None:
                try:
                    build(self)
                except BaseException as error:  # raised where the kernels' compile ends
                    errors.append(error)

            thread = threading.Thread(target=compile_wrapper, name="wrapper-compile")
            thread.start()
            pending.append((thread, errors))
            return None
        if target.endswith(".wrapper.so"):
            finish_pending()
        if not target.endswith(".kernel.o"):
            return build(self)
        try:
            return build(self)
        finally:
            finish_pending()

    cpp_builder.CppBuilder.build = build_in_parallel


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
