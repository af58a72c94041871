"""Storage checkpoints as a ``<prefix>metadata.json`` + ``<prefix>state.safetensors`` pair.

:class:`SafetensorsCheckpointer` plugs into TorchRL's checkpointing
(``ReplayBuffer(storage=..., checkpointer=...)`` or ``storage.checkpointer =
...``; then ``rb.dumps(path)`` / ``rb.loads(path)``, which save the storage
under ``path/storage``). Tensors are stored whole (all ``capacity`` rows) under
their nested key joined by dots (``("next", "obs")`` -> ``"next.obs"``); the
JSON holds the capacity, size, ring position, device and key map. Nothing is
pickled.

Atomicity guarantee: a save never leaves the previous checkpoint unloadable.
Both files are first written to hidden temporary files in the same folder
(``.<prefix>state.safetensors.tmp``, ``.<prefix>metadata.json.tmp``) and
fsynced, then the state replaces the old state and the metadata replaces the
old metadata (``os.replace``, with a folder fsync around each step). The
state's safetensors header records the SHA-256 of the metadata text it belongs
to, so a loader can tell whether the pair matches: if a save was killed between
the two renames, the complete pending metadata is still on disk and the loader
rolls forward to the new checkpoint (the next save also finishes that commit
first); any other mismatch raises a ``ValueError`` that names both files. A
crash before the first rename leaves the old pair untouched. Files without the
checksum (written by other programs, e.g. velora) load unverified. Two
processes saving to the same folder and prefix at once are not supported.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase

from torchrl_ext.io.state_files import fsync_dir, fsync_file

__all__ = [
    "CheckpointPair",
    "SafetensorsCheckpointer",
    "check_prefix",
    "read_pair",
    "restore_storage",
    "ring_fields",
    "storage_position",
    "write_pair",
]

DIGEST_KEY = "torchrl_ext.metadata_sha256"
FORMAT = "torchrl_ext.safetensors_storage"


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a plain file-name prefix, else a ``ValueError`` naming the fix."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str such as 'buffer_', got prefix={prefix!r}.")
    separators = {"/", os.sep, os.altsep} - {None}
    if any(sep in prefix for sep in separators) or "\0" in prefix or prefix in (".", ".."):
        raise ValueError(
            f"prefix={prefix!r} contains a path separator: the prefix only starts the file "
            f"names (e.g. 'run.v1_' -> run.v1_metadata.json); put folders in the path "
            f"argument instead, e.g. save('ckpt/run1', prefix='buffer_')."
        )
    return prefix


@dataclass(frozen=True)
class CheckpointPair:
    """The file names of one checkpoint: ``directory/<prefix>{metadata.json,state.safetensors}``.

    Examples:
        >>> CheckpointPair("ckpt", "run.v1_").metadata.name
        'run.v1_metadata.json'
        >>> CheckpointPair("ckpt", "run.v1_").pending_state.name
        '.run.v1_state.safetensors.tmp'
    """

    directory: Path
    prefix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        check_prefix(self.prefix)

    @property
    def metadata(self) -> Path:
        return self.directory / f"{self.prefix}metadata.json"

    @property
    def state(self) -> Path:
        return self.directory / f"{self.prefix}state.safetensors"

    @property
    def pending_metadata(self) -> Path:
        return self.directory / f".{self.metadata.name}.tmp"

    @property
    def pending_state(self) -> Path:
        return self.directory / f".{self.state.name}.tmp"


def write_pair(pair: CheckpointPair, tensors: dict[str, torch.Tensor], metadata_text: str) -> None:
    """Replaces ``pair`` with ``tensors`` + ``metadata_text``; see the module docstring.

    Examples:
        >>> import tempfile, torch
        >>> pair = CheckpointPair(tempfile.mkdtemp(), "demo_")
        >>> write_pair(pair, {"x": torch.arange(3.0)}, '{"n": 3}')
        >>> meta, tensors, verified = read_pair(pair)
        >>> meta, tensors["x"].tolist(), verified
        ({'n': 3}, [0.0, 1.0, 2.0], True)
    """
    pair.directory.mkdir(parents=True, exist_ok=True)
    _finish_pending_commit(pair)
    body = metadata_text.encode("utf-8")
    try:
        save_file(tensors, pair.pending_state, metadata={DIGEST_KEY: _sha256(body)})
        fsync_file(pair.pending_state)
        with open(pair.pending_metadata, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(pair.directory)
    except BaseException:
        pair.pending_state.unlink(missing_ok=True)
        pair.pending_metadata.unlink(missing_ok=True)
        raise
    os.replace(pair.pending_state, pair.state)
    fsync_dir(pair.directory)
    os.replace(pair.pending_metadata, pair.metadata)
    fsync_dir(pair.directory)


def read_pair(
    pair: CheckpointPair, *, load_tensors: bool = True
) -> tuple[dict[str, Any], dict[str, torch.Tensor], bool]:
    """``(metadata, tensors, verified)`` of a checkpoint written by :func:`write_pair` or others.

    ``verified`` is ``False`` for files without the metadata checksum (e.g.
    velora's). An interrupted save is rolled forward in memory (files are not
    touched). ``load_tensors=False`` returns an empty tensor dict.

    Raises:
        FileNotFoundError: a file is missing (the message lists the prefixes
            found in the folder).
        ValueError: unreadable files, or a metadata file that belongs to
            another save.
    """
    if not pair.state.is_file():
        raise FileNotFoundError(_missing_message(pair, pair.state))
    digest, tensors = _read_state(pair.state, load_tensors)
    body = pair.metadata.read_bytes() if pair.metadata.is_file() else None
    verified = digest is not None
    if digest is not None and (body is None or _sha256(body) != digest):
        pending = pair.pending_metadata.read_bytes() if pair.pending_metadata.is_file() else None
        if pending is not None and _sha256(pending) == digest:
            body = pending  # killed between the two renames: the new checkpoint is complete
        elif body is None:
            raise FileNotFoundError(_missing_message(pair, pair.metadata))
        else:
            raise ValueError(
                f"{pair.metadata} does not belong to {pair.state} (the state records another "
                f"metadata checksum): the two files come from different saves. Restore both "
                f"from the same save, or save again."
            )
    if body is None:
        raise FileNotFoundError(_missing_message(pair, pair.metadata))
    try:
        metadata = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{pair.metadata} is not valid JSON ({err}); restore it from a backup.") from err
    if not isinstance(metadata, dict):
        raise ValueError(f"{pair.metadata} must hold a JSON object, got {type(metadata).__name__}.")
    return metadata, tensors, verified


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
        storage._init(data[0])
    else:
        expected = _layout(storage._storage)
        got = _layout(data)
        if expected != got:
            raise ValueError(
                f"{source} does not fit the initialised storage: stored (key: shape, dtype) "
                f"{_describe(expected)}, file {_describe(got)}. Load into a fresh storage "
                f"(e.g. a new buffer) instead."
            )
    device = storage._storage.device
    storage._storage.update_(data if device is None else data.to(device))
    storage._len = size
    storage._set_last_cursor(None if size == 0 else (position - 1) % capacity)
    storage._bump_mutation_revision()


def storage_position(storage: Any) -> int:
    """The next ring slot the storage will be written at (velora's ``position``)."""
    last = getattr(storage, "_last_cursor_index", None)
    if last is None and getattr(storage, "_last_cursor", None) is not None:
        storage._set_last_cursor(storage._last_cursor)
        last = storage._last_cursor_index
    if last is None:  # never written through ``set``: a ring filled from 0
        return len(storage) % storage.max_size
    return (int(last) + 1) % storage.max_size


class SafetensorsCheckpointer(StorageCheckpointerBase):
    """TorchRL storage checkpointer writing an atomic safetensors + JSON pair.

    Works with 1-D TensorDict storages (``LazyTensorStorage``,
    :class:`~torchrl_ext.storages.FastTensorStorage`, memmap variants). Files
    are ``<path>/<prefix>state.safetensors`` and ``<path>/<prefix>metadata.json``;
    the module docstring gives the crash guarantee.

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
        return CheckpointPair(Path(path), self.prefix)

    def dumps(self, storage: Any, path: str | Path) -> None:
        """Writes ``storage`` atomically to ``path`` (created if needed)."""
        if self._save_hooks:
            raise ValueError(f"{type(self).__name__} does not run save hooks; remove them.")
        _check_tensor_storage(storage)
        if not storage.initialized:
            raise RuntimeError("Cannot save a non-initialized storage: write data to it first.")
        tensors, metadata = self.encode(storage)
        write_pair(self.pair(path), tensors, json.dumps(metadata, indent=2))

    def loads(self, storage: Any, path: str | Path) -> None:
        """Reads the pair at ``path`` into ``storage`` (contents, length, cursor)."""
        if self._load_hooks:
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
        for key, tensor in storage._storage.items(include_nested=True, leaves_only=True):
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
            tensors[name] = _plain(tensor)
        metadata = {
            "format": FORMAT,
            "version": 1,
            "capacity": storage.max_size,
            "size": len(storage),
            "position": storage_position(storage),
            "device": None if storage.device is None else str(storage.device),
            "keys": names,
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
    if getattr(storage, "ndim", None) != 1 or not hasattr(storage, "_init"):
        raise ValueError(
            f"{type(storage).__name__} is not supported: the safetensors checkpointers need a "
            f"1-D tensor storage (LazyTensorStorage, FastTensorStorage, LazyMemmapStorage)."
        )
    if storage.initialized and not isinstance(storage._storage, TensorDictBase):
        raise ValueError(
            "the storage holds a plain tensor/pytree; store TensorDicts to use this checkpointer."
        )


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU ``torch.Tensor`` (no memmap subclass) safetensors can write."""
    tensor = tensor.detach()
    if type(tensor) is not torch.Tensor:
        tensor = tensor.as_subclass(torch.Tensor)
    return tensor.cpu().contiguous()


def _layout(data: TensorDictBase) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    return {
        key: (tuple(t.shape), t.dtype) for key, t in data.items(include_nested=True, leaves_only=True)
    }


def _describe(layout: dict[Any, tuple[tuple[int, ...], torch.dtype]]) -> str:
    return "{" + ", ".join(f"{k!r}: {list(s)} {d}" for k, (s, d) in sorted(layout.items(), key=str)) + "}"


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _read_state(path: Path, load_tensors: bool) -> tuple[str | None, dict[str, torch.Tensor]]:
    """The recorded metadata checksum and (optionally) the tensors, from one open of the file."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            digest = (handle.metadata() or {}).get(DIGEST_KEY)
            tensors = {name: handle.get_tensor(name) for name in handle.keys()} if load_tensors else {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}).") from err
    return digest, tensors


def _finish_pending_commit(pair: CheckpointPair) -> None:
    """Completes a save killed between its two renames, so its recovery file is not lost."""
    if not (pair.state.is_file() and pair.pending_metadata.is_file()):
        return
    try:
        digest, _ = _read_state(pair.state, load_tensors=False)
    except ValueError:
        return
    current = pair.metadata.read_bytes() if pair.metadata.is_file() else None
    if digest is None or (current is not None and _sha256(current) == digest):
        return
    if _sha256(pair.pending_metadata.read_bytes()) == digest:
        os.replace(pair.pending_metadata, pair.metadata)
        fsync_dir(pair.directory)


def _missing_message(pair: CheckpointPair, missing: Path) -> str:
    found = sorted(p.name[: -len("metadata.json")] for p in pair.directory.glob("*metadata.json"))
    hint = f" Prefixes found there: {found}." if found else ""
    return (
        f"checkpoint file {missing} not found (prefix={pair.prefix!r}).{hint} Pass the folder "
        f"given to save and the same prefix."
    )
