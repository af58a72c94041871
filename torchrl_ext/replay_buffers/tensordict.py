"""Replay buffers: TorchRL's ``TensorDictReplayBuffer`` with lean hot paths.

:class:`TensorDictReplayBuffer` and :class:`PrioritizedReplayBuffer` keep
TorchRL's public API, samplers, writers, locks and checkpointing; where their lean
paths apply (the class docstrings, ``docs/architecture.md`` "Fast paths"), only faster.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection
from torchrl.data import TensorDictReplayBuffer as _TorchRLTensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from torchrl_ext import _compat
from torchrl_ext._checks import (
    as_index, check_generator, check_int, check_priorities, is_int_tensor, makes_kept_tensors,
)
from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.io.atomic_dir import atomic_save_dir, committed_dir, verify_checkpoint
from torchrl_ext.io.state_files import load_state, save_state
from torchrl_ext.replay_buffers._lean_extend import LeanExtend
from torchrl_ext.storages._gathers import (
    NO_ITEM_SHAPES, check_info_leads, gather_coordinates, gather_rows, item_batch_shapes, set_info,
)
from torchrl_ext.storages._numpy_rows import leaf_items
from torchrl_ext.samplers.minibatch import _EpochMinibatchSampler
from torchrl_ext.storages._layouts import has_lazy_stack
from torchrl_ext.storages.fast import FastMemmapStorage, FastTensorStorage
from torchrl_ext.storages.rollout import RolloutStorage
from torchrl_ext.writers.rollout import RolloutWriter

__all__ = ["PriorityEntryError", "TensorDictReplayBuffer"]

# Files of the state TorchRL's dumps leaves out (see TensorDictReplayBuffer._extra_state).
_EXTRA_TENSORS, _EXTRA_METADATA = "torchrl_ext_state.safetensors", "torchrl_ext_state.json"


class PriorityEntryError(ValueError, RuntimeError):
    """A batch's priority entry that the sampler refuses, found before the batch is stored.

    A ``ValueError`` (bad input) that is also the ``RuntimeError`` TorchRL's buffers raise
    for a failed priority write-back, so code written for either keeps catching it.
    """


def _check_sampler_capacity(sampler: Any, storage: Any) -> None:
    """Refuses a prioritized sampler with fewer priorities than a 1-D storage has rows (a tensor
    storage of more dims: cells, at least ``max_size``): items past its capacity could be stored
    but never get a priority (TorchRL would find out only after storing them)."""
    capacity = getattr(sampler, "max_size", None)
    rows = getattr(storage, "max_size", None)
    ndim = getattr(storage, "ndim", 1)
    if (
        isinstance(capacity, int) and isinstance(rows, int) and capacity < rows
        and (ndim == 1 or isinstance(storage, TensorStorage)) and hasattr(sampler, "update_priority")
    ):
        raise ValueError(
            f"the sampler holds max_capacity={capacity} priorities but the storage holds "
            f"max_size={rows} {'rows' if ndim == 1 else 'cells'}; build the sampler with "
            f"max_capacity={rows} (the storage's max_size), or give a storage of max_size={capacity}."
        )


def identity_collate(data: Any) -> Any:
    """Collate function of storages that already return one TensorDict."""
    return data


def _info_entries(info: dict[Any, Any], batch: int) -> dict[Any, torch.Tensor]:
    """Sampler info as TorchRL's ``TensorDictReplayBuffer.sample`` writes it (tensors, a tuple
    ``index`` stacked along the last dim, scalars broadcast over the batch)."""
    entries = {}
    for key, value in info.items():
        if key == "index" and isinstance(value, tuple):
            value = torch.stack(value, -1)
        elif isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        elif not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        entries[key] = value.expand(batch) if value.ndim == 0 else value
    return entries


def _check_unreduced(priority: Any) -> None:
    """Checks every agent's or step's priority before TorchRL reduces them to one per item: a
    ``max`` would hide a negative one, a ``min`` an infinite one."""
    if isinstance(priority, torch.Tensor) and priority.numel() > 1 and priority.is_floating_point():
        check_priorities("priority", priority.detach())


def _gather_sample(storage: Any, index: Any, rows: Any, info: dict) -> Any:
    """The sampled items with the sampler's ``info`` entries, as TorchRL's ``_sample`` builds
    them: a fast storage's own gather, the gathers here on a plain layout, else the storage's
    own indexing."""
    if isinstance(storage, (FastTensorStorage, FastMemmapStorage)) and storage.ndim == 1 \
            and isinstance(rows, torch.Tensor) and rows.ndim == 1:
        return storage.gather(rows, _info_entries(info, rows.numel()))  # cached numpy reads
    stored = _compat.stored_data(storage) if isinstance(storage, TensorStorage) else None
    # The layout the gathers here assemble: items without batch dims of their own, no lazy
    # stacks. Listed once per sample: TorchRL adds and replaces leaves of the stored
    # TensorDict (a key that appears later, a load, memmap_()), which a kept list would miss.
    plain = isinstance(stored, TensorDictBase) and not has_lazy_stack(stored) \
        and item_batch_shapes(stored, storage.ndim) is NO_ITEM_SHAPES
    leaves = leaf_items(stored) if plain else None
    if leaves is not None and all(isinstance(t, torch.Tensor) for _, t in leaves):
        if isinstance(rows, torch.Tensor) and rows.ndim == 1 and storage.ndim == 1:
            return gather_rows(stored, rows, extra=_info_entries(info, rows.numel()), leaves=leaves)
        # One integer tensor per dim of an ndim >= 2 storage (a TensorStorage: leaves were listed).
        if isinstance(index, tuple) and len(index) == storage.ndim >= 2 and all(map(is_int_tensor, index)):
            batch = torch.broadcast_shapes(*(i.shape for i in index))[0]
            return gather_coordinates(stored, index, extra=_info_entries(info, batch), leaves=leaves)
    data = storage.get(_compat.storage_index(index, storage))  # non-tensor leaves, other layouts
    return set_info(data, _info_entries(info, data.shape[0]))


class TensorDictReplayBuffer(LeanExtend, _TorchRLTensorDictReplayBuffer):
    """TorchRL's ``TensorDictReplayBuffer`` with a lean ``sample``.

    Same constructor and behaviour (any sampler, writer, storage, transform);
    on a 1-D tensor storage without sample units or generation tracking,
    ``sample`` gathers with ``index_select`` and writes the sampler's info
    (``index``, weights, ...) straight into the result. A transform,
    ``include_info``, prefetch, pinned memory and every other layout take
    TorchRL's own ``sample`` (the info joins after the transform).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import TensorDictReplayBuffer
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=FastTensorStorage(100), batch_size=4)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
        >>> batch = rb.sample()
        >>> bool((batch["obs"] == batch["index"].float()).all())
        True
    """

    def __init__(self, **kwargs: Any) -> None:
        storage = kwargs.get("storage")
        if callable(storage) and not isinstance(storage, Storage):
            # A factory (functools.partial(RolloutStorage, ...), as RayReplayBuffer and
            # configs pass it): build it now so the defaults below see the storage.
            kwargs["storage"] = storage()
        # torchrl_ext storages that return one TensorDict per read need no
        # collate function; TorchRL only knows its own storage classes.
        if kwargs.get("collate_fn") is None and getattr(kwargs.get("storage"), "returns_tensordicts", False):
            kwargs["collate_fn"] = identity_collate
        if kwargs.get("writer") is None and isinstance(kwargs.get("storage"), RolloutStorage):
            # rb.extend(collector_batch) appends steps to the rollout, as TorchRL users expect.
            kwargs["writer"] = RolloutWriter()
        if kwargs.get("batch_size") is None and isinstance(kwargs.get("sampler"), _EpochMinibatchSampler):
            # The minibatch sampler sizes its minibatches; TorchRL only needs a batch size to iterate.
            kwargs["batch_size"] = 1
        sampler, storage = kwargs.get("sampler"), kwargs.get("storage")
        # A sampler's storage check: it would refuse the storage only at the first write, once stored.
        check_storage = getattr(sampler, "_check_storage", None) if isinstance(sampler, Sampler) else None
        if check_storage is not None and storage is not None:
            check_storage(storage)
        _check_sampler_capacity(sampler, storage)
        check_generator("generator", kwargs.get("generator"))  # torch would refuse it at the first draw
        super().__init__(**kwargs)
        if storage is None and self.initialized:  # TorchRL's default storage, built just now
            if check_storage is not None:
                check_storage(self.storage)
            _check_sampler_capacity(sampler, self.storage)

    def set_rng(self, generator: torch.Generator | None) -> None:
        """TorchRL's ``set_rng``; ``TypeError`` for anything but a ``torch.Generator`` or ``None``."""
        super().set_rng(check_generator("generator", generator))

    def _transpose(self, data: Any) -> Any:
        if isinstance(self.storage, RolloutStorage) and isinstance(data, TensorDictBase) and data.batch_dims == 1:
            return data.unsqueeze(1)  # [T] from one env: T steps of N = 1
        return super()._transpose(data)

    # ------------------------------------------------------------------
    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """TorchRL's ``extend``; a write the storage refuses leaves the writer's cursor unmoved,
        and a priority entry the sampler would refuse is refused before any row is stored."""
        self._check_priority_entry(tensordicts, update_priority)
        if isinstance(tensordicts, TensorDictBase) and tensordicts.batch_size.numel() == 0 \
                and not self._has_transform():
            # Nothing to write. TorchRL fails on a first write of no rows: its lazy
            # allocation reads row 0, and its writer then reads the unset storage shape.
            return torch.zeros((0, self.storage.ndim) if self.storage.ndim > 1 else (0,), dtype=torch.long)
        self._check_batch_dims(tensordicts)
        self._check_first_write(tensordicts)
        if self._lean_extend_applies(tensordicts):
            return self._lean_extend(tensordicts, update_priority)
        # The readiness condition first: TorchRL's extend notifies it with the replay lock held
        # here, and its wait_until_sampleable takes the two in that order.
        with _compat.readiness_condition(self), _compat.replay_lock(self), self._writer_restored_on_error():
            return super().extend(tensordicts, update_priority=update_priority)

    def _check_batch_dims(self, data: Any) -> None:
        """Refuses, before anything is stored, a batch whose dims differ from an ``ndim >= 2``
        tensor storage's: TorchRL stores its rows and then fails on their index (more dims), or
        allocates a storage of another layout (fewer)."""
        storage = self.storage
        if not isinstance(storage, TensorStorage) or storage.ndim < 2 or not isinstance(data, TensorDictBase) \
                or data.batch_dims == storage.ndim or self._has_transform():
            return
        fix = ("add the missing dims (e.g. data.unsqueeze(1) for one env)" if data.batch_dims < storage.ndim
               else "keep per-agent entries in a sub-TensorDict (e.g. 'agents' of batch [T, N, A] under a "
                    "[T, N] root), or build the storage with ndim=data.batch_dims")
        raise ValueError(
            f"data has batch size {list(data.batch_size)} but the storage has ndim={storage.ndim}, so "
            f"a batch needs exactly {storage.ndim} dims (dim_extend={self.dim_extend} is extended); {fix}."
        )

    def _check_first_write(self, data: Any) -> None:
        """Lets the sampler refuse the shape a 2-D storage's first write would allocate before
        it is written (TorchRL rounds ``max_size`` up to whole env columns of the batch)."""
        check = getattr(self.sampler, "_check_capacity", None)
        storage = self.storage
        if check is None or getattr(storage, "ndim", 1) != 2 or getattr(storage, "initialized", True) \
                or not isinstance(data, TensorDictBase) or data.batch_dims < 2 or self._has_transform():
            return
        check(storage, num_envs=data.shape[1 - self.dim_extend])  # the envs' dim: the one not extended

    def _check_priority_entry(self, data: Any, update_priority: bool | None, *, single: bool = False) -> None:
        """Validates the batch's priority entry (values, and its length on a 1-D storage)
        before the write: TorchRL stores the rows first and raises on the priority after."""
        check = getattr(self.sampler, "check_priority", None)
        if check is None or update_priority is False or not isinstance(data, TensorDictBase):
            return
        priority = data.get(self.priority_key, None)
        if priority is None or self._has_transform():
            return  # a transform may rewrite the entry: it is checked where TorchRL checks it
        try:
            if single and isinstance(priority, torch.Tensor):
                check(priority.reshape(1, -1), 1)
            elif data.batch_dims == 1 and getattr(self.storage, "ndim", 1) == 1:
                check(priority, data.shape[0])
            elif isinstance(priority, torch.Tensor):
                check(priority.reshape(-1), priority.numel())
        except ValueError as err:
            raise PriorityEntryError(
                f"Failed to update priority of extended data: {err} Nothing was stored; fix "
                f"the {self.priority_key!r} entry, or pass update_priority=False and update "
                "the priorities afterwards."
            ) from err

    def empty(self, empty_write_count: bool = True) -> None:
        """TorchRL's ``empty`` under the buffer's locks, so that no sample or write in another
        thread or process sees a half-emptied buffer (TorchRL 0.14.1's takes none; later
        releases take them themselves, and taking the process lock twice would hang)."""
        if _compat.empty_takes_locks():
            super().empty(empty_write_count=empty_write_count)
            return
        with _compat.replay_lock(self), _compat.write_lock(self):
            super().empty(empty_write_count=empty_write_count)

    def update_priority(self, index: Any, priority: Any = None) -> None:
        """TorchRL's ``update_priority(index, priority)``; a sampled TensorDict alone
        (``update_priority(batch)``, as TorchRL's reference scripts call it) writes back its
        ``priority_key`` entry at its ``"index"``, as :meth:`update_tensordict_priority`."""
        if priority is None:
            if not is_tensor_collection(index):
                raise TypeError(
                    "update_priority needs a priority: update_priority(index, priority), or "
                    f"update_priority(batch) with a sampled TensorDict; got index={type(index).__name__} "
                    "and no priority."
                )
            return self.update_tensordict_priority(index)
        return super().update_priority(index, priority)

    def add(self, data: Any) -> Any:
        """TorchRL's ``add``; a write the storage refuses leaves the writer's cursor unmoved,
        and a priority entry the sampler would refuse is refused before the item is stored."""
        self._check_priority_entry(data, None, single=True)
        # The readiness condition before the replay lock, as in extend.
        with _compat.readiness_condition(self), _compat.replay_lock(self), self._writer_restored_on_error():
            return super().add(data)

    @contextmanager
    def _writer_restored_on_error(self) -> Iterator[None]:
        """Puts the writer's cursor and write count back when a write raises before changing the storage.

        TorchRL's writers advance their cursor before the storage checks the
        data, so a refused write would make the next one skip rows and expose
        never-written (garbage) rows as stored data.
        """
        writer, storage = self.writer, self.storage
        saved = _compat.writer_state(writer)
        revision = _compat.mutation_revision(storage)
        try:
            yield
        except BaseException:
            if revision is not None and _compat.mutation_revision(storage) == revision:
                _compat.restore_writer_state(writer, saved)
            raise

    # ------------------------------------------------------------------
    def _lean_path(self) -> bool:
        storage = self.storage
        if not fastpath_enabled() or _compat.sample_unit(self) is not None or self.writer.tracks_generations:
            return False
        if getattr(storage, "returns_tensordicts", False):  # torchrl_ext storages read themselves
            return True
        return isinstance(storage, TensorStorage) and isinstance(_compat.stored_data(storage), TensorDictBase)

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event: Any = None,
    ) -> Any:
        """Samples ``batch_size`` items with ``index`` and ``priority_weight`` set.

        Same contract as ``TensorDictReplayBuffer.sample`` (a numpy or 0-d tensor integer
        ``batch_size`` is taken as its int); a negative or non-int ``batch_size`` is a
        ``ValueError`` (TorchRL fails inside torch). ``wait``, ``timeout`` and ``cancel_event``
        are TorchRL's (releases after 0.14.1); on a TorchRL without them, a value other than
        the default is a ``TypeError``.
        """
        waits = _compat.sample_wait_arguments(wait=wait, timeout=timeout, cancel_event=cancel_event)
        batch_size = as_index(batch_size)  # TorchRL's fallback below then gets the int too
        size = self._plain_batch_size(batch_size, include_info, self._lean_path)
        if size is None or waits:  # TorchRL's sample waits, then calls the lean _sample
            return super().sample(batch_size, return_info=return_info, include_info=include_info, **waits)
        data, info = self._lean_sample(size, with_info=True)  # _lean_path() held just above
        _compat.count_sample(self, info["index"])  # as TorchRL's sample counts after _sample
        return (data, info) if return_info else data

    def _plain_batch_size(self, batch_size: Any, include_info: bool | None, lean: Callable[[], bool]) -> int | None:
        """Checks ``batch_size``; the size a one-layer sample draws, or ``None`` where TorchRL's
        ``sample`` must run (it warns about a size other than the buffer's, raises without one)."""
        batch_size = as_index(batch_size)  # subclasses' sample calls this first
        if batch_size is not None:  # None: the buffer's batch_size
            check_int("batch_size", batch_size, minimum=0)
        _compat.ensure_initialized(self)
        # The one layer gathers the info with the rows; TorchRL adds it after the transform,
        # and not at all for include_info=False.
        if not lean() or include_info is not None or self._has_transform() or not _compat.samples_plainly(self):
            return None
        if batch_size is None:
            return self.batch_size
        return batch_size if self.batch_size is None or batch_size == self.batch_size else None

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        if not self._lean_path():
            data, info = super()._sample(batch_size)
            if is_tensor_collection(data):  # TorchRL would fail writing it, with a RuntimeError
                for key, value in _info_entries(info, data.shape[0] if data.batch_dims else 1).items():
                    # TorchRL broadcasts info of fewer dims over the rest (per-item info of windows).
                    check_info_leads(key, value, data.batch_size[: value.ndim])
            return data, info
        return self._lean_sample(batch_size)

    def _lean_sample(self, batch_size: int, with_info: bool = False) -> tuple[Any, dict]:
        """TorchRL's ``_sample`` in one layer, for buffers where :meth:`_lean_path` holds;
        ``with_info`` (only without a transform) also puts the info in the sample, as
        TorchRL's ``sample`` would after ``_sample``."""
        storage = self.storage
        with _compat.replay_lock(self), _compat.write_lock(self):
            index, info = self.sampler.sample(storage, batch_size)
            info["index"] = index
            # Samplers may hand back a 1-tuple of coordinates for a 1-D storage.
            rows = index[0] if isinstance(index, tuple) and len(index) == 1 else index
            data = _gather_sample(storage, index, rows, info if with_info else {})
        data = _compat.set_sample_names(self.sampler, _compat.collate(self, data))
        if not with_info and self._has_transform():  # with_info: sample() found no transform
            with data.unlock_():
                data = self.transform(data)
        return data, info

    def _get_priority_vector(self, tensordict: TensorDictBase) -> torch.Tensor:
        _check_unreduced(tensordict.get(self.priority_key, None))
        return super()._get_priority_vector(tensordict)

    def _get_priority_item(self, tensordict: TensorDictBase) -> Any:
        _check_unreduced(tensordict.get(self.priority_key, None))
        return super()._get_priority_item(tensordict)

    def _set_index_in_td(self, tensordict: TensorDictBase, index: Any) -> None:
        """Writes each extended item's storage coordinates under ``"index"``.

        On an ``ndim >= 2`` storage the writer returns one row of coordinates per
        item, in storage order (``dim_extend`` first). TorchRL reshapes them in
        the batch's own order, which raises when the batch's dims after the
        first are all 1 (``[num_envs, 1]``, a ``[T, 1]`` rollout); here they are
        reshaped in storage order and transposed back.
        """
        if (
            isinstance(index, torch.Tensor) and index.ndim == 2 and self.storage.ndim > 1
            and index.shape[0] == tensordict.numel()
            # [T] steps of one env in a [T, N = 1] rollout: one (time, env) row per step, as is
            and tensordict.ndim in (1, self.storage.ndim)
        ):
            if tensordict.ndim > 1:
                dim = self.dim_extend
                shape = list(tensordict.shape)
                shape[0], shape[dim] = shape[dim], shape[0]
                index = index.reshape(*shape, index.shape[-1]).transpose(0, dim)
            tensordict.set("index", index)
            return
        super()._set_index_in_td(tensordict, index)

    # ------------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        """State that decides the next draws but that TorchRL's ``dumps`` leaves out.

        Here: a tensor storage's last written row (TorchRL's storage
        checkpointer does not save it; n-step chains stop at it). Subclasses
        add theirs. Values are numbers, strings, ``None`` and lists of tensors
        (see :func:`torchrl_ext.io.save_state`).
        """
        storage = self.storage
        cursor = _compat.last_written(storage) if isinstance(storage, TensorStorage) else None
        return {"storage_last_cursor": None if cursor is None else int(cursor)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`_extra_state` returned."""
        cursor = state.get("storage_last_cursor")
        if cursor is not None and isinstance(self.storage, TensorStorage):
            _compat.set_last_written(self.storage, int(cursor))

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's ``state_dict`` plus :meth:`_extra_state` under ``"_torchrl_ext"``, taken
        with no write in between (of another thread, or process for a shared buffer)."""
        with _compat.snapshot_locks(self):
            state = super().state_dict()
            state["_torchrl_ext"] = self._extra_state()
        return state

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """TorchRL's ``load_state_dict``; also restores ``"_torchrl_ext"`` when present. A sampler
        or writer state that does not fit raises a ``ValueError`` before anything changes."""
        state_dict = dict(state_dict)
        extra = state_dict.pop("_torchrl_ext", None)
        self._try_on_copies(lambda part, name: part.load_state_dict(state_dict[f"_{name}"]),
                            lambda name: f"state_dict['_{name}']")
        super().load_state_dict(state_dict)
        if extra is not None:
            self._load_extra_state(extra)

    def dumps(self, path: str | Path) -> None:
        """TorchRL's ``dumps`` plus :meth:`_extra_state`, all swapped in at once.

        The files are written to a hidden sibling folder and renamed over
        ``path`` (:func:`torchrl_ext.io.atomic_dir.atomic_save_dir`), so a
        crash during the save leaves the previous checkpoint or the new one,
        never a mix; :meth:`loads` applies the recovery rule. No write, of another
        thread or process for a shared buffer, lands during the save.
        """
        with _compat.snapshot_locks(self):
            atomic_save_dir(path, super().dumps)

    def _dump_prefetch_state(self, path: Path, prefetch_state: dict[str, Any]) -> None:
        # TorchRL's dumps calls this last, with the replay lock held: the extra
        # state is captured at the same point as the storage, sampler and writer.
        super()._dump_prefetch_state(path, prefetch_state)
        save_state(path, self._extra_state(), tensors_file=_EXTRA_TENSORS, metadata_file=_EXTRA_METADATA)

    def loads(self, path: str | Path) -> None:
        """Loads what :meth:`dumps` (or TorchRL's ``dumps``) wrote at ``path``.

        After a save that was killed, the folder to read follows the recovery
        rule of :mod:`torchrl_ext.io.atomic_dir` (files are not touched).
        """
        folder = committed_dir(path)
        # Everything that can be checked is checked before anything in memory changes: the
        # manifest's checksums, the extra state, and the sampler and writer files, loaded
        # into copies of the two first.
        verify_checkpoint(folder)
        state = None
        if (folder / _EXTRA_METADATA).is_file():
            state = load_state(folder, tensors_file=_EXTRA_TENSORS, metadata_file=_EXTRA_METADATA)
        # A missing file is skipped here: TorchRL's loads names it.
        self._try_on_copies(lambda part, name: (folder / name).exists() and part.loads(folder / name),
                            lambda name: folder / name)
        super().loads(folder)
        if state is not None:
            with _compat.replay_lock(self):
                self._load_extra_state(state)

    def _try_on_copies(self, load: Callable[[Any, str], Any], source: Callable[[str], Any]) -> None:
        """``load(copy, name)`` the sampler's and writer's saved state into copies of them (sharing
        the storage): TorchRL loads the storage first, so a state they refuse must raise before."""
        shared = {id(self): self, id(self.storage): self.storage}
        for name, part in (("sampler", self.sampler), ("writer", self.writer)):
            try:
                trial = copy.deepcopy(part, memo=dict(shared))
            except Exception:  # a part that cannot be copied is loaded as TorchRL would
                continue
            if callable(getattr(trial, "use_storage", None)):
                trial.use_storage(self.storage)  # a copy drops that link, which its checks need
            try:
                load(trial, name)
            except Exception as err:
                raise ValueError(
                    f"{source(name)} cannot be loaded into this buffer's {type(part).__name__} "
                    f"({type(err).__name__}: {err}); the buffer is unchanged. Build the buffer as "
                    "the saved one was built."
                ) from err
