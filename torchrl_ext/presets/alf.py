"""ALF's ``ReplayBuffer`` as a configured :class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer`."""
from __future__ import annotations

from typing import Any

import torch

from torchrl_ext._checks import check_bool, check_int
from torchrl_ext.replay_buffers.env_ring import EnvRingReplayBuffer
from torchrl_ext.samplers.prioritized_trajectory import PrioritizedTrajectorySampler
from torchrl_ext.samplers.trajectory import TrajectorySampler
from torchrl_ext.storages.episodes import EpisodicEnvRingStorage
from torchrl_ext.storages.ring import EnvRingStorage

__all__ = ["alf_replay_buffer"]


def alf_replay_buffer(
    num_environments: int,
    max_length: int = 1024,
    *,
    batch_length: int = 1,
    batch_size: int | None = None,
    num_earliest_frames_ignored: int = 0,
    prioritized_sampling: bool = False,
    initial_priority: float = 1.0,
    recent_data_steps: int = 1,
    recent_data_ratio: float = 0.0,
    with_replacement: bool = False,
    device: torch.device | str = "cpu",
    keep_episodic_info: bool | None = None,
    record_episodic_return: bool = False,
    default_return: float = -1000.0,
    gamma: float = 0.99,
    reward_clip: tuple[float, float] | None = None,
    step_type_key: Any = "step_type",
    generator: torch.Generator | None = None,
) -> EnvRingReplayBuffer:
    """ALF's ``ReplayBuffer(data_spec, num_environments, max_length, ...)``: ALF's arguments,
    by keyword after ``max_length``, but ``data_spec`` (taken from the first batch written),
    ``allow_multiprocess`` (:func:`~torchrl_ext.distributed.share_buffer` or Ray), and
    ``enable_checkpoint`` / ``name`` (checkpoints are ``rb.dumps`` / ``rb.loads``).

    ``add_batch(batch, env_ids)`` becomes ``rb.extend(batch, env_ids=env_ids)``,
    ``get_batch(B, T)`` becomes ``rb.sample(B)`` with ``batch_length=T`` (or
    ``rb.sampler.batch_length = T``), ``get_field`` becomes ``rb.read`` and the
    episode queries live on ``rb.storage``. Differences from ALF are listed in
    docs/migrating.md.

    Args:
        num_environments: number of env rings.
        max_length: steps kept per env.

    Keyword Args:
        batch_length, batch_size: the sampled windows (``[batch_size, batch_length]``).
        keep_episodic_info: index episodes (``None``: only when frames are ignored,
            as in ALF). Needs ``step_type_key`` in the data.
        record_episodic_return: needs ``keep_episodic_info``; ``gamma``,
            ``reward_clip`` and ``default_return`` as in ALF (checked even when unused).
        initial_priority: as in ALF (checked even without ``prioritized_sampling``).
        the rest: as in ALF's constructor.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.presets import alf_replay_buffer
        >>> rb = alf_replay_buffer(2, 16, batch_length=4, batch_size=3)
        >>> for t in range(6):
        ...     _ = rb.extend(TensorDict({"obs": torch.full((2, 1), float(t))}, [2]))
        >>> rb.sample().shape
        torch.Size([3, 4])
    """
    check_int("num_environments", num_environments, minimum=1)  # ALF's names in the messages
    check_int("num_earliest_frames_ignored", num_earliest_frames_ignored, minimum=0)
    if batch_size is not None:
        check_int("batch_size", batch_size, minimum=1)
    check_bool("prioritized_sampling", prioritized_sampling)
    check_bool("record_episodic_return", record_episodic_return)
    if keep_episodic_info is None:
        keep_episodic_info = num_earliest_frames_ignored > 0
    keep_episodic_info = check_bool("keep_episodic_info", keep_episodic_info)
    if record_episodic_return and not keep_episodic_info:
        raise ValueError(
            "record_episodic_return=True needs keep_episodic_info=True (returns are "
            "written per episode); set keep_episodic_info=True."
        )
    # Built (1 x 1 when unused) so its checks refuse bad episodic arguments either way.
    episodic = EpisodicEnvRingStorage(
        num_environments if keep_episodic_info else 1, max_length if keep_episodic_info else 1,
        step_type_key=step_type_key, record_episodic_return=record_episodic_return, gamma=gamma,
        reward_clip=None if reward_clip is None else tuple(reward_clip),
        default_return=default_return, device=device,
    )
    storage = episodic if keep_episodic_info else EnvRingStorage(num_environments, max_length, device=device)
    window = {
        "num_earliest_frames_ignored": num_earliest_frames_ignored,
        "with_replacement": with_replacement,
        "recent_data_steps": recent_data_steps,
        "recent_data_ratio": recent_data_ratio,
    }
    # Built either way (it holds no data until sampling) so initial_priority is checked either way.
    prioritized = PrioritizedTrajectorySampler(batch_length, initial_priority=initial_priority, **window)
    sampler = prioritized if prioritized_sampling else TrajectorySampler(batch_length, **window)
    return EnvRingReplayBuffer(storage=storage, sampler=sampler, batch_size=batch_size,
                               generator=generator)
