"""The common ``extend`` of a ``[N]`` batch into a 1-D fast storage, without TorchRL's layers.

A fast path (:mod:`torchrl_ext._fastpath`): with the fast paths off, TorchRL's ``extend`` runs.
A mixin for :class:`~torchrl_ext.replay_buffers.TensorDictReplayBuffer`: it reads the
buffer's writer, storage, sampler, locks and transform, as TorchRL's ``extend`` does.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase, unravel_key
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

from torchrl_ext import _compat
from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.storages.fast import FastMemmapStorage, FastTensorStorage, ring_index

__all__ = ["LeanExtend"]


class LeanExtend:
    """``_lean_extend``: TorchRL's ``extend`` in one layer, where it provably does the same."""

    def _has_transform(self) -> bool:
        """Whether the buffer applies a transform (TorchRL's test, as its ``extend`` makes it)."""
        transform = self.transform
        return transform is not None and len(transform) > 0

    def _lean_extend_applies(self, data: Any) -> bool:
        """Whether :meth:`_lean_extend` does exactly what TorchRL's ``extend`` would."""
        storage, writer = self.storage, self.writer
        return (
            fastpath_enabled()
            and type(writer) is TensorDictRoundRobinWriter  # exactly: subclasses may place data elsewhere
            and not writer.tracks_generations
            and isinstance(storage, (FastTensorStorage, FastMemmapStorage))
            and storage.ndim == 1
            and storage.initialized
            and isinstance(data, TensorDictBase)
            and data.batch_dims == 1
            and 0 < data.shape[0] <= storage.max_size
            and not self.dim_extend
            and not self._has_transform()
            and not _compat.is_consuming(self)
            and self.initialized
        )

    def _lean_extend(self, data: TensorDictBase, update_priority: bool | None) -> torch.Tensor:
        """TorchRL's ``extend`` of a ``[N]`` batch into a 1-D fast storage, in one layer.

        The same steps in the same order (cursor, write count, ``"index"`` written with the
        rows, the storage write, the buffer's and sampler's update notices, the priority
        write-back), without the wrappers and branches that cannot apply here. As there, the
        caller's batch is not modified (the ``"index"`` entry is stored with the rows), and a
        write the storage refuses moves the writer back (``FastTensorStorage.set``).
        """
        writer, storage = self.writer, self.storage
        n, capacity = data.shape[0], storage.max_size
        # The replay lock spans the write and its priorities (another thread must not write
        # the same rows in between); update_priority takes the process lock itself. The
        # readiness condition is taken first, in wait_until_sampleable's order. (Inline, as in
        # EnvRingReplayBuffer._write: a shared generator context manager costs more per
        # write than the write's own locking.)
        try:
            with _compat.readiness_condition(self), _compat.replay_lock(self):
                with _compat.write_lock(self):
                    start = _compat.writer_cursor(writer)
                    index = ring_index(start, n, capacity, data.device)
                    _compat.set_writer_cursor(writer, (start + n) % capacity, written=n)
                    # TorchRL writes "index" into a shallow copy of the batch; the storage takes it
                    # apart and stores it with the rows, so that no copy is made.
                    stored_keys = storage.set_ring_rows(start, index, data, extra={"index": index})
                    _compat.mark_updated(writer, index)
                    self.sampler.extend(index)
                # A batch found to hold exactly the stored keys has no priority entry unless one is
                # stored: that spares TensorDict.get's miss (several us on a 1,000-row write).
                if (update_priority is None or update_priority) and (
                    stored_keys is None or unravel_key(self.priority_key) in stored_keys
                ):
                    try:
                        priority = data.get(self.priority_key, None)
                        if priority is not None:
                            self.update_priority(index, priority)
                    except Exception as err:  # TorchRL's wording and type for this failure
                        raise RuntimeError(
                            "Failed to update priority of extended data. You can try to set "
                            "update_priority=False in the extend method and update the priority manually."
                        ) from err
        finally:
            # TorchRL's extend wakes the waiters (wait_until_sampleable, sample(wait=True))
            # after each write; nothing else would, as it is skipped here.
            _compat.notify_state_change(self)
        return index
