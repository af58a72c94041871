"""Every private TorchRL / TensorDict name torchrl_ext relies on, in one place.

TorchRL's public extension contract (subclassing ``Storage``, ``Sampler``, ``Writer`` and the
value estimators) still leaves some work to private names: helpers of its value estimators,
counters of its storages, flags of its buffers. Upstream may rename them in any release, so
the rest of the package reaches them only through this module, and
``tests/test_compat.py`` has one test per name (the nightly job runs it against
torchrl-nightly and tensordict-nightly): an upstream rename fails one named test instead of
surfacing as a wrong result somewhere else.

Two kinds of names are listed:

* names torchrl_ext reads or calls, wrapped below as plain functions;
* :data:`HOOKS`, private methods TorchRL calls on its own classes and torchrl_ext overrides.
  An override of a renamed hook would silently stop being called, so the test checks that
  TorchRL's class still defines each one.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterable, Iterator

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.replay_buffers.base import _storage_index
from torchrl.data.replay_buffers import ReplayBuffer as _ReplayBuffer
from torchrl.data.replay_buffers import TensorDictReplayBuffer as _TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as _PrioritizedSampler
from torchrl.data.replay_buffers.samplers import Sampler as _Sampler
from torchrl.data.replay_buffers.storages import LazyMemmapStorage as _LazyMemmapStorage
from torchrl.data.replay_buffers.storages import LazyTensorStorage as _LazyTensorStorage
from torchrl.data.replay_buffers.storages import ListStorage as _ListStorage
from torchrl.data.replay_buffers.storages import Storage as _Storage
from torchrl.data.replay_buffers.writers import Writer as _Writer
from torchrl.objectives.value import GAE as _GAE
from torchrl.objectives.value import ValueEstimatorBase as _ValueEstimatorBase
from torchrl.objectives.value.advantages import (
    _self_set_grad_enabled,
    _self_set_skip_existing,
    _standardize_by_group,
)

# ---------------------------------------------------------------- value estimators
#: Decorators of TorchRL's estimator ``forward``: honour ``set_skip_existing`` and the
#: estimator's ``differentiable`` flag, as TorchRL's own estimators do.
skip_existing = _self_set_skip_existing
grad_enabled = _self_set_grad_enabled
#: ``standardize_by_group(values, groups, mask=None, eps=...)``: per-group standardisation.
standardize_by_group = _standardize_by_group


def call_value_nets(estimator: Any, data: TensorDictBase, **kwargs: Any) -> tuple[Any, Any, Any]:
    """``(value, next_value, valid)`` from ``estimator``'s value network on ``data`` and ``data["next"]``."""
    return estimator._call_value_nets(data=data, **kwargs)


def next_state_value(estimator: Any, data: TensorDictBase, target_params: Any, kwargs: dict) -> Any:
    """The critic's value of ``data``'s next states alone (with ``target_params`` when given), as
    TorchRL's ``value_estimate`` bootstraps without ``next_value=``."""
    return estimator._next_value(data, target_params, kwargs)


def time_dim_of(estimator: Any, time_dim: int | None, data: TensorDictBase) -> int:
    """The time dimension ``estimator`` uses for ``data`` (its own setting when ``time_dim`` is None)."""
    return estimator._get_time_dim(time_dim, data)


def shifted_view(estimator: Any, data: TensorDictBase, valid: Any, time_dim: int) -> TensorDictBase:
    """``data`` as the estimator reads it after a shifted value-network call (``valid`` steps)."""
    return estimator._prepare_shifted_tensordict(data, valid, time_dim)


def mask_shifted_outputs(estimator: Any, data: TensorDictBase, valid: Any) -> None:
    """Masks the outputs written into ``data`` where a shifted call left invalid steps."""
    estimator._mask_shifted_output(data, valid)


def set_value_estimator(loss: Any, estimator: Any) -> None:
    """Gives a TorchRL loss its estimator, as its own ``make_value_estimator`` does (the public
    ``value_estimator`` setter is shadowed by ``nn.Module``'s sub-module registration)."""
    loss._value_estimator = estimator


def expand_to_match(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``source`` (a mask) expanded to ``target``'s shape, as TorchRL's estimators expand it."""
    return _ValueEstimatorBase._expand_to_match(source, target)


def group_ids(estimator: Any, data: TensorDictBase) -> torch.Tensor | None:
    """The ids under the estimator's ``group_key`` in ``data`` (None without one)."""
    return estimator._group_ids(data)


# ---------------------------------------------------------------- storages, samplers, buffers
def storage_index(index: Any, storage: Any) -> Any:
    """``index`` moved to ``storage``'s device, as TorchRL's buffers move it before a read."""
    return _storage_index(index, storage)


def stored_data(storage: Any) -> Any:
    """What a TorchRL ``TensorStorage`` holds (its ``_storage``: a TensorDict of ``[max_size, ...]``
    leaves once initialised, ``None`` before)."""
    return storage._storage


def allocate_like(storage: Any, item: Any) -> None:
    """Allocates a lazy TorchRL storage's leaves for items shaped like ``item`` (its ``_init``)."""
    storage._init(item)


def writer_cursor(writer: Any) -> int:
    """The next slot a TorchRL ``RoundRobinWriter`` writes (its ``_cursor``)."""
    return writer._cursor


def set_writer_cursor(writer: Any, cursor: int, *, written: int = 0) -> None:
    """Moves a ``RoundRobinWriter`` to ``cursor``, adding ``written`` to its count of writes."""
    writer._cursor = cursor
    writer._write_count += written


def requested_dim_extend(buffer: Any) -> int | None:
    """The ``dim_extend`` a TorchRL buffer was built with (``None``: TorchRL picks one later);
    ``0`` for anything that is not a buffer or is not built yet."""
    return getattr(buffer, "_dim_extend", 0)


def pins_memory(buffer: Any) -> bool:
    """Whether a TorchRL buffer was built with ``pin_memory=True`` (set before it attaches storages)."""
    return bool(getattr(buffer, "_pin_memory", False))


def replay_lock(buffer: Any) -> Any:
    """The lock a TorchRL buffer holds around every read and write of its parts (``_replay_lock``)."""
    return buffer._replay_lock


def write_lock(buffer: Any) -> Any:
    """The lock a shared TorchRL buffer holds around writes (``_write_lock``; a null context
    unless the buffer is shared)."""
    return buffer._write_lock


@contextlib.contextmanager
def snapshot_locks(buffer: Any) -> Iterator[None]:
    """Holds a buffer's prefetch and replay locks, and a shared buffer's process lock, in
    TorchRL's order, so that a ``state_dict``/``dumps`` inside sees no write in between, of
    another thread or process. TorchRL's own ``state_dict``/``dumps`` take the first two
    (reentrant) again inside.

    With a prefetch queue nothing is held here: TorchRL waits for the queued samples, which
    take the replay lock, and only then takes it. Shared buffers have none
    (:func:`torchrl_ext.distributed.share_buffer` refuses it).
    """
    if prefetch_size(buffer):
        yield
        return
    with buffer._futures_lock, replay_lock(buffer), write_lock(buffer):
        yield


def attach_shared_init(storage: Any) -> None:
    """Attaches a ``shared_init=True`` tensor storage that another process allocated, as
    TorchRL's ``get`` does first (``_wait_for_init``); until then it reads as not initialized
    in this process, though ``len`` counts the shared rows. A no-op for any other storage."""
    if getattr(storage, "shared_init", False) and not storage.initialized and len(storage):
        storage._wait_for_init()


@functools.cache
def empty_takes_locks() -> bool:
    """Whether TorchRL's ``ReplayBuffer.empty`` holds the buffer's locks itself.

    0.14.1 holds none; later releases hold both. The process lock is not reentrant, so a
    caller that holds it must not call an ``empty`` that takes it again: that hangs. Found out
    once, by calling ``empty`` on a small buffer whose process lock records being taken.
    """
    taken = []

    class _RecordingLock:
        def __enter__(self) -> None:
            taken.append(True)

        def __exit__(self, *exc_info: Any) -> bool:
            return False

    probe = _ReplayBuffer(storage=_ListStorage(1))
    probe._write_lock = _RecordingLock()
    probe.empty()
    return bool(taken)


def sample_unit(buffer: Any) -> Any:
    """The ``sample_unit`` a TorchRL buffer was built with (``None``: items)."""
    return buffer._sample_unit


def ensure_initialized(buffer: Any) -> None:
    """Builds the parts of a buffer made with ``delayed_init=True``, as its ``sample`` would."""
    if buffer._delayed_init and not buffer.initialized:
        buffer._init()


def prefetch_size(buffer: Any) -> int | None:
    """The ``prefetch`` a TorchRL buffer was built with (batches sampled ahead; ``None``/0: none)."""
    return buffer._prefetch_cap


def samples_plainly(buffer: Any) -> bool:
    """Whether TorchRL's ``sample`` would add nothing to the sampler's draw, the storage's read,
    the collate function and the transform: no prefetch queue, no pinned outputs, no shut-down
    service and no ``sample_unit``."""
    return not (buffer._prefetch or buffer._pin_memory or buffer._service_shutdown
                or buffer._sample_unit is not None)


def collate(buffer: Any, data: Any) -> Any:
    """``data`` through the buffer's collate function, as TorchRL's ``sample`` passes it."""
    return buffer._collate_fn(data)


def is_consuming(buffer: Any) -> bool:
    """Whether the buffer removes what it samples (a consuming sampler)."""
    return buffer._is_consuming()


def generator(component: Any) -> torch.Generator | None:
    """The ``torch.Generator`` a buffer's ``set_rng`` gave a sampler, storage or writer (``_rng``)."""
    return getattr(component, "_rng", None)


def set_generator(component: Any, rng: torch.Generator | None) -> None:
    """Gives a sampler, storage or writer the generator ``set_rng`` would give it."""
    component._rng = rng


def set_remaining_batches(sampler: Any, count: int) -> None:
    """Tells TorchRL's prefetcher how many batches are left in the sampler's epoch
    (``_remaining_batches``, which it caps its queue with)."""
    sampler._remaining_batches = count


def ray_client(buffer: Any) -> Any:
    """The client through which a TorchRL ``RayReplayBuffer`` calls its actor (``_client``)."""
    return buffer._client


def write_count(writer: Any) -> int:
    """How many items a ``RoundRobinWriter`` has written (its ``_write_count``)."""
    return writer._write_count


def writer_storage(writer: Any) -> Any:
    """The storage a TorchRL writer writes to (its ``_storage``; ``None`` before registration)."""
    return getattr(writer, "_storage", None)


def mark_updated(writer: Any, index: torch.Tensor) -> None:
    """Tells the entities attached to ``writer``'s storage that rows ``index`` were written."""
    writer._mark_update_entities(index)


def last_written(storage: Any) -> Any:
    """The storage's last written row as TorchRL records it (``None`` before a write)."""
    last = getattr(storage, "_last_cursor_index", None)
    if last is None and getattr(storage, "_last_cursor", None) is not None:
        # A cursor recorded without its shared index (a storage from a pickle): derive it.
        storage._set_last_cursor(storage._last_cursor)
        last = storage._last_cursor_index
    return last


def set_last_written(storage: Any, cursor: Any, *, cursor_as_written: Any = None) -> None:
    """Records ``cursor`` as the storage's last written row(s); ``cursor_as_written``: the
    index the rows were written at, kept as TorchRL's ``set`` keeps it (its ``_last_cursor``),
    where ``cursor`` is only the last of them."""
    storage._set_last_cursor(cursor)
    if cursor_as_written is not None:
        storage._last_cursor = cursor_as_written


def set_last_cursor_copied(storage: Any, cursor: Any) -> None:
    """TorchRL's ``_set_last_cursor`` (a :data:`HOOKS` override of it), keeping a copy of the
    last row a ``compilable=True`` storage records: TorchRL keeps ``cursor[-1]``, a view into
    the caller's index (the tensor ``extend`` returned), and its next int cursor ``fill_``s
    that view, rewriting the caller's tensor."""
    _Storage._set_last_cursor(storage, cursor)
    last = storage._last_cursor_index_value
    if isinstance(last, torch.Tensor):
        storage._last_cursor_index_value = last.clone()


def filled_rows(storage: Any) -> int:
    """Rows along dim 0 of a ``TensorStorage`` that hold data."""
    return int(storage._len_along_dim0)


def set_length(storage: Any, length: int) -> None:
    """Sets a ``TensorStorage``'s count of stored items (after a load)."""
    storage._len = length


def mutation_revision(storage: Any) -> Any:
    """A counter TorchRL bumps on every write to the storage (an int or a tensor); ``None`` for
    storages without one."""
    return getattr(storage, "_mutation_revision", None)


def writer_state(writer: Any) -> dict[str, Any]:
    """The cursor and write count a TorchRL writer moves before its storage sees the data
    (whichever of the two it has), for :func:`restore_writer_state`."""
    return {name: getattr(writer, name) for name in ("_cursor", "_write_count") if hasattr(writer, name)}


def restore_writer_state(writer: Any, state: dict[str, Any]) -> None:
    """Puts back what :func:`writer_state` saved."""
    for name, value in state.items():
        setattr(writer, name, value)


def bump_mutation_revision(storage: Any) -> None:
    """Bumps the storage's write counter, as TorchRL's own storages do on every write."""
    storage._bump_mutation_revision()


def attached_entities(storage: Any) -> Iterable[Any]:
    """The buffers attached to ``storage`` (told about its writes)."""
    return storage._attached_entities_iter()


def checkpointer_hooks(checkpointer: Any) -> tuple[list[Callable], list[Callable]]:
    """``(save_hooks, load_hooks)`` registered on a storage checkpointer."""
    return checkpointer._save_hooks, checkpointer._load_hooks


_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)


def unchecked_tensordict(entries: dict[Any, torch.Tensor], batch_size: torch.Size, device: Any) -> TensorDict:
    """``TensorDict(entries, batch_size, device)`` (nested keys as tuples) through the constructor
    TensorDict's own ops use, which skips re-checking every leaf's batch dims and device: the
    caller guarantees both. Falls back to the checked constructor where it is gone."""
    if _NEW_UNSAFE is None:
        return TensorDict(entries, batch_size=batch_size, device=device)
    root: dict[str, Any] = {}
    for key, value in entries.items():
        node = root
        if isinstance(key, tuple):
            for part in key[:-1]:
                node = node.setdefault(part, {})
            key = key[-1]
        node[key] = value
    return _NEW_UNSAFE(source=root, batch_size=batch_size, device=device)


#: ``(TorchRL class, private method)``: the private methods TorchRL calls that torchrl_ext overrides.
HOOKS: tuple[tuple[type, str], ...] = (
    (_ReplayBuffer, "_dump_prefetch_state"),  # the extra state saved with the same lock held
    (_ReplayBuffer, "_transpose"),  # a [T] rollout from one env
    (_TensorDictReplayBuffer, "_sample"),  # the buffer's one-layer sample
    (_TensorDictReplayBuffer, "_set_index_in_td"),  # "index" of ndim >= 2 storages
    (_TensorDictReplayBuffer, "_get_priority_vector"),  # priorities checked before the reduction
    (_TensorDictReplayBuffer, "_get_priority_item"),
    (_Sampler, "_empty"),
    (_PrioritizedSampler, "_empty"),
    (_PrioritizedSampler, "_init"),
    (_PrioritizedSampler, "_max_priority"),
    (_PrioritizedSampler, "_retransform_priority_trees"),
    (_Writer, "_empty"),
    (_Storage, "_empty"),
    (_LazyTensorStorage, "_init"),  # the fast storages' log line names them
    (_LazyMemmapStorage, "_init"),
    (_Storage, "_default_checkpointer"),
    (_Storage, "_is_full"),
    (_Storage, "_set_last_cursor"),  # the fast storages keep no view of a caller's cursor
    (_Storage, "_rand_given_ndim"),  # RandomSampler's draws on the per-env rings
    (_GAE, "_broadcast_optional"),  # per-agent values with team-level signals
    (_GAE, "_normalize_advantage"),
    (_GAE, "_prepare_signals"),
)


# ---------------------------------------------------------------- readiness, sample counters and names
# Later TorchRL releases wake waiters (``wait_until_sampleable``, ``sample(wait=True)``) through a
# readiness condition, count samples and name the sampled dims; 0.14.1 has none of these. Each
# helper below finds out by looking for the name and does nothing where it is absent.
_NO_CONDITION = contextlib.nullcontext()

#: TorchRL's defaults for the waiting keywords of its later ``sample``.
SAMPLE_WAIT_DEFAULTS: dict[str, Any] = {"wait": False, "timeout": None, "cancel_event": None}


def readiness_condition(buffer: Any) -> Any:
    """The condition a TorchRL buffer notifies after each write (``_readiness_condition``; reentrant),
    or a null context where it has none.

    ``wait_until_sampleable`` takes it before the replay lock, so a caller holding the replay lock
    around TorchRL's ``extend``/``add`` (which notify) must take it first, or the two deadlock."""
    condition = getattr(buffer, "_readiness_condition", None)
    return _NO_CONDITION if condition is None else condition


def notify_state_change(buffer: Any) -> None:
    """Wakes the buffer's waiters after a write made without TorchRL's ``extend``/``add``
    (``_notify_replay_state_change``); nothing where the buffer has no waiters to wake."""
    notify = getattr(buffer, "_notify_replay_state_change", None)
    if notify is not None:
        notify()


@functools.cache
def sample_wait_keywords() -> frozenset[str]:
    """The waiting keywords (``wait``, ``timeout``, ``cancel_event``) TorchRL's
    ``TensorDictReplayBuffer.sample`` accepts: none on 0.14.1."""
    parameters = inspect.signature(_TensorDictReplayBuffer.sample).parameters
    return frozenset(name for name in SAMPLE_WAIT_DEFAULTS if name in parameters)


def sample_wait_arguments(**given: Any) -> dict[str, Any]:
    """The waiting keywords of a ``sample`` call that differ from TorchRL's defaults, for
    TorchRL's ``sample`` to honour; empty when the call does not wait.

    Raises:
        TypeError: for a non-default value where TorchRL's ``sample`` has no such keyword
            (it would be ignored otherwise).
    """
    # wait=False and None (no limit, no event) are what TorchRL's sample does without them.
    changed = {name: value for name, value in given.items()
               if (bool(value) if name == "wait" else value is not None)}
    for name, value in changed.items():
        if name not in sample_wait_keywords():
            raise TypeError(
                f"sample() got {name}={value!r}, but this TorchRL's sample has no {name!r} keyword "
                f"(later releases add it); leave {name} at its default {SAMPLE_WAIT_DEFAULTS[name]!r}, "
                "or upgrade TorchRL to wait for data inside sample."
            )
    return changed


def sampled_item_count(index: Any, storage_ndim: int) -> int:
    """How many records a sample of ``index`` returns, as TorchRL's ``sample`` counts them
    (one per row of coordinates on a multi-dim storage)."""
    if isinstance(index, tuple):
        return torch.as_tensor(index[0]).numel()
    index = torch.as_tensor(index)
    if storage_ndim > 1 and index.ndim > 1 and index.shape[-1] == storage_ndim:
        return index[..., 0].numel()
    return index.numel()


def count_sample(buffer: Any, index: Any) -> None:
    """Adds one call and its records to the buffer's sample counters (``stats()``'s
    ``sample_calls``/``samples_returned``), as TorchRL's ``sample`` does after ``_sample``;
    nothing where the buffer keeps no counters. Call it with the buffer's locks released."""
    increment = getattr(buffer, "_increment_counter", None)
    if increment is None or not hasattr(buffer, "_sample_call_count_value"):
        return
    increment("_sample_call_count_value", 1)
    increment("_sampled_item_count_value", sampled_item_count(index, getattr(buffer.storage, "ndim", 1)))


def set_sample_names(sampler: Any, data: Any) -> Any:
    """``data`` with the dim names the sampler gives its batches (``_set_sample_names``: a
    ``SliceSampler(output_layout="batch_time")`` names the last dim ``"time"``), as TorchRL's
    ``_sample`` applies them before the transform; ``data`` as is where samplers name nothing."""
    name = getattr(sampler, "_set_sample_names", None)
    return data if name is None else name(data)


def validate_recurrent_inputs(estimator: Any, tensordict: TensorDictBase, time_dim: int | None) -> None:
    """The input checks TorchRL's ``GAE.forward`` runs for a ``GAE.for_recurrent`` estimator
    (``_validate_recurrent_inputs``: time last, ``is_init`` and the state keys present); nothing
    where TorchRL has no such checks (0.14.1)."""
    check = getattr(estimator, "_validate_recurrent_inputs", None)
    if check is not None:
        check(tensordict, time_dim)
