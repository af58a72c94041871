"""Writer for :class:`~torchrl_ext.storages.RolloutStorage`: ``rb.extend(batch)`` appends steps
at the rollout's current step (shape contract: :class:`RolloutWriter`), so the usual TorchRL
loop works unchanged::

    rb.empty()          # a new rollout (keeps the allocated tensors)
    rb.extend(batch)    # [N, T] collector batch, or [T] from one env
    for minibatch in rb: ...

The rollout's step counter, saved with the storage, is the cursor: the writer keeps no state of its own.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers.writers import Writer

from torchrl_ext import _compat
from torchrl_ext.io.state_files import NoState
from torchrl_ext.storages.rollout import RolloutStorage

__all__ = ["RolloutWriter"]


class RolloutWriter(NoState, Writer):
    """Appends written steps to a :class:`RolloutStorage` (``add``: one step, ``extend``: ``[L, N]``).

    Shape contract:
        ``add(step)`` takes one step ``[N]``; ``extend(data)`` takes ``[L, N]``
        time-major (what a buffer passes on after transposing ``[N, L]``).
        Both return the written ``(time, env)`` coordinates, ``[L * N, 2]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import TensorDictReplayBuffer
        >>> from torchrl_ext.samplers import FeedForwardMinibatchSampler
        >>> from torchrl_ext.storages import RolloutStorage
        >>> rb = TensorDictReplayBuffer(storage=RolloutStorage(4),
        ...                             sampler=FeedForwardMinibatchSampler(mini_batch_size=4))
        >>> batch = TensorDict({"obs": torch.arange(8.0).view(2, 4), "next": {
        ...     "obs": torch.arange(1.0, 9.0).view(2, 4)}}, [2, 4])  # a collector's [N=2, T=4]
        >>> _ = rb.extend(batch)
        >>> len(rb), sum(minibatch.numel() for minibatch in rb)
        (8, 8)
    """

    def register_storage(self, storage: Any) -> None:
        if not isinstance(storage, RolloutStorage):
            raise TypeError(
                f"RolloutWriter writes into a RolloutStorage, got storage={type(storage).__name__}; "
                "use TorchRL's RoundRobinWriter for other storages."
            )
        super().register_storage(storage)

    def _coordinates(self, first: int, data: TensorDictBase) -> torch.Tensor:
        time = torch.arange(first, first + data.shape[0])
        return torch.cartesian_prod(time, torch.arange(data.shape[1:].numel()))  # time-major rows

    def add(self, data: Any) -> torch.Tensor:
        storage = _compat.writer_storage(self)
        first = storage.step
        storage.insert(data)
        return self._coordinates(first, data.unsqueeze(0))

    def extend(self, data: Any) -> torch.Tensor:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict, got {type(data).__name__}.")
        storage = _compat.writer_storage(self)
        first = storage.step
        storage.insert_steps(data, time_dim=0)
        return self._coordinates(first, data)  # [L] from one env: envs = Size([]).numel() = 1

    def _empty(self, empty_write_count: bool = True) -> None:
        return  # the storage's own _empty resets its step counter
