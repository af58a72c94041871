"""NStepSampler on every layout that keeps env streams, single-agent, EP and FP.

Each stored field encodes (env, time, agent), so a brute-force walk over the
written history says exactly which step every sampled entry must come from.
"""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler
from torchrl_ext.storages import FastMemmapStorage, FastTensorStorage

GAMMA = 0.9
NUM_ACTIONS = 3


def step(rng: random.Random, env: int, t: int, num_agents: int) -> dict:
    """One transition of env ``env`` at time ``t``; every value names its step."""
    agent_done = [rng.random() < 0.25 for _ in range(num_agents)]
    base = 1000.0 * env + t
    return {
        "obs": base, "action": base + 0.25,
        "next_obs": base + 0.5, "reward": round(rng.uniform(-1, 1), 3),
        "done": all(agent_done) or rng.random() < 0.1,
        "agent_obs": [base + 0.125 * (a + 1) for a in range(num_agents)],
        "agent_next_obs": [base + 0.5 + 0.125 * (a + 1) for a in range(num_agents)],
        "agent_reward": [round(rng.uniform(-1, 1), 3) for _ in range(num_agents)],
        "agent_done": agent_done,
        "valid": [float(rng.random() < 0.8) for _ in range(num_agents)],
        "avail": [[float((t + a + j) % 2) for j in range(NUM_ACTIONS)] for a in range(num_agents)],
        "next_avail": [[float((t + a + j + 1) % 2) for j in range(NUM_ACTIONS)] for a in range(num_agents)],
    }


def as_tensordict(rows: list[dict], env_level: bool) -> TensorDict:
    """``[len(rows)]`` transitions; FP-only layouts leave out env-level reward and done."""
    col = lambda name, dtype=torch.float32: torch.tensor([r[name] for r in rows], dtype=dtype)  # noqa: E731
    agents = {
        "obs": col("agent_obs").unsqueeze(-1),
        "valid_transitions": col("valid").unsqueeze(-1),
        "available_actions": col("avail"),
    }
    next_agents = {
        "obs": col("agent_next_obs").unsqueeze(-1),
        "reward": col("agent_reward").unsqueeze(-1),
        "done": col("agent_done", torch.bool).unsqueeze(-1),
        "available_actions": col("next_avail"),
    }
    data = {"obs": col("obs").unsqueeze(-1), "action": col("action").unsqueeze(-1),
            "agents": agents, "next": {"obs": col("next_obs").unsqueeze(-1), "agents": next_agents}}
    if env_level:
        data["next"]["reward"] = col("reward").unsqueeze(-1)
        data["next"]["done"] = col("done", torch.bool).unsqueeze(-1)
    return TensorDict(data, [len(rows)])


def chain_end(history, env, start, newest, n, done_of) -> int:
    """Index ``m`` where the walk from ``start`` stops (done, newest step, or ``n - 1``)."""
    k = 0
    while not (done_of(history[env][start + k]) or start + k == newest or k == n - 1):
        k += 1
    return k


def fill(layout: str, rng: random.Random, num_envs: int, num_agents: int, rows: int, steps: int,
         env_level: bool, sampler=None, after_write=None):
    """A buffer on ``layout`` and each env's full history (list index = time).

    ``sampler`` is given to the buffer from the start; ``after_write(rb)`` runs after each write.
    """
    history = [[] for _ in range(num_envs)]
    after_write = after_write or (lambda rb: None)
    chosen = {} if sampler is None else {"sampler": sampler}
    if layout == "ring":
        rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=rows,
                                 generator=torch.Generator().manual_seed(rng.randrange(1000)), **chosen)
        for _ in range(steps):
            envs = sorted(rng.sample(range(num_envs), rng.randint(1, num_envs)))
            batch = [step(rng, e, len(history[e]), num_agents) for e in envs]
            for e, row in zip(envs, batch):
                history[e].append(row)
            rb.extend(as_tensordict(batch, env_level), env_ids=envs)
            after_write(rb)
        return rb, history
    storage_cls = {"fast": FastTensorStorage, "memmap": FastMemmapStorage,
                   "torchrl": LazyTensorStorage}[layout]
    buffer_cls = TorchRLTensorDictReplayBuffer if layout == "torchrl" else TensorDictReplayBuffer
    rb = buffer_cls(storage=storage_cls(rows * num_envs, ndim=2),
                    generator=torch.Generator().manual_seed(rng.randrange(1000)), **chosen)
    t = 0
    while t < steps:
        chunk = min(rng.randint(1, 4), steps - t, rows)
        if layout == "torchrl":  # TorchRL's own buffer raises on [num_envs, 1] batches
            chunk = max(chunk, 2)
        block = []
        for _ in range(chunk):
            batch = [step(rng, e, t, num_agents) for e in range(num_envs)]
            for e, row in enumerate(batch):
                history[e].append(row)
            block.append(as_tensordict(batch, env_level))
            t += 1
        rb.extend(torch.stack(block, 1))  # [num_envs, chunk], as a collector yields
        after_write(rb)
    return rb, history


def start_and_newest(rb, layout, index, history):
    """Sampled ``(env, start time)`` and the env's newest time, from the buffer's index."""
    if layout == "ring":
        env, start, _ = index.tolist()
        return env, start, int(rb.storage.current_pos[env]) - 1
    row, env = index.tolist()
    rows = rb.storage._storage.shape[0]
    newest = len(history[env]) - 1
    return env, newest - (newest % rows - row) % rows, newest


LAYOUTS = ["ring", "fast", "memmap", "torchrl"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["ep", "fp", "fp_agents_only"])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n_step=st.integers(1, 4), num_envs=st.integers(1, 3),
       num_agents=st.integers(1, 3), rows=st.integers(2, 9), steps=st.integers(1, 25))
def test_chains_equal_a_brute_force_walk(layout, mode, seed, n_step, num_envs, num_agents, rows, steps):
    rng = random.Random(seed)
    rb, history = fill(layout, rng, num_envs, num_agents, rows, steps, env_level=mode != "fp_agents_only")
    sampler = NStepSampler(n_step, GAMMA, agent_group=None if mode == "ep" else "agents")
    rb._sampler = sampler
    count = min(32, len(rb))
    batch = rb.sample(count)
    for i in range(count):
        env, start, newest = start_and_newest(rb, layout, batch["index"][i], history)
        walk = lambda done_of: chain_end(history, env, start, newest, n_step, done_of)  # noqa: E731
        agent_m = [walk(lambda r, a=a: r["agent_done"][a]) for a in range(num_agents)]
        m = max(agent_m) if mode == "fp_agents_only" else walk(lambda r: r["done"])
        first, last = history[env][start], history[env][start + m]
        # Root entries from the start step.
        assert batch["obs"][i, 0] == torch.tensor(first["obs"])
        assert batch["action"][i, 0] == torch.tensor(first["action"])
        assert batch["agents", "valid_transitions"][i, :, 0].tolist() == first["valid"]
        assert batch["agents", "available_actions"][i].tolist() == first["avail"]
        # Env-level next entries from the env chain end.
        assert batch["next", "obs"][i, 0] == torch.tensor(last["next_obs"])
        assert int(batch["steps_to_next_obs"][i, 0]) == m + 1
        assert batch["nstep_discount"][i, 0].item() == pytest.approx(GAMMA ** (m + 1), rel=1e-6)
        if mode != "fp_agents_only":
            assert bool(batch["next", "done"][i, 0]) == last["done"]
            want = sum(GAMMA ** k * history[env][start + k]["reward"] for k in range(m + 1))
            assert batch["next", "reward"][i, 0].item() == pytest.approx(want, abs=1e-5)
        if mode == "ep":  # agents ride along with the env chain
            assert batch["next", "agents", "obs"][i, :, 0].tolist() == [
                torch.tensor(v).item() for v in last["agent_next_obs"]]
            assert batch["next", "agents", "available_actions"][i].tolist() == last["next_avail"]
            continue
        for a, ma in enumerate(agent_m):  # FP: each agent's own chain
            end = history[env][start + ma]
            assert batch["next", "agents", "obs"][i, a, 0] == torch.tensor(end["agent_next_obs"][a])
            assert bool(batch["next", "agents", "done"][i, a, 0]) == end["agent_done"][a]
            assert batch["next", "agents", "available_actions"][i, a].tolist() == end["next_avail"][a]
            want = sum(GAMMA ** k * history[env][start + k]["agent_reward"][a] for k in range(ma + 1))
            assert batch["next", "agents", "reward"][i, a, 0].item() == pytest.approx(want, abs=1e-5)
            assert int(batch["agents", "steps_to_next_obs"][i, a, 0]) == ma + 1
            assert batch["agents", "nstep_discount"][i, a, 0].item() == pytest.approx(
                GAMMA ** (ma + 1), rel=1e-6)


def test_fp_with_one_agent_keeps_the_agent_dim():
    """HARL's FP squeezes the agent axis away with one agent and fails; here it stays."""
    rng = random.Random(3)
    rb, history = fill("ring", rng, num_envs=2, num_agents=1, rows=10, steps=12, env_level=False)
    rb._sampler = NStepSampler(3, GAMMA, agent_group="agents")
    batch = rb.sample(8)
    assert batch["next", "agents", "reward"].shape == (8, 1, 1)
    assert batch["agents", "steps_to_next_obs"].shape == (8, 1, 1)
    assert batch["next", "agents", "obs"].shape == (8, 1, 1)


def test_grid_chains_cross_the_physical_end_of_the_storage():
    """Rows wrap at capacity; a chain from the last row continues at row 0 of the same env."""
    storage = FastTensorStorage(4 * 2, ndim=2)  # 4 time rows x 2 envs
    rb = TensorDictReplayBuffer(storage=storage, sampler=NStepSampler(3, gamma=0.5))
    for t in range(6):  # rows 0..3 then 0..1 again: time 4 -> row 0, time 5 -> row 1
        rb.extend(TensorDict({"obs": torch.tensor([[[t * 1.0]], [[10.0 + t]]]), "next": {
            "obs": torch.tensor([[[t + 1.0]], [[11.0 + t]]]),
            "reward": torch.ones(2, 1, 1), "done": torch.zeros(2, 1, 1, dtype=torch.bool)}}, [2, 1]))
    torch.manual_seed(0)
    batch = torch.cat([rb.sample(8) for _ in range(8)])
    start_time = batch["obs"][:, 0] % 10
    # Time 3 sits in the last row; its chain runs through times 4 and 5 (rows 0 and 1).
    at_three = start_time == 3
    assert bool(at_three.any())
    assert bool((batch["next", "obs"][at_three, 0] % 10 == 6).all())
    assert bool((batch["steps_to_next_obs"][at_three] == 3).all())
    # Chains never pass the newest time (5): from time 4 they stop after 2 steps.
    at_four = start_time == 4
    assert bool((batch["steps_to_next_obs"][at_four] == 2).all())
    assert torch.allclose(batch["next", "reward"][at_four], torch.full_like(batch["next", "reward"][at_four], 1.5))


def test_torchrl_replay_buffer_on_a_grid_storage():
    """TorchRL's plain ReplayBuffer reads the start and returns the n-step entries as info."""
    rb = ReplayBuffer(storage=LazyTensorStorage(20, ndim=2), sampler=NStepSampler(2, gamma=0.5))
    obs = torch.arange(6.0).reshape(3, 2, 1).transpose(0, 1)  # [2 envs, 3 steps]: time t at 2t + env
    rb.extend(TensorDict({"obs": obs, "next": {
        "obs": obs + 2, "reward": torch.ones(2, 3, 1),
        "done": torch.zeros(2, 3, 1, dtype=torch.bool)}}, [2, 3]))
    data, info = rb.sample(6, return_info=True)
    start = data["obs"][:, 0]
    newest = start >= 4  # time 2: nothing after it yet
    want = torch.where(newest, start + 2, start + 4)
    assert torch.equal(info[("next", "obs")][:, 0], want)
    assert torch.equal(info[("next", "reward")][:, 0], torch.where(newest, 1.0, 1.5))


def test_bad_layouts_and_keys():
    flat = TensorDictReplayBuffer(storage=FastTensorStorage(10), sampler=NStepSampler(2))
    flat.extend(TensorDict({"obs": torch.zeros(4, 1), "next": {
        "reward": torch.zeros(4, 1), "done": torch.zeros(4, 1, dtype=torch.bool)}}, [4]))
    with pytest.raises(TypeError, match="a 1-D FastTensorStorage does not keep: use an EnvRingStorage"):
        flat.sample(2)
    with pytest.raises(TypeError, match="agent_group must be the name of the agents' group key"):
        NStepSampler(2, agent_group=3)
    rng = random.Random(0)
    rb, _ = fill("ring", rng, num_envs=1, num_agents=2, rows=5, steps=5, env_level=True)
    rb._sampler = NStepSampler(2, agent_group="team")
    with pytest.raises(ValueError, match=r"needs \('next', 'team', 'done'\) in the stored data"):
        rb.sample(2)
    bad = EnvRingReplayBuffer(num_envs=1, max_length=5, sampler=NStepSampler(2, agent_group="agents"))
    bad.extend(TensorDict({"obs": torch.zeros(1, 1), "next": {"agents": {
        "reward": torch.zeros(1, 1), "done": torch.zeros(1, 1, dtype=torch.bool)}}}, [1]))
    with pytest.raises(ValueError, match=r"must hold one flag per agent, \[..., num_agents, 1\]"):
        bad.sample(1)
    empty = TensorDictReplayBuffer(storage=FastTensorStorage(10, ndim=2), sampler=NStepSampler(2))
    with pytest.raises(RuntimeError, match="empty storage"):
        empty.sample(2)


def test_grid_streams_see_leaves_added_to_the_stored_tensordict():
    # Was: views of the stored leaves were kept per stored TensorDict, so a ("next", key)
    # TorchRL's storage added to it later never reached the samples.
    def step_batch(t0, extra):
        t = torch.arange(t0, t0 + 4.0).reshape(1, 4, 1)
        nxt = {"obs": t + 1, "reward": torch.ones(1, 4, 1), "done": torch.zeros(1, 4, 1, dtype=torch.bool)}
        if extra:
            nxt["t"] = t + 1
        return TensorDict({"obs": t, "next": nxt}, [1, 4])

    results = []
    for cls in (TorchRLTensorDictReplayBuffer, TensorDictReplayBuffer):
        torch.manual_seed(0)
        rb = cls(storage=LazyTensorStorage(16, ndim=2), sampler=NStepSampler(3, gamma=1.0), batch_size=8)
        rb.extend(step_batch(0, False))
        rb.sample(4)
        rb.extend(step_batch(4, True))
        rb.extend(step_batch(8, True))
        results.append(rb.sample())
    for sample in results:
        assert ("next", "t") in sample.keys(True)
        # Rows written before the key existed hold TorchRL's zeros; the others the chain end's time.
        filled = sample["obs"] >= 4
        assert torch.equal(sample["next", "t"][filled], sample["next", "obs"][filled])
    assert torch.equal(results[0]["obs"], results[1]["obs"])  # same draws
    filled = results[0]["obs"] >= 4
    assert torch.equal(results[0]["next", "t"][filled], results[1]["next", "t"][filled])
