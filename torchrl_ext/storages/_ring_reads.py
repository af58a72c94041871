"""Reads of per-env rings (:class:`~torchrl_ext.storages._ring_data.RingData`) by ``(env, position)``.

Functions of the rings alone: :class:`~torchrl_ext.storages.EnvRingStorage` checks
coordinates and delegates its reads here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_ext.storages._gathers import assemble, select_rows, take
from torchrl_ext.storages._ring_data import RingData


def gather(
    rings: RingData, env: torch.Tensor, position: torch.Tensor, extra: dict[Any, torch.Tensor] | None,
    skip: Any, pinned: bool, next_position: torch.Tensor | None = None,
) -> TensorDictBase:
    """The stored steps at ``(env, position)`` (both of shape ``S``) as a TensorDict of batch
    size ``S``, plus ``extra`` entries (which replace stored ones), without the leaves in
    ``skip``. With ``next_position``, the ``"next"`` entries are read at ``(env,
    next_position)``: the transition from ``position`` to the step after ``next_position``."""
    root = rings.flat_index(env, position)
    shape = root.shape
    root = root.reshape(-1)
    after = root if next_position is None else rings.flat_index(env, next_position).reshape(-1)
    columns = rings.read_columns() if root.is_cpu else None
    if columns is None:
        sources, pick = rings.flat, select_rows
    else:  # numpy's take costs less than index_select on a sample's few hundred rows
        sources = [(key, array) for key, (array, _, _) in columns.by_key.items()]
        root, after, pick = root.numpy(), after.numpy(), take
    entries = {}
    for key, source in sources:
        if key in skip or (extra and key in extra):
            continue
        value = pick(source, after if isinstance(key, tuple) and key[0] == "next" else root, pinned=pinned)
        entries[key] = value if len(shape) == 1 else value.reshape(*shape, *source.shape[1:])
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
