"""The one switch for torchrl_ext's fast paths.

A fast path is an optimisation that is not plain torch or numpy: the buffer's one-layer
``extend`` and ``sample`` around TorchRL's layers, and the rings' one-slot step writes. Each gives the same result as
the plain code it skips; turning the switch off runs the plain code everywhere, so a result
that differs between the two settings is a bug (CI runs the whole test suite both ways).
``docs/architecture.md`` lists each fast path and what it buys, measured.

Turn them off for a process with the environment variable ``TORCHRL_EXT_FASTPATH=0``
(read at import), or from Python with :func:`set_fastpath` or the :func:`fastpath`
context manager.

Examples:
    >>> import torchrl_ext
    >>> with torchrl_ext.fastpath(False):
    ...     torchrl_ext.fastpath_enabled()
    False
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from torchrl_ext._checks import check_bool

__all__ = ["ENV_VAR", "fastpath", "fastpath_enabled", "set_fastpath"]

#: The environment variable read at import: ``0`` / ``false`` / ``off`` turn the fast paths off.
ENV_VAR = "TORCHRL_EXT_FASTPATH"
_ON = ("", "1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def _from_environment() -> bool:
    value = os.environ.get(ENV_VAR, "1").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(
        f"{ENV_VAR} must be 0 or 1, got {ENV_VAR}={os.environ[ENV_VAR]!r}; "
        f"set it to 0 to run without the fast paths, or unset it."
    )


_enabled = _from_environment()


def fastpath_enabled() -> bool:
    """Whether the fast paths are on (the default)."""
    return _enabled


def set_fastpath(enabled: bool) -> None:
    """Turns every fast path on or off for the whole process.

    Args:
        enabled: ``True`` for the fast paths, ``False`` for plain torch/numpy everywhere.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    global _enabled
    _enabled = check_bool("enabled", enabled)


@contextlib.contextmanager
def fastpath(enabled: bool) -> Iterator[None]:
    """Runs the ``with`` block with the fast paths on or off, then restores the setting.

    Args:
        enabled: the setting inside the block.
    """
    previous = _enabled
    set_fastpath(enabled)
    try:
        yield
    finally:
        set_fastpath(previous)
