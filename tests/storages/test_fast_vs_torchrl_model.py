"""Differential test: torchrl_ext's fast storage and buffer against TorchRL's, same calls.

A hypothesis state machine runs one random sequence of public calls on three buffers:
TorchRL's ``TensorDictReplayBuffer`` over ``LazyTensorStorage`` (the reference),
TorchRL's buffer over :class:`FastTensorStorage` (the storage swap alone), and
torchrl_ext's ``TensorDictReplayBuffer`` over :class:`FastTensorStorage` (both swaps).
The calls: ``extend`` (including zero-row batches), ``add``, default and explicit
``sample(n)`` with ``return_info``, ``rb[index]`` reads, iteration, ``empty``,
``state_dict`` and ``dumps``/``loads`` round trips, with and without ``prefetch``. Entries include a per-item scalar
(0-dim items) and a zero-size ``[N, 0]`` leaf. After every call everything observable is
compared: return values, lengths, stored rows, writer cursors and write counts; the three
buffers sample with identically seeded generators, so their samples must be equal too.

The documented differences (docs/migrating.md, "Where behaviour differs"), each checked on its
own (the reference is not called there): the fast storages refuse a batch whose keys differ
from the stored ones, and write nothing for a first batch of no rows, where TorchRL's lazy
allocation fails.
"""
from __future__ import annotations

import tempfile
import warnings

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data import TensorDictReplayBuffer as TorchRLBuffer

from tests._hypothesis import machine_settings
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastTensorStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

BATCH = 3


def batch(start: int, n: int, extra: bool = False) -> TensorDict:
    step = torch.arange(start, start + n)
    data = TensorDict({
        "obs": step.float().unsqueeze(-1).expand(n, 2).clone(),
        "scalar": step.double(),  # 0-dim items
        "empty": torch.zeros(n, 0),  # zero-size items
        "next": {"obs": step.float().unsqueeze(-1) + 1, "done": step % 5 == 0},
    }, [n])
    if extra:
        data.set(("extra", "x"), step + 0.5)
    return data


def assert_equal_data(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), where
        return
    assert a.batch_size == b.batch_size, where
    keys_a, keys_b = sorted(a.keys(True, True), key=str), sorted(b.keys(True, True), key=str)
    assert keys_a == keys_b, f"{where}: {keys_a} != {keys_b}"
    for key in keys_a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{where}[{key}]"


class FastVsTorchRLMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.extra = False  # whether writes carry the key new_key_is_added_as_torchrl_adds_it added

    @initialize(capacity=st.integers(1, 12), seed=st.integers(0, 2**16), prefetch=st.sampled_from([None, 1]))
    def build(self, capacity: int, seed: int, prefetch: int | None) -> None:
        # prefetch=1: one worker thread draws the queued samples in order, so the three
        # buffers stay comparable draw for draw (more workers would race for the generator).
        self.capacity, self.seed, self.prefetch = capacity, seed, prefetch
        self.buffers = self._new_buffers()

    def _new_buffers(self) -> list:
        common = {"batch_size": BATCH, "prefetch": self.prefetch}
        return [
            TorchRLBuffer(storage=LazyTensorStorage(self.capacity),
                          generator=torch.Generator().manual_seed(self.seed), **common),
            TorchRLBuffer(storage=FastTensorStorage(self.capacity),
                          generator=torch.Generator().manual_seed(self.seed), **common),
            TensorDictReplayBuffer(storage=FastTensorStorage(self.capacity),
                                   generator=torch.Generator().manual_seed(self.seed), **common),
        ]

    def each(self, call):
        """``call(rb)`` on every buffer; the results (or the exception types, where the
        reference raises) are checked equal to the reference's."""
        outcomes = []
        for rb in self.buffers:
            try:
                outcomes.append((call(rb), None))
            except Exception as error:  # compared below: TorchRL's own errors included
                outcomes.append((None, type(error)))
            # The synchronisation point: queued prefetch draws finish before the next call, so
            # they read the same buffer state in all three (else the worker races the caller).
            for future in tuple(getattr(rb, "_prefetch_queue", ())):
                future.exception()
        errors = [error for _, error in outcomes]
        assert errors == [errors[0]] * len(errors), f"exceptions differ: {errors}"
        results = [result for result, _ in outcomes]
        for result in results[1:]:
            if isinstance(result, tuple):
                for x, y in zip(results[0], result):
                    if isinstance(x, dict):
                        assert sorted(x) == sorted(y)
                        for key in x:
                            xv = torch.stack(x[key], -1) if isinstance(x[key], tuple) else x[key]
                            yv = torch.stack(y[key], -1) if isinstance(y[key], tuple) else y[key]
                            assert torch.equal(torch.as_tensor(xv), torch.as_tensor(yv)), key
                    else:
                        assert_equal_data(x, y, "result")
            elif result is not None:
                assert_equal_data(results[0], result, "result")
        return results[0]

    @property
    def filled(self) -> int:
        return len(self.buffers[0])

    # ------------------------------------------------------------------ calls
    @rule(n=st.integers(0, 15))
    def extend(self, n: int) -> None:
        # n may exceed the capacity: TorchRL keeps the last rows, and so must the fast storage.
        data = batch(self.written, n, self.extra)
        self.written += n
        if n == 0 and not self.buffers[0].storage.initialized:
            # TorchRL's lazy allocation fails here (IndexError); the fast storages write nothing.
            for rb in self.buffers[1:]:
                assert rb.extend(data.clone()).numel() == 0 and len(rb) == 0
            return
        self.each(lambda rb: rb.extend(data.clone()))

    @rule()
    def add(self) -> None:
        item = batch(self.written, 1, self.extra)[0]
        self.written += 1
        self.each(lambda rb: torch.as_tensor(rb.add(item.clone())))

    @precondition(lambda self: self.filled > 0)
    @rule(n=st.one_of(st.none(), st.integers(1, 7)), info=st.booleans())
    def sample(self, n, info: bool) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # TorchRL's "conflicting batch_sizes"
            self.each(lambda rb: rb.sample(n, return_info=info))

    @precondition(lambda self: self.filled > 0)
    @rule(data=st.data())
    def read(self, data) -> None:
        size = self.filled
        index = data.draw(st.one_of(
            st.integers(-size, size - 1),
            st.lists(st.integers(0, size - 1), min_size=1, max_size=6).map(torch.tensor),
            st.tuples(st.integers(0, size), st.integers(0, size)).map(lambda t: slice(min(t), max(t))),
        ))
        self.each(lambda rb: rb[index])

    @precondition(lambda self: self.filled > 0)
    @rule()
    def iterate(self) -> None:
        self.each(lambda rb: next(iter(rb)))

    @rule()
    def empty(self) -> None:
        self.each(lambda rb: rb.empty())

    @rule()
    def state_dict_round_trip(self) -> None:
        states = [rb.state_dict() for rb in self.buffers]
        self.buffers = self._new_buffers()
        for rb, state in zip(self.buffers, states):
            rb.load_state_dict(state)

    @precondition(lambda self: self.filled > 0)
    @rule()
    def files_round_trip(self) -> None:
        last = self.buffers[0].storage._last_cursor
        if isinstance(last, torch.Tensor) and last.numel() == 0:
            # TorchRL's dumps fails after a zero-row extend (it records the empty cursor);
            # the fast storages keep the last real one (docs/migrating.md, "Where behaviour differs").
            for rb in self.buffers[1:]:
                with tempfile.TemporaryDirectory() as folder:
                    rb.dumps(folder)
            return
        restored = self._new_buffers()
        for rb, new in zip(self.buffers, restored):
            with tempfile.TemporaryDirectory() as folder:
                rb.dumps(folder)
                new.loads(folder)
        self.buffers = restored

    @precondition(lambda self: self.filled > 0)
    @rule(n=st.integers(1, 3))
    def new_key_is_added_as_torchrl_adds_it(self, n: int) -> None:
        """A key after the first write: TorchRL adds it (zeros in the other rows), and later
        writes carry it. (Writes without a stored key: tests/torchrl_contract.)"""
        data = batch(self.written, n, extra=True)
        self.extra = True
        self.written += n
        self.each(lambda rb: rb.extend(data.clone()))

    # ------------------------------------------------------------------ observables
    @invariant()
    def same_observable_state(self) -> None:
        reference = self.buffers[0]
        for rb in self.buffers[1:]:
            assert len(rb) == len(reference)
            assert rb.writer._cursor == reference.writer._cursor
            assert rb.writer._write_count == reference.writer._write_count
            if len(reference):
                index = torch.arange(len(reference))
                assert_equal_data(reference.storage.get(index), rb.storage.get(index), "stored rows")


TestFastVsTorchRL = FastVsTorchRLMachine.TestCase
TestFastVsTorchRL.settings = machine_settings(step_count=25)
