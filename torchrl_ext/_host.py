"""Host-side reads of small tensors: numpy views of CPU tensors, and Python numbers from them.

A check or a scale on a batch's few hundred entries needs a number on the host. A torch
reduction plus its ``.item()`` costs several microseconds per number; numpy's reduction
on a view of the same memory costs a fraction of that. Tensors numpy cannot view (other
devices, autograd history, bfloat16) keep torch's reductions.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["NUMPY_DTYPES", "TORCH_DTYPES", "bounds", "last", "numpy_view", "smallest"]

#: torch dtypes whose CPU tensors numpy views without a copy (bfloat16 has no numpy twin).
NUMPY_DTYPES = {
    torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16,
    torch.float32: np.float32, torch.float64: np.float64,
}
#: The reverse map, keyed by ``np.dtype``.
TORCH_DTYPES = {np.dtype(numpy_dtype): dtype for dtype, numpy_dtype in NUMPY_DTYPES.items()}


def numpy_view(values: torch.Tensor) -> np.ndarray | None:
    """``values.numpy()`` (same memory) when numpy can view it, else ``None``."""
    if values.is_cpu and not values.requires_grad and values.dtype in NUMPY_DTYPES:
        return values.numpy()
    return None


def bounds(values: torch.Tensor) -> tuple[Any, Any]:
    """``(min, max)`` of a non-empty tensor as Python numbers (NaN if it holds one).

    Examples:
        >>> import torch
        >>> bounds(torch.tensor([3, -1, 2]))
        (-1, 3)
    """
    array = numpy_view(values)
    if array is None:
        low, high = torch.aminmax(values.detach())
        return low.item(), high.item()
    return np.minimum.reduce(array, axis=None).item(), np.maximum.reduce(array, axis=None).item()


def smallest(values: torch.Tensor) -> Any:
    """Minimum of a non-empty tensor as a Python number.

    Examples:
        >>> import torch
        >>> smallest(torch.tensor([0.5, 0.25]))
        0.25
    """
    array = numpy_view(values)
    if array is None:
        return values.detach().amin().item()
    return np.minimum.reduce(array, axis=None).item()


def last(values: torch.Tensor) -> Any:
    """The last entry of a non-empty 1-D tensor as a Python number.

    Examples:
        >>> import torch
        >>> last(torch.tensor([1.0, 3.0]))
        3.0
    """
    array = numpy_view(values)
    return values[-1].item() if array is None else array[-1].item()
