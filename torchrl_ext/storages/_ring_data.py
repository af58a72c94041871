"""What an :class:`~torchrl_ext.storages.EnvRingStorage` holds and reads: :class:`RingData`."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_ext._checks import makes_kept_tensors
from torchrl_ext.storages._numpy_rows import Columns, leaf_items, numpy_columns
from torchrl_ext.storages._gathers import NO_ITEM_SHAPES, ItemShapes, assemble, item_batch_shapes, select_rows, take
from torchrl_ext.storages._layouts import _check_common_keys, _layout, _raise_key_mismatch, _refuse_non_tensors

__all__ = ["Leaves", "RingData"]


class Leaves(NamedTuple):
    """The ``[E, L]`` leaves (``None`` before the first write) and what is derived from them."""

    data: TensorDictBase | None
    flat: list[tuple[Any, torch.Tensor]]  # (key, memory as [E*L, ...] rows)
    layout: dict | None
    item_shapes: ItemShapes  # batch dims a stored step keeps (reads restore them)


class RingData:
    """Leaves ``[E, L, ...]`` (``None`` before the first write) and counters ``[E]`` of the
    rings, with the caches derived from them and the reads by ``(env, position)``.

    ``time_major`` keeps slot ``s`` of every env as one contiguous block (the leaves are
    transposed views of ``[L, E, ...]`` memory); otherwise each env's ring is contiguous.
    The counters are numpy arrays (``pos_np``, ``size_np``: the per-write bookkeeping of a
    few dozen envs runs there) with torch views on the same memory (``pos``, ``size``).
    """

    @makes_kept_tensors  # the counters, updated in place later, maybe outside inference_mode
    def __init__(self, num_envs: int, max_length: int, device: torch.device, time_major: bool) -> None:
        self.num_envs, self.max_length, self.device, self.time_major = num_envs, max_length, device, time_major
        self.data: TensorDictBase | None = None
        self.pos_np = np.zeros(num_envs, dtype=np.int64)
        self.size_np = np.zeros(num_envs, dtype=np.int64)
        self.resets = torch.zeros(num_envs, dtype=torch.long)  # clears per env
        self.loads = 0  # checkpoint loads: what samplers derived from the counters is void
        self.last_rows: torch.Tensor | int | None = None  # flat rows, or the slot of a step write
        self.shared = False
        self._views()
        self.index_leaves()

    def _views(self) -> None:
        """Torch views on the numpy counters, or numpy views on shared torch counters."""
        if self.shared:
            self.pos_np, self.size_np = self.pos.numpy(), self.size.numpy()
        else:
            self.pos, self.size = torch.from_numpy(self.pos_np), torch.from_numpy(self.size_np)
        self.full_bytes = np.full(self.num_envs, self.max_length, dtype=np.int64).tobytes()

    # ------------------------------------------------------------------
    # Leaves
    def allocate(self, data: TensorDictBase, batch_dims: int) -> None:
        """Zeroed leaves for steps laid out like ``data``'s (batch ``[N]`` or ``[N, T]``)."""
        self.index_leaves(self.allocated(data, batch_dims))

    @makes_kept_tensors  # normal tensors even at a first write inside torch.inference_mode()
    def allocated(self, data: TensorDictBase, batch_dims: int) -> Leaves:
        """:meth:`allocate`'s leaves and views, built without touching ``self``: a first write
        commits them only once its rows are copied, so one that fails leaves nothing allocated."""
        shape = (self.num_envs, self.max_length)
        memory_shape = shape[::-1] if self.time_major else shape
        leaves = TensorDict(
            {
                key: self.as_leaf(torch.zeros(
                    memory_shape + tuple(leaf.shape[batch_dims:]), dtype=leaf.dtype, device=self.device
                ))
                for key, leaf in leaf_items(data)
            },
            batch_size=shape,
            device=self.device,
        )
        for key, item_shape in item_batch_shapes(data, batch_dims)[1]:  # ("agents", ...) of [N, A]
            leaves.get(key).batch_size = shape + item_shape
        return self.indexed(leaves)

    def as_leaf(self, memory: torch.Tensor) -> torch.Tensor:
        """The ``[E, L, ...]`` leaf over a layout's memory (``[L, E, ...]`` when time-major), or
        the memory under a leaf: the same transpose both ways."""
        return memory.transpose(0, 1) if self.time_major else memory

    def indexed(self, data: TensorDictBase) -> Leaves:
        """``data`` (``[E, L]`` leaves) with its flat views, layout and item shapes; a leaf not
        laid out as this ring's memory (a checkpoint, a pickle) is replaced by a copy that is."""
        flat = []
        for key, leaf in leaf_items(data):
            memory = self.as_leaf(leaf)
            if not memory.is_contiguous():
                memory = memory.contiguous()
                data.set(key, self.as_leaf(memory))
            # Sizes spelled out: ``view(-1, ...)`` cannot infer the row count of a leaf with
            # no elements (an item dim of size 0).
            flat.append((key, memory.view(memory.shape[0] * memory.shape[1], *memory.shape[2:])))
        return Leaves(data, flat, _layout(data, 2), item_batch_shapes(data, 2))

    def index_leaves(self, leaves: Leaves | None = None) -> None:
        """Sets the leaves with their flat views, layout and (lazily) column views (``leaves``:
        from :meth:`indexed`; ``None``: rebuilt from :attr:`data`): the one place they change."""
        self.read_columns_cache: Columns | None | bool = False
        self.step_columns_cache: Columns | None | bool = False
        self.draw_cache: tuple | None = None
        if leaves is None:
            leaves = Leaves(None, [], None, NO_ITEM_SHAPES) if self.data is None else self.indexed(self.data)
        self.data, self.flat, self.layout, self.item_shapes = leaves

    def write(self, env: torch.Tensor, position: torch.Tensor, data: TensorDictBase, owner: str) -> torch.Tensor:
        """Copies ``data`` (batch shape ``env.shape``) to the rows of ``(env, position)`` and
        returns those rows; a batch laid out unlike the stored steps raises ``ValueError``
        (naming ``owner``, the storage) before anything is written."""
        layout = _layout(data, env.ndim)
        if layout is None:  # a leaf that is not a tensor: named in the error
            _refuse_non_tensors(data, owner)
        fresh = self.allocated(data, env.ndim) if self.data is None else None
        if fresh is None and layout != self.layout:  # StorageLayoutError: a shape or dtype, else the keys
            _check_common_keys(self.layout, layout)
            _raise_key_mismatch(self.layout, layout)
        flat = self.flat_index(env, position).reshape(-1)
        _copy_rows(self.flat if fresh is None else fresh.flat, flat, data)
        if fresh is not None:  # the first write: the leaves exist once its rows are in them
            self.index_leaves(fresh)
        return flat

    def flat_index(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Row of ``(env, position)`` in :attr:`flat`: ``slot * E + env`` time-major,
        ``env * L + slot`` env-major."""
        slot = position.remainder(self.max_length)
        if self.time_major:
            flat = torch.add(env, slot, alpha=self.num_envs)
        else:
            flat = torch.add(slot, env, alpha=self.max_length)
        return flat if flat.device == self.device else flat.to(self.device)

    def read_columns(self) -> Columns | None:
        """Numpy views of the flat rows, or ``None`` where numpy cannot view one (not on the
        CPU, bfloat16, autograd history). Numpy's ``take`` costs less than a torch
        ``index_select`` on the few hundred rows of a sample."""
        if self.read_columns_cache is False:
            self.read_columns_cache = numpy_columns(self.flat, batch_dims=1) if self.data is not None else None
        return self.read_columns_cache

    def step_columns(self) -> Columns | None:
        """Numpy views of the leaves as ``[L, E, ...]`` (slot first, whatever the layout)."""
        if self.step_columns_cache is False:
            self.step_columns_cache = None if self.data is None else numpy_columns(
                [(key, leaf.transpose(0, 1)) for key, leaf in leaf_items(self.data)], batch_dims=2
            )
        return self.step_columns_cache

    # ------------------------------------------------------------------
    # Reads
    def gather(
        self, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None,
        skip: Any, pinned: bool, next_position: torch.Tensor | None = None,
    ) -> TensorDictBase:
        """The stored steps at ``(env, position)`` (both of shape ``S``) as a TensorDict of batch
        size ``S``, plus ``extra`` entries (which replace stored ones), without the leaves in
        ``skip``. With ``next_position``, the ``"next"`` entries are read at ``(env,
        next_position)``: the transition from ``position`` to the step after ``next_position``."""
        root = self.flat_index(env, position)
        shape = root.shape
        root = root.reshape(-1)
        after = root if next_position is None else self.flat_index(env, next_position).reshape(-1)
        columns = self.read_columns() if root.is_cpu else None
        if columns is None:
            sources, pick = self.flat, select_rows
        else:  # numpy's take costs less than index_select on a sample's few hundred rows
            sources = [(key, array) for key, (array, _, _) in columns.items()]
            root, after, pick = root.numpy(), after.numpy(), take
        entries = {}
        for key, source in sources:
            if key in skip or (extra and key in extra):
                continue
            value = pick(source, after if isinstance(key, tuple) and key[0] == "next" else root, pinned=pinned)
            entries[key] = value if len(shape) == 1 else value.reshape(*shape, *source.shape[1:])
        return assemble(entries, shape, self.device, extra, self.item_shapes)

    def empty_result(self, shape: tuple[int, ...]) -> TensorDictBase:
        """A TensorDict of batch size ``shape`` with the stored leaves' per-step shapes, unfilled."""
        entries = {key: torch.empty(*shape, *leaf.shape[1:], dtype=leaf.dtype, device=self.device)
                   for key, leaf in self.flat}
        return assemble(entries, torch.Size(shape), self.device, None, self.item_shapes)

    def draw_uniform(
        self, batch_size: int, lookback: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` uniform draws over the stored steps, except each env's ``lookback``
        oldest, as ``(env, position)``."""
        total, ends, base = self.draw_tables(lookback)
        if total == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        flat = torch.randint(total, (batch_size,), generator=generator).numpy()
        env = np.searchsorted(ends, flat, side="right")
        flat += base[env]
        return torch.from_numpy(env), torch.from_numpy(flat)

    # ------------------------------------------------------------------
    # Counters
    @property
    def is_full(self) -> bool:
        # A byte comparison of the [E] counters, cheaper than a per-env comparison,
        # which every step of every env would otherwise pay.
        return self.size_np.tobytes() == self.full_bytes

    def common_position(self) -> int | None:
        """The position every env stands at, or ``None`` if the envs stand at different ones."""
        raw, width = self.pos_np.tobytes(), self.pos_np.itemsize
        return self.pos_np.item(0) if raw[width:] == raw[:-width] else None

    def advance(self, env_ids: torch.Tensor | None, steps: int) -> None:
        """Moves the cursors of ``env_ids`` (distinct; ``None``: every env) on by ``steps``."""
        if env_ids is None:
            self.pos_np += steps
            self.grow_every_size(steps)
            return
        ids = env_ids.cpu().numpy()  # int64: checked by the storage
        self.pos_np[ids] += steps
        self.size_np[ids] = np.minimum(self.size_np[ids] + steps, self.max_length)

    def grow_every_size(self, steps: int) -> None:
        """Every env's size after ``steps`` more written steps (the full rings keep theirs)."""
        if not self.is_full:
            np.minimum(self.size_np + steps, self.max_length, out=self.size_np)

    def check_stored(self, env_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Raises ``ValueError`` naming the first ``(env, position)`` that is not stored."""
        stored = (positions >= (self.pos - self.size)[env_ids]) & (positions < self.pos[env_ids])
        if not bool(stored.all()):
            bad = int(stored.logical_not().nonzero()[0, 0]) if stored.ndim else 0
            e, p = int(env_ids.reshape(-1)[bad]), int(positions.reshape(-1)[bad])
            raise ValueError(
                f"position {p} of env {e} is not stored; env {e} holds positions "
                f"[{int(self.pos[e] - self.size[e])}, {int(self.pos[e]) - 1}]."
            )

    def draw_tables(self, lookback: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Readable steps in all (each env's ``lookback`` oldest are not), their running count
        per env, and what turns a flat draw into a position; kept until the counters move."""
        key = self.pos_np.tobytes() + self.size_np.tobytes()
        cached = self.draw_cache
        if cached is None or cached[0] != (key, lookback):
            readable = np.maximum(self.size_np - lookback, 0)
            ends = readable.cumsum()
            base = self.pos_np - self.size_np + lookback - ends + readable
            cached = self.draw_cache = ((key, lookback), int(ends[-1]), ends, base)
        return cached[1:]

    # ------------------------------------------------------------------
    # Checkpoints, sharing and pickling
    def load(self, data: TensorDictBase | None, counters: list[torch.Tensor]) -> None:
        """Replaces the leaves and the counters (``[position, size, resets]``) by a checkpoint's."""
        self.data = data
        self.index_leaves()
        for mine, theirs in zip((self.pos, self.size, self.resets), counters):
            mine.copy_(theirs)
        self.loads += 1

    @makes_kept_tensors  # the shared counters and leaves replace the ones updated in place
    def share_memory_(self, example: TensorDictBase | None, owner: str) -> None:
        """Moves the leaves (allocated from ``example`` if nothing was written) and the
        counters to shared memory; ``owner`` names the storage in errors. Once shared, a
        call changes nothing: new counters would cut off the processes holding the old ones."""
        if self.shared:
            return
        if self.device.type != "cpu":
            raise ValueError(
                f"{owner}.share_memory_() shares CPU storages only, got device={self.device}; "
                "build the storage with device='cpu' (CUDA tensors are shared by "
                "torch.multiprocessing without this call)."
            )
        if self.data is None:
            if example is None:
                raise ValueError(
                    f"{owner} allocates its rings on the first write, which a spawned process "
                    "would do in its own memory; pass example=<one batch of steps> to "
                    "share_memory_() (or write once before sharing)."
                )
            if not isinstance(example, TensorDictBase) or example.batch_dims not in (1, 2):
                raise ValueError(
                    "example must be a TensorDict of batch size [N] or [N, T], got "
                    f"{type(example).__name__} {list(getattr(example, 'batch_size', []))}."
                )
            self.allocate(example, example.batch_dims)
        self.data.share_memory_()
        self.index_leaves()
        # Counters: torch tensors in shared memory (pickling sends them as handles),
        # numpy views on them.
        self.pos, self.size = self.pos.clone().share_memory_(), self.size.clone().share_memory_()
        self.resets.share_memory_()
        self.shared = True
        self._views()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        # Derived views: pickled apart, they would arrive as copies. Rebuilt on arrival.
        for name in ("read_columns_cache", "step_columns_cache", "draw_cache", "flat", "layout", "item_shapes"):
            state.pop(name)
        # Shared counters travel as the torch tensors torch.multiprocessing shares; others as
        # the numpy arrays, with the views rebuilt on them.
        for name in ("pos_np", "size_np") if self.shared else ("pos", "size"):
            state.pop(name)
        return state

    @makes_kept_tensors  # the torch views on the counters, updated in place
    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._views()
        self.index_leaves()


def _copy_rows(leaves: list[tuple[Any, torch.Tensor]], rows: torch.Tensor, data: TensorDictBase) -> None:
    """Copies ``data``'s leaves (one row per entry of ``rows``) into the flat ``leaves`` at ``rows``."""
    n = rows.numel()
    for key, leaf in leaves:
        value = data.get(key)
        if value.dim() != leaf.dim():  # [N, T, ...] batches: one row per step
            value = value.reshape(n, *leaf.shape[1:])
        if value.device != leaf.device:
            value = value.to(leaf.device)
        row_bytes = leaf[0].numel() * leaf.element_size()
        if leaf.element_size() < 8 and row_bytes % 8 == 0 and row_bytes >= 64:
            # index_copy_ moves small dtypes (uint8 frames) much slower
            # than the same bytes seen as int64.
            leaf.view(leaf.shape[0], -1).view(torch.int64).index_copy_(
                0, rows, value.contiguous().view(n, -1).view(torch.int64))
        else:
            leaf.index_copy_(0, rows, value)
