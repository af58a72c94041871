"""TorchRL value-estimator modules backed by :mod:`torchrl_ext.value.functional`.

:class:`GAE` and :class:`VTrace` subclass TorchRL's classes of the same name: same keys
(``set_keys``), same value-network calling (``shifted``, chunking, vmap, functional params),
same ``for_loss`` wiring. They only swap the math for the log-depth scans of
:mod:`~torchrl_ext.value.functional` and add two things TorchRL's ``GAE`` lacks: team-level
reward/done broadcast to per-agent values (so one class serves single- and multi-agent data) and
an optional value normalizer (HARL's ``ValueNorm``) applied before the recursion.

Both (and :class:`~torchrl_ext.value.TDLambda`) are registered in TorchRL's value-estimator
registry under :class:`ExtValueEstimators`; :func:`torchrl_ext.value.make_value_estimator`
gives one to a TorchRL loss with the loss's critic, actor and keys.
"""
from __future__ import annotations

from contextlib import nullcontext
from enum import Enum
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn import dispatch, set_composite_lp_aggregate
from torch import Tensor
from torchrl.objectives.utils import hold_out_net, register_value_estimator
from torchrl.objectives.value import GAE as _TorchRLGAE
from torchrl.objectives.value import VTrace as _TorchRLVTrace

from torchrl_ext import _compat
from torchrl_ext._checks import check_reals, makes_kept_tensors
from torchrl_ext._keys import nested_key, next_key
from torchrl_ext.value import functional
from torchrl_ext.value.normalizers import ValueNorm

__all__ = ["ExtValueEstimators", "GAE", "VTrace", "stored_action_log_prob"]


class ExtValueEstimators(Enum):
    """Registry keys of torchrl_ext's estimators (string aliases ``ext_gae``, ``ext_vtrace``,
    ``ext_td_lambda``)."""

    EXT_GAE = "torchrl_ext generalized advantage estimate (log-depth scan)"
    EXT_VTRACE = "torchrl_ext V-trace (log-depth scan)"
    EXT_TD_LAMBDA = "torchrl_ext TD(lambda) (log-depth scan)"


class _Signals(NamedTuple):
    value: Tensor
    next_value: Tensor
    reward: Tensor
    done: Tensor
    terminated: Tensor
    gamma: Tensor
    time_dim: int
    valid: Tensor | None
    steps: Tensor | None  # steps_to_next_obs (gamma's exponent), in the reward's layout where it fits


class _SignalsMixin:
    """Reads values and environment signals the way TorchRL's estimators do."""

    @makes_kept_tensors  # TorchRL's __init__ makes the gamma / lmbda buffers, which load_state_dict writes
    def __init__(self, *, group_key: Any = None, **kwargs: Any) -> None:
        # A key written in YAML arrives as a ListConfig, which TorchRL would keep as the key.
        super().__init__(group_key=None if group_key is None else nested_key(group_key, "group_key"), **kwargs)

    def _read_signals(self, tensordict: TensorDictBase, params: TensorDictBase | None,
                      target_params: TensorDictBase | None, time_dim: int | None,
                      next_value: Tensor | None = None) -> _Signals:
        """The values and signals of ``tensordict``; given ``next_value`` (the bootstrap of TorchRL's
        ``value_estimate``), no critic is called and ``value`` is None."""
        if tensordict.batch_dims < 1:
            raise ValueError(
                "The input tensordict needs a time dimension, got batch_size="
                f"{tuple(tensordict.batch_size)}; reshape it to [*B, T]."
            )
        keys = self.tensor_keys
        reward = tensordict.get(("next", keys.reward))
        if self.gamma.device != reward.device:
            self.gamma = self.gamma.to(reward.device)
        gamma = self.gamma
        steps = tensordict.get(keys.steps_to_next_obs, None)
        if steps is not None:
            # TorchRL views it as the reward; team-level steps with per-agent rewards cannot be.
            steps = steps.view_as(reward) if steps.numel() == reward.numel() else steps
            gamma = gamma ** steps

        value = None
        if next_value is None and self.value_network is not None:
            if params is not None:
                params = params.detach()
                if target_params is None:
                    target_params = params.clone(False)
            holdout = hold_out_net(self.value_network) if target_params is None else nullcontext()
            with holdout:
                value, next_value, valid = _compat.call_value_nets(
                    self, tensordict, params=params, next_params=target_params, single_call=self.shifted,
                    value_key=keys.value, detach_next=True, vmap_randomness=self.vmap_randomness,
                )
            if valid is not None:
                tensordict.set("shifted_valid", valid)
        elif next_value is None:
            value = _stored(tensordict, keys.value)
            next_value = _stored(tensordict, next_key(keys.value))

        time_dim = _compat.time_dim_of(self, time_dim, tensordict)
        valid = tensordict.get("shifted_valid", default=None)
        data = _compat.shifted_view(self, tensordict, valid, time_dim)
        done = data.get(("next", keys.done))
        terminated = data.get(("next", keys.terminated), default=done)
        reward = data.get(("next", keys.reward))
        return _Signals(value, next_value, reward, done, terminated, gamma, time_dim, valid, steps)

    def _team_signals(self, reward: Tensor, done: Tensor, terminated: Tensor, value: Tensor,
                      agent_dim: int) -> tuple[Tensor, Tensor, Tensor]:
        """``reward``, ``done``, ``terminated`` in ``value``'s shape: team-level ``[*B, T, 1]`` ones
        are expanded over ``agent_dim`` to per-agent values."""
        keys = self.tensor_keys
        return tuple(  # type: ignore[return-value]
            _broadcast_team_signal(tensor, value, agent_dim, next_key(key))
            for tensor, key in ((reward, keys.reward), (done, keys.done), (terminated, keys.terminated))
        )

    def _team_gamma(self, sig: _Signals, value: Tensor, agent_dim: int) -> Tensor:
        """``sig.gamma``, with ``gamma ** steps_to_next_obs`` expanded like a team-level reward."""
        if sig.steps is None:
            return sig.gamma
        return self.gamma ** _broadcast_team_signal(sig.steps, value, agent_dim, self.tensor_keys.steps_to_next_obs)

    def _standardize(self, x: Tensor, tensordict: TensorDictBase, eps: float = 1e-4) -> Tensor:
        """``x`` standardized (unbiased std clamped to ``eps``), per group under ``group_key``."""
        groups = _compat.group_ids(self, tensordict)
        if groups is None:
            return (x - x.mean()) / x.std().clamp_min(eps)
        return _compat.standardize_by_group(x, groups, eps=eps)

    @_compat.skip_existing
    @_compat.grad_enabled
    @dispatch
    def forward(self, tensordict: TensorDictBase, *, params: TensorDictBase | None = None,
                target_params: TensorDictBase | None = None, time_dim: int | None = None) -> TensorDictBase:
        """Writes ``advantage`` and ``value_target`` into ``tensordict`` and returns it."""
        padding_key = getattr(self.tensor_keys, "valid", None)
        if padding_key is not None:  # TorchRL after 0.14.1: set_keys(valid=...)
            # Ignoring it would silently give padded steps advantages and normalise over them.
            raise ValueError(
                f"{type(self).__name__} does not support right-padding masks (set_keys(valid="
                f"{padding_key!r})); drop the padded steps first, or use TorchRL's estimator."
            )
        _compat.validate_recurrent_inputs(self, tensordict, time_dim)
        advantage, value_target, valid = self._advantage(tensordict, params, target_params, time_dim)
        if getattr(self, "average_gae", False):  # GAE's option
            advantage = self._normalize_advantage(advantage, valid, groups=_compat.group_ids(self, tensordict))
        elif getattr(self, "average_adv", False):  # VTrace's option
            advantage = self._standardize(advantage, tensordict, eps=1e-5)
        tensordict.set(self.tensor_keys.advantage, advantage)
        tensordict.set(self.tensor_keys.value_target, value_target)
        _compat.mask_shifted_outputs(self, tensordict, valid)
        return tensordict


class _CheckedLambda:
    """Checks ``gamma`` and ``lmbda`` before TorchRL stores them.

    ``value_estimate`` is not shared here: TorchRL gives each estimator its own signature
    (GAE's takes ``params``, TD(lambda)'s ``next_value``), so each class overrides its parent's."""

    def __init__(self, *, gamma: float | Tensor, lmbda: float | Tensor, value_network: Any, **kwargs: Any) -> None:
        check_reals("gamma", gamma, low=0.0, high=1.0)
        check_reals("lmbda", lmbda, low=0.0, high=1.0)
        super().__init__(gamma=gamma, lmbda=lmbda, value_network=value_network, **kwargs)


def _stored(tensordict: TensorDictBase, key: Any) -> Tensor:
    """The values stored under ``key`` (``ValueError`` without them: there is no critic to call)."""
    tensor = tensordict.get(key, None)
    if tensor is None:
        raise ValueError(
            f"The tensor with key {key} is missing and no value network "
            "was given; pass value_network= or write the values first."
        )
    return tensor


def _broadcast_team_signal(tensor: Tensor, value: Tensor, agent_dim: int, key: Any) -> Tensor:
    """Expands the team-level signal ``key`` ``[*B, T, 1]`` to per-agent ``[*B, T, A, 1]``."""
    if tensor.ndim == value.ndim:
        return tensor
    if tensor.ndim != value.ndim - 1:
        raise ValueError(
            "reward/done/terminated must have the value's shape (per-agent) or one "
            f"dim fewer (team-level, broadcast over agent_dim={agent_dim}); got "
            f"signal shape {tuple(tensor.shape)} for {key!r} and value shape {tuple(value.shape)}."
        )
    dim = agent_dim % value.ndim
    team = value.shape[:dim] + value.shape[dim + 1:]
    if any(size not in (1, want) for size, want in zip(tensor.shape, team)):
        # One dim short is also what a single-agent signal without its feature dim looks like.
        fix = ("it lacks the trailing feature dim: pass it with .unsqueeze(-1)"
               if tensor.shape == value.shape[:-1] else "give it one of these shapes")
        raise ValueError(
            f"{key!r} of shape {tuple(tensor.shape)} fits neither the value shape {tuple(value.shape)} "
            f"(per-agent) nor that shape without agent_dim={agent_dim}, {tuple(team)} (team-level); {fix}."
        )
    return tensor.unsqueeze(dim).expand(value.shape)


@register_value_estimator(
    ExtValueEstimators.EXT_GAE,
    default_kwargs={"gamma": 0.99, "lmbda": 0.95, "differentiable": True},
)
class GAE(_SignalsMixin, _CheckedLambda, _TorchRLGAE):
    """Generalized advantage estimation, a faster drop-in for :class:`torchrl.objectives.value.GAE`.

    Reads ``value`` (or calls ``value_network``) at the root and under
    ``"next"``, ``("next", reward)``, ``("next", done)``, ``("next",
    terminated)``; writes ``advantage`` and ``value_target``. All keys are set
    with :meth:`set_keys`. The math is
    :func:`torchrl_ext.value.functional.generalized_advantage_estimate`.

    Shape contract: a tensordict of batch ``[*B, T]`` (``time_dim`` chooses T);
    values ``[*B, T, *F]``. Per-agent values ``[*B, T, A, 1]`` (nested keys such
    as ``("agents", "state_value")``) work with team-level signals
    ``[*B, T, 1]`` (reward, done, terminated, ``steps_to_next_obs``): they
    are broadcast over ``agent_dim``.

    Keyword Args:
        gamma (float or Tensor): discount in ``[0, 1]``.
        lmbda (float or Tensor): GAE lambda in ``[0, 1]``.
        value_network: the critic, or ``None`` when values are precomputed.
        agent_dim (int, optional): the agent dimension of the value tensor.
            ``None`` (default): team-level signals are still broadcast at dim
            ``-2`` if the value has one more dim than the reward, and
            ``average_gae`` standardizes over everything. An int: like
            TorchRL's ``MultiAgentGAE``, ``average_gae`` standardizes each
            agent separately; a dim outside the value tensor raises
            ``ValueError`` at the first call.
        value_normalizer (ValueNorm, optional): when given, values are
            denormalized before the recursion (HARL's convention), so
            ``advantage`` and ``value_target`` come out in the raw return scale.
            Anything with ``normalize`` and ``denormalize`` methods.
        **kwargs: every other keyword of TorchRL's ``GAE`` (``average_gae``,
            ``differentiable``, ``shifted``, ``time_dim``, ``auto_reset_env``,
            ``device``, ``value_chunk_size``, ``group_key``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.value import GAE
        >>> gae = GAE(gamma=0.9, lmbda=1.0, value_network=None)
        >>> td = TensorDict({
        ...     "state_value": torch.zeros(1, 4, 1),
        ...     "next": {
        ...         "state_value": torch.full((1, 4, 1), 10.0),
        ...         "reward": torch.ones(1, 4, 1),
        ...         "done": torch.tensor([False, True, False, False]).view(1, 4, 1),
        ...         "terminated": torch.tensor([False, True, False, False]).view(1, 4, 1),
        ...     },
        ... }, batch_size=[1, 4])
        >>> gae(td)["advantage"].flatten().tolist()
        [10.899999618530273, 1.0, 19.0, 10.0]
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        lmbda: float | Tensor,
        value_network,
        agent_dim: int | None = None,
        value_normalizer: ValueNorm | None = None,
        **kwargs,
    ) -> None:
        # Both checked before TorchRL stores anything; agent_dim's range needs the data (_agents_at).
        if agent_dim is not None and (isinstance(agent_dim, bool) or not isinstance(agent_dim, int)):
            raise TypeError(f"agent_dim must be an int (a dim of the value tensor, e.g. -2) or None, "
                            f"got agent_dim={agent_dim!r}.")
        if value_normalizer is not None and not all(
            callable(getattr(value_normalizer, name, None)) for name in ("normalize", "denormalize")
        ):
            raise TypeError(f"value_normalizer must be a ValueNorm (anything with normalize() and "
                            f"denormalize()) or None, got value_normalizer={value_normalizer!r}.")
        super().__init__(gamma=gamma, lmbda=lmbda, value_network=value_network, **kwargs)
        self.agent_dim = agent_dim
        self.value_normalizer = value_normalizer

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
        time_dim: int | None = None,
        **kwargs,
    ) -> Tensor:
        """Returns the value target without writing to ``tensordict``."""
        if self.is_stateless and params is None:
            raise RuntimeError("This estimator is stateless: pass params=.")
        return self._advantage(tensordict, params, target_params, time_dim)[1]

    def _prepare_signals(self, reward, done, terminated, value):
        return self._team_signals(reward, done, terminated, value, self._agents_at(value))

    def _broadcast_optional(self, tensor: Tensor, value: Tensor) -> Tensor:
        return _broadcast_team_signal(tensor, value, self._agents_at(value), ("next", "truncated"))

    def _agents_at(self, value: Tensor) -> int:
        """The agent dim of ``value`` (``ValueError`` if ``agent_dim`` is not one of its dims)."""
        if self.agent_dim is None:
            return -2
        if not -value.ndim <= self.agent_dim < value.ndim:
            raise ValueError(
                f"agent_dim={self.agent_dim} is out of range for values of shape {tuple(value.shape)} "
                f"({value.ndim} dims); use a dim in [{-value.ndim}, {value.ndim - 1}], e.g. -2 for [*B, T, A, 1]."
            )
        return self.agent_dim

    def _normalize_advantage(self, adv, valid=None, groups=None):
        if self.agent_dim is None:
            return super()._normalize_advantage(adv, valid, groups)
        # Each agent apart (within each group when group_key is set), with the unbiased std on
        # every path. TorchRL 0.14.1's MultiAgentGAE takes the population std under a
        # shifted_valid mask without groups; its later releases take the unbiased one there too.
        agent_dim = self._agents_at(adv) % adv.ndim
        mask = None if valid is None else _compat.expand_to_match(valid, adv)
        n_agents = adv.shape[agent_dim]
        ids = torch.arange(n_agents, device=adv.device).reshape([-1 if d == agent_dim else 1 for d in range(adv.ndim)])
        if groups is not None:
            groups = groups.reshape(*groups.shape, *[1] * (adv.ndim - groups.ndim))
            ids = groups.expand(adv.shape) * n_agents + ids
        return _compat.standardize_by_group(adv, ids.expand(adv.shape), mask)

    def _advantage(self, tensordict, params, target_params, time_dim):
        sig = self._read_signals(tensordict, params, target_params, time_dim)
        reward, done, terminated = self._prepare_signals(sig.reward, sig.done, sig.terminated, sig.value)
        gamma = self._team_gamma(sig, sig.value, self._agents_at(sig.value))
        value, next_value = sig.value, sig.next_value
        if self.value_normalizer is not None:
            value = self.value_normalizer.denormalize(value)
            next_value = self.value_normalizer.denormalize(next_value)
        if self.auto_reset_env:
            # The last "next" observation already is the reset one: bootstrap a
            # truncation from V(s_t) through the reward, then treat it as terminal.
            truncated = self._broadcast_optional(tensordict.get(("next", "truncated")), value)
            reward = reward + gamma * value * truncated
            terminated = done
        advantage, value_target = functional.generalized_advantage_estimate(
            gamma, self.lmbda, value, next_value, reward, done, terminated, time_dim=sig.time_dim
        )
        return advantage, value_target, sig.valid


@register_value_estimator(
    ExtValueEstimators.EXT_VTRACE,
    default_kwargs={"gamma": 0.99, "differentiable": True},
)
class VTrace(_SignalsMixin, _TorchRLVTrace):
    """V-trace, a faster drop-in for :class:`torchrl.objectives.value.VTrace`.

    Reads the behaviour log-probability at ``sample_log_prob`` (the key set
    with :meth:`set_keys`), scores the stored actions under the current policy
    (``actor_network``), and writes ``advantage`` and ``value_target``
    (the V-trace target ``v_s``). The math is
    :func:`torchrl_ext.value.functional.vtrace_advantage_estimate`.

    Unlike TorchRL's ``VTrace``, which scores a freshly sampled action (so its targets
    change with the random state), the importance weight ``pi(a|x) / mu(a|x)`` uses the
    action that was taken: the batch must hold it under the actor's sample key
    (``"action"`` by default).

    Keyword Args:
        gamma (float or Tensor): discount in ``[0, 1]``.
        actor_network: the current policy (a probabilistic actor).
        value_network: the critic, or ``None`` when values are precomputed.
        rho_thresh (float): clip of the importance weight (> 0). Defaults to 1.
        c_thresh (float): clip of the trace coefficients (> 0). Defaults to 1.
        **kwargs: every other keyword of TorchRL's ``VTrace``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor())
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(net, in_keys=["obs"], out_keys=["loc", "scale"]),
        ...     in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal,
        ...     return_log_prob=True)
        >>> vtrace = VTrace(gamma=0.99, actor_network=actor, value_network=None)
        >>> vtrace.set_keys(sample_log_prob="action_log_prob")
        >>> td = TensorDict({"obs": torch.randn(1, 5, 3), "action": torch.randn(1, 5, 1),
        ...     "action_log_prob": torch.randn(1, 5, 1), "state_value": torch.zeros(1, 5, 1),
        ...     "next": {"state_value": torch.zeros(1, 5, 1), "reward": torch.ones(1, 5, 1),
        ...              "done": torch.zeros(1, 5, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(1, 5, 1, dtype=torch.bool)}}, [1, 5])
        >>> vtrace(td)["value_target"].shape
        torch.Size([1, 5, 1])
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        actor_network,
        value_network,
        rho_thresh: float | Tensor = 1.0,
        c_thresh: float | Tensor = 1.0,
        **kwargs,
    ) -> None:
        check_reals("gamma", gamma, low=0.0, high=1.0)
        functional._check_thresholds(rho_thresh, c_thresh)
        super().__init__(gamma=gamma, actor_network=actor_network, value_network=value_network,
                         rho_thresh=rho_thresh, c_thresh=c_thresh, **kwargs)

    @property
    def in_keys(self) -> list:
        """TorchRL's, plus the actor's sample keys: the stored actions are scored, so they are
        read (and, in the keyword call, taken as ``action=...``)."""
        keys = super().in_keys
        return keys + [key for key in getattr(self.actor_network, "dist_sample_keys", None) or () if key not in keys]

    def _advantage(self, tensordict, params, target_params, time_dim):
        sig = self._read_signals(tensordict, params, target_params, time_dim)
        log_mu = tensordict.get(self.tensor_keys.sample_log_prob, None)
        if log_mu is None:
            raise ValueError(
                f"The behaviour log-probability {self.tensor_keys.sample_log_prob!r} is "
                "missing; store it at collection time or change it with "
                "set_keys(sample_log_prob=...)."
            )
        if is_tensor_collection(log_mu):
            log_mu = log_mu.sum(dim="feature", reduce=True)
        log_mu = log_mu.reshape(sig.value.shape)
        with hold_out_net(self.actor_network):
            log_pi = stored_action_log_prob(self.actor_network, tensordict).reshape(sig.value.shape)
        advantage, value_target = functional.vtrace_advantage_estimate(
            sig.gamma, log_pi, log_mu, sig.value, sig.next_value, sig.reward, sig.done, sig.terminated,
            rho_thresh=self.rho_thresh, c_thresh=self.c_thresh, time_dim=sig.time_dim,
        )
        return advantage, value_target, sig.valid


def stored_action_log_prob(actor: Any, data: TensorDictBase) -> Tensor:
    """The log-probability under ``actor``'s current policy of the actions stored in ``data``.

    Shape contract: ``data`` of batch size ``S`` holding ``actor``'s inputs and the
    actions under its sample keys gives ``[*S, ...]``, the shape of the distribution's
    ``log_prob`` (several sample keys: their sum, as TorchRL aggregates composite ones).

    Raises:
        TypeError: if ``actor`` is not a probabilistic actor (no ``get_dist``).
        ValueError: if ``data`` lacks a stored action.
    """
    keys = getattr(actor, "dist_sample_keys", None)
    if not keys or not callable(getattr(actor, "get_dist", None)):
        raise TypeError(
            f"actor_network must be a probabilistic actor (torchrl.modules.ProbabilisticActor), "
            f"got {type(actor).__name__}: V-trace scores the stored actions under its distribution."
        )
    missing = [key for key in keys if data.get(key, None) is None]
    if missing:
        raise ValueError(
            f"the batch holds no stored action under {missing[0]!r}: V-trace weighs each step by "
            "pi(a|x) / mu(a|x) for the action that was taken; store the collector's action there."
        )
    dist = actor.get_dist(data.select(*actor.in_keys, strict=False))
    if len(keys) == 1:
        return dist.log_prob(data.get(keys[0]))
    with set_composite_lp_aggregate(True):
        return dist.log_prob(data.select(*keys))
