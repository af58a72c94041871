"""Per-environment ring storage: ``[num_envs, max_length]``, one cursor per env.

TorchRL's multi-dimensional storages share one cursor, so every extend must
carry all environments (TorchRL issue #3194). ALF's replay buffer instead
gives each environment its own ring: env ``e`` keeps its last ``max_length``
steps, and envs can hold different amounts of data at different positions.

Steps are addressed by ``(env, position)`` (shape contract: :class:`EnvRingStorage`):
unlike its slot, a position never names two different steps, so a stale index is recognised.
Env ``e`` holds positions ``[current_pos[e] - current_size[e], current_pos[e] - 1]``.
The storage only holds data and these two counters;
:class:`~torchrl_ext.writers.EnvRingWriter` decides which positions a batch goes
to and :class:`~torchrl_ext.samplers.TrajectorySampler` picks windows.
"""
from __future__ import annotations

import functools
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, unravel_key
from torchrl.data import TensorDictReplayBuffer as _TorchRLTensorDictReplayBuffer
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
from torchrl.data.replay_buffers.storages import Storage

from torchrl_ext import _compat
from torchrl_ext._checks import check_device, check_indices, check_int, makes_kept_tensors, read_only
from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.io.state_files import (
    StateFilesCheckpointer,
    tensordict_from_state,
    tensordict_state,
)
from torchrl_ext.storages._numpy_rows import matching_arrays
from torchrl_ext.storages._output_memory import PinnedOutputs
from torchrl_ext.storages._ring_data import RingData

__all__ = ["EnvRingStorage", "EnvRingStorageCheckpointer"]


@functools.cache
def _write_at_copies_rows(cls: type) -> bool:
    """Whether ``cls.write_at`` only copies rows: the class defining the ``write_at`` in use
    must say so itself (a subclass that overrides it does more, e.g. an episode index)."""
    owner = next(klass for klass in cls.__mro__ if "write_at" in vars(klass))
    return vars(owner).get("write_at_copies_rows", False)


def _numpy_view(attr: str, doc: str) -> property:
    """A property giving a read-only view of the numpy counter ``self._rings.<attr>``."""
    def get(self: EnvRingStorage) -> np.ndarray:
        view = getattr(self._rings, attr).view()
        view.flags.writeable = False
        return view

    return property(get, doc=doc)


class EnvRingStorageCheckpointer(StateFilesCheckpointer):
    """Saves an :class:`EnvRingStorage` as safetensors + JSON (no pickle, atomic files)."""

    state_files = ("ring_storage.safetensors", "ring_storage.json")


class EnvRingStorage(PinnedOutputs, Storage):
    """One ring of ``max_length`` steps per environment, TensorDict leaves ``[E, L, ...]``.

    The leaves are allocated from the first write (any nested keys), on
    ``device``. Later writes must carry the same keys, per-step shapes and
    dtypes; a mismatch raises ``ValueError`` before anything is written. Steps are
    stored detached from autograd, as ALF's rings store them (TorchRL's storages keep
    a written tensor's graph).

    ``time_major`` chooses the memory layout behind the ``[E, L, ...]`` leaves:
    time-major keeps slot ``s`` of every env as one contiguous block (the leaves are
    transposed views of it), env-major keeps each env's ring contiguous. Envs stepped
    together write one block per leaf time-major instead of rows a ring apart;
    consecutive steps of one env are adjacent env-major (windows and frame stacks
    read neighbouring rows). ``benchmarks/bench_ring.py`` measures both. Checkpoints
    store the leaves env-major either way and load into either layout.

    Args:
        num_envs: number of environments ``E``.
        max_length: steps kept per environment ``L``.

    Keyword Args:
        device: where the data lives. The counters stay on the CPU, where the
            bookkeeping is cheapest.
        checkpointer: defaults to :class:`EnvRingStorageCheckpointer`.
        time_major: memory layout (above); ``None`` takes the class default,
            :attr:`default_time_major` (``True`` here, ``False`` for the frame-stacking
            :class:`~torchrl_ext.storages.DedupEnvRingStorage`).

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
    #: :meth:`write_at` only copies rows (the every-env step write may then stand in for it);
    #: a subclass that overrides ``write_at`` gets the general path unless it sets this too.
    write_at_copies_rows = True
    ndim = 2
    returns_tensordicts = True  # reads give one TensorDict: no collate function needed
    #: Oldest stored steps of each env that cannot be read whole (a frame-stacking
    #: storage needs the ``num_stack - 1`` steps before a step); samplers skip them.
    required_lookback = 0
    #: Default memory layout: time-major suits writes of every env at once (ALF's add_batch).
    default_time_major = True

    def __init__(
        self,
        num_envs: int,
        max_length: int,
        *,
        device: torch.device | str = "cpu",
        checkpointer: StorageCheckpointerBase | None = None,
        time_major: bool | None = None,
    ) -> None:
        for name, value in (("num_envs", num_envs), ("max_length", max_length)):
            check_int(name, value, minimum=1)
        if time_major is not None and not isinstance(time_major, bool):
            raise TypeError(
                f"time_major must be a bool (or None for the class default), got "
                f"time_major={time_major!r}."
            )
        super().__init__(num_envs * max_length, checkpointer=checkpointer)
        self._rings = RingData(
            num_envs, max_length, check_device("device", device),
            self.default_time_major if time_major is None else time_major,
        )

    # ------------------------------------------------------------------
    num_envs = read_only("_rings.num_envs", "Number of environments ``E``.")
    max_length = read_only("_rings.max_length", "Steps kept per environment ``L``.")
    device = read_only("_rings.device", "Where the data lives (the counters stay on the CPU).")

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.num_envs, self.max_length])

    @property
    def initialized(self) -> bool:
        return self._rings.data is not None

    @property
    def time_major(self) -> bool:
        """Memory layout of the stored leaves, fixed at construction (readers and writers
        address memory through it, so it cannot change under stored data)."""
        return self._rings.time_major

    @time_major.setter
    def time_major(self, value: Any) -> None:
        raise AttributeError(
            f"time_major is fixed when the storage is built (got time_major={value!r}); build a "
            f"new {type(self).__name__}(..., time_major={value!r}) and write the data into it."
        )

    @property
    def current_pos(self) -> torch.Tensor:
        """Position the next step of each env gets, int64 ``[E]`` (a copy)."""
        return self._rings.pos.clone()

    @property
    def current_size(self) -> torch.Tensor:
        """Steps stored per env, int64 ``[E]`` (a copy)."""
        return self._rings.size.clone()

    # The storage contract samplers and writers read: live views, no copies. They change as
    # the storage is written; the torch ones share the numpy ones' memory, so never write them.
    positions = read_only("_rings.pos", "Live view of each env's next position, int64 ``[E]`` (read only).")
    sizes = read_only("_rings.size", "Live view of the steps stored per env, int64 ``[E]`` (read only).")
    position_array = _numpy_view(
        "pos_np", ":attr:`positions` as a read-only numpy array (cheapest for per-write bookkeeping)."
    )
    size_array = _numpy_view("size_np", ":attr:`sizes` as a read-only numpy array.")
    resets = read_only(
        "_rings.resets",
        """Live count of the clears of each env, int64 ``[E]`` (read only): a sampler that keeps
        per-position state sees a clear even after the env was written past its old position.""",
    )
    load_count = read_only(
        "_rings.loads",
        """Checkpoints loaded into this storage: what a sampler derived from the counters before
        a load is void after it.""",
    )
    flat_leaves = read_only(
        "_rings.flat",
        """``(key, rows)`` for every stored leaf, its memory viewed as ``[E * L, ...]`` rows
        (row of ``(env, position)``: :meth:`flat_index`); empty before the first write.""",
    )

    def flat_leaf(self, key: Any) -> torch.Tensor | None:
        """The stored leaf ``key``'s memory as ``[E * L, ...]`` rows, or ``None``."""
        return next((leaf for leaf_key, leaf in self._rings.flat if leaf_key == key), None)

    def stores_leaf(self, key: Any) -> bool:
        """Whether the nested key ``key`` names a stored leaf."""
        layout = self._rings.layout
        # A string key is its own unravelled form (unravel_key costs far more than a lookup).
        return layout is not None and (key if type(key) is str else unravel_key(key)) in layout

    def flat_index(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Row of ``(env, position)`` in the leaf rows (:attr:`flat_leaves`): ``slot * E + env``
        time-major, ``env * L + slot`` env-major."""
        return self._rings.flat_index(env, position)

    def earliest_position(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Oldest stored position of each env in ``env_ids`` (all envs by default)."""
        earliest = self._rings.pos - self._rings.size
        return earliest if env_ids is None else earliest[env_ids]

    def contains(self, item: Any) -> bool:
        """Whether ``(env, position)`` (ints) is stored."""
        env, position = item
        pos, size = int(self._rings.pos[env]), int(self._rings.size[env])
        return pos - size <= position < pos

    def __len__(self) -> int:
        return int(self._rings.size.sum())

    _is_full = read_only("_rings.is_full", "Whether every env's ring is full (TorchRL's hook).")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, max_length={self.max_length}, "
            f"stored={len(self)}, device={self.device})"
        )

    def attach(self, buffer: Any) -> None:
        """Refuses buffers that would hand the rings transposed or mis-indexed batches."""
        ring_buffer = getattr(buffer, "_drives_env_rings", False)
        dim_extend = _compat.requested_dim_extend(buffer)
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
        self.write_at(env, position, data, set_cursor=set_cursor)

    @torch.no_grad()  # stored steps leave the writer's autograd graph, as ALF's rings do
    def write_at(
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
        flat = self._rings.write(env, position, data, type(self).__name__)
        if set_cursor:
            # TorchRL's shared last-cursor index describes a 1-D ring and has no
            # meaning for per-env rings: the rows are kept under their own name.
            self._rings.last_rows = flat
        _compat.bump_mutation_revision(self)

    def write_step(self, data: TensorDictBase, skip_key: Any = None) -> int | None:
        """Writes the ``[num_envs]`` batch ``data`` (row ``e`` is env ``e``) as the next step
        of every env and moves the counters, when every env stands at the same position;
        ``skip_key`` names an entry that is not stored (the writer's env ids).

        A fast path (:mod:`torchrl_ext._fastpath`): one copy per leaf into one slot, on numpy
        views, as for an ALF ``add_batch`` of small steps the calls cost more than the bytes.

        Returns:
            The position written, or ``None``, with nothing written or moved, where this path
            does not apply; the caller then takes :meth:`write_at`.
        """
        if not (fastpath_enabled() and _write_at_copies_rows(type(self))):
            return None
        rings = self._rings
        columns = rings.step_columns()
        position = rings.common_position()
        if columns is None or position is None:
            return None
        pairs = matching_arrays(data, columns, rings.num_envs, skip_key)
        if pairs is None:
            return None
        slot = position % rings.max_length
        for stored, array in pairs:
            stored[slot] = array
        rings.last_rows = slot  # expanded to flat rows when read (last_written_rows)
        rings.pos_np.fill(position + 1)  # every env stood at position: a fill, not += 1
        rings.grow_every_size(1)
        _compat.bump_mutation_revision(self)
        return position

    @property
    def last_written_rows(self) -> torch.Tensor | None:
        """Flat rows (see :meth:`flat_index`) of the last write, ``None`` before one. A step
        write records only its slot; the rows are built when read."""
        rows = self._rings.last_rows
        if isinstance(rows, int):
            rows = self._rings.last_rows = self.flat_index(torch.arange(self.num_envs), torch.tensor(rows))
        return rows

    def advance(self, env_ids: torch.Tensor | None, steps: int) -> None:
        """Moves the cursors of ``env_ids`` (distinct; ``None``: every env) on by ``steps`` written steps."""
        self._rings.advance(None if env_ids is None else check_indices("env_ids", env_ids, "env ids"), steps)

    def shrink(self, env_ids: torch.Tensor, n: torch.Tensor | int) -> None:
        """Forgets the ``n`` oldest steps of each env in ``env_ids`` (at most what it holds)."""
        env_ids = check_indices("env_ids", env_ids, "env ids").cpu()
        self.check_env_ids(env_ids)
        size = self._rings.size[env_ids]
        self._rings.size[env_ids] = size - torch.minimum(torch.as_tensor(n), size)
        _compat.bump_mutation_revision(self)

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Sets the position and size of ``env_ids`` (all envs by default) to 0."""
        if env_ids is None:
            env_ids = slice(None)
        else:
            env_ids = check_indices("env_ids", env_ids, "env ids").cpu()
            self.check_env_ids(env_ids)
        self._rings.pos[env_ids] = 0
        self._rings.size[env_ids] = 0
        self._rings.resets[env_ids] += 1
        _compat.bump_mutation_revision(self)

    def _empty(self) -> None:
        self.reset()

    # ------------------------------------------------------------------
    # Reads
    def get(self, index: Any) -> TensorDictBase:
        """Steps at ``index``: an ``(env, position)`` pair of integer tensors of one shape.

        An ``(env, start, end)`` triple gives n-step transitions: root entries
        from ``start``, ``"next"`` entries from ``end``.

        Other indices (an int env, slices, ...) index the ``[E, L]`` TensorDict.
        """
        if self._rings.data is None:
            raise RuntimeError(f"{type(self).__name__} is empty: write data before reading it.")
        if isinstance(index, tuple) and len(index) in (2, 3) and all(isinstance(i, torch.Tensor) for i in index):
            # Float or bool coordinates are refused there (TypeError), not cast.
            env, start = self._as_coordinates(index[:2])
            self._check_readable(env, start)
            if len(index) == 2:
                return self.gather(env, start)
            return self.gather_chain(env, start, self._as_coordinates((env, index[2]))[1])
        return self._rings.data[index]

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
        return self._rings.gather(env, position, extra, skip, self._pin_outputs)

    def gather_chain(
        self, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
        extra: dict[Any, torch.Tensor] | None = None,
    ) -> TensorDictBase:
        """Root entries at ``(env, start)`` and ``"next"`` entries at ``(env, end)``: the
        transition from ``start`` to the observation after ``end`` (n-step sampling).
        ``extra`` entries (the sampler's n-step reward, ...) replace stored ones."""
        extra = extra or {}
        if type(self).gather is EnvRingStorage.gather:
            return self._rings.gather(env, start, extra, (), self._pin_outputs, next_position=end)
        out = self.gather(env, start)  # subclasses rebuild entries on read
        if "next" in out.keys():
            out.set("next", self.gather(env, end).get("next"))
        for key, value in extra.items():
            out.set(key, value)
        return out

    def read(self, env_ids: torch.Tensor, positions: torch.Tensor) -> TensorDictBase:
        """Steps at absolute ``positions`` of ``env_ids`` (ALF's ``get_field``), checked.

        Raises:
            ValueError: if a position is not stored (overwritten, or not yet written).
        """
        return self.get(self._stored_coordinates(env_ids, positions))

    def _stored_coordinates(self, env_ids: Any, positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``env_ids`` and ``positions`` as broadcast CPU int64 tensors; ``ValueError`` unless
        every ``(env, position)`` is stored; ``TypeError`` for non-integer ones."""
        env = check_indices("env_ids", env_ids, "env ids").cpu()
        position = check_indices("positions", positions, "positions").cpu()
        env, position = _broadcast(("env_ids", env), ("positions", position))
        self.check_env_ids(env)
        self._rings.check_stored(env, position)
        return env, position

    def gather_all(self, num_earliest_ignored: int = 0) -> tuple[TensorDictBase, torch.Tensor]:
        """Everything stored, chronologically, as ``[E, n]`` plus the start positions ``[E]``.

        Every env must hold the same number of steps at the same positions.
        An empty buffer gives ``n = 0`` (ALF returns ``L`` stale steps there).

        Args:
            num_earliest_ignored: leave out that many oldest steps of each env.
        """
        check_int("num_earliest_ignored", num_earliest_ignored, minimum=0)
        pos, size = self._rings.pos, self._rings.size
        if not (bool((pos == pos[0]).all()) and bool((size == size[0]).all())):
            raise ValueError(
                "gather_all needs every env at the same position with the same size, got "
                f"current_pos={pos.tolist()}, current_size={size.tolist()}; sample windows "
                "instead, or write all envs together."
            )
        n = max(int(size[0]) - num_earliest_ignored, 0)
        start = int(pos[0]) - n
        positions = torch.full((self.num_envs,), start, dtype=torch.long)
        if self._rings.data is None or n == 0:
            return self.empty_result((self.num_envs, 0)), positions
        env = torch.arange(self.num_envs).unsqueeze(1).expand(-1, n)
        return self.get((env, torch.arange(start, start + n).expand(self.num_envs, -1))), positions

    def empty_result(self, shape: tuple[int, ...]) -> TensorDictBase:
        """An unfilled TensorDict of batch size ``shape`` laid out like the stored steps."""
        return self._rings.empty_result(shape)

    def draw_uniform(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform draws over the readable stored steps, as ``(env, position)``."""
        return self._rings.draw_uniform(batch_size, self.required_lookback, _compat.generator(self))

    _rand_given_ndim = draw_uniform  # TorchRL's RandomSampler hook: the same draws

    # ------------------------------------------------------------------
    # Checkpoints and sharing
    def state_dict(self) -> dict[str, Any]:
        rings = self._rings
        return {
            "num_envs": self.num_envs,
            "max_length": self.max_length,
            "data": tensordict_state(rings.data),
            "counters": [rings.pos.clone(), rings.size.clone(), rings.resets.clone()],
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name in ("num_envs", "max_length"):
            if state_dict[name] != getattr(self, name):
                raise ValueError(
                    f"the checkpoint has {name}={state_dict[name]} but this storage has "
                    f"{name}={getattr(self, name)}; build it with the same geometry."
                )
        self._rings.load(tensordict_from_state(state_dict["data"], self.device), state_dict["counters"])
        _compat.bump_mutation_revision(self)

    is_shared = read_only(
        "_rings.shared", "Whether :meth:`share_memory_` put the data and the counters in shared memory."
    )

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
        self._rings.share_memory_(example, type(self).__name__)
        for value in vars(self).values():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                value.share_memory_()  # per-env state of subclasses, e.g. the episode index
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
        return super().__getstate__()

    # ------------------------------------------------------------------
    def _as_coordinates(self, cursor: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(cursor, tuple) and len(cursor) == 2):
            raise TypeError(
                f"{type(self).__name__} is addressed by (env, position) pairs of integer "
                f"tensors, got {type(cursor).__name__}."
            )
        env = check_indices("index[0]", cursor[0], "env ids")
        position = check_indices("index[1]", cursor[1], "positions")
        env, position = _broadcast(("index[0]", env), ("index[1]", position))
        if env.numel():
            self.check_env_ids(env)
            if int(position.min()) < 0:
                raise ValueError(
                    f"positions must be >= 0, got {int(position.min())}; positions count "
                    "the steps written to an env."
                )
        return env, position

    def check_env_ids(self, env_ids: torch.Tensor) -> None:
        """Raises ``ValueError`` unless every id in ``env_ids`` names an env."""
        if env_ids.numel() and (int(env_ids.min()) < 0 or int(env_ids.max()) >= self.num_envs):
            raise ValueError(
                f"env_ids must lie in [0, {self.num_envs - 1}], got values in "
                f"[{int(env_ids.min())}, {int(env_ids.max())}]."
            )


def _broadcast(env: tuple[str, torch.Tensor], position: tuple[str, torch.Tensor]) -> list[torch.Tensor]:
    """The ``(name, tensor)`` env ids and positions broadcast together, or a ``ValueError``
    naming both (``torch.broadcast_tensors`` would raise a bare ``RuntimeError``)."""
    try:
        return torch.broadcast_tensors(env[1], position[1])
    except RuntimeError:
        raise ValueError(
            f"{env[0]} of shape {tuple(env[1].shape)} and {position[0]} of shape {tuple(position[1].shape)} "
            "do not broadcast together; pass one position per env id (or a single one)."
        ) from None
