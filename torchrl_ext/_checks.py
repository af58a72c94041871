"""Argument checks shared across components (errors name the argument, the value and the bound)."""
from __future__ import annotations

import math
from typing import Any

import torch

from torchrl_ext._host import bounds

__all__ = ["check_batch_size", "check_finite", "check_int", "check_priorities", "check_real"]


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """``value`` must be an int (not a bool) ``>= minimum``; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}.")


def check_batch_size(batch_size: Any) -> None:
    """A sampler's ``batch_size``: a positive int; ``ValueError`` otherwise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got batch_size={batch_size!r}.")


def check_real(name: str, value: Any, *, low: float, high: float | None = None) -> float:
    """``value`` (a number or a one-element tensor) as a finite float in ``[low, high]``;
    ``TypeError`` / ``ValueError`` otherwise (NaN and infinities are refused: they turn
    priorities, weights and discounts into NaN later, far from the call that set them)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}.")
    value = float(value)
    if math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {name}={value}.")
    if math.isnan(value) or value < low or (high is not None and value > high):
        interval = f"a number in [{low:g}, {high:g}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {interval}, got {name}={value}.")
    return value


def check_finite(name: str, values: torch.Tensor, then: str) -> None:
    """``ValueError`` naming ``name`` and counting the NaN / infinite entries of ``values``;
    ``then`` says what was left unchanged and how to fix it."""
    bad = int((~torch.isfinite(values)).sum())
    if bad:
        raise ValueError(f"`{name}` holds {bad} NaN or infinite value(s) of {values.numel()}; {then}")


def check_priorities(name: str, values: torch.Tensor) -> float:
    """The largest of the non-empty ``values``; ``ValueError`` unless every one is finite and ``>= 0``."""
    low, high = bounds(values)
    if not (math.isfinite(low) and math.isfinite(high)) or low < 0:
        raise ValueError(
            f"{name} must be finite and >= 0, got values in [{low}, {high}]; "
            "use e.g. td_error.abs() and replace NaN/inf before updating."
        )
    return high
