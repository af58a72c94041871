"""The scan behind every value kernel: ``y[t] = x[t] + a[t] * y[t + 1]`` in log depth.

Also the small tensor helpers the kernels share (flag conversion, dtype
handling). See :func:`_reverse_linear_scan` and ``docs/architecture.md``.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch


def _flag_as_float(flag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Fresh ``0./1.`` tensor of ``flag``, through a ``uint8`` view: several times faster on CPU
    than a ``bool`` cast or ``where``/``masked_fill``, which keeps the estimators cheap at small sizes."""
    return flag.view(torch.uint8).to(dtype)


def _needs_autograd(*args: object) -> bool:
    """Whether grad mode is on and an argument requires grad: autograd cannot follow the fast
    kernels' ``out=`` writes into reused workspaces, so the kernels then take their out-of-place
    twins (:mod:`torchrl_ext.value._differentiable`, TorchRL's ``differentiable=True``)."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _differentiable_scan(x: torch.Tensor, coef: torch.Tensor, dim: int) -> torch.Tensor:
    """``y[t] = x[t] + coef[t] * y[t + 1]`` (``y[T] = 0``) along ``dim``, out of place.

    The same log-depth rounds as :func:`_reverse_linear_scan`, each a new tensor, so autograd
    records them; shifted reads past the last step see zeros. ``x`` and ``coef`` share one shape.
    """
    offset = 1
    while offset < x.shape[dim]:
        x = x + coef * _ahead(x, dim, offset)
        coef = coef * _ahead(coef, dim, offset)
        offset *= 2
    return x


def _ahead(x: torch.Tensor, dim: int, offset: int) -> torch.Tensor:
    """``x[t + offset]`` along ``dim`` (``offset < T``), zeros past the last step (out of place)."""
    pad = [0, 0] * (x.ndim - 1 - dim) + [0, offset]
    return torch.nn.functional.pad(x.narrow(dim, offset, x.shape[dim] - offset), pad)


def _fill_continues(out: torch.Tensor, done: torch.Tensor, dim: int) -> torch.Tensor:
    """Writes ``1 - done`` into ``out``, with 0 at the last step (where the
    trajectory is cut too, and where the flat scan needs a 0 coefficient)."""
    out.copy_((~done).view(torch.uint8))  # a uint8 source copies much faster than bool
    if out.shape[dim]:
        out.narrow(dim, out.shape[dim] - 1, 1).zero_()
    return out


class _Workspace:
    """Buffers and views of one :func:`_reverse_linear_scan` shape.

    ``buffer`` holds 4 flat rows: ``x`` and ``coef`` (rows 0 and 1, which the caller fills
    through the views shaped like the data) and their ping-pong twins (rows 2 and 3). Each row
    is followed by zeros covering the largest shift of the scan, so shifted reads past the end
    see finite values (the scan only writes a row's first ``numel`` elements). ``rounds`` holds
    per round the operand views ``(x, coef, x shifted, coef shifted, x out, coef out)``, made
    once per shape: a view costs microseconds, as much as a kernel at rollout sizes.
    """

    def __init__(self, shape: torch.Size, dim: int, dtype: torch.dtype, device: torch.device):
        self.numel = numel = math.prod(shape)
        length = shape[dim]
        self.step = step = math.prod(shape[dim + 1:])  # flat distance between time steps
        largest_offset = 1 << (length - 1).bit_length() - 1 if length > 1 else 0
        self.buffer = torch.zeros(4, numel + largest_offset * step, dtype=dtype, device=device)
        rows = self.buffer.unbind(0)
        heads = [row[:numel] for row in rows]
        self.x, self.coef = heads[0].view(shape), heads[1].view(shape)
        self.rounds = []
        src, offset = 0, 1  # rows src (x) and src + 1 (coef) hold the current round
        while offset < length:
            dst, shift = 2 - src, offset * step
            self.rounds.append((
                heads[src], heads[src + 1],
                rows[src][shift:shift + numel], rows[src + 1][shift:shift + numel],
                heads[dst], heads[dst + 1],
            ))
            src, offset = dst, 2 * offset


# Workspaces are reused per thread (the scan writes into them) and per shape;
# bounded in count and size so a long-lived process does not hoard memory.
_WORKSPACES = threading.local()
_MAX_WORKSPACES = 8
_MAX_CACHED_NUMEL = 1 << 20


def _scan_workspace(shape: torch.Size, dim: int, dtype: torch.dtype, device: torch.device) -> _Workspace:
    """The (reused) workspace of :func:`_reverse_linear_scan` for this shape."""
    key = (tuple(shape), dim, dtype, device)
    cache = getattr(_WORKSPACES, "cache", None)
    if cache is None:
        cache = _WORKSPACES.cache = OrderedDict()
    workspace = cache.get(key)
    if workspace is not None:
        cache.move_to_end(key)
        return workspace
    # Reused across calls, so its buffer and views must be normal tensors: ones made
    # under inference_mode could not be written (out=) by a later call outside it.
    with torch.inference_mode(False):
        workspace = _Workspace(torch.Size(shape), dim, dtype, device)
    if workspace.numel <= _MAX_CACHED_NUMEL:
        cache[key] = workspace
        if len(cache) > _MAX_WORKSPACES:
            cache.popitem(last=False)
    return workspace


def _reverse_linear_scan(workspace: _Workspace, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Solves ``y[t] = x[t] + scale * coef[t] * y[t + 1]`` (``y[T] = 0``) along ``dim``.

    ``workspace.x`` and ``workspace.coef`` are filled by the caller, with ``coef == 0`` at the
    last step ``T - 1`` (where its value does not matter to the recursion). Returns ``y``, a
    fresh contiguous tensor shaped like the data whose storage holds one more time step of zeros
    (``step`` elements), so ``y.as_strided(y.shape, y.stride(), step)`` is ``y[t + 1]`` except
    at the last step of each row, where it reads the next row or the zeros.

    Hillis-Steele (log-depth) scan: round ``k`` (offset ``d = 2**k``) folds the partial sum that
    starts ``d`` steps later into ``y[t]`` and composes the coefficients, ``coef[t] *= coef[t + d]``.
    It runs on the flattened contiguous rows, where a shift by ``d`` steps is a shift by
    ``d * step`` elements, for every batch row at once. This is exact because ``coef[T - 1] == 0``:
    a composed coefficient whose window reaches past the end of a row is 0, so what the shift
    reads from the next row is multiplied by 0 (assuming finite inputs). Each round writes to the
    twin rows (ping-pong), so overlapping operands need no clone: two kernels per round. The
    Python float ``scale`` (e.g. ``gamma``) is kept out of ``coef`` and passed as ``addcmul``'s
    ``value=``, squared each round (in float64), which saves a multiplication pass; a tensor
    ``scale`` is folded into ``coef`` first.
    """
    if isinstance(scale, torch.Tensor):
        workspace.coef.mul_(scale)
        scale = 1.0
    numel = workspace.numel
    # One call (a memset) is cheaper than an empty tensor plus a slice to zero.
    result = torch.zeros(numel + workspace.step, dtype=workspace.buffer.dtype,
                         device=workspace.buffer.device)
    y = result[:numel].view(workspace.x.shape)
    if not workspace.rounds:
        return y.copy_(workspace.x)
    *rounds, last = workspace.rounds
    for x, coef, x_ahead, coef_ahead, x_out, coef_out in rounds:
        torch.addcmul(x, coef, x_ahead, value=scale, out=x_out)
        torch.mul(coef, coef_ahead, out=coef_out)
        scale = scale * scale
    # Last round: the composed coefficients are no longer needed.
    x, coef, x_ahead = last[:3]
    torch.addcmul(x, coef, x_ahead, value=scale, out=result[:numel])
    return y


def _to_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # ``Tensor.to`` returns ``tensor`` itself when nothing changes, but the
    # call alone costs as much as a small kernel on CPU.
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype of an estimator's results: torch's promotion of its floating inputs' dtypes
    (float32 with float64 gives float64, float16 with bfloat16 float32), as TorchRL's
    arithmetic promotes them, so no input is rounded to a narrower one's precision."""
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        if tensor.dtype != dtype:
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _scan_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision partial sums lose too much over long horizons.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _as_discount(value: float | torch.Tensor, like: torch.Tensor) -> float | torch.Tensor:
    """Keeps Python floats as floats (cheaper kernels), moves tensors to ``like``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype=like.dtype, device=like.device)
    return float(value)
