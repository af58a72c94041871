"""Transparent huge page advice for large CPU tensors."""
from __future__ import annotations

import mmap
import sys
from pathlib import Path

import torch

from torchrl_ext._huge_pages import advise_huge_pages, empty_huge


def kernel_grants_on_request() -> bool:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not (sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE") and setting.exists()):
        return False
    return "[never]" not in setting.read_text()


def test_large_cpu_tensors_are_advised_and_keep_their_contents():
    tensor = empty_huge((3 << 20,), dtype=torch.float32, device=torch.device("cpu"))  # 12 MiB
    assert tensor.shape == (3 << 20,) and tensor.dtype == torch.float32
    assert advise_huge_pages(tensor) is kernel_grants_on_request()
    tensor.fill_(1.5)
    assert advise_huge_pages(tensor) is kernel_grants_on_request()  # advice never touches data
    assert bool((tensor == 1.5).all())


def test_small_and_non_cpu_tensors_are_left_alone():
    assert advise_huge_pages(torch.empty(1000)) is False  # less than two huge pages
    assert advise_huge_pages(torch.empty(4 << 20, device="meta")) is False
