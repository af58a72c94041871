"""Numpy views for the storages' write fast paths: a batch's leaves matched against stored columns.

On writes of a few dozen to a few thousand rows, the calls around the copies cost
more than the bytes: a numpy slice assignment costs a fraction of a torch op per
call, and a leaf's layout check is a shape and dtype comparison on the array
numpy already made. Only CPU tensors of dtypes numpy views without a copy take
these paths; anything else (other devices, bfloat16, autograd history, a batch
that differs from what is stored) is left to the general write, which raises the
errors a bad batch deserves.
"""
from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, is_leaf_nontensor


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


#: A stored column: (the stored leaf as a numpy array, the item shape, the numpy dtype).
Column = tuple[np.ndarray, tuple[int, ...], np.dtype]
#: Stored columns by key.
Columns = dict[Any, Column]


def numpy_columns(leaves: Any, batch_dims: int) -> Columns | None:
    """Columns of the stored ``(key, tensor)`` leaves whose first ``batch_dims`` dims index
    items, or ``None`` if numpy cannot view one of them."""
    columns = {}
    for key, leaf in leaves:
        # A leaf with autograd history is refused too: a read must keep the graph, as torch's gathers do.
        array = numpy_view(leaf) if isinstance(leaf, torch.Tensor) else None
        if array is None:
            return None
        columns[key] = (array, array.shape[batch_dims:], array.dtype)
    return columns


class ColumnCache:
    """:func:`numpy_columns` of a storage's leaves, kept while the same tensors at the same
    addresses are stored: a load that replaces leaves, ``share_memory_`` or ``memmap_``
    (which move them) rebuild it. Pickles empty, as numpy views cannot travel.

    Examples:
        >>> import torch
        >>> cache, leaf = ColumnCache(), torch.zeros(4, 2)
        >>> cache.get([("x", leaf)], batch_dims=1) is cache.get([("x", leaf)], batch_dims=1)
        True
        >>> _ = leaf.share_memory_()  # new memory under the same tensor
        >>> cache.get([("x", leaf)], batch_dims=1)["x"][0].ctypes.data == leaf.data_ptr()
        True
    """

    __slots__ = ("_seen", "_columns")

    def __init__(self) -> None:
        self._seen: tuple = ()
        self._columns: Columns | None = None

    def __reduce__(self) -> tuple:
        return ColumnCache, ()

    def get(self, leaves: list[tuple[Any, Any]], batch_dims: int) -> Columns | None:
        seen = self._seen
        if len(seen) == len(leaves) and all(
            key == seen_key and leaf is tensor and leaf.data_ptr() == address
            for (key, leaf), (seen_key, tensor, address) in zip(leaves, seen)
        ):
            return self._columns
        self._columns = columns = numpy_columns(leaves, batch_dims)
        self._seen = () if columns is None else tuple((key, leaf, leaf.data_ptr()) for key, leaf in leaves)
        return columns


def leaf_items(data: TensorDictBase) -> list[tuple[Any, Any]]:
    """``data``'s ``(key, leaf)`` pairs, nested keys as tuples: the tensor leaves, and the
    non-tensor ones (strings and other ``NonTensorData``) that ``items``' default leaves out,
    so that a caller can refuse them.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "next": {"b": torch.ones(2, 3)}}, [2])
        >>> [key for key, _ in leaf_items(td)]
        ['a', ('next', 'b')]
    """
    items = list(data.items())
    if all(type(value) is torch.Tensor for _, value in items):
        return items  # nothing nested and no non-tensor leaf: the top level holds every leaf
    return list(data.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))


def matching_arrays(
    data: TensorDictBase,
    columns: Columns,
    rows: int,
    skip_key: Any = None,
    extra: dict[Any, torch.Tensor] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """``(stored array, new rows)`` for every column, when ``data``'s leaves (but
    ``skip_key``) and the ``extra`` entries are exactly the columns, each with ``rows``
    rows of the stored item shape and dtype; ``None`` otherwise (nothing is converted).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> columns = numpy_columns([("x", torch.zeros(4, 2)), ("i", torch.zeros(4))], batch_dims=1)
        >>> data = TensorDict({"x": torch.ones(3, 2)}, [3])
        >>> pairs = matching_arrays(data, columns, rows=3, extra={"i": torch.arange(3.0)})
        >>> [new.shape for _, new in pairs]
        [(3, 2), (3,)]
        >>> matching_arrays(data.double(), columns, rows=3, extra={"i": torch.arange(3.0)}) is None
        True
    """
    items = leaf_items(data)
    pairs = []
    try:
        for key, value in chain(items, extra.items()) if extra else items:
            if key == skip_key:
                continue
            column = columns.get(key)
            if column is None or not isinstance(value, torch.Tensor):
                return None  # a key that is not stored, or a non-tensor leaf
            # numpy() refuses tensors off the CPU, with autograd history, or with lazy
            # conjugate/negative bits.
            array = value.numpy()
            if array.shape[:1] != (rows,) or array.shape[1:] != column[1] or array.dtype != column[2]:
                return None
            pairs.append((column[0], array))
    except (RuntimeError, TypeError):
        return None
    return pairs if len(pairs) == len(columns) else None
