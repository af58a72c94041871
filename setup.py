"""Builds the optional C helper ``torchrl_ext._stream`` (streaming copies for large storage
writes). Everything else is declared in pyproject.toml. Without a C compiler the build skips
the helper (``optional=True``) and torchrl_ext copies with numpy instead."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("torchrl_ext._stream", ["torchrl_ext/_stream.c"], optional=True)])
