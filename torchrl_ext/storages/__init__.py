"""Storages: they hold the data and gather it by index; they never decide order."""
from torchrl_ext.storages.fast import FastMemmapStorage, FastTensorStorage, gather_rows

__all__ = ["FastMemmapStorage", "FastTensorStorage", "gather_rows"]
