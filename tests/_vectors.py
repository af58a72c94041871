"""The one place that opens the original libraries' reference vectors.

They live in ``tests/data/vectors`` (see the README there: which library and commit
produced each file, and what its keys mean), so the suite needs nothing outside this
repository. A missing file fails the test that needs it: the vectors are the independent
reference, so they are never skipped.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

VECTORS_DIR = Path(__file__).resolve().parent / "data" / "vectors"


def vectors_path(name: str = "") -> Path:
    """Path of ``tests/data/vectors/<name>``; fails the calling test if it is missing."""
    path = VECTORS_DIR / name
    if not path.exists():
        pytest.fail(f"reference vector file missing from the repository: {path}")
    return path


@functools.lru_cache(maxsize=None)
def load_npz(name: str) -> dict[str, np.ndarray]:
    """Arrays of ``tests/data/vectors/<name>``, loaded once per session."""
    with np.load(vectors_path(name)) as data:
        return {key: data[key] for key in data.files}
