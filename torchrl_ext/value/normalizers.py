"""Running value / reward normalisers ported from HARL and pytorchrl.

* :class:`ValueNorm`: HARL's debiased-EMA value normaliser (PopArt-style target scaling).
* :class:`RunningMeanStd`: running mean/variance merged with the parallel (Chan et al.) rule.
* :class:`IntrinsicRewardNormalizer`: pytorchrl's / RND's intrinsic-reward scaling.

All state lives in registered buffers, so ``state_dict()``, ``load_state_dict()`` and ``.to()``
behave like any other module; ``load_state_dict`` refuses a damaged state (NaN, infinite or
negative statistics) with a ``ValueError`` before copying any of it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from torchrl_ext._checks import (
    CheckedSetting, check_bool, check_device, check_finite, check_int, check_real, check_reals, makes_kept_tensors,
)
from torchrl_ext.value.functional import discounted_cumsum

__all__ = ["ValueNorm", "RunningMeanStd", "IntrinsicRewardNormalizer"]


def _as_shape(shape: int | tuple[int, ...], name: str) -> torch.Size:
    dims = tuple(shape) if isinstance(shape, Iterable) else (shape,)
    if any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in dims):
        raise ValueError(
            f"`{name}` must be a positive int or a tuple of positive ints, got {shape!r}; "
            f"pass e.g. {name}=1 for scalar values."
        )
    return torch.Size(int(d) for d in dims)


def _as_float_tensor(x: Any, name: str, device: torch.device) -> Tensor:
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        raise TypeError(
            f"`{name}` must hold floating-point values, got dtype {t.dtype}; "
            f"convert it first, e.g. `{name}.float()` (torch) or `{name}.astype(np.float32)`."
        )
    return t.to(device)


def _check_finite(x: Tensor, name: str) -> None:
    """Refuses NaN / infinite values before they reach running statistics, which they would
    turn NaN for good (and every normalised value and GAE result after them)."""
    check_finite(name, x, "the running statistics were left unchanged. Drop them first, e.g. "
                 f"`{name}[torch.isfinite({name})]`, or fix what produced them.")


def _check_trailing(x: Tensor, shape: torch.Size, name: str, lead: int | None) -> None:
    """Checks ``x.shape == (*leading, *shape)``; ``lead`` fixes the number of leading dims."""
    n_lead = x.ndim - len(shape)
    if n_lead < 0 or x.shape[n_lead:] != shape or (lead is not None and n_lead != lead):
        expected = f"{lead} leading dim(s)" if lead is not None else "any leading dims"
        raise ValueError(
            f"`{name}` has shape {tuple(x.shape)} but its trailing shape must equal "
            f"{tuple(shape)} ({expected} followed by {tuple(shape)}); reshape `{name}` "
            f"or build the normaliser with a matching shape."
        )


class _CheckedState(nn.Module):
    """A module whose ``load_state_dict`` refuses damaged statistics before copying any of them:
    a NaN mean or a negative variance loads silently and turns every later output NaN.

    ``_finite`` names the buffers that must be finite, ``_nonnegative`` those that must also be
    ``>= 0``. Missing or non-tensor entries are left to torch's own errors (``strict=False`` stays).
    """

    _finite: tuple[str, ...] = ()
    _nonnegative: tuple[str, ...] = ()

    def _check_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        hint = "nothing was loaded; load a state saved by this module, not a damaged or edited one"
        for key in self._finite + self._nonnegative:
            value = state_dict.get(prefix + key)
            if isinstance(value, Tensor):
                name = f"state_dict['{prefix}{key}']"
                check_finite(name, value, hint + ".")
                if key in self._nonnegative:
                    check_reals(name, value, low=0.0, hint=hint)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        self._check_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ValueNorm(_CheckedState):
    """HARL's value normaliser: debiased exponential moving averages of ``x`` and ``x**2``.

    ``update`` folds a batch into the EMAs (weight ``w = beta``, or ``beta ** batch_size`` with
    ``per_element_update``); ``normalize``/``denormalize`` map values to and from the normalised
    space using ``mean = running_mean / d`` and ``var = max(running_mean_sq / d - mean**2, 1e-2)``
    with ``d = max(debiasing_term, epsilon)``. The variance floor keeps the std at or above 0.1.

    Shape contract: ``update(x)`` needs ``x.shape == (*B, *input_shape)`` with ``len(B) ==
    norm_axes``; ``normalize``/``denormalize`` accept any number of leading dims and return the
    input's shape.

    Differences from HARL:
        * The state is held in registered buffers (HARL quirk Q9: its ``nn.Parameter(...).to()``
          turned them into plain tensors, so ``state_dict()`` was silently empty).
        * ``denormalize`` returns a torch tensor (HARL returns a numpy array).
        * Inputs keep their floating dtype in ``normalize``/``denormalize`` (float64 stays float64);
          HARL casts everything to float32. ``update`` still casts to the buffer dtype, then
          takes the batch moments in float64 and refuses a mean square the state dtype cannot
          hold (float16: values near 256 or beyond) instead of storing inf.
        * Invalid arguments / inputs raise ``ValueError``/``TypeError`` up front; a failing
          ``update`` leaves the state untouched. ``beta``, ``epsilon``, ``norm_axes`` and
          ``per_element_update`` (a bool: ``TypeError`` otherwise) stay checked when set
          later, and ``load_state_dict`` refuses a damaged state.

    Args:
        input_shape: Shape of one value (``1`` for a scalar critic).
        norm_axes: Number of leading batch dims reduced over in ``update``.
        beta: EMA decay in ``(0, 1]``.
        per_element_update: Weight by ``beta ** batch_size`` instead of ``beta`` (``True`` or
            ``False``).
        epsilon: Lower bound of the debiasing term (must be ``> 0``).
        device: Device of the state.
        dtype: Floating dtype of the state.

    Examples:
        >>> vn = ValueNorm(1, beta=0.9)
        >>> vn.update(torch.tensor([[1.0], [3.0]]))
        >>> mean, var = vn.running_mean_var()
        >>> mean
        tensor([2.])
        >>> vn.normalize(torch.tensor([[2.0], [3.0]])).flatten()
        tensor([0., 1.])
        >>> vn.denormalize(torch.tensor([[1.0]]))
        tensor([[3.]])
    """

    running_mean: Tensor
    running_mean_sq: Tensor
    debiasing_term: Tensor
    _finite = ("running_mean",)
    _nonnegative = ("running_mean_sq", "debiasing_term")  # a mean of squares, a sum of weights

    norm_axes = CheckedSetting(
        check_int, "Leading batch dims reduced over in ``update``, an int ``>= 1``; settable.",
        minimum=1, hint="use norm_axes=1 for (B, *input_shape) inputs",
    )
    beta = CheckedSetting(
        check_real, "EMA decay in ``(0, 1]``; settable.", low=0.0, high=1.0, open_low=True,
        hint="typical values are 0.99999 or 0.99",
    )
    epsilon = CheckedSetting(
        check_real, "Lower bound of the debiasing term, ``> 0``; settable.", low=0.0, open_low=True,
        hint="the default is 1e-5",
    )
    per_element_update = CheckedSetting(
        check_bool, "Weight each update by ``beta ** batch_size`` instead of ``beta``; settable.",
    )

    @makes_kept_tensors  # built inside torch.inference_mode(), its buffers could never be updated outside it
    def __init__(
        self,
        input_shape: int | tuple[int, ...],
        norm_axes: int = 1,
        beta: float = 0.99999,
        per_element_update: bool = False,
        epsilon: float = 1e-5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        shape = _as_shape(input_shape, "input_shape")
        self.norm_axes, self.beta, self.epsilon = norm_axes, beta, epsilon
        self.per_element_update = per_element_update
        if isinstance(dtype, str):  # configs name dtypes as strings ("float32")
            dtype = getattr(torch, dtype, dtype)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"`dtype` must be a floating dtype, got {dtype!r}; use torch.float32.")
        device = None if device is None else check_device("device", device)
        self.input_shape = shape
        self.register_buffer("running_mean", torch.zeros(shape, device=device, dtype=dtype))
        self.register_buffer("running_mean_sq", torch.zeros(shape, device=device, dtype=dtype))
        self.register_buffer("debiasing_term", torch.zeros((), device=device, dtype=dtype))

    def extra_repr(self) -> str:
        return (
            f"input_shape={tuple(self.input_shape)}, norm_axes={self.norm_axes}, beta={self.beta}, "
            f"per_element_update={self.per_element_update}, epsilon={self.epsilon}"
        )

    @torch.no_grad()
    def update(self, x: Tensor | Any) -> None:
        """Folds the batch ``x`` of shape ``(*B, *input_shape)``, ``len(B) == norm_axes``, in."""
        x = _as_float_tensor(x, "x", self.running_mean.device)
        _check_trailing(x, self.input_shape, "x", self.norm_axes)
        batch_size = math.prod(x.shape[: self.norm_axes])
        if batch_size == 0:
            raise ValueError(f"`x` has shape {tuple(x.shape)}: an empty batch cannot update the statistics.")
        _check_finite(x, "x")
        # HARL rounds x to the state dtype; the moments are then taken in float64, since
        # x * x overflows a narrow dtype long before x does (float16: |x| > 255).
        dtype, dims = self.running_mean.dtype, tuple(range(self.norm_axes))
        wide = x.to(dtype).double()
        batch_mean = wide.mean(dim=dims).to(dtype)
        batch_mean_sq = (wide * wide).mean(dim=dims).to(dtype)
        if not bool(torch.isfinite(batch_mean_sq).all()):
            raise ValueError(
                f"`x` (largest |x| = {float(x.abs().max()):g}) has a mean square that overflows "
                f"the state dtype {dtype}; the running statistics were left unchanged. Build "
                "ValueNorm with a wider dtype (e.g. dtype=torch.float32) or scale the values down."
            )
        w = self.beta**batch_size if self.per_element_update else self.beta
        self.running_mean.mul_(w).add_(batch_mean * (1.0 - w))
        self.running_mean_sq.mul_(w).add_(batch_mean_sq * (1.0 - w))
        self.debiasing_term.mul_(w).add_(1.0 - w)

    def running_mean_var(self) -> tuple[Tensor, Tensor]:
        """Returns the debiased ``(mean, var)``, each of shape ``input_shape``."""
        d = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / d
        return mean, (self.running_mean_sq / d - mean * mean).clamp(min=1e-2)

    def _stats_for(self, x: Any) -> tuple[Tensor, Tensor, Tensor]:
        x = _as_float_tensor(x, "x", self.running_mean.device)
        _check_trailing(x, self.input_shape, "x", None)
        mean, var = self.running_mean_var()
        return x, mean.to(x.dtype), var.to(x.dtype).sqrt()

    def normalize(self, x: Tensor | Any) -> Tensor:
        """Returns ``(x - mean) / std`` with ``x`` of shape ``(..., *input_shape)``."""
        x, mean, std = self._stats_for(x)
        return (x - mean) / std

    def denormalize(self, x: Tensor | Any) -> Tensor:
        """Returns ``x * std + mean`` (a tensor, unlike HARL); ``x`` is ``(..., *input_shape)``."""
        x, mean, std = self._stats_for(x)
        return x * std + mean

    def forward(self, x: Tensor | Any) -> Tensor:
        """Alias of :meth:`normalize`."""
        return self.normalize(x)


class RunningMeanStd(_CheckedState):
    """pytorchrl's running mean / variance (float64), merged by the parallel rule of Chan et al.

    With batch moments ``bm``, ``bv`` (unbiased) and ``n`` samples: ``delta = bm - mean``,
    ``tot = count + n``, ``mean += delta * n / tot``,
    ``var = (var * count + bv * n + delta**2 * count * n / tot) / tot``, ``count = tot``.
    The state starts at ``mean = 0``, ``var = 1``, ``count = epsilon``.

    Shape contract: ``update(x)`` takes ``x`` of shape ``(n, *shape)``; ``mean``/``var`` have
    shape ``shape``; ``count`` is a scalar.

    Differences from pytorchrl:
        * A batch with a single sample contributes batch variance 0 (its unbiased variance is
          undefined; pytorchrl would turn the running variance into NaN). An empty batch is a
          no-op.
        * Batch moments are computed in float64 (pytorchrl reduces float32 inputs in float32).
        * An update whose merged statistics overflow float64 is refused (``ValueError``) and
          stores nothing.
        * The state is in buffers, so it is saved by ``state_dict()``; ``load_state_dict``
          refuses a non-finite state or a negative ``var`` / ``count``.

    Args:
        shape: Shape of one sample.
        epsilon: Initial pseudo-count (must be ``> 0``).
        device: Device of the state.

    Examples:
        >>> rms = RunningMeanStd(epsilon=1e-4)
        >>> rms.update(torch.tensor([1.0, 2.0, 3.0]))
        >>> round(rms.mean.item(), 3), round(rms.var.item(), 3), round(rms.count.item(), 4)
        (2.0, 1.0, 3.0001)
    """

    mean: Tensor
    var: Tensor
    count: Tensor
    _finite = ("mean",)
    _nonnegative = ("var", "count")

    @makes_kept_tensors
    def __init__(
        self,
        shape: tuple[int, ...] = (),
        epsilon: float = 1e-4,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.shape = _as_shape(shape, "shape")
        epsilon = check_real("epsilon", epsilon, low=0.0, open_low=True, hint="the default is 1e-4")
        f64 = dict(device=None if device is None else check_device("device", device), dtype=torch.float64)
        self.register_buffer("mean", torch.zeros(self.shape, **f64))
        self.register_buffer("var", torch.ones(self.shape, **f64))
        self.register_buffer("count", torch.tensor(epsilon, **f64))

    def extra_repr(self) -> str:
        return f"shape={tuple(self.shape)}"

    @property
    def std(self) -> Tensor:
        """Square root of the running variance."""
        return self.var.sqrt()

    @torch.no_grad()
    def update(self, x: Tensor | Any) -> None:
        """Folds the samples ``x`` of shape ``(n, *shape)`` into the statistics."""
        x = _as_float_tensor(x, "x", self.mean.device).to(self.mean.dtype)
        _check_trailing(x, self.shape, "x", 1)
        if x.shape[0]:
            _check_finite(x, "x")
            self._set(*self._merged_samples(x, "x"))

    def _merged_samples(self, x: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`_merged` with the moments of the finite samples ``x`` (``n >= 1``, state dtype)."""
        n = x.shape[0]
        batch_var = x.var(dim=0, correction=1) if n > 1 else torch.zeros_like(self.var)
        return self._merged(x.mean(dim=0), batch_var, n, name)

    def _merged(self, bm: Tensor, bv: Tensor, batch_count: float, name: str) -> tuple[Tensor, Tensor, Tensor]:
        """The ``(mean, var, count)`` after merging the batch moments, without storing them.

        Raises:
            ValueError: naming ``name`` when they overflow float64 (values near 1e154 or
                beyond); nothing is stored then.
        """
        total = self.count + batch_count
        delta = bm - self.mean
        m2 = self.var * self.count + bv * batch_count + delta * delta * self.count * batch_count / total
        mean, var = self.mean + delta * batch_count / total, m2 / total
        if not bool(torch.isfinite(mean).all() and torch.isfinite(var).all()):
            raise ValueError(
                f"`{name}` makes the running variance overflow float64 (batch mean up to "
                f"{float(bm.abs().max()):g}, batch variance up to {float(bv.max()):g}); the running "
                f"statistics were left unchanged. Scale `{name}` down or drop its outliers."
            )
        return mean, var, total

    def _set(self, mean: Tensor, var: Tensor, count: Tensor) -> None:
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)

    @torch.no_grad()
    def update_from_moments(self, batch_mean: Tensor | Any, batch_var: Tensor | Any,
                            batch_count: float) -> None:
        """Merges batch moments (each of shape ``shape``) computed over ``batch_count`` samples."""
        batch_count = check_real("batch_count", batch_count, low=0.0)
        bm = _as_float_tensor(batch_mean, "batch_mean", self.mean.device).to(self.mean.dtype)
        bv = _as_float_tensor(batch_var, "batch_var", self.mean.device).to(self.mean.dtype)
        _check_trailing(bm, self.shape, "batch_mean", 0)
        _check_trailing(bv, self.shape, "batch_var", 0)
        if batch_count == 0:
            return
        _check_finite(bm, "batch_mean")
        _check_finite(bv, "batch_var")
        if bool((bv < 0).any()):
            raise ValueError(
                f"`batch_var` must be >= 0, got a minimum of {float(bv.min())}; pass the "
                "batch's variance, not a difference of moments that rounding made negative."
            )
        self._set(*self._merged(bm, bv, batch_count, "batch_mean` / `batch_var"))


class IntrinsicRewardNormalizer(_CheckedState):
    """Scales intrinsic rewards by the running std of a discounted intrinsic-reward sum.

    * ``mode="backward"`` (pytorchrl's ``normalize_int_rewards``): per rollout,
      ``e[t] = gamma * e[t+1] + r[t]`` from ``e[T] = 0`` (dones ignored, nothing carried over
      between calls); the running stats see all ``T*N`` values of ``e``.
    * ``mode="forward"`` (the RND paper's reward forward filter): ``f_t = gamma * f_{t-1} + r_t``
      per env, carried across calls; the running stats see all ``T*N`` values of ``f``.

    Both return ``r / sqrt(var)`` (no mean subtraction), with ``var`` cast to ``r``'s dtype.

    Shape contract: ``intrinsic_reward`` is time-major ``[T, N]`` or ``[T, N, 1]``; the output has
    the same shape. In forward mode ``N`` must stay the same between calls.

    Differences from pytorchrl:
        * Returns exactly ``T`` rows; pytorchrl keeps a ``T+1``-row buffer whose last row stays 0.
          ``T = 0`` returns an empty result and changes nothing.
        * A refused call (``ValueError``) moves neither the forward filter nor the statistics.
        * The statistics use :class:`RunningMeanStd` (float64 batch moments; see its notes).
        * ``gamma`` stays checked when set later; ``load_state_dict`` refuses a non-finite
          filter or damaged statistics before copying any of them.

    Args:
        gamma: Discount of the summed rewards, in ``[0, 1]``.
        mode: ``"backward"`` or ``"forward"``.
        epsilon: Initial pseudo-count of the running statistics.
        device: Device of the state.

    Examples:
        >>> norm = IntrinsicRewardNormalizer(gamma=0.5)
        >>> out = norm(torch.tensor([[1.0, 2.0], [2.0, 2.0]]))
        >>> out.shape
        torch.Size([2, 2])
        >>> norm.rms.count.item()
        4.0001
    """

    _finite = ("forward_filter",)
    gamma = CheckedSetting(
        check_real, "Discount of the summed rewards, in ``[0, 1]``; settable.", low=0.0, high=1.0,
        hint="e.g. gamma=0.99",
    )

    @makes_kept_tensors
    def __init__(
        self,
        gamma: float,
        *,
        mode: Literal["backward", "forward"] = "backward",
        epsilon: float = 1e-4,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.gamma = gamma
        if mode not in ("backward", "forward"):
            raise ValueError(f"`mode` must be 'backward' or 'forward', got {mode!r}.")
        self._mode = mode
        self.rms = RunningMeanStd((1,), epsilon, device=device)
        if mode == "forward":
            # Per-env filter state; empty until the first call tells us N.
            self.register_buffer("forward_filter", torch.zeros(0, device=device, dtype=torch.float64))

    @property
    def mode(self) -> str:
        """``"backward"`` or ``"forward"``, fixed at construction (only forward mode keeps a filter state)."""
        return self._mode

    @mode.setter
    def mode(self, value: Any) -> None:
        raise AttributeError(
            f"mode is fixed when the normalizer is built (got mode={value!r}); build a new "
            f"IntrinsicRewardNormalizer(gamma, mode={value!r})."
        )

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, mode={self.mode!r}"

    def _check_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        super()._check_state(state_dict, prefix)
        self.rms._check_state(state_dict, prefix + "rms.")  # loaded after the filter: check it first

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # The filter's shape is only known after the first call, so size it from the checkpoint
        # (once the checkpoint is known to be sound).
        saved = state_dict.get(prefix + "forward_filter")
        if self.mode == "forward" and saved is not None and saved.shape != self.forward_filter.shape:
            self._check_state(state_dict, prefix)
            self.forward_filter = self.forward_filter.new_zeros(saved.shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, intrinsic_reward: Tensor | Any) -> Tensor:
        """Updates the statistics with the rollout and returns the scaled rewards."""
        r = _as_float_tensor(intrinsic_reward, "intrinsic_reward", self.rms.mean.device)
        if not (r.ndim == 2 or (r.ndim == 3 and r.shape[-1] == 1)):
            raise ValueError(
                f"`intrinsic_reward` must be time-major [T, N] or [T, N, 1], got shape {tuple(r.shape)}; "
                "add an env dim with `r.unsqueeze(-1)` for a single env."
            )
        r2 = r.detach().reshape(r.shape[0], r.shape[1])
        _check_finite(r2, "intrinsic_reward")  # before the forward filter moves
        num_steps, num_envs = r2.shape
        never = torch.zeros_like(r2, dtype=torch.bool)
        if self.mode == "backward":
            # e[t] = gamma e[t+1] + r[t]: one log-depth scan, in the rewards' dtype
            # as pytorchrl accumulates in the storage dtype.
            sums = discounted_cumsum(r2, self.gamma, never, time_dim=0)
        else:
            acc = self.forward_filter
            if acc.numel() == 0:
                acc = torch.zeros(num_envs, dtype=acc.dtype, device=acc.device)
            elif acc.shape[0] != num_envs:
                raise ValueError(
                    f"`intrinsic_reward` has {num_envs} envs but the forward filter holds {acc.shape[0]}; "
                    "keep N fixed or use a fresh normalizer."
                )
            # f_t = gamma f_{t-1} + r_t is the backward sum of the time-reversed
            # rewards, plus the carried filter decayed by gamma^(t+1).
            reversed_r = r2.to(acc.dtype).flip(0)
            sums = discounted_cumsum(reversed_r, self.gamma, never, time_dim=0).flip(0)
            decay = self.gamma ** torch.arange(1, num_steps + 1, dtype=acc.dtype, device=acc.device)
            sums = sums + decay.unsqueeze(1) * acc
        if num_steps:  # T = 0 changes nothing
            # Everything is computed and checked before the filter or the statistics move.
            stats = self.rms._merged_samples(sums.reshape(-1, 1).to(self.rms.mean.dtype), "intrinsic_reward")
            if self.mode == "forward":
                with torch.inference_mode(False):  # a normal tensor, which load_state_dict can write
                    self.forward_filter = sums[-1].clone()
            self.rms._set(*stats)
        return r / self.rms.var.to(r.dtype).sqrt()
