"""FastTensorStorage / FastMemmapStorage: refused writes change nothing, at every ``ndim`` and with
the fast paths on or off; ``strict=True`` holds for multi-dim storages; an index ``extend``
returned is never rewritten by a later write; index dtypes are read as TorchRL reads them."""
from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

import torchrl_ext
from torchrl_ext import _compat
from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, StorageLayoutError

#: (TorchRL's storage, the torchrl_ext storage that replaces it).
PAIRS = {"tensor": (LazyTensorStorage, FastTensorStorage), "memmap": (LazyMemmapStorage, FastMemmapStorage)}
BUFFERS = {"torchrl-buffer": TensorDictReplayBuffer, "ext-buffer": ExtTensorDictReplayBuffer}
ENVS = 3
_scratch = itertools.count()

KINDS = pytest.mark.parametrize("kind", PAIRS)
BUFFER_KINDS = pytest.mark.parametrize("buffer", BUFFERS)
NDIMS = pytest.mark.parametrize("ndim", [1, 2])
FASTPATH = pytest.mark.parametrize("fast", [True, False], ids=["fastpath-on", "fastpath-off"])


def make(storage_cls: type, capacity: int, tmp_path: Any, **kwargs: Any) -> Any:
    if issubclass(storage_cls, LazyMemmapStorage):
        kwargs["scratch_dir"] = str(tmp_path / f"s{next(_scratch)}")
    return storage_cls(capacity, **kwargs)


def batch(start: int, steps: int, ndim: int, **leaves: Any) -> TensorDict:
    """``steps`` numbered rows (``[steps]``, or ``[ENVS, steps]`` for an ``ndim=2`` storage);
    ``leaves`` replaces or adds entries: ``name=None`` drops one, a dtype or an item shape
    changes ``"obs"``'s, a number adds a key of that value."""
    shape = [steps] if ndim == 1 else [ENVS, steps]
    value = torch.arange(start, start + shape[0] * (1 if ndim == 1 else steps)).reshape(shape).float()
    data = TensorDict({"obs": value.unsqueeze(-1).expand(*shape, 2).clone()}, shape)
    for key, spec in leaves.items():
        if spec is None:
            del data[key]
        elif isinstance(spec, torch.dtype):
            data[key] = data[key].to(spec)
        elif isinstance(spec, tuple):
            data[key] = torch.zeros(*shape, *spec)
        else:
            data[key] = torch.full(shape, float(spec))
    return data


def observe(rb: Any) -> tuple:
    """What a refused write must leave as it was: length, stored rows, writer position and
    count, and the last written row."""
    storage = rb.storage
    stored = storage[:].clone() if len(storage) else None
    last = _compat.last_written(storage)
    return (len(rb), rb.writer._cursor, rb.writer._write_count, None if last is None else int(last)), stored


def assert_same_observation(before: tuple, after: tuple) -> None:
    assert before[0] == after[0]
    assert (before[1] is None) == (after[1] is None)
    if before[1] is not None:
        assert (before[1] == after[1]).all()


# --------------------------------------------------------------------------- refused writes (ndim 1 and 2)
@KINDS
@BUFFER_KINDS
@NDIMS
@FASTPATH
@pytest.mark.parametrize("change", ["dtype", "item shape"])
def test_a_layout_change_is_refused_before_anything_changes(kind, buffer, ndim, fast, change, tmp_path):
    bad = {"obs": torch.float64} if change == "dtype" else {"obs": (3,)}
    with torchrl_ext.fastpath(fast):
        rb = BUFFERS[buffer](storage=make(PAIRS[kind][1], 12, tmp_path, ndim=ndim))
        reference = BUFFERS[buffer](storage=make(PAIRS[kind][0], 12, tmp_path, ndim=ndim))
        for buf in (rb, reference):
            buf.extend(batch(0, 2, ndim))
        before = observe(rb)
        with pytest.raises(StorageLayoutError, match="key 'obs'"):
            rb.extend(batch(100, 2, ndim, **bad))
        assert_same_observation(before, observe(rb))
        # The next write lands where it would have without the refused one.
        for buf in (rb, reference):
            buf.extend(batch(10, 2, ndim))
        assert observe(rb)[0] == observe(reference)[0]
        assert (rb.storage[:] == reference.storage[:]).all()


@KINDS
@NDIMS
@pytest.mark.parametrize("change", ["dtype", "item shape"])
def test_a_layout_change_written_to_the_storage_directly_is_refused_before_anything_changes(
        kind, ndim, change, tmp_path):
    storage = make(PAIRS[kind][1], 12, tmp_path, ndim=ndim)
    first = batch(0, 2, ndim)
    storage.set(torch.arange(2), first.transpose(0, 1) if ndim == 2 else first)
    length, stored = len(storage), storage[:].clone()
    bad = batch(100, 2, ndim, obs=torch.float64 if change == "dtype" else (3,))
    with pytest.raises(StorageLayoutError, match="key 'obs'"):
        storage.set(torch.arange(2, 4), bad.transpose(0, 1) if ndim == 2 else bad)
    with pytest.raises(StorageLayoutError, match="key 'obs'"):
        storage.set(2, bad[0] if ndim == 1 else bad[:, 0])
    assert len(storage) == length
    assert (storage[:] == stored).all()


# --------------------------------------------------------------------------- strict=True (ndim 1 and 2)
STRICT_REFUSALS = {
    "new key": ({"extra": 1.0}, "missing: \\[\\], extra: \\['extra'\\]"),
    "missing key": ({"obs": None, "other": 1.0}, "missing: \\['obs'\\]"),
    "more items than the capacity": ({}, None),
    "more items than the capacity, at the first write": ({}, None),
}


@KINDS
@BUFFER_KINDS
@NDIMS
@FASTPATH
@pytest.mark.parametrize("case", STRICT_REFUSALS)
def test_strict_refuses_key_changes_and_oversized_batches_at_every_ndim(kind, buffer, ndim, fast, case, tmp_path):
    leaves, message = STRICT_REFUSALS[case]
    first = case.endswith("first write")
    # 12 items: 12 steps of a 1-D storage, 4 steps of 3 envs of an ndim=2 one.
    steps = (13 if ndim == 1 else 5) if message is None else 2
    if message is None:
        message = ("cannot write a batch of 13 items into a storage of capacity 12; extend in chunks of at most 12"
                   if ndim == 1 else "cannot write a batch of 15 items into a storage of capacity 12; extend in "
                   "chunks of at most 4 rows along dim 0 \\(3 items each\\)")
    with torchrl_ext.fastpath(fast):
        rb = BUFFERS[buffer](storage=make(PAIRS[kind][1], 12, tmp_path, ndim=ndim, strict=True))
        if not first:
            rb.extend(batch(0, 2, ndim))
        before = observe(rb)
        with pytest.raises(StorageLayoutError, match=message):
            rb.extend(batch(100, steps, ndim, **leaves))
        assert_same_observation(before, observe(rb))
        assert rb.storage.initialized is not first


@KINDS
@BUFFER_KINDS
@NDIMS
@FASTPATH
def test_strict_takes_what_fits_at_every_ndim(kind, buffer, ndim, fast, tmp_path):
    # max_size=10 with 3 envs: TorchRL allocates 4 whole steps (12 items), which strict takes.
    with torchrl_ext.fastpath(fast):
        buffers = [BUFFERS[buffer](storage=make(cls, 10, tmp_path, ndim=ndim, **kw))
                   for cls, kw in zip(PAIRS[kind], ({}, {"strict": True}))]
        steps = 10 if ndim == 1 else 4
        for rb in buffers:
            rb.extend(batch(0, steps, ndim))
            rb.extend(batch(50, 2, ndim))  # wraps round
        reference, rb = buffers
        assert observe(rb)[0] == observe(reference)[0]
        assert (rb.storage[:] == reference.storage[:]).all()


def test_strict_on_a_two_dim_storage_refuses_direct_writes_too():
    storage = FastTensorStorage(12, ndim=2, strict=True)
    storage.set(torch.arange(2), batch(0, 2, 2).transpose(0, 1))
    with pytest.raises(StorageLayoutError, match="extra: \\['extra'\\]"):
        storage.set(2, batch(0, 1, 2, extra=1.0)[:, 0])
    with pytest.raises(StorageLayoutError, match="missing: \\['obs'\\]"):
        storage[torch.arange(2)] = batch(0, 2, 2, obs=None, other=1.0).transpose(0, 1)
    with pytest.raises(StorageLayoutError, match="15 items into a storage of capacity 12"):
        storage.set(torch.arange(5) % 4, batch(0, 5, 2).transpose(0, 1))
    assert len(storage) == 6


# --------------------------------------------------------------------------- cursors TorchRL takes
@KINDS
@pytest.mark.parametrize("ndim, cursor", [(1, c) for c in ("int", "0-d tensor", "slice", "list", "2-d tensor")]
                         + [(2, c) for c in ("int", "0-d tensor", "slice", "list", "2-d tensor", "coordinates")])
def test_every_cursor_form_torchrl_takes_is_written_alike(kind, ndim, cursor, tmp_path):
    cursors = {"int": 1, "0-d tensor": torch.tensor(1), "slice": slice(1, 3), "list": [1, 2],
               "2-d tensor": torch.tensor([[1], [2]]), "coordinates": (torch.tensor([1, 2]), torch.tensor([0, 2]))}
    where = cursors[cursor]
    shapes = {"int": [], "0-d tensor": [], "slice": [2], "list": [2], "2-d tensor": [2, 1], "coordinates": [2]}
    storages = [make(cls, 12, tmp_path, ndim=ndim) for cls in PAIRS[kind]]
    first = batch(0, 4, ndim)
    for storage in storages:
        storage.set(torch.arange(4), first.transpose(0, 1) if ndim == 2 else first)
        shape = shapes[cursor] + ([ENVS] if ndim == 2 and cursor != "coordinates" else [])
        storage.set(where, TensorDict({"obs": torch.full((*shape, 2), 7.0)}, shape))
    reference, fast = storages
    assert len(fast) == len(reference)  # TorchRL counts rows written twice twice: rows past 4 are not data
    assert (_compat.stored_data(fast)[:4] == _compat.stored_data(reference)[:4]).all()


@KINDS
@NDIMS
@pytest.mark.parametrize("cursor", ["slice", "list", "tensor", "mask"])
def test_a_write_without_a_stored_key_reads_zeros_on_rows_never_written(kind, ndim, cursor, tmp_path):
    storage = make(PAIRS[kind][1], 12, tmp_path, ndim=ndim)
    first = batch(0, 2, ndim, extra=5.0)
    storage.set(torch.arange(2), first.transpose(0, 1) if ndim == 2 else first)
    mask = torch.zeros(12 if ndim == 1 else 4, dtype=torch.bool)
    mask[1:3] = True
    where = {"slice": slice(1, 3), "list": [1, 2], "tensor": torch.tensor([1, 2]), "mask": mask}[cursor]
    second = batch(10, 2, ndim)  # no "extra"
    storage.set(where, second.transpose(0, 1) if ndim == 2 else second)
    extra = _compat.stored_data(storage)["extra"][:3]
    assert (extra[:2] == 5).all() and (extra[2] == 0).all()  # row 1 keeps its value, as in TorchRL


@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("strict", [False, True])
def test_a_two_dim_storage_keeps_non_tensor_entries_as_torchrl_does(kind, buffer, strict, tmp_path):
    """Its reads are TorchRL's, which read them (a 1-D storage refuses them: its gathers do
    not). Stored, they make a lazy stack: later writes go to TorchRL unchecked, as on a 1-D one."""
    buffers = [BUFFERS[buffer](storage=make(cls, 12, tmp_path, ndim=2, **kw))
               for cls, kw in zip(PAIRS[kind], ({}, {"strict": strict}))]
    for rb in buffers:
        for start in (0, 10):
            rb.extend(batch(start, 2, 2).set_non_tensor("note", "hi"))
    reference, rb = buffers
    assert observe(rb)[0] == observe(reference)[0]
    assert (rb.storage[:]["obs"] == reference.storage[:]["obs"]).all()
    assert rb.storage[:]["note"] == reference.storage[:]["note"]


# --------------------------------------------------------------------------- the index extend returned
@KINDS
@BUFFER_KINDS
@FASTPATH
@pytest.mark.parametrize("then", ["extend", "add", "wrapping extend"])
def test_a_later_write_leaves_the_index_an_extend_returned(kind, buffer, fast, then, tmp_path):
    with torchrl_ext.fastpath(fast):
        rb = BUFFERS[buffer](storage=make(PAIRS[kind][1], 10, tmp_path, compilable=True), compilable=True)
        first = rb.extend(batch(0, 4, 1))
        kept = first.clone()
        if then == "add":
            rb.add(batch(4, 1, 1)[0])
        else:
            rb.extend(batch(4, 3 if then == "extend" else 9, 1))
            rb.extend(batch(20, 2, 1))
        assert torch.equal(first, kept)
        assert int(_compat.last_written(rb.storage)) == (rb.writer._cursor - 1) % 10


@KINDS
@NDIMS
def test_a_compilable_storage_keeps_no_view_of_a_cursor_it_was_given(kind, ndim, tmp_path):
    storage = make(PAIRS[kind][1], 12, tmp_path, ndim=ndim, compilable=True)
    cursor = torch.arange(3)
    data = batch(0, 3, ndim)
    storage.set(cursor, data.transpose(0, 1) if ndim == 2 else data)
    storage.set(3, data[0] if ndim == 1 else data[:, 0])
    assert cursor.tolist() == [0, 1, 2]
    assert int(_compat.last_written(storage)) == 3


# --------------------------------------------------------------------------- index dtypes
@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8 is now deprecated")
@KINDS
@NDIMS
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("read", ["get", "getitem"])
def test_index_tensors_of_every_integer_dtype_read_as_torchrl_reads_them(kind, ndim, dtype, read, tmp_path):
    """uint8 (and bool) is a mask, as torch's indexing reads it; int8 / int16 are refused with
    TorchRL's IndexError."""
    results = []
    for cls in PAIRS[kind]:
        storage = make(cls, 12, tmp_path, ndim=ndim)
        data = batch(0, 6 if ndim == 1 else 2, ndim)
        storage.set(torch.arange(data.shape[ndim - 1]), data.transpose(0, 1) if ndim == 2 else data)
        index = torch.tensor([1, 0, 1, 0, 0, 1] if ndim == 1 else [1, 0], dtype=dtype)
        try:
            results.append(storage.get(index) if read == "get" else storage[index])
        except Exception as err:  # noqa: BLE001 - the type is what is compared
            results.append(type(err))
    reference, fast = results
    if isinstance(reference, type):
        assert fast is reference
    else:
        assert fast.batch_size == reference.batch_size and (fast == reference).all()
