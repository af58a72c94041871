"""The numpy write paths: batches matched against stored columns, the column cache, and
FastTensorStorage writes after its leaves move (share_memory_, loads, pickling)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage
from torchrl_ext.storages._numpy_rows import ColumnCache, leaf_items, matching_arrays, numpy_columns


def batch(n: int, start: float = 0.0, nested: bool = True) -> TensorDict:
    """A nested batch, or a flat one (whose entries are its leaves)."""
    x = start + torch.arange(n, dtype=torch.float32)
    second = {"next": {"obs": x.unsqueeze(1)}} if nested else {"next_obs": x.unsqueeze(1)}
    return TensorDict({"obs": torch.stack([x, -x], 1), **second, "done": x.remainder(2) == 0}, [n])


def stored_columns(n: int = 5, nested: bool = True):
    leaves = list(batch(n, nested=nested).items(include_nested=True, leaves_only=True))
    return numpy_columns(leaves, batch_dims=1)


@pytest.mark.parametrize("nested", [True, False])
def test_matching_arrays_pairs_every_column_with_the_new_rows(nested):
    columns = stored_columns(nested=nested)
    data = batch(3, 10.0, nested=nested)
    pairs = matching_arrays(data, columns, rows=3)
    by_array = {id(stored): new for stored, new in pairs}
    for key, (stored, _, _) in columns.items():
        assert (by_array[id(stored)] == data.get(key).numpy()).all()


# Batches that differ from the stored columns: both write paths refuse them.
DIFFERENCES = [
    lambda td: td.set("obs", td.get("obs").double()),           # dtype
    lambda td: td.set("obs", torch.zeros(3, 3)),                 # item shape
    lambda td: td.set("extra", torch.zeros(3)),                  # a key not stored
    lambda td: td.exclude("done"),                               # a stored key missing
    lambda td: td.set("obs", td.get("obs").requires_grad_()),   # autograd history
    lambda td: td.set("obs", torch.zeros(3, 2, device="meta")),   # not on the CPU
    lambda td: td.set(("sub", "x"), torch.zeros(3)),              # a nested key not stored
]


@pytest.mark.parametrize(
    "change",
    DIFFERENCES + [lambda td: td.set("obs", td.get("obs").to(torch.bfloat16))],  # no numpy twin
)
@pytest.mark.parametrize("nested", [True, False])
def test_matching_arrays_refuses_any_difference(change, nested):
    assert matching_arrays(change(batch(3, nested=nested)), stored_columns(nested=nested), rows=3) is None


def test_matching_arrays_checks_the_row_count_asked_each_time():
    """The columns keep the shapes for the last row count asked: a new count must not match
    batches of the old one (or the other way round)."""
    columns = stored_columns()
    for rows, other in [(3, 4), (4, 3), (3, 4), (1, 2)]:
        assert matching_arrays(batch(rows), columns, rows=rows) is not None
        assert matching_arrays(batch(other), columns, rows=rows) is None


def test_matching_arrays_reads_a_flat_batch_as_the_listed_leaves_would():
    """A flat batch pairs with the columns as its listed leaves do, and a nested key can be skipped."""
    columns = stored_columns(nested=False)
    data = batch(3, 4.0, nested=False)
    direct = matching_arrays(data, columns, rows=3)
    listed = [(columns[key][0], leaf.numpy()) for key, leaf in leaf_items(data)]
    assert [(id(a), b.tolist()) for a, b in direct] == [(id(a), b.tolist()) for a, b in listed]
    # a nested env-id key: refused unless it is the skipped one
    with_ids = data.set(("meta", "env_id"), torch.arange(3))
    assert matching_arrays(with_ids, columns, rows=3) is None
    skipped = matching_arrays(with_ids, columns, rows=3, skip_key=("meta", "env_id"))
    assert [b.tolist() for _, b in skipped] == [b.tolist() for _, b in direct]


def test_matching_arrays_takes_extra_entries_and_a_skipped_key():
    leaves = list(batch(4).set("index", torch.arange(4)).items(include_nested=True, leaves_only=True))
    columns = numpy_columns(leaves, batch_dims=1)
    data = batch(2).set("env_id", torch.tensor([0, 1]))
    assert matching_arrays(data, columns, rows=2, extra={"index": torch.arange(2)}) is None  # env_id
    pairs = matching_arrays(data, columns, rows=2, skip_key="env_id", extra={"index": torch.tensor([7, 8])})
    assert [new.tolist() for _, new in pairs][-1] == [7, 8]
    # the batch already holding the extra key: one entry too many, refused
    assert matching_arrays(data.set("index", torch.arange(2)), columns, rows=2, skip_key="env_id",
                           extra={"index": torch.arange(2)}) is None


def test_column_cache_rebuilds_when_a_leaf_is_replaced_or_moved():
    cache, leaf = ColumnCache(), torch.zeros(4, 2)
    first = cache.get([("x", leaf)], batch_dims=1)
    assert cache.get([("x", leaf)], batch_dims=1) is first
    other = torch.zeros(4, 2)
    assert cache.get([("x", other)], batch_dims=1)["x"][0].ctypes.data == other.data_ptr()
    assert pickle.loads(pickle.dumps(cache))._columns is None
    assert cache.get([("x", torch.zeros(4, 2, dtype=torch.bfloat16))], batch_dims=1) is None


def fill(storage_cls, **kwargs) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=storage_cls(6, **kwargs))
    rb.extend(batch(4))
    return rb


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, FastMemmapStorage])
def test_fast_storage_writes_land_in_the_leaves_it_holds_now(storage_cls, tmp_path):
    kwargs = {"scratch_dir": tmp_path} if storage_cls is FastMemmapStorage else {}
    rb = fill(storage_cls, **kwargs)
    rb.extend(batch(4, 100.0))  # wraps: rows 4, 5, 0, 1
    assert rb.storage.get(torch.tensor([4, 5, 0, 1]))["obs"][:, 0].tolist() == [100.0, 101.0, 102.0, 103.0]
    if storage_cls is FastTensorStorage:
        rb.storage._storage.share_memory_()  # same tensors, new memory
        rb.extend(batch(2, 200.0))
        assert rb.storage._storage["obs"][2:4, 0].tolist() == [200.0, 201.0]
        assert rb.storage._storage.is_shared()
    state = rb.state_dict()
    other = fill(storage_cls, **({"scratch_dir": tmp_path / "b"} if kwargs else {}))
    other.load_state_dict(state)
    other.extend(batch(1, 300.0))
    row = int(other.storage._last_cursor_index)
    assert other.storage._storage["obs"][row, 0].item() == 300.0
    copy = pickle.loads(pickle.dumps(other))
    copy.extend(batch(1, 400.0))
    row = int(copy.storage._last_cursor_index)
    assert copy.storage.get(torch.tensor([row]))["obs"][0, 0].item() == 400.0
    assert copy.storage._storage["obs"][row, 0].item() == 400.0


def test_fast_storage_state_after_numpy_writes_equals_torchrl_storage():
    ours, theirs = FastTensorStorage(7), LazyTensorStorage(7)
    rb_ours = TensorDictReplayBuffer(storage=ours)
    from torchrl.data import TensorDictReplayBuffer as TorchRLBuffer

    rb_theirs = TorchRLBuffer(storage=theirs)
    for n, start in [(3, 0.0), (5, 10.0), (7, 20.0), (2, 30.0)]:
        assert torch.equal(rb_ours.extend(batch(n, start)), rb_theirs.extend(batch(n, start)))
        assert len(ours) == len(theirs) and ours._last_cursor_index == theirs._last_cursor_index
        assert torch.equal(ours._last_cursor, theirs._last_cursor)
        assert (ours._storage[: len(ours)] == theirs._storage[: len(theirs)]).all()  # rows written so far


def sample_matches_storage(rb: TensorDictReplayBuffer, n: int = 16) -> TensorDict:
    """A sample whose every leaf equals the storage's rows at its index (read with TensorDict indexing)."""
    sample = rb.sample(n)
    want = rb.storage._storage[sample["index"]]
    for key in want.keys(include_nested=True, leaves_only=True):
        assert torch.equal(sample.get(key), want.get(key)), key
        assert sample.get(key).dtype == want.get(key).dtype
    return sample


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, LazyTensorStorage])
def test_numpy_gathers_read_the_leaves_the_storage_holds_now(storage_cls):
    # 256 uniform draws over 6 rows miss one with probability about 1e-19 (32 draws: 2%).
    rb = TensorDictReplayBuffer(storage=storage_cls(6))
    rb.extend(batch(6))
    sample_matches_storage(rb)
    rb.storage._storage.share_memory_()  # same tensors, new memory: the views must follow
    rb.extend(batch(6, 50.0))
    assert sorted(sample_matches_storage(rb, 256)["obs"][:, 0].unique().tolist()) == [
        50.0 + i for i in range(6)]
    other = TensorDictReplayBuffer(storage=storage_cls(6))
    other.extend(batch(6))
    sample_matches_storage(other)
    other.load_state_dict(rb.state_dict())
    assert sorted(sample_matches_storage(other, 256)["obs"][:, 0].unique().tolist()) == [
        50.0 + i for i in range(6)]
    copy = pickle.loads(pickle.dumps(other))
    copy.extend(batch(6, 90.0))
    assert sorted(sample_matches_storage(copy, 256)["obs"][:, 0].unique().tolist()) == [
        90.0 + i for i in range(6)]


@pytest.mark.parametrize("case", ["bfloat16", "requires_grad"])
def test_leaves_numpy_cannot_view_are_gathered_by_torch(case):
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(6))
    data = batch(6)
    if case == "bfloat16":
        data.set("low", torch.arange(6.0, dtype=torch.bfloat16))
    rb.extend(data)
    if case == "requires_grad":  # the stored leaf joins the graph
        rb.storage._storage.set_("obs", rb.storage._storage["obs"] * torch.ones(1, requires_grad=True))
    sample = sample_matches_storage(rb)
    assert sample["obs"].requires_grad == (case == "requires_grad")


def test_leaf_items_list_what_items_lists_in_the_same_order():
    """Non-tensor leaves included (TensorDict's default listing omits them), so callers can refuse them."""
    from tensordict import LazyStackedTensorDict, NonTensorData, is_leaf_nontensor

    from torchrl_ext.storages._numpy_rows import leaf_items

    def items(td):
        return list(td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))

    plain = TensorDict({"b": torch.zeros(2), "next": {"z": torch.ones(2, 3), "a": {"deep": torch.ones(2)}},
                        "a": torch.zeros(2, 1), "empty": {}}, [2])
    non_tensor = plain.clone()
    non_tensor.set("note", NonTensorData("x", batch_size=[2]))
    stacked = LazyStackedTensorDict.lazy_stack([plain[0], plain[1]])
    for td in (plain, non_tensor, stacked):
        got, want = leaf_items(td), items(td)
        assert [key for key, _ in got] == [key for key, _ in want]
        assert all(a is b or torch.equal(a, b) for (_, a), (_, b) in zip(got, want))
    assert [key for key, _ in leaf_items(plain)] == ["b", ("next", "z"), ("next", "a", "deep"), "a"]
    assert [key for key, _ in leaf_items(non_tensor)][-1] == "note"




def test_numpy_view_shares_memory_and_refuses_what_numpy_cannot_view():
    from torchrl_ext.storages._numpy_rows import NUMPY_DTYPES, TORCH_DTYPES, numpy_view

    values = torch.arange(4)
    numpy_view(values)[0] = 9
    assert values[0] == 9
    assert numpy_view(torch.ones(2, requires_grad=True)) is None
    assert numpy_view(torch.ones(2, dtype=torch.bfloat16)) is None
    assert all(TORCH_DTYPES[np.dtype(numpy_dtype)] is dtype for dtype, numpy_dtype in NUMPY_DTYPES.items())
