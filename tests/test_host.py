"""Host-side numbers from small tensors: numpy on the CPU, torch elsewhere, same answers."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl_ext._host import NUMPY_DTYPES, bounds, last, numpy_view, smallest


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_numbers_equal_torch_reductions(dtype, data):
    n = data.draw(st.integers(1, 300))
    high = 250 if dtype is torch.uint8 else 10_000
    values = torch.tensor(data.draw(st.lists(st.integers(0 if dtype is torch.uint8 else -high, high),
                                             min_size=n, max_size=n)), dtype=dtype)
    assert numpy_view(values) is not None
    low, top = torch.aminmax(values)
    assert bounds(values) == (low.item(), top.item())
    assert smallest(values) == low.item()
    assert last(values) == values[-1].item()
    assert type(bounds(values)[0]) is type(low.item())


@pytest.mark.parametrize("make", [
    lambda: torch.tensor([2.0, -1.0, 3.0], requires_grad=True),  # autograd history: torch path
    lambda: torch.tensor([2.0, -1.0, 3.0], dtype=torch.bfloat16),  # no numpy twin
])
def test_tensors_numpy_cannot_view_use_torch(make):
    values = make()
    assert numpy_view(values) is None
    assert bounds(values) == (-1.0, 3.0) and smallest(values) == -1.0 and last(values) == 3.0


def test_nan_propagates_like_aminmax():
    values = torch.tensor([1.0, math.nan, 2.0])
    assert all(math.isnan(x) for x in bounds(values)) and math.isnan(smallest(values))


def test_numpy_view_shares_memory():
    values = torch.arange(4)
    numpy_view(values)[0] = 9
    assert values[0] == 9 and set(NUMPY_DTYPES) >= {torch.float32, torch.int64, torch.bool}
