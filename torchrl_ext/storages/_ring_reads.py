"""Reads of per-env rings (:class:`~torchrl_ext.storages._ring_data.RingData`) by ``(env, position)``.

Functions of the rings alone: :class:`~torchrl_ext.storages.EnvRingStorage` checks
coordinates and delegates its reads here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_ext.storages._gathers import assemble, select_rows, take, take_rows
from torchrl_ext.storages._ring_data import RingData


def gather(
    rings: RingData, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None,
    skip: Any, pinned: bool,
) -> TensorDictBase:
    """The stored steps at ``(env, position)`` (both of shape ``S``) as a TensorDict of batch
    size ``S``, plus ``extra`` entries, without the leaves in ``skip``."""
    flat = rings.flat_index(env, position)
    shape, rows = flat.shape, flat.reshape(-1)
    columns = rings.read_columns() if flat.is_cpu else None
    if columns is not None:
        entries = take_rows(columns, rows, skip, pinned=pinned)
    else:
        entries = {key: select_rows(leaf, rows, pinned=pinned) for key, leaf in rings.flat if key not in skip}
    if len(shape) != 1:  # else the rows already have the batch shape
        entries = {key: value.reshape(*shape, *value.shape[1:]) for key, value in entries.items()}
    return assemble(entries, shape, rings.device, extra, rings.item_shapes)


def gather_chain(
    rings: RingData, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
    extra: dict[Any, torch.Tensor], pinned: bool,
) -> TensorDictBase:
    """Root entries at ``(env, start)`` and ``"next"`` entries at ``(env, end)``, one gather per
    leaf at the row it is read from; ``extra`` entries replace stored ones."""
    root, after = rings.flat_index(env, start), rings.flat_index(env, end)
    shape = env.shape
    flat_batch = len(shape) == 1  # rows already have the batch shape: no reshapes
    if not flat_batch:
        root, after = root.reshape(-1), after.reshape(-1)
    columns = rings.read_columns() if root.is_cpu else None
    if columns is None:
        sources, pick = rings.flat, select_rows
    else:
        sources = [(key, array) for key, (array, _, _) in columns.by_key.items()]
        root, after, pick = root.numpy(), after.numpy(), take
    entries = {}
    for key, source in sources:
        if key in extra:
            continue
        value = pick(source, after if isinstance(key, tuple) and key[0] == "next" else root, pinned=pinned)
        entries[key] = value if flat_batch else value.reshape(*shape, *source.shape[1:])
    return assemble(entries, shape, rings.device, extra, rings.item_shapes)


def empty_result(rings: RingData, shape: tuple[int, ...]) -> TensorDictBase:
    """A TensorDict of batch size ``shape`` with the stored leaves' per-step shapes, unfilled."""
    entries = {key: torch.empty(*shape, *leaf.shape[1:], dtype=leaf.dtype, device=rings.device)
               for key, leaf in rings.flat}
    return assemble(entries, torch.Size(shape), rings.device, None, rings.item_shapes)


def draw_uniform(
    rings: RingData, batch_size: int, lookback: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` uniform draws over the stored steps, except each env's ``lookback``
    oldest, as ``(env, position)``."""
    total, ends, base = rings.draw_tables(lookback)
    if total == 0:
        raise RuntimeError("Cannot sample from an empty storage.")
    flat = torch.randint(total, (batch_size,), generator=generator).numpy()
    env = np.searchsorted(ends, flat, side="right")
    flat += base[env]
    return torch.from_numpy(env), torch.from_numpy(flat)
