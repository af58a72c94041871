"""Component state as files: tensors in safetensors, everything else in JSON.

A ``state_dict`` (nested dicts of numbers, strings and lists of tensors)
becomes two files: the tensors in a safetensors file, named by their path in
the state (``_sum_tree.levels.0``), and the rest as JSON with a marker where
each list of tensors was. Nothing is pickled, and both files are written
atomically (temporary file, fsync, rename), so an interrupted save leaves the
previous files intact.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict, TensorDictBase

__all__ = ["atomic_write", "load_state", "save_state", "tensordict_from_state", "tensordict_state"]


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
    metadata = _split_tensors(state, "", tensors)
    atomic_write(directory / tensors_file, lambda tmp: save_file(tensors, tmp))
    atomic_write(
        directory / metadata_file, lambda tmp: Path(tmp).write_text(json.dumps(metadata))
    )


def load_state(directory: str | Path, *, tensors_file: str, metadata_file: str) -> dict[str, Any]:
    """Reads back what :func:`save_state` wrote."""
    directory = Path(directory).absolute()
    metadata = json.loads((directory / metadata_file).read_text())
    return _join_tensors(metadata, load_file(directory / tensors_file))


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
        "keys": [list(key) if isinstance(key, tuple) else [key] for key in keys],
        # Contiguous clones: a leaf that is a view (the rings' transposed memory) is
        # copied once, in the order its shape says, which is how the files store it.
        "leaves": [data.get(key).clone(memory_format=torch.contiguous_format) for key in keys],
    }


def tensordict_from_state(state: dict[str, Any], device: torch.device) -> TensorDictBase | None:
    """Inverse of :func:`tensordict_state` (``None`` when it held no TensorDict)."""
    if not state["keys"]:
        return None
    keys = [tuple(key) if len(key) > 1 else key[0] for key in state["keys"]]
    return TensorDict(
        {key: leaf.to(device) for key, leaf in zip(keys, state["leaves"])},
        batch_size=state["batch"],
        device=device,
    )


_TENSOR_LIST = "__tensor_list__"


def _split_tensors(state: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able copy of ``state`` with each list of tensors moved to ``tensors``."""
    if isinstance(state, dict):
        return {k: _split_tensors(v, f"{prefix}{k}.", tensors) for k, v in state.items()}
    if isinstance(state, list) and state and all(isinstance(t, torch.Tensor) for t in state):
        for k, tensor in enumerate(state):
            tensors[f"{prefix}{k}"] = tensor.detach().contiguous().cpu()
        return {_TENSOR_LIST: prefix, "length": len(state)}
    return state


def _join_tensors(metadata: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(metadata, dict) and _TENSOR_LIST in metadata:
        prefix = metadata[_TENSOR_LIST]
        return [tensors[f"{prefix}{k}"] for k in range(metadata["length"])]
    if isinstance(metadata, dict):
        return {k: _join_tensors(v, tensors) for k, v in metadata.items()}
    return metadata
