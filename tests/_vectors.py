"""The one place that finds the original libraries' reference vectors.

``shared/`` sits beside the repository checkout, on a developer machine and in a
CI clone alike. A missing folder or file fails the test that needs it: the
vectors are the independent reference, so they are never skipped.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

VECTORS_DIR = Path(__file__).resolve().parents[2] / "shared" / "vectors"


def vectors_path(name: str = "") -> Path:
    """Path of ``shared/vectors/<name>``; fails the calling test if it is missing."""
    if not VECTORS_DIR.is_dir():
        pytest.fail(
            f"reference vectors folder not found: {VECTORS_DIR}. The shared/ folder "
            "(with shared/vectors) must sit beside the repository checkout."
        )
    path = VECTORS_DIR / name
    if name and not path.exists():
        pytest.fail(f"reference vector file missing: {path}")
    return path


@functools.lru_cache(maxsize=None)
def load_npz(name: str) -> dict[str, np.ndarray]:
    """Arrays of ``shared/vectors/<name>``, loaded once per session."""
    with np.load(vectors_path(name)) as data:
        return {key: data[key] for key in data.files}
