"""HARL's buffers: on-policy as a :class:`~torchrl_ext.storages.RolloutStorage` with a minibatch
sampler, off-policy as per-env rings with an :class:`~torchrl_ext.samplers.NStepSampler`."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from torchrl_ext._checks import check_bool, check_int
from torchrl_ext.replay_buffers.env_ring import EnvRingReplayBuffer
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.minibatch import (
    ChunkedRecurrentMinibatchSampler,
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
    check_optional_count,
)
from torchrl_ext.samplers.nstep import NStepSampler
from torchrl_ext.storages.rollout import RolloutStorage

__all__ = ["harl_off_policy_buffer", "harl_rollout_buffer"]


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
    :class:`torchrl_ext.value.GAE` (``out = gae(rb.storage.data[:T], time_dim=0)``
    after ``rb.storage.fill_next("state_value")``) and store them with
    ``rb.storage.set_derived(key, out[key])`` for ``"advantage"`` and
    ``"value_target"`` (``data[:T]`` is a new TensorDict: what GAE writes there
    is not stored), iterate one epoch with ``for batch in rb:``, then call
    ``rb.storage.after_update()``.

    ``fill_next`` takes step ``t``'s next value from slot ``t + 1``, which after
    an auto-reset holds the next episode's first state. With truncations
    (``done & ~terminated``) GAE bootstraps from that value: set
    ``("next", "state_value")`` of a truncated step to the critic's value of
    its true final observation, or pass ``terminated = done`` (HARL with
    ``use_proper_time_limits=False``).

    Minibatch units are the storage's threads (whole steps for feed-forward),
    each with all its agents. HARL's FP critic draws ``(thread, agent)`` units:
    for its minibatches exactly, insert FP critic steps as ``[N, A]`` batches
    (agents as threads) in a buffer of their own. HARL's actors draw one
    permutation per agent; here the agents of a step share one.

    Args:
        episode_length: rollout length ``T`` (HARL's ``episode_length``).

    Keyword Args:
        num_mini_batch: HARL's ``actor_num_mini_batch`` / ``critic_num_mini_batch``.
        mini_batch_size: minibatch size instead (feed-forward only in HARL).
        use_recurrent_policy: chunks of ``data_chunk_length`` steps, which must divide
            ``episode_length``.
        use_naive_recurrent_policy: whole env sequences.
        shuffle, drop_last: see :class:`~torchrl_ext.samplers.FeedForwardMinibatchSampler`;
            ``drop_last=True`` gives HARL's minibatches exactly (for the same units, see above).
        carry_keys: see :class:`~torchrl_ext.storages.RolloutStorage`.

    ``data_chunk_length`` and ``num_mini_batch`` are checked also when unused
    (another sampler, or ``mini_batch_size`` given).

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
    check_int("episode_length", episode_length, minimum=1)  # HARL's name in the message
    # Checked even where unused (another sampler, or mini_batch_size given): a typo never passes silently.
    check_int("data_chunk_length", data_chunk_length, minimum=1)
    check_optional_count("num_mini_batch", num_mini_batch)
    check_bool("use_recurrent_policy", use_recurrent_policy)
    check_bool("use_naive_recurrent_policy", use_naive_recurrent_policy)
    if use_recurrent_policy and use_naive_recurrent_policy:
        raise ValueError(
            "use_recurrent_policy and use_naive_recurrent_policy are exclusive; pick one."
        )
    if use_recurrent_policy and episode_length % data_chunk_length:
        # The sampler would find out only at the first minibatch, after a whole rollout.
        raise ValueError(
            f"data_chunk_length={data_chunk_length} must divide episode_length={episode_length} "
            f"(chunks never cross threads); use a divisor of {episode_length}."
        )
    mb = None if mini_batch_size is not None else num_mini_batch
    common = {"mini_batch_size": mini_batch_size, "shuffle": shuffle, "drop_last": drop_last}
    if use_recurrent_policy:
        sampler = ChunkedRecurrentMinibatchSampler(mb, data_chunk_length=data_chunk_length, **common)
    elif use_naive_recurrent_policy:
        sampler = NaiveRecurrentMinibatchSampler(mb, **common)
    else:
        sampler = FeedForwardMinibatchSampler(mb, **common)
    storage = RolloutStorage(episode_length, carry_keys=carry_keys, device=device)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=1, generator=generator)


def harl_off_policy_buffer(
    buffer_size: int,
    n_rollout_threads: int,
    *,
    batch_size: int | None = None,
    n_step: int = 1,
    gamma: float = 0.99,
    state_type: str = "EP",
    agent_group: str = "agents",
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> EnvRingReplayBuffer:
    """HARL's ``OffPolicyBufferEP`` / ``OffPolicyBufferFP`` as per-env rings with n-step sampling.

    HARL keeps one flat array and assumes every insert holds exactly
    ``n_rollout_threads`` rows; here each thread has its own ring of
    ``ceil(buffer_size / n_rollout_threads)`` steps, so any subset of threads
    can be written (``rb.extend(step, env_ids=...)``). ``rb.sample()`` gives
    HARL's n-step sample as one TensorDict ``[batch_size]``:

    ========================  ==========================================  ==========================================
    HARL                      EP key                                      FP key
    ========================  ==========================================  ==========================================
    ``share_obs``             ``"state"``                                 ``("agents", "state")``
    ``obs``, ``actions``      ``("agents", "observation" / "action")``    same
    ``available_actions``     ``("agents", "available_actions")``         same
    ``valid_transitions``     ``("agents", "valid_transitions")``         same (taken at the start step)
    ``reward`` (n-step sum)   ``("next", "reward")``                      ``("next", "agents", "reward")``
    ``done``, ``term``        ``("next", "done" / "terminated")``         ``("next", "agents", "done" / "terminated")``
    ``next_*``                ``("next", ...)``                           ``("next", "agents", ...)``
    ``gamma`` (``γ^(m+1)``)   ``"nstep_discount"``                        ``("agents", "nstep_discount")``
    ========================  ==========================================  ==========================================

    FP chains run per agent and stop at each agent's own done; one agent works
    (HARL's FP squeezes its agent axis away). Samples are drawn uniformly with
    replacement (HARL draws a permutation of the whole buffer per call) and
    ``nstep_discount`` is float32 (HARL's is float64).

    Args:
        buffer_size: total steps kept (HARL's ``buffer_size``).
        n_rollout_threads: number of envs (threads).

    Keyword Args:
        batch_size: default ``sample()`` size (HARL's ``batch_size``).
        n_step, gamma: see :class:`~torchrl_ext.samplers.NStepSampler`.
        state_type: ``"EP"`` (env-level reward/done) or ``"FP"`` (per agent).
        agent_group: the agents' group key.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.presets import harl_off_policy_buffer
        >>> rb = harl_off_policy_buffer(100, 2, batch_size=4, n_step=3, gamma=0.5)
        >>> for t in range(3):
        ...     _ = rb.extend(TensorDict({"state": torch.zeros(2, 5), "next": {
        ...         "state": torch.zeros(2, 5), "reward": torch.ones(2, 1),
        ...         "done": torch.zeros(2, 1, dtype=torch.bool)}}, [2]))
        >>> rb.sample()["next", "reward"].shape
        torch.Size([4, 1])
    """
    if state_type not in ("EP", "FP"):
        raise ValueError(
            f"state_type must be 'EP' (environment-provided state, env-level reward/done) or "
            f"'FP' (per-agent), got state_type={state_type!r}."
        )
    check_int("buffer_size", buffer_size, minimum=1)
    check_int("n_rollout_threads", n_rollout_threads, minimum=1)
    if batch_size is not None:
        check_int("batch_size", batch_size, minimum=1)
    sampler = NStepSampler(n_step, gamma, agent_group=agent_group)  # checks agent_group for EP too
    if state_type == "EP":
        sampler.agent_group = None  # env-level chains
    return EnvRingReplayBuffer(
        num_envs=n_rollout_threads,
        max_length=-(-buffer_size // n_rollout_threads),
        device=device,
        sampler=sampler,
        batch_size=batch_size,
        generator=generator,
    )
