"""Streaming (non-temporal) storage writes: the C helper copies exactly the bytes numpy would,
at any alignment and length, overlapping or not; the storages take it for large writes only,
and fall back to numpy's assignment (broadcasting, casting, errors) everywhere else."""
from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer as TorchRLBuffer

import torchrl_ext
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, StreamingWrites, streaming_writes
from torchrl_ext.storages import _streaming

# This module checks a fast path itself: it runs with the fast paths on (see tests/conftest.py).
pytestmark = pytest.mark.fastpath

_stream = _streaming._stream
needs_helper = pytest.mark.skipif(_stream is None, reason="torchrl_ext._stream not built (no C compiler at install)")


def test_the_c_helper_is_built_where_it_can_be():
    # The build skips the helper quietly without a compiler; CI and any Linux x86-64
    # machine with one must have it, or the storages would copy with numpy unnoticed.
    x86 = platform.machine() in ("x86_64", "AMD64")
    if os.environ.get("CI") or (x86 and sys.platform.startswith("linux") and (shutil.which("cc") or shutil.which("gcc"))):
        assert _streaming._stream is not None, "torchrl_ext._stream was not built: reinstall with a C compiler"
    assert streaming_writes.available == (_streaming._stream is not None and x86)  # streaming stores: x86-64 only


@needs_helper
@settings(max_examples=300, deadline=None)
@given(length=st.integers(0, 700), dst_offset=st.integers(0, 63), src_offset=st.integers(0, 63),
       seed=st.integers(0, 2**31 - 1))
def test_copies_exactly_the_bytes_at_any_alignment_and_length(length, dst_offset, src_offset, seed):
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 256, length + 64, dtype=np.uint8)
    destination = rng.integers(0, 256, length + 128, dtype=np.uint8)
    expected = destination.copy()
    expected[dst_offset:dst_offset + length] = source[src_offset:src_offset + length]
    _stream.copy(destination[dst_offset:dst_offset + length], source[src_offset:src_offset + length])
    np.testing.assert_array_equal(destination, expected)  # guard bytes on both sides untouched


@needs_helper
def test_copies_megabytes_of_any_dtype():
    rng = np.random.default_rng(0)
    source = rng.standard_normal((1000, 2049)).astype(np.float32)  # 8 MB, not a multiple of 64 B
    destination = np.zeros((1003, 2049), np.float32)
    _stream.copy(destination[2:1002], source)
    np.testing.assert_array_equal(destination[2:1002], source)
    assert not destination[:2].any() and not destination[1002:].any()


@needs_helper
@pytest.mark.parametrize("shift", [-250, -65, -16, -1, 1, 3, 64, 150])
def test_overlapping_buffers_are_copied_as_memmove_does(shift):
    buffer = np.arange(1000, dtype=np.int64).astype(np.uint8)
    expected = buffer.copy()
    length, src = 600, 250
    expected[src + shift:src + shift + length] = buffer[src:src + length].copy()
    _stream.copy(buffer[src + shift:src + shift + length], buffer[src:src + length])
    np.testing.assert_array_equal(buffer, expected)


@needs_helper
def test_the_c_helper_refuses_what_it_cannot_copy():
    data = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="dst has 10 bytes and src 9; pass buffers of the same size"):
        _stream.copy(data, np.ones(9, np.uint8))
    with pytest.raises(ValueError, match="not C-contiguous"):
        _stream.copy(data[::2], np.ones(5, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        _stream.copy(np.frombuffer(bytes(10), np.uint8), data)
    assert not data.any()


@contextlib.contextmanager
def streaming_from(min_bytes: int, enabled: bool = True):
    saved = streaming_writes.min_bytes, streaming_writes.enabled
    streaming_writes.min_bytes, streaming_writes.enabled = min_bytes, enabled
    try:
        yield
    finally:
        streaming_writes.min_bytes, streaming_writes.enabled = saved


@pytest.fixture
def recorded(monkeypatch):
    """The output sizes of the copies and gathers the C helper makes (it still makes them)."""
    calls = {"copy": [], "gather": []}

    class Recording:
        STREAMING = _stream.STREAMING

        @staticmethod
        def copy(destination, source):
            calls["copy"].append(destination.nbytes)
            _stream.copy(destination, source)

        @staticmethod
        def gather(destination, source, rows):
            calls["gather"].append(destination.nbytes)
            _stream.gather(destination, source, rows)

    monkeypatch.setattr(_streaming, "_stream", Recording)
    return calls


@pytest.fixture
def stream_calls(recorded):
    """Records the sizes of the copies the C helper makes (and still makes them)."""
    return recorded["copy"]


@needs_helper
def test_only_large_contiguous_same_layout_copies_stream(stream_calls):
    writes = StreamingWrites(min_bytes=1024)
    big, small = np.zeros((4, 512), np.float32), np.zeros((4, 8), np.float32)
    writes.copy(big, np.ones((4, 512), np.float32))
    writes.copy(small, np.ones((4, 8), np.float32))  # below min_bytes
    writes.copy(big, np.ones((4, 512), np.float64))  # cast
    writes.copy(big, np.ones((1, 512), np.float32))  # broadcast
    writes.copy(big, np.ones((512, 4), np.float32).T)  # not contiguous
    writes.copy(torch.from_numpy(big), torch.full((4, 512), 2.0))  # torch tensors
    writes.enabled = False
    writes.copy(big, np.full((4, 512), 3.0, np.float32))
    assert stream_calls == [big.nbytes]
    assert (big == 3.0).all() and (small == 1.0).all()


@needs_helper
def test_fallback_keeps_numpy_assignment_errors(stream_calls):
    writes = StreamingWrites(min_bytes=1)
    destination = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="could not broadcast"):
        writes.copy(destination, np.ones((3, 2), np.float32))  # same bytes, other shape
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        writes.copy(read_only, np.ones((2, 3), np.float32))
    assert stream_calls == [] and not destination.any()


def test_bad_settings_name_the_argument_and_the_fix():
    with pytest.raises(TypeError, match="min_bytes must be an int number of bytes, got min_bytes=1.5"):
        StreamingWrites(min_bytes=1.5)
    with pytest.raises(ValueError, match="min_bytes must be >= 1, got min_bytes=0; set enabled = False to turn"):
        StreamingWrites(min_bytes=0)
    with pytest.raises(TypeError, match="enabled must be a bool, got int"):
        StreamingWrites(enabled=1)
    writes = StreamingWrites()
    with pytest.raises(ValueError, match=r"min_bytes must be >= 1, got min_bytes=-5"):
        writes.min_bytes = -5
    assert writes.min_bytes == 4 << 20 and writes.enabled is True


def _frames(start: int, count: int) -> TensorDict:
    index = torch.arange(start, start + count)
    obs = (index.view(-1, 1, 1) * 7 + torch.arange(12 * 16).view(1, 12, 16)).to(torch.uint8)
    return TensorDict({"obs": obs, "next": {"obs": obs.flip(-1), "reward": index.float().unsqueeze(-1)},
                       "action": index.unsqueeze(-1)}, [count])


@needs_helper
@pytest.mark.parametrize("storage", ["tensor", "memmap"])
def test_storage_writes_stream_and_store_what_torchrl_stores(storage, tmp_path, stream_calls):
    capacity = 50
    make = (lambda: FastTensorStorage(capacity)) if storage == "tensor" else \
        (lambda: FastMemmapStorage(capacity, scratch_dir=tmp_path))
    ours, theirs = TensorDictReplayBuffer(storage=make()), TorchRLBuffer(storage=LazyTensorStorage(capacity))
    with streaming_from(min_bytes=12 * 16 * 5):  # frame leaves of 5 rows or more stream
        for start, count in [(0, 30), (30, 30), (60, 4), (64, 45), (109, 2)]:  # wrap-arounds, small ones
            batch = _frames(start, count)
            ours.extend(batch)
            theirs.extend(batch)
    stored, expected = ours.storage._storage, theirs.storage._storage
    for key in expected.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(stored[key], expected[key], rtol=0, atol=0)
    frame = 12 * 16
    # The first write initialises through TorchRL; then 20+10 rows on the wrap, 4 (below
    # min_bytes), 36+9, 2 (below): two frame leaves each.
    assert sorted(stream_calls) == sorted(n * frame for n in (20, 20, 10, 10, 36, 36, 9, 9))


@needs_helper
def test_writes_with_streaming_off_store_the_same(stream_calls):
    buffers = [TensorDictReplayBuffer(storage=FastTensorStorage(40)) for _ in range(2)]
    for on, rb in zip((True, False), buffers):
        with streaming_from(min_bytes=64, enabled=on):
            for start in range(0, 100, 25):
                rb.extend(_frames(start, 25))
    assert stream_calls  # the first buffer streamed
    torch.testing.assert_close(buffers[0].storage._storage.to_dict(), buffers[1].storage._storage.to_dict(),
                               rtol=0, atol=0)


# ---------------------------------------------------------------- gathers into sample outputs

@needs_helper
@settings(max_examples=300, deadline=None)
@given(n_src=st.integers(1, 12), row=st.integers(0, 300), n_rows=st.integers(0, 20),
       dst_offset=st.integers(0, 63), src_offset=st.integers(0, 63), seed=st.integers(0, 2**31 - 1))
def test_gathers_exactly_the_rows_at_any_alignment_and_row_length(n_src, row, n_rows, dst_offset, src_offset, seed):
    rng = np.random.default_rng(seed)
    source_memory = rng.integers(0, 256, n_src * row + 64, dtype=np.uint8)
    source = source_memory[src_offset:src_offset + n_src * row].reshape(n_src, row)
    rows = rng.integers(-n_src, n_src, n_rows)  # negative rows count from the end
    memory = rng.integers(0, 256, n_rows * row + 128, dtype=np.uint8)
    expected = memory.copy()
    expected[dst_offset:dst_offset + n_rows * row] = source[rows].reshape(-1)
    _stream.gather(memory[dst_offset:dst_offset + n_rows * row].reshape(n_rows, row), source, rows)
    np.testing.assert_array_equal(memory, expected)  # guard bytes on both sides untouched


@needs_helper
def test_gathers_megabyte_rows_of_any_dtype_and_shape():
    rng = np.random.default_rng(1)
    source = rng.standard_normal((50, 7, 3001)).astype(np.float32)  # rows of 84 KB, not a multiple of 64 B
    rows = rng.integers(0, 50, 40)
    destination = np.empty((40, 7, 3001), np.float32)
    _stream.gather(destination, source, rows)
    np.testing.assert_array_equal(destination, source[rows])


@needs_helper
def test_the_c_gather_refuses_what_it_cannot_gather_and_leaves_dst_as_it_was():
    source = np.arange(60, dtype=np.float32).reshape(6, 10)
    destination = np.full((3, 10), -1.0, np.float32)
    for rows, error, match in [
        (np.array([0, 6, 1]), IndexError, "gather: row 6 is out of range for 6 rows"),
        (np.array([0, -7, 1]), IndexError, "gather: row -7 is out of range for 6 rows"),
        (np.array([0, 1, 2], np.int32), TypeError, "rows must be int64, got format 'i' of 4 bytes; pass rows.astype"),
        (np.array([0.0, 1.0, 2.0]), TypeError, "rows must be int64, got format 'd'"),
        (np.array([0, 1]), ValueError, "dst has 120 bytes, not 2 rows of 40 bytes; pass an output of len"),
    ]:
        with pytest.raises(error, match=match):
            _stream.gather(destination, source, rows)
    with pytest.raises(ValueError, match="dst overlaps src; gather into a separate output"):
        _stream.gather(source[3:], source, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="src has no first dim"):
        _stream.gather(np.empty(0, np.uint8), np.uint8(3), np.empty(0, np.int64))
    with pytest.raises(ValueError, match="not C-contiguous"):
        _stream.gather(destination, source[:, ::2], np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="read-only"):
        _stream.gather(np.frombuffer(bytes(120), np.float32).reshape(3, 10), source, np.array([0, 1, 2]))
    assert (destination == -1.0).all()
    empty = np.empty((0, 10), np.float32)
    _stream.gather(empty, source[:0], np.empty(0, np.int64))  # no rows from no rows: nothing to do
    with pytest.raises(IndexError, match="row 0 is out of range for 0 rows"):
        _stream.gather(destination[:1], source[:0], np.array([0]))


@pytest.fixture
def gather_calls(recorded):
    """Records the output sizes of the gathers the C helper makes (and still makes them)."""
    return recorded["gather"]


@needs_helper
def test_only_large_outputs_of_long_contiguous_rows_stream(gather_calls, monkeypatch):
    monkeypatch.setattr(StreamingWrites, "MIN_ROW_BYTES", 64)
    writes = StreamingWrites(min_output_bytes=1024)
    source = np.arange(20 * 32, dtype=np.float32).reshape(20, 32)  # rows of 128 B
    rows = np.array([19, 0, -1, 5, 5, 7, 2, 3])  # 8 rows: 1 KiB out
    for out_rows, src, index, streams in [
        (rows, source, rows, True),
        (rows[:7], source, rows[:7], False),  # below min_output_bytes
        (np.resize(rows, 32), source[:, :8].copy(), np.resize(rows, 32), False),  # 1 KiB of 32-B rows
        (rows, np.asfortranarray(source), rows, False),  # not contiguous
        (rows, source, rows.astype(np.int32), False),  # int32 rows
        (rows, source, np.repeat(rows, 2)[::2], False),  # strided rows
    ]:
        destination = np.zeros((len(out_rows), *src.shape[1:]), np.float32)
        before = len(gather_calls)
        writes.gather(destination, src, index)
        np.testing.assert_array_equal(destination, np.asarray(src)[np.asarray(index)])
        assert (len(gather_calls) > before) == streams
    destination = np.zeros((8, 32), np.float32)
    for setting in ("sample_outputs", "enabled"):
        writes = StreamingWrites(min_output_bytes=1024, **{setting: False})
        writes.gather(destination, source, rows)
        np.testing.assert_array_equal(destination, source[rows])
    assert gather_calls == [1024]


@needs_helper
@pytest.mark.parametrize("min_output_bytes", [1, 1 << 30])  # streamed, and numpy's take
def test_gathers_refuse_rows_out_of_range_before_writing(min_output_bytes, monkeypatch):
    monkeypatch.setattr(StreamingWrites, "MIN_ROW_BYTES", 1)
    writes = StreamingWrites(min_output_bytes=min_output_bytes)
    destination = np.full((3, 4), 7, np.int64)
    for rows in (np.array([0, 5, 1]), np.array([-6, 0, 1])):
        with pytest.raises(IndexError, match="out of range for 5 rows"):
            writes.gather(destination, np.zeros((5, 4), np.int64), rows)
    assert (destination == 7).all()


def test_bad_output_settings_name_the_argument_and_the_fix():
    with pytest.raises(TypeError, match="min_output_bytes must be an int number of bytes, got min_output_bytes='8M'"):
        StreamingWrites(min_output_bytes="8M")
    with pytest.raises(ValueError, match="min_output_bytes must be >= 1, got min_output_bytes=0; set sample_outputs = False"):
        StreamingWrites(min_output_bytes=0)
    with pytest.raises(TypeError, match="sample_outputs must be a bool, got str"):
        StreamingWrites(sample_outputs="yes")
    writes = StreamingWrites()
    with pytest.raises(TypeError, match="sample_outputs must be a bool, got NoneType"):
        writes.sample_outputs = None
    assert writes.sample_outputs is True and writes.min_output_bytes == 1 << 20


@pytest.fixture
def streamed_outputs(monkeypatch, gather_calls):
    """Every sample output, of any size and row length, gathered by the C helper."""
    from torchrl_ext.storages import output_recycler

    monkeypatch.setattr(StreamingWrites, "MIN_ROW_BYTES", 1)
    monkeypatch.setattr(output_recycler, "min_bytes", 1)  # the gathers' own first size test
    monkeypatch.setattr(streaming_writes, "min_output_bytes", 1)
    return gather_calls


@needs_helper
def test_streamed_samples_equal_torchrls(streamed_outputs, tmp_path):
    from torchrl.data import LazyMemmapStorage

    from tests.storages import test_fast, test_ring_reads

    test_fast.test_same_contents_and_samples_as_torchrls_storage()  # hypothesis: against LazyTensorStorage
    test_fast.test_gathers_equal_tensordicts_own_indexing()
    assert streamed_outputs
    streamed_outputs.clear()
    ours = TensorDictReplayBuffer(storage=FastMemmapStorage(40, scratch_dir=tmp_path / "ours"), batch_size=64)
    theirs = TorchRLBuffer(storage=LazyMemmapStorage(40, scratch_dir=tmp_path / "theirs"))
    for start in range(0, 100, 25):
        ours.extend(_frames(start, 25))
        theirs.extend(_frames(start, 25))
    sample = ours.sample()
    expected = theirs.storage.get(sample["index"])
    for key in expected.keys(include_nested=True, leaves_only=True):
        assert torch.equal(sample[key], expected[key]), key
    assert streamed_outputs
    streamed_outputs.clear()
    test_ring_reads.test_chain_and_window_reads_equal_the_stored_rows("float32")  # numpy take path
    test_ring_reads.test_samples_equal_the_stored_rows_at_their_index("nstep")
    assert streamed_outputs


@needs_helper
@pytest.mark.parametrize("num_stack, stack_dim, padding", [(4, 0, "reset"), (3, -1, "zero")])
def test_streamed_frame_stacks_equal_the_plain_storage(streamed_outputs, num_stack, stack_dim, padding):
    from tests.storages import test_dedup

    test_dedup.test_reads_equal_the_full_stream(num_stack, stack_dim, padding)  # hypothesis: dedup == plain
    assert streamed_outputs


# ---------------------------------------------------------------- the fast-path switch

@needs_helper
def test_the_fastpath_switch_turns_streaming_off_and_stores_the_same(recorded):
    """With the fast paths off, no copy or gather goes through the C helper, and the storage
    holds and returns the same as with them on."""
    results = {}
    for enabled in (True, False):
        recorded["copy"].clear()
        recorded["gather"].clear()
        with streaming_from(1), torchrl_ext.fastpath(enabled):
            storage = FastTensorStorage(30)
            rb = TensorDictReplayBuffer(storage=storage, batch_size=16)
            for start in range(0, 40, 10):
                rb.extend(_frames(start, 10))
            rows = torch.tensor([0, 5, 29, 7])
            results[enabled] = storage.get(rows)
            calls = len(recorded["copy"]) + len(recorded["gather"])
        assert (calls > 0) is enabled
    assert (results[True] == results[False]).all()
