"""Prioritized windows from per-environment rings (ALF's prioritized ``get_batch``).

One priority per window start (leaf ``env * max_length + slot`` of a sum tree); only
*valid* starts (whole window stored, outside the ignored earliest steps) have a non-zero
leaf. The leaves follow the storage lazily, before each sample or update (``_sync``).

Differences from ALF, all deliberate:

* an update for a position that is no longer a valid start (overwritten,
  dequeued, in the ignored earliest steps, or in the last ``T - 1`` steps)
  is skipped, never raised (ALF raises when all are stale, Q14) and never
  applied (ALF re-enables such positions, Q15);
* an env holding fewer than ``batch_length`` steps has no valid start, so
  no negative position or partial window is ever drawn (ALF: Q16);
* recent-data sampling works together with priorities: recent windows get
  importance weight 1 (ALF fails to build the batch, Q13);
* ``batch_length`` can change between samples: the leaves are rebuilt,
  and starts that become valid again keep the priority they had.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from torchrl_ext import _compat
from torchrl_ext._checks import (
    CheckedSetting, check_choice, check_indices, check_priorities, check_real, check_state_keys, makes_kept_tensors,
)
from torchrl_ext.io.state_files import StateFiles
from torchrl_ext.samplers._priority_tree import PrioritySegmentTree
from torchrl_ext.samplers.prioritized import priority_tensor
from torchrl_ext.samplers._streams import expand_ranges
from torchrl_ext.samplers.trajectory import TrajectorySampler
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["PrioritizedTrajectorySampler"]

_DTYPE = torch.float32  # of the priority tree
_UNSET = -1.0  # stored priority of a slot whose current step was never prioritized


class PrioritizedTrajectorySampler(StateFiles, TrajectorySampler):
    """Windows drawn with probability proportional to their start's priority.

    New windows get ``max(largest current leaf, (initial_priority + eps) ** alpha)``
    when the sampler next follows the storage (at the next sample or priority update):
    the writes since then count as one, so the windows they overwrote no longer count.
    ALF assigns it at each ``add_batch``; the two differ only where a window holding the
    largest priority is overwritten between two samples (following every write costs
    many times the write). Priorities given to :meth:`update_window_priority` are stored
    as ``(priority + eps) ** alpha``.

    Args:
        batch_length: steps per window.

    Keyword Args:
        alpha: priority exponent (ALF stores priorities as given: ``alpha=1``).
        beta: importance-weight exponent for ``weights="per"``.
        eps: added to priorities before the exponent.
        initial_priority: priority of new windows (at least).
        weights: ``"alf"`` gives ``leaf * nnz / total`` (ALF's convention: the
            algorithm applies ``** -beta`` itself); ``"per"`` gives
            ``(leaf / min_leaf) ** -beta``, TorchRL's convention.
        num_earliest_frames_ignored, with_replacement, recent_data_steps,
        recent_data_ratio: see :class:`TrajectorySampler`. Without
            replacement the draws are stratified over the priority mass.

    Shape contract:
        ``info`` adds ``priority_weight`` ``[B]`` to ``env_ids`` and ``positions``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import EnvRingReplayBuffer
        >>> from torchrl_ext.samplers import PrioritizedTrajectorySampler
        >>> sampler = PrioritizedTrajectorySampler(batch_length=2)
        >>> rb = EnvRingReplayBuffer(num_envs=2, max_length=6, sampler=sampler)
        >>> for t in range(4):
        ...     _ = rb.extend(TensorDict({"t": torch.full((2,), float(t))}, [2]))
        >>> # Only env 1's window starting at position 2 keeps a priority.
        >>> sampler.update_window_priority([0, 0, 0, 1, 1], [0, 1, 2, 0, 1], 0.0)
        >>> batch = rb.sample(3)
        >>> batch["env_ids"][:, 0].tolist(), batch["positions"][:, 0].tolist()
        ([1, 1, 1], [2, 2, 2])
    """

    state_files = ("trajectory_priorities.safetensors", "trajectory_sampler.json")

    def __init__(
        self,
        batch_length: int = 1,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        eps: float = 0.0,
        initial_priority: float = 1.0,
        weights: str = "alf",
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_length, **kwargs)
        self._alpha, self._eps, self._initial_priority = 1.0, 0.0, 1.0  # then each setter checks
        self.alpha, self.eps, self.initial_priority = alpha, eps, initial_priority
        self.beta, self.weights = beta, weights
        self._empty()
        self._ignored = self.num_earliest_frames_ignored  # the storage may need more

    # ------------------------------------------------------------------
    # Settings: each setter runs the constructor's check (new windows use them at the next sync)
    # The hook refuses a change whose new-window priority would overflow the tree.
    alpha = CheckedSetting(
        check_real, "Priority exponent ``>= 0`` for priorities written from now on.",
        hook="_new_window_priority", low=0.0,
    )
    eps = CheckedSetting(
        check_real, "Added to priorities before the exponent, ``>= 0``.", hook="_new_window_priority", low=0.0
    )
    initial_priority = CheckedSetting(
        check_real, "Priority of new windows (at least), ``>= 0``.", hook="_new_window_priority", low=0.0
    )
    beta = CheckedSetting(
        check_real, 'Importance-weight exponent in ``[0, 1]`` for ``weights="per"``.', low=0.0, high=1.0
    )
    weights = CheckedSetting(
        check_choice, 'Importance-weight convention, ``"alf"`` or ``"per"``.', allowed=("alf", "per")
    )

    def _transformed(self, priorities: torch.Tensor, what: str, **changes: float) -> torch.Tensor:
        """``(priorities + eps) ** alpha`` (float64 ``priorities``, with ``changes`` to the
        settings) in the tree dtype; ``ValueError`` when one overflows it (stored as inf,
        it would make every weight NaN)."""
        alpha, eps = changes.get("alpha", self._alpha), changes.get("eps", self._eps)
        values = (priorities + eps).pow_(alpha).to(_DTYPE)
        if not bool(torch.isfinite(values).all()):
            raise ValueError(
                f"{what} with alpha={alpha:g} and eps={eps:g} gives (priority + eps) ** alpha "
                f"above {torch.finfo(_DTYPE).max:.4g}, the largest {_DTYPE} value of the priority "
                "tree; nothing was changed. Use smaller priorities or a smaller alpha."
            )
        return values

    def _new_window_priority(self, **changes: float) -> float:
        """``(initial_priority + eps) ** alpha`` with ``changes``, checked as priorities are."""
        initial = changes.pop("initial_priority", self._initial_priority)
        value = torch.tensor([initial], dtype=torch.float64)
        return float(self._transformed(value, f"initial_priority={initial:g}", **changes))

    # ------------------------------------------------------------------
    # Keeping the leaves in step with the storage
    def _sync(self, storage: EnvRingStorage) -> None:
        num_leaves = storage.num_envs * storage.max_length
        if self._tree is None or self._tree.capacity != num_leaves:
            # Written in place later, maybe outside an inference_mode() the first sync ran in.
            with torch.inference_mode(False):
                self._tree = PrioritySegmentTree(num_leaves, track_max=True, dtype=_DTYPE)
                self._stored = torch.full((num_leaves,), _UNSET)
            self._seen = torch.zeros(3, storage.num_envs, dtype=torch.long)
            self._seen_geometry = None
        now = torch.stack([storage.positions, storage.sizes, storage.resets])
        self._ignored = self.ignored_frames(storage)
        geometry = (self._batch_length, self._ignored)
        # Counters only move forward between clears; another storage, a load or a position
        # that went back means the steps (and their priorities) are not the ones seen. The
        # storage is known by a weak reference: an id can be reused once a storage is freed.
        replaced = (now[2] != self._seen[2]) | (now[0] < self._seen[0])
        seen = self._seen_source
        if seen is not None and (seen[0]() is not storage or seen[1] != storage.load_count):
            replaced[:] = True
        self._seen_source = (weakref.ref(storage), storage.load_count)
        # Before choosing how to update the leaves: on every path, a slot written since the
        # last sync holds a new step, which must not inherit the overwritten step's priority.
        self._stored.view(storage.num_envs, -1)[replaced] = _UNSET
        kept, length = (~replaced).nonzero().squeeze(1), storage.max_length
        p0, p1 = self._seen[0, kept], now[0, kept]
        written = _leaves_of(kept, torch.maximum(p0, p1 - length), p1 - 1, length)
        self._stored[written] = _UNSET
        if geometry != self._seen_geometry or bool(replaced.any()):
            self._rebuild(storage)
        else:
            changed = (now != self._seen).any(0).nonzero().squeeze(1)
            if changed.numel():
                self._advance(storage, changed, written)
        self._seen, self._seen_geometry = now, geometry

    def _valid_bounds(self, pos: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pos - size + self._ignored, pos - self._batch_length

    def _advance(self, storage: EnvRingStorage, env: torch.Tensor, written: torch.Tensor) -> None:
        """Leaves of the ``env`` that moved on; ``written`` are the slots :meth:`_sync` found rewritten."""
        length = storage.max_length
        p1 = storage.positions[env]
        a0, b0 = self._valid_bounds(self._seen[0, env], self._seen[1, env])
        a1, b1 = self._valid_bounds(p1, storage.sizes[env])
        # Starts that left the valid range and whose slot still holds them.
        left = _leaves_of(env, torch.maximum(a0, p1 - length), torch.minimum(a1, b0 + 1) - 1, length)
        zeros = torch.cat([written, left])
        if zeros.numel():
            self._tree._write(zeros, torch.zeros(zeros.numel(), dtype=self._tree.dtype))
        new = _leaves_of(env, torch.maximum(b0 + 1, a1), b1, length)
        if new.numel():
            self._enable(new)

    def _enable(self, leaves: torch.Tensor) -> None:
        """Starts that became valid: their own priority if they had one, else a new one."""
        stored = self._stored[leaves]
        known = stored != _UNSET
        if bool(known.any()):
            self._tree._write(leaves[known], stored[known].to(self._tree.dtype))
        if not bool(known.all()):
            new = leaves[~known]
            value = max(float(self._tree.max()), self._new_window_priority())
            self._tree._write(new, torch.full((new.numel(),), value, dtype=self._tree.dtype))
            self._stored[new] = value

    def _rebuild(self, storage: EnvRingStorage) -> None:
        """All leaves from scratch (after a clear or a new batch_length)."""
        length = storage.max_length
        pos = storage.positions.unsqueeze(1)
        a, b = self._valid_bounds(pos, storage.sizes.unsqueeze(1))
        slot = torch.arange(length)
        latest = pos - 1 - (pos - 1 - slot) % length  # newest position held by each slot
        valid = ((latest >= a) & (latest <= b)).reshape(-1)
        self._tree.clear()
        self._enable(valid.nonzero().squeeze(1))

    # ------------------------------------------------------------------
    def _draw_windows(
        self, storage: EnvRingStorage, n: int, eligible: np.ndarray, count: np.ndarray, latest: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Windows drawn by priority (not by the uniform draws' arrays), with their ``priority_weight``."""
        self._storage_ref = storage
        self._sync(storage)
        tree, length = self._tree, storage.max_length
        if n == 0:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty, {"priority_weight": torch.empty(0, dtype=tree.dtype)}
        drawn = tree.walk_draw(n, _compat.generator(self), stratified=not self.with_replacement)
        if drawn is None:
            raise ValueError(
                "every valid window has priority 0, so none can be drawn; give some windows a "
                "positive priority (or use eps > 0)."
            )
        leaf, value, total = drawn
        env, slot = leaf // length, leaf % length
        pos = storage.positions[env]
        start = pos - 1 - (pos - 1 - slot) % length
        if self.weights == "alf":
            weight = value * tree.nnz / total
        else:
            weight = (value / tree.min_nonzero()).pow_(-self.beta)
        return env, start, {"priority_weight": weight}

    # ------------------------------------------------------------------
    @torch.no_grad()
    def update_window_priority(self, env_ids: Any, positions: Any, priorities: Any) -> None:
        """Sets the priority of the windows starting at ``positions`` of ``env_ids``.

        Entries whose position is no longer a valid start are skipped.

        Args:
            env_ids: ``[N]`` env ids (or one for all).
            positions: ``[N]`` window start positions (or one for all).
            priorities: ``[N]`` raw priorities (or one for all).

        Raises:
            ValueError: on NaN, infinite or negative priorities, priorities whose
                ``(priority + eps) ** alpha`` overflows float32, lengths that differ
                (other than 1), or env ids out of range (nothing is written then).
            TypeError: on priorities that are not real numbers.
        """
        storage = getattr(self, "_storage_ref", None)
        if storage is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a buffer yet; build the buffer "
                "with this sampler (or sample once) before updating priorities."
            )
        env_ids = check_indices("env_ids", env_ids, "env ids").reshape(-1).cpu()
        positions = check_indices("positions", positions, "positions").reshape(-1).cpu()
        priorities = _as_float64("priorities", priorities).reshape(-1)
        lengths = {"env_ids": env_ids.numel(), "positions": positions.numel(), "priorities": priorities.numel()}
        if len(set(lengths.values()) - {1}) > 1:
            raise ValueError(
                f"env_ids, positions and priorities must have one length N (or length 1, used for "
                f"all), got lengths {lengths}; nothing was written."
            )
        env_ids, positions, priorities = torch.broadcast_tensors(env_ids, positions, priorities)
        if env_ids.numel() == 0:
            return
        storage.check_env_ids(env_ids)
        transformed = self._transformed(priorities, f"priorities={check_priorities('priorities', priorities):g}")
        self._sync(storage)
        a, b = self._valid_bounds(storage.positions[env_ids], storage.sizes[env_ids])
        keep = (positions >= a) & (positions <= b)
        if not bool(keep.any()):
            return
        leaves = env_ids[keep] * storage.max_length + positions[keep] % storage.max_length
        values = transformed[keep]
        self._tree._write(leaves, values)
        self._stored[leaves] = values.to(self._stored.dtype)

    def check_priority(self, priority: Any, num_items: int) -> None:
        """Raises the ``ValueError`` :meth:`update_window_priority` would raise for these
        priority values, writing nothing (buffers call it before storing a batch)."""
        values = _as_float64("priorities", priority).reshape(-1)
        if values.numel():
            self._transformed(values, f"priorities={check_priorities('priorities', values):g}")

    def update_priority(
        self, index: Any, priority: Any, *, storage: EnvRingStorage | None = None
    ) -> None:
        """TorchRL's hook: ``index`` is a sample's ``index`` (``[B, T, 2]`` or ``[B, 2]``).

        The window is named by its first step; a ``[B, T]`` priority is
        reduced with ``max`` over time.
        """
        if storage is not None:
            self._storage_ref = storage
        index = torch.as_tensor(index)
        if index.ndim == 3:
            index = index[:, 0]
        priority = _as_float64("priority", priority)
        if priority.ndim > 1:
            if priority.shape[1:].numel() == 0:  # max over nothing: no window gets a priority
                raise ValueError(
                    f"priority of shape {tuple(priority.shape)} holds no value per window (a dim after "
                    f"the first has size 0); pass [B] or [B, T] priorities."
                )
            priority = priority.reshape(priority.shape[0], -1).amax(1)
        self.update_window_priority(index[:, 0], index[:, 1], priority)

    def mark_update(self, index: Any, *, storage: EnvRingStorage | None = None) -> None:
        # Called by the buffer on every write: remember where the data lives.
        if storage is not None:
            self._storage_ref = storage

    def use_storage(self, storage: EnvRingStorage) -> None:
        """Remembers the rings the window priorities index, so that
        :meth:`update_window_priority` works before the first sample (the buffer calls it)."""
        self._storage_ref = storage

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # a copy: object's is this sampler's own __dict__
        state.pop("_storage_ref", None)  # the buffer holds the storage
        # A copy goes with a copy of the storage (and a weak reference cannot be pickled):
        # the copy's next sync takes the storage it is given as the one seen, as after a load.
        state["_seen_source"] = None
        return state

    # ------------------------------------------------------------------
    def _empty(self) -> None:
        self._tree: PrioritySegmentTree | None = None
        self._stored: torch.Tensor | None = None  # transformed priority per slot, or _UNSET
        self._seen: torch.Tensor | None = None  # [3, E] pos, size, resets at the last sync
        self._seen_geometry: tuple[int, int] | None = None
        self._seen_source: tuple[Any, int] | None = None  # (weakref to the storage, its load count) at the last sync

    def state_dict(self) -> dict[str, Any]:
        if self._tree is None:
            return {"initialized": False}
        return {
            "initialized": True,
            "tree": self._tree.state_dict(),
            "stored": [self._stored.clone()],
            "seen": [self._seen.clone()],
            "seen_geometry": list(self._seen_geometry or ()),
        }

    @makes_kept_tensors
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`. ``ValueError``, before anything changes, for a state
        that is damaged, of another sampler, or of rings of another number of envs or length."""
        state = state_dict if isinstance(state_dict, dict) else {}
        keys = ("initialized", "tree", "stored", "seen", "seen_geometry")
        check_state_keys(state, keys[:1] if state.get("initialized") is False else keys,
                         f"pass a {type(self).__name__}'s state_dict()")
        if not state["initialized"]:
            self._empty()
            return
        tree_state, stored, seen = state["tree"], _one_tensor(state["stored"]), _one_tensor(state["seen"])
        capacity = tree_state.get("capacity") if isinstance(tree_state, dict) else None
        geometry = state["seen_geometry"]
        if not (
            isinstance(capacity, int) and capacity > 0 and stored is not None and seen is not None
            and stored.shape == (capacity,) and stored.is_floating_point()
            and bool(((stored >= 0) | (stored == _UNSET)).all())  # NaN fails both
            and seen.ndim == 2 and seen.shape[0] == 3 and 0 < seen.shape[1] and capacity % seen.shape[1] == 0
            and seen.dtype in (torch.int64, torch.int32) and bool((seen >= 0).all())
            and isinstance(geometry, (list, tuple)) and len(geometry) in (0, 2)
            and all(isinstance(g, int) for g in geometry)
        ):
            raise ValueError("state_dict is damaged: its 'tree', 'stored', 'seen' and 'seen_geometry' do "
                             f"not fit together; pass a {type(self).__name__}'s state_dict().")
        envs, length = seen.shape[1], capacity // seen.shape[1]
        storage = getattr(self, "_storage_ref", None)
        own = None
        if storage is not None:
            own = (storage.num_envs, storage.max_length)
        elif self._seen is not None:  # a copy (pickling drops the storage link) that has synced
            own = (self._seen.shape[1], self._tree.capacity // self._seen.shape[1])
        if own is not None and own != (envs, length):
            raise ValueError(f"state_dict holds window priorities of {envs} envs x {length} steps but this "
                             f"sampler serves {own[0]} envs x {own[1]} steps; build the buffer as the "
                             "saved one was built.")
        tree = PrioritySegmentTree(capacity, track_max=True, dtype=_DTYPE)
        tree.load_state_dict(tree_state)  # checks the levels before writing them
        # Everything checked: the state changes all at once.
        self._tree, self._stored, self._seen = tree, stored.clone(), seen.to(torch.long, copy=True)
        self._seen_geometry = tuple(geometry) if geometry else None
        self._seen_source = None  # restored with its storage: the next sync takes it as seen


def _one_tensor(value: Any) -> torch.Tensor | None:
    """The tensor of a state's one-tensor list (``[tensor]``), or ``None`` for anything else."""
    ok = isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], torch.Tensor)
    return value[0].detach().cpu() if ok else None


def _as_float64(name: str, value: Any) -> torch.Tensor:
    """``value`` as a float64 CPU tensor; ``TypeError`` naming ``name`` when it holds no numbers."""
    return priority_tensor(value, name).detach().to("cpu", torch.float64)


def _leaves_of(env: torch.Tensor, low: torch.Tensor, high: torch.Tensor, length: int) -> torch.Tensor:
    """Leaves of positions ``low[i] ... high[i]`` of ``env[i]`` (empty where ``high < low``)."""
    env, position = expand_ranges(env.numpy(), low.numpy(), high.numpy())
    return env * length + position % length
