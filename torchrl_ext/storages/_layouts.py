"""What a write must match in a fast storage: the stored layout, and the errors for a mismatch.

A batch's layout is its per-leaf item shapes and dtypes. The fast storages compare it with the
stored one before anything is copied; a change TorchRL also refuses (shape, dtype) raises
:class:`StorageLayoutError`, and so do key changes in a ``strict=True`` storage. The rings
(:mod:`~torchrl_ext.storages.ring`) use the same checks.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, is_tensor_collection

from torchrl_ext.storages._numpy_rows import leaf_items

__all__ = ["StorageLayoutError", "has_lazy_stack"]


class StorageLayoutError(ValueError, RuntimeError):
    """A write that does not fit the stored layout, refused before anything is copied.

    A ``ValueError`` (bad input) that is also the ``RuntimeError`` TorchRL's storages raise
    for a shape or dtype change, so code written for either keeps catching it.
    """


def _layout(data: Any, item_dims: int) -> dict[Any, tuple[tuple[int, ...], torch.dtype]] | None:
    """Per-leaf item shape (without the first ``item_dims`` dims) and dtype."""
    if isinstance(data, torch.Tensor):
        return {"": (tuple(data.shape[item_dims:]), data.dtype)}
    if not isinstance(data, TensorDictBase):
        return None
    layout = {}
    for key, leaf in leaf_items(data):
        if not isinstance(leaf, torch.Tensor):
            return None  # a non-tensor leaf: the callers refuse the batch (_refuse_non_tensors)
        layout[key] = (tuple(leaf.shape[item_dims:]), leaf.dtype)
    return layout


def _refuse_non_tensors(data: Any, owner: str) -> None:
    """Raises ``TypeError`` if the TensorDict ``data`` has non-tensor leaves, which ``owner`` does
    not store (its reads gather tensors only: such entries would be lost without a word)."""
    if not isinstance(data, TensorDictBase):
        return
    keys = [key for key, leaf in leaf_items(data) if not isinstance(leaf, torch.Tensor)]
    if keys:
        raise TypeError(
            f"data has non-tensor entries {keys}; {owner} stores tensors only. Drop them "
            f"(data.exclude(*{keys!r})), or keep such data in TorchRL's LazyTensorStorage."
        )


def _check_common_keys(expected: dict, got: dict) -> None:
    """Raises :class:`StorageLayoutError` for a key stored and written with a different
    per-item shape or dtype."""
    for key, (shape, dtype) in expected.items():
        if key not in got:
            continue
        got_shape, got_dtype = got[key]
        if got_shape != shape:
            raise StorageLayoutError(
                f"key {key!r}: stored items have shape {list(shape)}, got {list(got_shape)}; "
                "per-item shapes must not change after the first write."
            )
        if got_dtype != dtype:
            raise StorageLayoutError(
                f"key {key!r}: stored dtype is {dtype}, got {got_dtype}; convert the data, "
                f"e.g. tensor.to({dtype})."
            )


def _raise_key_mismatch(expected: dict, got: dict, hint: str = "") -> None:
    missing = sorted(map(str, expected.keys() - got.keys()))
    extra = sorted(map(str, got.keys() - expected.keys()))
    raise StorageLayoutError(
        f"data keys differ from the stored keys (missing: {missing}, extra: {extra}); "
        "write the same keys every time, e.g. data.select(*stored_keys), or build "
        f"the storage from a sample that has all of them{hint}."
    )


def has_lazy_stack(data: Any) -> bool:
    """Whether ``data`` is, or holds at any depth, a ``LazyStackedTensorDict``."""
    if not isinstance(data, TensorDictBase):
        return False
    return isinstance(data, LazyStackedTensorDict) or any(
        has_lazy_stack(value) for value in data.values() if isinstance(value, TensorDictBase))


def _newest_rows(cursor: Any, data: Any, capacity: int) -> tuple[Any, Any]:
    """The last ``capacity`` entries of a 1-D ``cursor`` and its rows of ``data``, as TorchRL
    keeps them from a batch larger than the storage (the later write of a row wins)."""
    if (
        isinstance(cursor, torch.Tensor) and cursor.ndim == 1 and cursor.numel() > capacity
        and (is_tensor_collection(data) or isinstance(data, torch.Tensor))
        and data.ndim and len(data) == cursor.numel()
    ):
        return cursor[-capacity:], data[-capacity:]
    return cursor, data
