"""The buffers with the readiness features of TorchRL releases after 0.14.1.

Later releases wake waiters (``wait_until_sampleable``, ``sample(wait=True)``) through a
readiness condition notified after each write, count samples (``stats()``) and let samplers
name the sampled dims. Each test checks the behaviour where this TorchRL has the feature (the
nightly job) and, where it has not (0.14.1), that the buffers behave as before.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

import torchrl_ext
from torchrl_ext import _compat
from torchrl_ext.replay_buffers import (
    EnvRingReplayBuffer, OnPolicyReplayBuffer, PrioritizedReplayBuffer, TensorDictReplayBuffer, VTraceReplayBuffer,
)
from torchrl_ext.storages import FastTensorStorage

HAS_READINESS = hasattr(TorchRLTensorDictReplayBuffer, "wait_until_sampleable")
HAS_WAIT = "wait" in inspect.signature(TorchRLTensorDictReplayBuffer.sample).parameters


def _rows(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32)}, [n])


def _steps(num_envs: int = 2) -> TensorDict:
    return TensorDict({"obs": torch.ones(num_envs, 1)}, [num_envs])


def _wait_in_a_thread(wait, write) -> dict:
    """Starts ``wait()`` in a thread, calls ``write()`` while it waits; its result and seconds."""
    out = {}

    def consume() -> None:
        start = time.monotonic()
        out["result"] = wait()
        out["after"] = time.monotonic() - start

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(0.2)
    write()
    consumer.join(10)
    return out


def _paused(method, entered: threading.Event, release: threading.Event):
    """``method`` that signals ``entered`` and waits for ``release`` first (the buffer's locks held)."""

    def wrapper(*args, **kwargs):
        entered.set()
        release.wait(10)
        return method(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------- 1. lock order of the writes
WRITES = {
    # name: (buffer factory, writer method paused with the replay lock held, the write)
    "extend": (lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4),
               "extend", lambda rb: rb.extend(_rows(3))),
    "add": (lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4),
            "add", lambda rb: rb.add(TensorDict({"obs": torch.tensor(1.0)}, []))),
    "ring_blocking_extend": (lambda: EnvRingReplayBuffer(num_envs=2, max_length=10, batch_size=4),
                             "extend", lambda rb: rb.extend(_steps(), blocking=True, timeout=5.0)),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_write_holding_the_replay_lock_does_not_deadlock_with_wait_until_sampleable(name):
    """A waiter that takes the readiness condition while a write holds the replay lock: TorchRL's
    write then notifies the condition, the waiter wants the replay lock (ABBA before the fix)."""
    make, method, write = WRITES[name]
    rb = make()
    entered, release = threading.Event(), threading.Event()
    # The slow roads: TorchRL's own extend/add, which notify with our replay lock held.
    with torchrl_ext.fastpath(False):
        write(rb)  # allocates the storage
        length = len(rb)
        if not HAS_READINESS:
            assert isinstance(_compat.readiness_condition(rb), contextlib.nullcontext)
            write(rb)
            assert len(rb) > length
            return
        setattr(rb.writer, method, _paused(getattr(rb.writer, method), entered, release))
        writer = threading.Thread(target=write, args=(rb,), daemon=True)
        writer.start()
        assert entered.wait(5)
        waiter = threading.Thread(target=rb.wait_until_sampleable, kwargs={"min_items": 1000, "timeout": 1.0},
                                  daemon=True)
        waiter.start()
        time.sleep(0.3)  # the waiter holds the condition now (it would, without the fix)
        release.set()
        writer.join(10)
        waiter.join(10)
    assert not writer.is_alive() and not waiter.is_alive(), "deadlock between the write and the waiter"
    assert len(rb) > length


# ---------------------------------------------------------------- 2. fast writes wake the waiters
FAST_WRITES = {
    "lean_extend": (lambda: TensorDictReplayBuffer(storage=FastTensorStorage(100), batch_size=4),
                    lambda rb: rb.extend(_rows(10)), lambda rb: (rb.extend(_rows(1)), rb.empty())),
    "ring_write": (lambda: EnvRingReplayBuffer(num_envs=2, max_length=10, batch_size=4),
                   lambda rb: [rb.extend(_steps()) for _ in range(4)], lambda rb: None),
    "ring_blocking_write": (lambda: EnvRingReplayBuffer(num_envs=2, max_length=10, batch_size=4),
                            lambda rb: [rb.extend(_steps(), blocking=True, timeout=5.0) for _ in range(4)],
                            lambda rb: None),
}


@pytest.mark.fastpath
@pytest.mark.parametrize("name", sorted(FAST_WRITES))
def test_a_fast_write_wakes_a_waiting_consumer(name):
    make, write, prepare = FAST_WRITES[name]
    rb = make()
    prepare(rb)
    _check_the_write_wakes_a_waiter(rb, write)


def _check_the_write_wakes_a_waiter(rb, write) -> None:
    """``write(rb)`` wakes a consumer waiting for 4 items (where TorchRL has waiters)."""
    if not HAS_READINESS:
        assert _compat.notify_state_change(rb) is None  # nothing to wake
        write(rb)
        assert len(rb) >= 4
        return
    woke = _wait_in_a_thread(lambda: rb.wait_until_sampleable(min_items=4, timeout=4.0), lambda: write(rb))
    # Without a notice the waiter only rechecks at its timeout (4 s).
    assert woke["result"] is True and woke["after"] < 2.0, woke


def _on_policy_step() -> TensorDict:
    ones = torch.ones(2, 1)
    return TensorDict({"observation": ones, "state_value": ones,
                       "next": {"observation": ones, "reward": ones, "done": ones.bool(),
                                "terminated": ones.bool()}}, [2])


def _shipped_rollout() -> TensorDict:
    worker = OnPolicyReplayBuffer(4)
    for _ in range(3):
        worker.insert(_on_policy_step())
    return worker.get_all_buffer_data()


# The on-policy buffers write their storage without TorchRL's extend.
ON_POLICY_WRITES = {
    "insert": lambda rb: [rb.insert(_on_policy_step()) for _ in range(2)],
    "insert_data_slice": lambda rb: rb.insert_data_slice(_shipped_rollout()),
}


@pytest.mark.parametrize("name", sorted(ON_POLICY_WRITES))
@pytest.mark.parametrize("cls", [OnPolicyReplayBuffer, VTraceReplayBuffer])
def test_an_on_policy_write_wakes_a_waiting_consumer(cls, name):
    _check_the_write_wakes_a_waiter(cls(4), ON_POLICY_WRITES[name])


# ---------------------------------------------------------------- 3. sample's waiting keywords
BUFFERS = {
    "tensordict": lambda: TensorDictReplayBuffer(storage=FastTensorStorage(100), batch_size=4),
    "prioritized": lambda: PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(100),
                                                   batch_size=4),
    "env_ring": lambda: EnvRingReplayBuffer(num_envs=2, max_length=10, batch_size=4),
}


def _fill(rb) -> None:
    if isinstance(rb, EnvRingReplayBuffer):
        for _ in range(4):
            rb.extend(_steps())
    else:
        rb.extend(_rows(10))


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_sample_takes_torchrls_waiting_keywords(name):
    rb = BUFFERS[name]()
    _fill(rb)
    assert rb.sample(wait=False, timeout=None, cancel_event=None).shape[0] == 4  # the defaults
    if not HAS_WAIT:
        for keyword, value in (("wait", True), ("timeout", 1.0), ("cancel_event", threading.Event())):
            with pytest.raises(TypeError, match=f"{keyword}=.*no '{keyword}' keyword"):
                rb.sample(**{keyword: value})
        return
    batch, info = rb.sample(wait=True, timeout=1.0, return_info=True)
    assert batch.shape[0] == 4 and "index" in info
    with torchrl_ext.fastpath(False):
        assert rb.sample(wait=True, timeout=1.0).shape[0] == 4


@pytest.mark.fastpath
@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_sample_wait_blocks_until_a_write_and_honours_timeout_and_cancel(name):
    rb = BUFFERS[name]()
    if not HAS_WAIT:
        with pytest.raises(TypeError, match="wait=True"):
            rb.sample(wait=True, timeout=0.1)
        return
    if not isinstance(rb, EnvRingReplayBuffer):
        rb.extend(_rows(1))
        rb.empty()  # allocated, empty: the fast writes apply
    with pytest.raises(TimeoutError):
        rb.sample(wait=True, timeout=0.1)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RuntimeError, match="cancelled"):
        rb.sample(wait=True, cancel_event=cancel)
    got = _wait_in_a_thread(lambda: rb.sample(wait=True, timeout=4.0), lambda: _fill(rb))
    assert got["result"].shape[0] == 4 and got["after"] < 2.0, got


# ---------------------------------------------------------------- 4. sample counters
def _counters(rb) -> tuple:
    stats = rb.stats()
    return stats["sample_calls"], stats["samples_returned"], rb.state_dict()["_sample_calls"]


COUNTED = {
    "fast_storage": lambda: TensorDictReplayBuffer(storage=FastTensorStorage(100), batch_size=4),
    "lazy_storage": lambda: TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4),
    "prioritized": BUFFERS["prioritized"],
    "env_ring": BUFFERS["env_ring"],
}


@pytest.mark.fastpath
@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes")  # sample(3) on a buffer of 4
@pytest.mark.parametrize("name", sorted(COUNTED))
def test_fast_samples_are_counted_as_torchrls_sample_counts_them(name):
    results = {}
    for fast in (True, False):
        rb = COUNTED[name]()
        _fill(rb)
        with torchrl_ext.fastpath(fast):
            batches = [rb.sample(), rb.sample(3), rb.sample(return_info=True)[0]]
        if not HAS_READINESS:
            assert not hasattr(rb, "stats") or "sample_calls" not in rb.stats()
            assert [b.shape[0] for b in batches] == [4, 3, 4]
            return
        results[fast] = _counters(rb)
    items = (4 + 3 + 4) * (1 if name != "env_ring" else rb.sampler.batch_length)
    assert results[True] == results[False] == (3, items, 3)
    # TorchRL's own buffer, the reference.
    reference = TorchRLTensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    reference.extend(_rows(10))
    for size in (None, 3, None):
        reference.sample(size)
    if name != "env_ring":
        assert _counters(reference) == results[True]


# ---------------------------------------------------------------- 5. sample names
@pytest.mark.fastpath
def test_fast_samples_carry_the_samplers_dim_names():
    def names(cls, fast: bool) -> tuple:
        rb = cls(storage=LazyTensorStorage(100), batch_size=10,
                 sampler=SliceSampler(slice_len=5, traj_key="traj", output_layout="batch_time"))
        rb.extend(TensorDict({"obs": torch.arange(40.0), "traj": torch.arange(40) // 20}, [40]))
        with torchrl_ext.fastpath(fast):
            batch = rb.sample()
        return tuple(batch.shape), batch.names

    try:
        SliceSampler(slice_len=5, traj_key="traj", output_layout="batch_time")
    except TypeError:  # this TorchRL's SliceSampler names nothing: samples as before
        sampler = SliceSampler(slice_len=5, traj_key="traj")
        data = _rows(10)
        assert _compat.set_sample_names(sampler, data) is data
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=10, sampler=sampler)
        rb.extend(TensorDict({"obs": torch.arange(40.0), "traj": torch.arange(40) // 20}, [40]))
        assert rb.sample().names == [None]
        return
    reference = names(TorchRLTensorDictReplayBuffer, True)
    assert reference == ((2, 5), [None, "time"])
    assert names(TensorDictReplayBuffer, True) == names(TensorDictReplayBuffer, False) == reference
