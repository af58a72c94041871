"""Shared hypothesis settings for the model-based (stateful) tests.

CI runs a bounded number of examples; ``TORCHRL_EXT_SOAK=<n>`` raises
``max_examples`` to ``n`` for long soak runs (e.g. ``TORCHRL_EXT_SOAK=2000``).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["MAX_EXAMPLES", "SOAK", "machine_settings"]


def _soak() -> int | None:
    value = os.environ.get("TORCHRL_EXT_SOAK", "").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError as error:
        raise ValueError(f"TORCHRL_EXT_SOAK must be an int, got {value!r}.") from error
    if n < 1:
        raise ValueError(f"TORCHRL_EXT_SOAK must be >= 1, got {n}.")
    return n


SOAK = _soak()
MAX_EXAMPLES = 25


def machine_settings(max_examples: int = MAX_EXAMPLES, step_count: int = 30) -> settings:
    """Settings of a ``RuleBasedStateMachine.TestCase``: bounded in CI, ``TORCHRL_EXT_SOAK`` in soak runs."""
    return settings(
        max_examples=SOAK if SOAK is not None else max_examples,
        stateful_step_count=step_count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        derandomize=False,
    )
