"""Importing an example's ``train.py`` by path (``examples/`` is not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
CONF_DIR = EXAMPLES_DIR.parent / "conf"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_example(name: str) -> ModuleType:
    """``examples/<name>/train.py`` as a module, imported once per session."""
    module_name = f"{name}_train"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES_DIR / name / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
