"""Nested TensorDict keys as constructors receive them (from code or from Hydra configs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["nested_key", "next_key"]


def nested_key(key: Any, name: str) -> str | tuple[str, ...]:
    """``key`` as a TensorDict key: a str, or a tuple of str.

    Hydra hands tuple defaults over as lists (``ListConfig``); those become
    tuples here, so every component accepts keys written in YAML.

    Raises:
        TypeError: naming the argument ``name`` when ``key`` is neither.
    """
    if isinstance(key, str):
        return key
    if isinstance(key, Sequence) and len(key) > 0 and all(isinstance(part, str) for part in key):
        return tuple(key) if len(key) > 1 else key[0]
    raise TypeError(
        f"{name} must be a key: a str or a tuple of str such as ('next', 'reward'), "
        f"got {name}={key!r}."
    )


def next_key(key: Any) -> tuple[str, ...]:
    """``("next", *key)``: where a step keeps ``key`` of the following step."""
    return ("next", *key) if isinstance(key, tuple) else ("next", key)
