"""Shared memory on one machine: two spawned writer processes, the sampler in the parent.

Measures: no transition lost, none duplicated and no torn row in a shared
per-env prioritized ring written by two ``torch.multiprocessing`` spawn
processes while the parent samples and writes priorities; the parent's
prioritized sampler rebuilding its leaves from the shared cursors; and the
refusals (flat prioritized sampler, dedup storage, unshared ring) with the fix.
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from tests.distributed._workers import process_writer, tagged_steps, torn_rows
from torchrl_ext.distributed import share_buffer
from torchrl_ext.presets import alf_replay_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer
from torchrl_ext.storages import DedupEnvRingStorage, FastTensorStorage

STEPS_PER_ENV = 1_000
WRITERS = {0: [0, 1], 1: [2, 3]}  # process -> the envs it owns
TAG_BASE = 1_000_000


@pytest.mark.slow
def test_two_spawned_writers_lose_nothing_while_the_parent_samples() -> None:
    torch.set_num_threads(1)
    rb = alf_replay_buffer(4, STEPS_PER_ENV, batch_length=2, batch_size=16, prioritized_sampling=True)
    share_buffer(rb, example=tagged_steps(torch.arange(4)))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=process_writer, args=(rb, envs, k * TAG_BASE, STEPS_PER_ENV, 10))
             for k, envs in WRITERS.items()]
    for p in procs:
        p.start()
    samples = 0
    try:
        while any(p.is_alive() for p in procs):
            if len(rb) < 64:  # the children are still importing: do not spin
                time.sleep(0.1)
                continue
            batch = rb.sample()  # concurrent with the writers
            assert torn_rows(batch) == 0
            assert bool((batch["tag"][:, 1] - batch["tag"][:, 0] == 2).all())
            batch["td_error"] = torch.rand(16, 2)
            rb.update_tensordict_priority(batch)  # priorities live in this process
            samples += 1
            time.sleep(0.005)
    finally:
        for p in procs:
            p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]

    data, _ = rb.gather_all()
    assert data.shape == (4, STEPS_PER_ENV) and len(rb) == 4 * STEPS_PER_ENV
    assert torn_rows(data) == 0
    tags = data["tag"].reshape(-1)
    expected = torch.cat([k * TAG_BASE + torch.arange(2 * STEPS_PER_ENV) for k in WRITERS])
    assert tags.numel() == tags.unique().numel(), "a transition was stored twice"
    assert torch.equal(tags.sort().values, expected), "a transition was lost"
    # The parent's priority tree covers every window the children wrote.
    rb.update_window_priority(torch.tensor([3]), torch.tensor([STEPS_PER_ENV - 2]), 1e12)
    last = rb.sample()
    assert last["tag"][:, 1].tolist() == [TAG_BASE + 2 * STEPS_PER_ENV - 1] * 16


def test_flat_prioritized_sampler_is_refused_with_the_fix() -> None:
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(16, shared_init=True))
    with pytest.raises(RuntimeError, match=r"PrioritizedSampler cannot be shared between processes.*"
                                           r"alf_replay_buffer.*ray_replay_buffer"):
        share_buffer(rb)
    # Handing it to a spawned process anyway fails the same way, before the process starts.
    rb.share(True)
    proc = mp.get_context("spawn").Process(target=process_writer, args=(rb, [0], 0, 1, 1))
    with pytest.raises(RuntimeError, match="PrioritizedSampler cannot be shared between processes"):
        proc.start()


def test_other_refusals_name_the_component_and_the_fix() -> None:
    dedup = EnvRingReplayBuffer(storage=DedupEnvRingStorage(2, 4))
    with pytest.raises(RuntimeError, match="DedupEnvRingStorage cannot be shared.*ray_replay_buffer"):
        share_buffer(dedup, example=TensorDict({"obs": torch.zeros(2, 1)}, [2]))
    empty = alf_replay_buffer(2, 4)
    with pytest.raises(ValueError, match="pass example="):
        share_buffer(empty)
    with pytest.raises(ValueError, match="shared_init=True"):
        share_buffer(EnvRingReplayBuffer.__mro__[1](storage=FastTensorStorage(16)))
    # A ring sent to a spawned process without sharing would silently diverge: refused.
    unshared = alf_replay_buffer(2, 4)
    unshared.extend(tagged_steps(torch.arange(2)))
    proc = mp.get_context("spawn").Process(target=process_writer, args=(unshared, [0], 0, 1, 1))
    with pytest.raises(RuntimeError, match="without share_memory_"):
        proc.start()


def test_a_shared_ring_keeps_its_cursors_in_shared_memory() -> None:
    rb = alf_replay_buffer(2, 4, batch_length=1, batch_size=2)
    share_buffer(rb, example=tagged_steps(torch.arange(2)))
    storage = rb.storage
    assert storage.is_shared and storage.positions.is_shared() and storage.sizes.is_shared()
    assert all(leaf.is_shared() for leaf in storage._rings.data.values(True, True))
    rb.extend(tagged_steps(torch.tensor([5, 6])), env_ids=torch.tensor([1, 0]))
    # The numpy views the writer updates are the shared tensors.
    assert storage.current_pos.tolist() == [1, 1] and len(rb) == 2
    assert rb.read(torch.tensor([0]), torch.tensor([0]))["tag"].tolist() == [6]


def test_nstep_sampler_reads_a_shared_init_storage_another_process_allocated() -> None:
    """A shared_init storage a spawned process allocated reads as not initialized in the parent
    until attached (TorchRL's get does it): the n-step sampler attaches it too."""
    from tests.distributed._workers import write_grid
    from torchrl_ext.replay_buffers import TensorDictReplayBuffer
    from torchrl_ext.samplers import NStepSampler

    rb = TensorDictReplayBuffer(storage=FastTensorStorage(16, ndim=2, shared_init=True),
                                sampler=NStepSampler(3, 0.5), batch_size=4)
    share_buffer(rb)
    proc = mp.get_context("spawn").Process(target=write_grid, args=(rb, 6))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0 and len(rb) == 12
    batch = rb.sample()
    # Start t of either env: rewards of up to 3 steps, cut at the newest stored step (5).
    steps = (6 - batch["obs"].reshape(-1)).clamp(max=3)
    expected = (1 - 0.5 ** steps) / (1 - 0.5)
    assert torch.allclose(batch["next", "reward"].reshape(-1).double(), expected)


def test_state_dict_and_dumps_of_a_shared_buffer_wait_for_the_process_lock(tmp_path) -> None:
    """Writes of other processes hold the shared process lock: a snapshot taken without it
    mixed their rows. state_dict and dumps wait for it."""
    import threading

    from torchrl_ext import _compat

    from torchrl_ext.replay_buffers import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8))
    rb.extend(tagged_steps(torch.arange(4)))
    share_buffer(rb)
    for snapshot in (rb.state_dict, lambda: rb.dumps(tmp_path / "ckpt")):
        done = threading.Event()
        with _compat.write_lock(rb):  # as a writer in another process holds it
            worker = threading.Thread(target=lambda: (snapshot(), done.set()), daemon=True)
            worker.start()
            assert not done.wait(0.3), "the snapshot did not wait for the process lock"
        assert done.wait(30)
        worker.join(30)
