"""Input validation shared by the value kernels: clear errors naming the argument."""
from __future__ import annotations

from numbers import Real

import torch

SHAPE_ERR = (
    "All input tensors (state_value, next_state_value, reward, done, terminated"
    "{extra}) must share one shape [*B, T, *F]; got {shapes}."
)


########################################################################
# Validation
# ----------


def _check_floating(name: str, tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(tensor).__name__}."
        )
    if not tensor.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype={tensor.dtype}; "
            f"convert it first, e.g. {name}.float()."
        )


def _check_flag(name: str, tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{name} must be a boolean torch.Tensor, got {type(tensor).__name__}."
        )
    if tensor.dtype is not torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor, got dtype={tensor.dtype}; "
            f"convert it first, e.g. {name}.bool() or ({name} != 0)."
        )


def _check_same_shape(extra: str = "", **tensors: torch.Tensor) -> None:
    first, *others = (t.shape for t in tensors.values())
    if all(shape == first for shape in others):
        return  # the common case, without building the message's pieces
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        described = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(SHAPE_ERR.format(extra=extra, shapes=described))


def _check_unit_interval(
    name: str, value: float | torch.Tensor, shape: torch.Size | None = None
) -> None:
    """Rejects discounts outside ``[0, 1]`` (or NaN), and shapes that do not
    broadcast to ``shape`` (when given)."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(
                f"{name} must be a float or a floating-point tensor, got dtype={value.dtype}."
            )
        try:
            broadcast = shape if shape is None else torch.broadcast_shapes(value.shape, shape)
        except RuntimeError:
            broadcast = None
        if broadcast != shape:
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to the data "
                f"shape {tuple(shape)}; pass a scalar or a tensor broadcastable to it."
            )
        # One fused reduction: NaN fails both comparisons, so it is caught too.
        if not bool(((value >= 0) & (value <= 1)).all()):
            raise ValueError(
                f"{name} must lie in [0, 1], got values in "
                f"[{value.min().item()}, {value.max().item()}]."
            )
        return
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a float or a tensor, got {value!r}.")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {name}={value}.")


def _check_positive(name: str, value: float | torch.Tensor) -> None:
    if isinstance(value, torch.Tensor):
        if not bool((value > 0).all()):
            raise ValueError(
                f"{name} must be > 0, got a tensor with minimum {value.min().item()}; "
                f"use a positive clipping threshold (1.0 is the IMPALA default)."
            )
        return
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a float or a tensor, got {value!r}.")
    if not value > 0:
        raise ValueError(
            f"{name} must be > 0, got {name}={value}; use a positive clipping "
            f"threshold (1.0 is the IMPALA default)."
        )


def _resolve_time_dim(time_dim: int, ndim: int) -> int:
    if isinstance(time_dim, bool) or not isinstance(time_dim, int):
        raise TypeError(f"time_dim must be an int, got {time_dim!r}.")
    if not -ndim <= time_dim < ndim:
        raise ValueError(
            f"time_dim={time_dim} is out of range for tensors with {ndim} dims; "
            f"use a value in [{-ndim}, {ndim - 1}]."
        )
    return time_dim % ndim


def _check_signals(
    value: torch.Tensor,
    next_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    **extra_floats: torch.Tensor,
) -> None:
    shape = getattr(value, "shape", None)
    if (
        all(
            isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == shape
            for t in (value, next_value, reward, *extra_floats.values())
        )
        and all(
            isinstance(t, torch.Tensor) and t.dtype is torch.bool and t.shape == shape
            for t in (done, terminated)
        )
    ):
        return  # all valid: skip building the per-argument error messages
    floats = {
        "state_value": value,
        "next_state_value": next_value,
        "reward": reward,
        **extra_floats,
    }
    for name, tensor in floats.items():
        _check_floating(name, tensor)
    _check_flag("done", done)
    _check_flag("terminated", terminated)
    extra = "".join(f", {name}" for name in extra_floats) if extra_floats else ""
    _check_same_shape(extra, **floats, done=done, terminated=terminated)
