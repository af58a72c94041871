"""l2r-lab's buffers: ``PPOBuffer`` and ``SimpleReplayBuffer`` with their constructor arguments."""
from __future__ import annotations

import torch

from torchrl_ext._checks import check_int
from torchrl_ext.replay_buffers.segments import PathGAEReplayBuffer
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.uniform import DistinctUniformSampler
from torchrl_ext.storages.fast import FastTensorStorage

__all__ = ["l2r_ppo_buffer", "l2r_simple_replay_buffer"]


def _check_dims(obs_dim: int, act_dim: int) -> None:
    check_int("obs_dim", obs_dim, minimum=1)
    check_int("act_dim", act_dim, minimum=1)


def l2r_ppo_buffer(
    obs_dim: int,
    act_dim: int,
    size: int,
    batch_size: int,
    gamma: float = 0.99,
    lam: float = 0.95,
    eps: float = 1e-3,
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> PathGAEReplayBuffer:
    """l2r's ``PPOBuffer(obs_dim, act_dim, size, batch_size, gamma, lam, eps)``.

    ================================================  ==========================================
    l2r                                               torchrl_ext
    ================================================  ==========================================
    ``store({"obs", "act": ActionSample, "rew"})``    ``rb.store(step)``: ``"observation"``, ``"action"``,
                                                      ``"state_value"``, ``"action_log_prob"``, ``("next", "reward")``
    ``finish_path(action_obj)``                       ``rb.finish_path(last_val)`` (0 at a terminal state, else ``V(s_T)``)
    ``sample_batch()`` -> obs, act, ret, adv, logp    ``rb.sample_batch()`` -> ``value_target``, ``advantage``, ...
    ================================================  ==========================================

    ``obs_dim`` / ``act_dim`` are checked here; the storage takes its shapes
    from the first stored step and refuses steps that differ.

    Examples:
        >>> from torchrl_ext.presets import l2r_ppo_buffer
        >>> rb = l2r_ppo_buffer(obs_dim=3, act_dim=2, size=1000, batch_size=64)
        >>> rb.gamma, rb.lam, rb.eps
        (0.99, 0.95, 0.001)
    """
    _check_dims(obs_dim, act_dim)
    return PathGAEReplayBuffer(size, batch_size, gamma=gamma, lam=lam, eps=eps, device=device,
                               generator=generator)


def l2r_simple_replay_buffer(
    obs_dim: int,
    act_dim: int,
    size: int,
    batch_size: int,
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> TensorDictReplayBuffer:
    """l2r's ``SimpleReplayBuffer(obs_dim, act_dim, size, batch_size)``: a FIFO ring, distinct draws.

    ``store(d)`` is ``rb.extend(step.unsqueeze(0))`` with ``"observation"``,
    ``"action"``, ``("next", "observation" / "reward" / "done")``; ``sample_batch()``
    is ``rb.sample()``: ``min(batch_size, len(rb))`` distinct items.

    Examples:
        >>> from torchrl_ext.presets import l2r_simple_replay_buffer
        >>> rb = l2r_simple_replay_buffer(obs_dim=2, act_dim=1, size=5, batch_size=3)
        >>> type(rb.sampler).__name__, rb.storage.max_size
        ('DistinctUniformSampler', 5)
    """
    _check_dims(obs_dim, act_dim)
    check_int("size", size, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    return TensorDictReplayBuffer(
        storage=FastTensorStorage(size, device=device, strict=True),
        sampler=DistinctUniformSampler(),
        batch_size=batch_size,
        generator=generator,
    )
