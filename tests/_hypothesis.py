"""Shared hypothesis settings for the model-based (stateful) tests.

CI runs a bounded number of examples; ``TORCHRL_EXT_SOAK=<n>`` raises
``max_examples`` to ``n`` for long soak runs (e.g. ``TORCHRL_EXT_SOAK=2000``).
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import precondition, rule

__all__ = ["MAX_EXAMPLES", "SOAK", "FileRoundTrip", "StateDictRoundTrip", "machine_settings"]


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


class StateDictRoundTrip:
    """Checkpoint rule of the buffer state machines: ``self.rb`` is replaced by a fresh buffer
    (``self._new_buffer()``) restored from its ``state_dict``, and the run goes on with it.

    Machines that keep a snapshot compare it in ``_check_restored(old)``.
    """

    rb: Any

    def _new_buffer(self) -> Any:
        raise NotImplementedError

    def _check_restored(self, old: Any) -> None:
        """Hook: the restored ``self.rb`` against the buffer it replaced (nothing by default)."""

    @rule()
    def round_trip_state_dict(self) -> None:
        fresh = self._new_buffer()
        fresh.load_state_dict(self.rb.state_dict())
        old, self.rb = self.rb, fresh
        self._check_restored(old)


class FileRoundTrip(StateDictRoundTrip):
    """:class:`StateDictRoundTrip` plus the same through ``dumps`` / ``loads`` of a folder."""

    @precondition(lambda self: self.rb.storage.initialized)  # TorchRL refuses to save an unused storage
    @rule()
    def round_trip_files(self) -> None:
        with tempfile.TemporaryDirectory() as path:
            self.rb.dumps(path)
            fresh = self._new_buffer()
            fresh.loads(path)
        old, self.rb = self.rb, fresh
        self._check_restored(old)
