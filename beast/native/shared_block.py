"""What every native object has in common with the others: one block of shared memory
that Python allocates and owns and C borrows, and how it travels to other processes.

Pickled by torch's multiprocessing pickler (a child of any start method, a queue), the
object arrives over the same memory; any other pickler would copy the bytes into a
private object nobody else sees, which is never what the caller meant, so it is refused.
"""

from collections.abc import Callable
from typing import Any

import torch

from beast.native._ext import ffi

__all__ = ["SharedBlock"]


class SharedBlock:
    """Base of the native wrappers: `_tensor` is the shared block and `_mem` its C pointer;
    `_attach(tensor)` points the wrapper at one, at construction and after unpickling."""

    _tensor: torch.Tensor

    def _create(self, nbytes: int, init: Callable[[Any], None]) -> None:
        """Allocate a zeroed shared block of `nbytes`, set it up with `init(pointer)` (the
        C init, raising on a bad status) and attach to it. Python owns the memory; C
        borrows it through `_mem` for exactly as long as `_tensor` keeps the shared
        mapping alive."""
        tensor = torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
        init(ffi.cast("void *", tensor.data_ptr()))
        self._attach(tensor)

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._mem = ffi.cast("void *", tensor.data_ptr())
        self._read_header()

    def _read_header(self) -> None:
        """Read what the block says about itself (its sizes) into the wrapper."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        return {"tensor": self._tensor}

    def __setstate__(self, state: dict) -> None:
        tensor = state["tensor"]
        if not tensor.is_shared():
            raise RuntimeError(
                f"{type(self).__name__} can only be pickled to multiprocessing children"
            )
        self._attach(tensor)
