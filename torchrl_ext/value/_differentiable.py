"""Differentiable twins of the kernels in :mod:`torchrl_ext.value.functional`.

Same arguments (validated by the public functions) and results, computed out of place with
:func:`~torchrl_ext.value._scan._differentiable_scan`, so autograd follows them: the public
functions take these when grad mode is on and an input requires grad.
"""
from __future__ import annotations

import torch

from torchrl_ext.value._scan import _ahead, _as_discount, _differentiable_scan, _scan_dtype, _to_dtype


def _last_step(like: torch.Tensor, dim: int) -> torch.Tensor:
    """1 at the last step along ``dim``, 0 elsewhere, shaped like ``like`` (no grad)."""
    mask = torch.zeros_like(like, dtype=torch.bool)
    if like.shape[dim]:  # an empty time dim (T = 0) has no last step
        mask.narrow(dim, like.shape[dim] - 1, 1).fill_(True)
    return mask


def gae(gamma, lmbda, state_value, next_state_value, reward, done, terminated, dim):
    dtype, work = state_value.dtype, _scan_dtype(state_value.dtype)
    value, next_value = _to_dtype(state_value, work), _to_dtype(next_state_value, work)
    gamma, lmbda = _as_discount(gamma, value), _as_discount(lmbda, value)
    delta = _to_dtype(reward, work) + gamma * (~terminated).to(work) * next_value - value
    advantage = _differentiable_scan(delta, gamma * lmbda * (~done).to(work), dim)
    return _to_dtype(advantage, dtype), _to_dtype(advantage + value, dtype)


def td_lambda(gamma, lmbda, next_state_value, reward, done, terminated, dim):
    dtype, work = reward.dtype, _scan_dtype(reward.dtype)
    next_value = _to_dtype(next_state_value, work)
    gamma, lmbda = _as_discount(gamma, next_value), _as_discount(lmbda, next_value)
    ends = (done | _last_step(done, dim)).to(work)  # the last step bootstraps
    bootstrap_weight = (ends * lmbda + (1 - lmbda)) * gamma * (~terminated).to(work)
    returns = _to_dtype(reward, work) + bootstrap_weight * next_value
    return _to_dtype(_differentiable_scan(returns, gamma * lmbda * (1 - ends), dim), dtype)


def discounted_cumsum(x, gamma, done, dim):
    work = _scan_dtype(x.dtype)
    coef = _as_discount(gamma, _to_dtype(x, work)) * (~done).to(work)
    return _to_dtype(_differentiable_scan(_to_dtype(x, work), coef, dim), x.dtype)


def vtrace(gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated,
           rho_thresh, c_thresh, dim):
    dtype, work = state_value.dtype, _scan_dtype(state_value.dtype)
    value, next_value = _to_dtype(state_value, work), _to_dtype(next_state_value, work)
    gamma = _as_discount(gamma, value)
    ratio = (_to_dtype(log_pi, work) - _to_dtype(log_mu, work)).exp()
    clipped_rho = ratio.clamp(max=_as_discount(rho_thresh, value))
    clipped_c = ratio.clamp(max=_as_discount(c_thresh, value))
    bootstrap = gamma * (~terminated).to(work)
    reward_minus_value = _to_dtype(reward, work) - value
    delta = clipped_rho * (reward_minus_value + bootstrap * next_value)
    vs = _differentiable_scan(delta, gamma * clipped_c * (~done).to(work), dim) + value
    # v_{t+1} inside a trajectory, the true next value where it is cut (a done, the last step).
    vs_next = torch.where(done | _last_step(done, dim), next_value, _ahead(vs, dim, 1))
    advantage = clipped_rho * (reward_minus_value + bootstrap * vs_next)
    return _to_dtype(advantage, dtype), _to_dtype(vs, dtype)
