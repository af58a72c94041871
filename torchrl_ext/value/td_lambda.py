"""TD(lambda) as a TorchRL value-estimator module over :func:`~torchrl_ext.value.functional.td_lambda_return_estimate`."""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torch import Tensor
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value import TDLambdaEstimator as _TorchRLTDLambda

from torchrl_ext.value import functional
from torchrl_ext.value.estimators import (
    ExtValueEstimators, _broadcast_team_signal, _SignalsMixin, _TargetEstimate,
)

__all__ = ["TDLambda"]


@register_value_estimator(
    ExtValueEstimators.EXT_TD_LAMBDA,
    default_kwargs={"gamma": 0.99, "lmbda": 0.95, "differentiable": True},
)
class TDLambda(_SignalsMixin, _TargetEstimate, _TorchRLTDLambda):
    """TD(lambda) returns, a drop-in for :class:`torchrl.objectives.value.TDLambdaEstimator`.

    Same keys (``set_keys``), value-network calling and ``for_loss`` wiring as TorchRL's
    class; writes ``value_target`` (the TD(lambda) return) and ``advantage``
    (``value_target - value``). The math is
    :func:`torchrl_ext.value.functional.td_lambda_return_estimate`.

    Shape contract: a tensordict of batch ``[*B, T]`` (``time_dim`` chooses T); values
    ``[*B, T, *F]``, with team-level signals broadcast over per-agent values as in
    :class:`~torchrl_ext.value.GAE`.

    Keyword Args:
        gamma (float or Tensor): discount in ``[0, 1]``.
        lmbda (float or Tensor): lambda in ``[0, 1]``.
        value_network: the critic, or ``None`` when values are precomputed.
        **kwargs: every other keyword of TorchRL's ``TDLambdaEstimator``
            (``average_rewards``, ``differentiable``, ``shifted``, ``time_dim``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.value import TDLambda
        >>> td_lambda = TDLambda(gamma=0.5, lmbda=1.0, value_network=None)
        >>> td = TensorDict({
        ...     "state_value": torch.zeros(1, 3, 1),
        ...     "next": {"state_value": torch.full((1, 3, 1), 4.0), "reward": torch.ones(1, 3, 1),
        ...              "done": torch.zeros(1, 3, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(1, 3, 1, dtype=torch.bool)},
        ... }, batch_size=[1, 3])
        >>> td_lambda(td)["value_target"].flatten().tolist()
        [2.25, 2.5, 3.0]
    """

    def _advantage(self, tensordict: TensorDictBase, params: Any, target_params: Any,
                   time_dim: int | None) -> tuple[Tensor, Tensor, Any]:
        """``(advantage, value_target, valid)``: the advantage is ``value_target - value``."""
        sig = self._read_signals(tensordict, params, target_params, time_dim)
        reward = sig.reward
        if self.average_rewards:
            reward = self._standardize(reward, tensordict)
            if sig.valid is None:  # TorchRL writes them back, for code that reads them later
                tensordict.set(("next", self.tensor_keys.reward), reward)
        reward, done, terminated = (
            _broadcast_team_signal(t, sig.value, -2) for t in (reward, sig.done, sig.terminated)
        )
        value_target = functional.td_lambda_return_estimate(
            sig.gamma, self.lmbda, sig.next_value, reward, done, terminated, time_dim=sig.time_dim
        )
        return value_target - sig.value, value_target, sig.valid
