"""Checkpoints of :class:`~torchrl_ext.samplers.PrioritizedSampler`: state dicts, files, pickling.

A mixin, not a sampler: it reads the sampler's settings (``_priority_exponent``,
``_weight_exponent``, ``_priority_offset``, ``_max_seen``, ``_initial_priority``, ``_weights``,
``_max_in_buffer``, ``_capacity``) and its ``_tree``. The state dict keeps the key names of
earlier releases (``"_alpha"``, ``"_sum_tree"``, ...).
"""
from __future__ import annotations

import math
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrl_ext._checks import check_real
from torchrl_ext.io.state_files import StateFiles, load_json

__all__ = ["SHARING_REFUSED", "PriorityCheckpoints"]

#: Why a flat prioritized sampler cannot be handed to another process, and the fixes.
SHARING_REFUSED = (
    "{name} cannot be shared between processes: its priority trees live in one process, so "
    "priorities of items written by other processes would never reach them. Fix: use a "
    "per-env prioritized ring (torchrl_ext.presets.alf_replay_buffer(..., "
    "prioritized_sampling=True)), whose sampler rebuilds its priorities in the sampling "
    "process from the shared ring cursors, or keep the whole buffer in one Ray actor "
    "(torchrl_ext.distributed.ray_replay_buffer) and write to it from any process."
)


def _is_torchrl_tree(tree: Any) -> bool:
    """Whether ``tree`` is one of TorchRL's C++ segment trees (a ``PrioritizedSampler`` state)."""
    return hasattr(tree, "capacity") and all(callable(getattr(tree, name, None)) for name in ("scan_lower_bound", "query"))


def _checked_exponents(state: dict[str, Any]) -> tuple[float, float, float]:
    """``(alpha, beta, eps)`` of a sampler checkpoint, torchrl_ext's or TorchRL's, checked."""
    return (check_real("alpha", state.get("_alpha"), low=0.0), check_real("beta", state.get("_beta"), low=0.0),
            check_real("eps", state.get("_eps"), low=0.0))


class PriorityCheckpoints(StateFiles):
    """``state_dict`` / ``load_state_dict``, ``dumps`` / ``loads`` (``trees.safetensors`` and
    ``sampler_metadata.json``) and the pickling rule."""

    state_files = ("trees.safetensors", "sampler_metadata.json")

    def state_dict(self) -> dict[str, Any]:
        return {
            "_schema_version": 1,
            "_alpha": self._priority_exponent,
            "_beta": self._weight_exponent,
            "_eps": self._priority_offset,
            "_max_seen": self._max_seen,
            "_initial_priority": self._initial_priority,
            "_weights": self._weights,
            "_max_priority_within_buffer": self._max_in_buffer,
            "_sum_tree": self._tree.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`, or the ``state_dict()`` of TorchRL's
        ``PrioritizedSampler`` (priorities kept); everything is checked before anything changes."""
        if isinstance(state_dict, dict) and _is_torchrl_tree(state_dict.get("_sum_tree")):
            # TorchRL's C++ trees round their size up to the power of two above max_capacity.
            tree = state_dict["_sum_tree"]
            size = tree.capacity() if callable(tree.capacity) else tree.capacity
            leaves = torch.as_tensor(tree[torch.arange(size)], dtype=torch.float64)
            fits = size == 1 << self._capacity.bit_length() and not bool(leaves[self._capacity:].any())
            capacity = self._capacity if fits else f"{size} (rounded up)"
            return self._load_torchrl_state(state_dict, leaves[: self._capacity], capacity)
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("_sum_tree"), dict):
            raise ValueError(
                "state_dict was not produced by a PrioritizedSampler (torchrl_ext's or TorchRL's); "
                "pass the sampler's own state_dict()."
            )
        missing = sorted({"_alpha", "_beta", "_eps", "_max_seen", "_initial_priority", "_weights",
                          "_max_priority_within_buffer"} - state_dict.keys())
        if missing:
            raise ValueError(f"state_dict lacks {missing}: it is damaged or of another sampler.")
        self._check_geometry(state_dict["_sum_tree"].get("capacity"))
        saved = (state_dict["_weights"], state_dict["_max_priority_within_buffer"])
        if saved != (self._weights, self._max_in_buffer):
            raise ValueError(
                f"state_dict was saved with weights={saved[0]!r} and "
                f"max_priority_within_buffer={saved[1]}; build the sampler the same way."
            )
        exponents = _checked_exponents(state_dict)
        initial_priority = check_real("initial_priority", state_dict["_initial_priority"], low=0.0)
        max_seen = state_dict["_max_seen"]
        if isinstance(max_seen, bool) or not isinstance(max_seen, (int, float)) or math.isnan(max_seen) \
                or max_seen == math.inf:
            raise ValueError(f"state_dict['_max_seen'] must be a finite number or -inf, got {max_seen!r}.")
        self._tree.load_state_dict(state_dict["_sum_tree"])  # checks its levels before writing
        self._initial_priority = initial_priority
        self._take_loaded_tree(exponents, max_seen)

    def loads(self, path: str | Path) -> None:
        """Restores what :meth:`dumps` wrote, or what TorchRL's ``PrioritizedSampler.dumps``
        wrote (``sumtree.memmap`` and ``sampler_metadata.json``), all or nothing."""
        path = Path(path).absolute()
        if (path / "sumtree.memmap").is_file() and not (path / self.state_files[0]).is_file():
            metadata = load_json(path / "sampler_metadata.json")
            capacity = metadata.get("_max_capacity") if isinstance(metadata, dict) else None
            if not isinstance(capacity, (int, float)) or capacity != int(capacity) or capacity < 0:
                raise ValueError(f"{path / 'sampler_metadata.json'} is not TorchRL's sampler metadata.")
            leaves = np.fromfile(path / "sumtree.memmap", dtype=np.float64)
            if leaves.size != int(capacity):
                raise ValueError(
                    f"{path / 'sumtree.memmap'} holds {leaves.size} priorities, its metadata says "
                    f"{int(capacity)}: it is damaged. Restore the folder from the same save."
                )
            return self._load_torchrl_state(metadata, torch.from_numpy(leaves), int(capacity))
        return super().loads(path)

    def _load_torchrl_state(self, state: dict[str, Any], leaves: torch.Tensor, capacity: Any) -> None:
        """Loads TorchRL's sampler state: its sum tree holds the same ``(p + eps) ** alpha`` per
        item, and ``_max_priority`` the raw maximum. This sampler's own settings
        (``initial_priority``, ``weights``, ``max_priority_within_buffer``) stay."""
        self._check_geometry(capacity)
        exponents = _checked_exponents(state)
        max_priority = state.get("_max_priority")
        max_priority = max_priority[0] if isinstance(max_priority, (tuple, list)) and max_priority else None
        max_seen = -math.inf if max_priority is None else float(max_priority)
        if not bool(torch.isfinite(leaves).all()) or bool((leaves < 0).any()) or math.isnan(max_seen):
            raise ValueError("the TorchRL sampler state holds priorities that are not finite and >= 0; it is damaged.")
        written = torch.nonzero(leaves).flatten()
        self._tree.clear()
        if written.numel():
            self._tree._write(written, leaves[written].to(self.dtype))
        self._take_loaded_tree(exponents, max_seen)

    def _take_loaded_tree(self, exponents: tuple[float, float, float], max_seen: float) -> None:
        """The settings that go with a tree just loaded (either format): ``(alpha, beta, eps)``,
        the largest priority seen, and the bound above which every leaf is zero."""
        self._priority_exponent, self._weight_exponent, self._priority_offset = exponents
        self._max_seen = float(max_seen)
        written = torch.nonzero(self._tree.leaves)
        self._written_below = int(written.max()) + 1 if written.numel() else 0

    def _check_geometry(self, capacity: int) -> None:
        if capacity != self._capacity:
            raise ValueError(
                f"the checkpoint holds {capacity} priorities but this sampler has "
                f"max_capacity={self._capacity}; build it with the same capacity."
            )

    def __getstate__(self) -> dict[str, Any]:
        # Pickling for Ray, deepcopy or a checkpoint is fine; handing the sampler
        # to a spawned process is not: the trees would be copied, and priorities
        # of writes made in one process would never reach the other's trees.
        if get_spawning_popen() is not None:
            raise RuntimeError(SHARING_REFUSED.format(name=type(self).__name__))
        return super().__getstate__()
