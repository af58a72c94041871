"""Pinned sample outputs: storages attached to a buffer built with ``pin_memory=True`` gather
into page-locked memory, so TorchRL's ``pin_memory()`` of the sample copies nothing.

This machine has no accelerator, so most tests stand one in (:class:`FakePinning`): page-locked
allocations become plain CPU tensors whose memory the fake remembers. The last test pins for
real and runs where CUDA is present.
"""
from __future__ import annotations

import random
from functools import partial

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from tests.storages.test_dedup import Streams, to_td
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.storages import (
    DedupEnvRingStorage,
    EnvRingStorage,
    EpisodicEnvRingStorage,
    FastMemmapStorage,
    FastTensorStorage,
    RolloutStorage,
    _output_memory,
)
from torchrl_ext.storages._gathers import gather_coordinates, select_rows, take


class FakePinning:
    """Stands in for an accelerator: ``pinned_empty`` hands out plain CPU tensors and keeps
    them (so their memory cannot be reused by an unpinned tensor while the test runs)."""

    def __init__(self) -> None:
        self.blocks: list[torch.Tensor] = []

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        block = torch.empty(shape, dtype=dtype)
        self.blocks.append(block)
        return block

    def holds(self, tensor: torch.Tensor) -> bool:
        address = tensor.untyped_storage().data_ptr()
        return any(address == block.untyped_storage().data_ptr() for block in self.blocks)


@pytest.fixture
def fake_pinning(monkeypatch):
    fake = FakePinning()
    monkeypatch.setattr(_output_memory, "can_pin_memory", lambda: True)
    monkeypatch.setattr(_output_memory, "pinned_empty", fake.empty)
    return fake


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(_output_memory, "can_pin_memory", lambda: False)


# ---------------------------------------------------------------- one filled storage per kind
# Each case builds a buffer (pin_memory as asked) over the storage, fills it past its capacity,
# and returns the storage with a read of some stored items (repeats and wrap-around included).

def transitions(n: int, seed: int, numpy_views: bool = False) -> TensorDict:
    """``numpy_views``: only dtypes numpy can view (the storages then gather through numpy's
    ``take``; a bfloat16 leaf sends the rings to torch's ``index_select``)."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({
        "obs": torch.randint(0, 256, (n, 4, 3), dtype=torch.uint8, generator=g),
        "action": torch.randint(0, 5, (n, 1), generator=g),
        "next": {"obs": torch.randint(0, 256, (n, 4, 3), dtype=torch.uint8, generator=g),
                 "reward": torch.randn(n, 1, generator=g, dtype=torch.float64),
                 "done": torch.rand(n, 1, generator=g) < 0.2},
        "weight": torch.randn(n, 2, generator=g).to(torch.bfloat16),  # numpy cannot view it
        "step_type": torch.randint(0, 3, (n,), generator=g, dtype=torch.int32),  # ALF's: 0 = FIRST
    }, [n])
    return td.exclude("weight") if numpy_views else td


def fast_case(storage_type, pin_memory, tmp_path):
    kwargs = {"scratch_dir": tmp_path} if storage_type is FastMemmapStorage else {}
    rb = TorchRLTensorDictReplayBuffer(storage=storage_type(50, **kwargs), pin_memory=pin_memory)
    rb.extend(transitions(30, 0))
    rb.extend(transitions(35, 1))  # wraps around
    index = torch.tensor([3, 49, 0, 17, 17, 14])
    return rb.storage, lambda storage: storage.get(index)


def ring_case(storage_type, pin_memory, tmp_path, numpy_views=False):
    rb = EnvRingReplayBuffer(storage=storage_type(3, 6), pin_memory=pin_memory)
    for k in range(9):  # the rings wrap
        rb.extend(transitions(3, 10 + k, numpy_views), env_ids=torch.tensor([2, 0, 1]))
    env, position = torch.tensor([0, 2, 1, 0]), torch.tensor([3, 8, 5, 8])
    end = torch.tensor([5, 8, 7, 8])

    def read(storage):  # one-step and n-step reads
        out = storage.get((env, position))
        out["chain"] = storage.get((env, position, end))
        return out
    return rb.storage, read


def dedup_case(storage_type, pin_memory, tmp_path):
    rng = random.Random(3)
    streams = Streams(2, 3, 0, "reset", rng)
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 12, num_stack=3), pin_memory=pin_memory)
    for _ in range(20):
        td, ids = to_td([0, 1], [[streams.step(0)], [streams.step(1)]], blocks=False)
        rb.extend(td, env_ids=ids)
    storage = rb.storage
    index = (torch.tensor([0, 1, 1, 0]), storage.current_pos[[0, 1, 1, 0]] - torch.tensor([1, 2, 1, 3]))
    return storage, lambda storage: storage.get(index)


def rollout_case(storage_type, pin_memory, tmp_path):
    rollout = RolloutStorage(4)
    TensorDictReplayBuffer(storage=rollout, pin_memory=pin_memory)
    for t in range(4):
        rollout.insert(transitions(3, 20 + t))
    index = (torch.tensor([0, 3, 2, 2]), torch.tensor([1, 0, 2, 2]))  # steps of [T=4, N=3]
    return rollout, lambda storage: storage.get(index)


CASES = [
    pytest.param(fast_case, FastTensorStorage, id="FastTensorStorage"),
    pytest.param(fast_case, FastMemmapStorage, id="FastMemmapStorage"),
    pytest.param(ring_case, EnvRingStorage, id="EnvRingStorage"),
    pytest.param(ring_case, EpisodicEnvRingStorage, id="EpisodicEnvRingStorage"),
    pytest.param(partial(ring_case, numpy_views=True), EnvRingStorage, id="EnvRingStorage-numpy-views"),
    pytest.param(dedup_case, DedupEnvRingStorage, id="DedupEnvRingStorage"),
    pytest.param(rollout_case, RolloutStorage, id="RolloutStorage"),
]


@pytest.mark.parametrize("case, storage_type", CASES)
def test_a_buffer_that_pins_gets_pinned_reads_equal_to_plain_ones(fake_pinning, case, storage_type, tmp_path):
    storage, read = case(storage_type, True, tmp_path)
    assert storage.pin_outputs is True
    pinned = read(storage)
    storage.pin_outputs = False
    plain = read(storage)
    keys = list(plain.keys(True, True))
    assert sorted(map(str, pinned.keys(True, True))) == sorted(map(str, keys))
    for key in keys:
        assert pinned[key].dtype == plain[key].dtype and pinned[key].shape == plain[key].shape, key
        assert torch.equal(pinned[key], plain[key]), key
        assert fake_pinning.holds(pinned[key]), key  # every leaf, small ones included
        assert not fake_pinning.holds(plain[key]), key


@pytest.mark.parametrize("case, storage_type", CASES)
def test_storages_do_not_pin_unless_asked_or_without_an_accelerator(fake_pinning, case, storage_type, tmp_path,
                                                                    monkeypatch):
    storage, read = case(storage_type, False, tmp_path)
    assert storage.pin_outputs is False
    out = read(storage)
    assert not any(fake_pinning.holds(leaf) for leaf in out.values(True, True))
    assert fake_pinning.blocks == []
    # A buffer that pins on a machine without an accelerator: TorchRL's own pin_memory() call
    # fails there as it always has; the storage reads as before.
    monkeypatch.setattr(_output_memory, "can_pin_memory", lambda: False)
    storage, _ = case(storage_type, True, tmp_path / "pinning")
    assert storage.pin_outputs is False


def test_one_pinning_buffer_pins_a_shared_storage(fake_pinning):
    storage = FastTensorStorage(10)
    TorchRLTensorDictReplayBuffer(storage=storage)
    assert storage.pin_outputs is False
    TorchRLTensorDictReplayBuffer(storage=storage, pin_memory=True)
    assert storage.pin_outputs is True


# ---------------------------------------------------------------- the gather helpers

def test_select_rows_pinned_gathers_any_size_and_dtype(fake_pinning):
    index = torch.tensor([2, 0, 2, 1])
    for tensor in (torch.arange(12.0).reshape(3, 4), torch.arange(6).reshape(3, 2).to(torch.bfloat16),
                   torch.arange(3 * 400_000, dtype=torch.uint8).reshape(3, 400_000)):  # 1.6 MB out
        out = select_rows(tensor, index, pinned=True)
        assert fake_pinning.holds(out)
        assert torch.equal(out, tensor[index])
    stored = torch.arange(24.0).reshape(2, 3, 4)
    out = gather_coordinates(TensorDict({"a": stored}, [2, 3]), (torch.tensor([1, 0]), torch.tensor([2, 1])),
                             pinned=True)
    assert fake_pinning.holds(out["a"]) and torch.equal(out["a"], stored[[1, 0], [2, 1]])


def test_take_pinned_keeps_numpy_semantics(fake_pinning):
    array = np.arange(20, dtype=np.float32).reshape(5, 4)
    rows = np.array([4, -1, 0, -5], dtype=np.int64)
    out = take(array, rows, pinned=True)
    assert fake_pinning.holds(out) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), array[rows])
    with pytest.raises(IndexError, match="row index out of range for 5 rows"):
        take(array, np.array([0, 5]), pinned=True)


# ---------------------------------------------------------------- bad input

def test_pin_outputs_takes_a_bool_and_needs_an_accelerator(no_accelerator):
    storage = FastTensorStorage(10)
    with pytest.raises(TypeError, match=r"pin_outputs must be True or False, got pin_outputs='yes'"):
        storage.pin_outputs = "yes"
    with pytest.raises(ValueError, match="pin_outputs=True needs an accelerator .* leave pin_outputs=False"):
        storage.pin_outputs = True
    assert storage.pin_outputs is False
    storage.pin_outputs = False  # always allowed


# ---------------------------------------------------------------- real pinning

@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked host memory needs CUDA")
def test_pinned_samples_are_not_copied_again(monkeypatch):
    rb = TorchRLTensorDictReplayBuffer(storage=FastTensorStorage(50), pin_memory=True, batch_size=16)
    rb.extend(transitions(70, 5))
    gathered = {}
    get = type(rb.storage).get

    def spy(storage, index):
        out = get(storage, index)
        gathered.update({key: leaf.data_ptr() for key, leaf in out.items(True, True)})
        return out
    monkeypatch.setattr(type(rb.storage), "get", spy)
    sample = rb.sample()
    for key, address in gathered.items():
        assert sample[key].is_pinned() and sample[key].data_ptr() == address, key
    index = sample["index"]
    for key in gathered:
        assert torch.equal(sample[key], rb.storage._storage[key][index]), key
