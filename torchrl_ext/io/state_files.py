"""Component state as files: tensors in safetensors, everything else in JSON.

A ``state_dict`` (nested dicts of numbers, strings and lists of tensors)
becomes two files: the tensors in a safetensors file, named by their path in
the state (``_sum_tree.levels.0``), and the rest as JSON with a marker where
each list of tensors was. Nothing is pickled, and both files are written
atomically (temporary file, fsync, rename), so an interrupted save leaves the
previous files intact.

Every byte is checksummed: the safetensors header records the SHA-256 of the JSON
text and of the tensors (names, dtypes, shapes and bytes, :func:`tensors_digest`), so
a load refuses a damaged or mismatched pair with a ``ValueError`` that names the file,
before any component state changes (:func:`load_component`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase

__all__ = [
    "METADATA_DIGEST_KEY",
    "NoState",
    "StateFiles",
    "StateFilesCheckpointer",
    "TENSORS_DIGEST_KEY",
    "apply_state",
    "atomic_write",
    "load_component",
    "load_json",
    "load_state",
    "nested_batch",
    "save_state",
    "set_nested_batch",
    "sha256",
    "tensordict_from_state",
    "tensordict_state",
    "tensors_digest",
]

#: Safetensors header keys: the SHA-256 of the JSON text the tensors belong to, and of the tensors.
METADATA_DIGEST_KEY = "torchrl_ext.metadata_sha256"
TENSORS_DIGEST_KEY = "torchrl_ext.tensors_sha256"


def save_state(
    directory: str | Path, state: dict[str, Any], *, tensors_file: str, metadata_file: str
) -> None:
    """Writes ``state`` as ``directory/tensors_file`` + ``directory/metadata_file``.

    Examples:
        >>> import tempfile, torch
        >>> from torchrl_ext.io.state_files import load_state, save_state
        >>> folder = tempfile.mkdtemp()
        >>> save_state(folder, {"step": 3, "levels": [torch.ones(2)]},
        ...            tensors_file="t.safetensors", metadata_file="m.json")
        >>> load_state(folder, tensors_file="t.safetensors", metadata_file="m.json")
        {'step': 3, 'levels': [tensor([1., 1.])]}
    """
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    text = json.dumps(_split_tensors(state, (), tensors)).encode("utf-8")
    digests = {METADATA_DIGEST_KEY: sha256(text), TENSORS_DIGEST_KEY: tensors_digest(tensors)}
    atomic_write(directory / tensors_file, lambda tmp: save_file(tensors, tmp, metadata=digests))
    atomic_write(directory / metadata_file, lambda tmp: Path(tmp).write_bytes(text))


def load_state(directory: str | Path, *, tensors_file: str, metadata_file: str) -> dict[str, Any]:
    """Reads back what :func:`save_state` wrote, after checking both files' checksums.

    Files written before checksums were recorded load unverified.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a file is damaged, or the two files come from different saves; the
            message names the file.
    """
    directory = Path(directory).absolute()
    metadata_path, tensors_path = directory / metadata_file, directory / tensors_file
    for path in (metadata_path, tensors_path):
        if not path.is_file():
            raise FileNotFoundError(f"state file {path} not found; pass the folder given to dumps().")
    text = metadata_path.read_bytes()
    header, tensors = read_safetensors(tensors_path)
    recorded = header.get(METADATA_DIGEST_KEY)
    if recorded is not None and recorded != sha256(text):
        raise ValueError(
            f"{metadata_path} does not match the checksum recorded in {tensors_path}: it is "
            "damaged or comes from another save. Restore both files from the same save."
        )
    verify_tensors(tensors_path, header, tensors)
    try:
        return _join_tensors(json.loads(text.decode("utf-8")), tensors)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{metadata_path} is not a state written by torchrl_ext's save_state ({err!r}); "
            "restore it from the same save as the tensors."
        ) from err


def load_component(component: Any, directory: str | Path, *, tensors_file: str, metadata_file: str) -> None:
    """:func:`apply_state` of :func:`load_state`: the files are checked first, then the state
    is applied all or nothing (another configuration or an older format raises a ``ValueError``)."""
    state = load_state(directory, tensors_file=tensors_file, metadata_file=metadata_file)
    apply_state(component, state, Path(directory).absolute() / metadata_file)


class StateFiles:
    """Mixin: ``dumps`` / ``loads`` of ``state_dict()`` as the class's ``state_files``
    (tensors file, metadata file), through :func:`save_state` / :func:`load_component`."""

    state_files: tuple[str, str]

    def dumps(self, path: str | Path) -> None:
        """Writes the state under ``path``; each file atomically (see :func:`save_state`)."""
        tensors, metadata = self.state_files
        save_state(path, self.state_dict(), tensors_file=tensors, metadata_file=metadata)

    def loads(self, path: str | Path) -> None:
        """Restores what :meth:`dumps` wrote, all or nothing (:func:`load_component`)."""
        tensors, metadata = self.state_files
        load_component(self, path, tensors_file=tensors, metadata_file=metadata)


class StateFilesCheckpointer(StorageCheckpointerBase):
    """TorchRL storage checkpointer: the storage's ``state_dict()`` as the class's ``state_files``
    (tensors file, metadata file), through :func:`save_state` / :func:`load_component`."""

    state_files: tuple[str, str]

    def dumps(self, storage: Any, path: str | Path) -> None:
        tensors, metadata = self.state_files
        save_state(path, storage.state_dict(), tensors_file=tensors, metadata_file=metadata)

    def loads(self, storage: Any, path: str | Path) -> None:
        tensors, metadata = self.state_files
        load_component(storage, path, tensors_file=tensors, metadata_file=metadata)


class NoState:
    """Mixin of a sampler or writer with no state of its own: nothing to save or load."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return

    def dumps(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def loads(self, path: str | Path) -> None:
        return


def load_json(path: str | Path) -> Any:
    """The JSON value in ``path``; ``FileNotFoundError`` / ``ValueError`` naming the file."""
    path = Path(path).absolute()
    if not path.is_file():
        raise FileNotFoundError(f"state file {path} not found; pass the folder given to dumps().")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it is damaged. Restore it from the same save.") from err


def apply_state(component: Any, state: Any, source: str | Path) -> None:
    """``component.load_state_dict(state)``, all or nothing: if it raises, the component gets
    its previous state back and a ``ValueError`` names ``source``, the file the state came from."""
    backup = component.state_dict()
    try:
        component.load_state_dict(state)
    except Exception as err:
        component.load_state_dict(backup)
        raise ValueError(
            f"{source} holds a state that this {type(component).__name__} cannot load: {err} "
            "It is unchanged; build it as the saved one was built."
        ) from err


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 over the tensors' names, dtypes, shapes and bytes, in name order.

    Examples:
        >>> import torch
        >>> tensors_digest({"a": torch.zeros(2)}) == tensors_digest({"a": torch.zeros(2)})
        True
        >>> tensors_digest({"a": torch.zeros(2)}) == tensors_digest({"a": torch.zeros(1, 2)})
        False
    """
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def read_safetensors(path: Path, *, load_tensors: bool = True) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """``(header metadata, tensors)`` of a safetensors file (no tensors with ``load_tensors=False``);
    ``ValueError`` naming it if unreadable."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()} if load_tensors else {}
            return dict(handle.metadata() or {}), tensors
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); it is damaged.") from err


def verify_tensors(path: Path, header: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    """Raises a ``ValueError`` naming ``path`` if ``tensors`` do not match the digest its header records."""
    recorded = header.get(TENSORS_DIGEST_KEY)
    if recorded is not None and recorded != tensors_digest(tensors):
        raise ValueError(
            f"{path}: the tensors do not match the checksum recorded with them; the file is "
            "damaged. Restore it from a backup, or save again."
        )


def atomic_write(target: Path, write: Callable[[str], Any]) -> None:
    """Writes through ``write(tmp_path)``, fsyncs, then renames over ``target``."""
    tmp = target.with_name(f".{target.name}.tmp")
    write(str(tmp))
    fsync_file(tmp)
    os.replace(tmp, target)


def fsync_file(path: str | Path) -> None:
    """Flushes a written file to disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(directory: str | Path) -> None:
    """Flushes a folder's entries (renames, new files) to disk."""
    if os.name == "nt":  # folders cannot be fsynced on Windows; renames are still atomic
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tensordict_state(data: TensorDictBase | None) -> dict[str, Any]:
    """A TensorDict as JSON-able keys, batch size and a list of cloned leaves (``None``: empty)."""
    if data is None:
        return {"batch": [], "keys": [], "leaves": []}
    keys = list(data.keys(include_nested=True, leaves_only=True))
    return {
        "batch": list(data.batch_size),
        "nested_batch": nested_batch(data),
        "keys": [list(key) if isinstance(key, tuple) else [key] for key in keys],
        # Contiguous clones: a leaf that is a view (the rings' transposed memory) is
        # copied once, in the order its shape says, which is how the files store it.
        "leaves": [data.get(key).clone(memory_format=torch.contiguous_format) for key in keys],
    }


def tensordict_from_state(state: dict[str, Any], device: torch.device) -> TensorDictBase | None:
    """Inverse of :func:`tensordict_state` (``None`` when it held no TensorDict), with leaves of
    its own: a storage that loads the same state twice, or whose caller reuses it, shares nothing."""
    if not state["keys"]:
        return None
    data = TensorDict(  # a one-part key ("obs",) is the key "obs" to TensorDict
        {tuple(key): leaf.to(device, copy=True) for key, leaf in zip(state["keys"], state["leaves"])},
        batch_size=state["batch"],
        device=device,
    )
    return set_nested_batch(data, state.get("nested_batch", []))


def nested_batch(data: TensorDictBase) -> list[list[Any]]:
    """``[key parts, batch size]`` of each sub-TensorDict with batch dims of its own
    (``("agents", ...)`` of ``[E, L, n_agents]``): a TensorDict rebuilt from its leaves lacks them."""
    return [
        [list(key) if isinstance(key, tuple) else [key], list(value.batch_size)]
        for key, value in data.items(include_nested=True)
        if isinstance(value, TensorDictBase) and value.batch_dims > data.batch_dims
    ]


def set_nested_batch(data: TensorDictBase, entries: list[list[Any]]) -> TensorDictBase:
    """Gives ``data``'s sub-TensorDicts the batch sizes :func:`nested_batch` recorded; returns ``data``."""
    for key, batch in sorted(entries, key=lambda entry: -len(entry[0])):  # children first
        data.get(tuple(key)).batch_size = batch
    return data


_TENSOR_LIST = "__tensor_list__"


def _split_tensors(state: Any, path: tuple[Any, ...], tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able copy of ``state`` with each list of tensors moved to ``tensors``."""
    if isinstance(state, dict):
        return {k: _split_tensors(v, (*path, k), tensors) for k, v in state.items()}
    if isinstance(state, list) and state and all(isinstance(t, torch.Tensor) for t in state):
        prefix = "".join(f"{part}." for part in path)
        names = [f"{prefix}{k}" for k in range(len(state))]
        clash = [name for name in names if name in tensors]
        if clash:  # names join key parts with dots: ("a.b",) and ("a", "b") would share tensors
            raise ValueError(
                f"state{''.join(f'[{part!r}]' for part in path)} and another entry of the state "
                f"both map to the tensor name {clash[0]!r}; rename the keys so that none contains "
                "a dot. Nothing was written."
            )
        for name, tensor in zip(names, state):
            tensors[name] = tensor.detach().contiguous().cpu()
        return {_TENSOR_LIST: prefix, "length": len(state)}
    return state


def _join_tensors(metadata: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(metadata, dict) and _TENSOR_LIST in metadata:
        prefix = metadata[_TENSOR_LIST]
        return [tensors[f"{prefix}{k}"] for k in range(metadata["length"])]
    if isinstance(metadata, dict):
        return {k: _join_tensors(v, tensors) for k, v in metadata.items()}
    return metadata
