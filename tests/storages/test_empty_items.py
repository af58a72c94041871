"""Leaves whose items hold no elements (an item dim of size 0, e.g. obs ``[N, 2, 0]``).

The ring storages store them like any other leaf, as FastTensorStorage and TorchRL's
LazyTensorStorage do; FastMemmapStorage, whose files cannot be empty, refuses them before
anything changes. A first write that fails leaves a ring storage unallocated.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import (
    DedupEnvRingStorage,
    EnvRingStorage,
    EpisodicEnvRingStorage,
    FastMemmapStorage,
    FastTensorStorage,
    StorageLayoutError,
)

NUM_ENVS = 3
LENGTH = 8
RINGS = {
    "ring": lambda: EnvRingStorage(NUM_ENVS, LENGTH),
    "ring-env-major": lambda: EnvRingStorage(NUM_ENVS, LENGTH, time_major=False),
    "episodic": lambda: EpisodicEnvRingStorage(NUM_ENVS, LENGTH, record_episodic_return=True),
    "dedup": lambda: DedupEnvRingStorage(NUM_ENVS, LENGTH),
    "dedup-stacked": lambda: DedupEnvRingStorage(NUM_ENVS, LENGTH, num_stack=2),
}


def _steps(first: int, steps: int | None) -> TensorDict:
    """Steps ``first, first + 1, ...`` of every env (``[E]``, or ``[E, steps]``): ``reward`` is
    ``10 * env + step``; ``obs`` and the frames of ``observation`` hold no elements."""
    shape = [NUM_ENVS] if steps is None else [NUM_ENVS, steps]
    t = torch.arange(first, first + (steps or 1)).float()
    reward = (10 * torch.arange(NUM_ENVS).float().unsqueeze(1) + t).reshape(shape)
    return TensorDict({
        "obs": torch.zeros(*shape, 2, 0),
        "observation": torch.zeros(*shape, 2, 0),  # num_stack=2 frames of [0] along stack_dim 0
        "reward": reward,
        "step_type": torch.ones(shape, dtype=torch.long),
        "discount": torch.ones(shape),
        "next": {"observation": torch.zeros(*shape, 2, 0), "done": torch.zeros(*shape, 1, dtype=torch.bool)},
    }, shape)


@pytest.mark.parametrize("steps", [None, 2], ids=["[E]", "[E, T]"])
@pytest.mark.parametrize("ring", RINGS)
def test_ring_storages_store_a_leaf_with_empty_items(ring, steps):
    rb = EnvRingReplayBuffer(storage=RINGS[ring](), sampler=TrajectorySampler(2), batch_size=2)
    written = 0
    for _ in range(3):
        rb.extend(_steps(written, steps))
        written += steps or 1
    assert rb.storage.current_size.tolist() == [written] * NUM_ENVS
    data, start = rb.gather_all()
    assert start.tolist() == [0] * NUM_ENVS
    # By hand: env e's step t has reward 10 e + t.
    assert data["reward"].tolist() == [[10.0 * e + t for t in range(written)] for e in range(NUM_ENVS)]
    assert data["obs"].shape == (NUM_ENVS, written, 2, 0)
    assert data["observation"].shape == data["next", "observation"].shape == (NUM_ENVS, written, 2, 0)
    assert rb.storage.flat_leaf("obs").shape == (NUM_ENVS * LENGTH, 2, 0)
    assert rb.sample()["obs"].shape == (2, 2, 2, 0)


def test_a_ring_with_empty_items_stores_what_flat_storages_store():
    """The same batches in an EnvRingStorage, FastTensorStorage and TorchRL's LazyTensorStorage."""
    ring = EnvRingReplayBuffer(storage=EnvRingStorage(NUM_ENVS, 5), sampler=TrajectorySampler(2), batch_size=2)
    flats = [TensorDictReplayBuffer(storage=storage, batch_size=2)
             for storage in (FastTensorStorage(10), LazyTensorStorage(10))]
    for step in range(3):
        batch = _steps(step, None).select("obs", "reward")
        ring.extend(batch)
        for rb in flats:
            rb.extend(batch)
    stored = ring.gather_all()[0].transpose(0, 1).reshape(-1)  # step-major, as the flat rows
    for rb in flats:
        assert torch.equal(rb[:]["reward"], stored["reward"])
        assert rb[:]["obs"].shape == stored["obs"].shape == (9, 2, 0)


def test_a_first_write_that_fails_leaves_the_ring_unallocated():
    storage = EnvRingStorage(NUM_ENVS, 5)
    step = _steps(0, None).select("obs", "reward")
    # write_at takes coordinates already checked: env 99 has no row, so the copy fails after
    # the leaves were made.
    with pytest.raises((IndexError, RuntimeError)):
        storage.write_at(torch.tensor([0, 1, 99]), torch.zeros(3, dtype=torch.long), step, set_cursor=True)
    assert not storage.initialized
    assert storage.flat_leaves == [] and not storage.stores_leaf("obs")
    assert storage.last_written_rows is None
    # The next write allocates from its own batch, of other shapes.
    other = TensorDict({"x": torch.arange(3.0).unsqueeze(1)}, [3])
    storage.set((torch.arange(3), torch.zeros(3, dtype=torch.long)), other)
    storage.advance(None, 1)
    assert storage.gather_all()[0]["x"].flatten().tolist() == [0.0, 1.0, 2.0]
    assert not storage.stores_leaf("obs")


@pytest.mark.parametrize("write", ["extend", "add"])
def test_fast_memmap_storage_refuses_empty_items_before_anything_changes(tmp_path, write):
    rb = TensorDictReplayBuffer(storage=FastMemmapStorage(10, scratch_dir=tmp_path), batch_size=2)
    bad = TensorDict({"obs": torch.zeros(4, 2, 0), "reward": torch.arange(4.0)}, [4])
    with pytest.raises(StorageLayoutError, match=r"key 'obs' has items of shape \[2, 0\], with no elements.*"
                                                 r"leave it out \(data.exclude\('obs'\)\) or use FastTensorStorage"):
        getattr(rb, write)(bad if write == "extend" else bad[0])
    assert not rb.storage.initialized and len(rb) == 0 and rb.write_count == 0
    rb.extend(bad.exclude("obs"))
    assert rb[:]["reward"].tolist() == [0.0, 1.0, 2.0, 3.0]  # from row 0: the writer did not move
