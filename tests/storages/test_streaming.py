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

from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, StreamingWrites, streaming_writes
from torchrl_ext.storages import _streaming

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
def stream_calls(monkeypatch):
    """Records the sizes of the copies the C helper makes (and still makes them)."""
    calls = []

    class Recording:
        STREAMING = _stream.STREAMING

        @staticmethod
        def copy(destination, source):
            calls.append(destination.nbytes)
            _stream.copy(destination, source)

    monkeypatch.setattr(_streaming, "_stream", Recording)
    return calls


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
