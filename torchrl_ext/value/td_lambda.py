"""TD(lambda) as a TorchRL value-estimator module over :func:`~torchrl_ext.value.functional.td_lambda_return_estimate`."""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torch import Tensor
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value import TDLambdaEstimator as _TorchRLTDLambda

from torchrl_ext import _compat
from torchrl_ext._keys import next_key
from torchrl_ext.value import functional
from torchrl_ext.value.estimators import ExtValueEstimators, _CheckedLambda, _SignalsMixin, _stored

__all__ = ["TDLambda"]


@register_value_estimator(
    ExtValueEstimators.EXT_TD_LAMBDA,
    default_kwargs={"gamma": 0.99, "lmbda": 0.95, "differentiable": True},
)
class TDLambda(_SignalsMixin, _CheckedLambda, _TorchRLTDLambda):
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

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        target_params: TensorDictBase | None = None,
        next_value: Tensor | None = None,
        time_dim: int | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """The TD(lambda) return of ``tensordict``, bootstrapped from ``next_value``, as TorchRL's.

        Without ``next_value``, the value network is called on the next states alone (with
        ``target_params`` when given); without a network the stored ``("next", value)`` is read.
        The current states are never evaluated: value-based losses (``DQNLoss``, ``DDPGLoss``, ...)
        call this with batches that hold only what their own bootstrap needs. With
        ``average_rewards`` the standardized rewards are written back, as TorchRL does.
        """
        if next_value is None:
            next_value = (_stored(tensordict, next_key(self.tensor_keys.value)) if self.value_network is None
                          else _compat.next_state_value(self, tensordict, target_params, kwargs))
        elif not isinstance(next_value, Tensor):
            raise TypeError(
                f"next_value must be a tensor shaped like the values, got {type(next_value).__name__}; "
                "pass the next states' values as a tensor, or None to evaluate them."
            )
        sig = self._read_signals(tensordict, None, None, time_dim, next_value=next_value)
        reward = sig.reward
        if self.average_rewards:
            reward = self._standardize(reward, tensordict)
            tensordict.set(next_key(self.tensor_keys.reward), reward)  # as TorchRL: later code reads them
        reward, done, terminated = self._team_signals(reward, sig.done, sig.terminated, next_value, -2)
        return functional.td_lambda_return_estimate(
            self._team_gamma(sig, next_value, -2), self.lmbda, next_value, reward, done, terminated,
            time_dim=sig.time_dim,
        )

    def _advantage(self, tensordict: TensorDictBase, params: Any, target_params: Any,
                   time_dim: int | None) -> tuple[Tensor, Tensor, Any]:
        """``(advantage, value_target, valid)`` as TorchRL's ``forward`` gets them: the target from
        ``value_estimate`` on the shifted view, the advantage ``value_target - value``."""
        sig = self._read_signals(tensordict, params, target_params, time_dim)
        data = _compat.shifted_view(self, tensordict, sig.valid, sig.time_dim)
        value_target = self.value_estimate(data, next_value=sig.next_value, time_dim=sig.time_dim)
        return value_target - sig.value, value_target, sig.valid
