"""Every buffer family fed float64 or bfloat16 data (numpy has no bfloat16, so the numpy write and
gather paths step aside): the same data with the fast paths on or off, every written float kept in
its dtype, and where a family stores what it is given, the values of the float32 run."""
from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

import torchrl_ext

from tests._buffer_runs import ROUNDS, RUNS, RewrittenWrites, assert_same

# Families that compute floats in the data's dtype (n-step returns, advantages), where float64 or
# bfloat16 arithmetic rounds differently from float32: compared with the fast paths on and off only.
COMPUTES = ("nstep", "on-policy", "path-gae", "harl-fp")


def _whole_run(case: str, dtype: torch.dtype, fast: bool) -> list[TensorDict]:
    torch.manual_seed(0)
    with torchrl_ext.fastpath(fast):
        run = RUNS[case]()
        if dtype is not torch.float32:
            run.buffer = RewrittenWrites(run.buffer, lambda data: data.apply(
                lambda t: t.to(dtype) if t.is_floating_point() else t))
        return [run.run(k) for k in range(ROUNDS)]


@functools.lru_cache(maxsize=None)  # one float32 run per case and worker, read only
def _float32_run(case: str) -> list[TensorDict]:
    return _whole_run(case, torch.float32, fast=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", RUNS)
def test_every_buffer_family_keeps_the_dtype_it_is_given(case: str, dtype: torch.dtype) -> None:
    got = _whole_run(case, dtype, fast=True)
    assert_same(got, _whole_run(case, dtype, fast=False))
    float32 = _float32_run(case)
    compares_values = not any(word in case for word in COMPUTES)
    for rounds, (seen, want) in enumerate(zip(got, float32)):
        for key in want.keys(True, True):
            if not want[key].is_floating_point():
                continue
            where = f"round {rounds}, {key}"
            # Sampler outputs (importance weights) keep their own dtype; data leaves take the data's.
            assert seen[key].dtype in (dtype, want[key].dtype), where
            if compares_values and seen[key].dtype == dtype:
                assert torch.equal(seen[key], want[key].to(dtype)), where
