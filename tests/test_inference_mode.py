"""Every buffer, storage, sampler and estimator used inside ``torch.inference_mode()`` and then
outside it (or the other way round) keeps working and gives the data of a run outside it.

Persistent buffers (trees, tables, rings, workspaces) made inside inference mode would be
inference tensors, which no later in-place write outside it may touch; this runs every
component through both orders so the next reused buffer that forgets it fails here.
"""
from __future__ import annotations

import copy
import random
from typing import Any, Callable

import pytest
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
from torchrl_ext.value import functional as F
from torchrl_ext.value import GAE, TDLambda
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer, RunningMeanStd, ValueNorm

from tests.storages.test_dedup import Streams

ROUNDS = 6
# Which rounds run inside inference mode; "outside" is the reference every order must match.
ORDERS = {
    "inside-first": [True] * 3 + [False] * 3,
    "outside-first": [False] * 3 + [True] * 3,
    "alternating": [k % 2 == 0 for k in range(ROUNDS)],
    "outside": [False] * ROUNDS,
}


def _assert_same(got: list[TensorDict], want: list[TensorDict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


def _run_in_order(order: list[bool], step: Callable[[int], TensorDict], seed: int = 0) -> list[TensorDict]:
    torch.manual_seed(seed)
    out = []
    for k, inside in enumerate(order):
        with torch.inference_mode(inside):
            out.append(step(k).clone())  # a copy now: a step may return views of stored rows
    return out


def _check_orders(make_step: Callable[[], Callable[[int], TensorDict]]) -> None:
    # Inside first, reference last: a cache shared across instances (the scan's workspaces) is
    # then first made inside inference mode, as in a process whose first call runs there.
    runs = {name: _run_in_order(order, make_step()) for name, order in ORDERS.items()}
    for name, run in runs.items():
        _assert_same(run, runs["outside"])


def _copied(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        copied = copy.copy(state)  # keeps attributes such as a TensorDict state's _metadata
        copied.update((key, _copied(value)) for key, value in state.items())
        return copied
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(value) for value in state)
    return state


def _scramble(state: Any) -> None:
    if isinstance(state, torch.Tensor):
        # Its own generator: the runs compared must draw the same global random numbers.
        state.copy_(torch.randint(0, 2, state.shape, generator=torch.Generator().manual_seed(7)).to(state.dtype))
    elif isinstance(state, dict):
        for value in state.values():
            _scramble(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            _scramble(value)


def _check_load_inside(make_step: Callable[[], Callable[[int], TensorDict]]) -> None:
    """A buffer whose state is loaded inside inference mode (into a fresh one) goes on outside it
    exactly as the one it was saved from."""
    want = _run_in_order(ORDERS["outside"], make_step())
    torch.manual_seed(0)
    step = make_step()
    got = [step(k).clone() for k in range(ROUNDS // 2)]
    state = step.state["rb"].state_dict()
    fresh = make_step().state["rb"]
    with torch.inference_mode():
        # As if read back from a file there (torch.load): every tensor an inference tensor.
        loaded = _copied(state)
        fresh.load_state_dict(loaded)
        _scramble(loaded)  # the caller's tensors: the loaded buffer must not share them
    step.state["rb"] = fresh
    got += [step(k).clone() for k in range(ROUNDS // 2, ROUNDS)]
    _assert_same(got, want)


# ---------------------------------------------------------------- flat buffers

def _rows(start: int, n: int) -> TensorDict:
    values = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": values.unsqueeze(-1).expand(n, 3).clone(), "reward": values.unsqueeze(-1),
                       "next": {"obs": values.unsqueeze(-1).expand(n, 3) + 1,
                                "reward": values.unsqueeze(-1), "done": (values % 5 == 4).unsqueeze(-1)}}, [n])


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


@pytest.mark.parametrize("sampler", FLAT_SAMPLERS)
@pytest.mark.parametrize("storage", FLAT_STORAGES)
def test_flat_buffers_inside_and_outside_inference_mode(storage: str, sampler: str) -> None:
    def make_step() -> Callable[[int], TensorDict]:
        state = {"rb": TensorDictReplayBuffer(storage=FLAT_STORAGES[storage](), sampler=FLAT_SAMPLERS[sampler](),
                                              batch_size=8)}

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            rb.extend(_rows(9 * k, 9))  # wraps: 6 x 9 rows into 40
            batch = rb.sample()
            if isinstance(rb.sampler, PrioritizedSampler):
                batch.set("td_error", batch["reward"].squeeze(-1) + 0.5)
                rb.update_tensordict_priority(batch)
            return TensorDict({"batch": batch.exclude("td_error"), "stored": rb[:]["obs"]}, [])

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


@pytest.mark.parametrize("ndim", [1, 2])
def test_a_prioritized_replay_buffer_inside_and_outside_inference_mode(ndim: int) -> None:
    def make_step() -> Callable[[int], TensorDict]:
        state = {"rb": PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(24, ndim=ndim),
                                               batch_size=5)}

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            rows = _rows(6 * k, 6)
            rb.extend(rows if ndim == 1 else rows.reshape(2, 3))
            batch = rb.sample()
            batch.set("td_error", batch["reward"].squeeze(-1) + 0.5)
            rb.update_tensordict_priority(batch)
            return batch.exclude("td_error")

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


def test_a_prioritized_nstep_buffer_inside_and_outside_inference_mode() -> None:
    def make_step() -> Callable[[int], TensorDict]:
        sampler = PrioritizedNStepSampler(16, alpha=1.0, beta=0.5, n_step=2, gamma=0.5)
        state = {"rb": TensorDictReplayBuffer(storage=FastTensorStorage(16, ndim=2), sampler=sampler, batch_size=6)}

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            rb.extend(_rows(6 * k, 6).reshape(2, 3))  # [num_envs=2, T=3]
            batch = rb.sample()
            batch.set("td_error", batch["reward"].squeeze(-1) + 0.5)
            rb.update_tensordict_priority(batch)
            return batch.exclude("td_error")

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


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


@pytest.mark.parametrize("sampler", RING_SAMPLERS)
@pytest.mark.parametrize("storage", RING_STORAGES)
def test_ring_buffers_inside_and_outside_inference_mode(storage: str, sampler: str) -> None:
    def make_step() -> Callable[[int], TensorDict]:
        state = {"rb": EnvRingReplayBuffer(storage=RING_STORAGES[storage](), sampler=RING_SAMPLERS[sampler](),
                                           batch_size=6)}
        steps = _ring_steps(seed=4)

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            for _ in range(2):  # every env together (the step write), then a subset
                rb.extend(steps([0, 1, 2]))
            rb.extend(steps([2, 0]), env_ids=torch.tensor([2, 0]))
            batch = rb.sample()
            if isinstance(rb.sampler, PrioritizedTrajectorySampler):
                env, pos = rb.storage.earliest_position(), rb.storage.current_pos - 2
                rb.sampler.update_window_priority(torch.arange(3), pos, (env + k + 1).double())
            stored = rb.read(torch.tensor([0, 1, 2]), rb.storage.current_pos - 1)
            return TensorDict({"batch": batch, "newest": stored}, [])

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


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


@pytest.mark.parametrize("buffer", ON_POLICY)
def test_on_policy_buffers_inside_and_outside_inference_mode(buffer: str) -> None:
    def make_step() -> Callable[[int], TensorDict]:
        state = {"rb": ON_POLICY[buffer]()}

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            for t in range(4):
                rb.insert(_on_policy_step(float(10 * k + t), t))
            rb.compute_returns()
            batches = list(rb.generate_batches(num_mini_batch=2))
            stored = rb.storage.data.clone()
            rb.after_update()
            return TensorDict({"batches": torch.stack(batches), "stored": stored}, [])

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


def test_a_path_gae_buffer_inside_and_outside_inference_mode() -> None:
    def make_step() -> Callable[[int], TensorDict]:
        state = {"rb": PathGAEReplayBuffer(12, 4, gamma=0.5, lam=0.9)}

        def step(k: int) -> TensorDict:
            rb = state["rb"]
            v = torch.arange(3.0).unsqueeze(-1) + k
            rb.store(TensorDict({"observation": v.expand(3, 2), "state_value": v,
                                 "next": {"reward": v % 2}}, [3]))
            rb.finish_path(last_val=float(k))
            return TensorDict({"batch": rb.sample_batch(), "stored": rb.storage[:]}, [])

        step.state = state
        return step

    _check_orders(make_step)
    _check_load_inside(make_step)


# ---------------------------------------------------------------- value estimation

@pytest.mark.parametrize("shape", [(7, 3), (41, 2), (301, 1)])  # shapes no other test scans
def test_value_estimates_inside_and_outside_inference_mode(shape: tuple[int, ...]) -> None:
    def make_step() -> Callable[[int], TensorDict]:
        norm, stats, intrinsic = ValueNorm(1), RunningMeanStd(shape=(1,)), IntrinsicRewardNormalizer(gamma=0.5)
        gae, td_lambda = GAE(gamma=0.9, lmbda=0.8, value_network=None), TDLambda(gamma=0.9, lmbda=0.8,
                                                                                 value_network=None)

        def step(k: int) -> TensorDict:
            g = torch.Generator().manual_seed(k)
            reward, value, next_value = (torch.randn(*shape, 1, generator=g) for _ in range(3))
            done = torch.rand(*shape, 1, generator=g) < 0.2
            adv, ret = F.generalized_advantage_estimate(0.9, 0.8, value, next_value, reward, done, done,
                                                        time_dim=0)
            td_ret = F.td_lambda_return_estimate(0.9, 0.8, next_value, reward, done, done, time_dim=0)
            log_pi, log_mu = (torch.randn(*shape, 1, generator=g) for _ in range(2))
            pg_adv, vs = F.vtrace_advantage_estimate(0.9, log_pi, log_mu, value, next_value, reward, done, done,
                                                     time_dim=0)
            norm.update(ret.flatten(0, -2))
            stats.update(reward.flatten(0, -2))
            td = TensorDict({"state_value": value.transpose(0, 1),
                             "next": {"state_value": next_value.transpose(0, 1), "reward": reward.transpose(0, 1),
                                      "done": done.transpose(0, 1), "terminated": done.transpose(0, 1)}},
                            [shape[1], shape[0]])
            modules = TensorDict({"gae": gae(td.clone())["advantage"], "td_lambda": td_lambda(td.clone())["value_target"],
                                  "intrinsic": intrinsic(reward.squeeze(-1))}, [])
            return TensorDict({"adv": adv, "ret": ret, "td_ret": td_ret, "vs": vs, "pg_adv": pg_adv, "modules": modules,
                               "normalized": norm.normalize(ret.flatten(0, -2)), "mean": stats.mean.clone()}, [])

        return step

    _check_orders(make_step)

