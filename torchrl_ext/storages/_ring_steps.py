"""Writing one step of every env at once into :class:`~torchrl_ext.storages.EnvRingStorage`.

A mixin, not a storage. When every env stands at the same position (envs
stepped together, ALF's usual case), a ``[num_envs]`` step lands in one slot
column: each leaf is a single strided copy, with no per-env index arithmetic.
For the 64 envs of an ALF ``add_batch`` (17 KB) the calls around the copies,
not the bytes, are what costs, so this path runs on numpy views of the CPU
leaves (a numpy call costs a fraction of a torch op) and checks each leaf with
a handful of calls. Other devices and dtypes numpy cannot view take the
general ``_write``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

# torch dtypes whose CPU tensors numpy views without a copy (bfloat16 has no numpy twin).
_NUMPY_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64,
})


class RingStepWrites:
    """``_write_step``: the column write behind ``EnvRingWriter``'s every-env fast path."""

    def _step_columns(self) -> dict[Any, tuple[np.ndarray, tuple[int, ...], np.dtype]] | None:
        """Per stored key: (the ``[E, L, ...]`` leaf as a numpy array, the shape ``(E, ...)``
        of one step of every env, the numpy dtype).

        ``None`` when this path does not apply: nothing stored yet, leaves numpy
        cannot view (not on the CPU, bfloat16), or a subclass whose ``_write`` does
        more than copy rows (an episode index). Built lazily and dropped by
        ``_index_leaves`` and pickling: the views must be of the leaves the storage
        holds now (``share_memory_`` and loads put them in new memory).
        """
        columns = self.__dict__.get("_step_columns_cache")
        if columns is None and self._storage is not None:
            from torchrl_ext.storages.ring import EnvRingStorage  # the class that mixes this in

            if type(self)._write is not EnvRingStorage._write or not all(
                flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES for _, flat in self._flat
            ):
                return None
            columns = {}
            for key, flat in self._flat:
                leaf = flat.view(self._num_envs, self._max_length, *flat.shape[1:]).numpy()
                columns[key] = (leaf, (self._num_envs, *flat.shape[1:]), leaf.dtype)
            self._step_columns_cache = columns
            self._column_rows = np.arange(self._num_envs) * self._max_length  # flat row of slot 0
        return columns

    def _write_step(self, position: int, data: TensorDictBase, skip_key: Any = None) -> bool:
        """Writes the ``[num_envs]`` batch ``data`` (row ``e`` is env ``e``) at ``position`` of every env.

        Counters do not move (the writer calls ``advance``). ``skip_key`` names an entry
        that is not stored (the writer's env ids).

        Returns:
            ``False``, with nothing written, when this path does not apply (see
            :meth:`_step_columns`) or the batch differs in any way from what is
            stored (keys, per-step shapes, dtypes, device, autograd). The caller
            then takes ``_write``, which raises the errors a bad batch deserves.
        """
        columns = self._step_columns()
        if columns is None:
            return False
        pairs = _column_pairs(data.items(), columns, skip_key)
        if pairs is _NESTED:  # their leaves come under tuple keys, as the columns hold them
            pairs = _column_pairs(data.items(include_nested=True, leaves_only=True), columns, skip_key)
        if not pairs:
            return False
        slot = position % self._max_length
        for stored, array in pairs:
            stored[:, slot] = array
        self._last_cursor = torch.from_numpy(self._column_rows + slot)  # as _write sets it
        self._bump_mutation_revision()
        return True


_NESTED = object()


def _column_pairs(leaves: Any, columns: dict, skip_key: Any) -> list | object | None:
    """``(stored array, data array)`` for every column, ``_NESTED`` at the first nested
    entry, or ``None`` when the leaves do not match the columns exactly."""
    pairs = []
    try:
        for key, value in leaves:
            if key == skip_key:
                continue
            if not isinstance(value, torch.Tensor):
                return _NESTED if isinstance(value, TensorDictBase) and not isinstance(key, tuple) else None
            column = columns.get(key)
            if column is None:
                return None
            # numpy() refuses tensors off the CPU, with autograd history, or with
            # lazy conjugate/negative bits: those take the general write.
            array = value.numpy()
            dtype = array.dtype
            if array.shape != column[1] or (dtype is not column[2] and dtype != column[2]):
                return None
            pairs.append((column[0], array))
    except (RuntimeError, TypeError):
        return None
    return pairs if len(pairs) == len(columns) else None
