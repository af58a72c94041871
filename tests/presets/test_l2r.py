"""l2r presets: PPOBuffer (GAE per finished path, across the ring end) and SimpleReplayBuffer."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests._vectors import load_npz
from torchrl_ext.presets import l2r_ppo_buffer, l2r_simple_replay_buffer


def ppo_step(obs, act, rew, val, logp) -> TensorDict:
    f = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    return TensorDict({"observation": f(obs), "action": f(act), "state_value": f(val).reshape(1),
                       "action_log_prob": f(logp).reshape(1), "next": {"reward": f(rew).reshape(1)}}, [])


def fill_vectors(paths):
    data = load_npz("l2r_ppobuffer_finish_path.npz")
    gamma, lam, eps, size, batch = data["params"]
    rb = l2r_ppo_buffer(3, 2, int(size), int(batch), gamma, lam, eps,
                        generator=torch.Generator().manual_seed(0))
    start = 0
    for end, last in zip(*paths(data)):
        for t in range(start, end):
            rb.store(ppo_step(data["in_obs"][t], data["in_act"][t], data["in_rew"][t],
                              data["in_val"][t], data["in_logp"][t]))
        rb.finish_path(last)
        start = end
    return rb, data


def close(got, want):
    torch.testing.assert_close(got.reshape(-1).double(), torch.from_numpy(np.asarray(want, np.float64)),
                               rtol=1e-5, atol=1e-5)


def test_finish_path_equals_l2r():
    rb, data = fill_vectors(lambda d: (d["path_ends"], d["last_vals"]))
    n = int(data["size_"])
    stored = rb.storage._storage
    close(stored["advantage"][:n], data["adv_buf_after_finish"][:n])
    close(stored["value_target"][:n], data["ret_buf_after_finish"][:n])


def test_runner_style_bootstrap_is_the_callers_choice():
    """l2r's runner ends one 6-step path with the last stored step's own value; finish_path
    bootstraps from whatever it is given."""
    rb, data = fill_vectors(lambda d: ([6], [float(d["in_val"][5])]))
    n = 6
    close(rb.storage._storage["advantage"][:n], data["runner_style_adv"][:n])
    close(rb.storage._storage["value_target"][:n], data["runner_style_ret"][:n])


def test_advantages_of_values_that_require_grad_carry_no_graph():
    # Was: finish_path ran with grad on, so values straight from a critic (not detached) gave
    # advantages and returns holding the critic's graph, which a PPO loss then backpropagated.
    critic = torch.nn.Linear(2, 1)
    obs, last = torch.randn(4, 2), torch.randn(1, 2)
    buffers = []
    for detach in (False, True):
        rb = l2r_ppo_buffer(2, 1, 8, 4, 0.9, 0.8, 1e-8)
        value, last_val = critic(obs), critic(last).squeeze()
        if detach:
            value, last_val = value.detach(), last_val.detach()
        rb.store(TensorDict({"observation": obs, "action": torch.zeros(4, 1), "state_value": value,
                             "action_log_prob": torch.zeros(4, 1), "next": {"reward": torch.ones(4, 1)}}, [4]))
        rb.finish_path(last_val)
        buffers.append(rb.storage[:])
    graph, plain = buffers
    for key in ("advantage", "value_target"):
        assert graph[key].grad_fn is None and not graph[key].requires_grad, key
        assert torch.equal(graph[key], plain[key]), key


def test_sample_batch_returns_gae_returns_and_leaves_the_buffer_alone():
    """l2r returns rewards as `ret` and re-normalises the whole array in place on every call."""
    rb, data = fill_vectors(lambda d: (d["path_ends"], d["last_vals"]))
    n = int(data["size_"])
    stored_adv = rb.storage._storage["advantage"][:n].clone()
    mean, std = stored_adv.mean(), stored_adv.std(correction=0)
    for _ in range(2):
        batch = rb.sample_batch()
        assert batch.shape == (5,) and batch["index"].unique().numel() == 5
        idx = batch["index"]
        torch.testing.assert_close(batch["advantage"], (stored_adv[idx] - mean) / (std + 1e-3))
        close(batch["value_target"], data["ret_buf_after_finish"][idx.numpy()])
        torch.testing.assert_close(batch["observation"], torch.from_numpy(data["in_obs"][idx.numpy()]))
    torch.testing.assert_close(rb.storage._storage["advantage"][:n], stored_adv)


def reference(rewards, values, last, gamma, lam):
    r = np.append(np.asarray(rewards, np.float64), last)
    v = np.append(np.asarray(values, np.float64), last)
    delta = r[:-1] + gamma * v[1:] - v[:-1]
    adv, ret, acc, acc_r = np.zeros(len(delta)), np.zeros(len(delta)), 0.0, float(last)
    for t in range(len(delta) - 1, -1, -1):
        acc = delta[t] + gamma * lam * acc
        acc_r = r[t] + gamma * acc_r
        adv[t], ret[t] = acc, acc_r
    return adv, ret


@pytest.mark.parametrize("lengths", [[3, 4, 6], [2, 9], [5, 5, 5]])
def test_paths_across_the_ring_end_and_longer_than_the_ring(lengths):
    """l2r crashes when a path wraps (UnboundLocalError / ValueError); here it follows the ring."""
    rng = np.random.default_rng(sum(lengths))
    size, gamma, lam = 5, 0.9, 0.8
    rb = l2r_ppo_buffer(1, 1, size, 3, gamma, lam)
    for length in lengths:
        rew, val = rng.normal(size=length), rng.normal(size=length)
        last = float(rng.normal())
        for t in range(length):
            rb.store(ppo_step([t], [0.0], rew[t], val[t], 0.0))
        start = (rb._writer._cursor - min(length, size)) % size
        rb.finish_path(last)
        adv, ret = reference(rew, val, last, gamma, lam)
        kept = min(length, size)  # the newest steps of the path
        idx = (start + np.arange(kept)) % size
        close(rb.storage._storage["advantage"][idx], adv[-kept:])
        close(rb.storage._storage["value_target"][idx], ret[-kept:])


def test_simple_replay_ring_and_distinct_batches():
    data = load_npz("l2r_simple_replay.npz")
    rb = l2r_simple_replay_buffer(2, 1, 5, 3, generator=torch.Generator().manual_seed(0))
    f = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    for t in range(len(data["in_rew"])):
        rb.extend(TensorDict({"observation": f(data["in_obs"][t]), "action": f(data["in_act"][t]),
                              "next": {"observation": f(data["in_obs2"][t]), "reward": f(data["in_rew"][t]).reshape(1),
                                       "done": f(data["in_done"][t]).reshape(1)}}, []).unsqueeze(0))
    stored = rb.storage._storage
    torch.testing.assert_close(stored["observation"], torch.from_numpy(data["obs_buf"]))
    torch.testing.assert_close(stored["next", "reward"][:, 0], torch.from_numpy(data["rew_buf"]))
    assert rb._writer._cursor == int(data["ptr"]) and len(rb) == int(data["size_"])
    batch = rb.sample()
    assert batch["index"].unique().numel() == 3
    torch.testing.assert_close(batch["observation"], stored["observation"][batch["index"]])
    small = l2r_simple_replay_buffer(2, 1, 5, 3)
    small.extend(TensorDict({"observation": torch.zeros(2, 2)}, [2]))
    assert small.sample().shape == (2,)  # fewer stored than batch_size: all of them


def test_bad_input():
    with pytest.raises(ValueError, match="obs_dim must be an int >= 1, got obs_dim=0"):
        l2r_ppo_buffer(0, 1, 10, 2)
    with pytest.raises(ValueError, match=r"lam must be a number in \[0, 1\], got lam=1.5"):
        l2r_ppo_buffer(1, 1, 10, 2, lam=1.5)
    rb = l2r_ppo_buffer(1, 1, 10, 2)
    with pytest.raises(ValueError, match="step has no \\('next', 'reward'\\)"):
        rb.store(TensorDict({"state_value": torch.zeros(1)}, []))
    rb.store(ppo_step([0.0], [0.0], 1.0, 0.0, 0.0))
    with pytest.raises(RuntimeError, match="no finished path to sample from: call finish_path"):
        rb.sample_batch()
