"""Sphinx configuration of torchrl_ext's documentation: the API reference (autodoc + napoleon over
the Google-style docstrings) and the user guides, which are the repository's Markdown files
rendered in place (``_ext/markdown_include.py``). Build with ``make docs``."""
from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "torchrl_ext"
author = "torchrl_ext contributors"
release = _version("torchrl_ext")
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "markdown_include"]
exclude_patterns = ["_build", "img"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Members a subclass inherits from TorchRL are documented by TorchRL.
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Classes are re-exported by their package; the reference documents them there once.
suppress_warnings = ["ref.python"]
nitpicky = False
