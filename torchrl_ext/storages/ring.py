"""Per-environment ring storage: ``[num_envs, max_length]``, one cursor per env.

TorchRL's multi-dimensional storages share one cursor, so every extend must
carry all environments (TorchRL issue #3194). ALF's replay buffer instead
gives each environment its own ring: env ``e`` keeps its last ``max_length``
steps, and envs can hold different amounts of data at different positions.

A *position* counts the steps written to one env and grows forever (int64);
the storage *slot* of a position is ``position % max_length``. Env ``e``
holds positions ``[current_pos[e] - current_size[e], current_pos[e] - 1]``.
Steps are addressed by ``(env, position)``: unlike a slot, a position never
names two different steps, so a stale index can be recognised.
The storage only holds data and these two counters;
:class:`~torchrl_ext.writers.EnvRingWriter` decides which positions a batch goes
to and :class:`~torchrl_ext.samplers.TrajectorySampler` picks windows.
"""
from __future__ import annotations

from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import TensorDictReplayBuffer as _TorchRLTensorDictReplayBuffer
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
from torchrl.data.replay_buffers.storages import Storage

from torchrl_ext.io.state_files import (
    load_state,
    save_state,
    tensordict_from_state,
    tensordict_state,
)
from torchrl_ext.storages.fast import _layout, _leaves, _raise_layout_mismatch

__all__ = ["EnvRingStorage", "EnvRingStorageCheckpointer"]

_TENSORS, _METADATA = "ring_storage.safetensors", "ring_storage.json"


class EnvRingStorageCheckpointer(StorageCheckpointerBase):
    """Saves an :class:`EnvRingStorage` as safetensors + JSON (no pickle, atomic files)."""

    def dumps(self, storage: EnvRingStorage, path: str | Path) -> None:
        save_state(path, storage.state_dict(), tensors_file=_TENSORS, metadata_file=_METADATA)

    def loads(self, storage: EnvRingStorage, path: str | Path) -> None:
        storage.load_state_dict(load_state(path, tensors_file=_TENSORS, metadata_file=_METADATA))


class EnvRingStorage(Storage):
    """One ring of ``max_length`` steps per environment, TensorDict leaves ``[E, L, ...]``.

    The leaves are allocated from the first write (any nested keys), on
    ``device``. Later writes must carry the same keys, per-step shapes and
    dtypes; a mismatch raises ``ValueError`` before anything is written.

    Args:
        num_envs: number of environments ``E``.
        max_length: steps kept per environment ``L``.

    Keyword Args:
        device: where the data lives. The counters stay on the CPU, where the
            bookkeeping is cheapest.
        checkpointer: defaults to :class:`EnvRingStorageCheckpointer`.

    Shape contract:
        ``get((env, position))`` with two integer tensors of one shape ``S``
        returns a TensorDict of batch size ``S`` (the step in slot
        ``position % max_length``: reading a position that is no longer
        stored gives whatever replaced it; :meth:`read` checks); ``len(storage)`` is the
        number of stored steps over all envs.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages import EnvRingStorage
        >>> storage = EnvRingStorage(num_envs=2, max_length=3)
        >>> step = TensorDict({"obs": torch.tensor([[1.0], [2.0]])}, [2])
        >>> storage.set((torch.tensor([0, 1]), torch.tensor([0, 0])), step)
        >>> storage.advance(torch.tensor([0, 1]), 1)
        >>> len(storage), storage.current_pos.tolist()
        (2, [1, 1])
        >>> storage.get((torch.tensor([1]), torch.tensor([0])))["obs"].tolist()
        [[2.0]]
    """

    _default_checkpointer = EnvRingStorageCheckpointer
    ndim = 2
    returns_tensordicts = True  # reads give one TensorDict: no collate function needed
    #: Oldest stored steps of each env that cannot be read whole (a frame-stacking
    #: storage needs the ``num_stack - 1`` steps before a step); samplers skip them.
    required_lookback = 0

    def __init__(
        self,
        num_envs: int,
        max_length: int,
        *,
        device: torch.device | str = "cpu",
        checkpointer: StorageCheckpointerBase | None = None,
    ) -> None:
        for name, value in (("num_envs", num_envs), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}.")
        super().__init__(num_envs * max_length, checkpointer=checkpointer)
        self._num_envs, self._max_length = num_envs, max_length
        self._device = torch.device(device)
        self._storage: TensorDictBase | None = None
        self._flat: list[tuple[Any, torch.Tensor]] = []  # (key, leaf viewed as [E*L, ...])
        self._layout_cache: dict | None = None
        # The counters live in numpy arrays with torch views on them (same
        # memory): samplers do tensor math on the views, while the per-write
        # bookkeeping of a few dozen envs runs on numpy, about 5x cheaper per call.
        self._pos_np = np.zeros(num_envs, dtype=np.int64)
        self._size_np = np.zeros(num_envs, dtype=np.int64)
        self._counter_views()
        # Clears per env: lets samplers that keep per-position state notice a
        # clear even when the env has since been written past its old position.
        self._resets = torch.zeros(num_envs, dtype=torch.long)
        self._last_cursor = None

    # ------------------------------------------------------------------
    @property
    def num_envs(self) -> int:
        return self._num_envs

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self._num_envs, self._max_length])

    @property
    def initialized(self) -> bool:
        return self._storage is not None

    @property
    def current_pos(self) -> torch.Tensor:
        """Position the next step of each env gets, int64 ``[E]`` (a copy)."""
        return self._current_pos.clone()

    @property
    def current_size(self) -> torch.Tensor:
        """Steps stored per env, int64 ``[E]`` (a copy)."""
        return self._current_size.clone()

    def earliest_position(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Oldest stored position of each env in ``env_ids`` (all envs by default)."""
        earliest = self._current_pos - self._current_size
        return earliest if env_ids is None else earliest[env_ids]

    def __len__(self) -> int:
        return int(self._current_size.sum())

    @property
    def _is_full(self) -> bool:
        return bool((self._current_size == self._max_length).all())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self._num_envs}, max_length={self._max_length}, "
            f"stored={len(self)}, device={self._device})"
        )

    def attach(self, buffer: Any) -> None:
        """Refuses buffers that would hand the rings transposed or mis-indexed batches."""
        ring_buffer = getattr(buffer, "_drives_env_rings", False)
        dim_extend = getattr(buffer, "_dim_extend", 0)
        if dim_extend not in (0, None) or (dim_extend is None and not ring_buffer):
            raise ValueError(
                f"{type(self).__name__} needs dim_extend=0 (batches are [N] or [N, T] steps "
                "of N envs); build the buffer with dim_extend=0, or use "
                "torchrl_ext.replay_buffers.EnvRingReplayBuffer."
            )
        if isinstance(buffer, _TorchRLTensorDictReplayBuffer) and not ring_buffer:
            # TorchRL's TensorDictReplayBuffer cannot write [N, 2] coordinates into [N] data.
            raise ValueError(
                f"TorchRL's TensorDictReplayBuffer cannot index an {type(self).__name__}; "
                "use torchrl_ext.replay_buffers.EnvRingReplayBuffer (same API)."
            )
        super().attach(buffer)

    # ------------------------------------------------------------------
    # Writes
    def set(self, cursor: Any, data: TensorDictBase, *, set_cursor: bool = True) -> None:
        """Writes ``data`` at ``cursor = (env, position)``, integer tensors of ``data``'s batch shape.

        Counters do not move: :meth:`advance` does that (the writer calls it).
        """
        env, position = self._as_coordinates(cursor)
        self._write(env, position, data, set_cursor=set_cursor)

    def _write(
        self, env: torch.Tensor, position: torch.Tensor, data: TensorDictBase, *, set_cursor: bool
    ) -> None:
        """:meth:`set` for coordinates known to be in range (checks the data only)."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"data must be a TensorDict, got {type(data).__name__}; wrap tensors as "
                "TensorDict({'obs': x}, batch_size=[N])."
            )
        if tuple(data.batch_size) != tuple(env.shape):
            raise ValueError(
                f"data has batch size {list(data.batch_size)} but the cursor addresses "
                f"{list(env.shape)} steps; give one (env, position) pair per step."
            )
        layout = _layout(data, env.ndim)
        if layout is None:
            raise TypeError(
                "every leaf of data must be a tensor; non-tensor leaves cannot be stored in "
                f"{type(self).__name__}."
            )
        if self._storage is None:
            self._allocate(data, env.ndim)
        elif layout != self._layout_cache:
            _raise_layout_mismatch(self._layout_cache, layout)
        flat = self._flat_index(env, position).reshape(-1)
        n = flat.numel()
        for key, leaf in self._flat:
            value = data.get(key)
            if value.dim() != leaf.dim():  # [N, T, ...] batches: one row per step
                value = value.reshape(n, *leaf.shape[1:])
            if value.device != leaf.device:
                value = value.to(leaf.device)
            row_bytes = leaf[0].numel() * leaf.element_size()
            if leaf.element_size() < 8 and row_bytes % 8 == 0 and row_bytes >= 64:
                # index_copy_ moves small dtypes (uint8 frames) about 5x slower
                # than the same bytes seen as int64.
                leaf.view(leaf.shape[0], -1).view(torch.int64).index_copy_(
                    0, flat, value.contiguous().view(n, -1).view(torch.int64))
            else:
                leaf.index_copy_(0, flat, value)
        if set_cursor:
            # TorchRL's shared last-cursor index describes a 1-D ring and has no
            # meaning for per-env rings; the attribute is kept for inspection.
            self._last_cursor = flat
        self._bump_mutation_revision()

    def advance(self, env_ids: torch.Tensor, steps: int) -> None:
        """Moves the cursors of ``env_ids`` (distinct) on by ``steps`` written steps."""
        ids = torch.as_tensor(env_ids, dtype=torch.long).cpu().numpy()
        self._pos_np[ids] += steps
        self._size_np[ids] = np.minimum(self._size_np[ids] + steps, self._max_length)

    def shrink(self, env_ids: torch.Tensor, n: torch.Tensor | int) -> None:
        """Forgets the ``n`` oldest steps of each env in ``env_ids`` (at most what it holds)."""
        env_ids = torch.as_tensor(env_ids, dtype=torch.long).cpu()
        size = self._current_size[env_ids]
        self._current_size[env_ids] = size - torch.minimum(torch.as_tensor(n), size)
        self._bump_mutation_revision()

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Sets the position and size of ``env_ids`` (all envs by default) to 0."""
        env_ids = slice(None) if env_ids is None else torch.as_tensor(env_ids).cpu()
        self._current_pos[env_ids] = 0
        self._current_size[env_ids] = 0
        self._resets[env_ids] += 1
        self._bump_mutation_revision()

    def _allocate(self, data: TensorDictBase, batch_dims: int) -> None:
        shape = (self._num_envs, self._max_length)
        self._storage = TensorDict(
            {
                key: torch.zeros(
                    shape + tuple(leaf.shape[batch_dims:]), dtype=leaf.dtype, device=self._device
                )
                for key, leaf in _leaves(data)
            },
            batch_size=shape,
            device=self._device,
        )
        self._index_leaves()

    def flat_leaf(self, key: Any) -> torch.Tensor | None:
        """The stored leaf ``key`` viewed as ``[E * L, ...]`` (rows ``env * L + slot``), or ``None``."""
        for leaf_key, leaf in self._flat:
            if leaf_key == key:
                return leaf
        return None

    def _index_leaves(self) -> None:
        self._flat = [
            (key, leaf.view(-1, *leaf.shape[2:])) for key, leaf in _leaves(self._storage)
        ]
        self._layout_cache = _layout(self._storage, 2)

    # ------------------------------------------------------------------
    # Reads
    def get(self, index: Any) -> TensorDictBase:
        """Steps at ``index``: an ``(env, position)`` pair of integer tensors of one shape.

        An ``(env, start, end)`` triple gives n-step transitions: root entries
        from ``start``, ``"next"`` entries from ``end``.

        Other indices (an int env, slices, ...) index the ``[E, L]`` TensorDict.
        """
        if self._storage is None:
            raise RuntimeError(f"{type(self).__name__} is empty: write data before reading it.")
        if isinstance(index, tuple) and len(index) == 2 and all(
            isinstance(i, torch.Tensor) and not i.dtype.is_floating_point for i in index
        ):
            env, position = self._as_coordinates(index)
            self._check_readable(env, position)
            return self._gather(env, position)
        if isinstance(index, tuple) and len(index) == 3 and all(
            isinstance(i, torch.Tensor) and not i.dtype.is_floating_point for i in index
        ):
            env, start = self._as_coordinates(index[:2])
            end = self._as_coordinates((env, index[2]))[1]
            self._check_readable(env, start)
            return self._gather_chain(env, start, end)
        return self._storage[index]

    def _gather_chain(
        self,
        env: torch.Tensor,
        start: torch.Tensor,
        end: torch.Tensor,
        extra: dict[Any, torch.Tensor] | None = None,
    ) -> TensorDictBase:
        """Root entries at ``(env, start)`` and ``"next"`` entries at ``(env, end)``: the
        transition from ``start`` to the observation after ``end`` (n-step sampling).
        ``extra`` entries (the sampler's n-step reward, ...) replace stored ones."""
        extra = extra or {}
        if type(self)._gather is not EnvRingStorage._gather:  # subclasses rebuild entries on read
            out = self._gather(env, start)
            if "next" in out.keys():
                out.set("next", self._gather(env, end).get("next"))
            for key, value in extra.items():
                out.set(key, value)
            return out
        # One gather per leaf, at the row it is read from; overridden leaves are skipped.
        rows = {"root": self._flat_index(env, start), "next": self._flat_index(env, end)}
        shape = env.shape
        entries = dict(extra)
        for key, leaf in self._flat:
            if key in entries:
                continue
            row = rows["next" if isinstance(key, tuple) and key[0] == "next" else "root"]
            entries[key] = leaf.index_select(0, row.reshape(-1)).reshape(*shape, *leaf.shape[1:])
        return TensorDict(entries, batch_size=shape, device=self._device)

    def _check_readable(self, env: torch.Tensor, position: torch.Tensor) -> None:
        """Hook for :meth:`get`: subclasses refuse steps they cannot rebuild whole."""

    def _gather(
        self, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None = None
    ) -> TensorDictBase:
        """:meth:`get` for coordinates known to be valid, plus ``extra`` entries of the same batch shape."""
        flat = self._flat_index(env, position)
        shape = flat.shape
        flat = flat.reshape(-1)
        entries = {
            key: leaf.index_select(0, flat).reshape(*shape, *leaf.shape[1:])
            for key, leaf in self._flat
        }
        if extra:
            entries.update(extra)
        return TensorDict(entries, batch_size=shape, device=self._device)

    def read(self, env_ids: torch.Tensor, positions: torch.Tensor) -> TensorDictBase:
        """Steps at absolute ``positions`` of ``env_ids`` (ALF's ``get_field``), checked.

        Raises:
            ValueError: if a position is not stored (overwritten, or not yet written).
        """
        env_ids = torch.as_tensor(env_ids, dtype=torch.long).cpu()
        positions = torch.as_tensor(positions, dtype=torch.long).cpu()
        env_ids, positions = torch.broadcast_tensors(env_ids, positions)
        self._check_env_ids(env_ids)
        earliest = self.earliest_position()[env_ids]
        stored = (positions >= earliest) & (positions < self._current_pos[env_ids])
        if not bool(stored.all()):
            bad = int(stored.logical_not().nonzero()[0, 0]) if stored.ndim else 0
            e, p = int(env_ids.reshape(-1)[bad]), int(positions.reshape(-1)[bad])
            raise ValueError(
                f"position {p} of env {e} is not stored; env {e} holds positions "
                f"[{int(self._current_pos[e] - self._current_size[e])}, "
                f"{int(self._current_pos[e]) - 1}]."
            )
        return self.get((env_ids, positions))

    def gather_all(self, num_earliest_ignored: int = 0) -> tuple[TensorDictBase, torch.Tensor]:
        """Everything stored, chronologically, as ``[E, n]`` plus the start positions ``[E]``.

        Every env must hold the same number of steps at the same positions.
        An empty buffer gives ``n = 0`` (ALF returns ``L`` stale steps there).

        Args:
            num_earliest_ignored: leave out that many oldest steps of each env.
        """
        if isinstance(num_earliest_ignored, bool) or not isinstance(num_earliest_ignored, int) or (
            num_earliest_ignored < 0
        ):
            raise ValueError(
                "num_earliest_ignored must be an int >= 0, got "
                f"num_earliest_ignored={num_earliest_ignored!r}."
            )
        pos, size = self._current_pos, self._current_size
        if not (bool((pos == pos[0]).all()) and bool((size == size[0]).all())):
            raise ValueError(
                "gather_all needs every env at the same position with the same size, got "
                f"current_pos={pos.tolist()}, current_size={size.tolist()}; sample windows "
                "instead, or write all envs together."
            )
        n = max(int(size[0]) - num_earliest_ignored, 0)
        start = int(pos[0]) - n
        positions = torch.full((self._num_envs,), start, dtype=torch.long)
        if self._storage is None or n == 0:
            return self._empty_result((self._num_envs, 0)), positions
        env = torch.arange(self._num_envs).unsqueeze(1).expand(-1, n)
        return self.get((env, torch.arange(start, start + n).expand(self._num_envs, -1))), positions

    def _empty_result(self, shape: tuple[int, ...]) -> TensorDictBase:
        if self._storage is None:
            return TensorDict({}, batch_size=shape, device=self._device)
        return TensorDict(
            {key: torch.empty(*shape, *leaf.shape[1:], dtype=leaf.dtype, device=self._device)
             for key, leaf in self._flat},
            batch_size=shape,
            device=self._device,
        )

    def _rand_given_ndim(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform draws over the stored steps (``RandomSampler`` support), as ``(env, position)``."""
        # The counters live in numpy (they are views of the same memory): the
        # bookkeeping of a draw costs microseconds there, tens of them in torch.
        readable = np.maximum(self._size_np - self.required_lookback, 0)
        total = int(readable.sum())
        if total == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        flat = torch.randint(total, (batch_size,), generator=self._rng).numpy()
        ends = readable.cumsum()
        env = np.searchsorted(ends, flat, side="right")
        earliest = self._pos_np - self._size_np + self.required_lookback
        position = (earliest - ends + readable)[env] + flat
        return torch.from_numpy(env), torch.from_numpy(position)

    def contains(self, item: Any) -> bool:
        """Whether ``(env, position)`` (ints) is stored."""
        env, position = item
        pos, size = int(self._current_pos[env]), int(self._current_size[env])
        return pos - size <= position < pos

    # ------------------------------------------------------------------
    # Checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "num_envs": self._num_envs,
            "max_length": self._max_length,
            "data": tensordict_state(self._storage),
            "counters": [
                self._current_pos.clone(), self._current_size.clone(), self._resets.clone()
            ],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name in ("num_envs", "max_length"):
            if state_dict[name] != getattr(self, name):
                raise ValueError(
                    f"the checkpoint has {name}={state_dict[name]} but this storage has "
                    f"{name}={getattr(self, name)}; build it with the same geometry."
                )
        self._storage = tensordict_from_state(state_dict["data"], self._device)
        if self._storage is not None:
            self._index_leaves()
        else:
            self._flat, self._layout_cache = [], None
        pos, size, resets = state_dict["counters"]
        self._current_pos.copy_(pos)
        self._current_size.copy_(size)
        self._resets.copy_(resets)
        self._bump_mutation_revision()

    def _empty(self) -> None:
        self.reset()

    # ------------------------------------------------------------------
    def _as_coordinates(self, cursor: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(cursor, tuple) and len(cursor) == 2):
            raise TypeError(
                f"{type(self).__name__} is addressed by (env, position) pairs of integer "
                f"tensors, got {type(cursor).__name__}."
            )
        env, position = (torch.as_tensor(c) for c in cursor)
        if env.dtype.is_floating_point or position.dtype.is_floating_point:
            raise TypeError("env and position indices must be integers.")
        env, position = torch.broadcast_tensors(env.long(), position.long())
        if env.numel():
            if int(env.min()) < 0 or int(env.max()) >= self._num_envs:
                raise ValueError(
                    f"env index out of range: got values in [{int(env.min())}, "
                    f"{int(env.max())}], num_envs={self._num_envs}."
                )
            if int(position.min()) < 0:
                raise ValueError(
                    f"positions must be >= 0, got {int(position.min())}; positions count "
                    "the steps written to an env."
                )
        return env, position

    def _flat_index(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Row of ``(env, position)`` in the leaves viewed as ``[E * L, ...]``."""
        if env.device.type == "cpu" and position.device.type == "cpu":
            flat = env.numpy() * self._max_length + position.numpy() % self._max_length
            return torch.from_numpy(flat).to(self._device)
        return (env * self._max_length + position % self._max_length).to(self._device)

    def _counter_views(self) -> None:
        self._current_pos = torch.from_numpy(self._pos_np)
        self._current_size = torch.from_numpy(self._size_np)

    # ------------------------------------------------------------------
    # Sharing with other processes
    @property
    def is_shared(self) -> bool:
        """Whether :meth:`share_memory_` put the data and the counters in shared memory."""
        return getattr(self, "_shared", False)

    def share_memory_(self, example: TensorDictBase | None = None) -> EnvRingStorage:
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
        if self.is_shared:
            # Send the shared counter tensors; numpy views are rebuilt on arrival.
            state.pop("_pos_np", None)
            state.pop("_size_np", None)
            state.pop("_flat", None)
            return state
        # Views are rebuilt on unpickling so that they share the arrays again.
        state.pop("_current_pos", None)
        state.pop("_current_size", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.is_shared:
            self._pos_np, self._size_np = self._current_pos.numpy(), self._current_size.numpy()
            self._index_leaves()
        else:
            self._counter_views()

    def _check_env_ids(self, env_ids: torch.Tensor) -> None:
        if env_ids.numel() and (int(env_ids.min()) < 0 or int(env_ids.max()) >= self._num_envs):
            raise ValueError(
                f"env_ids must lie in [0, {self._num_envs - 1}], got values in "
                f"[{int(env_ids.min())}, {int(env_ids.max())}]."
            )
