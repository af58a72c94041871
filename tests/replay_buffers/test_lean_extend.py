"""The lean ``extend`` (a ``[N]`` batch into a 1-D fast storage) does what TorchRL's ``extend`` does."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from torchrl_ext.replay_buffers import PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage

# This module checks a fast path itself: it runs with the fast paths on (see tests/conftest.py).
pytestmark = pytest.mark.fastpath


def batch(first: int, n: int, td_error: bool = False) -> TensorDict:
    data = TensorDict({"obs": torch.arange(first, first + n, dtype=torch.float32).unsqueeze(-1),
                       "next": {"reward": torch.full((n, 1), float(first))}}, [n])
    if td_error:
        data["td_error"] = torch.rand(n) + 0.1
    return data


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, FastMemmapStorage])
@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 12), sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8))
def test_same_state_as_torchrls_extend(storage_cls, capacity, sizes):
    ours = TensorDictReplayBuffer(storage=storage_cls(capacity))
    theirs = TorchRLTensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    first = 0
    for n in (min(n, capacity) for n in sizes):
        data_ours, data_theirs = batch(first, n), batch(first, n)
        got, want = ours.extend(data_ours), theirs.extend(data_theirs)
        assert torch.equal(got, want)
        assert set(data_ours.keys()) == set(data_theirs.keys())  # the caller's batch is left as TorchRL leaves it
        first += n
    assert ours.writer._cursor == theirs.writer._cursor
    assert ours.write_count == theirs.write_count and len(ours) == len(theirs)
    stored = ours.storage.get(torch.arange(len(ours)))
    expected = theirs.storage.get(torch.arange(len(theirs)))
    for key in ("obs", ("next", "reward"), "index"):
        assert torch.equal(stored[key], expected[key]), key


def test_the_lean_path_is_the_one_taken(monkeypatch):
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8))
    rb.extend(batch(0, 3))  # the first write initialises the storage through TorchRL's path

    def refuse(*args, **kwargs):
        raise AssertionError("TorchRL's extend was called")

    monkeypatch.setattr(TorchRLTensorDictReplayBuffer, "extend", refuse)
    rb.extend(batch(3, 7))  # wraps around
    assert rb.storage.get(torch.arange(8))["obs"][:, 0].tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    assert rb.writer._cursor == 2 and rb.write_count == 10


def test_priorities_given_at_extend_match_torchrls_path():
    """Same buffer class, one storage on the lean path and one on TorchRL's: same priorities."""
    lean = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=FastTensorStorage(16))
    slow = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(16))
    for first, n in ((0, 5), (5, 9), (14, 6)):
        data = batch(first, n, td_error=True)
        lean.extend(data.clone())
        slow.extend(data.clone())
    assert torch.equal(lean.sampler.state_dict()["_sum_tree"]["levels"][0],
                       slow.sampler.state_dict()["_sum_tree"]["levels"][0])


def test_a_failing_priority_write_back_is_torchrls_error():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=FastTensorStorage(8))
    rb.extend(batch(0, 2, td_error=True))
    bad = batch(2, 2, td_error=True)
    bad["td_error"] = torch.tensor([float("nan"), 1.0])
    with pytest.raises(RuntimeError, match="Failed to update priority of extended data"):
        rb.extend(bad)


@pytest.mark.parametrize("priority_key", ["td_error", ("td_error",), ("meta", "td_error")])
def test_priorities_under_any_spelling_of_the_key_are_written_back(priority_key):
    # The lean path skips the priority lookup only when the batch provably lacks the key:
    # a stored column under any spelling of it (a 1-tuple, a nested key) must still be read.
    leaves, trees = [], []
    for storage in (FastTensorStorage(16), LazyTensorStorage(16)):
        rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, priority_key=priority_key)
        for first, n in ((0, 5), (5, 9), (14, 6)):
            data = batch(first, n)
            data.set(priority_key, torch.linspace(0.5, 2.0, n) + first)
            rb.extend(data)
        trees.append(rb.sampler.state_dict()["_sum_tree"]["levels"][0])
        leaves.append(rb.storage.get(torch.arange(16)).get(priority_key))
    assert torch.equal(trees[0], trees[1])
    assert torch.equal(leaves[0], leaves[1])
    assert bool((trees[0][:16] != trees[0][0]).any())  # the priorities differ from the initial one
