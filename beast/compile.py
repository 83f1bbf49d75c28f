"""torch.compile for the learner's forward pass, with a fallback to eager.

On the 2-core development CPU, compiling AtariNet's learner forward pass under bf16
autocast cut the update (T=80, B=8, one thread) from 413 to 334 ms
(benchmarks/RESULTS.md), at the price of a first update that compiles for 20-40 s.
Compilation needs a C++ compiler and can fail on unusual models or platforms; a run
must not die of it, so the first failure is logged once and the learner goes on
uncompiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["CompiledForward"]


class CompiledForward:
    """Calls `model` through `torch.compile(model)`; eager after a compilation failure.

    Generated CPU kernels are built with inductor's `cpp.dynamic_threads`, so they
    follow the torch thread count at run time instead of the one seen at compile time.
    """

    def __init__(self, model: nn.Module, log: Callable[[str], None]) -> None:
        self.model = model
        self.log = log
        self._compiled: Callable[..., Any] | None = torch.compile(model)

    @property
    def compiled(self) -> bool:
        """False once compilation has failed and calls go to the eager model."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self._compiled is not None:
            import torch._inductor.config as inductor_config

            try:
                with inductor_config.patch({"cpp.dynamic_threads": True}):
                    return self._compiled(*args)
            except Exception as error:  # dynamo/inductor errors, a missing compiler
                reason = (str(error).strip().splitlines() or [""])[0][:200]
                self.log(
                    f"torch.compile failed ({type(error).__name__}: {reason}); the learner"
                    " goes on uncompiled (--no-compile skips compiling)"
                )
                self._compiled = None
        return self.model(*args)
