"""Tensor storages that write ring ranges as slice copies and gather with ``index_select``.

TorchRL's ``RoundRobinWriter`` hands a storage ``arange(start, start + n) %
capacity`` and ``LazyTensorStorage`` writes it through advanced indexing
(``index_put``), which moves image rows at about 1 GB/s where a contiguous
copy reaches about 10 GB/s. Reads use TensorDict advanced indexing, 5-10x
slower on CPU than ``index_select``. The storages here keep TorchRL's classes,
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

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torchrl.data import LazyMemmapStorage, LazyTensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter

from torchrl_ext.storages._numpy_rows import NUMPY_DTYPES, ColumnCache, matching_arrays

__all__ = ["FastMemmapStorage", "FastTensorStorage", "gather_rows"]

# TensorDict's constructor re-checks every entry's batch dims and device (about 40 us for a
# dozen leaves); the gathers below build entries that satisfy both by construction, so they
# use the unchecked constructor TensorDict's own ops use, when this tensordict has it.
_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)


def assemble(entries: dict[Any, torch.Tensor], batch_size: torch.Size, device: Any,
             extra: dict[Any, torch.Tensor] | None = None) -> TensorDict:
    """``TensorDict({**entries, **extra}, batch_size, device)`` without re-checking ``entries``.

    ``entries`` must already lead with ``batch_size`` and live on ``device`` (gathered from a
    storage's own leaves); ``extra`` (sampler info) is checked, moved to ``device`` and added.

    Examples:
        >>> import torch
        >>> td = assemble({"a": torch.zeros(2, 3), ("b", "c"): torch.ones(2)}, torch.Size([2]), None,
        ...               extra={"index": torch.tensor([4, 1])})
        >>> td.batch_size, td["b", "c"].tolist(), td["index"].tolist()
        (torch.Size([2]), [1.0, 1.0], [4, 1])
    """
    batch_size = torch.Size(batch_size)
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    for key, value in (extra or {}).items():
        if value.shape[: len(batch_size)] != batch_size:
            raise ValueError(
                f"sampler info {key!r} has shape {list(value.shape)}, which does not lead with the "
                f"sample's batch size {list(batch_size)}; return per-item info from the sampler."
            )
        entries[key] = value if device is None or value.device == device else value.to(device)
    if _NEW_UNSAFE is None:
        return TensorDict(entries, batch_size=batch_size, device=device)
    root: dict[str, Any] = {}
    for key, value in entries.items():
        if isinstance(key, tuple):
            node = root
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = value
        else:
            root[key] = value
    return _NEW_UNSAFE(source=root, batch_size=batch_size, device=device)


def gather_rows(
    stored: TensorDictBase,
    index: torch.Tensor,
    extra: dict[Any, torch.Tensor] | None = None,
    leaves: list[tuple[Any, torch.Tensor]] | None = None,
) -> TensorDict:
    """``stored[index]`` for a 1-D index, one ``index_select`` per leaf, plus ``extra`` entries.

    Args:
        stored: a TensorDict whose leaves are all tensors, batch dim first.
        index: 1-D integer tensor of rows, all within ``stored``.
        extra: entries of shape ``[len(index), ...]`` added to the result.
        leaves: ``stored``'s ``(key, tensor)`` leaves, if the caller keeps them
            (listing them costs microseconds per call).

    Returns:
        A TensorDict of batch size ``[len(index)]`` on ``stored``'s device.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages.fast import gather_rows
        >>> td = TensorDict({"a": torch.arange(5.0), ("b", "c"): torch.arange(5) * 10}, [5])
        >>> out = gather_rows(td, torch.tensor([4, 0]))
        >>> out["a"].tolist(), out["b", "c"].tolist()
        ([4.0, 0.0], [40, 0])
    """
    device = stored.device
    if device is not None and index.device != device:
        index = index.to(device)
    if leaves is None:
        leaves = stored.items(include_nested=True, leaves_only=True)
    entries = {key: select_rows(tensor, index) for key, tensor in leaves}
    return assemble(entries, index.shape, device, extra)


# glibc serves allocations above 32 MiB (its largest mmap threshold) with fresh mmaps,
# whose every 4 KiB page faults on first write: a 115 MB gather of frames spent three
# quarters of its time in page faults. numpy asks for transparent huge pages on such
# arrays (madvise), 512x fewer faults where the kernel grants them (as here); smaller
# outputs come from the reused heap and stay with torch's allocator.
_HUGE_OUTPUT_BYTES = 32 << 20


def select_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tensor.index_select(0, index)``; outputs of 32 MiB or more on the CPU are
    allocated by numpy (huge pages), so they are not resizable in place.

    Examples:
        >>> import torch
        >>> select_rows(torch.arange(6).reshape(3, 2), torch.tensor([2, 0])).tolist()
        [[4, 5], [0, 1]]
    """
    dtype = NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None or not tensor.is_cpu or (
        index.numel() * tensor.element_size() * (tensor.numel() // max(tensor.shape[0], 1))
        < _HUGE_OUTPUT_BYTES
    ):
        return tensor.index_select(0, index)
    out = torch.from_numpy(np.empty((index.numel(), *tensor.shape[1:]), dtype=dtype))
    return torch.index_select(tensor, 0, index, out=out)


def gather_coordinates(
    stored: TensorDictBase,
    index: tuple[torch.Tensor, ...],
    extra: dict[Any, torch.Tensor] | None = None,
    leaves: Any = None,
) -> TensorDict:
    """``stored[index]`` for one integer tensor per leading dim: one ``index_select``
    of flat rows per leaf (TensorDict's advanced indexing costs several times more).

    Args:
        stored: a TensorDict whose leaves are all tensors, ``len(index)`` leading dims
            laid out contiguously (so each leaf flattens to rows without a copy).
        index: coordinates, broadcastable to the result's batch shape.
        extra: entries of the result's batch shape added to it.
        leaves: ``stored``'s ``(key, tensor)`` leaves, if the caller keeps them.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages.fast import gather_coordinates
        >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3)}, [2, 3])
        >>> gather_coordinates(td, (torch.tensor([1, 0]), torch.tensor([2, 1])))["a"].tolist()
        [5.0, 1.0]
    """
    coords = torch.broadcast_tensors(*index) if len(index) > 1 else index
    ndim, shape = len(coords), coords[0].shape
    flat = coords[0]
    for coord, size in zip(coords[1:], stored.batch_size[1:]):
        flat = flat * size + coord
    device = stored.device
    flat = flat.reshape(-1) if device is None else flat.reshape(-1).to(device)
    if leaves is None:
        leaves = stored.items(include_nested=True, leaves_only=True)
    if len(shape) == 1:  # the usual sampler output: the gathered rows already have the batch shape
        entries = {key: select_rows(leaf.flatten(0, ndim - 1), flat) for key, leaf in leaves}
    else:
        entries = {
            key: select_rows(leaf.flatten(0, ndim - 1), flat).reshape(*shape, *leaf.shape[ndim:])
            for key, leaf in leaves
        }
    return assemble(entries, shape, device, extra)


class _SliceWritesIndexSelectReads:
    """Mixin over a TorchRL ``TensorStorage``: the two fast paths described above."""

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        leaves = self._checked_leaves(cursor, data) if self.ndim == 1 else None
        ranges = self._ring_ranges(cursor, data)
        if ranges is None:
            return super().set(cursor, data, set_cursor=set_cursor)
        if leaves is None:  # first write (lazy init) or non-tensor leaves
            for start, stop, first, last in ranges:
                super().set(slice(start, stop), data[first:last], set_cursor=set_cursor)
            if set_cursor:
                self._set_last_cursor(cursor)  # the cursor TorchRL's set records, not the last slice
            return
        self._copy_ranges(leaves, ranges, cursor, data, set_cursor)

    def _set_ring_rows(self, start: int, cursor: torch.Tensor, data: Any,
                       extra: dict[Any, torch.Tensor] | None = None) -> None:
        """:meth:`set` of ``data`` plus the ``extra`` entries (TorchRL's ``"index"``) at
        ``cursor = (start + arange(n)) % max_size`` on an initialised 1-D storage, for callers
        that built the cursor that way (no re-check of it). ``data`` is not modified."""
        leaves = self._numpy_pairs(data, extra)
        if leaves is None:
            if extra:
                data = data.clone(False)
                for key, value in extra.items():
                    data.set(key, value)
            leaves = self._checked_leaves(cursor, data)
            if leaves is None:
                return self.set(cursor, data)
        self._copy_ranges(leaves, _ring_slices(start, cursor.numel(), self.max_size), cursor, data, True)

    def _numpy_pairs(self, data: Any, extra: dict[Any, torch.Tensor] | None = None) -> list | None:
        """``(stored, new rows)`` numpy views for a ``[N]`` batch that matches the stored
        leaves exactly (:func:`~torchrl_ext.storages._numpy_rows.matching_arrays`): the
        layout check and the copies in a fraction of torch's calls. ``None`` otherwise."""
        if self.ndim != 1 or not isinstance(data, TensorDictBase) or data.batch_dims != 1:
            return None
        cache = self.__dict__.get("_numpy_columns")
        if cache is None:
            cache = self._numpy_columns = ColumnCache()
        columns = cache.get(list(self._storage.items(include_nested=True, leaves_only=True)), batch_dims=1)
        return None if columns is None else matching_arrays(data, columns, data.shape[0], extra=extra)

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
            for start, stop, first, last in ranges:
                destination[start:stop] = source[first:last]
        if set_cursor:
            # What TorchRL's set records for a ring range (_set_last_cursor(cursor), then
            # _get_new_len), from the ranges instead of a dozen tensor ops on the cursor.
            self._set_last_cursor(ranges[-1][1] - 1)
            self._last_cursor = cursor
            self._len = min(self._len + sum(stop - start for start, stop, _, _ in ranges), self.max_size)
        self._bump_mutation_revision()

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
        for entity in self._attached_entities_iter():
            writer = getattr(entity, "_writer", None)
            if not isinstance(writer, RoundRobinWriter) or getattr(writer, "_storage", None) is not self:
                continue
            if writer._cursor == (start + count) % self.max_size and writer._write_count >= count:
                writer._cursor = start
                writer._write_count -= count

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
            return None
        pairs = None if single else self._numpy_pairs(data)
        if pairs is not None:
            return pairs
        expected = self._stored_layout()
        got = _layout(data, item_dims=0 if single else 1)
        if got is None or expected is None:
            return None
        if got != expected:
            _raise_layout_mismatch(expected, got)
        if isinstance(data, torch.Tensor):
            return [(self._storage, data)]
        return [(self._storage.get(key), leaf) for key, leaf in _leaves(data)]

    def _stored_layout(self) -> dict[Any, tuple[tuple[int, ...], torch.dtype]] | None:
        # The stored TensorDict is fixed once initialised; a new one (after
        # loads, say) is a new object, which invalidates this cache.
        cached = getattr(self, "_layout_cache", None)
        if cached is None or cached[0] is not self._storage:
            cached = self._layout_cache = (self._storage, _layout(self._storage, item_dims=1))
        return cached[1]

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
        ring = torch.arange(start, start + n, device=cursor.device).remainder_(capacity)
        if not torch.equal(cursor, ring.to(cursor.dtype)):
            return None
        return _ring_slices(start, n, capacity)

    def get(self, index: Any) -> Any:
        stored = getattr(self, "_storage", None)
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
            low, high = (int(x) for x in torch.aminmax(index))
            size = len(self)
            if 0 <= low and high < size:
                return gather_rows(stored, index)
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise IndexError(
                    f"index {bad} is out of range for a storage holding {size} items; read "
                    f"indices in [0, {size - 1}] (negative ones count from the end)."
                )
        return super().get(index)


def _ring_slices(start: int, n: int, capacity: int) -> list[tuple[int, int, int, int]]:
    """``(start, stop, data_first, data_last)`` slices of ``n`` rows written from ``start`` round a ring."""
    head = min(n, capacity - start)
    ranges = [(start, start + head, 0, head)]
    if head < n:
        ranges.append((0, n - head, head, n))
    return ranges


def _leaves(data: TensorDictBase) -> list[tuple[Any, Any]]:
    return list(data.items(include_nested=True, leaves_only=True))


def _layout(data: Any, item_dims: int) -> dict[Any, tuple[tuple[int, ...], torch.dtype]] | None:
    """Per-leaf item shape (without the first ``item_dims`` dims) and dtype."""
    if isinstance(data, torch.Tensor):
        return {"": (tuple(data.shape[item_dims:]), data.dtype)}
    if not isinstance(data, TensorDictBase):
        return None
    layout = {}
    for key, leaf in _leaves(data):
        if not isinstance(leaf, torch.Tensor):
            return None  # non-tensor leaves: TorchRL's own handling
        layout[key] = (tuple(leaf.shape[item_dims:]), leaf.dtype)
    return layout


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
