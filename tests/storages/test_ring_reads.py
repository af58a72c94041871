"""EnvRingStorage reads: numpy gathers equal the stored rows, and follow the leaves the ring holds."""
from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import NStepSampler, TrajectorySampler
from torchrl_ext.storages import EnvRingStorage

E, L = 3, 5


def step(values: list[float], dtype: torch.dtype = torch.float32) -> TensorDict:
    """One step of every env: ``obs`` = [v, 2v] (``dtype``), ``("next", "obs")`` = v + 0.5, a
    uint8 frame, and ``("next", "done")`` every third value."""
    v = torch.tensor(values)
    return TensorDict({
        "obs": torch.stack([v, 2 * v], -1).to(dtype),
        "frame": (v.long() % 256).to(torch.uint8).view(-1, 1, 1).expand(-1, 2, 2).clone(),
        "next": {
            "obs": (v + 0.5).unsqueeze(-1),
            "reward": torch.ones(len(values), 1),
            "done": (v.long() % 3 == 0).unsqueeze(-1),
        },
    }, [len(values)])


def expected(storage: EnvRingStorage, env: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
             key) -> torch.Tensor:
    """The stored leaf at ``(env, end)`` for "next" keys, at ``(env, start)`` otherwise, indexed
    on the ``[E, L]`` TensorDict (an independent path: advanced indexing of the leaf)."""
    position = end if isinstance(key, tuple) and key[0] == "next" else start
    return storage._rings.data.get(key)[env, position % L]


def filled(dtype: torch.dtype = torch.float32, grad: bool = False, writes: int = 8) -> EnvRingStorage:
    storage = EnvRingStorage(E, L)
    for t in range(writes):
        data = step([10.0 * e + t for e in range(E)], dtype)
        if grad and t == writes - 1:  # stored detached (tests/storages/test_ring_autograd.py)
            data.set("obs", data.get("obs").requires_grad_())
        write(storage, data)
    return storage


def write(storage: EnvRingStorage, data: TensorDict) -> None:
    EnvRingReplayBuffer(storage=storage).extend(data)


def coordinates(storage: EnvRingStorage, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    env = torch.randint(E, (n,), generator=g)
    newest = storage.current_pos[env] - 1
    start = newest - torch.randint(L, (n,), generator=g)
    end = torch.minimum(start + torch.randint(3, (n,), generator=g), newest)
    return env, start, end


@pytest.mark.parametrize("case", ["float32", "bfloat16", "requires_grad"])
def test_chain_and_window_reads_equal_the_stored_rows(case):
    storage = filled(torch.bfloat16 if case == "bfloat16" else torch.float32, grad=case == "requires_grad")
    assert (storage._rings.read_columns() is None) == (case == "bfloat16")  # numpy only where it can view
    env, start, end = coordinates(storage, 64, seed=0)
    chain = storage.gather_chain(env, start, end)
    window = storage.gather(env.view(8, 8), start.view(8, 8))
    assert chain.batch_size == (64,) and window.batch_size == (8, 8)
    for key in storage._rings.data.keys(include_nested=True, leaves_only=True):
        want = expected(storage, env, start, end, key)
        assert torch.equal(chain.get(key), want), key
        assert chain.get(key).dtype == want.dtype
        same_step = expected(storage, env, start, start, key).view(8, 8, *want.shape[1:])
        assert torch.equal(window.get(key), same_step), key
    assert not chain.get("obs").requires_grad


def test_reads_follow_the_leaves_after_share_memory_load_and_pickling():
    # The numpy views must be of the leaves held now: each of these puts them in new memory.
    def check(storage: EnvRingStorage, value: float) -> None:
        write(storage, step([value] * E))
        env = torch.arange(E)
        newest = storage.current_pos - 1
        chain = storage.gather_chain(env, newest, newest)
        assert chain["obs"][:, 0].tolist() == [value] * E
        assert chain["next", "obs"][:, 0].tolist() == [value + 0.5] * E

    storage = filled()
    check(storage, 100.0)  # builds the numpy views
    storage.share_memory_()
    check(storage, 101.0)
    fresh = EnvRingStorage(E, L)
    fresh.load_state_dict(storage.state_dict())
    check(fresh, 102.0)
    copy = pickle.loads(pickle.dumps(filled()))
    check(copy, 103.0)


def test_reads_of_an_empty_storage_build_their_views_on_the_first_write():
    storage = EnvRingStorage(E, L)
    assert storage._rings.read_columns() is None
    write(storage, step([1.0, 2.0, 3.0]))
    chain = storage.gather_chain(torch.arange(E), torch.zeros(E, dtype=torch.long), torch.zeros(E, dtype=torch.long))
    assert chain["obs"][:, 0].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("sampler", ["nstep", "windows"])
def test_samples_equal_the_stored_rows_at_their_index(sampler):
    rb = EnvRingReplayBuffer(
        num_envs=E, max_length=L, batch_size=12,
        sampler=NStepSampler(3, gamma=0.5) if sampler == "nstep" else TrajectorySampler(batch_length=2),
    )
    for t in range(9):
        rb.extend(step([10.0 * e + t for e in range(E)]))
    torch.manual_seed(0)
    batch = rb.sample()
    index = batch["index"]
    env, start = index[..., 0], index[..., 1]
    end = index[..., 2] if sampler == "nstep" else start
    for key in ("obs", "frame", ("next", "obs"), ("next", "done")):
        assert torch.equal(batch.get(key), expected(rb.storage, env, start, end, key)), key
