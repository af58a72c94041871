"""Which locks each buffer operation holds, checked from inside the operation.

TorchRL's buffers hold a thread lock (``_replay_lock``) and, once shared with other processes,
a process lock (``_write_lock``) around every read and write of their parts. An operation that
skips one of them races the threads or processes that hold it: steps dequeued twice, rows torn
between two writes, a batch's priorities landing on another writer's rows.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext import _compat, fastpath
from torchrl_ext.distributed import share_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer
from torchrl_ext.samplers import PrioritizedTrajectorySampler
from torchrl_ext.storages import FastTensorStorage


def _held_by_another_thread(lock) -> bool:
    """Whether another thread fails to take ``lock`` right now (it is held)."""
    taken = []

    def attempt() -> None:
        got = lock.acquire(False)
        taken.append(got)
        if got:
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return not taken[0]


def _ring_buffer(prioritized: bool = False) -> EnvRingReplayBuffer:
    sampler = PrioritizedTrajectorySampler(batch_length=1) if prioritized else None
    rb = EnvRingReplayBuffer(num_envs=2, max_length=4, sampler=sampler)
    rb.extend(TensorDict({"obs": torch.arange(6.0).reshape(2, 3)}, [2, 3]))
    return rb


RING_OPERATIONS = {
    "dequeue": lambda rb: rb.dequeue(1),
    "remove_up_to": lambda rb: rb.remove_up_to(1),
    "clear": lambda rb: rb.clear(),
    "gather_all": lambda rb: rb.gather_all(),
    "read": lambda rb: rb.read(torch.tensor([0]), torch.tensor([1])),
    "empty": lambda rb: rb.empty(),
}


@pytest.mark.parametrize("operation", sorted(RING_OPERATIONS))
def test_ring_operations_hold_both_locks_of_a_shared_buffer(operation):
    rb = share_buffer(_ring_buffer())
    seen = []
    storage = rb.storage
    for name in ("shrink", "reset", "read", "gather_all"):  # whichever the operation reaches
        original = getattr(storage, name)

        def spy(*args, _original=original, **kwargs):
            seen.append((_held_by_another_thread(_compat.replay_lock(rb)),
                         _held_by_another_thread(_compat.write_lock(rb))))
            return _original(*args, **kwargs)

        setattr(storage, name, spy)
    RING_OPERATIONS[operation](rb)
    assert seen and all(held == (True, True) for held in seen), seen


def test_a_second_share_buffer_keeps_the_counters_and_the_process_lock():
    rb = share_buffer(_ring_buffer())
    lock, positions, sizes = _compat.write_lock(rb), rb.storage.positions, rb.storage.sizes
    assert share_buffer(rb) is rb
    # The processes started after the first call hold these: new ones would cut them off.
    assert _compat.write_lock(rb) is lock
    assert rb.storage.positions.data_ptr() == positions.data_ptr()
    assert rb.storage.sizes.data_ptr() == sizes.data_ptr()
    rb.extend(TensorDict({"obs": torch.tensor([7.0, 8.0])}, [2]))
    assert positions.tolist() == [4, 4]


@pytest.mark.parametrize("fast", [True, False])
def test_extend_writes_its_priorities_before_another_thread_writes_the_rows(fast):
    """Thread B extends the same rows while thread A is between its write and its priority
    write-back: B must wait, so the rows end with B's data and B's priorities."""
    with fastpath(fast):
        rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=FastTensorStorage(4), batch_size=2)
        # A first write allocates the storage: later ones may take the one-layer extend.
        rb.extend(TensorDict({"obs": torch.zeros(4), "td_error": torch.ones(4)}, [4]))
        real_update = rb.update_priority
        second = TensorDict({"obs": torch.full((4,), 2.0), "td_error": torch.full((4,), 0.5)}, [4])
        other = threading.Thread(target=rb.extend, args=(second,))
        waited = []

        def update_priority(index, priority):
            if not other.is_alive() and not waited:  # only during A's extend
                other.start()
                other.join(0.3)
                waited.append(other.is_alive())  # still blocked on the buffer's lock
            real_update(index, priority)

        rb.update_priority = update_priority
        rb.extend(TensorDict({"obs": torch.full((4,), 1.0), "td_error": torch.full((4,), 100.0)}, [4]))
        other.join(10)
        assert waited == [True]
        assert rb.storage.get(torch.arange(4))["obs"].tolist() == [2.0] * 4
        assert rb.sampler._tree.leaves[:4].tolist() == pytest.approx([0.5] * 4)


def test_empty_holds_the_buffer_lock():
    rb = _ring_buffer(prioritized=True)
    held = []
    original = rb.storage._empty

    def spy():
        held.append(_held_by_another_thread(_compat.replay_lock(rb)))
        original()

    rb.storage._empty = spy
    rb.empty()
    assert held == [True]


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, float("inf")])
def test_blocking_extend_refuses_a_bad_timeout(timeout):
    rb = _ring_buffer()
    before = rb.storage.current_pos.tolist()
    with pytest.raises(ValueError, match=r"timeout must be .*got timeout=.*pass seconds to wait"):
        rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]), blocking=True, timeout=timeout)
    with pytest.raises(TypeError, match="timeout must be a real number, got '5'"):
        rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]), blocking=True, timeout="5")
    assert rb.storage.current_pos.tolist() == before


def test_blocking_extend_keeps_one_deadline_when_the_room_is_taken_again():
    """Each wake-up finds the room taken by another producer: the writer waits out what is left
    of its timeout, not the whole timeout again."""
    rb = _ring_buffer()
    rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]))  # full: 4 steps per env
    asked = []

    def wait_for_room(env_ids, steps, timeout):
        asked.append(timeout)
        assert len(asked) < 100, f"the writer keeps waiting: asked for {asked[:5]}..."
        time.sleep(min(timeout, 0.05))
        return timeout > 0  # woken for room that is gone again by the time the lock is taken

    rb.writer.wait_for_room = wait_for_room
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]), blocking=True, timeout=0.2)
    assert time.monotonic() - start < 2.0
    assert asked[0] == pytest.approx(0.2, abs=0.05) and asked[-1] == 0.0
    assert all(later <= earlier for earlier, later in zip(asked, asked[1:]))


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_stop_undone_by_revive_before_the_writer_looks_still_returns_none(timeout):
    """stop() then revive() (a paused collector resumed) while a blocking write waits: the wait
    ends because of the stop, so the write returns None; it raised "TimeoutError after None s"."""
    rb = _ring_buffer()
    rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]))  # full: 4 steps per env
    real_wait = rb.writer.wait_for_room

    def wait_for_room(env_ids, steps, remaining):
        rb.writer.stop()
        refused = real_wait(env_ids, steps, remaining)
        rb.writer.revive()  # before extend reads writer.stopped
        return refused

    rb.writer.wait_for_room = wait_for_room
    before = rb.storage.current_pos.tolist()
    assert rb.extend(TensorDict({"obs": torch.ones(2)}, [2]), blocking=True, timeout=timeout) is None
    assert rb.storage.current_pos.tolist() == before
