"""velora_replay_buffer: velora's ring, sampling, files and warm-up on a TorchRL buffer."""
from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule

from tests._vectors import load_npz, vectors_path
from torchrl_ext.io import VELORA_KEYS, as_batch_experience
from torchrl_ext.presets.velora import VeloraReplayBuffer, load_velora_replay_buffer, velora_replay_buffer

NAMES = ("states", "actions", "rewards", "next_states", "dones", "hiddens")


@pytest.fixture(scope="module")
def semantics():
    return json.loads(vectors_path("velora_buffer_semantics.json").read_text())


def rows(ids, state_dim=3, action_dim=2, hidden_dim=4):
    """add_multi arguments for transitions numbered ``ids`` (every field holds its id)."""
    ids = torch.as_tensor(ids, dtype=torch.float32)[:, None]
    return (ids.expand(-1, state_dim), ids.expand(-1, action_dim), ids[:, 0],
            ids.expand(-1, state_dim) + 0.5, ids[:, 0] % 2 == 0, ids.expand(-1, hidden_dim))


def contents(rb):
    """The stored slots (the ring fills from slot 0)."""
    return rb.storage._storage[: len(rb)]


def test_ring_trace(semantics):
    vectors = load_npz("velora_buffer_state.npz")
    done = {int(s[0]): float(d[0]) for s, d in zip(vectors["states"], vectors["dones"])}
    rb = velora_replay_buffer(5, state_dim=3, action_dim=2, hidden_dim=4)
    trace = []
    for i in range(3):
        rb.add([i] * 3, [i] * 2, i, [i + 0.5] * 3, done.get(i, 0.0), torch.full((1, 4), float(i)))
        trace.append({"op": f"add(i={i})", "position": rb.position, "size": len(rb)})
    states, actions, rewards, next_states, _, hiddens = rows(range(3, 7))
    rb.add_multi(states, actions, rewards, next_states, torch.tensor([done[i] for i in range(3, 7)]), hiddens)
    trace.append({"op": "add_multi(ids 3..6)", "position": rb.position, "size": len(rb)})
    assert trace == semantics["trace"]
    stored = contents(rb)
    for name in NAMES:
        assert torch.equal(stored[VELORA_KEYS[name]].float(), torch.from_numpy(vectors[name])), name
    assert rb.metadata() == semantics["metadata_json_written"]


def test_overfull_add_multi_keeps_the_newest_in_order(semantics):
    case = semantics["overfull_add_multi"]
    rb = velora_replay_buffer(case["capacity"], state_dim=1, action_dim=1, hidden_dim=1)
    rb.add_multi(*rows(range(case["rows"]), 1, 1, 1))
    assert [rb.position, len(rb)] == [case["position"], case["size"]]
    assert contents(rb)["observation"][:, 0].tolist() == case["states_col0"]


@pytest.mark.parametrize("sizes", [[1, 2, 3], [7], [2, 11, 1], [4, 4, 9, 3]])
def test_batches_of_any_size_equal_one_by_one_adds(sizes):
    batched, single = velora_replay_buffer(4, 3, 2, 4), velora_replay_buffer(4, 3, 2, 4)
    start = 0
    for size in sizes:
        ids = range(start, start + size)
        batched.add_multi(*rows(ids))
        for i in ids:
            single.add(*(value[0] for value in rows([i])))
        start += size
        expected = (start % 4, min(start, 4))
        assert (batched.position, len(batched)) == (single.position, len(single)) == expected
        assert (contents(batched) == contents(single)).all()


def test_sample_is_a_tensordict_and_a_batch_experience_view(semantics):
    rb = velora_replay_buffer(5, 3, 2, 4, batch_size=5)
    with pytest.raises(ValueError, match=r"only 0 transitions stored, batch_size=5"):
        rb.sample()
    rb.add_multi(*rows(range(7)))
    batch = rb.sample()
    assert set(batch.keys(True, True)) == {"observation", "action", "index", ("next", "reward"),
                                           ("next", "observation"), ("next", "done"), ("next", "hidden")}
    experience = as_batch_experience(batch)
    assert {name: list(getattr(experience, name).shape) for name in NAMES} == semantics["sample_shapes"]
    assert experience.dones.dtype is torch.float32
    slots = torch.tensor([5.0, 6.0, 2.0, 3.0, 4.0])  # ids 0..6 into 5 slots
    assert torch.equal(experience.states[:, 0], slots[batch["index"]])


def test_save_load_round_trip_with_sampler_state(tmp_path):
    rb = velora_replay_buffer(6, 3, 2, 4, batch_size=4, generator=torch.Generator().manual_seed(7))
    rb.add_multi(*rows(range(9)))
    rb.sample()
    rb.save(tmp_path)
    state = rb._rng.get_state()
    restored = load_velora_replay_buffer(tmp_path, batch_size=4, generator=torch.Generator())
    restored._rng.set_state(state)
    assert (restored.position, len(restored)) == (rb.position, len(rb)) == (3, 6)
    assert (contents(restored) == contents(rb)).all()
    for _ in range(3):
        assert (restored.sample() == rb.sample()).all()
    rb.add_multi(*rows(range(100, 104)))
    restored.add_multi(*rows(range(100, 104)))
    assert (contents(restored) == contents(rb)).all() and restored.position == rb.position


def test_torchrl_dumps_loads_use_velora_files(tmp_path):
    rb = velora_replay_buffer(6, 3, 2, 4, batch_size=3, generator=torch.Generator().manual_seed(1))
    rb.add_multi(*rows(range(4)))
    rb.dumps(tmp_path)
    assert json.loads((tmp_path / "storage" / "buffer_metadata.json").read_text())["position"] == 4
    restored = velora_replay_buffer(6, 3, 2, 4, batch_size=3, generator=torch.Generator().manual_seed(99))
    restored.loads(tmp_path)  # generator state comes back too
    assert restored.position == 4 and (restored.sample() == rb.sample()).all()


def test_empty_buffer_saves_and_loads(tmp_path):
    velora_replay_buffer(3, 1, 1, 1).save(tmp_path)
    rb = load_velora_replay_buffer(tmp_path)
    assert (len(rb), rb.position) == (0, 0) and not rb.storage._storage["observation"].any()


def test_bad_inputs_name_the_argument():
    rb = velora_replay_buffer(5, 3, 2, 4)
    with pytest.raises(ValueError, match=r"add: state has 4 values \(shape \[4\]\); expected 3 \(state_dim"):
        rb.add([0.0] * 4, [0, 0], 0, [0] * 3, False, [0] * 4)
    with pytest.raises(ValueError, match=r"add: hidden has 2 values .*hidden_dim=4.*use add_multi"):
        rb.add([0.0] * 3, [0, 0], 0, [0] * 3, False, torch.zeros(2))
    states, actions, rewards, next_states, dones, hiddens = rows(range(4))
    fix = r"add_multi: hiddens has shape \[4, 3\]; expected \[B, 4\] \(hidden_dim=4\), e.g. hiddens.reshape"
    with pytest.raises(ValueError, match=fix):
        rb.add_multi(states, actions, rewards, next_states, dones, hiddens[:, :3])
    with pytest.raises(ValueError, match=r"add_multi: states has shape \[4\]; expected \[B, 3\] \(state_dim"):
        rb.add_multi(states[:, 0], actions, rewards, next_states, dones, hiddens)
    with pytest.raises(ValueError, match=r"add_multi: arguments have different batch sizes .*'rewards': 3"):
        rb.add_multi(states, actions, rewards[:3], next_states, dones, hiddens)
    with pytest.raises(TypeError, match="add_multi: missing argument 'dones'"):
        rb.add_multi(states, actions, rewards, next_states, None, hiddens)
    with pytest.raises(ValueError, match="hidden_dim must be an int >= 1, got hidden_dim=0"):
        velora_replay_buffer(5, 3, 2, 0)
    assert len(rb) == 0  # nothing was written


# -- warm ----------------------------------------------------------------------------------
class Recorder(gym.Wrapper):
    """Logs every true transition of one env: (obs, action, reward, next obs, done, step in episode)."""

    def __init__(self, env, log):
        super().__init__(env)
        self.log, self.obs, self.t = log, None, 0

    def reset(self, **kwargs):
        self.obs, info = self.env.reset(**kwargs)
        self.t = 0
        return self.obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = terminated or truncated
        self.log.append((self.obs.copy(), int(action), float(reward), obs.copy(), done, self.t))
        self.obs, self.t = obs, self.t + 1
        return obs, reward, terminated, truncated, info


def counting_policy(seed=0):
    generator = torch.Generator().manual_seed(seed)

    def policy(obs, hidden):  # hidden counts the steps since the episode started
        return torch.randint(0, 2, (obs.shape[0],), generator=generator), hidden + 1

    return policy


def vector_cartpole(num_envs, mode, logs):
    def make(log):
        return lambda: Recorder(gym.make("CartPole-v1", max_episode_steps=12), log)

    return gym.vector.SyncVectorEnv([make(log) for log in logs[:num_envs]], autoreset_mode=mode)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("capacity,n_samples", [(400, 300), (50, 170)])
def test_warm_gymnasium_vector_env(mode, capacity, n_samples):
    logs = [[] for _ in range(3)]
    env = vector_cartpole(3, mode, logs)
    rb = velora_replay_buffer(capacity, 4, 1, 2)
    assert rb.warm(counting_policy(), n_samples, env, progress=False, seed=3) == n_samples
    assert len(rb) == min(n_samples, capacity) and rb.position == n_samples % capacity
    truth = {(o.tobytes(), n.tobytes()): (a, r, d, t) for log in logs for o, a, r, n, d, t in log}
    recorded = sum(map(len, logs))
    assert n_samples <= recorded < n_samples + 3  # nothing extra stepped, nothing skipped but resets
    stored = contents(rb)
    ends = 0
    for i in range(len(rb)):
        key = (stored["observation"][i].numpy().tobytes(), stored["next", "observation"][i].numpy().tobytes())
        assert key in truth, "stored a transition the env never made (reset obs after a final obs?)"
        action, reward, done, t = truth[key]
        assert stored["action"][i].item() == action and stored["next", "reward"][i].item() == reward == 1.0
        assert stored["next", "done"][i].item() == done  # dones line up with episode ends
        assert stored["next", "hidden"][i].tolist() == [t + 1.0] * 2  # hidden reset at episode start
        ends += done
    assert ends >= max(1, len(rb) // 36)  # 3 envs, each truncated after 12 steps at the latest
    # the newest transitions are kept, in order
    newest = rb.storage.get(torch.tensor([(rb.position - 1) % capacity]))["next", "observation"][0]
    last_step = {n.tobytes() for log in logs for *_, n, _, _ in log[-1:]}
    assert newest.numpy().tobytes() in last_step
    env.close()


def test_warm_tops_up_and_reports_progress_without_tqdm(monkeypatch, capsys):
    logs = [[] for _ in range(2)]
    env = vector_cartpole(2, "NextStep", logs)
    rb = velora_replay_buffer(100, 4, 1, 2)
    assert rb.warm(counting_policy(), 15, env, progress=False) == 15
    assert rb.warm(counting_policy(), 10, env) == 0  # already holds n_samples
    monkeypatch.setitem(sys.modules, "tqdm", None)  # "not installed"
    assert rb.warm(counting_policy(), 40, env, progress=True) == 25
    assert "warm: 25/25 transitions" in capsys.readouterr().err
    env.close()


def test_warm_errors():
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    with pytest.raises(ValueError, match=r"shape \[1, 4\]; expected \[num_envs=1, state_dim=3\]"):
        velora_replay_buffer(10, 3, 1, 2).warm(counting_policy(), 5, env, progress=False)
    rb = velora_replay_buffer(10, 4, 1, 2)
    with pytest.raises(TypeError, match=r"must return \(action, new_hidden\)"):
        rb.warm(lambda obs, hidden: obs, 5, env, progress=False)
    with pytest.raises(ValueError, match=r"hidden state of shape \[1, 3\]; expected \[num_envs=1, hidden"):
        rb.warm(lambda obs, hidden: (np.zeros(1, dtype=int), torch.zeros(1, 3)), 5, env, progress=False)
    with pytest.raises(TypeError, match="env must be a gymnasium vector env"):
        rb.warm(counting_policy(), 5, gym.make("CartPole-v1"), progress=False)
    with pytest.raises(ValueError, match="n_samples must be an int >= 0"):
        rb.warm(counting_policy(), -1, env, progress=False)
    assert len(rb) == 0
    env.close()


class _CountingModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, observation, hidden):
        choice = torch.randint(0, 2, observation.shape[:-1], generator=self.generator)
        return torch.nn.functional.one_hot(choice, 2), hidden + 1


@pytest.mark.parametrize("num_envs", [None, 2])
def test_warm_torchrl_env(num_envs):
    from torchrl.envs import GymEnv, SerialEnv

    def make():
        return GymEnv("CartPole-v1")

    env = make() if num_envs is None else SerialEnv(num_envs, make)
    policy = TensorDictModule(_CountingModule(), in_keys=["observation", "hidden"],
                              out_keys=["action", ("next", "hidden")])
    rb = velora_replay_buffer(200, 4, 2, 3)
    assert rb.warm(policy, 121, env, progress=False, seed=0) == 121
    assert len(rb) == 121
    stored = rb.storage.get(torch.arange(121))
    assert (stored["next", "reward"] == 1).all() and stored["next", "done"].any()
    assert (stored["action"].sum(-1) == 1).all()
    lanes = num_envs or 1
    for lane in range(lanes):  # rows interleave the envs step by step
        seq = stored[lane::lanes]
        hidden, done = seq["next", "hidden"][:, 0], seq["next", "done"][:, 0]
        assert hidden[0] == 1
        for t in range(len(seq) - 1):
            if done[t]:
                assert hidden[t + 1] == 1
                assert not torch.equal(seq["observation"][t + 1], seq["next", "observation"][t])
            else:
                assert hidden[t + 1] == hidden[t] + 1
                assert torch.equal(seq["observation"][t + 1], seq["next", "observation"][t])
    bad = TensorDictModule(lambda obs: obs[..., :2].long(), in_keys=["observation"], out_keys=["action"])
    with pytest.raises(KeyError, match=r"policy must write \('next', 'hidden'\)"):
        rb.warm(bad, 150, env, progress=False)
    env.close()


def test_class_is_a_torchrl_tensordict_buffer():
    from torchrl.data import TensorDictReplayBuffer

    rb = velora_replay_buffer(4, 3, 2, 4)
    assert isinstance(rb, VeloraReplayBuffer) and isinstance(rb, TensorDictReplayBuffer)
    rb.add_multi(*rows(range(2)))
    rb.add(rb.storage.get(0).clone())  # TorchRL's add(tensordict) still works
    assert len(rb) == 3


def test_warm_refuses_a_progress_flag_that_is_not_a_bool():
    """progress="False" is truthy: taken as a flag it would show the bar."""
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    rb = velora_replay_buffer(10, 4, 1, 2)
    with pytest.raises(TypeError, match="progress must be True or False, got progress='False'"):
        rb.warm(counting_policy(), 5, env, progress="False")
    assert len(rb) == 0
    env.close()


def test_sample_takes_torchrls_waiting_keywords():
    # Was: velora's sample signature had no wait/timeout/cancel_event, so a TorchRL release with
    # them (after 0.14.1) got a TypeError from this buffer alone.
    rb = velora_replay_buffer(5, 3, 2, 4, batch_size=3)
    rb.add_multi(*rows(range(4)))
    assert rb.sample(wait=False, timeout=None, cancel_event=None).shape == (3,)
    try:
        batch = rb.sample(timeout=5.0, wait=True)
    except TypeError as error:  # TorchRL 0.14.1: no waiting sample; refused, never ignored
        assert "timeout=5.0" in str(error) or "wait=True" in str(error)
    else:
        assert batch.shape == (3,)
