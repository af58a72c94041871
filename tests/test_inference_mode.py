"""Every buffer, storage, sampler and estimator used inside ``torch.inference_mode()`` and then
outside it (or the other way round) keeps working and gives the data of a run outside it.

Persistent buffers (trees, tables, rings, workspaces) made inside inference mode would be
inference tensors, which no later in-place write outside it may touch; this runs every
component through both orders so the next reused buffer that forgets it fails here.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.segment_tree import MaxSegmentTree, MinSegmentTree, SumSegmentTree
from torchrl_ext.storages import EnvRingStorage, EpisodicEnvRingStorage
from torchrl_ext.value import GAE, TDLambda
from torchrl_ext.value import functional as F
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer, RunningMeanStd, ValueNorm

from tests._buffer_runs import ROUNDS, RUNS, BufferRun, assert_same

# Which rounds run inside inference mode; "outside" is the reference every order must match.
ORDERS = {
    "inside-first": [True] * 3 + [False] * 3,
    "outside-first": [False] * 3 + [True] * 3,
    "alternating": [k % 2 == 0 for k in range(ROUNDS)],
    "outside": [False] * ROUNDS,
}


def _run_in_order(order: list[bool], run: Callable[[int], TensorDict]) -> list[TensorDict]:
    torch.manual_seed(0)
    out = []
    for k, inside in enumerate(order):
        with torch.inference_mode(inside):
            out.append(run(k))
    return out


def _check_orders(make_run: Callable[[], Callable[[int], TensorDict]]) -> None:
    # Inside first, reference last: a cache shared across instances (the scan's workspaces) is
    # then first made inside inference mode, as in a process whose first call runs there.
    runs = {name: _run_in_order(order, make_run()) for name, order in ORDERS.items()}
    for name, run in runs.items():
        assert_same(run, runs["outside"])


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


@pytest.mark.parametrize("case", RUNS)
def test_buffers_inside_and_outside_inference_mode(case: str) -> None:
    _check_orders(lambda: RUNS[case]().run)


@pytest.mark.parametrize("case", RUNS)
def test_a_state_loaded_inside_inference_mode_goes_on_outside_it(case: str) -> None:
    """Loaded into a fresh buffer inside inference mode (every tensor of the state an inference
    tensor, as torch.load there makes them), then the caller's state overwritten: the buffer
    goes on outside exactly as the one it was saved from."""
    want = _run_in_order(ORDERS["outside"], RUNS[case]().run)
    torch.manual_seed(0)
    run: BufferRun = RUNS[case]()
    got = [run.run(k) for k in range(ROUNDS // 2)]
    state = run.buffer.state_dict()
    fresh = RUNS[case]().buffer
    with torch.inference_mode():
        loaded = _copied(state)
        fresh.load_state_dict(loaded)
        _scramble(loaded)  # the caller's tensors: the loaded buffer must not share them
    run.buffer = fresh
    got += [run.run(k) for k in range(ROUNDS // 2, ROUNDS)]
    assert_same(got, want)


@pytest.mark.parametrize("order", ["outside", "alternating"])
@pytest.mark.parametrize("case", RUNS)
def test_buffers_built_inside_inference_mode_go_on_outside_it(case: str, order: str) -> None:
    """Built inside inference mode (a process whose setup runs there), then played outside it
    (or in both, alternately): every tensor a constructor keeps must take in-place writes."""
    want = _run_in_order(ORDERS["outside"], RUNS[case]().run)
    torch.manual_seed(0)
    with torch.inference_mode():
        run = RUNS[case]()
    got = []
    for k, inside in enumerate(ORDERS[order]):
        with torch.inference_mode(inside):
            got.append(run.run(k))
    assert_same(got, want)


def _tree_round(tree: Any, k: int) -> TensorDict:
    index = torch.arange(k, 200, 3)
    tree[index] = torch.arange(index.numel(), dtype=torch.float32) + k
    out = {"leaves": tree.leaves.clone(), "summary": tree.summary()}
    if isinstance(tree, SumSegmentTree):
        out |= {"nnz": torch.tensor(tree.nnz), "found": tree.find_sum_bound(torch.tensor([0.5, 7.5]))}
    if k == 3:
        tree.load_state_dict(_copied(tree.state_dict()))
    if k == 4:
        tree.clear()
    return TensorDict(out, [])


@pytest.mark.parametrize("track_nnz", [True, False])
@pytest.mark.parametrize("cls", [SumSegmentTree, MinSegmentTree, MaxSegmentTree])
def test_trees_built_inside_inference_mode_go_on_outside_it(cls: type, track_nnz: bool) -> None:
    kwargs = {"fanout": 4, "top_size": 4} | ({"track_nnz": track_nnz} if cls is SumSegmentTree else {})
    reference = cls(200, **kwargs)
    want = [_tree_round(reference, k) for k in range(ROUNDS)]
    with torch.inference_mode():
        tree = cls(200, **kwargs)
    assert_same([_tree_round(tree, k) for k in range(ROUNDS)], want)


def _ring_round(storage: Any, k: int) -> TensorDict:
    """Writes, clears and forgets steps of single envs: the per-env counters change in place."""
    env = torch.tensor([k % 3])
    steps = TensorDict({"x": torch.full((1, 2), float(k)), "step_type": torch.tensor([k % 2]),
                        "discount": torch.ones(1), "reward": torch.ones(1)}, [1])
    storage.set((env, storage.current_pos[env]), steps)
    storage.advance(env, 1)
    if k == 3:
        storage.shrink(torch.tensor([0]), 1)
    if k == 4:
        storage.reset(torch.tensor([1]))
    return TensorDict({"pos": storage.current_pos, "size": storage.current_size, "resets": storage.resets.clone(),
                       "stored": storage.get(slice(None)).clone()}, [])


RINGS = {
    "ring": lambda: EnvRingStorage(3, 4),
    "episodic": lambda: EpisodicEnvRingStorage(3, 4, record_episodic_return=True),
}


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared-inside"])
@pytest.mark.parametrize("ring", RINGS)
def test_rings_built_inside_inference_mode_go_on_outside_it(ring: str, shared: bool) -> None:
    example = TensorDict({"x": torch.zeros(1, 2), "step_type": torch.zeros(1, dtype=torch.long),
                          "discount": torch.ones(1), "reward": torch.ones(1)}, [1])
    reference = RINGS[ring]()
    if shared:
        reference.share_memory_(example)
    want = [_ring_round(reference, k) for k in range(ROUNDS)]
    with torch.inference_mode():
        storage = RINGS[ring]()
        if shared:
            storage.share_memory_(example)
    assert_same([_ring_round(storage, k) for k in range(ROUNDS)], want)


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



def test_a_priority_tree_built_inside_inference_mode_goes_on_outside_it():
    # Was: its min/max levels, made after the sum tree's, were inference tensors, so the first
    # update outside inference mode raised (PrioritizedSampler builds its tree lazily: unaffected).
    from torchrl_ext.samplers._priority_tree import PrioritySegmentTree

    with torch.inference_mode():
        tree = PrioritySegmentTree(100, track_max=True)
    tree[torch.arange(100)] = torch.arange(100, dtype=torch.float64)
    assert float(tree.summary()) == sum(range(100))
    assert float(tree.max()) == 99.0
