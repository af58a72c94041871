"""FastTensorStorage / FastMemmapStorage: TorchRL's storages' contents, faster paths, strict writes."""
from __future__ import annotations

import logging
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)

from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, StorageLayoutError
from torchrl_ext.storages._gathers import select_rows

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def chunk(start: int, n: int, device: str = "cpu") -> TensorDict:
    """Transitions numbered start ... start + n - 1 in every field."""
    step = torch.arange(start, start + n, device=device)
    return TensorDict(
        {
            "obs": step.float().unsqueeze(-1).expand(n, 3).clone(),
            "pixels": (step % 256).to(torch.uint8).view(n, 1, 1).expand(n, 4, 4).clone(),
            "next": {"obs": step.float().unsqueeze(-1) + 1, "done": step % 7 == 0},
        },
        [n],
        device=device,
    )


def assert_same_storage(fast, plain):
    assert len(fast) == len(plain)
    for key, value in plain._storage.items(include_nested=True, leaves_only=True):
        assert torch.equal(fast._storage[key][: len(plain)], value[: len(plain)]), key


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 40),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    seed=st.integers(0, 1000),
)
def test_same_contents_and_samples_as_torchrls_storage(capacity, sizes, seed):
    sizes = [min(n, capacity) for n in sizes]
    fast = TensorDictReplayBuffer(storage=FastTensorStorage(capacity))
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    written = 0
    for n in sizes:
        assert torch.equal(fast.extend(chunk(written, n)), plain.extend(chunk(written, n)))
        written += n
        assert_same_storage(fast.storage, plain.storage)
    index = torch.randint(0, len(plain), (17,), generator=torch.Generator().manual_seed(seed))
    assert (fast.storage.get(index) == plain.storage.get(index)).all()


def test_plain_tensor_buffers():
    fast, plain = ReplayBuffer(storage=FastTensorStorage(5)), ReplayBuffer(storage=LazyTensorStorage(5))
    for start in (0, 3, 6):
        data = torch.arange(start, start + 3).float()
        fast.extend(data)
        plain.extend(data)
    assert torch.equal(fast.storage._storage, plain.storage._storage)
    index = torch.tensor([4, 0, 2])
    assert torch.equal(fast.storage.get(index), plain.storage.get(index))


@pytest.mark.parametrize(
    "index", [torch.tensor([-1, 0]), 2, slice(1, 3), [0, 2], torch.tensor([[0, 1]])]
)
def test_other_indices_behave_like_torchrl(index):
    fast, plain = FastTensorStorage(10), LazyTensorStorage(10)
    for storage in (fast, plain):
        TensorDictReplayBuffer(storage=storage).extend(chunk(0, 6))
    assert (fast.get(index) == plain.get(index)).all()


def test_index_beyond_the_filled_part_is_torchrls_error():
    storage = FastTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(chunk(0, 4))
    with pytest.raises(IndexError):
        storage.get(torch.tensor([1, 7]))


def test_non_ring_cursor_uses_torchrls_write():
    fast, plain = FastTensorStorage(8), LazyTensorStorage(8)
    for storage in (fast, plain):
        storage.set(torch.arange(8), chunk(0, 8))
        storage.set(torch.tensor([5, 1, 6]), chunk(100, 3))
    assert_same_storage(fast, plain)


@pytest.mark.parametrize("device", DEVICES)
def test_device(device):
    storage = FastTensorStorage(6, device=device)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(chunk(0, 4, device))
    rb.extend(chunk(4, 4, device))  # wraps
    out = storage.get(torch.tensor([0, 1], device=device))
    assert out.device.type == device and out["obs"][:, 0].tolist() == [6.0, 7.0]


def test_memmap_and_in_memory_give_identical_samples(tmp_path):
    buffers = [
        TensorDictReplayBuffer(
            storage=storage, batch_size=16, generator=torch.Generator().manual_seed(3)
        )
        for storage in (FastTensorStorage(50), FastMemmapStorage(50, scratch_dir=tmp_path))
    ]
    for rb in buffers:
        for start in range(0, 120, 30):
            rb.extend(chunk(start, 30))
    for _ in range(5):
        assert (buffers[0].sample() == buffers[1].sample()).all()


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, FastMemmapStorage])
def test_checkpoint_round_trip(storage_cls, tmp_path):
    def make(seed):
        kwargs = {"scratch_dir": tmp_path / f"s{seed}"} if storage_cls is FastMemmapStorage else {}
        return TensorDictReplayBuffer(
            storage=storage_cls(40, **kwargs), batch_size=8,
            generator=torch.Generator().manual_seed(seed),
        )

    original = make(0)
    original.extend(chunk(0, 30))
    original.extend(chunk(30, 25))  # wraps
    original.dumps(tmp_path / "ckpt")
    restored = make(1)
    restored.loads(tmp_path / "ckpt")
    assert_same_storage(restored.storage, original.storage)
    for _ in range(3):
        assert (original.sample() == restored.sample()).all()
    restored.extend(chunk(55, 10))
    original.extend(chunk(55, 10))
    assert_same_storage(restored.storage, original.storage)


def test_shared_memory_writes_are_visible():
    storage = FastTensorStorage(10)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(chunk(0, 4))
    storage._storage.share_memory_()
    rb.extend(chunk(4, 8))  # a wrapping write into shared memory
    assert storage._storage.is_shared()
    assert storage.get(torch.tensor([0, 1, 2]))["obs"][:, 0].tolist() == [10.0, 11.0, 2.0]


# --------------------------------------------------------------------------- bad input
#: Refused by every fast storage; the three marked "strict" only with strict=True (TorchRL's
#: storages accept them, and so do the default ones: tests/torchrl_contract).
STRICT_ONLY = {"extra key", "missing key", "too large"}
BAD_WRITES = {
    "extra key": (chunk(10, 3).set("extra", torch.ones(3)), ValueError, "extra: \\['extra'\\]"),
    "missing key": (chunk(10, 3).exclude("pixels"), ValueError, "missing: \\['pixels'\\]"),
    "shape": (chunk(10, 3).set("obs", torch.ones(3, 5)), ValueError, r"'obs': stored items have shape \[3\]"),
    "dtype": (chunk(10, 3).set("obs", torch.ones(3, 3, dtype=torch.float64)), ValueError, "stored dtype"),
    "too large": (chunk(10, 11), ValueError, "capacity 10; extend in chunks"),
    # TensorDict's own leaf listing omits non-tensor entries: they were once dropped without a word.
    "non-tensor entry": (chunk(10, 3).set_non_tensor("tag", "a"), TypeError,
                         r"non-tensor entries \['tag'\]; FastTensorStorage stores tensors only"),
    "nested non-tensor entry": (chunk(10, 3).set_non_tensor(("next", "tag"), "a"), TypeError,
                                r"non-tensor entries \[\('next', 'tag'\)\]"),
}


@pytest.mark.parametrize("case", BAD_WRITES)
def test_bad_writes_raise_before_touching_stored_data(case):
    data, error, match = BAD_WRITES[case]
    storage = FastTensorStorage(10, strict=case in STRICT_ONLY)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(chunk(0, 8))
    before = storage._storage.clone()
    with pytest.raises(error, match=match):
        rb.extend(data)  # would wrap around: two slices, neither may be written
    # Rows 8-9 were never written and may hold NaN garbage, hence equal_nan.
    for key, value in before.items(include_nested=True, leaves_only=True):
        torch.testing.assert_close(storage._storage[key], value, rtol=0, atol=0, equal_nan=True)
    assert len(storage) == 8



@pytest.mark.parametrize("buffer", ["torchrl_ext", "torchrl"])
@pytest.mark.parametrize("case", BAD_WRITES)
def test_the_write_after_a_refused_one_lands_at_the_old_cursor(case, buffer):
    """TorchRL's writer moves its cursor before the storage checks; the storage (and
    torchrl_ext's buffer) put it back, so the next write fills the next row."""
    from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer

    data, error, match = BAD_WRITES[case]
    cls = ExtTensorDictReplayBuffer if buffer == "torchrl_ext" else TensorDictReplayBuffer
    rb = cls(storage=FastTensorStorage(10, strict=case in STRICT_ONLY))
    rb.extend(chunk(0, 8))
    with pytest.raises(error, match=match):
        rb.extend(data)
    assert rb.writer._cursor == 8 and rb.write_count == 8
    rb.extend(chunk(100, 1))
    assert len(rb) == 9
    assert rb.storage.get(torch.arange(9))["obs"][:, 0].tolist() == [*range(8), 100]


def test_a_refused_add_on_torchrls_buffer_leaves_the_cursor():
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(10))
    rb.extend(chunk(0, 3))
    with pytest.raises(ValueError, match="stored dtype"):
        rb.add(chunk(50, 1)[0].set("obs", torch.ones(3, dtype=torch.float64)))
    assert rb.writer._cursor == 3 and rb.write_count == 3
    rb.add(chunk(100, 1)[0])
    assert rb.storage.get(torch.arange(4))["obs"][:, 0].tolist() == [0, 1, 2, 100]

@pytest.mark.parametrize("key", ["tag", ("next", "tag")])
def test_a_first_batch_with_non_tensor_entries_is_rejected(key):
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(10))
    with pytest.raises(TypeError, match="non-tensor entries .*Drop them"):
        rb.extend(chunk(0, 3).set_non_tensor(key, "a"))
    assert len(rb) == 0 and not rb.storage.initialized
    rb.extend(chunk(0, 3))
    assert rb.storage.get(torch.arange(3))["obs"][:, 0].tolist() == [0, 1, 2]


def test_a_first_batch_larger_than_the_capacity_is_rejected_when_strict():
    with pytest.raises(ValueError, match="capacity 4"):
        TensorDictReplayBuffer(storage=FastTensorStorage(4, strict=True)).extend(chunk(0, 5))


def test_a_first_batch_larger_than_the_capacity_keeps_its_last_rows():
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(4))
    rb.extend(chunk(0, 5))
    assert rb.storage.get(torch.arange(4))["obs"][:, 0].tolist() == [4.0, 1.0, 2.0, 3.0]


@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_gathers_equal_tensordicts_own_indexing(n_rows, seed):
    """gather_rows / gather_coordinates (unchecked constructor) == TensorDict indexing + set."""
    from torchrl_ext.storages._gathers import gather_coordinates, gather_rows

    g = torch.Generator().manual_seed(seed)
    stored = TensorDict({"obs": torch.randn(7, 3, 2, generator=g), ("next", "obs"): torch.randn(7, 3, 2, generator=g),
                         ("next", "deep", "done"): torch.rand(7, 3, generator=g) < 0.5}, [7, 3])
    rows, cols = torch.randint(7, (n_rows,), generator=g), torch.randint(3, (n_rows,), generator=g)
    extra = {"index": torch.stack([rows, cols], -1)}
    expected = stored[rows, cols]
    expected.set("index", extra["index"])
    got = gather_coordinates(stored, (rows, cols), extra=dict(extra))
    assert got.batch_size == expected.batch_size and (got == expected).all()
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    flat = stored.reshape(-1)
    got_rows = gather_rows(flat, rows * 3 + cols, extra=dict(extra))
    assert (got_rows == expected).all() and got_rows["next"].batch_size == torch.Size([n_rows])


def test_sampler_info_of_the_wrong_shape_is_named():
    from torchrl_ext.storages._gathers import gather_rows

    stored = TensorDict({"obs": torch.arange(5.0)}, [5])
    with pytest.raises(ValueError, match=r"sampler info 'weight' has shape \[3\].*batch size \[2\]"):
        gather_rows(stored, torch.tensor([0, 1]), extra={"weight": torch.ones(3)})


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bool, torch.bfloat16])
def test_select_rows_of_huge_outputs_equals_index_select(dtype):
    source = (torch.arange(3 * 2**18) % 251).reshape(3, 2**18).to(dtype)  # rows of 256 Ki items
    index = torch.tensor([2, 0, 1, 2] * 40)  # >= 40 MiB out for 1-byte items: numpy-allocated
    out = select_rows(source, index)
    expected = source.index_select(0, index)
    assert out.dtype == dtype and out.shape == expected.shape and torch.equal(out, expected)
    small = select_rows(source, index[:3])
    assert torch.equal(small, source.index_select(0, index[:3]))


# ---------------------------------------------------------------------------
# Writes of the buffer's own rows, settings, autograd history.

FAST = [FastTensorStorage, FastMemmapStorage]


@pytest.mark.parametrize("buffer_cls", [TensorDictReplayBuffer, ExtTensorDictReplayBuffer])
@pytest.mark.parametrize("storage_cls", FAST)
@pytest.mark.parametrize("cursor, rows", [(5, slice(3, 10)), (3, slice(2, 5)), (8, slice(0, 4)), (0, slice(1, 10))])
def test_extending_with_a_view_of_the_buffer_itself_stores_the_viewed_rows(buffer_cls, storage_cls, cursor, rows):
    # Was: capacity 10, cursor 5, rb.extend(rb[3:10]) stored [6, 7, ...] at rows 0-1: the
    # first slice copy overwrote rows the second one read.
    rb = buffer_cls(storage=storage_cls(10), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
    if cursor:
        rb.extend(TensorDict({"obs": torch.arange(100.0, 100.0 + cursor)}, [cursor]))
    expected = rb[:]["obs"].clone()
    view = rb[rows]
    viewed = view["obs"].clone()
    expected[(cursor + torch.arange(len(viewed))) % 10] = viewed
    rb.extend(view.exclude("index"))
    assert torch.equal(rb[:]["obs"], expected)


@pytest.mark.parametrize("storage_cls", FAST)
@pytest.mark.parametrize("max_size", [0, -1, 2.5, True, "10"])
def test_a_capacity_that_is_not_a_positive_int_is_refused(storage_cls, max_size):
    # FastTensorStorage(0) failed at the first write with a ZeroDivisionError; -1 was accepted.
    with pytest.raises(ValueError, match=f"max_size must be an int >= 1, got max_size={max_size!r}"):
        storage_cls(max_size)


@pytest.mark.parametrize("storage_cls", [*FAST, LazyTensorStorage])
def test_samples_of_rows_stored_with_autograd_history_work_as_in_torchrl(storage_cls):
    # Was: when the first batch carried autograd history, every sample of 1 MiB or more
    # raised "index_select(): functions with out=... arguments don't support automatic
    # differentiation". TorchRL's LazyTensorStorage samples such rows.
    weight = torch.ones(1, requires_grad=True)
    obs = torch.randn(100, 2048) * weight
    reference = TensorDictReplayBuffer(storage=LazyTensorStorage(1000), batch_size=256)
    rb = ExtTensorDictReplayBuffer(storage=storage_cls(1000), batch_size=256)
    for buffer in (reference, rb):
        buffer.extend(TensorDict({"obs": obs}, [100]))
    index = torch.randint(100, (256,))
    got, want = rb.storage.get(index), reference.storage.get(index)
    assert got["obs"].requires_grad == want["obs"].requires_grad
    assert torch.equal(got["obs"].detach(), want["obs"].detach())
    assert rb.sample()["obs"].shape == (256, 2048)


# ---------------------------------------------------------------------------
# Nothing derived from the stored leaves outlives them.


def test_samples_follow_leaves_replaced_or_added_in_the_stored_tensordict():
    # Was: the buffer kept the stored TensorDict's leaf list while the TensorDict object
    # stayed the same, so a replaced leaf, memmap_() or a key TorchRL's storage added later
    # was sampled stale or not at all.
    rb = ExtTensorDictReplayBuffer(storage=FastTensorStorage(4), batch_size=4)
    rb.extend(TensorDict({"obs": torch.zeros(4)}, [4]))
    rb.sample()
    rb.storage._storage.set("obs", torch.full((4,), 5.0))  # same TensorDict, new leaf
    assert rb.sample()["obs"].tolist() == [5.0] * 4
    lazy = ExtTensorDictReplayBuffer(storage=LazyTensorStorage(4), batch_size=4)
    lazy.extend(TensorDict({"a": torch.zeros(2)}, [2]))
    lazy.sample()
    lazy.extend(TensorDict({"a": torch.ones(2), "b": torch.ones(2)}, [2]))  # TorchRL adds "b"
    assert "b" in lazy.sample().keys()


def test_a_load_that_adds_a_key_keeps_writes_strict():
    # Was: the stored layout was cached per stored TensorDict; load_state_dict loads into
    # the same one (adding "b"), and a later write without "b" was accepted, leaving stale rows.
    donor = FastTensorStorage(4)
    donor.set(torch.arange(4), TensorDict({"a": torch.zeros(4), "b": torch.full((4,), 9.0)}, [4]))
    storage = FastTensorStorage(4, strict=True)
    storage.set(torch.arange(4), TensorDict({"a": torch.zeros(4)}, [4]))
    storage.set(0, TensorDict({"a": torch.tensor(0.0)}, []))
    storage.load_state_dict(donor.state_dict())
    with pytest.raises(ValueError, match=r"data keys differ from the stored keys \(missing: \['b'\]"):
        storage.set(torch.arange(4), TensorDict({"a": torch.ones(4)}, [4]))


@pytest.mark.parametrize("storage_cls", FAST)
def test_a_zero_row_extend_keeps_the_buffer_checkpointable(storage_cls, tmp_path):
    # TorchRL records the empty cursor of a zero-row write as the last one, and its
    # checkpointer then fails on dumps (LazyTensorStorage still does).
    rb = ExtTensorDictReplayBuffer(storage=storage_cls(4), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
    assert rb.extend(TensorDict({"obs": torch.zeros(0)}, [0])).numel() == 0
    assert len(rb) == 3
    rb.dumps(tmp_path / "ckpt")
    restored = ExtTensorDictReplayBuffer(storage=storage_cls(4), batch_size=2)
    restored.loads(tmp_path / "ckpt")
    assert restored[:]["obs"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("storage_cls", FAST)
def test_a_zero_row_extend_keeps_a_two_dim_buffer_checkpointable(storage_cls, tmp_path):
    # The same on [time, env] storages, whose writes otherwise go to TorchRL's own set.
    rb = ExtTensorDictReplayBuffer(storage=storage_cls(40, ndim=2), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(8.0).view(2, 4)}, [2, 4]))
    assert rb.extend(TensorDict({"obs": torch.zeros(2, 0)}, [2, 0])).numel() == 0
    assert len(rb) == 8
    rb.dumps(tmp_path / "ckpt")
    restored = ExtTensorDictReplayBuffer(storage=storage_cls(40, ndim=2), batch_size=2)
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == 8


@pytest.mark.parametrize("ours", [True, False], ids=["torchrl_ext buffer", "torchrl buffer"])
@pytest.mark.parametrize("storage_cls", FAST)
def test_a_first_write_of_no_rows_writes_nothing(storage_cls, ours):
    # Was: IndexError from TorchRL's lazy allocation, which reads row 0 (LazyTensorStorage still fails).
    buffer_cls = ExtTensorDictReplayBuffer if ours else TensorDictReplayBuffer
    rb = buffer_cls(storage=storage_cls(4), batch_size=2)
    assert rb.extend(TensorDict({"obs": torch.zeros(0, 2)}, [0])).numel() == 0
    assert len(rb) == 0 and not rb.storage.initialized
    rb.extend(TensorDict({"obs": torch.ones(3, 2)}, [3]))
    assert rb[:]["obs"].tolist() == [[1.0, 1.0]] * 3


@pytest.mark.parametrize("storage_cls", FAST)
def test_a_first_write_of_no_steps_into_a_two_dim_buffer_writes_nothing(storage_cls):
    # Was: TypeError from TorchRL's writer, which reads the shape of the storage not yet allocated.
    rb = ExtTensorDictReplayBuffer(storage=storage_cls(40, ndim=2), batch_size=2)
    assert rb.extend(TensorDict({"obs": torch.zeros(2, 0)}, [2, 0])).shape == (0, 2)
    assert len(rb) == 0
    rb.extend(TensorDict({"obs": torch.arange(8.0).view(2, 4)}, [2, 4]))
    assert len(rb) == 8


def test_gather_equals_get_and_carries_the_extra_entries():
    storage = FastTensorStorage(10)
    data = TensorDict({"a": torch.arange(20.0).reshape(10, 2), ("b", "c"): torch.arange(10)}, [10])
    storage.set(torch.arange(10), data)
    rows = torch.tensor([7, 0, 7, 3])
    out = storage.gather(rows, {"index": rows, "weight": torch.ones(4)})
    expected = storage.get(rows)
    assert out.batch_size == (4,)
    assert all(torch.equal(out[k], expected[k]) for k in expected.keys(True, True))
    assert out["index"].tolist() == [7, 0, 7, 3] and out["weight"].tolist() == [1.0] * 4
    with pytest.raises(ValueError, match=r"sampler info 'weight' has shape \[3\]"):
        storage.gather(rows, {"weight": torch.ones(3)})


def test_gather_refuses_extra_entries_that_do_not_lead_with_the_whole_batch_shape():
    from torchrl_ext.storages._gathers import assemble

    # A [2] entry in a [2, 3] result would be a TensorDict whose leaf lacks a batch dim.
    with pytest.raises(ValueError, match=r"sampler info 'w' has shape \[2\], which does not lead with .*\[2, 3\]"):
        assemble({"a": torch.zeros(2, 3)}, torch.Size([2, 3]), None, extra={"w": torch.ones(2)})
    out = assemble({"a": torch.zeros(2, 3)}, torch.Size([2, 3]), None, extra={"w": torch.ones(2, 3, 4)})
    assert out["w"].shape == (2, 3, 4)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("cls,base", [(FastTensorStorage, "LazyTensorStorage"), (FastMemmapStorage, "LazyMemmapStorage")])
def test_the_initialisation_log_names_the_storage(cls, base, tmp_path):
    """TorchRL logs "Initialized LazyTensorStorage with ... shape" at the first write; ours names itself."""
    kwargs = {"scratch_dir": tmp_path} if cls is FastMemmapStorage else {}
    logger, seen = logging.getLogger("torchrl"), _Lines()
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(seen)
    try:
        cls(8, **kwargs).set(torch.arange(2), TensorDict({"obs": torch.zeros(2, 3)}, [2]))
        logger.info(f"Initialized {base} elsewhere")  # other lines are left as they are
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    lines = [line for line in seen.lines if line.startswith("Initialized")]
    assert lines[0].startswith(f"Initialized {cls.__name__} with ") and "shape" in lines[0], lines
    assert lines[1:] == [f"Initialized {base} elsewhere"], lines


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, FastMemmapStorage])
@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_refused_oversized_write_rewinds_torchrl_writer_over_every_row(storage_cls, buffer_cls, tmp_path):
    # 7 rows into capacity 5: the storage keeps the newest 5, but TorchRL's writer advanced
    # over all 7; a refusal must rewind all 7 (not the 5 kept), else row 0 is overwritten
    # next and never-written row 3 counts as stored.
    kwargs = {"scratch_dir": tmp_path} if storage_cls is FastMemmapStorage else {}
    rb = buffer_cls(storage=storage_cls(5, **kwargs), batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(3.0)}, [3]))
    with pytest.raises(StorageLayoutError, match="dtype"):
        rb.extend(TensorDict({"x": torch.arange(7)}, [7]))  # int64 into float32
    assert (rb.writer._cursor, rb.writer._write_count, len(rb)) == (3, 3, 3)
    rb.extend(TensorDict({"x": torch.tensor([9.0])}, [1]))
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0, 9.0] and len(rb) == 4


@pytest.mark.parametrize("cls", [FastTensorStorage, FastMemmapStorage])
@pytest.mark.parametrize("device, error", [("nope", ValueError), (1.5, TypeError), (None, TypeError)])
def test_a_bad_device_is_refused_naming_it(cls, device, error):
    # Was: torch's RuntimeError / TypeError, naming no argument.
    with pytest.raises(error, match=rf"device must be a torch.device or a device string such as 'cpu' or "
                                    rf"'cuda:0', got device={re.escape(repr(device))}\."):
        cls(8, device=device)


def test_torchrls_auto_device_and_devices_are_still_taken():
    assert FastTensorStorage(8, device="auto").device == "auto"  # the first write's device
    assert FastMemmapStorage(8, device=torch.device("cpu")).device == torch.device("cpu")
    assert FastTensorStorage(8, device="cpu").device == torch.device("cpu")
