"""Writing one step of every env at once into :class:`~torchrl_ext.storages.EnvRingStorage`.

When every env stands at the same position (envs
stepped together, ALF's usual case), a ``[num_envs]`` step lands in one slot:
a single copy per leaf (one contiguous block in time-major rings), with no
per-env index arithmetic. For the few dozen small steps of an ALF ``add_batch``
the calls around the copies, not the bytes, are what costs, so this path
runs on numpy views of the CPU leaves (see :mod:`torchrl_ext.storages._numpy_rows`).
It is a fast path (:mod:`torchrl_ext._fastpath`): with the fast paths off, every write
takes the storage's general ``write_at``.
"""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.storages._numpy_rows import matching_arrays
from torchrl_ext.storages._ring_data import RingData


def write_step(rings: RingData, data: TensorDictBase, skip_key: Any = None) -> int | None:
    """Writes the ``[num_envs]`` batch ``data`` (row ``e`` is env ``e``) as the next step of
    every env, when every env stands at the same position, and moves the counters.

    The checks, the copies and the counters' move are one call: for a step of a few dozen
    small envs, call layers cost as much as the copies. ``skip_key`` names an entry that is
    not stored (the writer's env ids).

    Returns:
        The position written, or ``None``, with nothing written or moved, when this path
        does not apply: the fast paths are off, the envs stand at different positions,
        numpy cannot view the leaves (nothing stored yet, not on the CPU, bfloat16), or the
        batch differs in any way from what is stored (keys, per-step shapes, dtypes,
        device, autograd). The caller then takes the general write, which raises the
        errors a bad batch deserves.
    """
    columns = rings.step_columns() if fastpath_enabled() else None
    if columns is None:
        return None
    position = rings.common_position()
    if position is None:
        return None
    pairs = matching_arrays(data, columns, rings.num_envs, skip_key)
    if pairs is None:
        return None
    slot = position % rings.max_length
    for stored, array in pairs:
        stored[slot] = array
    rings.last_rows = slot  # expanded to flat rows when read (the storage's last_written_rows)
    rings.pos_np.fill(position + 1)  # every env stood at position: a fill, not += 1
    rings.grow_every_size(1)
    return position
