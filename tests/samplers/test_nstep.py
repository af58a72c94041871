"""NStepSampler: chains stop at done and at each env's newest step; TorchRL's TD(0) honours them."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import LazyTensorStorage
from torchrl.objectives.value import TD0Estimator

from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler
from torchrl_ext.storages import DedupEnvRingStorage


class _Constant(torch.nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.full_like(observation, self.value)


def constant_value(value: float) -> TensorDictModule:
    return TensorDictModule(_Constant(value), in_keys=["observation"], out_keys=["state_value"])


def transition(obs, next_obs, reward, done, truncated=False):
    n = len(obs)
    flags = lambda v: torch.tensor(v).reshape(n, 1)  # noqa: E731
    return TensorDict({
        "observation": torch.tensor(obs, dtype=torch.float32).reshape(n, 1),
        "next": {
            "observation": torch.tensor(next_obs, dtype=torch.float32).reshape(n, 1),
            "reward": torch.tensor(reward, dtype=torch.float32).reshape(n, 1),
            "done": flags(done),
            "terminated": flags([d and not t for d, t in zip(done, truncated if isinstance(truncated, list) else [truncated] * n)]),
        },
    }, [n])


def fill(rng, num_envs, max_length, steps):
    """Random episodes per env; returns the buffer and each env's full history."""
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length,
                             generator=torch.Generator().manual_seed(rng.randrange(1000)))
    history = [[] for _ in range(num_envs)]
    obs = [float(1000 * e) for e in range(num_envs)]
    for _ in range(steps):
        envs = sorted(rng.sample(range(num_envs), rng.randint(1, num_envs)))
        rows = []
        for e in envs:
            done = rng.random() < 0.25
            nxt = obs[e] + 1
            row = (obs[e], nxt, round(rng.uniform(-1, 1), 3), done)
            history[e].append(row)
            rows.append(row)
            obs[e] = nxt + 100 if done else nxt  # reset observation after an episode end
        rb.extend(transition(*[list(c) for c in zip(*rows)]), env_ids=envs)
    return rb, history


def reference(history, env, start, n, gamma, newest):
    """Walk the stored stream: stop at done or at the newest step."""
    total, k = 0.0, 0
    while True:
        obs, nxt, reward, done = history[env][start + k]
        total += gamma ** k * reward
        if done or start + k == newest or k == n - 1:
            return total, nxt, done, k + 1
        k += 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_step=st.integers(1, 5), num_envs=st.integers(1, 3),
       max_length=st.integers(3, 12), steps=st.integers(1, 30))
def test_chains_equal_a_brute_force_walk(seed, n_step, num_envs, max_length, steps):
    rng = random.Random(seed)
    rb, history = fill(rng, num_envs, max_length, steps)
    gamma = 0.9
    sampler = NStepSampler(n_step, gamma)
    rb._sampler = sampler
    count = min(64, len(rb))
    batch = rb.sample(count)
    storage = rb.storage
    for i in range(count):
        env, start, end = batch["index"][i].tolist()
        assert int(storage.earliest_position()[env]) <= start <= end < int(storage.current_pos[env])
        want_reward, want_next, want_done, count = reference(
            history, env, start, n_step, gamma, int(storage.current_pos[env]) - 1)
        assert batch["observation"][i, 0] == history[env][start][0]
        assert batch["next", "observation"][i, 0] == want_next
        assert bool(batch["next", "done"][i, 0]) == want_done
        assert batch["steps_to_next_obs"][i, 0] == count == end - start + 1
        assert batch["next", "reward"][i, 0].item() == pytest.approx(want_reward, abs=1e-5)
        assert batch["nstep_discount"][i, 0].item() == pytest.approx(gamma ** count, rel=1e-6)


def test_td0_targets_with_a_constant_value_match_the_closed_form():
    """TorchRL's TD(0) reads steps_to_next_obs: target = R + gamma^(m+1) * V * (1 - terminated)."""
    rb = EnvRingReplayBuffer(num_envs=1, max_length=10, sampler=NStepSampler(3, gamma=0.9))
    # One episode of 3 steps with reward 1 ending in a termination, then 4 open steps.
    for t in range(7):
        rb.extend(transition([float(t)], [t + 1.0], [1.0], [t == 2]))
    batch = rb.storage.get((torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 3, 5]),
                            torch.tensor([2, 2, 5, 6])))
    reward = torch.tensor([[1 + 0.9 + 0.81], [1 + 0.9], [1 + 0.9 + 0.81], [1 + 0.9]])
    batch["next", "reward"] = reward
    batch["steps_to_next_obs"] = torch.tensor([[3], [2], [3], [2]])
    estimator = TD0Estimator(gamma=0.9, value_network=constant_value(100.0))
    target = estimator.value_estimate(batch)
    # Terminated chains: no bootstrap; open chains: + gamma^(m+1) * 100.
    expected = torch.tensor([[2.71], [1.9], [2.71 + 0.9 ** 3 * 100], [1.9 + 0.9 ** 2 * 100]])
    torch.testing.assert_close(target, expected, rtol=1e-5, atol=1e-4)


def test_sampled_batches_feed_torchrl_td0_end_to_end():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=50, sampler=NStepSampler(4, gamma=0.5),
                             generator=torch.Generator().manual_seed(0))
    rng = random.Random(0)
    for t in range(40):
        done = [rng.random() < 0.2, rng.random() < 0.2]
        rb.extend(transition([t, 100.0 + t], [t + 1.0, 101.0 + t], [1.0, 1.0], done))
    batch = rb.sample(64)
    target = TD0Estimator(gamma=0.5, value_network=constant_value(8.0)).value_estimate(batch)
    m1 = batch["steps_to_next_obs"].double()
    closed = (1 - 0.5 ** m1) / 0.5 + 0.5 ** m1 * 8.0 * (~batch["next", "terminated"]).double()
    torch.testing.assert_close(target.double(), closed, rtol=1e-5, atol=1e-5)


def test_n_step_one_gives_plain_transitions():
    rb = EnvRingReplayBuffer(num_envs=1, max_length=5, sampler=NStepSampler(1, gamma=0.7))
    for t in range(5):
        rb.extend(transition([float(t)], [t + 1.0], [float(t)], [False]))
    batch = rb.sample(5)
    assert torch.equal(batch["next", "reward"], batch["observation"])
    assert bool((batch["steps_to_next_obs"] == 1).all())
    assert torch.allclose(batch["nstep_discount"], torch.full((5, 1), 0.7))


def test_works_on_the_dedup_storage():
    storage = DedupEnvRingStorage(1, 20, obs_key="observation", num_stack=1)
    rb = EnvRingReplayBuffer(storage=storage, sampler=NStepSampler(3, gamma=0.9))
    for t in range(10):
        rb.extend(transition([float(t)], [t + 1.0], [1.0], [False]))
    batch = rb.sample(10)
    start, end = batch["index"][:, 1], batch["index"][:, 2]
    assert torch.equal(batch["observation"][:, 0], start.float())
    assert torch.equal(batch["next", "observation"][:, 0], end.float() + 1)


def test_dedup_storage_with_only_unreadable_steps_says_why():
    # Was: "Cannot sample from an empty storage." with 5 steps stored, all inside the lookback.
    storage = DedupEnvRingStorage(2, 8, obs_key="observation", num_stack=4)
    rb = EnvRingReplayBuffer(storage=storage, sampler=NStepSampler(2, gamma=0.9))
    stack = lambda t: [float(max(0, t - 3 + i)) for i in range(4)]  # noqa: E731  frames 0, 1, ...
    written = [0, 0]

    def write(env):
        step = transition([0.0], [0.0], [1.0], [False])
        step["observation"] = torch.tensor([stack(written[env])])
        step["next", "observation"] = torch.tensor([stack(written[env] + 1)])
        rb.extend(step, env_ids=[env])
        written[env] += 1

    for env in (0, 0, 0, 1, 1):
        write(env)
    message = (r"no env holds a step to start a transition from after ignoring 3 earliest steps, whose "
               r"frame stacks the storage cannot rebuild \(steps per env: \[3, 2\]\); add more data.")
    with pytest.raises(ValueError, match=message):
        rb.sample(1)
    write(1)
    write(1)  # env 1: 4 steps, the newest one readable
    assert rb.sample(3)["index"][:, :2].tolist() == [[1, 3]] * 3


def test_bad_input():
    with pytest.raises(ValueError, match="n_step must be an int >= 1, got n_step=0"):
        NStepSampler(0)
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\], got gamma=1.5"):
        NStepSampler(3, gamma=1.5)
    rb = EnvRingReplayBuffer(num_envs=1, max_length=5, sampler=NStepSampler(2))
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample(4)
    rb.extend(transition([0.0], [1.0], [1.0], [False]))
    with pytest.raises(ValueError, match="needs at least batch_size=4 stored transitions, the buffer holds 1"):
        rb.sample(4)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got batch_size=0"):
        rb._sampler.sample(rb.storage, 0)
    rb = EnvRingReplayBuffer(num_envs=1, max_length=5, sampler=NStepSampler(2, done_key="finished"))
    rb.extend(transition([0.0], [1.0], [1.0], [False]))
    with pytest.raises(ValueError, match="needs 'finished' in the stored data"):
        rb.sample(1)


def test_rewards_with_autograd_history_are_sampled_through_torch():
    # A stored reward that joined the graph (TorchRL's storages keep it; the per-env rings
    # store detached steps) puts the chain table's rewards in it too; numpy cannot view
    # those, so the table's lookups must stay with torch's gathers.
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16, ndim=2), sampler=NStepSampler(3, gamma=0.5),
                                batch_size=4)
    for i in range(5):  # one step of 2 envs per write: [2 envs, 1 step]
        reward = torch.ones(2, 1, 1).requires_grad_(i == 2)
        rb.extend(TensorDict({"obs": torch.full((2, 1, 1), float(i)), "next": {
            "obs": torch.full((2, 1, 1), i + 1.0), "reward": reward,
            "done": torch.zeros(2, 1, 1, dtype=torch.bool)}}, [2, 1]))
    batch = rb.sample()
    assert rb.sampler._chain_table.reward.requires_grad and batch["next", "reward"].requires_grad
    # chains of up to 3 steps, 1 + 0.5 + 0.25 when all three exist
    assert set(batch["next", "reward"].detach().reshape(-1).tolist()) <= {1.0, 1.5, 1.75}


def test_changing_the_reward_key_rebuilds_the_chain_table():
    # Was: the table was keyed on (n_step, gamma) only, so after sampler.reward_key = ...
    # samples kept the discounted sums of the old reward.
    def build(sampler):
        rb = EnvRingReplayBuffer(num_envs=1, max_length=16, sampler=sampler, batch_size=4)
        for t in range(8):
            rb.extend(TensorDict({"obs": torch.tensor([[float(t)]]), "next": {
                "obs": torch.tensor([[t + 1.0]]), "reward": torch.ones(1, 1),
                "reward2": torch.full((1, 1), 10.0), "done": torch.zeros(1, 1, dtype=torch.bool)}}, [1]))
        return rb

    torch.manual_seed(0)
    sampler = NStepSampler(2, gamma=0.5)
    rb = build(sampler)
    rb.sample()
    sampler.reward_key = ("next", "reward2")
    sums = rb.sample()["next", "reward2"].flatten()
    # 10 + 0.5 * 10 for a two-step chain, 10 for the newest step (its chain stops there).
    assert set(sums.tolist()) <= {15.0, 10.0} and 15.0 in sums.tolist()


def test_writes_while_the_settings_differ_never_reach_the_table_built_for_others():
    # Found by tests/samplers/test_nstep_model.py: the table built for ("next", "reward")
    # took the rows written while reward_key was another key (computed with that key), and
    # looked current again once the key came back.
    def step(t):
        return TensorDict({"obs": torch.tensor([[float(t)]]), "next": {
            "obs": torch.tensor([[t + 1.0]]), "reward": torch.ones(1, 1),
            "bonus": torch.full((1, 1), 10.0), "done": torch.zeros(1, 1, dtype=torch.bool)}}, [1])

    torch.manual_seed(0)
    sampler = NStepSampler(1, gamma=0.0)
    rb = EnvRingReplayBuffer(num_envs=1, max_length=16, sampler=sampler, batch_size=2)
    rb.extend(step(0))
    rb.extend(step(1))
    rb.sample()
    sampler.reward_key = ("next", "bonus")
    rb.extend(step(2))
    sampler.reward_key = ("next", "reward")
    for _ in range(10):
        assert rb.sample(3)["next", "reward"].flatten().tolist() == [1.0] * 3


# --------------------------------------------------------------------------- settings after construction
@pytest.mark.parametrize(
    "name,value,exc,match",
    [
        ("gamma", float("nan"), ValueError, "gamma must be a number in \\[0, 1\\], got gamma=nan"),
        ("gamma", 1.5, ValueError, "gamma must be a number in \\[0, 1\\], got gamma=1.5"),
        ("gamma", "0.9", TypeError, "gamma must be a real number"),
        ("n_step", 0, ValueError, "n_step must be an int >= 1, got n_step=0"),
        ("n_step", 2.0, ValueError, "n_step must be an int >= 1, got n_step=2.0"),
        # Was: the key setters stored anything, and sampling then named the stored value.
        ("reward_key", 3, TypeError, "reward_key must be a key: a str or a tuple of str .*got reward_key=3"),
        ("done_key", ["next", 1], TypeError, "done_key must be a key: .*got done_key=\\['next', 1\\]"),
        ("agent_group", 5, TypeError, "agent_group must be the name of the agents' group key .*got agent_group=5"),
        ("agent_group", "", TypeError, "agent_group must be the name of the agents' group key .*got agent_group=''"),
    ],
)
def test_settings_are_checked_as_the_constructor_checks_them(name, value, exc, match):
    sampler = NStepSampler(3, gamma=0.5)
    with pytest.raises(exc, match=match):
        setattr(sampler, name, value)
    assert (sampler.n_step, sampler.gamma) == (3, 0.5)
    with pytest.raises(exc, match=match):
        NStepSampler(**{"n_step": 3, "gamma": 0.5, name: value})


def test_key_settings_are_normalised_as_the_constructor_does():
    # Was: sampler.reward_key = ["next", "bonus"] stayed a list, which sampling then reported missing.
    rb = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=NStepSampler(2, gamma=0.5))
    for t in range(4):
        step = transition([float(t)], [t + 1.0], [1.0], [False])
        step["next", "bonus"] = torch.full((1, 1), 10.0)
        rb.extend(step)
    rb.sampler.reward_key, rb.sampler.done_key = ["next", "bonus"], ["next", "done"]
    assert (rb.sampler.reward_key, rb.sampler.done_key) == (("next", "bonus"), ("next", "done"))
    assert set(rb.sample(4)["next", "bonus"].flatten().tolist()) <= {10.0, 15.0}  # 10 + 0.5 * 10
    rb.sampler.agent_group = None
    assert rb.sampler.agent_group is None


def test_settings_changed_after_construction_are_used_and_pickled():
    import pickle

    rb = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=NStepSampler(3, gamma=0.9))
    for t in range(6):
        rb.extend(transition([float(t)], [t + 1.0], [1.0], [False]))
    rb.sampler.gamma, rb.sampler.n_step = 0.5, 2
    batch = rb.sample(6)
    # Two steps (start <= 3 of 0..5 has two stored steps ahead): 1 + 0.5 = 1.5, or one step at the newest.
    steps = batch["steps_to_next_obs"].flatten()
    expected = torch.where(steps == 2, 1.5, 1.0)
    assert torch.equal(batch["next", "reward"].flatten(), expected)
    assert torch.equal(batch["next", "observation"].flatten(), batch["observation"].flatten() + steps)
    clone = pickle.loads(pickle.dumps(rb.sampler))
    assert (clone.n_step, clone.gamma) == (2, 0.5)


def test_chain_table_made_inside_inference_mode_takes_writes_outside():
    rb = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=NStepSampler(2, gamma=0.5))
    for t in range(3):
        rb.extend(transition([float(t)], [t + 1.0], [1.0], [False]))
    with torch.inference_mode():
        rb.sample(3)  # builds the chain table
    for t in range(3, 6):
        rb.extend(transition([float(t)], [t + 1.0], [2.0], [False]))
    batch = rb.sample(6)
    obs, reward = batch["observation"].flatten(), batch["next", "reward"].flatten()
    # Rewards r_t = 1 for t < 3, else 2; two-step sums up to the newest step 5.
    r = lambda t: 1.0 if t < 3 else 2.0  # noqa: E731
    expected = [r(int(o)) + (0.5 * r(int(o) + 1) if o < 5 else 0.0) for o in obs.tolist()]
    assert reward.tolist() == expected


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("path", ["chain table", "walked", "fp agents"])
def test_integer_and_bool_rewards_give_a_floating_n_step_reward(dtype, path):
    # Was: the float64 sum was cast back to the reward's dtype (int64 rewards of 1, n_step=3,
    # gamma=0.5 gave 1, not 1.75), in the chain table and in the walked chains alike.
    rewards, dones = [1, 0, 1, 1, 1, 0, 1, 1], [False, False, False, True, False, False, False, False]
    group = ("agents",) if path == "fp agents" else ()
    shape = (1, 1, 1) if group else (1, 1)  # one env (and one agent)
    sampler = NStepSampler(3, gamma=0.5, agent_group="agents" if group else None)
    rb = EnvRingReplayBuffer(num_envs=1, max_length=8, sampler=sampler)
    for t, (reward, done) in enumerate(zip(rewards, dones)):
        rb.extend(TensorDict({"observation": torch.full((1, 1), float(t)), "next": {
            "observation": torch.full((1, 1), t + 1.0), "done": torch.tensor([[done]]), **{
                key: {"reward": torch.full(shape, reward).to(dtype), "done": torch.full(shape, done)}
                for key in group}, **({} if group else {"reward": torch.full(shape, reward).to(dtype)})}}, [1]))
    if path == "walked":
        rb.storage.share_memory_()  # chains of shared storages are walked at each sample
    history = [[(float(t), t + 1.0, float(r), d) for t, (r, d) in enumerate(zip(rewards, dones))]]
    torch.manual_seed(0)
    batch = torch.cat([rb.sample(8) for _ in range(4)])  # every start, with high probability
    got = batch[("next", *group, "reward")]
    assert got.dtype == torch.get_default_dtype()
    for start, value in zip(batch["observation"].flatten().long().tolist(), got.flatten().tolist()):
        want = reference(history, 0, start, 3, 0.5, newest=len(rewards) - 1)[0]  # float64 walk
        assert value == pytest.approx(want, abs=1e-6)
    assert ("_chain_table" in sampler.__dict__) == (path == "chain table")
