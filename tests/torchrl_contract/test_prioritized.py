"""TorchRL's prioritized sampler and buffer against torchrl_ext's: checkpoints move between them
with their priorities, and the write-back calls TorchRL's scripts make are accepted."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler

from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
from torchrl_ext.samplers import PrioritizedSampler

CAPACITY, STORED = 16, 10
PRIORITIES = torch.tensor([3.0, 0.5, 1.0, 7.0, 2.0, 0.25, 4.0, 1.5, 9.0, 6.0])


def weights_by_index(sampler, storage, draws: int = 4_000) -> dict[int, float]:
    """The importance weight each stored index gets when drawn."""
    index, info = sampler.sample(storage, draws)
    return {int(i): float(w) for i, w in zip(index.tolist(), info["priority_weight"].tolist())}


def filled_storage() -> LazyTensorStorage:
    storage = LazyTensorStorage(CAPACITY)
    storage.set(torch.arange(STORED), TensorDict({"obs": torch.arange(float(STORED))}, [STORED]))
    return storage


def torchrl_sampler(alpha: float = 0.7, beta: float = 0.5) -> TorchRLPrioritizedSampler:
    sampler = TorchRLPrioritizedSampler(CAPACITY, alpha, beta)
    sampler.update_priority(torch.arange(STORED), PRIORITIES)
    return sampler


def assert_same_weights(reference, ours, storage) -> None:
    torch.manual_seed(0)
    expected = weights_by_index(reference, storage)
    got = weights_by_index(ours, storage)
    assert set(got) == set(expected) == set(range(STORED))
    for index, weight in expected.items():
        assert got[index] == pytest.approx(weight, rel=1e-5), index


def test_a_torchrl_sampler_state_dict_loads_with_its_priorities():
    reference = torchrl_sampler()
    ours = PrioritizedSampler(CAPACITY, 0.1, 0.1)  # alpha, beta and eps come from the checkpoint
    ours.load_state_dict(reference.state_dict())
    assert (ours.alpha, ours.beta) == (pytest.approx(0.7), pytest.approx(0.5))
    assert_same_weights(reference, ours, filled_storage())
    # New items get the checkpoint's max priority, as in TorchRL's sampler.
    reference.mark_update(torch.tensor([STORED]))
    ours.mark_update(torch.tensor([STORED]))
    assert ours.default_priority == pytest.approx(float(reference.default_priority))


def test_a_torchrl_sampler_folder_loads_with_its_priorities(tmp_path):
    reference = torchrl_sampler()
    reference.dumps(tmp_path / "sampler")
    ours = PrioritizedSampler(CAPACITY, 0.1, 0.1)
    ours.loads(tmp_path / "sampler")
    assert_same_weights(reference, ours, filled_storage())


def test_a_torchrl_buffer_checkpoint_loads_into_the_prioritized_buffer(tmp_path):
    reference = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY),
                                                  batch_size=8)
    reference.extend(TensorDict({"obs": torch.arange(float(STORED))}, [STORED]))
    reference.update_priority(torch.arange(STORED), PRIORITIES)
    reference.dumps(tmp_path / "rb")
    ours = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY), batch_size=8)
    ours.loads(tmp_path / "rb")
    assert len(ours) == STORED
    assert_same_weights(reference.sampler, ours.sampler, ours.storage)
    batch = ours.sample()
    assert torch.equal(batch["obs"], batch["index"].float())


# TorchRL's state_dict holds its C++ trees, sized to the power of two above max_capacity: it
# cannot tell 16 from 17 (17 then loads it, its last item unwritten); its folders record it.
@pytest.mark.parametrize("capacity,how", [(8, "state_dict"), (8, "folder"), (17, "folder")])
def test_a_torchrl_checkpoint_of_another_capacity_is_refused(capacity, how, tmp_path):
    reference = torchrl_sampler()
    reference.dumps(tmp_path / "sampler")
    ours = PrioritizedSampler(capacity, 0.7, 0.5)
    before = ours.state_dict()["_sum_tree"]
    with pytest.raises(ValueError, match=f"priorities but this sampler has max_capacity={capacity}"):
        if how == "state_dict":
            ours.load_state_dict(reference.state_dict())
        else:
            ours.loads(tmp_path / "sampler")
    after = ours.state_dict()["_sum_tree"]
    assert before.keys() == after.keys() and all(torch.equal(a, b) for a, b in zip(before["levels"], after["levels"]))


def test_update_priority_with_a_sampled_batch():
    """``rb.update_priority(batch)``, as TorchRL's reference scripts write it back."""
    buffers = []
    for write_back in ("update_priority", "update_tensordict_priority"):
        rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY), batch_size=4)
        rb.extend(TensorDict({"obs": torch.arange(float(STORED))}, [STORED]))
        batch = TensorDict({"index": torch.tensor([1, 3, 8]), "td_error": torch.tensor([5.0, 0.1, 2.0])}, [3])
        getattr(rb, write_back)(batch)
        buffers.append(rb)
    assert torch.equal(buffers[0].sampler.tree.leaves, buffers[1].sampler.tree.leaves)
    with pytest.raises(TypeError, match="update_priority needs a priority"):
        buffers[0].update_priority(torch.tensor([1]))


def test_a_beta_above_one_survives_a_checkpoint(tmp_path):
    sampler = PrioritizedSampler(CAPACITY, 0.7, 2.0)
    sampler.update_priority(torch.arange(STORED), PRIORITIES)
    sampler.dumps(tmp_path / "s")
    restored = PrioritizedSampler(CAPACITY, 0.7, 2.0)
    restored.loads(tmp_path / "s")
    assert restored.beta == 2.0
    assert_same_weights(sampler, restored, filled_storage())


@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize("unit", [None, "sequence"])
def test_buffer_arguments_torchrl_accepts(sync, unit):
    """``sync``, ``sample_unit``, ``transport``, ``shared``, ``compilable``, ``sampler_device``:
    the same batches' layout and keys from both classes."""
    from torchrl.data.replay_buffers.sample_units import Sequence

    batches = []
    for cls in (TensorDictPrioritizedReplayBuffer, PrioritizedReplayBuffer):
        rb = cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY), batch_size=4, sync=sync,
                 sample_unit=None if unit is None else Sequence(length=3), transport="auto", shared=False,
                 compilable=False, sampler_device="cpu")
        done = torch.zeros(STORED, dtype=torch.bool)
        done[4] = True
        rb.extend(TensorDict({"obs": torch.arange(float(STORED)), ("next", "done"): done}, [STORED]))
        rb.update_priority(torch.arange(STORED), PRIORITIES)
        torch.manual_seed(0)
        batch = rb.sample()
        assert torch.equal(batch["obs"], batch["index"].float())
        batch["td_error"] = torch.rand(batch.shape)
        rb.update_tensordict_priority(batch)
        batches.append(batch)
        assert rb.prioritized_sampler is not None
    reference, ours = batches
    assert reference.batch_size == ours.batch_size
    assert sorted(map(str, reference.keys(True))) == sorted(map(str, ours.keys(True)))


def test_sync_must_be_a_bool():
    with pytest.raises(TypeError, match="sync must be True or False, got 'no'"):
        PrioritizedReplayBuffer(alpha=0.7, beta=0.5, sync="no")


@pytest.mark.parametrize("within", [False, True])
@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_new_data_gets_torchrls_default_priority(within, alpha):
    """Drop-in: after any sequence of writes and priority updates (below and above 1), new rows
    get the priority TorchRL's sampler gives them, with and without max_priority_within_buffer."""
    generator = torch.Generator().manual_seed(0)
    samplers = [cls(8, alpha, 0.4, eps=0.0, max_priority_within_buffer=within)
                for cls in (TorchRLPrioritizedSampler, PrioritizedSampler)]
    buffers = [TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler) for sampler in samplers]
    for step in range(12):
        rows = torch.randint(1, 4, (), generator=generator).item()
        written = [rb.extend(TensorDict({"obs": torch.zeros(rows)}, [rows])) for rb in buffers]
        scale = 0.5 if step < 6 else 3.0  # first below TorchRL's 1.0, then above it
        priority = torch.rand(rows, generator=generator) * scale
        for rb, index in zip(buffers, written):
            rb.update_priority(index, priority)
        reference, ours = (float(s.default_priority) for s in samplers)
        assert ours == pytest.approx(reference, rel=1e-5), step
