"""Prioritized sampling on pure-torch segment trees (no compiled extension).

:class:`PrioritizedSampler` is a subclass of TorchRL's
:class:`torchrl.data.PrioritizedSampler`, so everything that checks
``isinstance(sampler, PrioritizedSampler)`` keeps working:
``TensorDictReplayBuffer`` priority write-back, ``update_tensordict_priority``,
``ReplayBufferTrainer`` hooks and parameter schedulers. Only the trees and the
hot paths differ: the trees are :mod:`torchrl_ext.segment_tree`'s, which need
no ``torchrl._torchrl`` and run on any device.
"""
from __future__ import annotations

import math
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data import PrioritizedSampler as _TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from torchrl_ext import _compat
from torchrl_ext._checks import (
    CheckedSetting, bounds, check_batch_size, check_bool, check_choice, check_device, check_int, check_priorities,
    check_real, check_state_keys, makes_kept_tensors, read_only,
)
from torchrl_ext.io.state_files import StateFiles, load_json
from torchrl_ext.samplers._priority_tree import PrioritySegmentTree, reduce_per_item
from torchrl_ext.segment_tree import INT_DTYPES
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["SHARING_REFUSED", "PrioritizedSampler", "PrioritizedSamplerWithoutReplacement"]

WEIGHT_CONVENTIONS = ("per", "alf")
REDUCTIONS = ("max", "min", "mean", "median", "sum")
EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
#: Why a flat prioritized sampler cannot be handed to another process, and the fixes.
SHARING_REFUSED = (
    "{name} cannot be shared between processes: its priority trees live in one process, so "
    "priorities of items written by other processes would never reach them. Fix: use a "
    "per-env prioritized ring (torchrl_ext.presets.alf_replay_buffer(..., "
    "prioritized_sampling=True)), whose sampler rebuilds its priorities in the sampling "
    "process from the shared ring cursors, or keep the whole buffer in one Ray actor "
    "(torchrl_ext.distributed.ray_replay_buffer) and write to it from any process."
)


def _checked_exponents(state: dict[str, Any]) -> tuple[float, float, float]:
    """``(alpha, beta, eps)`` of a sampler checkpoint, torchrl_ext's or TorchRL's, checked."""
    return (check_real("alpha", state.get("_alpha"), low=0.0), check_real("beta", state.get("_beta"), low=0.0),
            check_real("eps", state.get("_eps"), low=0.0))


def priority_tensor(priority: Any, name: str = "priority") -> torch.Tensor:
    """``priority`` as a tensor (float64 unless it is one: a float32 cast turns 1e39 into inf);
    ``TypeError`` naming ``name`` when it holds no numbers (``torch.as_tensor`` would
    raise about ``new()``)."""
    if isinstance(priority, torch.Tensor):
        return priority
    try:
        return torch.as_tensor(priority, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a real number or a tensor of them, got {name}={priority!r}.") from None


class PrioritizedSampler(StateFiles, _TorchRLPrioritizedSampler):
    r"""Prioritized experience replay (Schaul et al., 2015) on pure-torch trees.

    Index ``i`` is drawn with probability :math:`(p_i + \epsilon)^\alpha / \sum_j
    (p_j + \epsilon)^\alpha`. New data gets ``default_priority``: the largest
    raw priority seen (or, with ``max_priority_within_buffer=True``, the
    largest one still in the buffer), or ``initial_priority`` before there is
    one: TorchRL's rule, where that is 1.0.

    Args:
        max_capacity: capacity of the storage.
        alpha: priority exponent, ``>= 0`` (0 is uniform sampling).
        beta: importance-sampling exponent (>= 0; usually annealed from about 0.4 to 1).
        eps: added to every priority before the exponent. Defaults to 1e-8.
        dtype: dtype of the stored priorities, ``torch.float32`` (default) or
            ``torch.float64`` (also accepted as ``"float32"`` / ``"float64"``).
        reduction: how a multi-element priority per sample (per agent, per
            step of a stored trajectory) is reduced: ``"max"``, ``"min"``,
            ``"mean"``, ``"median"`` or ``"sum"``. Defaults to ``"max"``.
        max_priority_within_buffer: track the max priority among the stored
            items instead of the max ever seen (about 3% more tree memory).
            With ``alpha == 0`` stored values no longer reveal raw priorities,
            so the max ever seen is used.
        device: device of the trees. Defaults to the storage's device when it
            is a CUDA device, else the CPU.

    Keyword Args:
        initial_priority: priority given to new data while no priority is known
            (seen, or stored with ``max_priority_within_buffer``). Defaults to 1.0.
        weights: importance-weight convention written to ``priority_weight``.
            ``"per"`` (default): :math:`w_i = (N P_i)^{-\beta} / \max_j w_j =
            (p_i / p_{\min})^{-\beta}`. ``"alf"``: ALF's
            :math:`p_i \cdot \mathrm{nnz} / \sum_j p_j` (the priority relative
            to the mean non-zero priority, before any exponent), where
            :math:`p` is the stored ``(priority + eps) ** alpha``.
        fanout: children per tree node. Defaults to 32.

    Shapes: ``sample`` returns a ``[B]`` index (a tuple of ``[B]`` coordinates
    for multi-dimensional storages) and ``info["priority_weight"]`` of shape
    ``[B]``. ``update_priority(index, priority)`` takes ``priority`` of shape
    ``[N]``, ``[N, *extra]`` (reduced with ``reduction``) or a scalar.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl_ext.samplers import PrioritizedSampler
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100),
        ...     sampler=PrioritizedSampler(100, alpha=0.6, beta=0.4),
        ...     batch_size=8,
        ... )
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(10, 3)}, [10]))
        >>> batch = rb.sample()
        >>> batch["priority_weight"].shape
        torch.Size([8])
        >>> batch["td_error"] = torch.rand(8)
        >>> rb.update_tensordict_priority(batch)
    """

    _stratified = False
    state_files = ("trees.safetensors", "sampler_metadata.json")

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float32,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: torch.device | str | None = None,
        *,
        initial_priority: float = 1.0,
        weights: str = "per",
        fanout: int = 32,
    ) -> None:
        # TorchRL's __init__ is not called: it would build its C++ trees.
        check_int("max_capacity", max_capacity, minimum=1)
        check_choice("reduction", reduction, REDUCTIONS, one_of=True)
        check_choice("weights", weights, WEIGHT_CONVENTIONS, one_of=True)
        self._priority_offset = check_real("eps", eps, low=0.0)
        self._initial_priority = check_real("initial_priority", initial_priority, low=0.0)
        if dtype in ("float32", "float64"):  # configs name dtypes as strings
            dtype = getattr(torch, dtype)
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got dtype={dtype!r}.")
        self._capacity = max_capacity
        self._priority_exponent = check_real("alpha", alpha, low=0.0)
        self.beta = beta
        self.reduction = reduction
        self.dtype = dtype
        self._max_in_buffer = check_bool("max_priority_within_buffer", max_priority_within_buffer)
        self._tree_device = check_device("device", device) if device is not None else None
        self._weights = weights
        self._fanout = fanout
        self._init()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self._capacity}, alpha={self._priority_exponent}, "
            f"beta={self._weight_exponent}, eps={self._priority_offset}, weights={self._weights!r}, "
            f"device={self.device})"
        )

    # ------------------------------------------------------------------
    # Trees
    @makes_kept_tensors  # sample() may rebuild the tree inside torch.inference_mode()
    def _init(self) -> None:
        self._tree = PrioritySegmentTree(
            self._capacity, track_nnz=self._weights == "alf", track_max=self._max_in_buffer,
            fanout=self._fanout, dtype=self.dtype, device=self._tree_device or torch.device("cpu"),
        )
        self._max_seen = -math.inf
        # Every leaf at or above this index is zero. A leaf can be written for an item
        # that is not stored (a standalone update_priority, a write-back of a batch sampled
        # before the storage was emptied): sample() zeroes those before drawing.
        self._written_below = 0

    @property
    def _max_priority(self) -> tuple[float | None, None]:
        # TorchRL's code reads this tuple; ours is derived from the trees.
        value = self._max_raw_priority()
        return (None if value == -math.inf else value, None)

    @_max_priority.setter
    def _max_priority(self, value: Any) -> None:
        # TorchRL's own bookkeeping writes here; the trees are the truth.
        return

    def _max_raw_priority(self) -> float:
        if self._max_in_buffer and self._priority_exponent > 0:
            # The tree stores (p + eps) ** alpha, which is increasing in p.
            stored = float(self._tree.max())
            if not stored > 0:
                return -math.inf
            return max(stored ** (1.0 / self._priority_exponent) - self._priority_offset, 0.0)
        return self._max_seen

    max_size = read_only("_capacity", "Capacity of the trees (the ``max_capacity`` given).")
    device = read_only("_tree.device", "Device of the priority trees.")
    tree = read_only(
        "_tree", "The sum tree of the transformed priorities ``(p + eps) ** alpha`` (read it, do not write it)."
    )

    def _check_storage(self, storage: Storage) -> None:
        """Refuses per-env rings (``EnvRingReplayBuffer`` asks when it is built): one priority
        per stored row cannot index their ``(env, position)`` steps."""
        if isinstance(storage, EnvRingStorage):
            raise TypeError(
                f"{type(self).__name__} keeps a priority per row of a tensor storage, got an "
                "EnvRingStorage; for per-env rings use PrioritizedTrajectorySampler."
            )

    def _trees_follow_storage(self, storage: Storage) -> None:
        """Without a ``device`` given, trees follow a CUDA storage (rebuilt empty on it before
        the first sample), as TorchRL's sampler does; any other storage keeps them on the CPU."""
        if self._tree_device is not None:
            return
        device = getattr(storage, "device", None)
        if device is not None and device != "auto" and torch.device(device).type == "cuda":
            self._tree_device = torch.device(device)
            self._init()

    @property
    def default_priority(self) -> float:
        """Raw priority given to new data: the max priority, or ``initial_priority`` before one."""
        largest = self._max_raw_priority()
        return self._initial_priority if largest == -math.inf else largest

    initial_priority = read_only("_initial_priority", "Priority given to new data while no priority is known.")
    weights = read_only("_weights", 'Importance-weight convention, ``"per"`` or ``"alf"``.')

    beta = CheckedSetting(
        check_real, "Importance-sampling exponent, ``>= 0`` (usually annealed to 1); settable (schedulable).",
        attr="_weight_exponent", low=0.0,
    )

    eps = read_only("_priority_offset", "Added to every priority before the exponent.")

    alpha = CheckedSetting(
        check_real, "Priority exponent ``>= 0``; setting it re-transforms stored priorities.",
        hook="_alpha_changes", attr="_priority_exponent", low=0.0,
    )

    def _alpha_changes(self, alpha: float) -> None:
        # Re-transforms (or refuses, keeping the old alpha and trees) before alpha changes.
        if alpha != self._priority_exponent:
            self._retransform_priority_trees(self._priority_exponent, alpha)

    # ------------------------------------------------------------------
    # Sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict[str, torch.Tensor]]:
        self._trees_follow_storage(storage)
        stored = len(storage)
        if stored == 0:
            raise RuntimeError(
                f"{EMPTY_STORAGE_ERROR} Extend the buffer before calling sample()."
            )
        check_batch_size(batch_size)
        tree = self._tree
        if self._written_below > stored:
            # Leaves of items >= stored hold no data: zeroed, so they are never drawn.
            index = torch.arange(stored, min(self._written_below, self._capacity), device=tree.device)
            tree._write(index, torch.zeros(index.numel(), dtype=self.dtype, device=tree.device))
            self._written_below = stored
        drawn = None if self._stratified else tree.draw_by_rejection(batch_size, _compat.generator(self))
        if drawn is not None:
            index, value = drawn
            total = tree._top_prefix()[-1].item() if self._weights == "alf" else math.nan
        else:
            drawn = tree.walk_draw(batch_size, _compat.generator(self), stratified=self._stratified)
            if drawn is None:
                raise RuntimeError(
                    "every stored priority is zero, so nothing can be sampled; give some "
                    "items a positive priority (or use eps > 0)."
                )
            index, value, total = drawn
        per = self._weights == "per"
        if value.is_cpu:  # numpy: a fraction of a torch kernel per call at a batch's size
            array = value.numpy()
            weight = torch.from_numpy(
                np.power(array / tree.min_nonzero(), -self._weight_exponent) if per else array * tree.nnz / total
            )
        elif per:
            weight = value.div(tree.min_nonzero()).pow_(-self._weight_exponent)
        else:
            weight = value.mul(tree._nnz.to(value.dtype)).div_(total)
        if storage.ndim > 1:
            index = torch.unravel_index(index, storage.shape)
        return index, {"priority_weight": weight}

    def _check_capacity(self, storage: TensorStorage, num_envs: int | None = None) -> None:
        """Refuses a storage of more cells than the trees hold: as allocated, or before its first
        write, as a first write of ``num_envs`` envs would allocate it (the buffer asks then).
        Storages of ``ndim=2`` only: TorchRL rounds their ``max_size`` up to whole env columns."""
        if not isinstance(storage, TensorStorage) or storage.ndim != 2:
            return
        stored = _compat.stored_data(storage)
        if storage.initialized and stored is not None:
            rows, num_envs = int(stored.shape[0]), int(stored.shape[1])
        elif num_envs:
            rows = -(-storage.max_size // num_envs)  # TorchRL rounds the rows up to whole env columns
        else:
            return
        cells = rows * num_envs
        if cells > self._capacity:
            raise ValueError(
                f"max_capacity={self._capacity} is smaller than the storage's {cells} cells "
                f"({rows} rows x {num_envs} envs): build the sampler with max_capacity={cells} "
                f"(or give the storage a max_size that is a multiple of num_envs={num_envs})."
            )

    # ------------------------------------------------------------------
    # Priorities
    def extend(self, index: torch.Tensor | tuple) -> None:
        return  # new data gets its priority in (TorchRL's) mark_update; the trees track the maximum

    add = extend

    @torch.no_grad()
    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: Storage | None = None,
    ) -> None:
        """Sets the raw priorities of ``index`` (last write wins for repeats).

        Args:
            index: flat indices ``[N]``, or ``[N, ndim]`` / a tuple of ``[N]``
                coordinates for multi-dimensional storages. ``-1`` entries (items
                a ``TensorDictMaxValueWriter`` did not write) are ignored.
            priority: ``[N]``, ``[N, *extra]`` reduced with ``reduction``, or
                one value for all.

        Keyword Args:
            storage: needed to flatten coordinates of a multi-dimensional storage.
                When given (TorchRL's buffers always pass it), indices of items it does
                not hold now (``>= len(storage)``) are refused. Without it, such
                priorities are kept only until the next :meth:`sample`, which never
                draws an item that is not stored.

        Raises:
            ValueError: on indices outside the capacity or (with ``storage``) not
                stored, NaN, infinite or negative priorities, or a per-item priority
                ``[N, *extra]`` whose ``extra`` dims hold no element. Nothing is written then.
        """
        if storage is not None:  # before the first write, as sample() does: a move empties the trees
            self._trees_follow_storage(storage)
        device = self._tree.device
        index = self._tree_rows(index, storage, device)
        priority = self._priority_vector(priority, index.shape[0], device)
        if index.numel() == 0:
            return
        low, high = bounds(index)
        if low < 0:
            keep = index != -1
            index, priority = index[keep], priority[keep]
            if index.numel() == 0:
                return
            low, high = bounds(index)
        if low < 0 or high >= self._capacity:
            bad = low if low < 0 else high
            raise ValueError(
                f"index {bad} is out of range for a sampler of max_capacity "
                f"{self._capacity}; indices must lie in [0, {self._capacity - 1}] "
                "(or be -1 to skip an entry)."
            )
        if storage is not None and high >= len(storage):
            raise ValueError(
                f"index {high} is not stored: the storage holds {len(storage)} items, so "
                f"priorities can be written for indices in [0, {len(storage) - 1}] only. A "
                "batch sampled before rb.empty() (or a load) cannot write its priorities back."
            )
        pmax = check_priorities("priority", priority)
        self._tree._write(index, self._transformed(priority, pmax))
        self._max_seen = max(self._max_seen, pmax)
        self._written_below = max(self._written_below, high + 1)

    def check_priority(self, priority: Any, num_items: int) -> None:
        """Raises the ``TypeError`` / ``ValueError`` that :meth:`update_priority` would raise
        for ``priority`` given for ``num_items`` items, and writes nothing: buffers call it
        before they store a batch that carries priorities, so a refused priority never
        leaves the rows stored without one."""
        vector = self._priority_vector(priority, num_items, self._tree.device)
        if vector.numel():
            self._transformed(vector, check_priorities("priority", vector))

    def _transformed(self, priority: torch.Tensor, pmax: float) -> torch.Tensor:
        """``(priority + eps) ** alpha`` in the trees' dtype, for checked raw priorities
        whose largest is ``pmax``; ``ValueError`` when a value overflows that dtype."""
        priority = priority.to(self.dtype)
        if priority.is_cpu:  # two numpy calls cost a fraction of two torch kernels here
            with np.errstate(over="ignore"):  # an overflow is refused below
                value = torch.from_numpy(np.power(priority.numpy() + self._priority_offset, self._priority_exponent))
        else:
            value = priority.add(self._priority_offset).pow_(self._priority_exponent)
        if not bool(torch.isfinite(value).all()):
            # A finite priority stored as inf would make every draw NaN, and the max seen
            # would give all new data that inf.
            raise ValueError(self._overflow_message(f"priority={pmax:g}", self._priority_exponent))
        return value

    def _overflow_message(self, what: str, alpha: float) -> str:
        return (
            f"{what} with alpha={alpha:g} and eps={self._priority_offset:g} gives "
            f"(priority + eps) ** alpha above {torch.finfo(self.dtype).max:.4g}, the largest "
            f"{self.dtype} value the trees hold; nothing was written. Scale the priorities down, "
            "lower alpha or build the sampler with dtype=torch.float64."
        )

    def _tree_rows(
        self, index: Any, storage: Storage | None, device: torch.device
    ) -> torch.Tensor:
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        index = torch.as_tensor(index, device=device)
        if index.dtype.is_floating_point or index.dtype is torch.bool:
            raise TypeError(f"index must hold integers, got dtype={index.dtype}.")
        index = index.long()
        if index.ndim <= 1:
            return index.reshape(-1)
        if storage is None or not hasattr(storage, "shape"):
            raise ValueError(
                f"index of shape {tuple(index.shape)} holds coordinates of a "
                "multi-dimensional storage; pass storage= so they can be flattened."
            )
        shape = tuple(storage.shape)
        strides = torch.tensor([math.prod(shape[d + 1:]) for d in range(len(shape))], device=device)
        return (index * strides).sum(-1)

    def _priority_vector(self, priority: Any, n: int, device: torch.device) -> torch.Tensor:
        """``priority`` as ``[n]`` raw values (float64 unless a float32 tensor: :func:`priority_tensor`)."""
        priority = priority_tensor(priority).to(device).detach()
        if not (priority.is_floating_point() or priority.dtype in INT_DTYPES):
            raise TypeError(f"priority must hold real numbers, got dtype={priority.dtype}.")
        if priority.dtype != torch.float32:
            priority = priority.to(torch.float64)
        if priority.numel() == 1:
            return priority.reshape(()).expand(n)
        if priority.ndim >= 1 and priority.shape[0] == n:
            if priority.ndim == 1:
                return priority
            per_item = math.prod(priority.shape[1:])
            if per_item == 0:  # nothing to reduce: no reduction gives an item a priority
                raise ValueError(
                    f"priority of shape {tuple(priority.shape)} holds no value per item (a dim after the "
                    f"first has size 0), so reduction={self.reduction!r} has nothing to reduce; "
                    f"pass at least one priority per item, e.g. shape [{n}] or [{n}, k] with k >= 1."
                )
            if priority.numel():  # each agent's or step's: a reduction can hide a negative or inf one
                check_priorities("priority", priority)
            return reduce_per_item(priority.reshape(n, per_item), self.reduction)
        raise ValueError(
            f"priority of shape {tuple(priority.shape)} does not match {n} indices; pass "
            f"[{n}], [{n}, ...] (reduced with reduction={self.reduction!r}) or a scalar."
        )

    def _retransform_priority_trees(self, old_alpha: float, new_alpha: float) -> None:
        stored = self._tree.leaves
        written = torch.nonzero(stored > 0).squeeze(1)
        if written.numel() == 0 or old_alpha == 0:
            # With alpha == 0 every stored value is 1: the raw priorities are
            # gone, and entries are corrected as they get new priorities.
            return
        raw = (stored[written].double().pow(1.0 / old_alpha) - self._priority_offset).clamp_min(0)
        new = (raw + self._priority_offset).pow(new_alpha).to(self.dtype)
        if not bool(torch.isfinite(new).all()):
            raise ValueError(self._overflow_message(f"the stored priority {raw.max().item():g}", new_alpha)
                             .replace("nothing was written", "alpha and the priorities were kept"))
        self._tree._write(written, new)

    _empty = _init  # TorchRL's empty(): fresh, empty trees

    # ------------------------------------------------------------------
    # Checkpoints: state dicts (the key names of earlier releases: "_alpha", "_sum_tree", ...),
    # files (trees.safetensors and sampler_metadata.json) and the pickling rule.
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

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`, or the ``state_dict()`` of TorchRL's
        ``PrioritizedSampler`` (priorities kept); everything is checked before anything changes."""
        tree = state_dict.get("_sum_tree") if isinstance(state_dict, dict) else None
        if hasattr(tree, "capacity") and all(callable(getattr(tree, n, None)) for n in ("scan_lower_bound", "query")):
            # TorchRL's C++ trees round their size up to the power of two above max_capacity.
            size = tree.capacity() if callable(tree.capacity) else tree.capacity
            leaves = torch.as_tensor(tree[torch.arange(size)], dtype=torch.float64)
            fits = size == 1 << self._capacity.bit_length() and not bool(leaves[self._capacity:].any())
            capacity = self._capacity if fits else f"{size} (rounded up)"
            return self._load_torchrl_state(state_dict, leaves[: self._capacity], capacity)
        if not isinstance(tree, dict):
            raise ValueError(
                "state_dict was not produced by a PrioritizedSampler (torchrl_ext's or TorchRL's); "
                "pass the sampler's own state_dict()."
            )
        check_state_keys(state_dict, ("_alpha", "_beta", "_eps", "_initial_priority", "_max_priority_within_buffer",
                                      "_max_seen", "_weights"))
        self._check_geometry(tree.get("capacity"))
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


class PrioritizedSamplerWithoutReplacement(PrioritizedSampler):
    """Prioritized sampling with stratified draws, ALF's "without replacement".

    The total priority mass is cut into ``batch_size`` equal strata and one
    index is drawn in each, so a batch covers the distribution evenly (lower
    variance than independent draws). An item whose share of the mass exceeds
    ``1 / batch_size`` can still appear more than once. Not TorchRL's
    ``replacement=False``: ``PrioritizedSampler(..., replacement=False)`` raises
    ``TypeError``, as TorchRL's does.
    """

    _stratified = True


