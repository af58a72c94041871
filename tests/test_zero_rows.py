"""Every buffer family written an empty batch before each real write (a collector step where no
env was ready, a filter that kept nothing): the empty write changes nothing, with the fast paths
on or off, and the run goes on exactly as without it."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from tensordict import TensorDict

import torchrl_ext

from tests._buffer_runs import ROUNDS, RUNS, RewrittenWrites, assert_same


class EmptyWritesFirst(RewrittenWrites):
    """``buffer`` whose ``extend`` and ``store`` first write the batch's first zero rows
    (with the matching zero env ids), and keep what those empty writes returned."""

    WRITES = ("extend", "store")

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer, form=lambda data: data)
        self.__dict__["empty_writes"] = []

    def write(self, write: Callable[..., Any], data: TensorDict, *args: Any, **kwargs: Any) -> Any:
        empty_kwargs = dict(kwargs)
        if getattr(self.buffer, "dim_extend", 0) == 1:  # [envs, steps] into a 2-D storage
            empty = data[:, :0]
        else:
            empty = data[:0]
            if isinstance(kwargs.get("env_ids"), torch.Tensor):
                empty_kwargs["env_ids"] = kwargs["env_ids"][:0]
        self.empty_writes.append(write(empty, *args, **empty_kwargs))
        return write(data, *args, **kwargs)


def _whole_run(case: str, empty_first: bool, fast: bool) -> tuple[list[TensorDict], list[Any]]:
    torch.manual_seed(0)
    with torchrl_ext.fastpath(fast):
        run = RUNS[case]()
        if empty_first:
            run.buffer = EmptyWritesFirst(run.buffer)
        rounds = [run.run(k) for k in range(ROUNDS)]
        return rounds, run.buffer.empty_writes if empty_first else []


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("case", RUNS)
def test_an_empty_write_changes_nothing(case: str, fast: bool) -> None:
    got, empty_writes = _whole_run(case, empty_first=True, fast=fast)
    assert_same(got, _whole_run(case, empty_first=False, fast=fast)[0])
    for index in empty_writes:  # what a write returns: no row written
        assert index is None or (isinstance(index, torch.Tensor) and index.numel() == 0), index
