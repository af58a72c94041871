"""The sum tree behind :class:`~torchrl_ext.samplers.PrioritizedSampler`.

Prioritized replay needs sums to sample from, the smallest sampleable
priority to normalise importance weights, and (optionally) the largest stored
priority for new data. One tree keeps all three over a single copy of the
leaves: the extra reductions share every gathered row of an update, so an
update costs a few kernels more than a plain sum tree's, and memory stays
about 1.1x the leaves instead of 2-3x for separate trees.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from torchrl_ext._checks import makes_kept_tensors
from torchrl_ext.storages._numpy_rows import ColumnCache, numpy_view
from torchrl_ext.segment_tree import SumSegmentTree, _store

__all__ = ["PrioritySegmentTree", "reduce_per_item"]


class PrioritySegmentTree(SumSegmentTree):
    """Sum tree that also tracks the minimum non-zero leaf (and the maximum).

    Zero leaves (never written, or priority 0) are left out of the minimum:
    they are never sampled, so they never need an importance weight.

    Args:
        capacity: number of leaves.

    Keyword Args:
        track_max: also keep the maximum leaf. Defaults to ``False``.
        track_nnz, fanout, top_size, dtype, device: see
            :class:`~torchrl_ext.segment_tree.SumSegmentTree`.

    Examples:
        >>> import torch
        >>> from torchrl_ext.samplers._priority_tree import PrioritySegmentTree
        >>> tree = PrioritySegmentTree(4, track_max=True)
        >>> tree[torch.tensor([0, 1, 2])] = torch.tensor([3.0, 0.0, 1.5])
        >>> [float(tree.summary()), tree.min_nonzero(), float(tree.max())]
        [4.5, 1.5, 3.0]
    """

    @makes_kept_tensors
    def __init__(self, capacity: int, *, track_max: bool = False, **kwargs: Any) -> None:
        super().__init__(capacity, **kwargs)
        # Minimum keys per internal node (see _min_keys), then optional maxima.
        self._min_levels = [
            torch.full(level.shape, self._no_key, dtype=self._key_dtype, device=self._device)
            for level in self._levels[1:]
        ]
        self._max_levels = (
            [torch.zeros(level.shape, dtype=self._dtype, device=self._device)
             for level in self._levels[1:]]
            if track_max
            else None
        )
        self._numpy_cache = ColumnCache()

    # Derived from the dtype rather than stored, so trees pickled by earlier versions load.
    @property
    def _key_dtype(self) -> torch.dtype:
        return _KEYS[self._dtype][0]

    @property
    def _no_key(self) -> int:
        return _KEYS[self._dtype][1]

    def _refresh_level(self, k: int, rows: torch.Tensor, parents: torch.Tensor | None) -> None:
        super()._refresh_level(k, rows, parents)
        if k == 1:
            min_rows = self._min_keys(rows, reuse=parents is not None)
        else:
            min_rows = _rows(self._min_levels[k - 2], self._fanout, parents)
        _store(self._min_levels[k - 1], min_rows.amin(1), parents)
        if self._max_levels is not None:
            max_rows = rows if k == 1 else _rows(self._max_levels[k - 2], self._fanout, parents)
            _store(self._max_levels[k - 1], max_rows.amax(1), parents)

    def _min_keys(self, values: torch.Tensor, *, reuse: bool = True) -> torch.Tensor:
        """Integer keys whose minimum is the minimum non-zero value.

        Non-negative IEEE floats order like their bit patterns. Subtracting 1
        sends +0.0 (and -0.0) to -1, and clearing the sign bit then makes it
        the largest key, so ``amin`` skips zeros without a mask (a masked copy
        costs several times more on CPU).
        """
        out = self._scratch("min_keys", values.shape, self._key_dtype) if reuse else None
        keys = torch.sub(values.view(self._key_dtype), 1, out=out)
        return keys.bitwise_and_(self._no_key)

    def min_nonzero(self) -> float:
        """Smallest non-zero leaf, or ``inf`` when every leaf is zero."""
        if len(self._levels) == 1:
            key = int(self._min_keys(self._levels[0], reuse=False).amin())
        else:
            key = self._min_levels[-1].amin().item()
        if key == self._no_key:
            return math.inf
        return torch.tensor(key + 1, dtype=self._key_dtype).view(self._dtype).item()

    def draw_by_rejection(
        self, n: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``n`` leaves drawn with probability ``value / total``, or ``None``, by rejection
        sampling on the level above the leaves (docs/architecture.md, "Prioritized replay").

        Returns ``None`` (walk instead) off the CPU, for dtypes numpy has no twin
        of, when too few proposals would be accepted for rejection to beat a walk
        (a mostly empty buffer, say; see ``_min_acceptance``), or when a batch of
        proposals falls short of ``n`` or lands on a zero leaf by rounding
        (throwing such a batch away keeps the draws exact).

        Returns:
            int64 leaf indices ``[n]`` and their values ``[n]``.

        Examples:
            >>> import torch
            >>> tree = PrioritySegmentTree(3)
            >>> tree[torch.arange(3)] = torch.tensor([1.0, 0.0, 3.0])
            >>> index, value = tree.draw_by_rejection(1000, torch.Generator().manual_seed(0))
            >>> sorted(set(index.tolist())), bool((value == tree[index]).all())
            ([0, 2], True)
        """
        views = self._numpy_levels()
        if views is None:
            return None
        leaves, fanout = views[0], self._fanout
        # The proposals' level without its padding: the leaves in a one-level tree.
        nodes = leaves[: self._capacity] if len(self._levels) == 1 else views[1][: self._sizes[1]]
        peak = nodes.max().item()
        if not peak > 0:
            return None
        acceptance = nodes.sum().item() / (nodes.shape[0] * peak)
        if acceptance < _min_acceptance(n):
            return None
        # About 5 standard deviations of headroom at n = 256: a short batch is rare.
        proposals = int(n / acceptance * 1.2) + 32
        # One draw for the proposals, their coins and the shares within rows: uniform
        # integers as floor(u * count) are off by at most 2**-53 relative.
        uniform = torch.rand(2 * proposals + n, dtype=torch.float64, generator=generator).numpy()
        node = np.minimum(uniform[:proposals] * nodes.shape[0], nodes.shape[0] - 1).astype(np.int64)
        accepted = np.flatnonzero(uniform[proposals:2 * proposals] * peak < nodes[node])[:n]
        if accepted.shape[0] < n:
            return None
        node = node[accepted]
        if len(self._levels) == 1:
            return torch.from_numpy(node), torch.from_numpy(leaves[node])
        rows = leaves.reshape(-1, fanout).take(node, axis=0)
        # torch's kernel: numpy's BLAS would start threads that then contend with torch's.
        running = torch.from_numpy(rows).cumsum(1).numpy()
        share = uniform[2 * proposals:] * running[:, -1]
        below = running <= share.astype(rows.dtype)[:, None]
        if below[:, -1].any():  # a share rounded up to its row's sum: no child exceeds it
            return None
        child = below.argmin(1)  # the first child whose running sum exceeds the share
        flat = child + np.arange(0, n * fanout, fanout)
        value = rows.reshape(-1)[flat]
        if not value.min() > 0:
            return None
        return torch.from_numpy(node * fanout + child), torch.from_numpy(value)

    def walk_draw(
        self, n: int, generator: torch.Generator | None = None, *, stratified: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """``n`` leaves drawn by walking the tree from uniform thresholds (``stratified``: one per
        equal-mass stratum, ALF's "without replacement"), their values and the total; ``None``
        when every leaf is zero."""
        prefix = self._top_prefix()
        total = prefix[-1].item()
        if not total > 0:
            return None
        draw = torch.rand(n, dtype=torch.float64, device=self._device, generator=generator)
        if stratified:
            draw = draw.add_(torch.arange(n, dtype=torch.float64, device=self._device)).div_(n)
        # Scaled by the float just below the total: every draw stays strictly
        # below it, so the walk needs no cap at the top.
        index, value = self._sample_walk(draw.mul_(math.nextafter(total, 0.0)), prefix)
        return index, value, total

    def max(self) -> torch.Tensor:
        """Largest leaf (0 while every leaf is zero), 0-d tensor; needs ``track_max``."""
        if self._max_levels is None:
            raise RuntimeError("build the tree with track_max=True to query its maximum.")
        if len(self._levels) == 1:
            return self._levels[0][: self._capacity].amax()
        return self._max_levels[-1].amax()

    def clear(self) -> None:
        super().clear()
        for level in self._min_levels:
            level.fill_(self._no_key)
        for level in self._max_levels or ():
            level.zero_()

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), *self._min_levels, *(self._max_levels or ())]

    # ------------------------------------------------------------------
    # CPU writes through numpy
    def _write(self, index: torch.Tensor, value: torch.Tensor) -> None:
        if index.shape[0] < _NUMPY_WRITES_BELOW:  # larger writes: torch's kernels win
            index_np, value_np = numpy_view(index), numpy_view(value)
            views = self._numpy_levels() if index_np is not None and value_np is not None else None
            if views is not None:
                return self._write_arrays(views, index_np, value_np)
        super()._write(index, value)

    def _numpy_levels(self) -> list[np.ndarray] | None:
        """Numpy views of every level, in order: the sums, the minimum keys, then the
        maxima; ``None`` off the CPU or for dtypes numpy has no twin of.

        A prioritized update writes a few hundred leaves: about 20 torch kernels that
        cost several microseconds each, where numpy's calls cost one or two. The views
        are checked against the tensors on every call (``to()`` replaces them; a load
        copies into them) and pickle empty.
        """
        tensors = [*self._levels, *self._min_levels, *(self._max_levels or ())]
        columns = self._numpy_cache.get(list(enumerate(tensors)), batch_dims=1)
        return None if columns is None else [array for array, _, _ in columns.values()]

    def _write_arrays(self, views: list[np.ndarray], index: np.ndarray, value: np.ndarray) -> None:
        """:meth:`_write` of validated, non-empty ``index`` / ``value`` on the :meth:`_numpy_levels` views."""
        depth = len(self._levels)
        levels, min_levels = views[:depth], views[depth:2 * depth - 1]
        max_levels = views[2 * depth - 1:]  # empty without track_max
        value = value.astype(levels[0].dtype, copy=False)
        if index.shape[0] > 1:
            index, value = _last_writes(index, value)
        if self._track_nnz:
            change = int(np.count_nonzero(value)) - int(np.count_nonzero(levels[0][index]))
            if change:
                self._nnz += change
        levels[0][index] = value
        parents, fanout = index, self._fanout
        no_key = self._no_key
        ones = _ones(fanout, levels[0].dtype)
        for k in range(1, depth):
            children = levels[k - 1].reshape(-1, fanout)
            if children.shape[0] <= parents.shape[0]:
                # Small level (and every level above it): recomputed whole, as the torch path does.
                for j in range(k, depth):
                    self._refresh_level(j, self._levels[j - 1].view(-1, fanout), None)
                return
            parents = parents >> self._shift
            rows = children.take(parents, axis=0)
            # A matrix-vector product sums short rows several times faster than sum(1).
            levels[k][parents] = rows.sum(1) if ones is None else rows @ ones
            if k == 1:
                min_rows = (rows.view(min_levels[0].dtype) - 1) & no_key
            else:
                min_rows = min_levels[k - 2].reshape(-1, fanout).take(parents, axis=0)
            min_levels[k - 1][parents] = min_rows.min(1)
            if max_levels:
                max_rows = rows if k == 1 else max_levels[k - 2].reshape(-1, fanout).take(parents, axis=0)
                max_levels[k - 1][parents] = max_rows.max(1)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "min_levels": [level.clone() for level in self._min_levels],
            "max_levels": None
            if self._max_levels is None
            else [level.clone() for level in self._max_levels],
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The minimum keys and maxima are recomputed from the leaves with the sums
        # (SegmentTree.load_state_dict refreshes every level): only their presence is checked.
        saved_max = state_dict.get("max_levels")
        if (saved_max is None) != (self._max_levels is None):
            raise ValueError(
                f"state_dict {'has no' if saved_max is None else 'has'} maxima but this tree was "
                f"built with track_max={self._max_levels is not None}; build it the same way."
            )
        super().load_state_dict(state_dict)


def _min_acceptance(n: int) -> float:
    """The acceptance below which a walk draws ``n`` leaves faster than rejection.

    Proposals cost per draw divided by the acceptance, a walk per draw plus a fixed
    cumsum of the top. Measured on a 1M tree (CPU, one process): level at about 0.1
    for 256 draws, 0.15-0.2 for 1,024, 0.3 for 2,048 and 0.35-0.4 for 4,096.
    """
    return 0.12 * math.sqrt(n / 256)


# Writes of fewer entries go through numpy on the CPU, where small writes pay less per call
# than torch's; larger writes go to torch (the crossover: benchmarks/bench_prioritized.py).
_NUMPY_WRITES_BELOW = 2048

# Per value dtype: the dtype of its minimum keys and the key of "no non-zero leaf" (the largest).
_KEYS = {
    torch.float16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF),
}


def _last_writes(index: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each index once, with the value of its last write (repeats in one update).

    A stable sort keeps repeats in write order, so the last of each run of equal
    indices is the write that wins; it touches only the update's entries, where
    per-leaf tickets would touch the capacity's.
    """
    order = index.argsort(kind="stable")
    ordered = index[order]
    last = ordered[1:] != ordered[:-1]
    if last.all():
        return index, value
    keep = order[np.append(last, True)]
    return index[keep], value[keep]


@functools.lru_cache(maxsize=None)
def _ones(fanout: int, dtype: np.dtype) -> np.ndarray | None:
    """A ones vector whose product with ``[k, fanout]`` rows sums them (BLAS dtypes only)."""
    if dtype not in (np.float32, np.float64):
        return None
    ones = np.ones(fanout, dtype=dtype)
    ones.flags.writeable = False
    return ones


def _rows(level: torch.Tensor, fanout: int, parents: torch.Tensor | None) -> torch.Tensor:
    rows = level.view(-1, fanout)
    return rows if parents is None else rows.index_select(0, parents)


def reduce_per_item(priority: torch.Tensor, reduction: str) -> torch.Tensor:
    """``[N, k]`` priorities (one per agent, say) to one per item with ``reduction``."""
    if reduction == "median":
        return priority.median(1).values
    return getattr(priority, {"max": "amax", "min": "amin", "mean": "mean"}.get(reduction, "sum"))(1)
