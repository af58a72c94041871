"""Page-locked (pinned) host memory for sample outputs that will be copied to an accelerator."""
from __future__ import annotations

from typing import Any

import torch

from torchrl_ext import _compat
from torchrl_ext._checks import check_bool

__all__ = ["PinnedOutputs", "can_pin_memory", "pinned_empty"]


def can_pin_memory() -> bool:
    """Whether this process can page-lock host memory (it takes an accelerator: CUDA, ...)."""
    return bool(torch.accelerator.is_available())


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, pin_memory=True)``. Torch's caching host allocator
    keeps freed pinned blocks for the next request, so samples do not page-lock afresh."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


class PinnedOutputs:
    """Mixin for storages whose reads can gather into page-locked (pinned) host memory.

    With :attr:`pin_outputs` on, a read of a CPU storage returns leaves in pinned memory, so
    ``pin_memory()``, which TorchRL's ``ReplayBuffer(pin_memory=True)`` calls on every sample,
    copies nothing, and ``sample.to("cuda", non_blocking=True)`` can overlap the transfer with compute.
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
        value = check_bool("pin_outputs", value)
        if value and not can_pin_memory():
            raise ValueError(
                "pin_outputs=True needs an accelerator to page-lock host memory, and "
                "torch.accelerator.is_available() is False here; leave pin_outputs=False on a "
                "CPU-only machine."
            )
        self._pin_outputs = value

    def attach(self, buffer: Any) -> None:
        super().attach(buffer)  # type: ignore[misc]
        if _compat.pins_memory(buffer) and can_pin_memory():
            self._pin_outputs = True
