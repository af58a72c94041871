"""Pure tensor math for advantages and returns.

Every function here is tensor-in, tensor-out: no TensorDict, no ``nn.Module`` state, no in-place
change of an argument. Argument names and order follow
:mod:`torchrl.objectives.value.functional`, so each function is a drop-in replacement for its
TorchRL namesake.

Shape contract: ``state_value``, ``next_state_value``, ``reward``, ``done``, ``terminated`` (and
``log_pi`` / ``log_mu`` for V-trace) share one shape ``[*B, T, *F]`` where ``T`` sits at
``time_dim`` (default ``-2``). Any number of leading batch dims works, e.g. ``[N, A, T, 1]`` for
per-agent values with ``time_dim=-2``. ``gamma`` and ``lmbda`` are Python floats or tensors
broadcastable to that shape (per-step or per-env discounts), as are V-trace's ``rho_thresh`` and
``c_thresh``. An empty time dim (``T = 0``) gives empty results.

Dtypes: every function computes in, and returns, the promoted dtype (:func:`torch.promote_types`)
of its floating tensors (values, rewards, log-probabilities; not the discounts or thresholds,
which are cast to it), so a float64 input is never rounded to a float32 or float16 one's
precision. Half-precision results are accumulated in float32 and rounded at the end.

Flag semantics (exactly TorchRL 0.14.1's):

* ``done[t]`` ends the trajectory after step ``t``: the recursion does not
  carry information from ``t + 1`` back to ``t``.
* ``terminated[t]`` removes the bootstrap ``next_state_value[t]``. A step that
  is ``done`` but not ``terminated`` is a truncation: it bootstraps from
  ``next_state_value[t]`` and cuts the trace. ``terminated=None`` means
  ``terminated = done`` (every end is terminal).
* The last step of the tensor bootstraps from ``next_state_value`` unless it
  is terminated.

Algorithm: every estimator reduces to the reverse linear recurrence
``y[t] = x[t] + a[t] * y[t + 1]``, solved by :func:`_reverse_linear_scan` in
``ceil(log2 T)`` rounds of whole-tensor element-wise ops instead of ``T`` rounds of
tiny ops: fast on CPU (few kernel launches) and GPU (no sequential dependency), in
pure torch. The estimators keep the number of torch calls low, since at rollout sizes
each call costs several microseconds of fixed overhead on CPU, as much as its
arithmetic. When grad mode is on and an input requires grad, the same recursion runs
out of place (:mod:`torchrl_ext.value._differentiable`), so gradients flow as through
TorchRL's functions. Inputs are expected to be finite: a NaN or inf in one trajectory
of a batch can also turn outputs of the trajectory stored before it into NaN (the flat
scan multiplies it by a zero coefficient), so check the value network, not the estimate.
TorchRL's vectorised GAE instead splits trajectories at every ``done``, pads them and
convolves (``O(T^2)`` memory traffic per trajectory); a blocked (chunk-then-carry)
formulation was slower on CPU (``benchmarks/``): two Python loops of ``sqrt(T)`` small ops.
"""
from __future__ import annotations

import torch

from torchrl_ext._checks import (
    check_bool,
    check_flag,
    check_floating,
    check_reals,
    check_same_shape,
    check_signals,
    resolve_time_dim,
)
from torchrl_ext.value import _differentiable
from torchrl_ext.value._scan import (
    _as_discount,
    _fill_continues,
    _flag_as_float,
    _needs_autograd,
    _result_dtype,
    _reverse_linear_scan,
    _scan_dtype,
    _scan_workspace,
    _to_dtype,
)

__all__ = [
    "discounted_cumsum",
    "generalized_advantage_estimate",
    "td_lambda_return_estimate",
    "vtrace_advantage_estimate",
]


def generalized_advantage_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Generalized advantage estimate (Schulman et al., 2015, arXiv:1506.02438).

    .. math::
        \delta_t = r_t + \gamma (1 - \mathrm{term}_t) V(s'_t) - V(s_t), \qquad
        A_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) A_{t+1}

    and ``value_target = A + V(s)``. Same arguments and results as
    :func:`torchrl.objectives.value.functional.generalized_advantage_estimate`
    (and its ``vec_`` twin), computed with a log-depth scan.

    Args:
        gamma: discount in ``[0, 1]``, a float or a tensor broadcastable to
            the data (per-step or per-env discounts).
        lmbda: GAE trace parameter in ``[0, 1]``, float or broadcastable tensor.
        state_value: ``V(s_t)``, floating tensor ``[*B, T, *F]``.
        next_state_value: ``V(s'_t)``, same shape.
        reward: ``r_t``, same shape.
        done: boolean, same shape; cuts the trace after step ``t``.
        terminated: boolean, same shape; removes the bootstrap. Defaults to
            ``done``.

    Keyword Args:
        time_dim: the time dimension. Defaults to ``-2``.

    Returns:
        ``(advantage, value_target)``, both with the shape of ``state_value``, in the
        promoted dtype of ``state_value``, ``next_state_value`` and ``reward``.

    Raises:
        TypeError: a value/reward tensor is not floating point, a flag is not
            boolean, or a discount is not a real number or a tensor of them.
        ValueError: shapes differ, ``gamma``/``lmbda`` (or one of their elements)
            is NaN, infinite or outside ``[0, 1]``, or ``time_dim`` is not an int
            or out of range.

    Examples:
        >>> import torch
        >>> from torchrl_ext.value.functional import generalized_advantage_estimate
        >>> value = torch.zeros(1, 4, 1)
        >>> next_value = torch.full((1, 4, 1), 10.0)
        >>> reward = torch.ones(1, 4, 1)
        >>> done = torch.tensor([False, True, False, False]).view(1, 4, 1)
        >>> adv, target = generalized_advantage_estimate(
        ...     0.9, 1.0, value, next_value, reward, done, terminated=done)
        >>> adv.flatten().tolist()
        [10.899999618530273, 1.0, 19.0, 10.0]
    """
    if terminated is None:
        terminated = done
    check_signals(state_value, next_state_value, reward, done, terminated)
    check_reals("gamma", gamma, low=0.0, high=1.0, shape=state_value.shape)
    check_reals("lmbda", lmbda, low=0.0, high=1.0, shape=state_value.shape)
    dim = resolve_time_dim(time_dim, state_value.ndim)
    dtype = _result_dtype(state_value, next_state_value, reward)
    work = _scan_dtype(dtype)
    value, next_value = _to_dtype(state_value, work), _to_dtype(next_state_value, work)
    gamma, lmbda = _as_discount(gamma, value), _as_discount(lmbda, value)
    if _needs_autograd(gamma, lmbda, value, next_value, reward):
        advantage = _differentiable.gae(gamma, lmbda, value, next_value, reward, done, terminated, dim)
    else:
        workspace = _scan_workspace(state_value.shape, dim, work, value.device)
        _fill_continues(workspace.coef, done, dim)  # the scan applies gamma * lmbda
        not_terminal = _flag_as_float(~terminated, work).mul_(gamma)
        delta = torch.sub(reward, value, out=workspace.x)
        delta.addcmul_(not_terminal, next_value)
        advantage = _reverse_linear_scan(workspace, scale=gamma * lmbda)
    return _to_dtype(advantage, dtype), _to_dtype(advantage + value, dtype)


def td_lambda_return_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    *,
    time_dim: int = -2,
) -> torch.Tensor:
    r"""TD(:math:`\lambda`) return, TorchRL's definition.

    .. math::
        G_t = r_t + \gamma \left[(1 - \lambda) \bar V_t
              + \lambda \left(\mathrm{done}_t \bar V_t
              + (1 - \mathrm{done}_t) G_{t+1}\right)\right],
        \qquad \bar V_t = (1 - \mathrm{term}_t) V(s'_t)

    with the last step treated as ``done`` (it bootstraps from
    ``next_state_value``). Same arguments and results as
    :func:`torchrl.objectives.value.functional.td_lambda_return_estimate`.

    Args:
        gamma: discount in ``[0, 1]``, float or broadcastable tensor.
        lmbda: trace parameter in ``[0, 1]``, float or broadcastable tensor.
        next_state_value: ``V(s'_t)``, floating tensor ``[*B, T, *F]``.
        reward: ``r_t``, same shape.
        done: boolean, same shape.
        terminated: boolean, same shape. Defaults to ``done``.
        rolling_gamma: how per-step tensors ``gamma`` / ``lmbda`` apply, as in TorchRL.
            ``True`` or ``None`` (the default): ``gamma[t]`` and ``lmbda[t]`` apply to
            step ``t`` (the scan above). ``False``: ``G_t`` uses ``gamma[t]`` and
            ``lmbda[t]`` at every later step of its trajectory; when they vary along time
            this takes ``O(T^2)`` memory (one scan per start step, like TorchRL's loop).
            With discounts constant along time both definitions agree (TorchRL refuses
            ``False`` there; this returns the common result).

    Keyword Args:
        time_dim: the time dimension. Defaults to ``-2``.

    Returns:
        The returns ``G``, shaped like ``reward``, in the promoted dtype of
        ``next_state_value`` and ``reward``.

    Raises:
        TypeError: ``rolling_gamma`` is not ``None``, ``True`` or ``False``, or one of the
            checks of :func:`generalized_advantage_estimate` fails.

    Examples:
        >>> import torch
        >>> from torchrl_ext.value.functional import td_lambda_return_estimate
        >>> next_value = torch.zeros(1, 3, 1)
        >>> reward = torch.ones(1, 3, 1)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> td_lambda_return_estimate(0.5, 1.0, next_value, reward, done).flatten().tolist()
        [1.75, 1.5, 1.0]
    """
    if terminated is None:
        terminated = done
    check_floating("next_state_value", next_state_value)
    check_floating("reward", reward)
    check_flag("done", done)
    check_flag("terminated", terminated)
    check_same_shape(next_state_value=next_state_value, reward=reward, done=done, terminated=terminated)
    check_reals("gamma", gamma, low=0.0, high=1.0, shape=reward.shape)
    check_reals("lmbda", lmbda, low=0.0, high=1.0, shape=reward.shape)
    rolling = rolling_gamma is None or check_bool("rolling_gamma", rolling_gamma)
    dim = resolve_time_dim(time_dim, reward.ndim)
    if not rolling and (_varies_in_time(gamma, reward.ndim, dim) or _varies_in_time(lmbda, reward.ndim, dim)):
        return _fixed_discount_returns(gamma, lmbda, next_state_value, reward, done, terminated, dim)
    dtype = _result_dtype(next_state_value, reward)
    work = _scan_dtype(dtype)
    next_value = _to_dtype(next_state_value, work)
    gamma, lmbda = _as_discount(gamma, next_value), _as_discount(lmbda, next_value)
    if _needs_autograd(gamma, lmbda, next_value, reward):
        returns = _differentiable.td_lambda(gamma, lmbda, next_value, reward, done, terminated, dim)
    else:
        workspace = _scan_workspace(reward.shape, dim, work, next_value.device)
        # 1 at the ends (a done, and the last step, which bootstraps); the scan's coef is 1 - ends.
        ends = 1 - _fill_continues(workspace.coef, done, dim)
        # Weight of the bootstrap in G_t: gamma at an end, gamma * (1 - lmbda) elsewhere.
        bootstrap_weight = (ends * lmbda).add_(1 - lmbda).mul_(_flag_as_float(~terminated, work).mul_(gamma))
        torch.addcmul(reward, bootstrap_weight, next_value, out=workspace.x)
        returns = _reverse_linear_scan(workspace, scale=gamma * lmbda)
    return _to_dtype(returns, dtype)


def _varies_in_time(discount: float | torch.Tensor, ndim: int, dim: int) -> bool:
    """Whether ``discount`` (broadcastable to ``ndim``-dim data) has more than one entry along ``dim``."""
    from_right = ndim - dim  # broadcasting aligns the trailing dims
    return isinstance(discount, torch.Tensor) and discount.ndim >= from_right and discount.shape[-from_right] > 1


def _fixed_discount_returns(gamma, lmbda, next_value, reward, done, terminated, dim):
    """TD(lambda) with ``rolling_gamma=False``: ``G_k`` is the rolling return of start ``k``
    computed with ``gamma[k]`` and ``lmbda[k]`` at every step. A new dim before ``dim`` indexes
    ``k`` (discounts vary along it, the data along ``dim``); row ``k`` only needs steps ``>= k``,
    so its entry ``k`` is ``G_k``: the diagonal."""
    shape = reward.shape
    starts = shape[:dim] + (shape[dim],) + shape[dim:]

    def per_start(discount):
        return discount.expand(shape).unsqueeze(dim + 1) if isinstance(discount, torch.Tensor) else discount

    def along_time(tensor):
        return tensor.unsqueeze(dim).expand(starts)

    returns = td_lambda_return_estimate(
        per_start(gamma), per_start(lmbda), along_time(next_value), along_time(reward), along_time(done),
        along_time(terminated), time_dim=dim + 1,
    )
    # contiguous(): a copy, so the T x T intermediate is freed
    return returns.diagonal(dim1=dim, dim2=dim + 1).movedim(-1, dim).contiguous()


def discounted_cumsum(
    x: torch.Tensor,
    gamma: float | torch.Tensor,
    done: torch.Tensor,
    *,
    time_dim: int = -2,
) -> torch.Tensor:
    r"""Discounted reverse cumulative sum that restarts after every ``done``.

    .. math:: y_t = x_t + \gamma (1 - \mathrm{done}_t) y_{t+1}, \qquad y_T = 0

    With ``x`` the rewards this is the reward-to-go of TorchRL's
    ``reward2go`` (no bootstrap). To bootstrap a rollout cut at ``T``, add
    ``gamma * V(s_T)`` to ``x[T-1]`` (or use :func:`td_lambda_return_estimate`
    with ``lmbda=1``).

    Args:
        x: floating tensor ``[*B, T, *F]``.
        gamma: discount in ``[0, 1]``, float or broadcastable tensor.
        done: boolean tensor with the shape of ``x``.

    Keyword Args:
        time_dim: the time dimension. Defaults to ``-2``.

    Returns:
        ``y``, shaped like ``x``.

    Examples:
        >>> import torch
        >>> from torchrl_ext.value.functional import discounted_cumsum
        >>> x = torch.ones(4, 1)
        >>> done = torch.tensor([[False], [True], [False], [False]])
        >>> discounted_cumsum(x, 0.5, done).flatten().tolist()
        [1.5, 1.0, 1.5, 1.0]
    """
    check_floating("x", x)
    check_flag("done", done)
    if x.shape != done.shape:
        raise ValueError(
            f"x and done must share one shape [*B, T, *F]; got x={tuple(x.shape)}, "
            f"done={tuple(done.shape)}."
        )
    check_reals("gamma", gamma, low=0.0, high=1.0, shape=x.shape)
    dim = resolve_time_dim(time_dim, x.ndim)
    work = _scan_dtype(x.dtype)
    if _needs_autograd(x, gamma):
        return _to_dtype(_differentiable.discounted_cumsum(_to_dtype(x, work), gamma, done, dim), x.dtype)
    workspace = _scan_workspace(x.shape, dim, work, x.device)
    workspace.x.copy_(x)
    _fill_continues(workspace.coef, done, dim)
    return _to_dtype(_reverse_linear_scan(workspace, scale=_as_discount(gamma, workspace.coef)), x.dtype)


def vtrace_advantage_estimate(
    gamma: float | torch.Tensor,
    log_pi: torch.Tensor,
    log_mu: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rho_thresh: float | torch.Tensor = 1.0,
    c_thresh: float | torch.Tensor = 1.0,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""V-trace targets and advantages (Espeholt et al., 2018, arXiv:1802.01561).

    With :math:`\rho_t = \min(\bar\rho, \pi/\mu)` and
    :math:`c_t = \min(\bar c, \pi/\mu)`:

    .. math::
        \delta_t = \rho_t (r_t + \gamma (1 - \mathrm{term}_t) V(s'_t) - V(s_t)), \quad
        v_t - V(s_t) = \delta_t + \gamma (1 - \mathrm{done}_t) c_t (v_{t+1} - V(s_{t+1}))

    and the advantage
    :math:`\rho_t (r_t + \gamma (1 - \mathrm{term}_t) v^+_t - V(s_t))` where
    :math:`v^+_t = v_{t+1}` inside a trajectory and :math:`V(s'_t)` at a
    ``done`` step or the last step (TorchRL 0.14.1's truncation handling).
    Same arguments and results as TorchRL's ``vtrace_advantage_estimate``.

    Args:
        gamma: discount in ``[0, 1]``, float or broadcastable tensor.
        log_pi: log-probabilities of the taken actions under the policy being
            learned (TorchRL's module passes the current actor here).
        log_mu: log-probabilities under the behaviour policy that collected
            the data. The importance ratio is ``exp(log_pi - log_mu)``.
        state_value: ``V(s_t)``, floating tensor ``[*B, T, *F]``.
        next_state_value: ``V(s'_t)``, same shape.
        reward: ``r_t``, same shape.
        done: boolean, same shape.
        terminated: boolean, same shape. Defaults to ``done``.
        rho_thresh: clip of the importance weight in the TD error (> 0; ``math.inf`` clips
            nothing), float or broadcastable tensor.
        c_thresh: clip of the trace coefficients (> 0; ``math.inf`` clips nothing), float or
            broadcastable tensor.
        time_dim: the time dimension. Defaults to ``-2``. Positional or keyword, as in TorchRL.

    Returns:
        ``(advantage, value_target)`` where ``value_target`` is ``v_t``, in the promoted
        dtype of ``log_pi``, ``log_mu``, ``state_value``, ``next_state_value`` and ``reward``.

    Examples:
        >>> import torch
        >>> from torchrl_ext.value.functional import vtrace_advantage_estimate
        >>> shape = (1, 3, 1)
        >>> logp = torch.zeros(shape)
        >>> value, next_value = torch.zeros(shape), torch.ones(shape)
        >>> reward, done = torch.ones(shape), torch.zeros(shape, dtype=torch.bool)
        >>> adv, vs = vtrace_advantage_estimate(
        ...     0.5, logp, logp, value, next_value, reward, done)
        >>> vs.flatten().tolist()
        [2.625, 2.25, 1.5]
    """
    if terminated is None:
        terminated = done
    check_signals(state_value, next_state_value, reward, done, terminated, log_pi=log_pi, log_mu=log_mu)
    check_reals("gamma", gamma, low=0.0, high=1.0, shape=state_value.shape)
    _check_thresholds(rho_thresh, c_thresh, state_value.shape)
    dim = resolve_time_dim(time_dim, state_value.ndim)
    dtype = _result_dtype(log_pi, log_mu, state_value, next_state_value, reward)
    work = _scan_dtype(dtype)
    value, next_value = _to_dtype(state_value, work), _to_dtype(next_state_value, work)
    log_pi, log_mu = _to_dtype(log_pi, work), _to_dtype(log_mu, work)
    gamma = _as_discount(gamma, value)
    rho_thresh, c_thresh = _as_discount(rho_thresh, value), _as_discount(c_thresh, value)
    if _needs_autograd(gamma, log_pi, log_mu, value, next_value, reward, rho_thresh, c_thresh):
        advantage, vs = _differentiable.vtrace(gamma, log_pi, log_mu, value, next_value, reward, done,
                                               terminated, rho_thresh, c_thresh, dim)
        return _to_dtype(advantage, dtype), _to_dtype(vs, dtype)
    workspace = _scan_workspace(state_value.shape, dim, work, value.device)
    ratio = torch.sub(log_pi, log_mu).exp_()
    clipped_rho = ratio.clamp(max=rho_thresh)
    clipped_c = ratio.clamp_(max=c_thresh)
    # 1 inside a trajectory, 0 at a done step and at the last step: the trace
    # is cut there (and the scan needs coef == 0 at the last step).
    continues = _fill_continues(torch.empty_like(value), done, dim)
    torch.mul(clipped_c, continues, out=workspace.coef)
    not_terminal = _flag_as_float(~terminated, work).mul_(gamma)
    # delta = rho * (r + gamma * (1 - terminated) * V(s') - V(s))
    reward_minus_value = torch.sub(_to_dtype(reward, work), value)
    torch.addcmul(reward_minus_value, not_terminal, next_value, out=workspace.x).mul_(clipped_rho)
    vs = _reverse_linear_scan(workspace, scale=gamma).add_(value)
    # v^+_t: v_{t+1} inside a trajectory, the true next value where the trace is cut
    # (``continues == 0``, which also masks what the flat shift reads past the end of a row).
    vs_following = vs.as_strided(vs.shape, vs.stride(), workspace.step)
    vs_next = torch.lerp(next_value, vs_following, continues)
    advantage = reward_minus_value.addcmul_(not_terminal, vs_next)
    return _to_dtype(advantage.mul_(clipped_rho), dtype), _to_dtype(vs, dtype)


def _check_thresholds(rho_thresh: float | torch.Tensor, c_thresh: float | torch.Tensor,
                      shape: torch.Size | None = None) -> None:
    for name, thresh in (("rho_thresh", rho_thresh), ("c_thresh", c_thresh)):
        check_reals(name, thresh, low=0.0, open_low=True, finite=False, shape=shape,
                    hint="e.g. 1.0, the IMPALA default (+inf: no clipping)")
