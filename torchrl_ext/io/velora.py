"""velora's replay-buffer files and batch layout, on TorchRL keys.

velora (``Achronus/velora`` 0.2.0) keeps six ``[capacity, dim]`` float32
tensors and saves them as ``<prefix>state.safetensors`` (tensors named
``states, actions, rewards, next_states, dones, hiddens``, no header metadata
of its own) plus ``<prefix>metadata.json`` (``capacity, state_dim, action_dim,
hidden_dim, position, size, device``, ``json.dumps(indent=2)``). The storage
rows are velora's slots, ``position`` is the ring writer's cursor and ``size``
the storage length, so files translate both ways without reordering.

Key mapping (:data:`VELORA_KEYS`; ``keys=`` overrides it):

========================  ==========================  ==========================
velora                    TorchRL key                 stored as
========================  ==========================  ==========================
``states``                ``"observation"``           float32 ``[state_dim]``
``actions``               ``"action"``                float32 ``[action_dim]``
``rewards``               ``("next", "reward")``      float32 ``[1]``
``next_states``           ``("next", "observation")`` float32 ``[state_dim]``
``dones``                 ``("next", "done")``        bool ``[1]`` (file: float32)
``hiddens``               ``("next", "hidden")``      float32 ``[hidden_dim]``
========================  ==========================  ==========================

velora stores the actor's hidden state *returned* for the step (after reading
``states``): in TorchRL's recurrent convention that output lives under
``"next"``, and becomes the root ``"hidden"`` of the following step.

Files written here have exactly velora's JSON text and tensor names, dtypes and shapes,
plus the pair's checksums in the safetensors header (``__metadata__``, which velora's
``load_file`` ignores; see :mod:`torchrl_ext.io.checkpoint_pair`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_ext import _compat
from torchrl_ext._keys import nested_key
from torchrl_ext.io.checkpoint_pair import CheckpointPair, read_pair
from torchrl_ext.io.checkpointer import SafetensorsCheckpointer, ring_fields, storage_position

__all__ = [
    "VELORA_KEYS",
    "VELORA_METADATA_FIELDS",
    "BatchExperience",
    "VeloraCheckpointer",
    "as_batch_experience",
    "check_velora_metadata",
    "read_velora_metadata",
    "velora_item_layout",
]

VELORA_KEYS: dict[str, Any] = {
    "states": "observation",
    "actions": "action",
    "rewards": ("next", "reward"),
    "next_states": ("next", "observation"),
    "dones": ("next", "done"),
    "hiddens": ("next", "hidden"),
}
VELORA_METADATA_FIELDS = ("capacity", "state_dim", "action_dim", "hidden_dim", "position", "size", "device")
_DIMS = ("state_dim", "action_dim", "hidden_dim")
_DIM_FIELD = {
    "states": "state_dim",
    "actions": "action_dim",
    "rewards": None,
    "next_states": "state_dim",
    "dones": None,
    "hiddens": "hidden_dim",
}


class BatchExperience(NamedTuple):
    """velora's sampled batch: six ``[B, dim]`` tensors (``rewards``/``dones`` ``[B, 1]`` float)."""

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    dones: torch.Tensor
    hiddens: torch.Tensor


def _keys(keys: Mapping[str, Any] | None) -> dict[str, Any]:
    if keys is None:
        return dict(VELORA_KEYS)
    if set(keys) != set(VELORA_KEYS):
        raise ValueError(
            f"keys must map each of velora's names {sorted(VELORA_KEYS)} to a TensorDict key, "
            f"got names {sorted(keys)}."
        )
    return {name: nested_key(key, f"keys[{name!r}]") for name, key in keys.items()}


def as_batch_experience(td: TensorDictBase, keys: Mapping[str, Any] | None = None) -> BatchExperience:
    """velora's ``BatchExperience`` view of a sampled TensorDict (``dones`` as float).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.io import as_batch_experience
        >>> td = TensorDict({"observation": torch.zeros(2, 3), "action": torch.zeros(2, 1),
        ...                  ("next", "reward"): torch.ones(2, 1),
        ...                  ("next", "observation"): torch.ones(2, 3),
        ...                  ("next", "done"): torch.tensor([[True], [False]]),
        ...                  ("next", "hidden"): torch.zeros(2, 4)}, [2])
        >>> batch = as_batch_experience(td)
        >>> batch.dones.tolist(), batch.hiddens.shape
        ([[1.0], [0.0]], torch.Size([2, 4]))
    """
    names = _keys(keys)
    values = {}
    for name, key in names.items():
        value = td.get(key, None)
        if value is None:
            raise KeyError(f"as_batch_experience: the batch has no {key!r} (velora's {name!r}).")
        values[name] = value.float() if name == "dones" else value
    return BatchExperience(**values)


def velora_item_layout(
    state_dim: int, action_dim: int, hidden_dim: int, keys: Mapping[str, Any] | None = None
) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    """Per-item ``(shape, dtype)`` of each stored key.

    Examples:
        >>> velora_item_layout(3, 2, 4)[("next", "done")]
        ((1,), torch.bool)
    """
    dims = {"state_dim": state_dim, "action_dim": action_dim, "hidden_dim": hidden_dim, None: 1}
    return {
        key: ((dims[_DIM_FIELD[name]],), torch.bool if name == "dones" else torch.float32)
        for name, key in _keys(keys).items()
    }


class VeloraCheckpointer(SafetensorsCheckpointer):
    """Reads and writes velora's ``save(dirpath, prefix)`` files as a TorchRL storage checkpointer.

    The storage must hold exactly the six mapped keys as 1-D items (what
    :func:`~torchrl_ext.presets.velora_replay_buffer` builds). Loading casts
    the file's tensors to the storage's dtypes (``dones`` to bool by default);
    the metadata ``device`` is informational (the storage's device wins).

    Args:
        prefix: file-name prefix, velora's default ``"buffer_"``. Dots are
            kept (velora itself truncates ``"buf.v1_"`` to ``buf.json``);
            path separators raise ``ValueError``.

    Keyword Args:
        keys: velora name -> TensorDict key, default :data:`VELORA_KEYS`.

    Examples:
        >>> import tempfile, torch
        >>> from torchrl_ext.io import VeloraCheckpointer
        >>> from torchrl_ext.presets.velora import velora_replay_buffer
        >>> rb = velora_replay_buffer(4, state_dim=2, action_dim=1, hidden_dim=3)
        >>> rb.add_multi(torch.ones(5, 2), torch.zeros(5), torch.ones(5), torch.ones(5, 2),
        ...              torch.zeros(5), torch.zeros(5, 3))
        >>> folder = tempfile.mkdtemp()
        >>> VeloraCheckpointer().dumps(rb.storage, folder)
        >>> print((Path(folder) / "buffer_metadata.json").read_text())
        {
          "capacity": 4,
          "state_dim": 2,
          "action_dim": 1,
          "hidden_dim": 3,
          "position": 1,
          "size": 4,
          "device": "cpu"
        }
    """

    def __init__(self, prefix: str = "buffer_", *, keys: Mapping[str, Any] | None = None) -> None:
        super().__init__(prefix)
        self.keys = _keys(keys)

    def encode(self, storage: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        stored = _compat.stored_data(storage)
        present = set(stored.keys(True, True))
        wanted = set(self.keys.values())
        if present != wanted:
            raise ValueError(
                f"velora files hold exactly the keys {sorted(map(str, wanted))}; the storage also "
                f"has {sorted(map(str, present - wanted))} and lacks {sorted(map(str, wanted - present))}. "
                f"Store only the mapped keys (data.select(*VELORA_KEYS.values())) or pass keys=."
            )
        dims: dict[str, int] = {}
        tensors = {}
        for name, key in self.keys.items():
            tensor = stored.get(key)
            if tensor.ndim != 2:
                raise ValueError(
                    f"velora stores {name!r} as [capacity, dim] rows; key {key!r} holds items of "
                    f"shape {list(tensor.shape[1:])}. Flatten items to vectors before adding."
                )
            field = _DIM_FIELD[name]
            width = tensor.shape[1]
            expected = 1 if field is None else dims.setdefault(field, width)
            if width != expected:
                raise ValueError(
                    f"key {key!r} ({name!r}) has items of width {width}, expected {expected} "
                    f"({field or 'one value per step'})."
                )
            tensors[name] = tensor.detach().to("cpu", torch.float32).contiguous()
        metadata = {
            "capacity": storage.max_size,
            **{field: dims[field] for field in _DIMS},  # in velora's order, whatever the order of keys=
            "position": storage_position(storage),
            "size": len(storage),
            "device": None if storage.device is None else str(storage.device),
        }
        return tensors, metadata

    def decode(
        self, metadata: dict[str, Any], tensors: dict[str, torch.Tensor], pair: CheckpointPair, storage: Any
    ) -> tuple[TensorDict, int, int]:
        capacity, size, position = check_velora_metadata(metadata, pair)
        if set(tensors) != set(self.keys):
            raise ValueError(
                f"{pair.state} holds tensors {sorted(tensors)}; velora files hold {sorted(self.keys)}."
            )
        layout = velora_item_layout(*(metadata[f] for f in _DIMS), self.keys)
        if storage.initialized:
            layout = {key: (shape, _compat.stored_data(storage).get(key).dtype) for key, (shape, _) in layout.items()}
        entries = {}
        for name, key in self.keys.items():
            tensor, ((width,), dtype) = tensors[name], layout[key]
            if list(tensor.shape) != [capacity, width]:
                field = _DIM_FIELD[name]
                said = f"capacity={capacity}" + (f", {field}={width}" if field else "")
                raise ValueError(
                    f"{pair.state}: tensor {name!r} has shape {list(tensor.shape)} but "
                    f"{pair.metadata} says {said} (expected {[capacity, width]}); the two files do not "
                    f"belong together: restore both from the same save."
                )
            entries[key] = tensor != 0 if dtype is torch.bool else tensor.to(dtype)
        return TensorDict(entries, batch_size=[capacity]), size, position


def check_velora_metadata(metadata: dict[str, Any], pair: CheckpointPair) -> tuple[int, int, int]:
    """Validates velora's metadata fields; returns ``(capacity, size, position)``."""
    missing = [field for field in VELORA_METADATA_FIELDS if field not in metadata]
    if missing:
        raise ValueError(
            f"{pair.metadata} lacks velora's fields {missing} (it has {sorted(metadata)}); "
            f"is it a velora buffer metadata file? Agent-level saves keep them under 'buffer'."
        )
    for field in _DIMS:
        value = metadata[field]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{pair.metadata}: {field!r} must be a positive int, got {value!r}.")
    return ring_fields(metadata, pair)


def read_velora_metadata(path: str | Path, prefix: str = "buffer_") -> dict[str, Any]:
    """The validated metadata of velora files in folder ``path`` (tensors not loaded).

    Examples:
        >>> import tempfile
        >>> from torchrl_ext.presets.velora import velora_replay_buffer
        >>> folder = tempfile.mkdtemp()
        >>> velora_replay_buffer(8, 3, 2, 4).save(folder, prefix="run.v1_")
        >>> read_velora_metadata(folder, prefix="run.v1_")["capacity"]
        8
    """
    pair = CheckpointPair(path, prefix)
    metadata, _, _ = read_pair(pair, load_tensors=False)
    check_velora_metadata(metadata, pair)
    return metadata
