"""Large storage writes with streaming (non-temporal) stores.

A storage write copies a batch into slots that will not be read again soon. Regular stores
first read each destination cache line, then write it back; streaming stores write whole
lines straight to memory. glibc's ``memmove`` (numpy's and torch's copies) switches to them
only above a threshold set from the cache size, 240 MB on this project's machine, so the
writes of a few to a few hundred megabytes a buffer makes use regular stores. Measured
there, copies into a 2.8 GB storage: 1.2-1.5x faster from 8 MB up (1.5x with the sources
out of cache too, as in a 1,000-frame extend), 1.1x at 2-4 MB; but 0.9x into a destination
already in cache, which a write of megabytes into a large storage rarely is.

The copies come from the C helper ``torchrl_ext._stream``, built at install when a C
compiler is present; without it (or on CPUs without streaming stores) :attr:`StreamingWrites.available`
is ``False`` and every copy is numpy's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from torchrl_ext.storages._output_memory import _byte_count

try:
    from torchrl_ext import _stream
except ImportError:  # installed without a C compiler: numpy copies everywhere
    _stream = None

__all__ = ["StreamingWrites", "streaming_writes"]


class StreamingWrites:
    """Copies storage writes of ``min_bytes`` or more with streaming stores.

    The storages copy each written slice through :meth:`copy`. Set ``enabled = False`` to
    copy everything with numpy (for instance for a storage small enough to stay in cache).

    Args:
        min_bytes: smallest copy written with streaming stores (smaller ones gain little
            and may overwrite lines still in cache, where regular stores are faster).
        enabled: whether copies of ``min_bytes`` or more stream, when :attr:`available`.

    Examples:
        >>> import numpy as np
        >>> writes = StreamingWrites(min_bytes=64)
        >>> destination, source = np.zeros(1000, np.uint8), np.arange(1000).astype(np.uint8)
        >>> writes.copy(destination[10:510], source[:500])
        >>> bool((destination[10:510] == source[:500]).all())
        True
    """

    def __init__(self, *, min_bytes: int = 4 << 20, enabled: bool = True) -> None:
        self.min_bytes = min_bytes
        self.enabled = enabled

    @property
    def available(self) -> bool:
        """Whether this install has the C helper and the CPU streaming stores."""
        return _stream is not None and bool(_stream.STREAMING)

    @property
    def min_bytes(self) -> int:
        return self._min_bytes

    @min_bytes.setter
    def min_bytes(self, value: int) -> None:
        self._min_bytes = _byte_count(value, "min_bytes", low=1, fix="; set enabled = False to turn streaming off")

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"enabled must be a bool, got {type(value).__name__} ({value!r}).")
        self._enabled = bool(value)

    def copy(self, destination: Any, source: Any) -> None:
        """``destination[...] = source``: with streaming stores when both are C-contiguous
        numpy arrays of the same shape and dtype, of ``min_bytes`` or more; otherwise
        numpy's or torch's assignment (broadcasting and casting as they do)."""
        if (self._enabled and _stream is not None and type(destination) is np.ndarray
                and type(source) is np.ndarray and destination.nbytes >= self._min_bytes
                and destination.shape == source.shape and destination.dtype == source.dtype
                and destination.flags.c_contiguous and source.flags.c_contiguous
                and destination.flags.writeable):
            _stream.copy(destination, source)
        else:
            destination[...] = source


#: The storages' process-wide instance.
streaming_writes = StreamingWrites()
