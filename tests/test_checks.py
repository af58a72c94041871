"""``torchrl_ext._checks``: one rule per check, and the same bad input raising the same exception
type with the same kind of message in every component that takes such a setting."""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl_ext._checks import (
    as_index, bounds, check_bool, check_generator, check_int, check_real, check_reals, resolve_time_dim,
)
from torchrl_ext.demos import DemoStore
from torchrl_ext.presets import l2r_ppo_buffer
from torchrl_ext.replay_buffers.on_policy import OnPolicyReplayBuffer, VTraceReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedSampler, TrajectorySampler
from torchrl_ext.samplers.minibatch import FeedForwardMinibatchSampler
from torchrl_ext.segment_tree import SumSegmentTree
from torchrl_ext.value import GAE, IntrinsicRewardNormalizer, ValueNorm, VTrace
from torchrl_ext.value import functional as F

ZEROS = torch.zeros(5, 1)
NEVER = torch.zeros(5, 1, dtype=torch.bool)


def _set_beta(value: Any) -> None:
    PrioritizedSampler(8, 0.6, 0.4).beta = value


def _update_lambda(value: Any) -> None:
    OnPolicyReplayBuffer(3).update_storage_parameter("gae_lambda", value)


# Every component taking a setting in [0, 1]: (argument name, call with the value).
UNIT: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "GAE": ("gamma", lambda v: GAE(gamma=v, lmbda=0.9, value_network=None)),
    "functional GAE": ("lmbda", lambda v: F.generalized_advantage_estimate(0.9, v, ZEROS, ZEROS, ZEROS, NEVER)),
    "discounted_cumsum": ("gamma", lambda v: F.discounted_cumsum(ZEROS, v, NEVER)),
    "OnPolicyReplayBuffer": ("gamma", lambda v: OnPolicyReplayBuffer(3, gamma=v)),
    "update_storage_parameter": ("gae_lambda", _update_lambda),
    "NStepSampler": ("gamma", lambda v: NStepSampler(2, v)),
    "TrajectorySampler": ("recent_data_ratio", lambda v: TrajectorySampler(2, recent_data_ratio=v)),
    "DemoStore": ("rho", lambda v: DemoStore(rho=v, phi=0.0)),
    "IntrinsicRewardNormalizer": ("gamma", lambda v: IntrinsicRewardNormalizer(v)),
    "l2r_ppo_buffer": ("lam", lambda v: l2r_ppo_buffer(1, 1, 10, 2, lam=v)),
}

# Every component taking a setting >= 0 with no upper bound (TorchRL's PrioritizedSampler takes any beta >= 0).
NON_NEGATIVE: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "PrioritizedSampler": ("beta", lambda v: PrioritizedSampler(8, 0.6, v)),
    "PrioritizedSampler.beta": ("beta", _set_beta),
}

# Every component taking a setting > 0.
POSITIVE: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "VTrace": ("rho_thresh", lambda v: VTrace(gamma=0.9, value_network=None, actor_network=None, rho_thresh=v)),
    "functional V-trace": ("c_thresh", lambda v: F.vtrace_advantage_estimate(
        0.9, ZEROS, ZEROS, ZEROS, ZEROS, ZEROS, NEVER, c_thresh=v)),
    "VTraceReplayBuffer": ("rho_thresh", lambda v: VTraceReplayBuffer(3, rho_thresh=v)),
    "DemoStore": ("alpha", lambda v: DemoStore(alpha=v)),
    "ValueNorm": ("epsilon", lambda v: ValueNorm(1, epsilon=v)),
}

# Every component taking an int setting >= 1.
INTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "SumSegmentTree": ("capacity", lambda v: SumSegmentTree(v)),
    "PrioritizedSampler": ("max_capacity", lambda v: PrioritizedSampler(v, 0.6, 0.4)),
    "NStepSampler": ("n_step", lambda v: NStepSampler(v)),
    "DemoStore": ("capacity", lambda v: DemoStore(capacity=v)),
    "FeedForwardMinibatchSampler": ("num_mini_batch", lambda v: FeedForwardMinibatchSampler(v)),
    "generate_batches": ("num_epochs", lambda v: next(OnPolicyReplayBuffer(3).generate_batches(num_epochs=v))),
    "ValueNorm": ("norm_axes", lambda v: ValueNorm(1, norm_axes=v)),
    "l2r_ppo_buffer": ("obs_dim", lambda v: l2r_ppo_buffer(v, 1, 10, 2)),
}

NOT_A_NUMBER = ["0.5", True, [0.5], object()]


def _raises(call: Callable[[], Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert re.match(pattern, str(info.value)), f"{str(info.value)!r} does not start with {pattern!r}"


# ---------------------------------------------------------------------------- one message everywhere
@pytest.mark.parametrize("component", list(UNIT))
@pytest.mark.parametrize("value", [1.5, -0.5, math.nan])
def test_an_out_of_range_unit_setting_is_one_value_error(component, value):
    name, call = UNIT[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be a number in \[0, 1\], got {name}={float(value)}")


@pytest.mark.parametrize("component", list(UNIT))
@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_an_infinite_unit_setting_is_one_value_error(component, value):
    name, call = UNIT[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be a finite number, got {name}={value}")


@pytest.mark.parametrize("component", list(UNIT))
@pytest.mark.parametrize("value", NOT_A_NUMBER)
def test_a_unit_setting_that_is_not_a_number_is_one_type_error(component, value):
    name, call = UNIT[component]
    _raises(lambda: call(value), TypeError, rf"{name} must be a real number")


@pytest.mark.parametrize("component", list(NON_NEGATIVE))
@pytest.mark.parametrize("value", [-0.5, math.nan])
def test_a_negative_setting_is_one_value_error(component, value):
    name, call = NON_NEGATIVE[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be >= 0\.0, got {name}={value}")


@pytest.mark.parametrize("component", list(NON_NEGATIVE))
def test_a_non_negative_setting_takes_values_above_one_and_refuses_inf_and_non_numbers(component):
    name, call = NON_NEGATIVE[component]
    call(0.0)
    call(2.5)
    _raises(lambda: call(math.inf), ValueError, rf"{name} must be a finite number, got {name}=inf")
    for value in NOT_A_NUMBER:
        _raises(lambda: call(value), TypeError, rf"{name} must be a real number")


@pytest.mark.parametrize("component", list(POSITIVE))
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_a_non_positive_setting_is_one_value_error(component, value):
    name, call = POSITIVE[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be > 0\.0, got {name}={value}")


#: Clip thresholds: +inf clips nothing, as TorchRL's V-trace accepts it.
INFINITE_ACCEPTED = {"VTrace", "functional V-trace", "VTraceReplayBuffer"}


@pytest.mark.parametrize("component", sorted(set(POSITIVE) - INFINITE_ACCEPTED))
def test_an_infinite_positive_setting_is_one_value_error(component):
    name, call = POSITIVE[component]
    _raises(lambda: call(math.inf), ValueError, rf"{name} must be a finite number, got {name}=inf")


@pytest.mark.parametrize("component", sorted(INFINITE_ACCEPTED))
def test_an_infinite_clip_threshold_is_accepted(component):
    POSITIVE[component][1](math.inf)


@pytest.mark.parametrize("component", list(POSITIVE))
@pytest.mark.parametrize("value", NOT_A_NUMBER)
def test_a_positive_setting_that_is_not_a_number_is_one_type_error(component, value):
    name, call = POSITIVE[component]
    _raises(lambda: call(value), TypeError, rf"{name} must be a real number")


@pytest.mark.parametrize("component", list(INTS))
@pytest.mark.parametrize("value", [0, -2, 2.0, "3", True])
def test_a_bad_int_setting_is_one_value_error(component, value):
    name, call = INTS[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be an int >= 1, got {name}={re.escape(repr(value))}")


@pytest.mark.parametrize("component", ["GAE", "OnPolicyReplayBuffer", "NStepSampler", "DemoStore"])
def test_a_one_element_tensor_is_checked_as_its_number(component):
    name, call = UNIT[component]
    call(torch.tensor(0.5))  # accepted
    _raises(lambda: call(torch.tensor(1.5)), ValueError, rf"{name} must be a number in \[0, 1\]")


# ---------------------------------------------------------------------------- tensors of settings
@pytest.mark.parametrize("bad, pattern", [
    (1.5, r"gamma must be a number in \[0, 1\], got values in \[0\.5, 1\.5\]"),
    (math.nan, r"gamma must be a number in \[0, 1\], got values in \[nan, nan\]"),
    (math.inf, r"gamma must be a finite number, got values in \[0\.5, inf\]"),
])
def test_a_tensor_of_discounts_is_checked_elementwise(bad, pattern):
    gamma = torch.tensor([[0.5], [0.5], [bad], [0.5], [0.5]])
    _raises(lambda: F.generalized_advantage_estimate(gamma, 0.9, ZEROS, ZEROS, ZEROS, NEVER), ValueError, pattern)


def test_a_tensor_of_thresholds_is_checked_elementwise():
    call = lambda rho: F.vtrace_advantage_estimate(0.9, ZEROS, ZEROS, ZEROS, ZEROS, ZEROS, NEVER, rho_thresh=rho)  # noqa: E731
    per_step = torch.ones(5, 1)
    _raises(lambda: call(per_step * torch.tensor([[1.0], [0.0], [1.0], [1.0], [1.0]])), ValueError,
            r"rho_thresh must be > 0\.0, got values in \[0\.0, 1\.0\]")
    _raises(lambda: call(per_step * math.nan), ValueError, r"rho_thresh must be > 0\.0, got values in \[nan, nan\]")
    call(per_step * 2.0)  # accepted
    call(per_step * math.inf)  # no clipping, as TorchRL accepts it


def test_a_tensor_of_discounts_still_works():
    reward = torch.arange(5.0).unsqueeze(1)
    per_step = torch.full((5, 1), 0.5)
    got = F.generalized_advantage_estimate(per_step, 0.9, ZEROS, ZEROS, reward, NEVER)
    want = F.generalized_advantage_estimate(0.5, 0.9, ZEROS, ZEROS, reward, NEVER)
    torch.testing.assert_close(got, want)


def test_an_int_discount_works_in_the_estimator():
    # TorchRL stores GAE(gamma=1) as an int64 tensor; the kernels used to refuse it at forward.
    flag = torch.zeros(1, 4, 1, dtype=torch.bool)
    td = TensorDict({"state_value": torch.zeros(1, 4, 1), "next": {
        "state_value": torch.zeros(1, 4, 1), "reward": torch.ones(1, 4, 1), "done": flag, "terminated": flag}},
        [1, 4])
    got = GAE(gamma=1, lmbda=1, value_network=None)(td.clone())["advantage"]
    want = GAE(gamma=1.0, lmbda=1.0, value_network=None)(td.clone())["advantage"]
    torch.testing.assert_close(got, want)
    assert got.flatten().tolist() == [4.0, 3.0, 2.0, 1.0]


@pytest.mark.parametrize("gamma", [torch.ones(5, 1, dtype=torch.bool), torch.ones(5, 1, dtype=torch.complex64)])
def test_a_tensor_that_is_not_real_is_a_type_error(gamma):
    _raises(lambda: F.generalized_advantage_estimate(gamma, 0.9, ZEROS, ZEROS, ZEROS, NEVER), TypeError,
            r"gamma must be a real number or a tensor of them, got dtype=")


# ---------------------------------------------------------------------------- the functions themselves
@pytest.mark.parametrize("kwargs, value, pattern", [
    (dict(low=0.0), -1, r"x must be >= 0\.0, got x=-1\.0\.$"),
    (dict(low=0.0, open_low=True), 0, r"x must be > 0\.0, got x=0\.0\.$"),
    (dict(low=0.0, high=1.0, open_low=True), 0.0, r"x must be a number in \(0, 1\], got x=0\.0\.$"),
    (dict(low=0.0, high=1.0, hint="e.g. x=0.5"), 2, r"x must be a number in \[0, 1\], got x=2\.0; e\.g\. x=0\.5\.$"),
    (dict(low=-math.inf, finite=False), math.nan, r"x must be a real number, got x=nan\.$"),
])
def test_check_real_names_the_value_and_the_bound(kwargs, value, pattern):
    _raises(lambda: check_real("x", value, **kwargs), ValueError, pattern)


def test_check_real_returns_a_float_and_lets_infinities_through_on_request():
    assert check_real("x", 1, low=0.0) == 1.0 and type(check_real("x", 1, low=0.0)) is float
    assert check_real("x", torch.tensor(0.25), low=0.0, high=1.0) == 0.25
    assert check_real("x", -math.inf, low=-math.inf, finite=False) == -math.inf


def test_check_reals_checks_the_broadcast():
    _raises(lambda: check_reals("g", torch.ones(3), low=0.0, shape=torch.Size([5, 1])), ValueError,
            r"g of shape \(3,\) does not broadcast to the data shape \(5, 1\)")
    check_reals("g", torch.ones(1, 1), low=0.0, shape=torch.Size([5, 1]))


def test_check_int_bounds_and_result():
    assert check_int("n", 3, minimum=1) == 3
    _raises(lambda: check_int("n", 5, minimum=0, maximum=4), ValueError, r"n must be an int in \[0, 4\], got n=5\.$")
    _raises(lambda: check_int("n", 0, minimum=1, hint="e.g. n=1"), ValueError, r"n must be an int >= 1, got n=0; e\.g\. n=1\.$")


@pytest.mark.parametrize("component", list(INTS))
@pytest.mark.parametrize("value", [np.int64(3), np.int32(2), torch.tensor(3)])
def test_an_integer_of_another_type_is_told_to_pass_a_python_int(component, value):
    # Was: "n_step must be an int >= 1, got n_step=np.int64(3)", as if 3 were out of range.
    name, call = INTS[component]
    _raises(lambda: call(value), ValueError, rf"{name} must be a Python int >= 1, got {name}="
            rf"{re.escape(repr(value))} \({type(value).__name__}\); pass int\({name}\)")


def test_check_int_python_int_message_keeps_the_bounds_and_hint():
    _raises(lambda: check_int("n", np.uint8(0), minimum=1, maximum=4, hint="e.g. n=1"), ValueError,
            r"n must be a Python int in \[1, 4\], got n=np\.uint8\(0\) \(uint8\); pass int\(n\); e\.g\. n=1\.$")
    for other in (True, np.True_, torch.tensor(True), torch.tensor([3]), 3.0):  # no integers: the old message
        _raises(lambda: check_int("n", other, minimum=1), ValueError, rf"n must be an int >= 1, got n={re.escape(repr(other))}\.$")


@pytest.mark.parametrize("value, expected", [(np.int64(4), 4), (torch.tensor(3), 3), (np.uint8(2), 2)])
def test_as_index_takes_integers_of_other_types(value, expected):
    assert type(as_index(value)) is int and as_index(value) == expected


@pytest.mark.parametrize("value", [True, np.True_, torch.tensor(True), torch.tensor([3]), 3.0, "3", None])
def test_as_index_leaves_everything_else(value):
    assert as_index(value) is value


def test_check_generator():
    generator = torch.Generator()
    assert check_generator("generator", generator) is generator and check_generator("generator", None) is None
    for bad in (3, "seed", np.random.default_rng(0)):
        _raises(lambda: check_generator("generator", bad), TypeError,
                rf"generator must be a torch\.Generator or None, got generator={re.escape(repr(bad))}; "
                r"e\.g\. generator=torch\.Generator\(\)\.manual_seed\(0\)\.$")


def test_resolve_time_dim():
    assert resolve_time_dim(-2, 3) == 1
    _raises(lambda: resolve_time_dim(3, 3), ValueError, r"time_dim=3 is out of range for tensors with 3 dims")
    _raises(lambda: resolve_time_dim("0", 3), ValueError, r"time_dim must be an int in \[-3, 2\], got time_dim='0'")


@pytest.mark.parametrize("good", [True, False, np.bool_(True)])
def test_check_bool_returns_a_python_bool(good):
    assert check_bool("flag", good) is bool(good)


@pytest.mark.parametrize("bad", [1, 0, "yes", None, torch.tensor(True)])
def test_check_bool_refuses_anything_but_a_bool(bad):
    with pytest.raises(TypeError, match=rf"flag must be True or False, got flag={re.escape(repr(bad))}\."):
        check_bool("flag", bad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool, torch.float32, torch.bfloat16])
def test_bounds_are_python_numbers_of_the_smallest_and_largest_entry(dtype):
    values = torch.tensor([2, 0, 1], dtype=dtype)
    low, high = bounds(values)
    assert (low, high) == ((False, True) if dtype is torch.bool else (0, 2))
    assert type(low) is type(values[0].item())


def test_bounds_propagate_nan_and_ignore_autograd_history():
    assert all(math.isnan(x) for x in bounds(torch.tensor([1.0, math.nan, 2.0])))
    assert bounds(torch.tensor([2.0, -1.0], requires_grad=True)) == (-1.0, 2.0)
