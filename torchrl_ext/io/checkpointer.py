"""Storage checkpoints as a ``<prefix>metadata.json`` + ``<prefix>state.safetensors`` pair.

:class:`SafetensorsCheckpointer` plugs into TorchRL's checkpointing
(``ReplayBuffer(storage=..., checkpointer=...)`` or ``storage.checkpointer =
...``; then ``rb.dumps(path)`` / ``rb.loads(path)``, which save the storage
under ``path/storage``). Tensors are stored whole (all ``capacity`` rows) under
their nested key joined by dots (``("next", "obs")`` -> ``"next.obs"``); the
JSON holds the capacity, size, ring position, device, key map and the batch
sizes of sub-TensorDicts with batch dims of their own (multi-agent groups).
Nothing is pickled.

The two files are written and replaced atomically as a pair
(:mod:`torchrl_ext.io.checkpoint_pair`): a save never leaves the previous checkpoint
unloadable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase

from torchrl_ext import _compat
from torchrl_ext.io.checkpoint_pair import CheckpointPair, check_prefix, read_pair, write_pair
from torchrl_ext.io.state_files import nested_batch, set_nested_batch

__all__ = ["SafetensorsCheckpointer", "restore_storage", "ring_fields", "storage_position"]

FORMAT = "torchrl_ext.safetensors_storage"


def restore_storage(storage: Any, data: TensorDictBase, size: int, position: int, source: str) -> None:
    """Puts ``data`` (``[capacity]`` rows) into a 1-D TorchRL tensor storage with its length and cursor.

    An uninitialised storage is built from ``data``; an initialised one must
    hold the same keys, item shapes and dtypes and is written in place.
    """
    capacity = data.shape[0]
    _check_tensor_storage(storage)
    if storage.max_size != capacity:
        raise ValueError(
            f"{source} holds a buffer of capacity {capacity} but the storage has max_size="
            f"{storage.max_size}; build the storage with max_size={capacity}."
        )
    if not storage.initialized:
        _compat.allocate_like(storage, data[0])
    else:
        expected = _layout(_compat.stored_data(storage))
        got = _layout(data)
        if expected != got:
            raise ValueError(
                f"{source} does not fit the initialised storage: stored (key: shape, dtype) "
                f"{_describe(expected)}, file {_describe(got)}. Load into a fresh storage "
                f"(e.g. a new buffer) instead."
            )
    device = _compat.stored_data(storage).device
    _compat.stored_data(storage).update_(data if device is None else data.to(device))
    _compat.set_length(storage, size)
    _compat.set_last_written(storage, None if size == 0 else (position - 1) % capacity)
    _compat.bump_mutation_revision(storage)


def storage_position(storage: Any) -> int:
    """The next ring slot the storage will be written at (velora's ``position``)."""
    last = _compat.last_written(storage)
    if last is None:  # never written through ``set``: a ring filled from 0
        return len(storage) % storage.max_size
    return (int(last) + 1) % storage.max_size


class SafetensorsCheckpointer(StorageCheckpointerBase):
    """TorchRL storage checkpointer writing an atomic safetensors + JSON pair.

    Works with 1-D TensorDict storages (``LazyTensorStorage``,
    :class:`~torchrl_ext.storages.FastTensorStorage`, memmap variants); the module
    docstring gives the files and their crash guarantee.

    Args:
        prefix: start of both file names; may contain dots (``"run.v1_"``) but
            no path separator.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.io import SafetensorsCheckpointer
        >>> from torchrl_ext.replay_buffers import TensorDictReplayBuffer
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> def make():
        ...     return TensorDictReplayBuffer(storage=FastTensorStorage(4),
        ...                                   checkpointer=SafetensorsCheckpointer("run.v1_"))
        >>> rb = make()
        >>> for start in (0, 3):
        ...     _ = rb.extend(TensorDict({"obs": torch.arange(start, start + 3.0),
        ...                               ("next", "obs"): torch.ones(3)}, [3]))
        >>> folder = tempfile.mkdtemp()
        >>> rb.dumps(folder)
        >>> sorted(p.name for p in (Path(folder) / "storage").iterdir())
        ['run.v1_metadata.json', 'run.v1_state.safetensors']
        >>> restored = make()
        >>> restored.loads(folder)
        >>> restored.storage.get(torch.arange(4))["obs"].tolist(), len(restored)
        ([4.0, 5.0, 2.0, 3.0], 4)
    """

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = check_prefix(prefix)

    def pair(self, path: str | Path) -> CheckpointPair:
        """The two files this checkpointer uses in folder ``path``."""
        return CheckpointPair(path, self.prefix)

    def dumps(self, storage: Any, path: str | Path) -> None:
        """Writes ``storage`` atomically to ``path`` (created if needed)."""
        if _compat.checkpointer_hooks(self)[0]:
            raise ValueError(f"{type(self).__name__} does not run save hooks; remove them.")
        _check_tensor_storage(storage)
        if not storage.initialized:
            raise RuntimeError("Cannot save a non-initialized storage: write data to it first.")
        tensors, metadata = self.encode(storage)
        write_pair(self.pair(path), tensors, json.dumps(metadata, indent=2))

    def loads(self, storage: Any, path: str | Path) -> None:
        """Reads the pair at ``path`` into ``storage`` (contents, length, cursor)."""
        if _compat.checkpointer_hooks(self)[1]:
            raise ValueError(f"{type(self).__name__} does not run load hooks; remove them.")
        pair = self.pair(path)
        metadata, tensors, _ = read_pair(pair)
        data, size, position = self.decode(metadata, tensors, pair, storage)
        restore_storage(storage, data, size, position, f"{pair.state}")

    # -- format: subclasses override these two ----------------------------------------
    def encode(self, storage: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, metadata)`` describing an initialised storage."""
        names: dict[str, list[str]] = {}
        tensors: dict[str, torch.Tensor] = {}
        stored = _compat.stored_data(storage)
        for key, tensor in stored.items(include_nested=True, leaves_only=True):
            key = (key,) if isinstance(key, str) else tuple(key)
            name = ".".join(key)
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(
                    f"key {key!r} holds {type(tensor).__name__}, not a tensor; safetensors "
                    f"stores tensors only: drop it before extending (data.exclude(...))."
                )
            if name in names:
                raise ValueError(
                    f"keys {tuple(names[name])!r} and {key!r} both map to the tensor name "
                    f"{name!r}; rename one (no dots inside key parts)."
                )
            names[name] = list(key)
            tensors[name] = tensor.detach().as_subclass(torch.Tensor).cpu().contiguous()  # no memmap subclass
        metadata = {
            "format": FORMAT,
            "version": 1,
            "capacity": storage.max_size,
            "size": len(storage),
            "position": storage_position(storage),
            "device": None if storage.device is None else str(storage.device),
            "keys": names,
            "nested_batch": nested_batch(stored),
        }
        return tensors, metadata

    def decode(
        self, metadata: dict[str, Any], tensors: dict[str, torch.Tensor], pair: CheckpointPair, storage: Any
    ) -> tuple[TensorDict, int, int]:
        """``(data, size, position)`` from what :meth:`encode` wrote."""
        if metadata.get("format") != FORMAT:
            raise ValueError(
                f"{pair.metadata} is not a {FORMAT} file (format={metadata.get('format')!r}); "
                f"velora files load with VeloraCheckpointer."
            )
        capacity, size, position = ring_fields(metadata, pair)
        names = metadata.get("keys")
        if not isinstance(names, dict) or set(names) != set(tensors):
            raise ValueError(
                f"{pair.metadata} lists tensors {sorted(names or {})} but {pair.state} holds "
                f"{sorted(tensors)}: the files come from different saves."
            )
        for name, tensor in tensors.items():
            if tensor.ndim == 0 or tensor.shape[0] != capacity:
                raise ValueError(
                    f"{pair.state}: tensor {name!r} has shape {list(tensor.shape)} but "
                    f"{pair.metadata} says capacity={capacity}; the files come from different saves."
                )
        data = TensorDict({tuple(names[n]): t for n, t in tensors.items()}, batch_size=[capacity])
        try:  # files saved before "nested_batch" was recorded load as they did: leaves only
            set_nested_batch(data, metadata.get("nested_batch", []))
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"{pair.metadata}: 'nested_batch' does not fit the tensors in {pair.state} ({err}); "
                "the files come from different saves."
            ) from err
        return data, size, position


def ring_fields(metadata: dict[str, Any], pair: CheckpointPair) -> tuple[int, int, int]:
    """Validated ``(capacity, size, position)`` of a ring buffer's metadata."""
    values = []
    for field in ("capacity", "size", "position"):
        value = metadata.get(field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{pair.metadata}: {field!r} must be an int, got {value!r}.")
        values.append(value)
    capacity, size, position = values
    if capacity < 1 or not 0 <= size <= capacity or not 0 <= position < capacity:
        raise ValueError(
            f"{pair.metadata}: need capacity >= 1, 0 <= size <= capacity and 0 <= position < "
            f"capacity, got capacity={capacity}, size={size}, position={position}."
        )
    if size < capacity and position != size:
        raise ValueError(
            f"{pair.metadata}: a ring that is not full has position == size, got size={size}, "
            f"position={position}; the file was edited or comes from another writer."
        )
    return capacity, size, position


def _check_tensor_storage(storage: Any) -> None:
    if getattr(storage, "ndim", None) != 1 or not isinstance(storage, TensorStorage):
        raise ValueError(
            f"{type(storage).__name__} is not supported: the safetensors checkpointers need a "
            f"1-D tensor storage (LazyTensorStorage, FastTensorStorage, LazyMemmapStorage)."
        )
    if storage.initialized and not isinstance(_compat.stored_data(storage), TensorDictBase):
        raise ValueError(
            "the storage holds a plain tensor/pytree; store TensorDicts to use this checkpointer."
        )


def _layout(data: TensorDictBase) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    return {
        key: (tuple(t.shape), t.dtype) for key, t in data.items(include_nested=True, leaves_only=True)
    }


def _describe(layout: dict[Any, tuple[tuple[int, ...], torch.dtype]]) -> str:
    return "{" + ", ".join(f"{k!r}: {list(s)} {d}" for k, (s, d) in sorted(layout.items(), key=str)) + "}"
