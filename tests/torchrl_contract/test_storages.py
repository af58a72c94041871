"""``LazyTensorStorage`` / ``LazyMemmapStorage`` against ``FastTensorStorage`` / ``FastMemmapStorage``,
in TorchRL's and torchrl_ext's ``TensorDictReplayBuffer``: what TorchRL accepts is accepted and
stored alike (docs/migrating.md: "same arguments").
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, lazy_stack
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)
from torchrl.envs.transforms import ExcludeTransform

from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage, StorageLayoutError

#: (TorchRL's storage, the torchrl_ext storage that replaces it).
PAIRS = {"tensor": (LazyTensorStorage, FastTensorStorage), "memmap": (LazyMemmapStorage, FastMemmapStorage)}
BUFFERS = {"torchrl-buffer": TensorDictReplayBuffer, "ext-buffer": ExtTensorDictReplayBuffer}
_scratch = itertools.count()


def rows(start: int, n: int, **extra: Callable[[torch.Tensor], torch.Tensor]) -> TensorDict:
    """Transitions numbered ``start ... start + n - 1``; ``extra`` adds keys computed from the numbers."""
    step = torch.arange(start, start + n)
    data = TensorDict({"obs": step.float().unsqueeze(-1).expand(n, 3).clone(),
                       "next": {"obs": step.float().unsqueeze(-1) + 1, "done": step % 3 == 0}}, [n])
    for key, fn in extra.items():
        data.set(key, fn(step))
    return data


def make(storage_cls: type, capacity: int, tmp_path: Any, **kwargs: Any) -> Any:
    if issubclass(storage_cls, LazyMemmapStorage):
        kwargs["scratch_dir"] = str(tmp_path / f"s{next(_scratch)}")
    return storage_cls(capacity, **kwargs)


def both(kind: str, buffer: str, capacity: int, tmp_path: Any, new_writer: Callable | None = None,
         **kwargs: Any) -> list:
    """The same buffer twice: on TorchRL's storage, and on torchrl_ext's (each with a writer
    from ``new_writer``, if given)."""
    if new_writer is not None:
        return [BUFFERS[buffer](storage=make(cls, capacity, tmp_path), writer=new_writer(), **kwargs)
                for cls in PAIRS[kind]]
    return [BUFFERS[buffer](storage=make(cls, capacity, tmp_path), **kwargs) for cls in PAIRS[kind]]


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal values, dtypes, shapes and keys (lazy stacks compared member by member)."""
    if isinstance(a, LazyStackedTensorDict) or isinstance(b, LazyStackedTensorDict):
        assert isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase), where
        dim = (a if isinstance(a, LazyStackedTensorDict) else b).stack_dim
        for x, y in zip(a.unbind(dim), b.unbind(dim), strict=True):
            assert_same(x, y, where)
        return
    if isinstance(a, TensorDictBase):
        assert isinstance(b, TensorDictBase) and a.batch_size == b.batch_size, where
        assert sorted(map(str, a.keys())) == sorted(map(str, b.keys())), where
        for key in a.keys():
            assert_same(a.get(key), b.get(key), f"{where}/{key}")
        return
    assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
    assert torch.equal(a, b), where


def observe(rb: Any) -> tuple:
    """What a user can see of a buffer: its length, stored rows and next write position."""
    stored = rb.storage.get(torch.arange(len(rb))) if len(rb) else None
    return len(rb), stored, rb.writer._cursor if hasattr(rb.writer, "_cursor") else None


def assert_same_buffers(reference: Any, ours: Any) -> None:
    (n, stored, cursor), (n2, stored2, cursor2) = observe(reference), observe(ours)
    assert (n, cursor) == (n2, cursor2)
    if stored is not None:
        assert_same(stored, stored2, "stored")


KINDS = pytest.mark.parametrize("kind", PAIRS)
BUFFER_KINDS = pytest.mark.parametrize("buffer", BUFFERS)


# --------------------------------------------------------------------------- writes TorchRL accepts
@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("first", [0, 3])
def test_a_batch_larger_than_the_capacity_keeps_its_last_rows(kind, buffer, first, tmp_path):
    buffers = both(kind, buffer, 4, tmp_path, batch_size=2)
    for rb in buffers:
        if first:
            rb.extend(rows(100, first))
        index = rb.extend(rows(0, 10))
        assert index.numel() == 10
    assert_same_buffers(*buffers)
    assert sorted(observe(buffers[1])[1]["obs"][:, 0].tolist()) == [6.0, 7.0, 8.0, 9.0]


@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("key", ["b", ("nested", "b")])
def test_a_key_after_the_first_write_is_added(kind, buffer, key, tmp_path):
    buffers = both(kind, buffer, 6, tmp_path, batch_size=2)
    for rb in buffers:
        rb.extend(rows(0, 3))
        rb.extend(rows(3, 2).set(key, torch.ones(2, 2)))
        rb.extend(rows(5, 3).set(key, torch.full((3, 2), 2.0)))  # wraps around
    assert_same_buffers(*buffers)
    stored = buffers[1].storage.get(torch.arange(6))
    if kind == "memmap":  # TorchRL's memory-mapped storage drops a key it did not allocate
        assert key not in stored.keys(True)
    else:
        assert stored.get(key)[:, 0].tolist() == [2.0, 2.0, 0.0, 1.0, 1.0, 2.0]


@KINDS
@BUFFER_KINDS
def test_max_value_writer_extend_then_add(kind, buffer, tmp_path):
    """TensorDictMaxValueWriter's add writes an "index" entry its extend did not store."""
    buffers = both(kind, buffer, 5, tmp_path, batch_size=2,
                   new_writer=lambda: TensorDictMaxValueWriter(rank_key="r"))
    for rb in buffers:
        rb.extend(rows(0, 3, r=lambda s: s.float()))
        rb.add(rows(7, 1, r=lambda s: s.float())[0])
        rb.extend(rows(10, 4, r=lambda s: s.float() - 10.0))
    assert_same_buffers(*buffers)


@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("how", ["setitem", "storage.set"])
def test_a_computed_key_is_written_back(kind, buffer, how, tmp_path):
    """PPO's pattern: compute a value target on sampled rows and store it with them."""
    buffers = both(kind, buffer, 8, tmp_path, batch_size=3)
    for rb in buffers:
        rb.extend(rows(0, 6))
        batch = rb.storage.get(torch.tensor([4, 1, 2]))
        batch["value_target"] = batch["obs"][:, :1] * 2
        index = torch.tensor([4, 1, 2])
        if how == "setitem":
            rb[index] = batch
        else:
            rb.storage.set(index, batch)
        rb.extend(rows(6, 4).set("value_target", torch.full((4, 1), -1.0)))
    assert_same_buffers(*buffers)
    stored = buffers[1].storage.get(torch.arange(8))
    if kind == "memmap":  # TorchRL's memory-mapped storage drops a key it did not allocate
        assert "value_target" not in stored.keys()
    else:
        assert stored["value_target"][:, 0].tolist() == [-1.0, -1.0, 4.0, 0.0, 8.0, 0.0, -1.0, -1.0]


@KINDS
@BUFFER_KINDS
def test_a_write_without_a_stored_key_leaves_it_on_rows_written_before(kind, buffer, tmp_path):
    buffers = both(kind, buffer, 4, tmp_path, batch_size=2)
    for rb in buffers:
        rb.extend(rows(0, 4, b=lambda s: s.float() + 0.5))
        rb.extend(rows(4, 3))  # overwrites rows 0-2 without "b": TorchRL leaves their "b" as it was
    assert_same_buffers(*buffers)
    assert buffers[1].storage.get(torch.arange(4))["b"].tolist() == [0.5, 1.5, 2.5, 3.5]


@KINDS
def test_a_write_without_a_stored_key_reads_zeros_past_the_filled_part(kind, tmp_path):
    """A documented difference (docs/migrating.md, "Where behaviour differs"): TorchRL leaves rows past
    the filled part as allocated (uninitialised memory); the fast storages zero them."""
    rb = ExtTensorDictReplayBuffer(storage=make(PAIRS[kind][1], 6, tmp_path))
    rb.extend(rows(0, 2, b=lambda s: s.float() + 0.5))
    rb.extend(rows(2, 3))
    assert rb.storage.get(torch.arange(5))["b"].tolist() == [0.5, 1.5, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("stack", ["top", "nested"])
@pytest.mark.parametrize("shapes", [(2, 5), (3, 3)], ids=["heterogeneous", "homogeneous"])
@KINDS
@BUFFER_KINDS
def test_lazy_stacks_are_stored_and_sampled(kind, buffer, stack, shapes, tmp_path):
    def agents(start: int) -> LazyStackedTensorDict:
        return lazy_stack([TensorDict({"o": torch.full((3, d), float(start + i))}, [3])
                           for i, d in enumerate(shapes)], dim=1)

    def data(start: int) -> TensorDictBase:
        if stack == "top":
            return agents(start)
        return TensorDict({"agents": agents(start), "r": torch.arange(start, start + 3.0)}, [3])

    buffers = both(kind, buffer, 5, tmp_path, batch_size=4)
    samples = []
    for rb in buffers:
        rb.extend(data(0))
        rb.extend(data(10))  # wraps around
        torch.manual_seed(0)
        samples.append(rb.sample())
    assert_same_buffers(*buffers)
    assert_same(samples[0], samples[1], "sample")


# --------------------------------------------------------------------------- writes both refuse
@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_a_shape_or_dtype_change_is_refused_as_torchrl_refuses_it(kind, buffer, change, tmp_path):
    bad = rows(10, 2).set("obs", torch.zeros(2, 4) if change == "shape" else torch.zeros(2, 3, dtype=torch.int64))
    buffers = both(kind, buffer, 6, tmp_path)
    for rb in buffers:
        rb.extend(rows(0, 3))
    with pytest.raises(RuntimeError):
        buffers[0].extend(bad)
    before = observe(buffers[1])
    with pytest.raises(StorageLayoutError, match=f"key 'obs': stored {'items have shape' if change == 'shape' else 'dtype'}"):
        buffers[1].extend(bad)  # also a RuntimeError, as TorchRL's
    after = observe(buffers[1])
    assert before[0] == after[0] and before[2] == after[2]  # the writer's cursor is not moved
    assert_same(before[1], after[1])


@KINDS
@pytest.mark.parametrize("case", ["new key", "missing key", "larger than the capacity"])
def test_strict_refuses_what_torchrl_accepts(kind, case, tmp_path):
    rb = ExtTensorDictReplayBuffer(storage=make(PAIRS[kind][1], 4, tmp_path, strict=True))
    rb.extend(rows(0, 2, b=lambda s: s.float()))
    bad = {"new key": rows(2, 1, b=lambda s: s.float(), c=lambda s: s.float()),
           "missing key": rows(2, 1), "larger than the capacity": rows(2, 5, b=lambda s: s.float())}[case]
    before = observe(rb)
    with pytest.raises(StorageLayoutError, match="data keys differ|capacity 4"):
        rb.extend(bad)
    after = observe(rb)
    assert before[0] == after[0] and before[2] == after[2]
    assert_same(before[1], after[1])


def test_strict_must_be_a_bool():
    with pytest.raises(TypeError, match="strict must be True or False, got 'yes'"):
        FastTensorStorage(4, strict="yes")


# --------------------------------------------------------------------------- buffer API
@KINDS
@BUFFER_KINDS
@pytest.mark.parametrize("prefetch", [None, 1])  # one worker: draws in order
def test_sampling_iteration_and_transforms(kind, buffer, prefetch, tmp_path):
    outputs = []
    for storage_cls in PAIRS[kind]:
        # Each buffer its own generator: a prefetch worker draws while the next buffer is built.
        rb = BUFFERS[buffer](storage=make(storage_cls, 16, tmp_path), batch_size=5, prefetch=prefetch,
                             transform=ExcludeTransform(("next", "done")), generator=torch.Generator().manual_seed(1))
        rb.extend(rows(0, 12))
        outputs.append([rb.sample() for _ in range(3)] + [b for b, _ in zip(rb, range(2))])
    for x, y in zip(*outputs, strict=True):
        assert ("next", "done") not in y.keys(True)
        assert_same(x, y, "sample")


@KINDS
@BUFFER_KINDS
def test_dumps_and_loads_round_trip_across_classes(kind, buffer, tmp_path):
    """A checkpoint of TorchRL's storage loads into torchrl_ext's and back."""
    reference, ours = both(kind, buffer, 8, tmp_path, batch_size=3)
    for rb in (reference, ours):
        rb.extend(rows(0, 11))
    reference.dumps(tmp_path / "torchrl")
    ours.dumps(tmp_path / "ext")
    into_ours, into_reference = both(kind, buffer, 8, tmp_path, batch_size=3)[::-1]
    into_ours.loads(tmp_path / "torchrl")
    into_reference.loads(tmp_path / "ext")
    assert_same_buffers(reference, into_ours)
    assert_same_buffers(ours, into_reference)
    for rb in (into_ours, into_reference):
        rb.extend(rows(20, 2))
    assert_same_buffers(into_reference, into_ours)


# --------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("data_kind", ["tensor", "tensordict"])
def test_compiled_writes_match(data_kind):
    """``set`` inside ``torch.compile`` with ``compilable=True`` (TorchRL's own test pattern)."""
    def item(i: int) -> Any:
        values = torch.full((50, 1), i)
        return values if data_kind == "tensor" else TensorDict({"a": values}, [50])

    results = []
    for cls in PAIRS["tensor"]:
        torch._dynamo.reset()
        storage = cls(50, compilable=True)
        storage.set(torch.arange(50), item(0))

        @torch.compile(fullgraph=data_kind == "tensor")
        def write(cursor: torch.Tensor, data: Any, storage: Any = storage) -> None:
            storage.set(cursor, data)

        for i in range(1, 4):
            write(torch.arange(50).roll(i), item(i))
        results.append(storage.get(torch.arange(50)))
    assert_same(*results)


def test_compiled_extend_and_sample_do_not_recompile():
    """TorchRL's test: after three warm-up calls, ``extend`` + ``sample`` under ``torch.compile``
    with ``compilable=True`` run without recompiling."""
    counts = []
    for cls in PAIRS["tensor"]:
        torch._dynamo.reset()
        rb = ReplayBuffer(storage=cls(1_100, compilable=True), batch_size=3, compilable=True)
        data = torch.randint(100, (100, 1))

        @torch.compile
        def extend_and_sample(data: torch.Tensor, rb: Any = rb) -> torch.Tensor:
            rb.extend(data)
            return rb.sample()

        for _ in range(3):
            extend_and_sample(data)
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for _ in range(7):
            extend_and_sample(data)
        counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - before)
        assert len(rb) == 1_000
    assert counts[1] <= counts[0]
