"""Sharing :class:`~torchrl_ext.storages.EnvRingStorage` with spawned processes.

A mixin: the rings, the cursors and any per-env tensors of subclasses go to shared memory, and
pickling refuses to copy an unshared storage into a spawned process (the copies would diverge).
"""
from __future__ import annotations

from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import TensorDictBase


class RingSharing:
    """``share_memory_``, ``is_shared`` and the pickling rules of shared rings."""

    @property
    def is_shared(self) -> bool:
        """Whether :meth:`share_memory_` put the data and the counters in shared memory."""
        return getattr(self, "_shared", False)

    def share_memory_(self, example: TensorDictBase | None = None) -> Any:
        """Puts the rings and their cursors in shared memory, for ``torch.multiprocessing``.

        After this, handing the storage (or a buffer over it) to a ``spawn``
        process shares it: steps written there are read here and the other
        way round. Writes are *not* serialised by the storage: the buffer's
        process lock does that (``rb.share(True)``, done by
        :func:`torchrl_ext.distributed.share_buffer`).

        Args:
            example: one batch of steps (``[N]`` or ``[N, T]``, the keys, per-step
                shapes and dtypes later writes carry). Needed when nothing was
                written yet: the rings are allocated from it (nothing is stored).

        Returns:
            The storage itself.

        Raises:
            ValueError: if the storage is empty and no ``example`` is given, or
                lives on a non-CPU device.
        """
        if self._device.type != "cpu":
            raise ValueError(
                f"{type(self).__name__}.share_memory_() shares CPU storages only, got "
                f"device={self._device}; build the storage with device='cpu' (CUDA tensors are "
                "shared by torch.multiprocessing without this call)."
            )
        if self._storage is None:
            if example is None:
                raise ValueError(
                    f"{type(self).__name__} allocates its rings on the first write, which a "
                    "spawned process would do in its own memory; pass example=<one batch of "
                    "steps> to share_memory_() (or write once before sharing)."
                )
            if not isinstance(example, TensorDictBase) or example.batch_dims not in (1, 2):
                raise ValueError(
                    "example must be a TensorDict of batch size [N] or [N, T], got "
                    f"{type(example).__name__} {list(getattr(example, 'batch_size', []))}."
                )
            self._allocate(example, example.batch_dims)
        self._storage.share_memory_()
        self._index_leaves()
        # Counters: torch tensors in shared memory, numpy views on them (pickling
        # sends the tensors, which torch.multiprocessing shares; numpy arrays
        # would be copied).
        for name in ("_current_pos", "_current_size"):
            tensor = getattr(self, name).clone().share_memory_()
            setattr(self, name, tensor)
        self._pos_np, self._size_np = self._current_pos.numpy(), self._current_size.numpy()
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                value.share_memory_()  # per-env state of subclasses, e.g. the episode index
        self._shared = True
        return self

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None and not self.is_shared:
            # The rings would be copied and the cursors diverge: every step written
            # in the new process would be lost to this one, silently.
            raise RuntimeError(
                f"{type(self).__name__} is being sent to a spawned process without "
                "share_memory_(): the two processes would write separate copies. Call "
                "torchrl_ext.distributed.share_buffer(rb, example=batch) (or "
                "storage.share_memory_(example)) before starting the processes."
            )
        state = super().__getstate__()
        state.pop("_draw_cache", None)  # derived from the counters: rebuilt at the next draw
        state.pop("_step_columns_cache", None)  # numpy views: rebuilt on the unpickled leaves
        state.pop("_read_columns_cache", None)
        # Flat views of the leaves: pickled apart, they would arrive as copies, and
        # writes would miss what state_dict and checkpoints read. Rebuilt on arrival.
        state.pop("_flat", None)
        if self.is_shared:
            # Send the shared counter tensors; numpy views are rebuilt on arrival.
            state.pop("_pos_np", None)
            state.pop("_size_np", None)
            return state
        # Views are rebuilt on unpickling so that they share the arrays again.
        state.pop("_current_pos", None)
        state.pop("_current_size", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.is_shared:
            self._pos_np, self._size_np = self._current_pos.numpy(), self._current_size.numpy()
        else:
            self._counter_views()
        self._index_leaves()

