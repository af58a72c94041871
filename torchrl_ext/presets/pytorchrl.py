"""pytorchrl's on-policy storages (``VanillaOnPolicyBuffer``, ``GAEBuffer``, ``VTraceBuffer``) as one factory."""
from __future__ import annotations

from typing import Any

import torch

from torchrl_ext._checks import check_int
from torchrl_ext.replay_buffers.on_policy import (
    OnPolicyReplayBuffer,
    VTraceReplayBuffer,
    check_clip_threshold,
    check_gae_lambda,
)

__all__ = ["pytorchrl_on_policy_buffer"]


def pytorchrl_on_policy_buffer(
    size: int,
    *,
    storage: str = "gae",
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    gamma_intrinsic: float = 0.99,
    clip_rho_thres: float = 1.0,
    clip_c_thres: float = 1.0,
    recurrent: bool = False,
    num_mini_batch: int | None = 1,
    mini_batch_size: int | None = None,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> OnPolicyReplayBuffer:
    """pytorchrl's on-policy storage of rollout length ``size``.

    ============================================  =================================================================
    pytorchrl                                     torchrl_ext
    ============================================  =================================================================
    ``insert_transition(sample)``                 ``rb.insert(step)`` (a TorchRL step TensorDict)
    ``before_gradients()``                        ``rb.compute_returns(critic)`` (V-trace: ``refresh=``)
    ``generate_batches(nmb, mbs, epochs, sh)``    ``rb.generate_batches(nmb, mbs, epochs, sh)``
    ``after_gradients(batch, info)``              ``rb.after_update()`` once per update
    ``get_all_buffer_data(to_cpu)``               ``rb.get_all_buffer_data(to_cpu)``
    ``insert_data_slice(data)``                   ``rb.insert_data_slice(data)``
    ``used_capacity``                             ``rb.used_capacity`` (filled steps)
    ``update_storage_parameter(name, value)``     same; unknown names raise
    ``Observation`` / ``Reward`` / ``Done``       ``"observation"`` / ``("next", "reward")`` / ``("next", "done")``
    ``Value`` / ``LogProbability``                ``"state_value"`` / ``"action_log_prob"``
    ``IntrinsicReward`` / ``IntrinsicValue``      ``("next", "intrinsic_reward")`` / ``"intrinsic_state_value"``
    ``ExternalReturn`` / ``Advantage``            ``"value_target"`` / ``"advantage"``
    ``IntrinsicReturn`` / ``IntrinsicAdvantage``  ``"intrinsic_value_target"`` / ``"intrinsic_advantage"``
    ============================================  =================================================================

    Args:
        size: rollout length ``T``.

    Keyword Args:
        storage: ``"gae"``, ``"vanilla"`` (discounted returns) or ``"vtrace"``.
        gamma, gae_lambda, gamma_intrinsic: discounts and GAE lambda (with ``"vtrace"``,
            the lambda of the intrinsic stream only).
        clip_rho_thres, clip_c_thres: V-trace clip thresholds.
        recurrent: minibatches of whole env sequences (pytorchrl's recurrent actor).
        num_mini_batch, mini_batch_size: default split of :meth:`generate_batches`.
        **kwargs: any other :class:`~torchrl_ext.replay_buffers.OnPolicyReplayBuffer`
            argument (``intrinsic_filter``, ``normalize_advantage``, ``keys``, ...).

    Every argument is checked, also those the chosen storage does not use
    (``gae_lambda`` with ``"vanilla"``, the clip thresholds with ``"gae"``, ...).

    Examples:
        >>> from torchrl_ext.presets import pytorchrl_on_policy_buffer
        >>> rb = pytorchrl_on_policy_buffer(128, storage="vtrace", clip_rho_thres=0.8)
        >>> type(rb).__name__, rb.rho_thresh
        ('VTraceReplayBuffer', 0.8)
    """
    check_int("size", size, minimum=1)  # pytorchrl's name in the message
    check_gae_lambda("gae_lambda", gae_lambda)
    check_clip_threshold("rho_thresh", clip_rho_thres)
    check_clip_threshold("c_thresh", clip_c_thres)
    common = dict(gamma=gamma, gamma_intrinsic=gamma_intrinsic, recurrent=recurrent,
                  num_mini_batch=num_mini_batch, mini_batch_size=mini_batch_size, device=device,
                  generator=generator, **kwargs)
    if storage == "gae":
        return OnPolicyReplayBuffer(size, gae_lambda=gae_lambda, **common)
    if storage == "vanilla":
        return OnPolicyReplayBuffer(size, gae_lambda=None, **common)
    if storage == "vtrace":
        return VTraceReplayBuffer(size, gae_lambda=gae_lambda, rho_thresh=clip_rho_thres, c_thresh=clip_c_thres,
                                  **common)
    raise ValueError(
        f"storage must be 'gae', 'vanilla' or 'vtrace' (pytorchrl's GAEBuffer, VanillaOnPolicyBuffer, "
        f"VTraceBuffer), got storage={storage!r}."
    )
