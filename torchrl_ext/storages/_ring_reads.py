"""The read half of :class:`~torchrl_ext.storages.EnvRingStorage`: gathers by ``(env, position)``.

A mixin, not a storage: it reads the attributes the storage keeps (``_storage``, ``_flat``,
the numpy counters, ``_num_envs``, ``_max_length``, ``_device``) and its coordinate helpers.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_ext import _compat
from torchrl_ext._checks import check_int
from torchrl_ext.storages._gathers import assemble, select_rows, take, take_rows
from torchrl_ext.storages._numpy_rows import Columns, numpy_columns


class RingReads:
    """``get``, ``read``, ``gather_all`` and uniform draws over per-env rings."""

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
            return self.gather(env, position)
        if isinstance(index, tuple) and len(index) == 3 and all(
            isinstance(i, torch.Tensor) and not i.dtype.is_floating_point for i in index
        ):
            env, start = self._as_coordinates(index[:2])
            end = self._as_coordinates((env, index[2]))[1]
            self._check_readable(env, start)
            return self.gather_chain(env, start, end)
        return self._storage[index]

    def gather_chain(
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
        if type(self).gather is not RingReads.gather:  # subclasses rebuild entries on read
            out = self.gather(env, start)
            if "next" in out.keys():
                out.set("next", self.gather(env, end).get("next"))
            for key, value in extra.items():
                out.set(key, value)
            return out
        # One gather per leaf, at the row it is read from; overridden leaves are skipped.
        root, after = self.flat_index(env, start), self.flat_index(env, end)
        shape = env.shape
        flat_batch = len(shape) == 1  # rows already have the batch shape: no reshapes
        if not flat_batch:
            root, after = root.reshape(-1), after.reshape(-1)
        columns = self._read_columns() if root.is_cpu else None
        if columns is None:
            sources, pick = self._flat, select_rows
        else:
            sources = [(key, array) for key, (array, _, _) in columns.by_key.items()]
            root, after, pick = root.numpy(), after.numpy(), take
        entries = {}
        for key, source in sources:
            if key in extra:
                continue
            value = pick(source, after if isinstance(key, tuple) and key[0] == "next" else root,
                         pinned=self._pin_outputs)
            entries[key] = value if flat_batch else value.reshape(*shape, *source.shape[1:])
        return assemble(entries, shape, self._device, extra)

    def _read_columns(self) -> Columns | None:
        """Numpy views of the flat ``[E * L, ...]`` leaf rows, or ``None`` where numpy cannot
        view one (not on the CPU, bfloat16, autograd history).

        A sample gathers a few hundred rows per leaf: numpy's ``take`` costs about half
        a torch ``index_select`` there. Built lazily and dropped by ``_index_leaves`` and
        pickling, like the step columns (:meth:`_step_columns`).
        """
        columns = self.__dict__.get("_read_columns_cache", False)
        if columns is False:
            columns = numpy_columns(self._flat, batch_dims=1) if self._storage is not None else None
            self._read_columns_cache = columns
        return columns

    def _check_readable(self, env: torch.Tensor, position: torch.Tensor) -> None:
        """Hook for :meth:`get`: subclasses refuse steps they cannot rebuild whole."""

    def gather(
        self, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None = None,
        skip: Any = (),
    ) -> TensorDictBase:
        """:meth:`get` for coordinates known to be stored (a sampler's draws; not re-checked),
        plus ``extra`` entries of the same batch shape (a sampler's info), without the stored
        leaves in ``skip`` (ones a subclass rebuilds itself). Shape contract: ``env`` and
        ``position`` of one shape ``S`` give a TensorDict of batch size ``S``."""
        flat = self.flat_index(env, position)
        shape, rows = flat.shape, flat.reshape(-1)
        columns = self._read_columns() if flat.is_cpu else None
        if columns is not None:
            entries = take_rows(columns, rows, skip, pinned=self._pin_outputs)
        else:
            entries = {key: select_rows(leaf, rows, pinned=self._pin_outputs) for key, leaf in self._flat
                       if key not in skip}
        if len(shape) != 1:  # else the rows already have the batch shape
            entries = {key: value.reshape(*shape, *value.shape[1:]) for key, value in entries.items()}
        return assemble(entries, shape, self._device, extra)

    def read(self, env_ids: torch.Tensor, positions: torch.Tensor) -> TensorDictBase:
        """Steps at absolute ``positions`` of ``env_ids`` (ALF's ``get_field``), checked.

        Raises:
            ValueError: if a position is not stored (overwritten, or not yet written).
        """
        env_ids = torch.as_tensor(env_ids, dtype=torch.long).cpu()
        positions = torch.as_tensor(positions, dtype=torch.long).cpu()
        env_ids, positions = torch.broadcast_tensors(env_ids, positions)
        self.check_env_ids(env_ids)
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
        check_int("num_earliest_ignored", num_earliest_ignored, minimum=0)
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
            return self.empty_result((self._num_envs, 0)), positions
        env = torch.arange(self._num_envs).unsqueeze(1).expand(-1, n)
        return self.get((env, torch.arange(start, start + n).expand(self._num_envs, -1))), positions

    def empty_result(self, shape: tuple[int, ...]) -> TensorDictBase:
        if self._storage is None:
            return TensorDict({}, batch_size=shape, device=self._device)
        return TensorDict(
            {key: torch.empty(*shape, *leaf.shape[1:], dtype=leaf.dtype, device=self._device)
             for key, leaf in self._flat},
            batch_size=shape,
            device=self._device,
        )

    def _rand_given_ndim(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """TorchRL's ``RandomSampler`` hook: :meth:`draw_uniform`."""
        return self.draw_uniform(batch_size)

    def draw_uniform(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform draws over the readable stored steps, as ``(env, position)``."""
        total, ends, base = self._draw_tables()
        if total == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        flat = torch.randint(total, (batch_size,), generator=_compat.generator(self)).numpy()
        env = np.searchsorted(ends, flat, side="right")
        flat += base[env]
        return torch.from_numpy(env), torch.from_numpy(flat)

    def _draw_tables(self) -> tuple[int, np.ndarray, np.ndarray]:
        """Readable steps in all, their running count per env, and what turns a flat draw into
        a position, for the counters as they are (kept until they move: a draw is then four ops)."""
        key = self._pos_np.tobytes() + self._size_np.tobytes()
        cached = self.__dict__.get("_draw_cache")
        if cached is None or cached[0] != key:
            readable = np.maximum(self._size_np - self.required_lookback, 0)
            ends = readable.cumsum()
            base = self._pos_np - self._size_np + self.required_lookback - ends + readable
            cached = self._draw_cache = (key, int(ends[-1]), ends, base)
        return cached[1:]
