"""Tensor storages that write ring ranges as slice copies and gather with ``index_select``.

TorchRL's ``RoundRobinWriter`` hands a storage ``arange(start, start + n) %
capacity`` and ``LazyTensorStorage`` writes it through advanced indexing
(``index_put``), which moves image rows several times slower than a contiguous
copy. Reads use TensorDict advanced indexing, slower on CPU than ``index_select``
(``benchmarks/bench_storage.py`` measures both). The storages here keep TorchRL's classes,
lazy initialisation, nested keys, ``device=``, memmap files, shared memory and
checkpointing, and change only those two paths:

* ``set`` recognises a ring range (whatever writer produced it) and copies it
  as one slice, or two on wrap-around; any other cursor goes to TorchRL;
* ``get`` gathers a 1-D index within the filled part with one
  ``index_select`` per stored tensor; other indices (ints, slices, negative
  indices, ...) go to TorchRL.

It is also stricter than TorchRL, which silently adds a key that appears
later, silently keeps stale values for a key that goes missing, and fails
deep inside ``index_put`` on a shape or dtype change. Here every write is
checked against what the first write stored (same keys, same per-item shapes
and dtypes, no batch larger than the capacity) *before* anything is copied,
and a mismatch raises a ``ValueError`` naming the key and the fix: stored
data is never half-written.

A drop-in: swap ``LazyTensorStorage`` for :class:`FastTensorStorage` (or
``LazyMemmapStorage`` for :class:`FastMemmapStorage`), keep everything else.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection
from torchrl.data import LazyMemmapStorage, LazyTensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter

from torchrl_ext import _compat
from torchrl_ext._checks import bounds, check_int
from torchrl_ext.storages._gathers import assemble, gather_rows, take_rows
from torchrl_ext.storages._numpy_rows import ColumnCache, Columns, matching_arrays, leaf_items
from torchrl_ext.storages._output_memory import PinnedOutputs

__all__ = ["FastMemmapStorage", "FastTensorStorage", "gather_rows"]


@contextlib.contextmanager
def _own_name_in_init_log(name: str) -> Iterator[None]:
    """Within the block, the "torchrl" logger's "Initialized LazyTensorStorage ..." (or
    LazyMemmapStorage) records say ``name`` instead."""

    def rename(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for base in ("LazyTensorStorage", "LazyMemmapStorage"):
            if message.startswith(f"Initialized {base} "):
                record.msg, record.args = message.replace(base, name, 1), ()
        return True

    logger = logging.getLogger("torchrl")
    logger.addFilter(rename)
    try:
        yield
    finally:
        logger.removeFilter(rename)


class _SliceWritesIndexSelectReads(PinnedOutputs):
    """Mixin over a TorchRL ``TensorStorage``: the two fast paths described above, gathering
    into pinned memory for buffers that pin their samples (:class:`PinnedOutputs`)."""

    def __init__(self, max_size: int, *args: Any, **kwargs: Any) -> None:
        check_int("max_size", max_size, minimum=1)  # TorchRL fails later, or never, on 0 or -1
        super().__init__(max_size, *args, **kwargs)

    def _init(self, data: Any) -> None:
        # TorchRL's hook that allocates the leaves at the first write. Its log line names
        # TorchRL's class ("Initialized LazyTensorStorage ..."): this storage's names itself.
        with _own_name_in_init_log(type(self).__name__):
            super()._init(data)

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        if isinstance(cursor, torch.Tensor) and cursor.numel() == 0 and self.initialized:
            # Nothing to write. TorchRL would record the empty cursor as the last one
            # written, and its checkpointer then fails on the next dumps().
            return
        leaves = self._checked_leaves(cursor, data) if self.ndim == 1 else None
        ranges = self._ring_ranges(cursor, data)
        if ranges is None:
            return super().set(cursor, data, set_cursor=set_cursor)
        if leaves is None:  # first write (lazy init) or non-tensor leaves
            for start, stop, first, last in ranges:
                super().set(slice(start, stop), data[first:last], set_cursor=set_cursor)
            if set_cursor:
                _compat.set_last_written(self, cursor)  # the cursor TorchRL's set records, not the last slice
            return
        self._copy_ranges(leaves, ranges, cursor, data, set_cursor)

    def set_ring_rows(self, start: int, cursor: torch.Tensor, data: Any,
                       extra: dict[Any, torch.Tensor] | None = None) -> dict[Any, Any] | None:
        """:meth:`set` of ``data`` plus the ``extra`` entries (TorchRL's ``"index"``) at
        ``cursor = (start + arange(n)) % max_size`` on an initialised 1-D storage, for callers
        that built the cursor that way (no re-check of it). ``data`` is not modified.

        Returns:
            The stored columns by key when ``data`` was found to hold exactly them (with
            the ``extra`` ones): a key that is not among them is not in ``data`` either,
            which a caller can then know without a lookup. ``None`` otherwise.
        """
        ranges = _ring_slices(start, cursor.numel(), self.max_size)
        columns = self._columns_of(data)
        pairs = None if columns is None else matching_arrays(data, columns, data.shape[0], extra=extra)
        if pairs is not None:
            self._copy_ranges(pairs, ranges, cursor, data, True)
            return columns.by_key
        if extra:
            data = data.clone(False)
            for key, value in extra.items():
                data.set(key, value)
        leaves = self._checked_leaves(cursor, data)
        if leaves is None:
            self.set(cursor, data)
        else:
            self._copy_ranges(leaves, ranges, cursor, data, True)
        return None

    def _columns_of(self, data: Any) -> Columns | None:
        """:meth:`_columns` when ``data`` is a ``[N]`` batch (the numpy write paths' case)."""
        if not isinstance(data, TensorDictBase) or data.batch_dims != 1:
            return None
        return self._columns()

    def _columns(self, leaves: list[tuple[Any, Any]] | None = None) -> Columns | None:
        """Numpy views of the stored leaves of a 1-D storage (``leaves``: ``leaf_items`` of
        them, if the caller listed them); ``None`` otherwise or where numpy cannot view a leaf.
        Rebuilt when TorchRL replaces or moves a leaf (:class:`ColumnCache`)."""
        stored = _compat.stored_data(self)
        if self.ndim != 1 or not isinstance(stored, TensorDictBase):
            return None
        cache = self.__dict__.get("_numpy_columns")
        if cache is None:
            cache = self._numpy_columns = ColumnCache()
        return cache.get(leaf_items(stored) if leaves is None else leaves, batch_dims=1)

    def gather(self, rows: torch.Tensor, extra: dict[Any, torch.Tensor] | None = None, *,
               leaves: list[tuple[Any, torch.Tensor]] | None = None) -> TensorDictBase:
        """``storage[rows]`` plus ``extra`` (entries of the same batch size, such as a sampler's
        info) in one TensorDict, for int64 ``rows`` a sampler drew inside the filled part (not
        re-checked): CPU rows through numpy's ``take`` on cached views of the leaves, which
        costs less than ``index_select`` on a sample's few hundred rows; other rows (or leaves
        numpy cannot view) through ``index_select``. ``leaves``: the stored ``(key, tensor)``
        leaves, if the caller listed them already (listing walks the whole TensorDict).

        Shape contract: ``rows`` ``[B]`` gives a TensorDict of batch size ``[B]``.
        """
        stored = _compat.stored_data(self)
        columns = self._columns(leaves) if rows.is_cpu and not self._pin_outputs else None
        if columns is not None:
            return assemble(take_rows(columns, rows), rows.shape, stored.device, extra)
        return gather_rows(stored, rows, extra=extra, leaves=leaves, pinned=self._pin_outputs)

    def _numpy_pairs(self, data: Any) -> list | None:
        """``(stored, new rows)`` numpy views for a ``[N]`` batch that matches the stored
        leaves exactly (:func:`~torchrl_ext.storages._numpy_rows.matching_arrays`): the
        layout check and the copies in a fraction of torch's calls. ``None`` otherwise."""
        columns = self._columns_of(data)
        return None if columns is None else matching_arrays(data, columns, data.shape[0])

    def _checked_leaves(self, cursor: Any, data: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """:meth:`_check_matches_storage`; a refused write first moves back the writer that advanced for it."""
        try:
            return self._check_matches_storage(cursor, data)
        except (TypeError, ValueError):
            self._rewind_writers(cursor, data)
            raise

    def _copy_ranges(self, leaves: list[tuple[torch.Tensor, torch.Tensor]], ranges: list[tuple[int, int, int, int]],
                     cursor: Any, data: Any, set_cursor: bool) -> None:
        # Initialised and checked: copy each leaf's slices straight into the
        # stored tensors (TensorDict slicing and assignment cost more than
        # the copy for small items), then do TorchRL's bookkeeping.
        for destination, source in leaves:  # torch tensors, or numpy views of them
            if _shares_memory(destination, source):
                # A view of the stored rows (rb.extend(rb[3:10])): one slice copy would
                # overwrite rows that it, or the next one, still reads.
                source = source.copy() if isinstance(source, np.ndarray) else source.clone()
            for start, stop, first, last in ranges:
                destination[start:stop] = source[first:last]
        if set_cursor:
            # What TorchRL's set records for a ring range (_set_last_cursor(cursor), then
            # _get_new_len), from the ranges instead of a dozen tensor ops on the cursor.
            _compat.set_last_written(self, ranges[-1][1] - 1, cursor_as_written=cursor)
            _compat.set_length(self, min(len(self) + sum(stop - start for start, stop, _, _ in ranges), self.max_size))
        _compat.bump_mutation_revision(self)

    def _rewind_writers(self, cursor: Any, data: Any) -> None:
        """Moves back the cursor of a TorchRL writer that advanced for a write refused here.

        TorchRL's ``RoundRobinWriter`` moves its cursor and write count before the storage
        sees the data; left there, the next write would skip rows and expose never-written
        ones as stored data. Only a writer whose cursor sits exactly past this write moves.
        """
        if isinstance(cursor, torch.Tensor) and cursor.ndim == 1 and cursor.numel() > 0:
            start, count = int(cursor[0]), cursor.numel()
        elif isinstance(cursor, int) and not isinstance(cursor, bool):
            start, count = cursor, 1
        else:
            return
        for entity in _compat.attached_entities(self):
            writer = getattr(entity, "writer", None)
            if not isinstance(writer, RoundRobinWriter) or _compat.writer_storage(writer) is not self:
                continue
            if _compat.writer_cursor(writer) == (start + count) % self.max_size \
                    and _compat.write_count(writer) >= count:
                _compat.set_writer_cursor(writer, start, written=-count)

    def _check_matches_storage(
        self, cursor: Any, data: Any
    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Raises before any copy if ``data`` does not fit what is stored.

        Returns ``(stored tensor, data tensor)`` pairs when the storage is
        initialised and every leaf is a tensor, else ``None``.
        """
        single = isinstance(cursor, int) and not isinstance(cursor, bool)
        if not single and hasattr(data, "shape") and data.ndim and len(data) > self.max_size:
            raise ValueError(
                f"cannot write a batch of {len(data)} items into a storage of capacity "
                f"{self.max_size}; extend in chunks of at most {self.max_size} (or keep the "
                f"newest: data[-{self.max_size}:])."
            )
        if not self.initialized:
            _refuse_non_tensors(data, type(self).__name__)
            return None
        pairs = None if single else self._numpy_pairs(data)
        if pairs is not None:
            return pairs
        expected = self._stored_layout()
        got = _layout(data, item_dims=0 if single else 1)
        if got is None:
            _refuse_non_tensors(data, type(self).__name__)
        if got is None or expected is None:
            return None
        if got != expected:
            _raise_layout_mismatch(expected, got)
        stored = _compat.stored_data(self)
        if isinstance(data, torch.Tensor):
            return [(stored, data)]
        return [(stored.get(key), leaf) for key, leaf in leaf_items(data)]

    def _stored_layout(self) -> dict[Any, tuple[tuple[int, ...], torch.dtype]] | None:
        # Read each time: a load_state_dict can add leaves to the same stored TensorDict.
        return _layout(_compat.stored_data(self), item_dims=1)

    def _ring_ranges(self, cursor: Any, data: Any) -> list[tuple[int, int, int, int]] | None:
        """``(start, stop, data_first, data_last)`` slices equivalent to writing
        ``data`` at ``cursor``, or ``None`` when ``cursor`` is not a ring range."""
        if not (
            isinstance(cursor, torch.Tensor)
            and cursor.ndim == 1
            and not cursor.dtype.is_floating_point
            and cursor.dtype is not torch.bool
            and cursor.numel() > 1
            and self.ndim == 1
            and (is_tensor_collection(data) or isinstance(data, torch.Tensor))
            and len(data) == cursor.numel()
        ):
            return None
        capacity = self.max_size
        n = cursor.numel()
        start = int(cursor[0])
        if n > capacity or not 0 <= start < capacity:  # not one pass over the ring
            return None
        ring = ring_index(start, n, capacity, cursor.device)
        if not torch.equal(cursor, ring.to(cursor.dtype)):
            return None
        return _ring_slices(start, n, capacity)

    def get(self, index: Any) -> Any:
        stored = _compat.stored_data(self)
        if (
            isinstance(index, torch.Tensor)
            and index.ndim == 1
            and index.numel() > 0
            and not index.dtype.is_floating_point
            and index.dtype is not torch.bool
            and self.ndim == 1
            and self.initialized
            and isinstance(stored, TensorDictBase)
        ):
            low, high = bounds(index)
            size = len(self)
            if 0 <= low and high < size:
                return gather_rows(stored, index, pinned=self._pin_outputs)
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise IndexError(
                    f"index {bad} is out of range for a storage holding {size} items; read "
                    f"indices in [0, {size - 1}] (negative ones count from the end)."
                )
        return super().get(index)


def ring_index(start: int, n: int, capacity: int, device: Any) -> torch.Tensor:
    """``(start + arange(n)) % capacity``, the rows of a ring write; on the CPU through numpy
    (fewer calls than torch's)."""
    if device is not None and torch.device(device).type != "cpu":
        return torch.arange(start, start + n, device=device).remainder_(capacity)
    index = np.arange(start, start + n)
    if start + n > capacity:
        index %= capacity
    return torch.from_numpy(index)


def _shares_memory(a: Any, b: Any) -> bool:
    """Whether the arrays or tensors ``a`` and ``b`` may overlap in memory."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device == b.device:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return False


def _ring_slices(start: int, n: int, capacity: int) -> list[tuple[int, int, int, int]]:
    """``(start, stop, data_first, data_last)`` slices of ``n`` rows written from ``start`` round a ring."""
    head = min(n, capacity - start)
    ranges = [(start, start + head, 0, head)]
    if head < n:
        ranges.append((0, n - head, head, n))
    return ranges


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


def _raise_layout_mismatch(expected: dict, got: dict) -> None:
    missing = sorted(map(str, expected.keys() - got.keys()))
    extra = sorted(map(str, got.keys() - expected.keys()))
    if missing or extra:
        raise ValueError(
            f"data keys differ from the stored keys (missing: {missing}, extra: {extra}); "
            "write the same keys every time, e.g. data.select(*stored_keys), or build "
            "the storage from a sample that has all of them."
        )
    for key, (shape, dtype) in expected.items():
        got_shape, got_dtype = got[key]
        if got_shape != shape:
            raise ValueError(
                f"key {key!r}: stored items have shape {list(shape)}, got {list(got_shape)}; "
                "per-item shapes must not change after the first write."
            )
        if got_dtype != dtype:
            raise ValueError(
                f"key {key!r}: stored dtype is {dtype}, got {got_dtype}; convert the data, "
                f"e.g. tensor.to({dtype})."
            )


class FastTensorStorage(_SliceWritesIndexSelectReads, LazyTensorStorage):
    """``LazyTensorStorage`` with slice-copy writes and ``index_select`` reads.

    Same constructor as :class:`torchrl.data.LazyTensorStorage` (``max_size``,
    ``device=``, ``ndim=``, ``shared_init=``, ...); multi-dimensional storages
    keep TorchRL's paths.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import ReplayBuffer
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> rb = ReplayBuffer(storage=FastTensorStorage(4), batch_size=2)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(3.0, 6.0)}, [3]))  # wraps around
        >>> rb.storage.get(torch.tensor([0, 1, 2, 3]))["obs"].tolist()
        [4.0, 5.0, 2.0, 3.0]
    """


class FastMemmapStorage(_SliceWritesIndexSelectReads, LazyMemmapStorage):
    """``LazyMemmapStorage`` (memory-mapped files, for buffers larger than RAM)
    with slice-copy writes and ``index_select`` reads. Same constructor."""
