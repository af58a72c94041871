"""Writer for :class:`~torchrl_ext.storages.EnvRingStorage`: each step goes to its env's ring.

The oldest steps of a full ring are overwritten. Blocking until there is room is done by
:class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer`, which waits on
this writer's condition *outside* the buffer lock, so a waiting producer
never stalls samplers, ``dequeue`` or ``clear`` (ALF holds its lock while it
waits: bug Q17).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.writers import Writer

from torchrl_ext import _compat
from torchrl_ext._checks import check_indices, check_int
from torchrl_ext._keys import nested_key
from torchrl_ext.io.state_files import apply_state, atomic_write, load_json
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["EnvRingWriter"]

_METADATA = "ring_writer.json"


class EnvRingWriter(Writer):
    """Routes each env's steps to the next slots of its own ring.

    Keyword Args:
        env_id_key: key of the int env ids in written batches (removed from
            what is stored). A batch without it must hold every env, in order.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages import EnvRingStorage
        >>> from torchrl_ext.writers import EnvRingWriter
        >>> storage = EnvRingStorage(num_envs=3, max_length=4)
        >>> writer = EnvRingWriter()
        >>> writer.register_storage(storage)
        >>> step = TensorDict({"obs": torch.ones(2, 5), "env_id": torch.tensor([2, 0])}, [2])
        >>> writer.extend(step).tolist()  # [env, position] per written step
        [[2, 0], [0, 0]]
        >>> storage.current_size.tolist()
        [1, 0, 1]
    """

    def __init__(self, *, env_id_key: Any = "env_id") -> None:
        super().__init__()
        self.env_id_key = nested_key(env_id_key, "env_id_key")
        self._write_count = 0
        # Notified whenever room may have been made or stop() was called.
        self._room = threading.Condition()
        self._stopped = False

    @property
    def storage(self) -> EnvRingStorage:
        storage = _compat.writer_storage(self)
        if not isinstance(storage, EnvRingStorage):
            raise RuntimeError(
                f"{type(self).__name__} writes into an EnvRingStorage; register one with "
                "register_storage() or build the buffer with storage=EnvRingStorage(...)."
            )
        return storage

    # ------------------------------------------------------------------
    def add(self, data: TensorDictBase) -> torch.Tensor:
        """Writes one step (batch size ``[]``, with its env id); returns ``[1, 2]`` coordinates."""
        return self.extend(data.unsqueeze(0))

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Writes ``[N]`` or ``[N, T]`` steps; returns their ``[N * T, 2]`` ``(env, position)`` coordinates."""
        return self.write(data)

    def write(self, data: TensorDictBase, env_ids: Any = None) -> torch.Tensor:
        """:meth:`extend` with the env ids given apart (then ``data`` needs no env id entry)."""
        storage = self.storage
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__} writes TensorDicts, got {type(data).__name__}."
            )
        if data.batch_size.numel() == 0:  # no step: nothing to write (the ids are still checked)
            if env_ids is not None:
                self.check_row_env_ids(env_ids, data)
            return torch.empty(0, 2, dtype=torch.long)
        index = self._write_every_env(storage, data, env_ids)
        if index is None:
            index = self._write_rows(storage, data, env_ids)
        self._write_count += index.shape[0]
        for entity in _compat.attached_entities(storage):
            entity.mark_update(index)
        return index

    def _env_ids_of(self, data: TensorDictBase, env_ids: Any) -> tuple[torch.Tensor, TensorDictBase]:
        """The checked env ids ``[N]`` of a write of the ``[N]`` or ``[N, T]`` batch ``data``
        (``env_ids``, or else the batch's own entry), and the batch without that entry."""
        if env_ids is None:
            _check_batch_dims(data)
            return self.split_env_ids(data)
        env_ids = self.check_row_env_ids(env_ids, data)
        if self.env_id_key in data.keys(include_nested=isinstance(self.env_id_key, tuple)):
            data = data.exclude(self.env_id_key)
        return env_ids, data

    def _write_rows(self, storage: EnvRingStorage, data: TensorDictBase, env_ids: Any) -> torch.Tensor:
        """The general write: ``[N]`` or ``[N, T]`` steps of any distinct envs, checked."""
        env_ids, data = self._env_ids_of(data, env_ids)
        steps = 1 if data.batch_dims == 1 else data.shape[1]
        self._check_fits(steps)
        pos = storage.position_array[env_ids.numpy()]
        if data.batch_dims == 1:
            env, position = env_ids, torch.from_numpy(pos)
        else:
            env = env_ids.unsqueeze(1).expand(-1, steps)
            position = torch.from_numpy(pos[:, None] + np.arange(steps))
        storage.write_at(env, position, data, set_cursor=True)
        storage.advance(env_ids, steps)
        return torch.stack([env.reshape(-1), position.reshape(-1)], -1)

    def _write_every_env(self, storage: EnvRingStorage, data: TensorDictBase, env_ids: Any) -> torch.Tensor | None:
        """One step of every env in env order while all envs stand at one position.

        Envs stepped together (ALF's usual ``add_batch``) write one slot, a block per leaf:
        the storage copies each leaf once, and the returned coordinates come from a kept
        ``[num_envs, 2]`` template, as building them per step costs about as much as the
        step's copies. ``None``, with nothing written, for any other batch: :meth:`write`
        then takes the general path, which also raises the errors of a bad batch.
        """
        num_envs = storage.num_envs
        batch_size = data.batch_size
        if len(batch_size) != 1 or batch_size[0] != num_envs:
            return None
        skip_key = None
        if env_ids is None:
            env_ids = data.get(self.env_id_key, None)
            skip_key = None if env_ids is None else self.env_id_key
        cached = self.__dict__.get("_every_env_cache")
        if cached is None or cached[0].numel() != num_envs:
            every_env = torch.arange(num_envs)
            template = np.stack([every_env.numpy(), np.zeros(num_envs, np.int64)], 1)  # (env, position 0)
            cached = self._every_env_cache = (every_env, template)
        every_env, index_template = cached
        if env_ids is not None and not (
            isinstance(env_ids, torch.Tensor)
            and env_ids.dtype is torch.int64
            and env_ids.is_cpu
            and torch.equal(env_ids, every_env)  # torch.equal also compares the shapes
        ):
            return None
        position = storage.write_step(data, skip_key)
        if position is None:
            return None
        index = index_template.copy()
        index[:, 1] = position
        return torch.from_numpy(index)

    def split_env_ids(self, data: TensorDictBase) -> tuple[torch.Tensor, TensorDictBase]:
        """Checked env ids ``[N]`` of a batch, and the batch without them."""
        num_envs = self.storage.num_envs
        env_ids = data.get(self.env_id_key, None)
        if env_ids is None:
            if data.shape[0] != num_envs:
                raise ValueError(
                    f"data has no {self.env_id_key!r} entry and {data.shape[0]} rows, but the "
                    f"storage has num_envs={num_envs}; give data[{self.env_id_key!r}] (the env "
                    "of each row), or write all envs in order."
                )
            return torch.arange(num_envs), data
        data = data.exclude(self.env_id_key)
        name = f"data[{self.env_id_key!r}]"
        env_ids = check_indices(name, env_ids, "env ids")
        if env_ids.ndim > 1:
            # [N, T] batches repeat the env id along time: one id per row.
            if env_ids.shape[1] == 0:
                raise ValueError(
                    f"{name} has no steps (batch size {list(data.batch_size)}), so no env ids; "
                    "pass env_ids= with the batch, or leave out empty batches."
                )
            if bool((env_ids != env_ids[:, :1]).any()):
                raise ValueError(
                    f"data[{self.env_id_key!r}] changes along time; a [N, T] batch must hold "
                    "T steps of one env per row."
                )
            env_ids = env_ids[:, 0]
        return self.check_env_ids(env_ids, name), data

    def check_row_env_ids(self, env_ids: Any, data: TensorDictBase) -> torch.Tensor:
        """The ``env_ids=`` of a write of ``data`` (``[N]`` or ``[N, T]``), checked as
        :meth:`check_env_ids` plus one id per row: an int for one row, or ``N`` ids in 1-D.
        Every write path checks them here, before anything changes."""
        _check_batch_dims(data)
        ids = check_indices("env_ids", env_ids, "env ids")
        if ids.ndim > 1:
            raise ValueError(
                f"env_ids must be an int or a 1-D sequence of env ids (one per row of data), "
                f"got shape {list(ids.shape)}; pass env_ids.reshape(-1) if each row has one."
            )
        ids = self.check_env_ids(ids)
        if ids.numel() != data.shape[0]:
            raise ValueError(
                f"env_ids has {ids.numel()} entries but data has {data.shape[0]} rows; "
                "give one env id per row."
            )
        return ids

    def check_env_ids(self, env_ids: Any, name: str = "env_ids") -> torch.Tensor:
        """``env_ids`` (given as ``name``) as a CPU int64 tensor, checked: integers (``TypeError``
        otherwise), in range and distinct."""
        num_envs = self.storage.num_envs
        env_ids = check_indices(name, env_ids, "env ids").reshape(-1).cpu()
        ids = env_ids.tolist()
        if ids and (min(ids) < 0 or max(ids) >= num_envs):
            bad = min(ids) if min(ids) < 0 else max(ids)
            raise ValueError(
                f"env id {bad} is out of range; env ids must lie in [0, {num_envs - 1}]."
            )
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(
                f"env ids must be distinct within one write, got {repeated} more than once; "
                "write repeated envs in separate calls (or as [N, T] steps)."
            )
        return env_ids

    # ------------------------------------------------------------------
    # Removing data, and waiting for room
    def dequeue(self, n: int = 1, env_ids: Any = None) -> TensorDictBase:
        """Removes and returns the ``n`` oldest steps of each env, as ``[len(env_ids), n]``.

        Raises:
            ValueError: if an env holds fewer than ``n`` steps (nothing is removed).
        """
        storage = self.storage
        env_ids = torch.arange(storage.num_envs) if env_ids is None else self.check_env_ids(env_ids)
        check_int("n", n, minimum=1)
        if env_ids.numel() == 0:
            return storage.empty_result((0, n))
        size = storage.sizes[env_ids]
        if int(size.min()) < n:
            raise ValueError(
                f"cannot dequeue n={n} steps: env {int(env_ids[size.argmin()])} holds only "
                f"{int(size.min())}; dequeue fewer, or wait for more data."
            )
        earliest = storage.earliest_position(env_ids)
        positions = earliest.unsqueeze(1) + torch.arange(n)
        out = storage.get((env_ids.unsqueeze(1).expand(-1, n), positions))
        storage.shrink(env_ids, n)
        self.notify_room()
        return out

    def remove_up_to(self, n: int, env_ids: Any = None) -> None:
        """Forgets up to ``n`` oldest steps of each env in ``env_ids`` (any subset)."""
        storage = self.storage
        env_ids = torch.arange(storage.num_envs) if env_ids is None else self.check_env_ids(env_ids)
        check_int("n", n, minimum=0)
        storage.shrink(env_ids, n)
        self.notify_room()

    def clear(self, env_ids: Any = None) -> None:
        """Empties ``env_ids`` (all envs by default): position and size back to 0."""
        storage = self.storage
        storage.reset(None if env_ids is None else self.check_env_ids(env_ids))
        self.notify_room()

    def has_room(self, env_ids: torch.Tensor, steps: int = 1) -> bool:
        """Whether every env in ``env_ids`` can take ``steps`` steps without overwriting."""
        storage = self.storage
        free = storage.max_length - storage.sizes[env_ids]
        return bool((free >= steps).all())

    def _check_fits(self, steps: int) -> None:
        """Refuses more steps per env than a ring holds (a blocking write of them would wait forever)."""
        max_length = self.storage.max_length
        if steps > max_length:
            raise ValueError(
                f"data holds {steps} steps per env but each ring keeps max_length="
                f"{max_length}; write at most max_length steps at a time."
            )

    def wait_for_room(self, env_ids: torch.Tensor, steps: int = 1, timeout: float | None = None) -> bool:
        """Blocks until :meth:`has_room`; ``False`` if :meth:`stop` was called or time ran out.

        Raises:
            ValueError: ``steps > max_length``: no ring can ever make that much room.
        """
        self._check_fits(steps)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while not self._stopped and not self.has_room(env_ids, steps):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._room.wait(remaining)
            return not self._stopped

    def notify_room(self) -> None:
        with self._room:
            self._room.notify_all()

    def stop(self) -> None:
        """Wakes every waiting writer; they return without writing until :meth:`revive`."""
        with self._room:
            self._stopped = True
            self._room.notify_all()

    def revive(self) -> None:
        with self._room:
            self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    # ------------------------------------------------------------------
    def _empty(self, empty_write_count: bool = True) -> None:
        if empty_write_count:
            self._write_count = 0
        self.notify_room()

    def state_dict(self) -> dict[str, Any]:
        return {"write_count": self._write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._write_count = int(state_dict["write_count"])

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.state_dict())
        atomic_write(path / _METADATA, lambda tmp: Path(tmp).write_text(text))

    def loads(self, path: str | Path) -> None:
        source = Path(path) / _METADATA
        apply_state(self, load_json(source), source)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_room", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._room = threading.Condition()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_id_key={self.env_id_key!r}, write_count={self._write_count})"


def _check_batch_dims(data: TensorDictBase) -> None:
    """``ValueError`` unless ``data`` is a ``[N]`` or ``[N, T]`` batch."""
    if data.batch_dims not in (1, 2):
        raise ValueError(
            f"data must have batch size [N] (one step per env) or [N, T] (T steps per "
            f"env), got {list(data.batch_size)}. With a TorchRL ReplayBuffer pass "
            "dim_extend=0, or use torchrl_ext.replay_buffers.EnvRingReplayBuffer."
        )
