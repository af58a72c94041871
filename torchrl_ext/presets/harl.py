"""HARL's on-policy buffers as a :class:`~torchrl_ext.storages.RolloutStorage` with a minibatch sampler."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.minibatch import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
)
from torchrl_ext.storages.rollout import RolloutStorage

__all__ = ["harl_rollout_buffer"]


def harl_rollout_buffer(
    episode_length: int,
    *,
    num_mini_batch: int | None = 1,
    mini_batch_size: int | None = None,
    use_recurrent_policy: bool = False,
    use_naive_recurrent_policy: bool = False,
    data_chunk_length: int = 10,
    shuffle: bool = True,
    drop_last: bool = False,
    carry_keys: Sequence[Any] | None = None,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> TensorDictReplayBuffer:
    """HARL's ``OnPolicyActorBuffer`` / ``OnPolicyCriticBuffer{EP,FP}`` for one rollout.

    One buffer serves actor and critic, EP and FP: per-agent entries live under
    ``("agents", ...)`` in each step, the shared critic input (EP) at the root
    or per agent (FP) under ``("agents", ...)``. Insert collector steps with
    ``rb.storage.insert(step)``, compute returns with
    :class:`torchrl_ext.value.GAE` (``time_dim=0`` on ``rb.storage.data[:T]``
    after ``rb.storage.fill_next("state_value")``), iterate one epoch with
    ``for batch in rb:``, then call ``rb.storage.after_update()``.

    Args:
        episode_length: rollout length ``T`` (HARL's ``episode_length``).

    Keyword Args:
        num_mini_batch: HARL's ``actor_num_mini_batch`` / ``critic_num_mini_batch``.
        mini_batch_size: minibatch size instead (feed-forward only in HARL).
        use_recurrent_policy: chunks of ``data_chunk_length`` steps.
        use_naive_recurrent_policy: whole env sequences.
        shuffle, drop_last: see :class:`~torchrl_ext.samplers.FeedForwardMinibatchSampler`;
            ``drop_last=True`` gives HARL's minibatches exactly.
        carry_keys: see :class:`~torchrl_ext.storages.RolloutStorage`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.presets import harl_rollout_buffer
        >>> rb = harl_rollout_buffer(4, num_mini_batch=2, use_recurrent_policy=True, data_chunk_length=2)
        >>> for t in range(4):
        ...     rb.storage.insert(TensorDict({"obs": torch.full((3, 1), float(t)),
        ...         "next": {"obs": torch.full((3, 1), t + 1.0)}}, [3]))
        >>> [tuple(batch.shape) for batch in rb]  # 6 chunks of 2 steps in 2 minibatches
        [(3, 2), (3, 2)]
    """
    if use_recurrent_policy and use_naive_recurrent_policy:
        raise ValueError(
            "use_recurrent_policy and use_naive_recurrent_policy are exclusive; pick one."
        )
    split = {"mini_batch_size": mini_batch_size} if mini_batch_size is not None else {}
    mb = None if mini_batch_size is not None else num_mini_batch
    common = {"shuffle": shuffle, "drop_last": drop_last, **split}
    if use_recurrent_policy:
        sampler = ChunkedRecurrentMinibatchSampler(mb, data_chunk_length=data_chunk_length, **common)
    elif use_naive_recurrent_policy:
        sampler = NaiveRecurrentMinibatchSampler(mb, **common)
    else:
        sampler = FeedForwardMinibatchSampler(mb, **common)
    storage = RolloutStorage(episode_length, carry_keys=carry_keys, device=device)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=1, generator=generator)
