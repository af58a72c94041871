"""Memory for large sample outputs, kept from one sample to the next of the same size.

A sample's outputs of a megabyte or more come from fresh mmaps or the top of malloc's heap.
Whether glibc keeps that memory once the outputs are freed depends on the process's
allocation history (its adaptive mmap and trim thresholds); where it does not, the next
sample faults every page back in. Measured on this project's machine, one process: a
sample(256) of 84x84x4 frames and next frames (14.5 MB) took 3.5 ms into fresh arrays
(numpy's and torch's alike, 940 page faults per call) against 1.05 ms into memory already
in place. The recycler hands out numpy arrays and takes a block back only once its array is
gone, which is when the last tensor or view reading it is: an output is never written again
while anything can still read it.

Outputs that will be copied to an accelerator can instead come from page-locked (pinned)
host memory (:class:`PinnedOutputs`): TorchRL's ``ReplayBuffer(pin_memory=True)`` calls
``pin_memory()`` on every sample, which copies each leaf once more unless it is pinned
already.
"""
from __future__ import annotations

import collections
import math
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch

from torchrl_ext._fastpath import fastpath_enabled

__all__ = ["OutputRecycler", "PinnedOutputs", "can_pin_memory", "output_recycler", "pinned_empty"]


class OutputRecycler:
    """Recycles the memory of large sample outputs once nothing refers to them.

    The storages gather outputs of ``min_bytes`` or more on the CPU into arrays from
    :meth:`empty`. When such an array is freed (with every tensor, view or TensorDict
    that holds it), its block waits for the next output of the same byte size, unless
    the free blocks would then exceed ``max_free_bytes``. Set ``max_free_bytes = 0`` to
    allocate every output afresh; :meth:`clear` frees the waiting blocks.

    Args:
        min_bytes: smallest output recycled (smaller ones come from the allocator's
            reused heap already).
        max_free_bytes: most bytes kept in free blocks.

    Examples:
        >>> import numpy as np
        >>> import torchrl_ext
        >>> recycler = OutputRecycler(min_bytes=1024)
        >>> with torchrl_ext.fastpath(True):  # recycling is a fast path
        ...     first = recycler.empty((4, 256), np.float32)
        ...     address = first.ctypes.data
        ...     del first  # nothing reads the block any more
        ...     recycler.empty((8, 128), np.float32).ctypes.data == address  # same byte size
        True
        >>> recycler.info()["hits"], recycler.info()["misses"]
        (1, 1)
    """

    def __init__(self, *, min_bytes: int = 1 << 20, max_free_bytes: int = 1 << 30) -> None:
        self.min_bytes = min_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._free_bytes = 0
        self._leases: dict[int, tuple[weakref.ref, np.ndarray]] = {}
        # Blocks whose outputs were freed, not yet filed. The weakref callback only appends
        # here and never takes the lock: garbage collection can free an output (and run the
        # callback) inside any allocation, including one made while the lock is held.
        self._returned: collections.deque[np.ndarray] = collections.deque()
        self._lock = threading.Lock()
        self._hits = self._misses = 0
        self.max_free_bytes = max_free_bytes

    @property
    def min_bytes(self) -> int:
        return self._min_bytes

    @min_bytes.setter
    def min_bytes(self, value: int) -> None:
        self._min_bytes = _byte_count(value, "min_bytes", low=1)

    @property
    def max_free_bytes(self) -> int:
        return self._max_free_bytes

    @max_free_bytes.setter
    def max_free_bytes(self, value: int) -> None:
        self._max_free_bytes = _byte_count(value, "max_free_bytes", low=0)
        with self._lock:
            self._file_returned()
            self._trim(self._max_free_bytes)

    def recycles(self, nbytes: int) -> bool:
        """Whether an output of ``nbytes`` comes from :meth:`empty`'s recycled blocks."""
        return nbytes >= self._min_bytes and self._max_free_bytes > 0 and fastpath_enabled()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """``np.empty(shape, dtype)``, from a free block of the same byte size if one waits.

        Outputs below ``min_bytes`` (or with recycling off) are plain ``np.empty``.
        """
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.recycles(nbytes):
            return np.empty(shape, dtype)
        with self._lock:
            self._file_returned()
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is None:
                self._misses += 1
            else:
                self._hits += 1
                self._free_bytes -= nbytes
        if block is None:
            # torch's allocator, not numpy's: numpy asks for huge pages on arrays of 4 MiB
            # or more, and gathers into such blocks ran 35% slower (0.99 against 0.73-0.75 ms
            # for a sample(256) of 84x84x4 frames) in the storage benchmark's process.
            block = torch.empty(nbytes, dtype=torch.uint8).numpy()
        array = block.view(dtype).reshape(shape)
        lease = weakref.ref(array, self._give_back)
        self._leases[id(lease)] = (lease, block)
        return array

    def _give_back(self, lease: weakref.ref) -> None:
        # A weakref callback: it may run inside any allocation, under the lock too, so it
        # takes no lock (dict.pop and deque.append are atomic) and runs no other code.
        entry = self._leases.pop(id(lease), None)
        if entry is not None:
            self._returned.append(entry[1])

    def _file_returned(self) -> None:
        # Callers hold the lock. Files the given-back blocks as free ones, within max_free_bytes.
        returned = self._returned
        while returned:
            block = returned.popleft()
            if self._free_bytes + block.nbytes <= self._max_free_bytes:
                self._free.setdefault(block.nbytes, []).append(block)
                self._free_bytes += block.nbytes

    def clear(self) -> None:
        """Frees every waiting block (outputs still in use are not affected)."""
        with self._lock:
            self._file_returned()
            self._trim(0)

    def info(self) -> dict[str, int]:
        """``hits`` and ``misses`` of :meth:`empty` so far, bytes in ``free`` blocks,
        and outputs ``in_use``."""
        with self._lock:
            self._file_returned()
            hits, misses, free_bytes = self._hits, self._misses, self._free_bytes
        return {"hits": hits, "misses": misses, "free_bytes": free_bytes, "in_use": len(self._leases)}

    def _trim(self, limit: int) -> None:
        # Callers hold the lock. Largest blocks go first: they cost the most to keep.
        for nbytes in sorted(self._free, reverse=True):
            blocks = self._free[nbytes]
            while blocks and self._free_bytes > limit:
                blocks.pop()
                self._free_bytes -= nbytes
            if not blocks:
                del self._free[nbytes]

    def _after_fork(self) -> None:
        # A fork taken while another thread held the lock would leave it held forever.
        self._lock = threading.Lock()


def can_pin_memory() -> bool:
    """Whether this process can page-lock host memory (it takes an accelerator: CUDA, ...)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, pin_memory=True)``. Torch's caching host allocator
    keeps freed pinned blocks for the next request, so samples do not page-lock afresh."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


class PinnedOutputs:
    """Mixin for storages whose reads can gather into page-locked (pinned) host memory.

    With :attr:`pin_outputs` on, a read of a CPU storage returns leaves in pinned memory, so
    ``pin_memory()`` on the sample (which TorchRL's ``ReplayBuffer(pin_memory=True)`` calls
    on every sample) finds them pinned and copies nothing, and
    ``sample.to("cuda", non_blocking=True)`` can overlap the transfer with compute.
    Attaching the storage to a buffer built with ``pin_memory=True`` turns it on when an
    accelerator is present (without one, page-locking is impossible and TorchRL's own
    ``pin_memory()`` call fails as it always has).

    Examples:
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from torchrl_ext.storages import FastTensorStorage
        >>> storage = FastTensorStorage(100)
        >>> rb = TensorDictReplayBuffer(storage=storage, pin_memory=True)
        >>> storage.pin_outputs == can_pin_memory()  # on wherever memory can be page-locked
        True
    """

    _pin_outputs = False

    @property
    def pin_outputs(self) -> bool:
        """Whether reads gather into pinned host memory (see the class docstring)."""
        return self._pin_outputs

    @pin_outputs.setter
    def pin_outputs(self, value: bool) -> None:
        value = _flag(value, "pin_outputs")
        if value and not can_pin_memory():
            raise ValueError(
                "pin_outputs=True needs an accelerator to page-lock host memory, and "
                "torch.accelerator.is_available() is False here; leave pin_outputs=False on a "
                "CPU-only machine."
            )
        self._pin_outputs = value

    def attach(self, buffer: Any) -> None:
        super().attach(buffer)  # type: ignore[misc]
        # TorchRL keeps the buffer's pin_memory argument as _pin_memory (set before it attaches).
        if getattr(buffer, "_pin_memory", False) and can_pin_memory():
            self._pin_outputs = True


def _flag(value: Any, name: str) -> bool:
    """``value`` as a bool; ``TypeError`` naming ``name`` for anything but a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r}).")
    return bool(value)


def _byte_count(value: Any, name: str, *, low: int, fix: str = "") -> int:
    """``value`` as an int number of bytes of at least ``low``; ``fix`` ends the ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int number of bytes, got {name}={value!r}.")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {name}={value}{fix}.")
    return int(value)


#: The recycler the storages' gathers use (see :class:`OutputRecycler`).
output_recycler = OutputRecycler()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=output_recycler._after_fork)
