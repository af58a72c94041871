"""Argument checks shared across components (errors name the argument, the value and the bound)."""
from __future__ import annotations

from typing import Any

__all__ = ["check_batch_size", "check_int"]


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """``value`` must be an int (not a bool) ``>= minimum``; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}.")


def check_batch_size(batch_size: Any) -> None:
    """A sampler's ``batch_size``: a positive int; ``ValueError`` otherwise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got batch_size={batch_size!r}.")
