"""SafetensorsCheckpointer keeps the batch dims of sub-TensorDicts (multi-agent groups ``[N, n_agents]``).

The reference is TorchRL's own storage checkpointer on the same buffer.
"""
from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from tests.test_errors import assert_same, freeze
from torchrl_ext.io import SafetensorsCheckpointer
from torchrl_ext.io.checkpoint_pair import read_pair, write_pair
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage


def steps(start: int, n: int) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    agents = TensorDict(
        {"obs": x.view(n, 1, 1).expand(n, 3, 4).clone(),
         "team": TensorDict({"id": torch.arange(2).expand(n, 3, 2).clone()}, [n, 3, 2])},
        [n, 3],
    )
    return TensorDict({"agents": agents, "state": x.view(n, 1).expand(n, 5).clone(),
                       "next": {"agents": agents.clone()}}, [n])


def buffer(storage_cls, checkpointer):
    rb = TensorDictReplayBuffer(storage=storage_cls(8), batch_size=4,
                                generator=torch.Generator().manual_seed(0))
    if checkpointer is not None:  # None: TorchRL's default checkpointer for the storage
        rb.storage.checkpointer = checkpointer
    return rb


def batch_sizes(data: TensorDict) -> dict:
    return {key: list(value.batch_size) for key, value in data.items(include_nested=True)
            if isinstance(value, TensorDict)}


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, FastMemmapStorage, LazyTensorStorage])
def test_fresh_buffer_gets_the_nested_batch_sizes_torchrl_restores(tmp_path, storage_cls):
    restored = {}
    for name, checkpointer in (("torchrl", None), ("safetensors", SafetensorsCheckpointer())):
        rb = buffer(storage_cls, checkpointer)
        for start in (0, 5):  # 10 steps into 8 slots: wrapped
            rb.extend(steps(start, 5))
        rb.dumps(tmp_path / name)
        fresh = buffer(storage_cls, checkpointer)
        fresh.loads(tmp_path / name)
        restored[name] = fresh
    reference, got = (restored[name].storage[torch.arange(8)] for name in ("torchrl", "safetensors"))
    assert batch_sizes(got) == batch_sizes(reference) == {
        "agents": [8, 3], ("agents", "team"): [8, 3, 2], "next": [8],
        ("next", "agents"): [8, 3], ("next", "agents", "team"): [8, 3, 2]}
    assert_same(freeze(reference.exclude("index")), freeze(got.exclude("index")))
    sample = restored["safetensors"].sample()
    assert sample["agents"].batch_size == (4, 3) and sample["next", "agents", "team"].batch_size == (4, 3, 2)


def save_with_metadata(path, edit) -> SafetensorsCheckpointer:
    """Five steps saved under ``path``, their metadata then rewritten by ``edit(metadata)``."""
    checkpointer, storage = SafetensorsCheckpointer(), FastTensorStorage(8)
    storage.set(torch.arange(5), steps(0, 5))
    checkpointer.dumps(storage, path)
    pair = checkpointer.pair(path)
    metadata, tensors, _ = read_pair(pair)
    edit(metadata)
    write_pair(pair, tensors, json.dumps(metadata, indent=2))
    return checkpointer


def test_files_saved_without_nested_batch_load_leaves_only(tmp_path):
    # what earlier versions wrote
    checkpointer = save_with_metadata(tmp_path, lambda metadata: metadata.pop("nested_batch", None))
    fresh = FastTensorStorage(8)
    checkpointer.loads(fresh, tmp_path)
    got = fresh[torch.arange(5)]
    assert got["agents"].batch_size == (5,) and got["agents", "obs"].shape == (5, 3, 4)
    assert torch.equal(got["agents", "obs"], steps(0, 5)["agents", "obs"])


def test_nested_batch_that_does_not_fit_the_tensors_is_refused(tmp_path):
    # 3 agents are stored
    checkpointer = save_with_metadata(tmp_path, lambda metadata: metadata.update(nested_batch=[[["agents"], [8, 4]]]))
    other = FastTensorStorage(8)
    other.set(torch.arange(2), steps(50, 2))
    before = freeze(other[torch.arange(2)])
    with pytest.raises(ValueError, match=r"metadata\.json: 'nested_batch' does not fit the tensors"):
        checkpointer.loads(other, tmp_path)
    assert len(other) == 2
    assert_same(before, freeze(other[torch.arange(2)]))
