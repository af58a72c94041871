"""The recycled memory of large sample outputs: a block is handed out again only once nothing
reads it, within the cap on free bytes, and every storage's samples stay intact while kept."""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.storages import (DedupEnvRingStorage, EnvRingStorage, FastTensorStorage,
                                  OutputRecycler, output_recycler)
from torchrl_ext.storages._gathers import select_rows, take

# This module checks a fast path itself: it runs with the fast paths on (see tests/conftest.py).
pytestmark = pytest.mark.fastpath

KB = 1024


def test_a_block_is_handed_out_again_only_after_its_array_is_gone():
    recycler = OutputRecycler(min_bytes=KB)
    first = recycler.empty((4, 64), np.float32)
    first[:] = 7.0
    second = recycler.empty((4, 64), np.float32)
    assert second.ctypes.data != first.ctypes.data
    address = first.ctypes.data
    del first
    third = recycler.empty((2, 128), np.float32)  # same byte size, another shape
    assert third.ctypes.data == address and third.shape == (2, 128)
    assert recycler.info() == {"hits": 1, "misses": 2, "free_bytes": 0, "in_use": 2}


def test_a_torch_view_keeps_the_block_in_use():
    recycler = OutputRecycler(min_bytes=KB)
    array = recycler.empty((8, 64), np.float32)
    address = array.ctypes.data
    tensor = torch.from_numpy(array)
    tensor.fill_(3.0)
    view = tensor[2:5]
    del array, tensor
    other = recycler.empty((8, 64), np.float32)
    assert other.ctypes.data != address
    other.fill(-1.0)
    assert bool((view == 3.0).all())
    numpy_again = view.numpy()
    del view
    assert recycler.empty((8, 64), np.float32).ctypes.data != address  # .numpy() still reads it
    assert (numpy_again == 3.0).all()
    del numpy_again
    gc.collect()
    assert recycler.empty((8, 64), np.float32).ctypes.data == address


def test_small_outputs_and_recycling_off_are_plain_arrays():
    recycler = OutputRecycler(min_bytes=KB)
    assert not recycler.recycles(KB - 1) and recycler.recycles(KB)
    small = recycler.empty((KB // 4 - 1,), np.float32)
    del small
    assert recycler.info()["free_bytes"] == 0 and recycler.info()["in_use"] == 0
    big = recycler.empty((KB,), np.uint8)
    del big
    assert recycler.info()["free_bytes"] == KB
    recycler.max_free_bytes = 0  # turning it off frees the waiting blocks
    assert recycler.info()["free_bytes"] == 0 and not recycler.recycles(1 << 30)
    recycler.empty((KB,), np.uint8)  # allocated and dropped at once
    assert recycler.info() == {"hits": 0, "misses": 1, "free_bytes": 0, "in_use": 0}


def test_free_blocks_stay_within_max_free_bytes_and_clear_frees_them():
    recycler = OutputRecycler(min_bytes=KB, max_free_bytes=3 * KB)
    blocks = [recycler.empty((2 * KB,), np.uint8), recycler.empty((KB,), np.uint8),
              recycler.empty((2 * KB,), np.uint8)]
    del blocks[:]
    assert recycler.info()["free_bytes"] == 3 * KB  # 2 KB + 1 KB kept, the second 2 KB dropped
    recycler.max_free_bytes = 2 * KB  # the largest go first
    assert recycler.info()["free_bytes"] == KB
    recycler.clear()
    assert recycler.info()["free_bytes"] == 0


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("min_bytes", 0, ValueError, r"min_bytes must be >= 1, got min_bytes=0"),
        ("max_free_bytes", -1, ValueError, r"max_free_bytes must be >= 0, got max_free_bytes=-1"),
        ("max_free_bytes", 1.5, TypeError, r"max_free_bytes must be an int number of bytes, got max_free_bytes=1.5"),
        ("min_bytes", True, TypeError, r"min_bytes must be an int number of bytes, got min_bytes=True"),
    ],
)
def test_bad_settings_are_refused_and_the_old_one_kept(name, value, error, match):
    recycler = OutputRecycler(min_bytes=KB, max_free_bytes=4 * KB)
    with pytest.raises(error, match=match):
        setattr(recycler, name, value)
    assert (recycler.min_bytes, recycler.max_free_bytes) == (KB, 4 * KB)
    with pytest.raises(error, match=match):
        OutputRecycler(**{name: value})


@contextlib.contextmanager
def recycling_small_outputs():
    """The storages' recycler, recycling outputs of 64 B or more (the tests' samples), from
    and back to an empty pool and its own setting."""
    output_recycler.clear()
    old = output_recycler.min_bytes
    output_recycler.min_bytes = 64
    try:
        yield output_recycler
    finally:
        output_recycler.min_bytes = old
        output_recycler.clear()


@pytest.fixture
def recycle_small():
    with recycling_small_outputs() as recycler:
        yield recycler


def test_take_and_select_rows_gather_into_recycled_memory(recycle_small):
    array = np.arange(40, dtype=np.float32).reshape(10, 4)
    before = recycle_small.info()
    out = take(array, np.array([9, -1, 0, 3]))
    assert out.tolist() == array[[9, 9, 0, 3]].tolist()
    selected = select_rows(torch.from_numpy(array), torch.tensor([1, 2, 3, 4]))
    assert selected.tolist() == array[1:5].tolist()
    assert recycle_small.info()["in_use"] == before["in_use"] + 2


@pytest.mark.parametrize("bad", [10, -11])
def test_take_into_recycled_memory_still_refuses_rows_out_of_range(recycle_small, bad):
    array = np.arange(160, dtype=np.float32).reshape(10, 16)  # 2 rows: 128 B, recycled
    with pytest.raises(IndexError, match=rf"row index out of range for 10 rows \(got rows in \[{min(bad, 0)}, {max(bad, 0)}\]\)"):
        take(array, np.array([0, bad]))


def _frames(values: torch.Tensor) -> torch.Tensor:
    """One 16-float frame per value, filled with it."""
    return values.to(torch.float32)[:, None].expand(len(values), 16).clone()


def _fast(storage_rows: int, through_buffer: bool):
    """FastTensorStorage rows ``i`` hold frame ``i``, next frame ``i + 1``; samples of 8 through
    ``rb.sample`` (the numpy ``take`` path) or ``storage.get`` (``index_select``)."""
    storage = FastTensorStorage(storage_rows)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=8)
    rows = torch.arange(storage_rows)
    rb.extend(TensorDict({"obs": _frames(rows), "next": {"obs": _frames(rows + 1)}}, [storage_rows]))

    def sample():
        if through_buffer:
            td = rb.sample()
            index = td["index"]
        else:
            index = torch.randint(storage_rows, (8,))
            td = storage.get(index)
        return td, _frames(index), _frames(index + 1)
    return sample


def _ring(storage_rows: int, kind: str):
    """Two envs; step ``s`` of env ``e`` has frame ``e * L + s`` (as a 2-frame stack for
    ``"dedup stack"``, padded with the first frame at the start)."""
    envs, length = 2, storage_rows // 2
    stacked = kind == "dedup stack"
    storage = {"ring": lambda: EnvRingStorage(envs, length),
               "dedup": lambda: DedupEnvRingStorage(envs, length, obs_key="obs"),
               "dedup stack": lambda: DedupEnvRingStorage(envs, length, obs_key="obs", num_stack=2)}[kind]()
    rb = EnvRingReplayBuffer(storage=storage)
    first = torch.tensor([0, length])

    def observation(step: torch.Tensor) -> torch.Tensor:  # [N] steps of envs 0..N-1 -> obs
        frame = _frames(first[: len(step)] + step)
        if not stacked:
            return frame
        return torch.stack([_frames(first[: len(step)] + (step - 1).clamp(min=0)), frame], 1)

    for step in range(length):
        steps = torch.full((envs,), step)
        rb.extend(TensorDict({"obs": observation(steps),
                              "next": {"obs": observation(steps + 1),
                                       "done": torch.zeros(envs, 1, dtype=torch.bool)}},
                             [envs]), env_ids=torch.arange(envs))

    def sample():
        env, pos = torch.randint(envs, (8,)), torch.randint(length - 1, (8,))
        td = storage.get((env, pos))
        if not stacked:
            return td, _frames(env * length + pos), _frames(env * length + pos + 1)
        older = lambda p: _frames(env * length + p.clamp(min=0))  # noqa: E731
        return (td, torch.stack([older(pos - 1), older(pos)], 1),
                torch.stack([older(pos), older(pos + 1)], 1))
    return sample


SAMPLERS = {
    "fast rb.sample": lambda rows: _fast(rows, through_buffer=True),
    "fast get": lambda rows: _fast(rows, through_buffer=False),
    "ring get": lambda rows: _ring(rows, "ring"),
    "dedup get": lambda rows: _ring(rows, "dedup"),
    "dedup stack get": lambda rows: _ring(rows, "dedup stack"),
}


@pytest.mark.parametrize("source", list(SAMPLERS))
@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.one_of(st.just("sample"), st.integers(0, 5)), min_size=1, max_size=30))
def test_kept_samples_stay_intact_while_later_samples_reuse_freed_memory(source, ops):
    """Samples are kept or dropped in any order; every kept one still holds its rows."""
    with recycling_small_outputs():  # not the fixture: hypothesis reruns the body per example
        sample = SAMPLERS[source](64)
        kept: list = []
        for op in ops:
            if op == "sample":
                kept.append(sample())
            elif kept:
                kept.pop(op % len(kept))
            for td, obs, next_obs in kept:
                assert torch.equal(td["obs"], obs)
                assert torch.equal(td["next", "obs"], next_obs)


@pytest.mark.parametrize("source", list(SAMPLERS))
def test_a_dropped_sample_s_memory_serves_the_next_one(recycle_small, source):
    sample = SAMPLERS[source](64)
    td, _, _ = sample()
    # obs and next obs have one byte size: either may get the other's block back
    addresses = {td["obs"].data_ptr(), td["next", "obs"].data_ptr()}
    hits = recycle_small.info()["hits"]
    del td
    td, obs, next_obs = sample()
    assert td["obs"].data_ptr() in addresses and recycle_small.info()["hits"] > hits
    assert torch.equal(td["obs"], obs) and torch.equal(td["next", "obs"], next_obs)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_fork_while_the_lock_is_held_leaves_the_child_a_working_recycler():
    with output_recycler._lock:
        pid = os.fork()
        if pid == 0:  # the child: it must not wait on the parent's held lock
            signal.alarm(10)
            try:
                output_recycler.empty((1 << 20,), np.uint8)
                os._exit(0)
            except BaseException:
                os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


class _CollectingLock:
    """A lock that runs the garbage collector right after every acquire: the collector frees
    recycled outputs held in reference cycles there, as it may inside any allocation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> "_CollectingLock":
        self._lock.acquire()
        gc.collect()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_garbage_collection_inside_the_critical_sections_cannot_deadlock():
    # Was: _give_back (a weakref callback) took the recycler's non-reentrant lock, so a
    # collection inside empty()/info()/clear()/max_free_bytes freeing a recycled output
    # held in a reference cycle made it wait on itself forever.
    recycler = OutputRecycler(min_bytes=1024)
    recycler._lock = _CollectingLock()

    class Cycle:
        pass

    def garbage() -> None:
        cycle = Cycle()
        cycle.self, cycle.array = cycle, recycler.empty((1024,), np.float32)

    operations = [
        lambda: recycler.empty((1024,), np.float32),
        recycler.info,
        recycler.clear,
        lambda: setattr(recycler, "max_free_bytes", 1 << 20),
    ]
    done = []

    def run() -> None:
        for operation in operations * 3:
            garbage()  # unreachable now, freed by the collection inside the next lock
            operation()
        done.append(True)

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=10)
    finally:
        if was_enabled:
            gc.enable()
    assert done, "a garbage collection inside the recycler's lock deadlocked"
    info = recycler.info()
    assert info["in_use"] == 0 and info["free_bytes"] <= 1 << 20
