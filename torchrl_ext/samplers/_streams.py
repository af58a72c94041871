"""Per-env streams as n-step sampling sees them, on the two storage layouts that keep them.

A stream is the sequence of steps one env wrote. n-step chains need four
things from a layout: uniform start draws, how many steps each start is from
its env's newest step, the flat row of ``(env, position)`` in leaves viewed
as ``[rows, ...]``, and those flat leaves. The chain table
(:mod:`~torchrl_ext.samplers._chain_table`) also needs every stored start, and
the starts whose chains can reach a written step. :class:`RingStreams` reads them off
an :class:`~torchrl_ext.storages.EnvRingStorage`; :class:`GridStreams` off a
TorchRL ``TensorStorage`` with ``ndim=2``, which stores collector batches
``[num_envs, T]`` time-major as ``[T_max, num_envs]`` (the buffer's default
``dim_extend=1``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.storages import TensorStorage

from torchrl_ext import _compat
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["GridStreams", "RingStreams", "streams_of"]


class _Streams:
    """What both layouts share: their leaves as ``[rows, ...]`` (``flat_leaves``) and written
    coordinates, whose column ``_env_column`` holds the env."""

    _env_column = 0

    def leaf(self, key: Any) -> torch.Tensor | None:
        return next((leaf for leaf_key, leaf in self.flat_leaves() if leaf_key == key), None)

    def leaves_under(self, prefix: tuple) -> list[tuple[Any, torch.Tensor]]:
        """The ``(key, leaf)`` pairs whose nested key starts with ``prefix``."""
        return [(key, leaf) for key, leaf in self.flat_leaves()
                if isinstance(key, tuple) and key[: len(prefix)] == prefix]

    def written(self, index: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """Written ``(env, position)`` as numpy int64, or ``None`` for a form writers do not report."""
        if isinstance(index, tuple) and len(index) == 2 and all(isinstance(i, torch.Tensor) for i in index):
            index = torch.stack(torch.broadcast_tensors(*index), -1)
        if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point or index.shape[-1:] != (2,):
            return None
        pairs = index.reshape(-1, 2).cpu().long().numpy()
        return pairs[:, self._env_column], pairs[:, 1 - self._env_column]


class RingStreams(_Streams):
    """Streams of an :class:`EnvRingStorage`: positions are absolute, the storage reads chains itself."""

    reads_chains = True

    def __init__(self, storage: EnvRingStorage) -> None:
        self.storage = storage

    def flat_leaves(self) -> list[tuple[Any, torch.Tensor]]:
        return self.storage.flat_leaves

    def stored(self) -> int:
        return int(self.storage.size_array.sum())

    def draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.storage.draw_uniform(batch_size)

    def steps_to_newest(self, env: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.storage.positions[env] - 1 - start

    def flat(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.storage.flat_index(env, position)

    def index(self, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> Any:
        return env, start, end

    def num_rows(self) -> int:
        return self.storage.num_envs * self.storage.max_length

    def shared(self) -> bool:
        return bool(self.storage.is_shared)

    def same_source(self, other: Any) -> bool:
        return isinstance(other, RingStreams) and other.storage is self.storage

    def all_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every stored step as ``(env, position)``, env by env."""
        pos = self.storage.position_array
        return expand_ranges(np.arange(self.storage.num_envs), pos - self.storage.size_array, pos - 1)

    def reaching(self, env: np.ndarray, position: np.ndarray, n_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored starts whose chains of ``n_step`` can read a written ``(env, position)``."""
        runs = _runs(env, position)
        if runs is not None:  # the ring writer's batches: one run of new positions per env
            run_env, first, last = runs
            earliest = self.storage.position_array[run_env] - self.storage.size_array[run_env]
            return expand_ranges(run_env, np.maximum(first - (n_step - 1), earliest), last)
        env, start = _back(env, position, n_step)
        pos = self.storage.position_array[env]
        keep = (start >= pos - self.storage.size_array[env]) & (start < pos)
        env, start = env[keep], start[keep]
        length = self.storage.max_length
        return unique_rows(env, start, env * length + start % length)


class GridStreams(_Streams):
    """Streams of a ``[T, num_envs]`` tensor storage: env ``e`` is column ``e``, time wraps at ``T``."""

    reads_chains = False
    _env_column = 1  # written coordinates are (time, env) rows

    def __init__(self, storage: TensorStorage) -> None:
        self.storage = storage
        self.source = stored = _compat.stored_data(storage)
        self.rows, self.num_envs = int(stored.shape[0]), int(stored.shape[1])
        leaves = list(stored.items(include_nested=True, leaves_only=True))
        self._leaves = [(key, leaf.reshape(-1, *leaf.shape[2:])) for key, leaf in leaves]
        # What the chain table built from these streams depends on: which tensors, where.
        self.fingerprint = tuple((key, id(leaf), leaf.data_ptr()) for key, leaf in leaves)

    def stored(self) -> int:
        return _compat.filled_rows(self.storage) * self.num_envs

    def draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = _compat.generator(self.storage)
        cell = torch.randint(self.stored(), (batch_size,), generator=rng)
        return cell % self.num_envs, cell // self.num_envs

    def steps_to_newest(self, env: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        newest = int(_compat.last_written(self.storage))
        return (newest - start) % self.rows

    def flat(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return (position % self.rows) * self.num_envs + env

    def flat_leaves(self) -> list[tuple[Any, torch.Tensor]]:
        return self._leaves

    def index(self, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> Any:
        return start, env

    def num_rows(self) -> int:
        return self.rows * self.num_envs

    def shared(self) -> bool:
        return bool(self.source.is_shared())

    def same_source(self, other: Any) -> bool:
        return (isinstance(other, GridStreams) and other.storage is self.storage and other.source is self.source
                and other.fingerprint == self.fingerprint)

    def all_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        cell = torch.arange(self.stored())
        return cell % self.num_envs, cell // self.num_envs

    def reaching(self, env: np.ndarray, position: np.ndarray, n_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        env, start = _back(env, position, n_step)
        filled = _compat.filled_rows(self.storage)
        if filled == self.rows:  # time wraps: the step before row 0 is the last row
            start = start % self.rows
        else:
            keep = (start >= 0) & (start < filled)
            env, start = env[keep], start[keep]
        return unique_rows(env, start, start * self.num_envs + env)


def unique_rows(env: np.ndarray, start: np.ndarray, flat: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(env, start)`` once per distinct flat row, as int64 tensors."""
    _, first = np.unique(flat, return_index=True)
    return torch.from_numpy(env[first]), torch.from_numpy(start[first])


def _runs(env: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(env, first, last)`` of each run of consecutive positions of one env, in index order,
    when every env has one run (as writers report a write); ``None`` otherwise."""
    if env.size == 0:
        return None
    same_run = (env[1:] == env[:-1]) & (position[1:] == position[:-1] + 1)
    first = np.concatenate(([0], np.flatnonzero(~same_run) + 1))
    run_env = env[first]
    if np.unique(run_env).size != run_env.size:
        return None
    last = np.concatenate((first[1:] - 1, [env.size - 1]))
    return run_env, position[first], position[last]


def expand_ranges(env: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``(env[i], p)`` for ``low[i] <= p <= high[i]``, as int64 tensors."""
    count = np.maximum(high - low + 1, 0)
    total = int(count.sum())
    offset = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    return torch.from_numpy(np.repeat(env, count)), torch.from_numpy(np.repeat(low, count) + offset)


def _back(env: np.ndarray, position: np.ndarray, n_step: int) -> tuple[np.ndarray, np.ndarray]:
    """Each ``(env, position)`` with the ``n_step - 1`` positions before it (candidate starts)."""
    start = (position[:, None] - np.arange(n_step)).reshape(-1)
    return np.repeat(env, n_step), start


def streams_of(sampler: Any, storage: Any) -> RingStreams | GridStreams:
    """The stream view of ``storage``, or an error saying which layouts keep env streams."""
    if isinstance(storage, EnvRingStorage):
        return RingStreams(storage)
    if isinstance(storage, TensorStorage) and storage.ndim == 2:
        _compat.attach_shared_init(storage)  # allocated by another process: attached at first use
        stored = _compat.stored_data(storage)
        if not isinstance(stored, TensorDictBase) or not storage.initialized:
            raise RuntimeError("Cannot sample from an empty storage.")
        # Built per sample (views, no copies): TorchRL adds and replaces leaves of the same
        # stored TensorDict (a key that appears later, a load), which a kept view would miss.
        return GridStreams(storage)
    raise TypeError(
        f"{type(sampler).__name__} follows env streams, which {storage_layout(storage)} does not keep: use an "
        "EnvRingStorage (EnvRingReplayBuffer) or a tensor storage with ndim=2 extended with "
        "[num_envs, T] collector batches, e.g. FastTensorStorage(max_size, ndim=2)."
    )


def storage_layout(storage: Any) -> str:
    """``"a 1-D LazyTensorStorage"`` (tensor storages), else the storage's class name, for messages."""
    return f"a {storage.ndim}-D {type(storage).__name__}" if isinstance(storage, TensorStorage) else type(storage).__name__
