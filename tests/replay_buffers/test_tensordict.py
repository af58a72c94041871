"""PrioritizedReplayBuffer: lean paths return what TorchRL's would, fallbacks, checkpoints."""
from __future__ import annotations

import math
import pickle
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.envs.transforms import Transform

from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
from torchrl_ext.samplers import PrioritizedSampler
from torchrl_ext.storages import FastTensorStorage

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def transitions(n: int, device: str = "cpu") -> TensorDict:
    obs = torch.arange(n, dtype=torch.float32, device=device).unsqueeze(-1).expand(n, 3)
    return TensorDict(
        {
            "obs": obs.clone(),
            "action": torch.arange(n, device=device) % 4,
            "next": {"obs": obs + 1, "reward": torch.ones(n, 1, device=device)},
        },
        [n],
        device=device,
    )


STORAGES = {
    "lazy_tensor": lambda n, tmp: LazyTensorStorage(n),
    "lazy_memmap": lambda n, tmp: LazyMemmapStorage(n, scratch_dir=tmp),
    "list": lambda n, tmp: ListStorage(n),  # not a tensor storage: TorchRL's own path
}


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("replacement", [True, False])
def test_samples_are_the_stored_rows(storage, replacement, tmp_path):
    rb = PrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, storage=STORAGES[storage](50, tmp_path), replacement=replacement
    )
    rb.extend(transitions(40))
    batch = rb.sample(32)
    index = batch["index"]
    assert int(index.max()) < 40
    assert torch.equal(batch["obs"][:, 0], index.float())
    assert torch.equal(batch["next", "obs"][:, 0], index.float() + 1)
    assert torch.equal(batch["action"], index % 4)
    weight = batch["priority_weight"]
    assert weight.shape == (32,) and bool(((weight > 0) & (weight <= 1)).all())


@pytest.mark.parametrize("device", DEVICES)
def test_device(device):
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(20, device=device))
    rb.extend(transitions(20, device))
    batch = rb.sample(8)
    assert batch.device.type == device and batch["index"].device.type == device
    assert torch.equal(batch["obs"][:, 0], batch["index"].float())


def test_return_info_and_default_batch_size():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(transitions(10))
    data, info = rb.sample(return_info=True)
    assert set(info) == {"index", "priority_weight"}
    assert torch.equal(data["index"], info["index"])
    with pytest.warns(UserWarning, match="conflicting batch_sizes"):
        assert rb.sample(6).shape == (6,)


def test_sampling_without_batch_size_is_torchrls_error():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10))
    rb.extend(transitions(10))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()


def test_sampling_an_empty_buffer_raises():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10))
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample(4)


class DoubleObs(Transform):
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set("obs", tensordict["obs"] * 2)


def test_transforms_run_on_the_lean_path():
    rb = PrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), transform=DoubleObs()
    )
    rb.extend(transitions(10))
    batch = rb.sample(5)
    assert torch.equal(batch["obs"][:, 0], 2 * batch["index"].float())


def test_prefetch_falls_back_to_torchrl():
    rb = PrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), batch_size=4, prefetch=2
    )
    rb.extend(transitions(10))
    for _ in range(3):
        batch = rb.sample()
        assert torch.equal(batch["obs"][:, 0], batch["index"].float())


def test_two_dimensional_storage_uses_torchrls_path():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(12, ndim=2))
    rb.extend(transitions(12).reshape(3, 4))
    batch = rb.sample(6)
    assert batch["index"].shape == (6, 2)
    batch["td_error"] = torch.full((6,), 3.0)
    rb.update_tensordict_priority(batch)


# --------------------------------------------------------------------------- priorities
def test_priority_write_back_from_the_batch():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.4, eps=0.0, storage=LazyTensorStorage(10))
    rb.extend(transitions(10))
    batch = rb.sample(16)
    batch["td_error"] = batch["index"].float() + 1
    rb.update_tensordict_priority(batch)
    stored = rb.sampler.tree[batch["index"]]
    assert torch.equal(stored, batch["index"].float() + 1)


def test_per_agent_priorities_are_reduced_with_max():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.4, eps=0.0, storage=LazyTensorStorage(10))
    rb.extend(transitions(10))
    batch = rb[torch.tensor([2, 5])]
    batch["td_error"] = torch.tensor([[1.0, 7.0, 3.0], [0.5, 0.25, 2.0]])
    batch["index"] = torch.tensor([2, 5])
    rb.update_tensordict_priority(batch)
    assert rb.sampler.tree[torch.tensor([2, 5])].tolist() == [7.0, 2.0]


def test_missing_priority_gives_the_default_priority():
    rb = PrioritizedReplayBuffer(
        alpha=1.0, beta=0.4, eps=0.0, storage=LazyTensorStorage(10), initial_priority=3.0
    )
    rb.extend(transitions(10))
    rb.update_priority(torch.tensor([0]), torch.tensor([0.5]))
    batch = rb[torch.tensor([0])]
    batch["index"] = torch.tensor([0])
    rb.update_tensordict_priority(batch)
    assert rb.sampler.tree[torch.tensor([0])].item() == 3.0


def test_priorities_given_at_extend_are_used():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.4, eps=0.0, storage=LazyTensorStorage(10))
    data = transitions(4)
    data["td_error"] = torch.tensor([0.0, 0.0, 5.0, 0.0])
    rb.extend(data)
    assert set(rb.sample(64)["index"].tolist()) == {2}


# --------------------------------------------------------------------------- checkpoints
def _stream(rb, steps=5):
    out = []
    for step in range(steps):
        batch = rb.sample(8)
        batch["td_error"] = torch.arange(8, dtype=torch.float32) + step
        rb.update_tensordict_priority(batch)
        out.append(batch.exclude("td_error"))
    return out


def _buffer(storage, seed):
    return PrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=storage, generator=torch.Generator().manual_seed(seed)
    )


def test_dumps_loads_resumes_the_exact_stream(tmp_path):
    original = _buffer(LazyMemmapStorage(100, scratch_dir=tmp_path / "a"), seed=0)
    original.extend(transitions(60))
    _stream(original, steps=3)
    original.dumps(tmp_path / "checkpoint")
    restored = _buffer(LazyMemmapStorage(100, scratch_dir=tmp_path / "b"), seed=99)
    restored.loads(tmp_path / "checkpoint")
    for ours, theirs in zip(_stream(original), _stream(restored)):
        assert (ours == theirs).all()


def test_state_dict_round_trip():
    original = _buffer(LazyTensorStorage(100), seed=1)
    original.extend(transitions(60))
    _stream(original, steps=2)
    restored = _buffer(LazyTensorStorage(100), seed=5)
    restored.load_state_dict(original.state_dict())
    for ours, theirs in zip(_stream(original), _stream(restored)):
        assert (ours == theirs).all()


def test_pickle_round_trip():
    rb = _buffer(LazyTensorStorage(30), seed=2)
    rb.extend(transitions(30))
    rb.sample(4)
    clone = pickle.loads(pickle.dumps(rb))
    assert torch.equal(clone.sampler.tree.leaves, rb.sampler.tree.leaves)
    batch = clone.sample(4)
    assert torch.equal(batch["obs"][:, 0], batch["index"].float())


def test_empty_resets_everything():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10))
    rb.extend(transitions(10))
    rb.empty()
    assert len(rb) == 0
    rb.extend(transitions(3))
    assert int(rb.sample(20)["index"].max()) < 3


# --------------------------------------------------------------------------- construction
def test_rejects_a_sampler_argument():
    from torchrl.data import RandomSampler

    with pytest.raises(TypeError, match="builds its own sampler"):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), sampler=RandomSampler())
    # None is what a config's unset `sampler` field passes: the buffer still builds its own.
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), sampler=None)
    assert isinstance(rb.sampler, PrioritizedSampler)


def test_rejects_a_non_storage():
    with pytest.raises(TypeError, match="storage must be a torchrl Storage"):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=[1, 2, 3])


def test_without_a_storage_it_takes_torchrls_default():
    """TorchRL's TensorDictPrioritizedReplayBuffer(alpha=, beta=) stores in ListStorage(1000)."""
    from torchrl.data import TensorDictPrioritizedReplayBuffer

    ours = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, batch_size=8)
    theirs = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, batch_size=8)
    for rb in (ours, theirs):
        assert type(rb.storage) is ListStorage and rb.storage.max_size == 1000
        rb.extend(TensorDict({"obs": torch.arange(20.0)}, [20]))
    assert len(ours) == len(theirs) == 20 and ours.sampler.max_size == 1000
    batch = ours.sample()
    assert torch.equal(batch["obs"], batch["index"].float())
    batch["td_error"] = batch["index"].float() + 1  # one priority per item, repeats included
    ours.update_tensordict_priority(batch)
    torch.testing.assert_close(ours.sampler.tree[batch["index"]], (batch["td_error"] + 1e-8) ** 0.6)


def test_accepts_a_storage_factory():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=lambda: LazyTensorStorage(7))
    assert rb.sampler.max_size == 7


def test_works_when_torchrls_compiled_extension_cannot_load():
    """Where torch and torchrl drift apart, torchrl._torchrl fails to import."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torchrl._torchrl"] = None  # any import of it now raises ImportError
        import torch
        import torchrl.data
        from tensordict import TensorDict
        from torchrl.data.replay_buffers.samplers import prioritized
        assert prioritized.SumSegmentTreeFp32 is None
        try:
            torchrl.data.PrioritizedSampler(10, 0.5, 0.5)
        except RuntimeError:
            pass
        else:
            raise SystemExit("TorchRL's own sampler should fail without its extension")
        from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
        rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4,
                                     storage=torchrl.data.LazyTensorStorage(100))
        rb.extend(TensorDict({"obs": torch.arange(100.0)}, [100]))
        batch = rb.sample(32)
        assert torch.equal(batch["obs"], batch["index"].float())
        batch["td_error"] = torch.rand(32)
        rb.update_tensordict_priority(batch)
        print("sampled without the extension")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sampled without the extension" in result.stdout


def test_no_warning_on_the_lean_path():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(transitions(10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.sample()


# --------------------------------------------------------------------------- lean generic buffer
from torchrl.data import RandomSampler, SamplerWithoutReplacement, SliceSampler  # noqa: E402
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer  # noqa: E402

from torchrl_ext.replay_buffers import TensorDictReplayBuffer  # noqa: E402

SAMPLERS = {
    "random": RandomSampler,
    "without_replacement": lambda: SamplerWithoutReplacement(drop_last=False),
    "slice": lambda: SliceSampler(num_slices=4, traj_key="episode"),
}


def episodes(n: int) -> TensorDict:
    data = transitions(n)
    data["episode"] = torch.arange(n) // 7
    return data


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("storage", [LazyTensorStorage, FastTensorStorage])
def test_lean_sample_equals_torchrls_sample(sampler, storage):
    buffers = [
        cls(
            storage=storage(60),
            sampler=SAMPLERS[sampler](),
            batch_size=16,
            generator=torch.Generator().manual_seed(7),
        )
        for cls in (TensorDictReplayBuffer, TorchRLTensorDictReplayBuffer)
    ]
    for rb in buffers:
        rb.extend(episodes(50))
    for _ in range(6):
        ours, theirs = (rb.sample() for rb in buffers)
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        assert (ours == theirs).all()


def test_an_epoch_without_replacement_has_torchrls_batches():
    batches = []
    for cls in (TensorDictReplayBuffer, TorchRLTensorDictReplayBuffer):
        rb = cls(
            storage=FastTensorStorage(30), sampler=SamplerWithoutReplacement(),
            batch_size=8, generator=torch.Generator().manual_seed(1),
        )
        rb.extend(transitions(30))
        batches.append([batch["index"].tolist() for batch in rb])
    assert batches[0] == batches[1] and len(batches[0]) == 4


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, FastTensorStorage])
@pytest.mark.parametrize(
    ("shape", "dim_extend"),
    [((2, 1), 1), ((2, 3), 1), ((4, 1), 0), ((1, 4), 0), ((4, 2), 0), ((4, 1, 1), 0), ((4, 2, 1), 1),
     ((4, 2, 3), 2), ((2, 1, 3), 2)],
)
def test_extend_a_multi_dim_storage_addresses_every_item(storage_cls, shape, dim_extend):
    """TorchRL's buffer stores the rows and then raises on batches whose dims after the first
    are all 1 ([T, 1] rollouts, [num_envs, 1]); ours stores them, and both the returned index
    and the "index" entry address each item."""
    ndim = len(shape)
    data = TensorDict({"obs": torch.arange(float(torch.Size(shape).numel())).reshape(*shape, 1)}, shape)
    rb = TensorDictReplayBuffer(storage=storage_cls(2 * data.numel(), ndim=ndim), dim_extend=dim_extend)
    index = rb.extend(data)
    assert index.shape == (data.numel(), ndim)
    # The returned rows follow the items in storage order: the extended dim first.
    expected = data.transpose(0, dim_extend).reshape(-1)
    assert torch.equal(rb.storage.get(tuple(index.unbind(-1)))["obs"], expected["obs"])
    probe = data.clone()
    rb._set_index_in_td(probe, index)  # what extend labels the batch with
    assert probe["index"].shape == (*shape, ndim)
    stored = rb.storage.get(tuple(probe["index"].reshape(-1, ndim).unbind(-1)))
    assert torch.equal(stored["obs"], data["obs"].reshape(-1, 1))


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, FastTensorStorage])
@pytest.mark.parametrize("dim_extend", [0, 1])
@pytest.mark.parametrize(("shape", "message"), [
    ((4,), r"data has batch size \[4\] but the storage has ndim=2.*add the missing dims"),
    ((4, 2, 3), r"data has batch size \[4, 2, 3\] but the storage has ndim=2.*sub-TensorDict"),
])
def test_extend_refuses_batches_of_other_dims_than_the_storage(storage_cls, dim_extend, shape, message):
    """TorchRL stores such batches and then fails on their index, or allocates a storage that
    refuses every later [T, N] write; ours refuses them first, on a fresh or a filled storage."""
    rb = TensorDictReplayBuffer(storage=storage_cls(16, ndim=2), dim_extend=dim_extend)
    bad = TensorDict({"obs": torch.zeros(*shape, 1)}, shape)
    with pytest.raises(ValueError, match=message):
        rb.extend(bad)
    assert len(rb) == 0 and rb.write_count == 0
    good = TensorDict({"obs": torch.arange(8.0).reshape(4, 2, 1)}, [4, 2])
    rb.extend(good)
    before, written = rb.storage[:].clone(), rb.write_count
    with pytest.raises(ValueError, match=message):
        rb.extend(bad)
    assert len(rb) == 8 and rb.write_count == written
    assert (rb.storage[:] == before).all()
    assert rb.sample(3)["obs"].shape == (3, 1)


@pytest.mark.parametrize("sampler_name", ["feed_forward", "naive_recurrent", "random"])
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, FastTensorStorage, LazyMemmapStorage])
def test_two_dim_storages_sample_like_torchrl(sampler_name, storage_cls):
    """Coordinates into [T, N] storages are gathered as flat rows; samples equal TorchRL's."""
    from torchrl.data import RandomSampler
    from torchrl.data import TensorDictReplayBuffer as TorchRLBuffer

    from torchrl_ext.samplers import FeedForwardMinibatchSampler, NaiveRecurrentMinibatchSampler

    make = {"feed_forward": lambda: FeedForwardMinibatchSampler(3),
            "naive_recurrent": lambda: NaiveRecurrentMinibatchSampler(2),
            "random": RandomSampler}[sampler_name]
    data = TensorDict({"obs": torch.arange(24.0).reshape(6, 4, 1), ("next", "r"): torch.arange(24).reshape(6, 4)},
                      [6, 4])
    buffers = []
    for cls in (TensorDictReplayBuffer, TorchRLBuffer):
        rb = cls(storage=storage_cls(24, ndim=2), sampler=make(), batch_size=5, dim_extend=0,
                 generator=torch.Generator().manual_seed(3))
        rb.extend(data.clone())
        buffers.append(rb)
    for _ in range(4):
        ours, theirs = (rb.sample() for rb in buffers)
        assert ours.shape == theirs.shape
        for key in ("obs", ("next", "r"), "index"):
            assert torch.equal(ours[key], theirs[key]), key


# ---------------------------------------------------------------------------
# A refused priority entry leaves nothing stored.


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, LazyTensorStorage])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_an_extend_with_a_bad_priority_stores_nothing_and_the_retry_stores_once(storage_cls, bad):
    # Was: extend stored the rows, then raised on the priority; calling again with the
    # input fixed, as the error suggests, stored the batch twice.
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage_cls(20), batch_size=4)
    rb.extend(TensorDict({"obs": torch.arange(3.0), "td_error": torch.ones(3)}, [3]))
    priority = torch.tensor([1.0, bad, 1.0])
    batch = TensorDict({"obs": torch.arange(10.0, 13.0), "td_error": priority}, [3])
    leaves = rb.sampler.tree.leaves.clone()
    # TorchRL's wording and type (RuntimeError), and a ValueError: the input is bad.
    with pytest.raises(RuntimeError, match="Failed to update priority of extended data: priority must be"):
        rb.extend(batch)
    assert len(rb) == 3 and rb.writer._cursor == 3
    assert torch.equal(rb.sampler.tree.leaves, leaves)
    with pytest.raises(ValueError, match="priority must be finite and >= 0.*Nothing was stored"):
        rb.add(TensorDict({"obs": torch.tensor(9.0), "td_error": torch.tensor(bad)}, []))
    assert len(rb) == 3 and rb.writer._cursor == 3
    batch["td_error"] = priority.nan_to_num(1.0, 1.0).abs()
    rb.extend(batch)
    assert len(rb) == 6
    assert rb[:]["obs"].tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]



@pytest.mark.parametrize("sampler_cls", [PrioritizedSampler, TorchRLPrioritizedSampler])
def test_a_prioritized_sampler_smaller_than_its_storage_is_refused_at_construction(sampler_cls):
    # Was accepted (e.g. the ext_prioritized config's default 1,000,000 under a bigger
    # storage); once the writer passed max_capacity, extend raised after storing the rows,
    # and those rows never got a priority.
    with pytest.raises(ValueError, match=r"max_capacity=50 priorities but the storage holds max_size=100 rows; "
                                         r"build the sampler with max_capacity=100"):
        TensorDictReplayBuffer(storage=FastTensorStorage(100), sampler=sampler_cls(50, 0.6, 0.4))
    TensorDictReplayBuffer(storage=FastTensorStorage(100), sampler=sampler_cls(100, 0.6, 0.4))


@pytest.mark.parametrize("sampler_cls", [PrioritizedSampler, TorchRLPrioritizedSampler])
def test_a_prioritized_sampler_smaller_than_its_two_dim_storage_is_refused_at_construction(sampler_cls):
    # Was: only 1-D storages were checked; a [T, num_envs] storage's cells past the sampler's
    # capacity were refused at the first extend, after they were stored.
    with pytest.raises(ValueError, match=r"max_capacity=50 priorities but the storage holds max_size=100 cells; "
                                         r"build the sampler with max_capacity=100"):
        TensorDictReplayBuffer(storage=LazyTensorStorage(100, ndim=2), sampler=sampler_cls(50, 0.6, 0.4))
    TensorDictReplayBuffer(storage=LazyTensorStorage(100, ndim=2), sampler=sampler_cls(100, 0.6, 0.4))


@pytest.mark.parametrize("sampler_cls", [PrioritizedSampler, TorchRLPrioritizedSampler])
def test_a_prioritized_sampler_smaller_than_the_default_storage_is_refused_at_construction(sampler_cls):
    # Was: only a storage passed in was checked. With TorchRL's default ListStorage(1000), the
    # write crossing max_capacity=5 stored its rows, moved the cursor, then raised, and the
    # rows past the first write were never sampled.
    with pytest.raises(ValueError, match=r"max_capacity=5 priorities but the storage holds max_size=1000 rows; "
                                         r"build the sampler with max_capacity=1000 \(the storage's max_size\), "
                                         r"or give a storage of max_size=5"):
        TensorDictReplayBuffer(sampler=sampler_cls(5, 0.7, 0.9), batch_size=5)
    rb = TensorDictReplayBuffer(sampler=sampler_cls(1000, 0.7, 0.9), batch_size=5)
    rb.extend(transitions(8))
    assert sorted(rb.sample(400)["index"].unique().tolist()) == list(range(8))


@pytest.mark.parametrize("shared", [False, True])
def test_empty_holds_the_buffer_locks(shared):
    # Was: TorchRL's empty takes no lock, so a sample in another thread (or a write in another
    # process) ran on a sampler and storage half reset.
    from tests.replay_buffers.test_buffer_locks import _held_by_another_thread
    from torchrl_ext import _compat

    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10))
    if shared:
        rb.share(True)  # the process lock, not reentrant, is taken once
    rb.extend(transitions(5))
    held = []
    original = rb.storage._empty

    def spy() -> None:
        held.append([_held_by_another_thread(lock) for lock in (_compat.replay_lock(rb), _compat.write_lock(rb))
                     if hasattr(lock, "acquire")])
        original()

    rb.storage._empty = spy
    rb.empty()
    assert held == [[True, True] if shared else [True]] and len(rb) == 0


@pytest.mark.parametrize("last_val, error, match", [
    (float("nan"), ValueError, r"`last_val` holds 1 NaN or infinite value\(s\) of 1; the path is still open"),
    ([1.0, 2.0], ValueError, "last_val must hold 1 value"),
    ("0", TypeError, "last_val must be a number or a tensor"),
])
def test_finish_path_refuses_a_bad_last_value_and_keeps_the_path(last_val, error, match):
    from torchrl_ext.presets import l2r_ppo_buffer

    rb = l2r_ppo_buffer(obs_dim=1, act_dim=1, size=4, batch_size=2)
    rb.store(TensorDict({"observation": torch.zeros(2, 1), "state_value": torch.ones(2, 1),
                         "next": {"reward": torch.ones(2, 1)}}, [2]))
    with pytest.raises(error, match=match):
        rb.finish_path(last_val)
    rb.finish_path(0.0)  # the path is still open: the refused call did not close it
    assert rb._finished[:2].all()


# ---------------------------------------------------------------------------- generator, batch_size types
import numpy as np  # noqa: E402

from torchrl_ext.replay_buffers import EnvRingReplayBuffer  # noqa: E402


@pytest.mark.parametrize("bad", [3, "seed", np.random.default_rng(0)])
def test_a_generator_that_is_not_a_torch_generator_is_refused_where_given(bad):
    # Was: kept, and the first sample() failed inside torch with a TypeError naming no argument.
    pattern = rf"generator must be a torch\.Generator or None, got generator={re.escape(repr(bad))}"
    for build in (lambda: TensorDictReplayBuffer(storage=FastTensorStorage(8), generator=bad),
                  lambda: PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(8), generator=bad),
                  lambda: EnvRingReplayBuffer(num_envs=2, max_length=4, generator=bad)):
        with pytest.raises(TypeError, match=pattern):
            build()
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8), batch_size=2)
    rb.extend(transitions(8))
    with pytest.raises(TypeError, match=pattern):
        rb.set_rng(bad)
    rb.sample()  # the refused generator was not installed


@pytest.mark.parametrize("size", [np.int64(5), np.int32(5), torch.tensor(5)])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_sample_takes_an_integer_of_another_type_as_torchrl_does(size, batch_size):
    # Was: "batch_size must be an int >= 0, got batch_size=np.int64(5)"; TorchRL samples it.
    def drawn(cls, n):
        rb = cls(storage=LazyTensorStorage(20), batch_size=batch_size, generator=torch.Generator().manual_seed(4))
        rb.extend(transitions(20))
        return rb.sample(n)["index"]

    expected = drawn(TorchRLTensorDictReplayBuffer, 5)
    assert torch.equal(drawn(TorchRLTensorDictReplayBuffer, size), expected)
    assert torch.equal(drawn(TensorDictReplayBuffer, size), expected)
    rb = EnvRingReplayBuffer(num_envs=2, max_length=6, generator=torch.Generator().manual_seed(4))
    rb.extend(TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, [2, 3]))
    assert rb.sample(size).shape[0] == 5


@pytest.mark.parametrize("bad", [True, torch.tensor(True), torch.tensor([5]), 5.0])
def test_sample_still_refuses_what_is_not_a_count(bad):
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8))
    rb.extend(transitions(8))
    with pytest.raises(ValueError, match=rf"batch_size must be an int >= 0, got batch_size={re.escape(repr(bad))}\.$"):
        rb.sample(bad)
