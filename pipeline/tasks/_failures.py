"""What a failed batch or row says, and whether the failure was the accelerator running out of memory.

A task that runs a batch and fails tells two failures apart: out of memory
means "too big" (split the batch and retry, and free the cached blocks
first), anything else is a poison row to isolate. Either way the row that
fails alone carries a short message in its ``error`` column; the text and
image tasks word it the same way.

>>> describe_error(ValueError("bad token"))
'ValueError: bad token'
>>> len(describe_error(RuntimeError("x" * 900))), is_out_of_memory(RuntimeError("CUDA out of memory."))
(500, True)
"""

from __future__ import annotations

__all__ = ["describe_error", "free_accelerator_memory", "is_out_of_memory"]


def describe_error(exc: BaseException, limit: int = 500) -> str:
    """``Type: message`` of ``exc``, cut to ``limit`` characters (a row's ``error`` column)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or simulated) out-of-memory error: worth retrying with a smaller batch."""
    from pipeline.core.faults import SimulatedOutOfMemoryError

    if isinstance(exc, SimulatedOutOfMemoryError):
        return True
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def free_accelerator_memory() -> None:
    """Hand the CUDA allocator's cached blocks back after an out-of-memory error (nothing without torch or CUDA)."""
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass
