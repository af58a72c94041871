"""torchrl_ext._compat: one test per private TorchRL / TensorDict name the package relies on.

Each wrapper is exercised on TorchRL's own objects and its result checked, so an upstream
rename or change of meaning fails the test named after that name (the nightly job runs this
file against torchrl-nightly and tensordict-nightly). The last tests keep the rule that made
this module: outside it, the package touches none of these names, and every private TorchRL
method it overrides is listed in ``HOOKS``.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import pkgutil
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.objectives.value import GAE

import torchrl_ext
from tests.replay_buffers.test_buffer_locks import _held_by_another_thread
from torchrl_ext import _compat

PACKAGE = Path(torchrl_ext.__file__).parent


def rollout(t: int = 5, batch: tuple[int, ...] = ()) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    shape = (*batch, t)
    obs = torch.randn(*shape, 3, generator=g)
    return TensorDict({
        "obs": obs, "action": torch.rand(*shape, 1, generator=g) * 1.8 - 0.9,
        "next": {"obs": obs + 1, "reward": torch.randn(*shape, 1, generator=g),
                 "done": torch.zeros(*shape, 1, dtype=torch.bool),
                 "terminated": torch.zeros(*shape, 1, dtype=torch.bool)},
    }, list(shape))


def critic() -> TensorDictModule:
    torch.manual_seed(0)
    return TensorDictModule(nn.Linear(3, 1), in_keys=["obs"], out_keys=["state_value"])


# ---------------------------------------------------------------- value estimators

def test_skip_existing_and_grad_enabled_follow_the_estimator_flags():
    class Estimator:
        differentiable, skip_existing = False, None

        @_compat.skip_existing
        @_compat.grad_enabled
        def forward(self):
            return torch.is_grad_enabled()

    estimator = Estimator()
    assert estimator.forward() is False
    estimator.differentiable = True
    assert estimator.forward() is True


def test_standardize_by_group_standardises_each_group_on_its_own():
    values = torch.tensor([1.0, 3.0, 10.0, 30.0, 50.0])
    groups = torch.tensor([0, 0, 1, 1, 1])
    out = _compat.standardize_by_group(values, groups, eps=1e-8)
    for g in (0, 1):
        member = out[groups == g]
        assert member.mean().abs() < 1e-5
        assert (member.std() - 1).abs() < 1e-4


def test_call_value_nets_runs_the_critic_on_now_and_next():
    estimator = GAE(gamma=0.9, lmbda=0.95, value_network=critic())
    data = rollout()
    value, next_value, _ = _compat.call_value_nets(
        estimator, data, params=None, next_params=None, single_call=False, value_key="state_value",
        detach_next=True, vmap_randomness="error")
    net = estimator.value_network
    torch.testing.assert_close(value, net.module(data["obs"]))
    torch.testing.assert_close(next_value, net.module(data["next", "obs"]))


def test_time_dim_of_is_the_last_batch_dim_by_default():
    estimator = GAE(gamma=0.9, lmbda=0.95, value_network=critic())
    data = rollout(batch=(2,))
    assert _compat.time_dim_of(estimator, None, data) == 1
    assert _compat.time_dim_of(estimator, 0, data) == 0


def test_shifted_view_without_a_shifted_call_is_the_data():
    estimator = GAE(gamma=0.9, lmbda=0.95, value_network=critic())
    data = rollout()
    view = _compat.shifted_view(estimator, data, None, 0)
    assert torch.equal(view["next", "reward"], data["next", "reward"])


def test_mask_shifted_outputs_leaves_outputs_alone_without_a_mask():
    estimator = GAE(gamma=0.9, lmbda=0.95, value_network=critic())
    data = rollout().set("advantage", torch.ones(5, 1))
    _compat.mask_shifted_outputs(estimator, data, None)
    assert torch.equal(data["advantage"], torch.ones(5, 1))


def test_expand_to_match_expands_a_mask_to_the_target_shape():
    mask = torch.tensor([[True], [False]])
    out = _compat.expand_to_match(mask, torch.zeros(2, 3))
    assert out.shape == (2, 3) and out[0].all() and not out[1].any()


def test_group_ids_reads_the_group_key():
    estimator = GAE(gamma=0.9, lmbda=0.95, value_network=critic())
    assert _compat.group_ids(estimator, rollout()) is None


# ---------------------------------------------------------------- storages, samplers, buffers

def test_storage_index_keeps_an_index_on_the_storage_device():
    storage = LazyTensorStorage(10, device="cpu")
    index = (torch.tensor([1]), torch.tensor([2]))
    moved = _compat.storage_index(index, storage)
    assert isinstance(moved, tuple) and all(torch.equal(a, b) for a, b in zip(moved, index))


def test_last_written_and_set_last_written():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    assert _compat.last_written(rb.storage) is None
    rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    assert int(_compat.last_written(rb.storage)) == 3
    _compat.set_last_written(rb.storage, torch.tensor([1]))
    assert int(_compat.last_written(rb.storage)) == 1


def test_stored_data_and_allocate_like():
    storage = LazyTensorStorage(5)
    assert _compat.stored_data(storage) is None
    _compat.allocate_like(storage, TensorDict({"x": torch.zeros(3)}, []))
    stored = _compat.stored_data(storage)
    assert isinstance(stored, TensorDict) and stored["x"].shape == (5, 3)
    storage.set(torch.arange(2), TensorDict({"x": torch.ones(2, 3)}, [2]))
    assert stored["x"][:2].eq(1).all()  # the rows it holds are the ones written


def test_writer_cursor_and_set_writer_cursor():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter())
    rb.extend(torch.arange(3))
    assert _compat.writer_cursor(rb.writer) == 3
    _compat.set_writer_cursor(rb.writer, 1, written=2)
    assert _compat.writer_cursor(rb.writer) == 1
    rb.extend(torch.tensor([9]))
    assert rb.storage[1].item() == 9 and _compat.writer_cursor(rb.writer) == 2
    assert _compat.write_count(rb.writer) == 6  # 3 + 2 counted + 1
    assert _compat.writer_storage(rb.writer) is rb.storage
    assert _compat.writer_storage(RoundRobinWriter()) is None


def test_mark_updated_reaches_the_attached_entities():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter())
    rb.extend(torch.arange(2))
    seen = []

    class Probe:
        def mark_update(self, index):
            seen.append(torch.as_tensor(index).tolist())

    probe = Probe()
    rb.storage.attach(probe)
    _compat.mark_updated(rb.writer, torch.tensor([1, 0]))
    assert seen == [[1, 0]]


def test_unchecked_tensordict_builds_what_the_checked_constructor_builds():
    assert hasattr(TensorDict, "_new_unsafe"), "TensorDict._new_unsafe is gone: the gathers fall back"
    entries = {"a": torch.arange(6.0).reshape(2, 3), ("b", "c"): torch.ones(2, 1)}
    built = _compat.unchecked_tensordict(dict(entries), torch.Size([2]), torch.device("cpu"))
    expected = TensorDict(entries, batch_size=[2], device="cpu")
    assert built.batch_size == expected.batch_size and built.device == expected.device
    assert set(built.keys(True, True)) == set(expected.keys(True, True))
    assert all(torch.equal(built[k], expected[k]) for k in expected.keys(True, True))


def test_requested_dim_extend_and_pins_memory():
    assert _compat.requested_dim_extend(object()) == 0
    assert _compat.pins_memory(ReplayBuffer(storage=LazyTensorStorage(4))) is False
    seen = []

    class Probe(LazyTensorStorage):
        def attach(self, buffer):  # what the rings read while TorchRL attaches them
            seen.append((_compat.requested_dim_extend(buffer), _compat.pins_memory(buffer)))
            super().attach(buffer)

    ReplayBuffer(storage=Probe(4), pin_memory=True, dim_extend=None)
    ReplayBuffer(storage=Probe(4), dim_extend=0)
    assert seen == [(None, True), (0, False)]


def test_writer_state_round_trip_and_mutation_revision_default():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter())
    rb.extend(torch.arange(2))
    state = _compat.writer_state(rb.writer)
    assert state == {"_cursor": 2, "_write_count": 2}
    rb.extend(torch.arange(3))
    _compat.restore_writer_state(rb.writer, state)
    assert _compat.writer_cursor(rb.writer) == 2 and _compat.write_count(rb.writer) == 2
    assert _compat.mutation_revision(object()) is None


def test_filled_rows_and_set_length():
    storage = LazyTensorStorage(10, ndim=2)
    storage.set(torch.arange(3), TensorDict({"x": torch.zeros(3, 2)}, [3, 2]))
    assert _compat.filled_rows(storage) == 3
    _compat.set_length(storage, 4)
    assert _compat.filled_rows(storage) == 2  # 4 items over 2 columns


def test_mutation_revision_moves_with_writes_and_bumps():
    storage = LazyTensorStorage(10)
    start = int(_compat.mutation_revision(storage))
    storage.set(torch.arange(2), TensorDict({"x": torch.zeros(2)}, [2]))
    after_write = int(_compat.mutation_revision(storage))
    assert after_write > start
    _compat.bump_mutation_revision(storage)
    assert int(_compat.mutation_revision(storage)) > after_write


def test_attached_entities_lists_the_buffers_reading_the_storage():
    storage = LazyTensorStorage(10)
    assert list(_compat.attached_entities(storage)) == []
    rb = TensorDictReplayBuffer(storage=storage, writer=RoundRobinWriter())
    rb.extend(TensorDict({"x": torch.arange(2)}, [2]))
    assert any(entity is rb for entity in _compat.attached_entities(storage))


def test_checkpointer_hooks_are_the_registered_ones():
    checkpointer = TensorStorageCheckpointer()

    def hook(x):
        return x

    checkpointer.register_save_hook(hook)
    checkpointer.register_load_hook(hook)
    save, load = _compat.checkpointer_hooks(checkpointer)
    assert save == [hook] and load == [hook]


def test_replay_lock_and_write_lock_are_the_buffers_locks():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    lock = _compat.replay_lock(rb)
    with lock:  # reentrant: TorchRL's own methods take it again inside
        rb.extend(torch.arange(2))
    assert len(rb) == 2
    with _compat.write_lock(rb):  # a null context unless the buffer is shared
        pass
    shared = ReplayBuffer(storage=LazyTensorStorage(4), shared=True)
    assert hasattr(_compat.write_lock(shared), "acquire")



def test_snapshot_locks_holds_the_prefetch_replay_and_process_locks_unless_it_prefetches():
    shared = ReplayBuffer(storage=LazyTensorStorage(4), shared=True)
    with _compat.snapshot_locks(shared):
        assert _held_by_another_thread(shared._futures_lock) and _held_by_another_thread(shared._replay_lock)
        assert _held_by_another_thread(_compat.write_lock(shared))
    assert not _held_by_another_thread(shared._replay_lock)
    assert not _held_by_another_thread(_compat.write_lock(shared))
    with _compat.snapshot_locks(ReplayBuffer(storage=LazyTensorStorage(4))) as held:  # unshared
        assert held is None
    prefetching = ReplayBuffer(storage=LazyTensorStorage(4), prefetch=2, batch_size=2)
    with _compat.snapshot_locks(prefetching):  # TorchRL waits for its queue before locking
        assert not _held_by_another_thread(prefetching._replay_lock)


def test_attach_shared_init_is_torchrls_wait_for_init_and_a_no_op_otherwise():
    storage = LazyTensorStorage(4, shared_init=True)
    assert callable(storage._wait_for_init)
    _compat.attach_shared_init(storage)  # nothing written by anyone yet: no wait
    assert not storage.initialized
    plain = LazyTensorStorage(4)
    plain.set(torch.arange(2), torch.zeros(2))
    _compat.attach_shared_init(plain)
    assert plain.initialized and len(plain) == 2
    # Attaching a storage another process allocated: tests/distributed/test_multiprocess.py.

def test_empty_takes_locks_says_whether_torchrls_empty_holds_the_process_lock():
    # Independently of the probe: look from another thread while TorchRL's empty runs.
    rb = ReplayBuffer(storage=LazyTensorStorage(4), shared=True)
    rb.extend(torch.arange(2))
    lock, held = _compat.write_lock(rb), []
    original = rb._storage._empty

    def spy() -> None:
        held.append(_held_by_another_thread(lock))
        original()

    rb._storage._empty = spy
    ReplayBuffer.empty(rb)
    assert held == [_compat.empty_takes_locks()]
    assert len(rb) == 0 and lock.acquire(False)  # emptied, and the lock given back
    lock.release()


@pytest.mark.parametrize("buffer", ["tensordict", "env_ring"])
def test_empty_on_a_shared_buffer_returns_and_gives_its_locks_back(buffer):
    # Was: with a TorchRL whose empty takes the process lock itself, ours took it first and
    # empty() never returned (the process lock is not reentrant).
    from torchrl_ext.distributed import share_buffer
    from torchrl_ext.replay_buffers import EnvRingReplayBuffer
    from torchrl_ext.replay_buffers import TensorDictReplayBuffer as OurBuffer
    from torchrl_ext.storages import FastTensorStorage

    if buffer == "tensordict":
        rb = OurBuffer(storage=FastTensorStorage(4), shared=True)
        rb.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
    else:
        rb = EnvRingReplayBuffer(num_envs=2, max_length=4)
        rb.extend(TensorDict({"x": torch.arange(2.0)}, [2]))
        share_buffer(rb)
    thread = threading.Thread(target=rb.empty, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "empty() hangs on its own locks"
    assert len(rb) == 0
    for lock in (_compat.write_lock(rb), _compat.replay_lock(rb)):
        assert lock.acquire(False)
        lock.release()


def test_prefetch_size_is_the_number_of_batches_sampled_ahead():
    assert not _compat.prefetch_size(ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2))
    # Was TorchRL's bool flag, so share_buffer's refusal read "prefetch=True" for prefetch=3.
    assert _compat.prefetch_size(ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2, prefetch=3)) == 3


def test_sample_unit_ensure_initialized_and_samples_plainly():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2)
    assert _compat.sample_unit(rb) is None and _compat.samples_plainly(rb)
    assert not _compat.samples_plainly(ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2, prefetch=2))
    assert not _compat.samples_plainly(ReplayBuffer(storage=LazyTensorStorage(4), pin_memory=True))
    delayed = ReplayBuffer(storage=LazyTensorStorage(4), delayed_init=True)
    assert not delayed.initialized
    _compat.ensure_initialized(delayed)
    assert delayed.initialized


def test_collate_applies_the_buffers_collate_function():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), collate_fn=lambda x: x * 10)
    assert _compat.collate(rb, torch.ones(2)).tolist() == [10.0, 10.0]


def test_is_consuming_follows_the_sampler():
    from torchrl.data import ConsumingSampler

    assert not _compat.is_consuming(ReplayBuffer(storage=LazyTensorStorage(4)))
    assert _compat.is_consuming(ReplayBuffer(storage=LazyTensorStorage(4), sampler=ConsumingSampler()))


def test_generator_is_what_set_rng_gives_the_parts():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    assert _compat.generator(rb.sampler) is None
    g = torch.Generator().manual_seed(3)
    rb.set_rng(g)
    assert _compat.generator(rb.sampler) is g and _compat.generator(rb.storage) is g
    other = torch.Generator()
    _compat.set_generator(rb.sampler, other)
    assert _compat.generator(rb.sampler) is other


def test_set_remaining_batches_caps_torchrls_prefetch_count():
    from torchrl.data.replay_buffers.samplers import RandomSampler

    sampler = RandomSampler()
    assert sampler._remaining_batches > 10**9  # TorchRL's class default: no epoch
    _compat.set_remaining_batches(sampler, 3)
    assert sampler._remaining_batches == 3


def test_ray_client_is_the_attribute_torchrls_ray_buffer_calls_through():
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    source = inspect.getsource(RayReplayBuffer)
    assert "self._client =" in source and "self._client." in source

    class Hosted:
        _client = object()

    assert _compat.ray_client(Hosted()) is Hosted._client


# ---------------------------------------------------------------- readiness, sample counters and names
# Features of TorchRL releases after 0.14.1: each test checks the wrapper against TorchRL's own
# buffer where this TorchRL has the feature, and that it does nothing where it has not.

def test_readiness_condition_is_the_one_torchrl_notifies_or_a_null_context():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    condition = _compat.readiness_condition(rb)
    if not hasattr(rb, "wait_until_sampleable"):  # 0.14.1: no waiters, nothing to take
        assert isinstance(condition, contextlib.nullcontext)
        with condition:
            rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]))
        assert len(rb) == 2
        return
    with condition:  # reentrant: TorchRL's extend notifies it with the condition held here
        rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]))
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(rb.wait_until_sampleable(min_items=1, timeout=5.0)))
    with condition:
        waiter.start()
        time.sleep(0.2)
        assert waiter.is_alive() and not woke  # sampleable, but the waiter needs this very condition
    waiter.join(5)
    assert woke == [True]


def test_notify_state_change_wakes_a_waiter_or_does_nothing():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    if not hasattr(rb, "wait_until_sampleable"):
        assert _compat.notify_state_change(rb) is None
        return
    rb.extend(TensorDict({"obs": torch.zeros(1)}, [1]))
    woke = {}

    def wait() -> None:
        start = time.monotonic()
        woke["ready"] = rb.wait_until_sampleable(min_items=1000, timeout=5.0)
        woke["after"] = time.monotonic() - start

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    _compat.notify_state_change(rb)  # wakes it: it rechecks, finds too few items, waits again
    time.sleep(0.2)
    rb.extend(TensorDict({"obs": torch.zeros(999)}, [999]))
    waiter.join(10)
    assert woke["ready"] is True and woke["after"] < 3.0


def test_sample_wait_keywords_are_those_of_torchrls_sample():
    parameters = inspect.signature(TensorDictReplayBuffer.sample).parameters
    assert _compat.sample_wait_keywords() == {n for n in ("wait", "timeout", "cancel_event") if n in parameters}
    for name, default in _compat.SAMPLE_WAIT_DEFAULTS.items():
        if name in parameters:
            assert parameters[name].default == default


def test_sample_wait_arguments_keeps_the_non_defaults_or_refuses_them():
    assert _compat.sample_wait_arguments(wait=False, timeout=None, cancel_event=None) == {}
    event = threading.Event()
    given = {"wait": True, "timeout": 0.0, "cancel_event": event}
    if _compat.sample_wait_keywords() == {"wait", "timeout", "cancel_event"}:
        assert _compat.sample_wait_arguments(**given) == given
        return
    assert not _compat.sample_wait_keywords()
    for name, value in given.items():
        with pytest.raises(TypeError, match=f"{name}=.*no '{name}' keyword"):
            _compat.sample_wait_arguments(**{name: value})


def test_sampled_item_count_counts_records_as_torchrls_sample():
    assert _compat.sampled_item_count(torch.arange(5), 1) == 5
    assert _compat.sampled_item_count((torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4)), 2) == 12
    assert _compat.sampled_item_count(torch.zeros(6, 2, dtype=torch.long), 2) == 6  # (row, col) pairs
    assert _compat.sampled_item_count(torch.zeros(6, 2, dtype=torch.long), 1) == 12
    assert _compat.sampled_item_count(3, 1) == 1


def test_count_sample_adds_what_torchrls_sample_adds():
    reference = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    counted = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    for rb in (reference, counted):
        rb.extend(TensorDict({"obs": torch.zeros(6)}, [6]))
    reference.sample()
    _compat.count_sample(counted, torch.arange(4))
    stats = getattr(reference, "stats", dict)()
    if "sample_calls" not in stats:  # this TorchRL keeps no counters: nothing to add to
        assert not hasattr(counted, "_sample_call_count_value")
        return
    assert stats["sample_calls"] == 1 and stats["samples_returned"] == 4
    assert {k: counted.stats()[k] for k in ("sample_calls", "samples_returned")} == {
        k: stats[k] for k in ("sample_calls", "samples_returned")}


def test_set_sample_names_names_as_torchrls_sampler_or_returns_the_data():
    from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

    data = TensorDict({"obs": torch.zeros(2, 5)}, [2, 5])
    assert _compat.set_sample_names(RandomSampler(), data) is data
    assert data.names == [None, None]
    try:
        sampler = SliceSampler(slice_len=5, traj_key="traj", output_layout="batch_time")
    except TypeError:  # this TorchRL's SliceSampler names nothing
        assert _compat.set_sample_names(SliceSampler(slice_len=5, traj_key="traj"), data) is data
        assert data.names == [None, None]
        return
    assert _compat.set_sample_names(sampler, data).names == [None, "time"]


# ---------------------------------------------------------------- the rule

@pytest.mark.parametrize("cls, name", _compat.HOOKS, ids=[f"{c.__name__}.{n}" for c, n in _compat.HOOKS])
def test_each_overridden_hook_is_still_defined_by_torchrl(cls, name):
    assert any(name in vars(base) for base in cls.__mro__), f"TorchRL's {cls.__name__} no longer defines {name}"


def _package_classes() -> set[type]:
    classes = set()
    for info in pkgutil.walk_packages(torchrl_ext.__path__, "torchrl_ext."):
        for value in vars(importlib.import_module(info.name)).values():
            if inspect.isclass(value) and value.__module__.startswith("torchrl_ext"):
                classes.add(value)
    return classes


def test_every_private_torchrl_method_the_package_overrides_is_listed_in_hooks():
    overridden = set()
    for cls in _package_classes():
        upstream = [b for b in cls.__mro__ if b.__module__.split(".")[0] in ("torchrl", "tensordict")]
        ours = [b for b in cls.__mro__ if b.__module__.startswith("torchrl_ext")]
        for own in ours:
            for attr in vars(own):
                if not attr.startswith("_") or attr.startswith("__") or attr in ("_abc_impl", "_target_"):
                    continue
                owner = next((b for b in upstream if attr in vars(b)), None)
                if owner is not None:
                    overridden.add((owner, attr))
    assert overridden == set(_compat.HOOKS)


def test_validate_recurrent_inputs_runs_torchrls_checks_where_it_has_them():
    from torchrl_ext.value import GAE as OurGAE

    class NoChecks:  # an estimator of a TorchRL without recurrent checks (0.14.1): nothing runs
        pass

    _compat.validate_recurrent_inputs(NoChecks(), TensorDict({}, []), None)
    if not hasattr(GAE, "for_recurrent"):
        assert not hasattr(GAE, "_validate_recurrent_inputs")
        return

    class Net(nn.Module):
        def forward(self, obs, is_init, hidden):
            return obs.sum(-1, keepdim=True), hidden

    net = TensorDictModule(Net(), ["obs", "is_init", "hidden"], ["state_value", ("next", "hidden")])
    steps = {"obs": torch.ones(1, 4, 2), "is_init": torch.zeros(1, 4, 1), "hidden": torch.zeros(1, 4, 3)}
    td = TensorDict({**steps, "next": {**steps, "reward": torch.ones(1, 4, 1),
                                        "done": torch.zeros(1, 4, 1, dtype=torch.bool),
                                        "terminated": torch.zeros(1, 4, 1, dtype=torch.bool)}}, [1, 4])
    # Was: our forward skipped TorchRL's check, and a float is_init failed later with a bare torch error.
    for estimator in (GAE, OurGAE):
        with pytest.raises(TypeError, match="expected 'is_init' to have dtype torch.bool"):
            estimator.for_recurrent(gamma=0.9, lmbda=0.95, value_network=net)(td.clone())


#: The private upstream names the wrappers above stand for (attributes and imports).
WRAPPED = {
    "_call_actor_net", "_self_set_grad_enabled", "_self_set_skip_existing", "_standardize_by_group",
    "_call_value_nets", "_get_time_dim", "_prepare_shifted_tensordict", "_mask_shifted_output",
    "_expand_to_match", "_group_ids", "_storage_index", "_last_cursor_index", "_set_last_cursor",
    "_len_along_dim0", "_mutation_revision", "_attached_entities_iter", "_save_hooks", "_load_hooks",
    "_maybe_init_from_storage", "_REPLACEMENT_DISPATCH", "_tensordict",
    "_new_unsafe", "_dim_extend", "_cursor", "_next_value", "_last_cursor_index_value",
    "_readiness_condition", "_notify_replay_state_change", "_increment_counter",
    "_sample_call_count_value", "_sampled_item_count_value", "_set_sample_names",
    "_validate_recurrent_inputs", "_futures_lock", "_wait_for_init",
}


def test_no_module_but_compat_touches_the_wrapped_private_names():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # getattr(x, "_name")
                names = [node.value]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("torchrl", "tensordict"):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {n}" for n in names if n in WRAPPED]
    assert not offenders, "use torchrl_ext._compat instead:\n" + "\n".join(offenders)


_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def _upstream_private_names(cls: type) -> set[str]:
    """Private names a TorchRL / TensorDict class defines or sets on ``self`` in its methods.

    Hydra's reserved config keys (``_target_``, ``_partial_``, ...) are its public
    instantiation protocol, not private state, so they are left out."""
    names = {a for a in vars(cls) if a.startswith("_") and not a.startswith("__") and a not in _HYDRA_KEYS}
    for member in vars(cls).values():
        member = getattr(member, "fget", member)
        member = inspect.unwrap(member) if callable(member) else member
        if not inspect.isfunction(member):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(member)))
        except (OSError, TypeError, SyntaxError):
            continue
        names |= {
            node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr.startswith("_") and not node.attr.startswith("__")
        }
    return names


def test_no_class_reads_private_upstream_attributes_on_self_outside_compat():
    """Subclasses of TorchRL classes (and the mixins they are built from) reach TorchRL's private
    state through ``_compat`` or public properties (``self.storage``, not ``self._storage``)."""
    hooks = {name for _, name in _compat.HOOKS}
    found = set()
    for cls in _package_classes():
        upstream = [b for b in cls.__mro__ if b.__module__.split(".")[0] in ("torchrl", "tensordict")]
        if not upstream:
            continue
        names = set().union(*map(_upstream_private_names, upstream)) - hooks
        for own in cls.__mro__:
            if not own.__module__.startswith("torchrl_ext") or own.__module__ == "torchrl_ext._compat":
                continue
            module = str(Path(inspect.getsourcefile(own)).relative_to(PACKAGE))
            first = inspect.getsourcelines(own)[1] - 1  # node line numbers count from the class
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(own)))):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "self" and node.attr in names:
                    found.add((module, first + node.lineno, node.attr))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                        and isinstance(node.args[0], ast.Name) and node.args[0].id == "self" \
                        and isinstance(node.args[1], ast.Constant) and node.args[1].value in names:
                    found.add((module, first + node.lineno, node.args[1].value))
    assert not found, "use torchrl_ext._compat or a public property:\n" + "\n".join(map(str, sorted(found)))


def test_no_module_reads_private_upstream_attributes_of_other_objects_outside_compat():
    """``obj._name`` and ``getattr(obj, "_name")`` on any object, for the private state of every
    TorchRL / TensorDict class the package builds on (``super()._hook()`` calls excepted)."""
    names = set()
    for cls in _package_classes():
        for base in cls.__mro__:
            if base.__module__.split(".")[0] in ("torchrl", "tensordict"):
                names |= _upstream_private_names(base)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in names:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id == "self":
                    continue  # the rule above, which knows each class's own bases
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue  # an overridden hook calling TorchRL's (listed in _compat.HOOKS)
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in names \
                    and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "use torchrl_ext._compat:\n" + "\n".join(found)
