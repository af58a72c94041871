"""Nested TensorDict keys as constructors receive them (from code or from Hydra configs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase, unravel_key

__all__ = ["has_leaf", "nested_key", "next_key"]


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


def has_leaf(data: TensorDictBase, key: Any) -> bool:
    """Whether ``data`` holds a leaf (not a sub-TensorDict) under the nested ``key``.

    The keys are listed: ``key in data.keys(True, True)`` misses the nested leaves of a lazy
    stack and takes a one-part key of a sub-TensorDict for a leaf (tensordict 0.14).

    Examples:
        >>> import torch
        >>> from tensordict import LazyStackedTensorDict, TensorDict
        >>> td = TensorDict({"next": {"reward": torch.zeros(2, 1)}}, [2])
        >>> has_leaf(LazyStackedTensorDict.lazy_stack(list(td.unbind(0))), ("next", "reward"))
        True
    """
    return unravel_key(key) in set(data.keys(True, True))
