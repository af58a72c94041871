"""Large storage writes and sample outputs with streaming (non-temporal) stores.

A storage write copies a batch into slots that will not be read again soon. Regular stores
first read each destination cache line, then write it back; streaming stores write whole
lines straight to memory. glibc's ``memmove`` (numpy's and torch's copies) switches to them
only above a threshold set from the cache size, 240 MB on this project's machine, so the
writes of a few to a few hundred megabytes a buffer makes use regular stores. Measured
there, copies into a 2.8 GB storage: 1.2-1.5x faster from 8 MB up (1.5x with the sources
out of cache too, as in a 1,000-frame extend), 1.1x at 2-4 MB; but 0.9x into a destination
already in cache, which a write of megabytes into a large storage rarely is.

A large sample's outputs are gathered the same way when their rows are long, eight rows at
a time interleaved by 128 bytes (the helper's ``gather``): one row at a time, a core keeps
one stream of reads in flight and stalls at every row start. Measured there (32 MiB L3),
samples of 84x84x4 frames and next frames from a 100,000-transition buffer, against
regular stores in the same process: 1.22x faster at batch 64 (two outputs of 1.7 MiB),
1.31x at 256, 1.66x at 1024 and 1.72x at 4096. Streaming row by row had been 5% slower
at batch 256 and 8-9% faster from 1024 on. Rows shorter than 16 KiB were not measured
with the interleaved gather (row by row they streamed 0.65-1.13x as fast), hence
:attr:`StreamingWrites.MIN_ROW_BYTES`; see benchmarks/README.md.

The copies come from the C helper ``torchrl_ext._stream``, built at install when a C
compiler is present; without it (or on CPUs without streaming stores) :attr:`StreamingWrites.available`
is ``False`` and every copy is numpy's, as it is with the fast paths off
(:mod:`torchrl_ext._fastpath`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from torchrl_ext._fastpath import fastpath_enabled
from torchrl_ext.storages._output_memory import _byte_count, _flag

try:
    from torchrl_ext import _stream
except ImportError:  # installed without a C compiler: numpy copies everywhere
    _stream = None

__all__ = ["StreamingWrites", "streaming_writes"]


class StreamingWrites:
    """Copies storage writes of ``min_bytes`` or more and gathers sample outputs of
    ``min_output_bytes`` or more with streaming stores.

    The storages copy each written slice through :meth:`copy` and gather large sample
    outputs through :meth:`gather`. Set ``enabled = False`` to copy everything with numpy
    (for instance for a storage small enough to stay in cache), or ``sample_outputs =
    False`` to keep streaming writes but leave sample outputs in cache for their reader.

    Args:
        min_bytes: smallest storage write copied with streaming stores (smaller ones gain
            little and may overwrite lines still in cache, where regular stores are faster).
        enabled: whether large copies and gathers stream, when :attr:`available`.
        sample_outputs: whether :meth:`gather` streams too (when ``enabled``).
        min_output_bytes: smallest output :meth:`gather` writes with streaming stores
            (smaller outputs are not recycled either; see
            :data:`~torchrl_ext.storages.output_recycler`).

    Examples:
        >>> import numpy as np
        >>> writes = StreamingWrites(min_bytes=64)
        >>> destination, source = np.zeros(1000, np.uint8), np.arange(1000).astype(np.uint8)
        >>> writes.copy(destination[10:510], source[:500])
        >>> bool((destination[10:510] == source[:500]).all())
        True
        >>> rows = np.array([3, 0, -1])
        >>> output = np.empty((3, 4), np.float32)
        >>> writes.gather(output, np.arange(40, dtype=np.float32).reshape(10, 4), rows)
        >>> output[:, 0].tolist()
        [12.0, 0.0, 36.0]
    """

    #: Shorter rows gather with numpy's ``take``: measured, streaming them was 0.65-1.13x as
    #: fast, and longer ones 1.05-1.11x.
    MIN_ROW_BYTES = 16384

    def __init__(self, *, min_bytes: int = 4 << 20, enabled: bool = True, sample_outputs: bool = True,
                 min_output_bytes: int = 1 << 20) -> None:
        self.min_bytes = min_bytes
        self.enabled = enabled
        self.sample_outputs = sample_outputs
        self.min_output_bytes = min_output_bytes

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
    def min_output_bytes(self) -> int:
        return self._min_output_bytes

    @min_output_bytes.setter
    def min_output_bytes(self, value: int) -> None:
        self._min_output_bytes = _byte_count(value, "min_output_bytes", low=1,
                                             fix="; set sample_outputs = False to gather with regular stores")

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = _flag(value, "enabled")

    @property
    def sample_outputs(self) -> bool:
        return self._sample_outputs

    @sample_outputs.setter
    def sample_outputs(self, value: bool) -> None:
        self._sample_outputs = _flag(value, "sample_outputs")

    def copy(self, destination: Any, source: Any) -> None:
        """``destination[...] = source``: with streaming stores when both are C-contiguous
        numpy arrays of the same shape and dtype, of ``min_bytes`` or more; otherwise
        numpy's or torch's assignment (broadcasting and casting as they do)."""
        if self._streams(destination, source, self._min_bytes) and destination.shape == source.shape:
            _stream.copy(destination, source)
        else:
            destination[...] = source

    def gather(self, destination: np.ndarray, source: np.ndarray, rows: np.ndarray) -> None:
        """``destination[...] = source[rows]``, rows along ``source``'s first dim (negative
        ones counted from the end): with streaming stores when :attr:`sample_outputs` is on,
        ``destination`` has ``min_output_bytes`` or more in rows of :attr:`MIN_ROW_BYTES` or
        more, and the arrays are C-contiguous with ``destination`` shaped
        ``(len(rows), *source.shape[1:])`` and int64 ``rows``; otherwise with numpy's ``take``.

        Raises:
            IndexError: a row outside ``[-len(source), len(source))`` (``destination`` is
                then left as it was).
        """
        if (self._sample_outputs and self._streams(destination, source, self._min_output_bytes)
                and rows.dtype == np.int64 and rows.ndim == 1 and rows.flags.c_contiguous
                and destination.shape == (rows.size, *source.shape[1:])
                and destination.nbytes >= rows.size * self.MIN_ROW_BYTES):
            _stream.gather(destination, source, rows)  # checks every row before copying any
            return
        high = source.shape[0]
        if rows.size and (rows.min() < -high or rows.max() >= high):
            raise IndexError(f"row index out of range for {high} rows (got rows in "
                             f"[{rows.min()}, {rows.max()}]).")
        # Checked above, so "wrap" only maps negative rows as "raise" would, and lets numpy
        # gather straight into ``destination`` ("raise" gathers into a buffer and copies it over).
        source.take(rows, axis=0, out=destination, mode="wrap")

    def _streams(self, destination: Any, source: Any, min_bytes: int) -> bool:
        """Whether the C helper can write ``destination`` from ``source``: streaming on, both
        C-contiguous numpy arrays of one dtype, ``destination`` writable and of ``min_bytes``
        or more (each method adds its own shape conditions)."""
        return (self._enabled and _stream is not None and fastpath_enabled() and type(destination) is np.ndarray
                and type(source) is np.ndarray and destination.nbytes >= min_bytes
                and destination.dtype == source.dtype and destination.flags.c_contiguous
                and source.flags.c_contiguous and destination.flags.writeable)


#: The storages' process-wide instance.
streaming_writes = StreamingWrites()
