"""Writing one step of every env at once into :class:`~torchrl_ext.storages.EnvRingStorage`.

A mixin, not a storage. When every env stands at the same position (envs
stepped together, ALF's usual case), a ``[num_envs]`` step lands in one slot:
a single copy per leaf (one contiguous block in time-major rings), with no
per-env index arithmetic. For the 64 envs of an ALF ``add_batch``
(17 KB) the calls around the copies, not the bytes, are what costs, so this path
runs on numpy views of the CPU leaves (see :mod:`torchrl_ext.storages._numpy_rows`).
It is a fast path (:mod:`torchrl_ext._fastpath`): with the fast paths off, every write
takes the storage's general ``write_at``.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl_ext import _compat
from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.storages._numpy_rows import Columns, leaf_items, matching_arrays, numpy_columns


class RingStepWrites:
    """``write_step``: the slot write behind ``EnvRingWriter``'s every-env fast path."""

    def _step_columns(self) -> Columns | None:
        """Numpy views of the leaves as ``[L, E, ...]`` (slot first, whatever the layout), by key.

        ``None`` when this path does not apply: nothing stored yet, leaves numpy
        cannot view (not on the CPU, bfloat16), or a subclass whose ``write_at`` does
        more than copy rows (an episode index). Built lazily and dropped by
        ``_index_leaves`` and pickling: the views must be of the leaves the storage
        holds now (``share_memory_`` and loads put them in new memory). The rings
        replace their leaves only through ``_index_leaves``, so this cache needs no
        per-call check; TorchRL's storages, whose leaves TorchRL may swap, use
        :class:`~torchrl_ext.storages._numpy_rows.ColumnCache` instead.
        """
        columns = self.__dict__.get("_step_columns_cache")
        if columns is None and self._storage is not None:
            # Only where write_at copies rows and nothing else: the class defining the
            # write_at in use must say so itself (a subclass that overrides it does more).
            owner = next(cls for cls in type(self).__mro__ if "write_at" in vars(cls))
            if not vars(owner).get("write_at_copies_rows", False):
                return None
            leaves = [(key, leaf.transpose(0, 1)) for key, leaf in leaf_items(self._storage)]
            columns = numpy_columns(leaves, batch_dims=2)
            if columns is None:
                return None
            self._step_columns_cache = columns
        return columns

    def write_step(self, data: TensorDictBase, skip_key: Any = None) -> int | None:
        """Writes the ``[num_envs]`` batch ``data`` (row ``e`` is env ``e``) as the next step
        of every env, when every env stands at the same position, and moves the counters.

        The checks, the copies and the counters' move are one call: for the 17 KB of a
        64-env step, each call layer costs about a tenth of the copies. ``skip_key``
        names an entry that is not stored (the writer's env ids).

        Returns:
            The position written, or ``None``, with nothing written or moved, when this
            path does not apply: the envs stand at different positions, the step columns
            do not apply (see :meth:`_step_columns`), or the batch differs in any way from
            what is stored (keys, per-step shapes, dtypes, device, autograd). The caller
            then takes ``write_at``, which raises the errors a bad batch deserves.
        """
        columns = self._step_columns() if fastpath_enabled() else None
        if columns is None:
            return None
        position = self._common_position()
        if position is None:
            return None
        slot = position % self._max_length
        pairs = matching_arrays(data, columns, self._num_envs, skip_key)
        if pairs is None:
            return None
        for stored, array in pairs:
            stored[slot] = array
        self._last_rows = slot  # expanded to flat rows when read (last_written_rows)
        _compat.bump_mutation_revision(self)
        self._pos_np.fill(position + 1)  # every env stood at position; a fill costs a fifth of += 1
        self._grow_every_size(1)
        return position

    @property
    def last_written_rows(self) -> torch.Tensor | None:
        """Flat rows (see :meth:`flat_index`) of the last write, ``None`` before one. A step
        write records only its slot; the rows are built when read."""
        rows = getattr(self, "_last_rows", None)  # absent in pickles of older versions
        if isinstance(rows, int):
            rows = self._last_rows = self.flat_index(torch.arange(self._num_envs), torch.tensor(rows))
        return rows
