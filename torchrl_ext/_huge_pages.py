"""Transparent huge pages for the storages' large CPU tensors.

A replay buffer's leaves span gigabytes that every write and every sample
touches at random places. With 4 KiB pages each 28 KB frame crosses seven
pages, and each page costs a TLB walk (two-level under virtualisation); with
2 MiB pages those walks nearly vanish. Kernels in ``madvise`` mode (a common
default) grant huge pages only to memory that asks for them before it is first
touched, which numpy does for its large arrays and torch does not. Measured on
this project's machine: slice writes of 1,000 frames 7% faster, 256-frame
gathers 7% faster, the margin by which cpprb (numpy arrays) led.
"""
from __future__ import annotations

import ctypes
import mmap
import sys

import torch

_HUGE = 2 << 20  # the x86-64 / arm64 transparent huge page size
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_libc = None


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Asks the kernel for transparent huge pages under ``tensor``'s memory.

    Call it before the memory is first written (``torch.empty``, not ``zeros``):
    pages already in place stay as they are. Only CPU tensors of at least two
    huge pages are advised (the 2 MiB-aligned part of them); elsewhere (other
    systems, devices, file-backed memory) nothing happens.

    Returns:
        Whether the kernel accepted the advice.

    Examples:
        >>> import torch
        >>> advise_huge_pages(torch.empty(10))  # too small: nothing to advise
        False
    """
    global _libc
    if _MADV_HUGEPAGE is None or not sys.platform.startswith("linux") or not tensor.is_cpu:
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
    if last - first < _HUGE:
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):  # no C library with madvise: no advice
            _libc = False
    return bool(_libc) and _libc.madvise(first, last - first, _MADV_HUGEPAGE) == 0


def empty_huge(shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty`` whose memory, on the CPU, is advised for huge pages (untouched yet)."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    advise_huge_pages(tensor)
    return tensor
