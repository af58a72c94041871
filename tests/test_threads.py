"""Writers and samplers on several threads at once (as collector threads and a learner share a
buffer): no sample sees a torn row or window, and the buffer ends holding exactly what was written.
Thread switches are forced every microsecond, so the interleavings vary from run to run; every
check is an invariant that holds under any interleaving."""
from __future__ import annotations

import sys
import threading
import traceback
from typing import Any, Callable

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import FastTensorStorage


@pytest.fixture(autouse=True)
def frequent_thread_switches():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _run(writers: list[Callable[[], None]], sampler: Callable[[], bool], samplers: int = 2) -> list[str]:
    """Runs the writers and ``samplers`` threads of ``sampler`` (a check that returns whether it
    sampled) until the writers are done and each sampler has sampled a few times; the failures."""
    errors: list[str] = []
    done = threading.Event()

    def guarded(body: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except Exception:  # reported by the test, not lost in the thread
                errors.append(traceback.format_exc())
        return run

    def keep_sampling() -> None:
        sampled = 0
        while (not done.is_set() or sampled < 3) and not errors:
            sampled += sampler()

    writing = [threading.Thread(target=guarded(w)) for w in writers]
    sampling = [threading.Thread(target=guarded(keep_sampling)) for _ in range(samplers)]
    for thread in writing + sampling:
        thread.start()
    for thread in writing:
        thread.join(timeout=120)
    done.set()
    for thread in sampling:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in writing + sampling), "a thread hung"
    return errors


def test_per_env_rings_written_by_two_threads_keep_every_env_in_order():
    num_envs, length, steps = 4, 16, 300
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=length, sampler=TrajectorySampler(batch_length=3),
                             batch_size=8)

    def writer(envs: list[int]) -> Callable[[], None]:
        def write() -> None:
            for t in range(steps):
                x = torch.tensor([e * 10_000.0 + t for e in envs])
                rb.extend(TensorDict({"x": x, "next": {"x": x + 1}}, [len(envs)]), env_ids=torch.tensor(envs))
        return write

    def sample() -> bool:
        if min(rb.storage.current_size.tolist()) < 3:
            return False
        batch = rb.sample()
        x = batch["x"]
        assert (x[:, 1:] - x[:, :-1] == 1).all(), f"a window mixes steps: {x.tolist()}"
        assert (batch["next", "x"] == x + 1).all(), "a step is torn"
        return True

    assert _run([writer([0, 1]), writer([2, 3])], sample) == []
    for env in range(num_envs):
        stored = rb.storage.read(torch.full((length,), env), torch.arange(steps - length, steps))["x"]
        assert stored.tolist() == [env * 10_000.0 + t for t in range(steps - length, steps)]


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_flat_buffer_written_by_two_threads_never_tears_a_row(prioritized):
    capacity, rows = 128, 7
    if prioritized:
        rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=FastTensorStorage(capacity), batch_size=16)
    else:
        rb = TensorDictReplayBuffer(storage=FastTensorStorage(capacity), batch_size=16)

    def writer(base: int) -> Callable[[], None]:
        def write() -> None:
            for t in range(300):
                v = torch.arange(base + rows * t, base + rows * (t + 1), dtype=torch.float32).unsqueeze(-1)
                rb.extend(TensorDict({"obs": v.expand(rows, 3).clone(), "next": {"obs": v + 1}}, [rows]))
        return write

    def intact(data: TensorDict) -> bool:
        obs = data["obs"]
        return bool((obs == obs[:, :1]).all() and (data["next", "obs"] == obs[:, :1] + 1).all())

    def sample() -> bool:
        if len(rb) < 16:
            return False
        batch = rb.sample()
        assert intact(batch), f"a sampled row is torn: {batch['obs'][:3].tolist()}"
        if prioritized:
            rb.update_priority(batch["index"], batch["obs"][:, 0] % 13 + 0.5)
        return True

    assert _run([writer(0), writer(1_000_000)], sample) == []
    assert len(rb) == capacity and intact(rb[:])
    if prioritized:  # the sums above the leaves still add up after the concurrent writes
        tree = rb.sampler.tree
        leaves = tree.leaves[:capacity].double().sum()
        torch.testing.assert_close(tree.summary().double(), leaves, rtol=1e-6, atol=0)
