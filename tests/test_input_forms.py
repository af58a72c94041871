"""Every buffer family written the same data in other forms: non-contiguous leaves, leaves
that require grad, a lazy stack of rows, shared or memory-mapped memory, a locked TensorDict.
Each stores and draws exactly what the plain data gives, with the fast paths on or off (the
numpy paths cannot view some of these forms)."""
from __future__ import annotations

import functools
from typing import Callable

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

import torchrl_ext

from tests._buffer_runs import ROUNDS, RUNS, RewrittenWrites, assert_same

def _strided(data: TensorDict) -> TensorDict:
    return data.apply(lambda t: torch.stack([t, t], -1)[..., 1])  # same values, every stride doubled


def _requiring_grad(data: TensorDict) -> TensorDict:
    return data.apply(lambda t: t.clone().requires_grad_() if t.is_floating_point() else t)


def _lazy_stack(data: TensorDict) -> TensorDict:
    return LazyStackedTensorDict.lazy_stack(list(data.unbind(0)), 0) if data.batch_dims else data


FORMS: dict[str, Callable[[TensorDict], TensorDict]] = {
    "strided": _strided,
    "requires-grad": _requiring_grad,
    "lazy-stack": _lazy_stack,
    "shared": lambda data: data.clone().share_memory_(),  # as multiprocess collectors hand it over
    "memmap": lambda data: data.clone().memmap_(),  # read from disk
    "locked": lambda data: data.clone().lock_(),
}


def _whole_run(case: str, form: str | None, fast: bool) -> list[TensorDict]:
    torch.manual_seed(0)
    with torchrl_ext.fastpath(fast):
        run = RUNS[case]()
        if form is not None:
            run.buffer = RewrittenWrites(run.buffer, FORMS[form])
        return [run.run(k).apply(lambda t: t.detach()) for k in range(ROUNDS)]


@functools.lru_cache(maxsize=None)  # one plain run per case and worker, read only
def _plain_run(case: str) -> list[TensorDict]:
    return _whole_run(case, None, fast=True)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", RUNS)
def test_every_buffer_family_takes_data_in_any_form(case: str, form: str) -> None:
    want = _plain_run(case)
    assert_same(_whole_run(case, form, fast=True), want)
    assert_same(_whole_run(case, form, fast=False), want)
