"""Sum, min and max segment trees in pure torch (any device, no compiled code).

Layout: a wide-fanout (B-ary) tree stored level by level. ``levels[0]`` holds
the leaves, and node ``j`` of level ``k`` reduces the ``fanout`` nodes
``j * fanout ... j * fanout + fanout - 1`` of level ``k - 1``. Levels are built
until one has at most ``top_size`` nodes; that top level is searched with one
float64 prefix sum and ``searchsorted`` instead of being walked.

Why this shape: see ``docs/architecture.md``, "Prioritized replay".

Contract (ALF's ``alf.experience_replayers.segment_tree``, quirks fixed):

* ``tree[indices] = values`` is batched; duplicate indices in one call take
  the **last** value given for them (on every device). An empty update is a
  no-op.
* ``tree[indices]`` reads leaves; ``summary()`` reduces all leaves.
* ``SumSegmentTree.find_sum_bound(thresholds)`` never chooses a zero leaf
  unless every leaf is.
* ``SumSegmentTree.nnz`` counts non-zero leaves and survives
  ``state_dict``/``load_state_dict`` (ALF loses it).
* Unwritten leaves hold the reduction's neutral element: 0 for sum, ``+inf``
  for min, ``-inf`` for max. (ALF zero-fills min and max trees, so its min
  tree reports 0 until every leaf has been written.)
* Bad input (indices out of range, NaN, negative values in a sum tree,
  thresholds outside ``[0, total]``) raises ``ValueError``/``TypeError``
  before anything is written: a failed call never changes the tree.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from torchrl_ext._checks import (
    bounds, check_bool, check_device, check_indices, check_int, makes_kept_tensors, read_only,
)

__all__ = ["MaxSegmentTree", "MinSegmentTree", "SegmentTree", "SumSegmentTree"]

IndexLike = int | Sequence[int] | torch.Tensor
ValueLike = float | Sequence[float] | torch.Tensor
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class SegmentTree:
    """Base class: a B-ary tree of ``capacity`` leaves under one reduction.

    Args:
        capacity: number of leaves (any integer >= 1).

    Keyword Args:
        fanout: children per internal node, a power of two >= 2. Defaults to 32.
        top_size: a level with at most this many nodes becomes the top level,
            searched in one pass instead of walked. Defaults to 32768, so up
            to about a million leaves need a single walked level.
        dtype: floating dtype of the values. Defaults to ``torch.float32``.
        device: where the tree lives. Defaults to the CPU.

    Subclasses set ``_neutral`` and implement ``_reduce_rows``.
    """

    _neutral: float = 0.0
    #: dtype of the top level when it is not the leaves (``None``: the tree's).
    _top_dtype: torch.dtype | None = None

    @makes_kept_tensors  # the levels, updated in place later, maybe outside inference_mode
    def __init__(
        self,
        capacity: int,
        *,
        fanout: int = 32,
        top_size: int = 32768,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check_int("capacity", capacity, minimum=1)
        check_int("fanout", fanout, minimum=2)
        check_int("top_size", top_size, minimum=1)
        if fanout & (fanout - 1):
            raise ValueError(f"fanout must be a power of two, got fanout={fanout}; try 32.")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                f"dtype must be a floating torch.dtype, got dtype={dtype!r}; "
                "use torch.float32 or torch.float64."
            )
        self._capacity = capacity
        self._fanout = fanout
        self._shift = fanout.bit_length() - 1
        self._top_size = top_size
        self._dtype = dtype
        self._device = check_device("device", "cpu" if device is None else device)
        sizes = [capacity]
        while sizes[-1] > top_size:
            sizes.append(-(-sizes[-1] // fanout))
        self._sizes = sizes
        # Every node has a full row of ``fanout`` children below it, padding
        # included, so a level can be viewed as ``[nodes above, fanout]`` and a
        # walk that strays onto a padding node still reads in-bounds rows.
        top = len(sizes) - 1
        top_dtype = self._top_dtype if top and self._top_dtype else dtype
        self._levels = [
            torch.full((sizes[-1] * fanout ** (top - k),), self._neutral, dtype=top_dtype if k == top else dtype,
                       device=self._device)
            for k in range(top + 1)
        ]
        self._scratch_buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    # ------------------------------------------------------------------
    capacity = read_only("_capacity", "Number of leaves.")
    fanout = read_only("_fanout", "Children per internal node.")
    dtype = read_only("_dtype", "Dtype of the values.")
    device = read_only("_device", "Device holding the tree.")

    @property
    def leaves(self) -> torch.Tensor:
        """View of the ``capacity`` leaf values (read it, do not write to it)."""
        return self._levels[0][: self._capacity]

    def __len__(self) -> int:
        return self._capacity

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, fanout={self._fanout}, "
            f"level_sizes={self._sizes}, dtype={self._dtype}, device={self._device})"
        )

    def nbytes(self) -> int:
        """Bytes held by the tree: levels and scratch buffers (last-write tickets included)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        return [*self._levels, *self._scratch_buffers.values()]

    # ------------------------------------------------------------------
    def __getitem__(self, indices: IndexLike) -> torch.Tensor:
        index = self._as_index(indices)
        if index.numel():
            self._check_range(*bounds(index))
        return self._levels[0].index_select(0, index.reshape(-1)).reshape(index.shape)

    def __setitem__(self, indices: IndexLike, values: ValueLike) -> None:
        index = self._as_index(indices).reshape(-1)
        value = self._as_values(values, index)
        if index.numel() == 0:
            return
        self._check_range(*bounds(index))
        self._check_values(*(float(x) for x in bounds(value)))
        self._write(index, value)

    def _write(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Writes validated, non-empty 1-D ``index``/``value``; last write wins."""
        if index.numel() > 1:
            value = value.index_select(0, self._last_write(index))
        self._before_leaf_write(index, value)
        self._levels[0].index_copy_(0, index, value)
        parents: torch.Tensor | None = index
        for k in range(1, len(self._levels)):
            children = self._levels[k - 1].view(-1, self._fanout)
            if parents is None or children.shape[0] <= parents.numel():
                # Small level (and every level above it): recomputing it whole
                # is one contiguous kernel, cheaper than a gather.
                parents = None
                self._refresh_level(k, children, None)
                continue
            # A repeated parent is recomputed twice with the same result, which
            # is cheaper than deduplicating the parents.
            parents = parents >> self._shift
            self._refresh_level(k, children.index_select(0, parents), parents)

    def _last_write(self, index: torch.Tensor) -> torch.Tensor:
        """Position in ``index`` of the last write to each entry's index.

        ``scatter_reduce`` keeps, per leaf, the largest position written to it
        (deterministic on every device; ``include_self=False`` ignores what the
        scratch held before). Giving every entry the value at that position
        makes repeats carry identical values, so write order no longer matters
        and nothing has to be sorted or compacted.
        """
        tickets = self._scratch("tickets", (self._capacity,), torch.int32)  # a position per leaf
        positions = torch.arange(index.numel(), dtype=torch.int32, device=self._device)
        tickets.scatter_reduce_(0, index, positions, "amax", include_self=False)
        return tickets.index_select(0, index)

    def _refresh_level(self, k: int, rows: torch.Tensor, parents: torch.Tensor | None) -> None:
        """Recomputes level ``k`` from ``rows`` of children (all rows when
        ``parents`` is ``None``, else the rows of ``parents``)."""
        _store(self._levels[k], self._reduce_rows(rows, self._levels[k].dtype), parents)

    def _before_leaf_write(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Hook run before the leaves change (repeats carry identical values)."""

    def _reduce_rows(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Reduction of each row, as ``dtype`` (the dtype of the level written)."""
        raise NotImplementedError

    def summary(self) -> torch.Tensor:
        """Reduction of all leaves, as a 0-d tensor (the neutral element when none was written)."""
        return self._reduce_rows(self._levels[-1].view(1, -1), self._levels[-1].dtype).reshape(())

    def clear(self) -> None:
        """Resets every leaf to the neutral element."""
        for level in self._levels:
            level.fill_(self._neutral)

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Reused temporary: fresh large CPU tensors pay page faults on every call.

        Created outside inference mode: a normal tensor can be written in place both inside
        and outside ``torch.inference_mode()``, an inference tensor only inside it.
        """
        buffer = self._scratch_buffers.get((name, dtype))
        if buffer is None or buffer.shape != shape:
            with torch.inference_mode(False):
                buffer = torch.empty(shape, dtype=dtype, device=self._device)
            self._scratch_buffers[(name, dtype)] = buffer
        return buffer

    # ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore the tree exactly (all levels, cloned)."""
        return {
            "capacity": self._capacity,
            "fanout": self._fanout,
            "top_size": self._top_size,
            "levels": [level.clone() for level in self._levels],
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` of a tree with the same geometry."""
        for key in ("capacity", "fanout", "top_size"):
            if state_dict.get(key) != getattr(self, f"_{key}"):
                raise ValueError(
                    f"state_dict has {key}={state_dict.get(key)!r} but this tree has "
                    f"{key}={getattr(self, f'_{key}')!r}; build the tree with the same "
                    "capacity, fanout and top_size before loading."
                )
        levels = self._checked_levels(state_dict.get("levels"))
        self._levels[0].copy_(levels[0])
        # Internal levels are recomputed from the leaves (they were checked to agree with
        # them): a tree loaded from a state is as consistent as one built by writes.
        for k in range(1, len(self._levels)):
            self._refresh_level(k, self._levels[k - 1].view(-1, self._fanout), None)

    def _checked_levels(self, levels: Any) -> list[torch.Tensor]:
        """``levels`` of a state dict as this tree's dtypes and device, after checking that
        their shapes are this tree's, the leaves are values this tree holds (padding
        neutral) and each internal level is the reduction of the level below it.

        Raises:
            ValueError: naming the first level that does not fit, before anything changes.
        """
        expected = [tuple(level.shape) for level in self._levels]
        if not isinstance(levels, (list, tuple)) or len(levels) != len(expected):
            found = len(levels) if isinstance(levels, (list, tuple)) else type(levels).__name__
            raise ValueError(
                f"state_dict['levels'] must be a list of {len(expected)} tensors of shapes "
                f"{expected}, got {found}; load a state_dict of a tree with the same geometry."
            )
        checked = []
        for k, (level, shape, dest) in enumerate(zip(levels, expected, self._levels)):
            if not isinstance(level, torch.Tensor) or tuple(level.shape) != shape or not level.is_floating_point():
                got = (f"{level.dtype} of shape {tuple(level.shape)}" if isinstance(level, torch.Tensor)
                       else type(level).__name__)
                raise ValueError(
                    f"state_dict level {k} must be a floating tensor of shape {shape}, got {got}; "
                    "the state is damaged or belongs to a tree of another geometry."
                )
            checked.append(level.to(dest.dtype).to(self._device))
        leaves, padding = checked[0][: self._capacity], checked[0][self._capacity:]
        try:
            self._check_values(*(float(x) for x in bounds(leaves)))
        except ValueError as err:
            raise ValueError(f"state_dict leaves are not values this tree holds: {err}") from err
        if padding.numel() and not bool((padding == self._neutral).all()):
            raise ValueError(
                f"state_dict padding leaves (past capacity {self._capacity}) must all be "
                f"{self._neutral}; the state is damaged."
            )
        for k in range(1, len(checked)):
            below = checked[k - 1].view(-1, self._fanout)
            reduced = self._reduce_rows(below, checked[k].dtype)
            if not torch.allclose(reduced, checked[k], rtol=1e-4, atol=0.0):
                raise ValueError(
                    f"state_dict level {k} does not match the level below it (each node must be "
                    "the reduction of its children): the state is damaged or was edited."
                )
        return checked

    @makes_kept_tensors  # the moved levels replace the ones updated in place
    def to(self, device: torch.device | str) -> SegmentTree:
        """Moves the tree to ``device`` in place and returns it."""
        self._device = torch.device(device)
        # Every tensor the tree holds, alone or in a list of levels (subclasses add their own).
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(self._device))
            elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
                setattr(self, name, [level.to(self._device) for level in value])
        self._scratch_buffers = {}
        return self

    # ------------------------------------------------------------------
    def _as_index(self, indices: IndexLike) -> torch.Tensor:
        return check_indices("indices", indices, "leaf indices").to(self._device)

    def _as_values(self, values: ValueLike, index: torch.Tensor) -> torch.Tensor:
        # Values are data: a written tensor's autograd history must not reach the levels
        # (they would track gradients, and every later sum with out= would raise).
        value = torch.as_tensor(values, device=self._device).detach()
        if not (value.is_floating_point() or value.dtype in INT_DTYPES):
            raise TypeError(f"values must be real numbers, got dtype={value.dtype}.")
        value = value.to(self._dtype)
        if value.numel() == 1:
            return value.reshape(()).expand(index.shape).contiguous()
        if value.numel() != index.numel():
            raise ValueError(
                f"values has {value.numel()} elements but indices has {index.numel()}; "
                "pass one value per index, or a single value for all of them."
            )
        return value.reshape(-1)

    def _check_range(self, low: int, high: int) -> None:
        if low < 0 or high >= self._capacity:
            bad = low if low < 0 else high
            raise ValueError(
                f"index {bad} is out of range for a tree of capacity {self._capacity}; "
                f"indices must lie in [0, {self._capacity - 1}]."
            )

    def _check_values(self, vmin: float, vmax: float) -> None:
        if math.isnan(vmin) or math.isnan(vmax):
            raise ValueError(
                "values must not be NaN; replace them (e.g. torch.nan_to_num) before writing."
            )


class SumSegmentTree(SegmentTree):
    """Segment tree of sums, with prefix-sum search and a non-zero count.

    Args:
        capacity: number of leaves (any integer >= 1).

    Keyword Args:
        track_nnz: keep :attr:`nnz` up to date on every write (a few extra
            kernels); otherwise it is counted when read. Defaults to ``True``.
        fanout, top_size, dtype, device: see :class:`SegmentTree`.

    Shapes: ``tree[idx] = v`` takes ``idx`` of any shape and ``v`` with as many
    elements (or one value); ``find_sum_bound(t)`` returns int64 indices of
    ``t``'s shape.

    Examples:
        >>> import torch
        >>> from torchrl_ext.segment_tree import SumSegmentTree
        >>> tree = SumSegmentTree(5)
        >>> tree[torch.tensor([1, 3])] = torch.tensor([2.0, 3.0])
        >>> float(tree.summary()), tree.nnz
        (5.0, 2)
        >>> tree.find_sum_bound(torch.tensor([0.0, 1.999, 2.0, 5.0])).tolist()
        [1, 1, 3, 3]
    """

    _neutral = 0.0
    # The top level feeds a float64 prefix sum on every search; storing it in
    # float64 saves a conversion per call and costs 8 bytes per top node.
    _top_dtype = torch.float64

    @makes_kept_tensors  # the count and the prefix buffer, updated in place later
    def __init__(self, capacity: int, *, track_nnz: bool = True, **kwargs: Any) -> None:
        track_nnz = check_bool("track_nnz", track_nnz)
        super().__init__(capacity, **kwargs)
        self._track_nnz = track_nnz
        self._nnz = torch.zeros((), dtype=torch.long, device=self._device)
        # [0, v0, v0 + v1, ..., total]; slot 0 stays 0, the rest is rewritten.
        self._prefix = torch.zeros(
            self._levels[-1].numel() + 1, dtype=torch.float64, device=self._device
        )

    @property
    def nnz(self) -> int:
        """Number of leaves whose value is not zero."""
        if not self._track_nnz:
            return int(torch.count_nonzero(self.leaves))
        return int(self._nnz)

    def _reduce_rows(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return rows.sum(1, dtype=dtype)

    def _check_values(self, vmin: float, vmax: float) -> None:
        if not (math.isfinite(vmin) and math.isfinite(vmax)) or vmin < 0:
            raise ValueError(
                f"a SumSegmentTree holds finite values >= 0, got values in [{vmin}, {vmax}]; "
                "replace NaN/inf and negative values before writing."
            )

    def _before_leaf_write(self, index: torch.Tensor, value: torch.Tensor) -> None:
        if not self._track_nnz:
            return
        old = self._levels[0].index_select(0, index)
        # Repeats carry identical values: count each index once, at its last write.
        once = self._last_write(index) == torch.arange(index.numel(), device=self._device)
        self._nnz += torch.count_nonzero((value != 0) & once) - torch.count_nonzero(
            (old != 0) & once
        )

    def clear(self) -> None:
        super().clear()
        self._nnz.zero_()

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), self._prefix]

    def _top_prefix(self) -> torch.Tensor:
        """Exclusive float64 prefix sums of the top level, ``[0, ..., total]``.

        float64 keeps small values visible next to a large running total.
        Written into a reused buffer: valid until the next call.
        """
        torch.cumsum(self._levels[-1].to(torch.float64), 0, out=self._prefix[1:])
        return self._prefix

    def summary(self) -> torch.Tensor:
        """Sum of all leaves (0-d tensor), consistent with :meth:`find_sum_bound`."""
        return self._top_prefix()[-1].to(self._dtype)

    def find_sum_bound(self, thresholds: torch.Tensor | float | Sequence[float]) -> torch.Tensor:
        """Smallest ``i`` with ``threshold < values[0] + ... + values[i]``.

        Args:
            thresholds: values in ``[0, summary()]``, any shape.

        Returns:
            int64 tensor of ``thresholds``' shape. A threshold equal to the total
            gives the last non-zero index. Thresholds within rounding of a
            prefix sum may resolve to either neighbouring leaf.

        Raises:
            ValueError: if a threshold is negative, NaN or above the total.
        """
        thr = torch.as_tensor(thresholds, device=self._device)
        shape = thr.shape
        thr = thr.reshape(-1).to(torch.float64)
        if thr.numel() == 0:
            return torch.empty(shape, dtype=torch.long, device=self._device)
        prefix = self._top_prefix()
        total = prefix[-1].item()
        tmin, tmax = bounds(thr)
        # summary() (in the tree's dtype) is what a caller sees as "the total";
        # a total summed in another order (ALF's, say) may exceed it by a few
        # ulps, which is rounding, not a caller error.
        total_seen = float(torch.tensor(total, dtype=self._dtype))
        slack = 8 * torch.finfo(self._dtype).eps * max(total, total_seen)
        if not (tmin >= 0 and tmax <= max(total_seen, total) + slack):
            raise ValueError(
                f"thresholds must lie in [0, summary()={total_seen}], got values in "
                f"[{tmin}, {tmax}]; scale uniform draws by summary()."
            )
        node, _ = self._walk(thr.clamp_(max=total), prefix, capped=True)
        return node.reshape(shape)

    def _sample_walk(
        self, thr: torch.Tensor, prefix: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Leaf indices and values for float64 thresholds in ``[0, total)``.

        Below the top, running sums use the tree's dtype (a float64 cumsum over
        short float32 rows is several times slower on CPU), so a threshold
        within rounding of a boundary can land on the neighbouring leaf, and,
        rarely, past the last non-zero child onto a zero leaf. That case is
        detected and walked again with every level capped at its last
        non-zero child.
        """
        node, value = self._walk(thr, prefix, capped=False)
        if len(self._levels) > 1 and not value.detach().amin().item() > 0:
            node, value = self._walk(thr, prefix, capped=True)
        return node, value

    def _walk(
        self, thr: torch.Tensor, prefix: torch.Tensor, *, capped: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        top = self._levels[-1]
        inclusive = prefix[1:]
        # First node whose inclusive prefix exceeds thr: it has a non-zero value,
        # so ties on zero-valued nodes resolve to the non-zero node after them.
        node = torch.searchsorted(inclusive, thr, right=True)
        if capped:
            # thr == total would run past the end: stop at the last non-zero node.
            node = torch.minimum(node, torch.searchsorted(inclusive, prefix[-1:], right=False))
        if len(self._levels) == 1:
            return node, top.index_select(0, node)
        fanout = self._fanout
        lower = self._levels[-2::-1]
        # The remainder below the chosen node, in the dtype of the levels below.
        rest = torch.sub(
            thr, prefix.index_select(0, node),
            out=self._scratch("rest", thr.shape, self._dtype),
        )
        for depth, level in enumerate(lower):
            rows = torch.index_select(
                level.view(-1, fanout), 0, node,
                out=self._scratch("rows", (node.numel(), fanout), level.dtype),
            )
            running = torch.cumsum(rows, 1, out=self._scratch("running", rows.shape, level.dtype))
            child = torch.searchsorted(running, rest.unsqueeze(1), right=True)
            child = child.clamp_(max=fanout - 1)
            if capped:
                last_nonzero = torch.searchsorted(
                    running, running[:, -1:].contiguous(), right=False
                )
                child = torch.minimum(child, last_nonzero)
            value = rows.gather(1, child).squeeze(1)
            node = torch.add(child.squeeze(1), node, alpha=fanout)
            if depth + 1 < len(lower):
                # Rounding can leave a tiny negative remainder; 0 means "the
                # first non-zero leaf below", which is the intended answer.
                rest = (rest - running.gather(1, child).squeeze(1) + value).clamp_(min=0)
        return node, value

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"nnz": self.nnz}

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._nnz.copy_(torch.count_nonzero(self.leaves))


class MinSegmentTree(SegmentTree):
    """Segment tree of minima; unwritten leaves hold ``+inf``.

    Examples:
        >>> import torch
        >>> from torchrl_ext.segment_tree import MinSegmentTree
        >>> tree = MinSegmentTree(4)
        >>> tree[torch.tensor([0, 2])] = torch.tensor([3.0, 1.5])
        >>> float(tree.summary())
        1.5
    """

    _neutral = math.inf

    def _reduce_rows(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return rows.amin(1)


class MaxSegmentTree(SegmentTree):
    """Segment tree of maxima; unwritten leaves hold ``-inf``.

    Examples:
        >>> import torch
        >>> from torchrl_ext.segment_tree import MaxSegmentTree
        >>> tree = MaxSegmentTree(4)
        >>> tree[torch.tensor([0, 2])] = torch.tensor([3.0, 1.5])
        >>> float(tree.summary())
        3.0
    """

    _neutral = -math.inf

    def _reduce_rows(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return rows.amax(1)


# ----------------------------------------------------------------------
def _store(level: torch.Tensor, values: torch.Tensor, parents: torch.Tensor | None) -> None:
    if parents is None:
        level[: values.shape[0]] = values
    else:
        level.index_copy_(0, parents, values)
