"""Differentiable twins of the kernels in :mod:`torchrl_ext.value.functional`.

Same arguments (validated by the public functions, and already in the scan dtype) and results
(in that dtype, which the public functions cast back), computed out of place with
:func:`~torchrl_ext.value._scan._differentiable_scan`, so autograd follows them: the public
functions take these when grad mode is on and an input requires grad.
"""
from __future__ import annotations

import torch

from torchrl_ext.value._scan import _as_discount, _differentiable_scan, _fill_continues, _to_dtype


def gae(gamma, lmbda, value, next_value, reward, done, terminated, dim):
    work = value.dtype
    delta = _to_dtype(reward, work) + gamma * (~terminated).to(work) * next_value - value
    return _differentiable_scan(delta, gamma * lmbda * (~done).to(work), dim)


def td_lambda(gamma, lmbda, next_value, reward, done, terminated, dim):
    work = next_value.dtype
    # 0 at the ends (a done, and the last step, which bootstraps), 1 elsewhere.
    continues = _fill_continues(torch.empty_like(next_value), done, dim)
    bootstrap_weight = ((1 - continues) * lmbda + (1 - lmbda)) * gamma * (~terminated).to(work)
    returns = _to_dtype(reward, work) + bootstrap_weight * next_value
    return _differentiable_scan(returns, gamma * lmbda * continues, dim)


def discounted_cumsum(x, gamma, done, dim):
    return _differentiable_scan(x, _as_discount(gamma, x) * (~done).to(x.dtype), dim)


def vtrace(gamma, log_pi, log_mu, value, next_value, reward, done, terminated,
           rho_thresh, c_thresh, dim):
    work = value.dtype
    ratio = (log_pi - log_mu).exp()
    clipped_rho = ratio.clamp(max=rho_thresh)
    clipped_c = ratio.clamp(max=c_thresh)
    bootstrap = gamma * (~terminated).to(work)
    reward_minus_value = _to_dtype(reward, work) - value
    delta = clipped_rho * (reward_minus_value + bootstrap * next_value)
    # 1 inside a trajectory, 0 where the trace is cut (a done, the last step).
    continues = _fill_continues(torch.empty_like(value), done, dim)
    vs = _differentiable_scan(delta, gamma * clipped_c * continues, dim) + value
    # v_{t+1} inside a trajectory; where it is cut (incl. the wrapped last step), the true next value.
    vs_next = torch.lerp(next_value, vs.roll(-1, dim), continues)
    advantage = clipped_rho * (reward_minus_value + bootstrap * vs_next)
    return advantage, vs
