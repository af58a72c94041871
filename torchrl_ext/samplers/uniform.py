"""Uniform batches of distinct items (l2r's ``np.random.choice(size, k, replace=False)``)."""
from __future__ import annotations

from typing import Any

import torch
from torchrl.data.replay_buffers.storages import TensorStorage

from torchrl_ext import _compat
from torchrl_ext._checks import check_batch_size
from torchrl_ext.samplers.trajectory import StatelessSampler

__all__ = ["DistinctUniformSampler"]


class DistinctUniformSampler(StatelessSampler):
    """Each batch holds ``min(batch_size, len(storage))`` distinct items, drawn uniformly.

    Unlike TorchRL's ``SamplerWithoutReplacement`` nothing is remembered
    between calls: every batch is a fresh draw (l2r's samplers). Early on,
    while fewer than ``batch_size`` items are stored, batches are smaller.

    Keyword Args:
        among: optional callable ``storage -> LongTensor`` of the eligible
            indices (default: every stored item).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import TensorDictReplayBuffer
        >>> from torchrl_ext.samplers import DistinctUniformSampler
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=FastTensorStorage(10), sampler=DistinctUniformSampler())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3.0)}, [3]))
        >>> sorted(rb.sample(5)["x"].tolist())  # only 3 stored: all of them, once each
        [0.0, 1.0, 2.0]
    """

    def __init__(self, *, among: Any = None) -> None:
        super().__init__()
        self.among = among

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        check_batch_size(batch_size)
        eligible = None if self.among is None else self.among(storage)
        count = len(storage) if eligible is None else int(eligible.numel())
        if count == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        take = min(batch_size, count)
        rng = _compat.generator(self)
        if take * 4 < count:  # far fewer than stored: rejection-free partial draw
            picks = torch.multinomial(torch.ones(count), take, replacement=False, generator=rng)
        else:
            picks = torch.randperm(count, generator=rng)[:take]
        index = picks if eligible is None else eligible[picks]
        ndim = getattr(storage, "ndim", 1)
        if ndim == 1:
            return index, {}
        if not isinstance(storage, TensorStorage):
            raise TypeError(
                f"DistinctUniformSampler reads 1-D storages and {ndim}-D tensor storages, got a "
                f"{ndim}-D {type(storage).__name__}; use TrajectorySampler on per-env rings."
            )
        # Flat cells of the filled rows, row-major: (row, env, ...) coordinates.
        cells = storage.shape[1:]
        return torch.unravel_index(index, (count // cells.numel(), *cells)), {}
