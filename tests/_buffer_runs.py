"""Scripted runs of every buffer family (write, sample, write priorities back), for tests that
compare a run with a variant of it: inside or outside inference mode, saved and loaded, copied.

A :class:`BufferRun` holds a buffer and the data stream that feeds it; ``run(k)`` plays round
``k`` and returns what it observed (samples, stored rows) as one TensorDict. Its ``buffer``
can be swapped for a loaded or copied one between rounds; the data stream goes on.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch
from tensordict import TensorDict
from torchrl.data import RandomSampler, SamplerWithoutReplacement

from torchrl_ext.replay_buffers import (
    EnvRingReplayBuffer,
    OnPolicyReplayBuffer,
    PathGAEReplayBuffer,
    PrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    VTraceReplayBuffer,
)
from torchrl_ext.samplers import (
    DistinctUniformSampler,
    NStepSampler,
    PrioritizedNStepSampler,
    PrioritizedSampler,
    PrioritizedSamplerWithoutReplacement,
    PrioritizedTrajectorySampler,
    TrajectorySampler,
)
from torchrl_ext.storages import (
    DedupEnvRingStorage,
    EnvRingStorage,
    EpisodicEnvRingStorage,
    FastMemmapStorage,
    FastTensorStorage,
)

from torchrl_ext.presets import harl_off_policy_buffer, harl_rollout_buffer, velora_replay_buffer

from tests.presets.test_harl_off_policy import harl_step
from tests.storages.test_dedup import Streams

ROUNDS = 6


class BufferRun:
    """``buffer`` and a round script ``play(buffer, k) -> TensorDict`` over a data stream."""

    def __init__(self, buffer: Any, play: Callable[[Any, int], TensorDict]) -> None:
        self.buffer, self._play = buffer, play

    def run(self, k: int) -> TensorDict:
        return self._play(self.buffer, k).clone()  # a copy now: a round may return views of stored rows


class RewrittenWrites:
    """``buffer`` whose writes (``extend``, ``add``, ``insert``, ``store``) get their TensorDict
    rewritten by ``form`` first; everything else is the buffer's own."""

    WRITES = ("extend", "add", "insert", "store")

    def __init__(self, buffer: Any, form: Callable[[TensorDict], TensorDict]) -> None:
        self.__dict__.update(buffer=buffer, form=form)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.buffer, name)
        if name not in self.WRITES:
            return attr
        return lambda data, *args, **kwargs: self.write(attr, data, *args, **kwargs)

    def write(self, write: Callable[..., Any], data: TensorDict, *args: Any, **kwargs: Any) -> Any:
        return write(self.form(data), *args, **kwargs)

    def __getitem__(self, index: Any) -> Any:
        return self.buffer[index]

    def __iter__(self) -> Any:
        return iter(self.buffer)

    def __len__(self) -> int:
        return len(self.buffer)


def assert_same(got: list[TensorDict], want: list[TensorDict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


# ---------------------------------------------------------------- flat buffers

def rows(start: int, n: int) -> TensorDict:
    values = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": values.unsqueeze(-1).expand(n, 3).clone(), "reward": values.unsqueeze(-1),
                       "next": {"obs": values.unsqueeze(-1).expand(n, 3) + 1,
                                "reward": values.unsqueeze(-1), "done": (values % 5 == 4).unsqueeze(-1)}}, [n])


def _write_back(rb: Any, batch: TensorDict) -> TensorDict:
    if isinstance(rb.sampler, PrioritizedSampler):
        batch.set("td_error", batch["reward"].squeeze(-1) + 0.5)
        rb.update_tensordict_priority(batch)
    return batch.exclude("td_error")


# TorchRL's own LazyTensorStorage is left out: first written inside inference mode, it refuses
# every later write outside it (docs/migrating.md).
FLAT_STORAGES = {
    "fast": lambda: FastTensorStorage(40),
    "memmap": lambda: FastMemmapStorage(40),
}
FLAT_SAMPLERS = {
    "random": RandomSampler,
    "without-replacement": SamplerWithoutReplacement,
    "distinct": DistinctUniformSampler,
    "prioritized": lambda: PrioritizedSampler(40, alpha=0.7, beta=0.5),
    "prioritized-without-replacement": lambda: PrioritizedSamplerWithoutReplacement(40, 0.7, 0.5),
}


def flat_run(storage: str, sampler: str) -> BufferRun:
    def play(rb: Any, k: int) -> TensorDict:
        rb.extend(rows(9 * k, 9))  # wraps: 6 x 9 rows into 40
        return TensorDict({"batch": _write_back(rb, rb.sample()), "stored": rb[:]["obs"]}, [])

    rb = TensorDictReplayBuffer(storage=FLAT_STORAGES[storage](), sampler=FLAT_SAMPLERS[sampler](), batch_size=8)
    return BufferRun(rb, play)


def prioritized_run(ndim: int) -> BufferRun:
    def play(rb: Any, k: int) -> TensorDict:
        data = rows(6 * k, 6)
        rb.extend(data if ndim == 1 else data.reshape(2, 3))
        return _write_back(rb, rb.sample())

    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(24, ndim=ndim), batch_size=5)
    return BufferRun(rb, play)


def prioritized_nstep_run() -> BufferRun:
    def play(rb: Any, k: int) -> TensorDict:
        rb.extend(rows(6 * k, 6).reshape(2, 3))  # [num_envs=2, T=3]
        return _write_back(rb, rb.sample())

    sampler = PrioritizedNStepSampler(16, alpha=1.0, beta=0.5, n_step=2, gamma=0.5)
    return BufferRun(TensorDictReplayBuffer(storage=FastTensorStorage(16, ndim=2), sampler=sampler, batch_size=6),
                     play)


# ---------------------------------------------------------------- per-env rings

FIRST, MID, LAST = 0, 1, 2
RING_STORAGES = {
    "ring": lambda: EnvRingStorage(3, 8),
    "ring-batch-major": lambda: EnvRingStorage(3, 8, time_major=False),
    "episodic": lambda: EpisodicEnvRingStorage(3, 8, record_episodic_return=True),
    "dedup": lambda: DedupEnvRingStorage(3, 8, num_stack=2),
}
RING_SAMPLERS = {
    "trajectory": lambda: TrajectorySampler(batch_length=2),
    "nstep": lambda: NStepSampler(n_step=2, gamma=0.9),
    "prioritized-trajectory": lambda: PrioritizedTrajectorySampler(2, alpha=0.7, beta=0.4),
}


def _ring_steps(seed: int) -> Callable[[list[int]], TensorDict]:
    """Steps of 3 envs: stacked frames of episodes that end at random, ALF step types."""
    streams = Streams(3, 2, 0, "reset", random.Random(seed))
    t = [0, 0, 0]

    def steps(env_ids: list[int]) -> TensorDict:
        rows = [streams.step(e) for e in env_ids]
        step_type = []
        for e, (_, _, done, _) in zip(env_ids, rows):
            step_type.append(FIRST if t[e] == 0 else (LAST if done else MID))
            t[e] = 0 if done else t[e] + 1
        return TensorDict({
            "observation": torch.stack([r[0] for r in rows]),
            "reward": torch.tensor([r[3] for r in rows]),
            "step_type": torch.tensor(step_type),
            "discount": torch.tensor([0.0 if s == LAST else 1.0 for s in step_type]),
            "next": {"observation": torch.stack([r[1] for r in rows]),
                     "done": torch.tensor([r[2] for r in rows]).unsqueeze(-1),
                     "reward": torch.tensor([r[3] for r in rows]).unsqueeze(-1)},
        }, [len(env_ids)])

    return steps


def ring_run(storage: str, sampler: str) -> BufferRun:
    steps = _ring_steps(seed=4)

    def play(rb: Any, k: int) -> TensorDict:
        for _ in range(2):  # every env together (the step write), then a subset
            rb.extend(steps([0, 1, 2]))
        rb.extend(steps([2, 0]), env_ids=torch.tensor([2, 0]))
        batch = rb.sample()
        if isinstance(rb.sampler, PrioritizedTrajectorySampler):
            env, pos = rb.storage.earliest_position(), rb.storage.current_pos - 2
            rb.sampler.update_window_priority(torch.arange(3), pos, (env + k + 1).double())
        newest = rb.read(torch.tensor([0, 1, 2]), rb.storage.current_pos - 1)
        return TensorDict({"batch": batch, "newest": newest}, [])

    rb = EnvRingReplayBuffer(storage=RING_STORAGES[storage](), sampler=RING_SAMPLERS[sampler](), batch_size=6)
    return BufferRun(rb, play)


# ---------------------------------------------------------------- on-policy

def _on_policy_step(v: float, t: int) -> TensorDict:
    return TensorDict({"observation": torch.full((2, 3), v), "state_value": torch.full((2, 1), v),
                       "action_log_prob": torch.full((2, 1), -0.1 * t), "sample_log_prob": torch.full((2, 1), -0.2),
                       "next": {"observation": torch.full((2, 3), v + 1), "reward": torch.full((2, 1), v % 3),
                                "done": torch.full((2, 1), t == 2), "terminated": torch.full((2, 1), t == 2)}}, [2])


ON_POLICY = {
    "gae": lambda: OnPolicyReplayBuffer(4, gamma=0.9, gae_lambda=0.8),
    "gae-recurrent": lambda: OnPolicyReplayBuffer(4, gamma=0.9, gae_lambda=0.8, recurrent=True),
    "vtrace": lambda: VTraceReplayBuffer(4, gamma=0.9),
}


def on_policy_run(buffer: str) -> BufferRun:
    def play(rb: Any, k: int) -> TensorDict:
        for t in range(4):
            rb.insert(_on_policy_step(float(10 * k + t), t))
        rb.compute_returns()
        batches = list(rb.generate_batches(num_mini_batch=2))
        stored = rb.storage.data.clone()
        rb.after_update()
        return TensorDict({"batches": torch.stack(batches), "stored": stored}, [])

    return BufferRun(ON_POLICY[buffer](), play)


def path_gae_run() -> BufferRun:
    def play(rb: Any, k: int) -> TensorDict:
        v = torch.arange(3.0).unsqueeze(-1) + k
        rb.store(TensorDict({"observation": v.expand(3, 2), "state_value": v, "next": {"reward": v % 2}}, [3]))
        rb.finish_path(last_val=float(k))
        return TensorDict({"batch": rb.sample_batch(), "stored": rb.storage[:]}, [])

    return BufferRun(PathGAEReplayBuffer(12, 4, gamma=0.5, lam=0.9), play)


# ---------------------------------------------------------------- presets with their own paths

def harl_fp_run() -> BufferRun:
    """HARL's FP layout: per-agent n-step chains under an agent group."""
    def play(rb: Any, k: int) -> TensorDict:
        for t in range(3 * k, 3 * k + 3):
            rb.extend(harl_step(t, num_threads=2, num_agents=3, fp=True, done_at=7))
        return rb.sample()

    return BufferRun(harl_off_policy_buffer(16, 2, batch_size=5, n_step=2, gamma=0.5, state_type="FP"), play)


HARL_ROLLOUTS = {
    "feed-forward": {"num_mini_batch": 3},
    "chunked": {"num_mini_batch": 2, "use_recurrent_policy": True, "data_chunk_length": 2},
    "naive": {"num_mini_batch": 3, "use_naive_recurrent_policy": True},
}


def harl_rollout_run(sampler: str) -> BufferRun:
    """HARL's rollout buffer: one epoch of minibatches per rollout, steps carried over."""
    def play(rb: Any, k: int) -> TensorDict:
        for t in range(4):
            v = torch.full((3, 1), 10.0 * k + t)
            rb.storage.insert(TensorDict({"obs": v + torch.arange(3.0).unsqueeze(1), "agents": {"x": v.unsqueeze(1)},
                                          "next": {"obs": v + 1}}, [3]))
        batches = torch.cat([batch.reshape(-1) for batch in rb])
        stored = rb.storage.data.clone()
        rb.storage.after_update()
        return TensorDict({"batches": batches, "stored": stored}, [])

    return BufferRun(harl_rollout_buffer(4, **HARL_ROLLOUTS[sampler]), play)


def velora_run() -> BufferRun:
    """velora's add_multi (overfull in round 3) and sample, with hidden states."""
    def play(rb: Any, k: int) -> TensorDict:
        n = 12 if k == 3 else 4
        ids = torch.arange(10.0 * k, 10.0 * k + n)
        rb.add_multi(ids[:, None].expand(n, 2), ids, ids, ids[:, None].expand(n, 2) + 1, ids % 3 == 0,
                     ids[:, None].expand(n, 3) / 10)
        return TensorDict({"batch": rb.sample(4), "stored": rb[:]}, [])

    return BufferRun(velora_replay_buffer(10, state_dim=2, action_dim=1, hidden_dim=3), play)


# Every case: id -> a function making a fresh run.
RUNS: dict[str, Callable[[], BufferRun]] = {
    **{f"flat-{st}-{sa}": (lambda st=st, sa=sa: flat_run(st, sa)) for st in FLAT_STORAGES for sa in FLAT_SAMPLERS},
    "prioritized-1d": lambda: prioritized_run(1),
    "prioritized-2d": lambda: prioritized_run(2),
    "prioritized-nstep": prioritized_nstep_run,
    **{f"{st}-{sa}": (lambda st=st, sa=sa: ring_run(st, sa)) for st in RING_STORAGES for sa in RING_SAMPLERS},
    **{f"on-policy-{b}": (lambda b=b: on_policy_run(b)) for b in ON_POLICY},
    "path-gae": path_gae_run,
    "harl-fp": harl_fp_run,
    **{f"harl-rollout-{sa}": (lambda sa=sa: harl_rollout_run(sa)) for sa in HARL_ROLLOUTS},
    "velora": velora_run,
}
