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

What else goes to TorchRL, the :class:`StorageLayoutError` of a shape or dtype change and
what ``strict=True`` adds (both checks hold for multi-dim storages too): docs/architecture.md,
"Fast storages".

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
from torchrl_ext._checks import bounds, check_device, check_int, is_int_tensor, makes_kept_tensors
from torchrl_ext.storages._layouts import (
    StorageLayoutError, _check_common_keys, _layout, _newest_rows, _raise_key_mismatch, _refuse_non_tensors,
    has_lazy_stack,
)
from torchrl_ext.storages._gathers import (
    NO_ITEM_SHAPES, assemble, gather_rows, item_batch_shapes, set_info, take,
)
from torchrl_ext.storages._numpy_rows import ColumnCache, Columns, matching_arrays, leaf_items
from torchrl_ext.storages._output_memory import PinnedOutputs

__all__ = ["FastMemmapStorage", "FastTensorStorage", "StorageLayoutError", "gather_rows"]


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

    #: Whether the stored data holds a lazy stack (heterogeneous agents, ...): TorchRL's
    #: reads and writes handle it, the column paths here do not.
    _lazy_stacked = False
    #: :func:`~torchrl_ext.storages._gathers.item_batch_shapes` of the stored data, kept by
    #: :meth:`_note_layout` after every write that can change the stored structure.
    _item_shapes = NO_ITEM_SHAPES

    def __init__(self, max_size: int, *args: Any, strict: bool = False, **kwargs: Any) -> None:
        check_int("max_size", max_size, minimum=1)  # TorchRL fails later, or never, on 0 or -1
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}.")
        device = kwargs.get("device", "auto")
        if not (isinstance(device, str) and device == "auto"):  # TorchRL's "auto": the first write's device
            check_device("device", device)  # torch's own error names no argument
        super().__init__(max_size, *args, **kwargs)
        self.strict = strict

    @makes_kept_tensors  # the stored leaves, even at a first write inside torch.inference_mode()
    def _init(self, data: Any) -> None:
        # TorchRL's hook that allocates the leaves at the first write. Its log line names
        # TorchRL's class ("Initialized LazyTensorStorage ..."): this storage's names itself.
        with _own_name_in_init_log(type(self).__name__):
            super()._init(data)
        self._note_layout()

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._note_layout()

    def _note_layout(self) -> None:
        """Records what the write checks and read paths need to know of the stored structure
        (lazy stacks, batch dims items keep): after the first write, a load, and TorchRL's own
        writes. Only 1-D storages read through those paths: a multi-dim one skips that walk."""
        stored = _compat.stored_data(self)
        self._lazy_stacked = has_lazy_stack(stored)
        if self.ndim == 1:
            self._item_shapes = (
                item_batch_shapes(stored, 1) if isinstance(stored, TensorDictBase) and not self._lazy_stacked
                else NO_ITEM_SHAPES
            )

    #: TorchRL's, keeping a copy of the last written row: with ``compilable=True`` it keeps a
    #: view into the caller's cursor (the index ``extend`` returned) and ``fill_``s it later.
    _set_last_cursor = _compat.set_last_cursor_copied

    def _torchrl_path(self) -> bool:
        """Whether reads and writes go to TorchRL's own code: multi-dim storages, stored lazy
        stacks and traced code (the paths here call numpy)."""
        return self.ndim != 1 or self._lazy_stacked or torch.compiler.is_compiling()

    def _torchrl_set(self, cursor: Any, data: Any, set_cursor: bool) -> None:
        """TorchRL's ``set``, looked up past this class in the MRO: it is a pyvers
        ``implement_for`` object, which dynamo traces when called but not through ``super()``."""
        mro = type(self).__mro__
        for cls in mro[mro.index(_SliceWritesIndexSelectReads) + 1:]:
            if "set" in cls.__dict__:
                return cls.__dict__["set"](self, cursor, data, set_cursor=set_cursor)
        raise AssertionError("no TorchRL set found")  # unreachable: TensorStorage defines set

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        if torch.compiler.is_compiling():
            return self._torchrl_set(cursor, data, set_cursor)
        if isinstance(cursor, torch.Tensor) and cursor.numel() == 0:
            # Nothing to write. TorchRL would record the empty cursor as the last one
            # written (its checkpointer then fails on the next dumps()), and a first write
            # of no rows fails in its lazy allocation (IndexError).
            return
        if has_lazy_stack(data) or self._lazy_stacked:
            leaves = _TORCHRL_WRITE
        else:
            written = cursor  # what the writer advanced for: a refused write rewinds all of it
            if not self.strict and self.ndim == 1:
                cursor, data = _newest_rows(cursor, data, self.max_size)
            leaves = self._checked_leaves(cursor, data, written)
        if leaves is _TORCHRL_WRITE or self.ndim != 1:  # checked: TorchRL writes multi-dim storages
            super().set(cursor, data, set_cursor=set_cursor)
            self._note_layout()
            return
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
            return columns
        if extra:
            data = set_info(data.clone(False), extra)
        leaves = None if self._torchrl_path() or has_lazy_stack(data) else self._checked_leaves(cursor, data)
        if leaves is None or leaves is _TORCHRL_WRITE:
            self.set(cursor, data)
        else:
            self._copy_ranges(leaves, ranges, cursor, data, True)
        return None

    def _columns_of(self, data: Any) -> Columns | None:
        """:meth:`_columns` when ``data`` is a dense ``[N]`` batch (the numpy write paths' case)."""
        if not isinstance(data, TensorDictBase) or data.batch_dims != 1 or has_lazy_stack(data):
            return None
        return self._columns()

    def _columns(self, leaves: list[tuple[Any, Any]] | None = None) -> Columns | None:
        """Numpy views of the stored leaves of a 1-D storage (``leaves``: ``leaf_items`` of
        them, if the caller listed them); ``None`` otherwise or where numpy cannot view a leaf.
        Rebuilt when TorchRL replaces or moves a leaf (:class:`ColumnCache`)."""
        stored = _compat.stored_data(self)
        if self._torchrl_path() or not isinstance(stored, TensorDictBase):
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
        if self._torchrl_path():
            data = super().get(rows)
            return set_info(data.copy(), extra) if extra else data  # a shallow copy: data may be stored
        stored = _compat.stored_data(self)
        columns = self._columns(leaves) if rows.is_cpu and not self._pin_outputs else None
        if columns is not None:
            index = rows.numpy()
            entries = {key: take(array, index) for key, (array, _, _) in columns.items()}
            return assemble(entries, rows.shape, stored.device, extra, self._item_shapes)
        return gather_rows(stored, rows, extra=extra, leaves=leaves, pinned=self._pin_outputs,
                           item_shapes=self._item_shapes)

    def _checked_leaves(self, cursor: Any, data: Any, written: Any = None) -> Any:
        """:meth:`_check_matches_storage`; a refused write first moves back the writer that
        advanced for it. ``written``: the cursor the writer produced, when ``cursor`` is only
        its newest ``max_size`` rows (the writer advanced over all of them)."""
        try:
            return self._check_matches_storage(cursor, data)
        except (TypeError, ValueError):
            self._rewind_writers(cursor if written is None else written, data)
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
        """Moves back the cursor of a TorchRL writer that advanced for a write of ``data``
        refused here.

        TorchRL's ``RoundRobinWriter`` moves its cursor and write count before the storage
        sees the data; left there, the next write would skip rows and expose never-written
        ones as stored data. Only a writer whose cursor sits exactly past this write moves.
        """
        if isinstance(cursor, torch.Tensor) and cursor.ndim == 1 and cursor.numel() > 0:
            start, count, data_dims = int(cursor[0]), cursor.numel(), 1
        elif isinstance(cursor, int) and not isinstance(cursor, bool):
            start, count, data_dims = cursor, 1, 0
        else:
            return
        rows = self._rows(data, data_dims)[0]
        for entity in _compat.attached_entities(self):
            writer = getattr(entity, "writer", None)
            if not isinstance(writer, RoundRobinWriter) or _compat.writer_storage(writer) is not self:
                continue
            if _compat.writer_cursor(writer) == (start + count) % rows and _compat.write_count(writer) >= count:
                _compat.set_writer_cursor(writer, start, written=-count)

    def _rows(self, data: Any, data_dims: int) -> tuple[int, int]:
        """``(rows, items per row)`` of the storage along dim 0, the ring its writers' cursors
        run round. A row of a multi-dim storage holds the items of its other dims (envs); before
        the first write they are read off ``data`` (past its first ``data_dims`` dims) and
        ``max_size`` is rounded up to whole rows, as TorchRL allocates it."""
        if self.ndim == 1:
            return self.max_size, 1
        row = self.shape[1:] if self.initialized else data.shape[data_dims:data_dims + self.ndim - 1]
        return -(self.max_size // -row.numel()), row.numel()

    def _check_matches_storage(self, cursor: Any, data: Any) -> Any:
        """Raises before any copy if ``data`` does not fit what is stored.

        Returns ``(stored tensor, data tensor)`` pairs when the storage is initialised, every
        leaf is a tensor and the keys are the stored ones; ``_TORCHRL_WRITE`` when the keys
        differ in a storage that is not strict (TorchRL's ``set`` then adds or skips them);
        else ``None``.
        """
        dims = _cursor_dims(cursor)
        if dims is None:  # a cursor with `...` or None: TorchRL's indexing decides
            return None
        addressed, written = dims
        if self.strict and written and hasattr(data, "shape"):
            items = data.shape[:written + self.ndim - addressed].numel()
            rows, per_row = self._rows(data, written)
            if items > rows * per_row:
                chunk = (f"{rows} (or keep the newest: data[-{rows}:])" if self.ndim == 1
                         else f"{rows} rows along dim 0 ({per_row} items each)")
                raise StorageLayoutError(
                    f"cannot write a batch of {items} items into a storage of capacity {rows * per_row}; "
                    f"extend in chunks of at most {chunk}, or build the storage with strict=False, "
                    "which keeps the newest as TorchRL does."
                )
        if not self.initialized:
            if self.ndim == 1:  # a multi-dim storage's reads are TorchRL's, which read non-tensors
                _refuse_non_tensors(data, type(self).__name__)
            self._check_first_items(data, written)
            return None
        # Numpy views of a [N] batch matching the stored leaves exactly: the layout check and
        # the copies in a fraction of torch's calls.
        columns = None if written != 1 else self._columns_of(data)
        pairs = None if columns is None else matching_arrays(data, columns, data.shape[0])
        if pairs is not None:
            return pairs
        # Read each time: a load_state_dict can add leaves to the same stored TensorDict.
        stored = _compat.stored_data(self)
        expected = _layout(stored, item_dims=addressed)
        got = _layout(data, item_dims=written)
        if got is None or expected is None:
            if self.ndim == 1:
                _refuse_non_tensors(data, type(self).__name__)
            return None
        if got != expected:
            _check_common_keys(expected, got)
            if self.strict:
                _raise_key_mismatch(expected, got, " (or with strict=False, which adds and skips keys as TorchRL does)")
            if addressed == 1:
                self._zero_unwritten_rows(cursor, expected.keys() - got.keys())
            return _TORCHRL_WRITE
        if isinstance(data, torch.Tensor):
            return [(stored, data)]
        return [(stored.get(key), leaf) for key, leaf in leaf_items(data)]

    def _check_first_items(self, data: Any, written: int) -> None:
        """Hook: refuses (``StorageLayoutError``) a first write of items this storage cannot
        allocate; ``written``: the leading dims of ``data`` that the cursor fills."""

    def _zero_unwritten_rows(self, cursor: Any, keys: Any) -> None:
        """Zeroes the stored ``keys`` at the rows along dim 0 that ``cursor`` addresses and that
        were never written (past the filled part): a write without them leaves them as they
        were, which there is uninitialised memory. Rows written before keep their values, as
        in TorchRL."""
        if not keys:
            return
        if isinstance(cursor, slice):
            cursor = range(*cursor.indices(self._rows(None, 0)[0]))
        rows = torch.as_tensor(cursor).reshape(-1)
        if rows.dtype in (torch.bool, torch.uint8):
            rows = rows.nonzero().reshape(-1)  # a mask: the rows it picks
        rows = rows[rows >= _compat.filled_rows(self)]
        if rows.numel():
            stored = _compat.stored_data(self)
            for key in keys:
                stored.get(key)[rows.to(stored.device)] = 0

    def _ring_ranges(self, cursor: Any, data: Any) -> list[tuple[int, int, int, int]] | None:
        """``(start, stop, data_first, data_last)`` slices equivalent to writing
        ``data`` at ``cursor``, or ``None`` when ``cursor`` is not a ring range."""
        if not (
            is_int_tensor(cursor)
            and cursor.ndim == 1
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
            is_int_tensor(index)
            and index.ndim == 1
            and index.numel() > 0
            and self.initialized
            and isinstance(stored, TensorDictBase)
            and not self._torchrl_path()
        ):
            low, high = bounds(index)
            size = len(self)
            if 0 <= low and high < size:
                return gather_rows(stored, index, pinned=self._pin_outputs, item_shapes=self._item_shapes)
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


def _cursor_dims(cursor: Any) -> tuple[int, int] | None:
    """``(storage dims, data dims)`` of a write at ``cursor``: how many leading dims of the
    storage it addresses, and of the data that fills them (none for an int, one per slice,
    the broadcast dims of index tensors and lists, one for a mask); ``None`` for ``...`` or
    ``None`` in it."""
    addressed = sliced = advanced = 0
    for part in cursor if isinstance(cursor, tuple) else (cursor,):
        if part is None or part is Ellipsis:
            return None
        if isinstance(part, slice):
            addressed, sliced = addressed + 1, sliced + 1
        elif isinstance(part, torch.Tensor) and part.dtype in (torch.bool, torch.uint8):
            addressed, advanced = addressed + part.ndim, max(advanced, 1)
        else:  # an int, index tensor, list or range
            ndim = part.ndim if isinstance(part, torch.Tensor) else np.ndim(part)
            addressed, advanced = addressed + 1, max(advanced, ndim)
    return addressed, sliced + advanced


def _ring_slices(start: int, n: int, capacity: int) -> list[tuple[int, int, int, int]]:
    """``(start, stop, data_first, data_last)`` slices of ``n`` rows written from ``start`` round a ring."""
    head = min(n, capacity - start)
    ranges = [(start, start + head, 0, head)]
    if head < n:
        ranges.append((0, n - head, head, n))
    return ranges


#: :meth:`_SliceWritesIndexSelectReads._check_matches_storage`'s answer for a write whose keys
#: differ from the stored ones in a storage that is not strict: TorchRL's ``set`` writes it.
_TORCHRL_WRITE = object()


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
    with slice-copy writes and ``index_select`` reads. Same constructor.

    A leaf whose items hold no elements (an item dim of size 0) is refused at the first
    write: its file would be empty, which cannot be mapped (TorchRL's storage fails there
    half-way, with the writer already moved on).
    """

    def _check_first_items(self, data: Any, written: int) -> None:
        leaves = [("", data)] if isinstance(data, torch.Tensor) else (
            leaf_items(data) if isinstance(data, TensorDictBase) else [])
        for key, leaf in leaves:
            if isinstance(leaf, torch.Tensor) and 0 in leaf.shape[written:]:
                shown, fix = ("the data", "use") if key == "" else (
                    f"key {key!r}", f"leave it out (data.exclude({key!r})) or use")
                raise StorageLayoutError(
                    f"{shown} has items of shape {list(leaf.shape[written:])}, with no elements: "
                    f"{type(self).__name__} keeps each leaf in a memory-mapped file, and an empty "
                    f"file cannot be mapped; {fix} FastTensorStorage, which stores it."
                )
