"""What every native object has in common with the others: one block of shared memory
that Python allocates and owns and C borrows, and how it travels to other processes.

Pickled by torch's multiprocessing pickler (a child of any start method, a queue), the
object arrives over the same memory; any other pickler would copy the bytes into a
private object nobody else sees, which is never what the caller meant, so it is refused.
"""

import torch

__all__ = ["SharedBlock"]


class SharedBlock:
    """Base of the native wrappers: `_tensor` is the shared block, `_attach(tensor)` points
    the wrapper (and its C pointers) at one, at construction and after unpickling."""

    _tensor: torch.Tensor

    def _attach(self, tensor: torch.Tensor) -> None:
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
