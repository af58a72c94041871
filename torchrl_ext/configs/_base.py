"""Pieces every config module shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


class Validated:
    """TorchRL's config base declares an abstract ``__post_init__``; the components
    validate their own arguments when instantiated, so there is nothing to check here."""

    def __post_init__(self) -> None:
        return


@dataclass
class RecordedReturns:
    """Arguments shared by the storages that record episodic returns."""

    record_episodic_return: bool = False
    gamma: float = 0.99
    reward_clip: Optional[Any] = None
    default_return: float = -1000.0
    discount_key: Any = "discount"
    reward_key: Any = "reward"
