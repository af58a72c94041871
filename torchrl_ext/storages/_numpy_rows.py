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
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor

from torchrl_ext import _compat


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


class Columns:
    """Stored columns by key, and the columns as a batch of some number of rows must match them."""

    __slots__ = ("by_key", "_sized")

    def __init__(self, by_key: dict[Any, Column]) -> None:
        self.by_key = by_key
        self._sized: tuple[int | None, dict[Any, Column]] = (None, {})

    def sized(self, rows: int) -> dict[Any, Column]:
        """:attr:`by_key` with each item shape replaced by the shape of ``rows`` items.

        A batch's arrays are then checked with one shape comparison each, about half
        the cost of comparing the row count and slicing off the item shape. The last
        row count asked is kept: writers repeat theirs.
        """
        cached_rows, sized = self._sized
        if cached_rows != rows:
            sized = {key: (array, (rows, *shape), dtype) for key, (array, shape, dtype) in self.by_key.items()}
            self._sized = (rows, sized)
        return sized


def numpy_columns(leaves: Any, batch_dims: int) -> Columns | None:
    """Columns of the stored ``(key, tensor)`` leaves whose first ``batch_dims`` dims index
    items, or ``None`` if numpy cannot view one of them."""
    by_key = {}
    for key, leaf in leaves:
        # A leaf with autograd history is refused too: a read must keep the graph, as torch's gathers do.
        array = numpy_view(leaf) if isinstance(leaf, torch.Tensor) else None
        if array is None:
            return None
        by_key[key] = (array, array.shape[batch_dims:], array.dtype)
    return Columns(by_key)


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
        >>> cache.get([("x", leaf)], batch_dims=1).by_key["x"][0].ctypes.data == leaf.data_ptr()
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
    """``list(data.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))``,
    in the same order: the tensor leaves, and the non-tensor ones (strings and other
    ``NonTensorData``) that ``items``' default leaves out, so that a caller can refuse them.

    A plain :class:`~tensordict.TensorDict` of tensors is listed from its entry dicts,
    cheaper than ``items``, which a small write would pay twice (the batch and the
    stored leaves). Any other TensorDict type, or a non-tensor leaf,
    takes ``items``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "next": {"b": torch.ones(2, 3)}}, [2])
        >>> [key for key, _ in leaf_items(td)]
        ['a', ('next', 'b')]
    """
    leaves = _plain_leaves(data, ()) if type(data) is TensorDict else None
    if leaves is None:
        return list(data.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))
    return leaves


def _plain_leaves(data: TensorDict, prefix: tuple) -> list[tuple[Any, torch.Tensor]] | None:
    leaves = []
    for key, value in _compat.entries(data).items():
        if isinstance(value, torch.Tensor):
            leaves.append(((*prefix, key) if prefix else key, value))
            continue
        nested = _plain_leaves(value, (*prefix, key)) if type(value) is TensorDict else None
        if nested is None:
            return None
        leaves.extend(nested)
    return leaves


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
    sized = columns.sized(rows)
    if type(data) is TensorDict and not extra:
        # The entries of a flat batch are its leaves: no listing needed.
        pairs = _matched(_compat.entries(data).items(), sized, skip_key, on_nested=_NESTED)
        if pairs is not _NESTED:
            return pairs
    leaves = leaf_items(data)
    return _matched(chain(leaves, extra.items()) if extra else leaves, sized, skip_key)


_NESTED = object()  # a flat batch's entries turned out to hold a sub-TensorDict


def _matched(items: Any, sized: dict[Any, Column], skip_key: Any, on_nested: Any = None) -> Any:
    """:func:`matching_arrays` of the ``(key, value)`` entries ``items`` against the columns
    :meth:`Columns.sized` gives; ``on_nested`` when one of the entries is a TensorDict."""
    pairs = []
    try:
        for key, value in items:
            if key == skip_key:
                continue
            if not isinstance(value, torch.Tensor):
                return on_nested if isinstance(value, TensorDictBase) else None  # else a non-tensor leaf
            column = sized.get(key)
            if column is None:
                return None  # a key that is not stored
            # numpy() refuses tensors off the CPU, with autograd history, or with lazy
            # conjugate/negative bits.
            array = value.numpy()
            dtype = array.dtype
            if array.shape != column[1] or (dtype is not column[2] and dtype != column[2]):
                return None
            pairs.append((column[0], array))
    except (RuntimeError, TypeError):
        return None
    return pairs if len(pairs) == len(sized) else None
