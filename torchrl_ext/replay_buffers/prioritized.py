"""``PrioritizedReplayBuffer``: TorchRL's prioritized TensorDict buffer on pure-torch trees."""
from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.storages import ListStorage, Storage

from torchrl_ext import _compat
from torchrl_ext._checks import read_only
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.prioritized import (
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
    priority_tensor,
)

__all__ = ["PrioritizedReplayBuffer"]


class PrioritizedReplayBuffer(TensorDictReplayBuffer):
    """Prioritized TensorDict replay buffer on pure-torch trees.

    A drop-in for ``torchrl.data.TensorDictPrioritizedReplayBuffer`` that
    needs no ``torchrl._torchrl`` extension. Samples carry ``index`` and
    ``priority_weight``; write priorities back with
    :meth:`update_tensordict_priority` (reads ``priority_key``) or
    :meth:`update_priority`.

    Keyword Args:
        alpha: priority exponent (>= 0).
        beta: importance-sampling exponent (>= 0; usually annealed from about 0.4 to 1).
        storage: the storage, e.g. ``LazyTensorStorage(1_000_000)``; its
            ``max_size`` sizes the priority trees. Defaults to TorchRL's default,
            ``ListStorage(max_size=1000)``.
        eps: added to priorities before the exponent. Defaults to 1e-8.
        priority_key: key read by :meth:`update_tensordict_priority` (and on
            ``extend`` when present). Defaults to ``"td_error"``.
        reduction: how multi-element priorities per item are reduced
            (``"max"``, ``"min"``, ``"mean"``, ``"median"``, ``"sum"``).
        weights: ``"per"`` (standard, default) or ``"alf"`` importance weights;
            see :class:`~torchrl_ext.samplers.PrioritizedSampler`.
        initial_priority: priority of new data while none is known. Defaults to 1.
        max_priority_within_buffer: new data gets the max priority still stored
            rather than the max ever seen.
        replacement: ``False`` draws one index per equal-mass stratum.
        sampler_device: device of the priority trees (default: follows a CUDA
            storage, else CPU).
        sync: accepted as TorchRL's, where ``sync=False`` lets writers in other processes skip
            the trees. This buffer refuses to be sent to other processes (use
            ``torchrl_ext.distributed.ray_replay_buffer``), so ``sync=False`` samples as ``True``.
        **kwargs: any other ``TensorDictReplayBuffer`` argument (``batch_size``,
            ``transform``, ``generator``, ``checkpointer``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
        >>> rb = PrioritizedReplayBuffer(
        ...     alpha=0.6, beta=0.4, storage=LazyTensorStorage(1000), batch_size=32
        ... )
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(100, 4)}, [100]))
        >>> batch = rb.sample()
        >>> sorted(batch.keys())
        ['index', 'obs', 'priority_weight']
        >>> batch["td_error"] = torch.rand(32)
        >>> rb.update_tensordict_priority(batch)
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        storage: Storage | Callable[[], Storage] | None = None,
        eps: float = 1e-8,
        priority_key: str | tuple[str, ...] = "td_error",
        reduction: str = "max",
        weights: str = "per",
        initial_priority: float = 1.0,
        max_priority_within_buffer: bool = False,
        replacement: bool = True,
        sampler_device: torch.device | str | None = None,
        sync: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sync, bool):
            raise TypeError(f"sync must be True or False, got {sync!r}.")
        if kwargs.pop("sampler", None) is not None:  # None: a config's unset field
            raise TypeError(
                "PrioritizedReplayBuffer builds its own sampler; pass alpha/beta/... "
                "instead of sampler=, or use TensorDictReplayBuffer(sampler=...)."
            )
        if storage is None:  # TorchRL's TensorDictPrioritizedReplayBuffer default
            storage = ListStorage(max_size=1_000)
        if callable(storage) and not isinstance(storage, Storage):
            storage = storage()
        if not isinstance(storage, Storage):
            raise TypeError(
                f"storage must be a torchrl Storage (e.g. LazyTensorStorage(capacity)), "
                f"got {type(storage).__name__}."
            )
        sampler_cls = PrioritizedSampler if replacement else PrioritizedSamplerWithoutReplacement
        sampler = sampler_cls(
            storage.max_size,
            alpha,
            beta,
            eps,
            reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer,
            device=sampler_device,
            initial_priority=initial_priority,
            weights=weights,
        )
        super().__init__(storage=storage, sampler=sampler, priority_key=priority_key, **kwargs)

    prioritized_sampler = read_only("sampler", "The sampler that owns the priority trees (TorchRL's name for it).")

    # ------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any = None) -> None:
        """TorchRL's ``update_priority(index, priority)`` (or ``update_priority(batch)``);
        ``TypeError`` naming ``priority`` when it holds no numbers."""
        if priority is not None:
            priority = priority_tensor(priority)  # TorchRL's torch.as_tensor would name new()
        return super().update_priority(index, priority)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Writes ``data[priority_key]`` back as the priority of ``data["index"]``.

        A missing priority gives the items the sampler's default priority. A
        priority with extra dims (per agent, per step) is reduced with the
        sampler's ``reduction``.

        Raises:
            ValueError: when ``data`` has no ``"index"`` entry (only a sampled batch
                says which items its priorities belong to); nothing is written then.
        """
        if data.get("index", None) is None:
            raise ValueError(
                "update_tensordict_priority(data) needs the \"index\" entry that rb.sample() adds, "
                f"but data has keys {sorted(map(str, data.keys()))}; pass the sampled batch (or "
                "call rb.update_priority(index, priority))."
            )
        if not (self._lean_path() and data.ndim == 1 and getattr(self.storage, "ndim", 1) == 1):
            return super().update_tensordict_priority(data)
        priority = data.get(self.priority_key, None)
        if priority is None:
            priority = self.sampler.default_priority
        with _compat.replay_lock(self), _compat.write_lock(self):
            self.sampler.update_priority(data.get("index"), priority, storage=self.storage)
