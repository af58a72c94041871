"""OnPolicyReplayBuffer / VTraceReplayBuffer: pytorchrl's on-policy storages, intended behaviour."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests._vectors import load_npz
from torchrl_ext.presets import pytorchrl_on_policy_buffer
from torchrl_ext.replay_buffers import OnPolicyReplayBuffer, VTraceReplayBuffer


def step(obs, value, reward, done, terminated=None, ireward=None, ivalue=None, log_prob=None):
    """One collector step ``[N]`` in TorchRL's keys (pytorchrl: OBS, VAL, REW, DONE2, ...)."""
    col = lambda x, dtype=torch.float32: torch.as_tensor(np.asarray(x), dtype=dtype).reshape(-1, 1)  # noqa: E731
    n = col(obs).shape[0]
    data = {"observation": col(obs), "state_value": col(value),
            "next": {"observation": col(obs) + 0.5, "reward": col(reward),
                     "done": col(done, torch.bool),
                     "terminated": col(done if terminated is None else terminated, torch.bool)}}
    if ireward is not None:
        data["next"]["intrinsic_reward"] = col(ireward)
        data["intrinsic_state_value"] = col(ivalue)
    if log_prob is not None:
        data["action_log_prob"] = col(log_prob)
    return TensorDict(data, [n])


def critic(values: dict[str, torch.Tensor]):
    """A value network that writes fixed bootstrap values (the critic on the last slot)."""
    def run(td):
        for key, value in values.items():
            td.set(key, value.reshape(td.shape + (1,)).to(torch.float32))
        return td
    return run


def normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    return (x - x.mean()) / (x.std(correction=1) + eps)


def returns_reference(reward, value, next_value, done, terminated, gamma, lmbda):
    """Float64 GAE loop over time-major ``[T, N]`` arrays."""
    reward, value, next_value = (np.asarray(x, np.float64) for x in (reward, value, next_value))
    adv = np.zeros_like(reward)
    acc = np.zeros(reward.shape[1])
    for t in range(reward.shape[0] - 1, -1, -1):
        delta = reward[t] + gamma * (1 - terminated[t]) * next_value[t] - value[t]
        acc = delta + gamma * lmbda * (1 - done[t]) * acc
        adv[t] = acc
    return adv, adv + value


@pytest.mark.parametrize("case", ["vanilla_ext", "gae_ext", "vanilla_extint", "gae_extint"])
def test_returns_and_advantages_equal_pytorchrl(case):
    """pytorchrl's full-rollout vectors (its backward intrinsic filter, eps 1e-5)."""
    data = load_npz("pytorchrl_returns_advantages.npz")
    gamma, lmbda, gamma_int = (float(p) for p in data["params"])
    steps, envs = data["in_rewards"].shape
    intrinsic = case.endswith("extint")
    rb = OnPolicyReplayBuffer(steps, gamma=gamma, gae_lambda=lmbda if case.startswith("gae") else None,
                              gamma_intrinsic=gamma_int, intrinsic_filter="backward")
    for t in range(steps):
        rb.insert(step(np.arange(envs) + 10 * t, data["in_values"][t], data["in_rewards"][t],
                       data["in_dones"][t + 1],
                       ireward=data["in_irew"][t] if intrinsic else None,
                       ivalue=data["in_ival"][t] if intrinsic else None))
    boot = {"state_value": torch.from_numpy(data["in_boot_val"])}
    if intrinsic:
        boot["intrinsic_state_value"] = torch.from_numpy(data["in_boot_ival"])
    rb.compute_returns(critic(boot))
    out = rb.storage.data
    close = lambda got, want: torch.testing.assert_close(  # noqa: E731
        got[:steps, :, 0], torch.from_numpy(want), rtol=1e-5, atol=1e-5)
    close(out["value_target"], data[f"{case}__RET"][:steps])
    close(out["advantage"], data[f"{case}__ADV"])
    if intrinsic:
        close(out["intrinsic_value_target"], data[f"{case}__IRET"][:steps])
        close(out["intrinsic_advantage"], data[f"{case}__IADV"])


def test_intrinsic_statistics_carry_across_rollouts_like_pytorchrl():
    data = load_npz("pytorchrl_int_reward_norm_sequence.npz")
    gamma, lmbda, gamma_int, steps, envs, iters = (float(p) for p in data["params"])
    steps, envs = int(steps), int(envs)
    rb = OnPolicyReplayBuffer(steps, gamma=gamma, gae_lambda=lmbda, gamma_intrinsic=gamma_int,
                              intrinsic_filter="backward")
    for it in range(int(iters)):
        for t in range(steps):
            rb.insert(step(np.zeros(envs), np.zeros(envs), np.zeros(envs), data[f"it{it}__in_dones"][t + 1],
                           ireward=data[f"it{it}__in_irew"][t], ivalue=data[f"it{it}__in_ival"][t]))
        rb.compute_returns(critic({"state_value": torch.zeros(envs),
                                   "intrinsic_state_value": torch.from_numpy(data[f"it{it}__in_boot_ival"])}))
        got = rb.storage.data
        torch.testing.assert_close(got["intrinsic_value_target"][:steps, :, 0],
                                   torch.from_numpy(data[f"it{it}__IRET"][:steps]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["intrinsic_advantage"][:steps, :, 0],
                                   torch.from_numpy(data[f"it{it}__IADV"]), rtol=1e-5, atol=1e-5)
        rb.after_update()


def test_forward_filter_and_partial_rollouts_against_a_float64_loop():
    """Only the filled steps count (pytorchrl used stale rows); the bootstrap is the slot after them."""
    rng = np.random.default_rng(0)
    steps, filled, envs, gamma, lmbda, gamma_int = 6, 4, 3, 0.9, 0.8, 0.95
    rb = OnPolicyReplayBuffer(steps, gamma=gamma, gae_lambda=lmbda, gamma_intrinsic=gamma_int,
                              advantage_eps=1e-8)
    # A previous full rollout leaves stale rows behind.
    for t in range(steps):
        rb.insert(step(np.full(envs, 99.0), np.full(envs, 50.0), np.full(envs, 7.0), np.zeros(envs),
                       ireward=np.full(envs, 3.0), ivalue=np.zeros(envs)))
    rb.after_update()
    reward, value, done, irew, ival = (rng.normal(size=(filled, envs)) for _ in range(5))
    done = rng.random((filled, envs)) < 0.3
    irew = np.abs(irew)
    for t in range(filled):
        rb.insert(step(np.arange(envs) + 10 * t, value[t], reward[t], done[t], ireward=irew[t], ivalue=ival[t]))
    boot, iboot = rng.normal(size=envs), rng.normal(size=envs)
    rb.compute_returns(critic({"state_value": torch.from_numpy(boot),
                               "intrinsic_state_value": torch.from_numpy(iboot)}))
    assert rb.used_capacity == filled
    next_value = np.concatenate([value[1:], boot[None]])
    adv, target = returns_reference(reward, value, next_value, done, done, gamma, lmbda)
    got = rb.storage.data
    torch.testing.assert_close(got["value_target"][:filled, :, 0].double(), torch.from_numpy(target), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["advantage"][:filled, :, 0].double(), normalise(torch.from_numpy(adv), 1e-8),
                               rtol=1e-4, atol=1e-5)
    assert bool((got["advantage"][filled:] == 0).all())
    # Forward filter: f_t = gamma_int f_{t-1} + r_t per env, stats over all values, r / std.
    filt, seen = np.zeros(envs), []
    for t in range(filled):
        filt = gamma_int * filt + irew[t]
        seen.append(filt.copy())
    seen = np.concatenate(seen)
    count = 1e-4 + seen.size
    mean = seen.size * seen.mean() / count
    var = (1e-4 + seen.var(ddof=1) * seen.size + seen.mean() ** 2 * 1e-4 * seen.size / count) / count
    scaled = irew / np.sqrt(var)
    inext = np.concatenate([ival[1:], iboot[None]])
    never = np.zeros_like(done)
    iadv, itarget = returns_reference(scaled, ival, inext, never, never, gamma_int, lmbda)
    assert mean == pytest.approx(float(rb.intrinsic_normalizer.rms.mean))
    torch.testing.assert_close(got["intrinsic_value_target"][:filled, :, 0].double(), torch.from_numpy(itarget),
                               rtol=1e-4, atol=1e-5)
    # Minibatches cover exactly the filled steps.
    seen_obs = torch.cat([b["observation"][:, 0] for b in rb.generate_batches(num_mini_batch=3)])
    assert sorted(seen_obs.tolist()) == sorted((np.arange(envs)[None] + 10 * np.arange(filled)[:, None]).ravel().tolist())


def test_truncated_steps_bootstrap_from_the_true_final_observation():
    rb = OnPolicyReplayBuffer(2, gamma=0.5, gae_lambda=None, normalize_advantage=False)
    rb.insert(step([1.0], [0.0], [1.0], [True], terminated=[False]))  # truncated: final obs 1.5
    rb.insert(step([2.0], [0.0], [1.0], [False]))
    with pytest.raises(ValueError, match="truncated .* pass compute_returns\\(value_network=critic\\)"):
        rb.compute_returns()

    def value_of_obs(td):  # V(s) = 10 * s
        td.set("state_value", 10 * td.get("observation"))
        return td

    rb.compute_returns(value_of_obs)
    # Step 0: 1 + 0.5 * V(1.5) = 8.5 (not V of the reset observation 2.0 in slot 1).
    # Step 1: 1 + 0.5 * V(slot 2 = 2.5) = 13.5.
    assert rb.storage.data["value_target"][:2, 0, 0].tolist() == [8.5, 13.5]


def test_epochs_minibatches_and_recurrent_sequences():
    """Every step once per epoch (pytorchrl: floor(N*l/mbs) batches, stale row 0 after the first)."""
    steps, envs = 5, 3
    rb = OnPolicyReplayBuffer(steps, generator=torch.Generator().manual_seed(0))
    for t in range(steps):
        rb.insert(step(np.arange(envs) + 10 * t, np.zeros(envs), np.ones(envs), np.zeros(envs)))
    rb.compute_returns()
    batches = list(rb.generate_batches(num_mini_batch=4, num_epochs=2))
    assert [b.shape[0] for b in batches] == [4, 4, 4, 3] * 2
    for epoch in (batches[:4], batches[4:]):
        obs = sorted(torch.cat([b["observation"][:, 0] for b in epoch]).tolist())
        assert obs == sorted(float(e + 10 * t) for t in range(steps) for e in range(envs))
    rb.recurrent = True  # whole env sequences; N=3 with 2 minibatches works (pytorchrl: IndexError)
    sequences = list(rb.generate_batches(num_mini_batch=2))
    assert [tuple(b.shape) for b in sequences] == [(2, steps), (1, steps)]
    with pytest.raises(ValueError, match="num_mini_batch=4 is larger than the 3 threads"):
        list(rb.generate_batches(num_mini_batch=4))


def test_rollouts_ship_between_buffers_and_parameters_update():
    rng = np.random.default_rng(1)
    worker = OnPolicyReplayBuffer(4, gamma=0.9)
    for t in range(3):
        worker.insert(step(rng.normal(size=2), rng.normal(size=2), rng.normal(size=2), [False, t == 1]))
    shipped = worker.get_all_buffer_data(to_cpu=True)
    assert shipped.shape == (4, 2) and "advantage" not in shipped.keys()
    learner = OnPolicyReplayBuffer(4, gamma=0.9)
    learner.insert_data_slice(shipped)
    worker.compute_returns()
    learner.compute_returns()
    torch.testing.assert_close(learner.storage.data["value_target"], worker.storage.data["value_target"])
    learner.update_storage_parameter("gamma", 0.0)
    learner.compute_returns()
    target = learner.storage.data["value_target"][:3]  # gamma 0: the target is the reward
    assert torch.allclose(target, learner.storage.data["next", "reward"][:3])
    with pytest.raises(ValueError, match="has no parameter 'gamma_int'; it can update gamma, gae_lambda"):
        learner.update_storage_parameter("gamma_int", 0.5)
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\], got gamma=2"):
        learner.update_storage_parameter("gamma", 2)
    with pytest.raises(RuntimeError, match="the rollout is empty"):
        OnPolicyReplayBuffer(3).compute_returns()
    with pytest.raises(ValueError, match="data holds 6 slots, i.e. 5 steps"):
        learner.insert_data_slice(torch.cat([shipped, shipped[:2]]))


def vtrace_reference(log_pi, log_mu, value, boot, reward, done, gamma, rho_bar, c_bar):
    """Float64 V-trace over ``[T, N]`` with episode ends (terminations) cutting bootstrap and trace."""
    value = np.asarray(value, np.float64)
    next_value = np.concatenate([value[1:], boot[None]])
    ratio = np.exp(np.asarray(log_pi, np.float64) - log_mu)
    rho, c = np.minimum(ratio, rho_bar), np.minimum(ratio, c_bar)
    not_done = 1.0 - done
    delta = rho * (reward + gamma * not_done * next_value - value)
    acc, vs_minus_v = np.zeros(value.shape[1]), np.zeros_like(value)
    for t in range(value.shape[0] - 1, -1, -1):
        acc = delta[t] + gamma * c[t] * not_done[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + value
    next_vs = np.concatenate([vs[1:], boot[None]])
    next_vs = np.where(done, next_value, next_vs)
    adv = rho * (reward + gamma * not_done * next_vs - value)
    return vs, adv


@pytest.mark.parametrize("rho_bar, c_bar", [(0.8, 1.3), (2.0, 0.5)])
def test_vtrace_against_a_float64_reference(rho_bar, c_bar):
    """Rewards (not returns) feed the TD terms; the bootstrap is V of the last observation."""
    rng = np.random.default_rng(2)
    steps, envs, gamma = 7, 3, 0.95
    reward, value, log_mu, new_value = (rng.normal(size=(steps, envs)) for _ in range(4))
    log_pi = log_mu + 0.5 * rng.normal(size=(steps, envs))
    done = rng.random((steps, envs)) < 0.2
    rb = VTraceReplayBuffer(steps, gamma=gamma, rho_thresh=rho_bar, c_thresh=c_bar)
    for t in range(steps):
        rb.insert(step(np.arange(envs) + 10 * t, value[t], reward[t], done[t], log_prob=log_mu[t]))
    boot = rng.normal(size=envs)

    def refresh(td):  # the current actor and critic on the stored steps
        td.set("action_log_prob", torch.from_numpy(log_pi).float().unsqueeze(-1))
        td.set("state_value", torch.from_numpy(new_value).float().unsqueeze(-1))
        return td

    rb.compute_returns(critic({"state_value": torch.from_numpy(boot)}), refresh=refresh)
    vs, adv = vtrace_reference(log_pi.astype(np.float32), log_mu.astype(np.float32),
                               new_value.astype(np.float32), boot.astype(np.float32),
                               reward.astype(np.float32), done, gamma, rho_bar, c_bar)
    got = rb.storage.data
    torch.testing.assert_close(got["value_target"][:steps, :, 0].double(), torch.from_numpy(vs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["advantage"][:steps, :, 0].double(), normalise(torch.from_numpy(adv), 1e-8),
                               rtol=1e-4, atol=1e-5)
    # The refreshed log-probs replace the behaviour ones: a PPO ratio now starts at 1.
    torch.testing.assert_close(got["action_log_prob"][:steps, :, 0], torch.from_numpy(log_pi).float())
    with pytest.raises(ValueError, match="refresh must return the steps with 'action_log_prob'"):
        rb.compute_returns(refresh=lambda td: td.exclude("action_log_prob"))
    with pytest.raises(ValueError, match="rho_thresh must be > 0.0, got rho_thresh=0.0"):
        VTraceReplayBuffer(3, rho_thresh=0)


def test_pytorchrl_preset_picks_the_storage():
    from torchrl_ext.presets import pytorchrl_on_policy_buffer

    assert pytorchrl_on_policy_buffer(8).gae_lambda == 0.95
    assert pytorchrl_on_policy_buffer(8, storage="vanilla").gae_lambda is None
    rb = pytorchrl_on_policy_buffer(8, storage="vtrace", clip_rho_thres=0.8, clip_c_thres=1.3)
    assert isinstance(rb, VTraceReplayBuffer) and (rb.rho_thresh, rb.c_thresh) == (0.8, 1.3)
    with pytest.raises(ValueError, match="storage must be 'gae', 'vanilla' or 'vtrace'.*got storage='ppo'"):
        pytorchrl_on_policy_buffer(8, storage="ppo")


def _rollout(cls=OnPolicyReplayBuffer, truncated=False):
    rb = cls(2, normalize_advantage=False)
    rb.insert(step([1.0, 2.0], [0.1, 0.2], [1.0, 1.0], [truncated, False], [False, False], log_prob=[-1.0, -1.0]))
    rb.insert(step([3.0, 4.0], [0.3, 0.4], [1.0, 1.0], [False, False], log_prob=[-2.0, -2.0]))
    return rb


def _stored(rb):
    return rb.storage.data.clone(), getattr(rb, "behaviour_log_prob", None)


@pytest.mark.parametrize("bad, match", [
    (lambda td: td.set("state_value", torch.zeros(*td.shape, 3)), "of shape \\[2, 3\\]; expected \\[2, 1\\]"),
    (lambda td: td.set("state_value", torch.full((*td.shape, 1), float("nan"))), r"`state_value` holds 2 NaN or infinite value\(s\) of 2; value_network wrote them"),
    (lambda td: td.exclude("state_value"), "value_network must return the steps with 'state_value' set"),
])
@pytest.mark.parametrize("truncated", [False, True])
def test_a_bad_critic_output_stores_nothing(bad, match, truncated):
    """compute_returns checks the critic's outputs before it writes the bootstrap or any target."""
    rb = _rollout(truncated=truncated)
    before, _ = _stored(rb)
    with pytest.raises(ValueError, match=match):
        rb.compute_returns(bad)
    after, _ = _stored(rb)
    assert (before == after).all()


def test_a_bad_refresh_stores_nothing_in_vtrace():
    rb = _rollout(VTraceReplayBuffer)
    rb.compute_returns()
    before, behaviour = _stored(rb)
    with pytest.raises(ValueError, match="refresh wrote 'state_value' of shape"):
        rb.compute_returns(refresh=lambda td: td.set("state_value", torch.zeros(*td.shape, 3)))
    after, kept = _stored(rb)
    assert (before == after).all() and torch.equal(behaviour, kept)


@pytest.mark.parametrize("name, value", [("advantage_eps", float("inf")), ("gamma", float("nan")),
                                         ("rho_thresh", float("nan"))])
def test_non_finite_parameters_are_refused(name, value):
    rb = VTraceReplayBuffer(2)
    with pytest.raises(ValueError, match=f"{name} must be"):
        rb.update_storage_parameter(name, value)


@pytest.mark.parametrize("cls", [OnPolicyReplayBuffer, VTraceReplayBuffer])
@pytest.mark.parametrize("intrinsic", [False, True])
def test_a_derived_key_written_by_the_steps_is_refused_before_anything_changes(cls, intrinsic):
    """Steps that carry ``value_target`` (an output of compute_returns) are refused before the
    bootstrap, the refreshed log-probs or the intrinsic normalizer change."""
    rb = cls(2, normalize_advantage=False)
    for t in range(2):
        data = step([1.0 + t, 2.0], [0.1, 0.2], [1.0, 1.0], [False, False],
                    ireward=[1.0, 2.0] if intrinsic else None, ivalue=[0.0, 0.0] if intrinsic else None,
                    log_prob=[-1.0, -1.0])
        rb.insert(data.set("value_target", torch.zeros(2, 1)))
    before, behaviour = _stored(rb)
    normalizer = {k: v.clone() for k, v in rb.intrinsic_normalizer.state_dict().items()}
    values = {"state_value": torch.full((2,), 7.0), "intrinsic_state_value": torch.ones(2)}
    refresh = {"refresh": lambda td: td.set("action_log_prob", torch.zeros(*td.shape, 1))} if cls is VTraceReplayBuffer else {}
    with pytest.raises(ValueError, match="'value_target' is written by inserted steps"):
        rb.compute_returns(critic(values), **refresh)
    after, kept = _stored(rb)
    assert set(after.keys(True, True)) == set(before.keys(True, True)) and (before == after).all()
    assert kept is behaviour
    assert all(torch.equal(v, normalizer[k]) for k, v in rb.intrinsic_normalizer.state_dict().items())


@pytest.mark.parametrize("filled", [1, 2, 3])
def test_after_update_carries_the_slot_after_the_last_step(filled):
    """pytorchrl's after_gradients: row 0 takes the row after the last inserted step (row T only
    after a full rollout), after a first rollout and after an earlier full one."""
    rb = OnPolicyReplayBuffer(3, normalize_advantage=False)
    for rollout in range(2):
        length = 3 if rollout == 0 else filled
        for t in range(length):
            rb.insert(step([10.0 * rollout + t, 0.0], [0.0, 0.0], [1.0, 1.0], [False, False]))
        rb.after_update()
        # step() stores obs + 0.5 as the next observation of the last step
        assert rb.storage.data["observation"][0, 0].item() == 10.0 * rollout + length - 1 + 0.5


def test_after_update_of_an_empty_rollout_keeps_slot_0():
    rb = OnPolicyReplayBuffer(3, normalize_advantage=False)
    for t in range(3):
        rb.insert(step([float(t), 0.0], [0.0, 0.0], [1.0, 1.0], [False, False]))
    rb.after_update()
    carried = rb.storage.data[0].clone()
    rb.after_update()
    assert (rb.storage.data[0] == carried).all()


def test_generate_batches_without_a_split_returns_to_the_constructors():
    rb = OnPolicyReplayBuffer(4, num_mini_batch=1, normalize_advantage=False)
    for t in range(4):
        rb.insert(step([float(t), 1.0], [0.0, 0.0], [1.0, 1.0], [False, False]))
    sizes = lambda **split: [b.numel() for b in rb.generate_batches(**split)]  # noqa: E731
    assert sizes() == [8]
    assert sizes(num_mini_batch=4) == [2, 2, 2, 2]
    assert sizes(mini_batch_size=3) == [3, 3, 2]
    assert sizes() == [8]


def _filled(num_steps=3, **kwargs):
    """A rollout of ``num_steps`` steps of 2 envs whose observation is the step number."""
    rb = OnPolicyReplayBuffer(num_steps, normalize_advantage=False, **kwargs)
    for t in range(num_steps):
        rb.insert(step([float(t), float(t)], [0.0, 0.0], [1.0, 1.0], [False, False]))
    return rb


def _observations(batches):
    return [b["observation"].flatten().tolist() for b in batches]


@pytest.mark.parametrize("name, call", [
    ("normalize_advantage", lambda: OnPolicyReplayBuffer(3, normalize_advantage="False")),
    ("recurrent", lambda: OnPolicyReplayBuffer(3, recurrent="False")),
    ("shuffle", lambda: OnPolicyReplayBuffer(3, shuffle="False")),
    ("recurrent", lambda: pytorchrl_on_policy_buffer(3, recurrent="False")),
    ("normalize_advantage", lambda: setattr(OnPolicyReplayBuffer(3), "normalize_advantage", "False")),
    ("normalize_advantage",
     lambda: OnPolicyReplayBuffer(3).update_storage_parameter("normalize_advantage", "False")),
    ("shuffle", lambda: _filled().generate_batches(shuffle="False")),
    ("to_cpu", lambda: _filled().get_all_buffer_data(to_cpu="False")),
])
def test_boolean_flags_refuse_other_values(name, call):
    """The string "False" is truthy: taken as a flag it would turn the feature on."""
    with pytest.raises(TypeError, match=f"{name} must be True or False, got {name}='False'"):
        call()


@pytest.mark.parametrize("cls, name, value, match", [
    (OnPolicyReplayBuffer, "advantage_eps", -1.0, "advantage_eps must be >= 0.0, got advantage_eps=-1.0"),
    (OnPolicyReplayBuffer, "gamma", float("nan"), "gamma must be a number in \\[0, 1\\], got gamma=nan"),
    (OnPolicyReplayBuffer, "gae_lambda", 2.0, "gae_lambda must be a number in \\[0, 1\\], got gae_lambda=2.0"),
    (OnPolicyReplayBuffer, "gamma_intrinsic", 5.0, "gamma_intrinsic must be a number in \\[0, 1\\]"),
    (VTraceReplayBuffer, "c_thresh", 0.0, "c_thresh must be > 0.0, got c_thresh=0.0"),
])
def test_assigned_parameters_are_checked_like_the_constructor(cls, name, value, match):
    rb = cls(3)
    before = getattr(rb, name)
    with pytest.raises(ValueError, match=match):
        setattr(rb, name, value)
    assert getattr(rb, name) == before


def test_assigned_gamma_intrinsic_reaches_the_normalizer():
    rb = OnPolicyReplayBuffer(3)
    rb.gamma_intrinsic = 0.5
    assert rb.intrinsic_normalizer.gamma == 0.5


def test_generate_batches_keeps_the_constructors_shuffle():
    """shuffle=None is the constructor's setting; a call's own shuffle never sticks to it."""
    rb = _filled(shuffle=False, generator=torch.Generator().manual_seed(0))
    in_order = [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0]]
    assert _observations(rb) == in_order
    assert _observations(rb.generate_batches()) == in_order
    assert _observations(rb) == in_order
    shuffled = _observations(rb.generate_batches(shuffle=True))
    assert sorted(shuffled[0]) == in_order[0] and shuffled != in_order
    assert _observations(rb.generate_batches()) == in_order
    assert _observations(rb.generate_batches(num_mini_batch=2)) == [[0.0, 0.0, 1.0], [1.0, 2.0, 2.0]]


@pytest.mark.parametrize("recurrent, split", [(False, {"num_mini_batch": 7}), (True, {"num_mini_batch": 3}),
                                              (False, {"num_epochs": 0})])
def test_a_refused_generate_batches_changes_nothing(recurrent, split):
    """The split and num_epochs are checked at the call, before the sampler is swapped."""
    rb = _filled(num_mini_batch=2, recurrent=recurrent)
    sampler, sizes = rb.sampler, [b.numel() for b in rb]
    with pytest.raises(ValueError, match="num_mini_batch=.* is larger than|num_epochs must be an int >= 1"):
        rb.generate_batches(**split)  # not iterated: refused at the call
    assert rb.sampler is sampler and [b.numel() for b in rb] == sizes


@pytest.mark.parametrize("call, match", [
    (lambda: OnPolicyReplayBuffer(4, num_mini_batch="x", mini_batch_size=2), "num_mini_batch must be an int >= 1"),
    (lambda: _filled().generate_batches(num_mini_batch=0, mini_batch_size=2), "num_mini_batch must be an int >= 1"),
])
def test_num_mini_batch_is_checked_when_mini_batch_size_wins(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("kwargs, match", [
    ({"storage": "vanilla", "gae_lambda": float("nan")}, "gae_lambda must be a number in \\[0, 1\\], got gae_lambda=nan"),
    ({"storage": "vtrace", "gae_lambda": 2.0}, "gae_lambda must be a number in \\[0, 1\\], got gae_lambda=2.0"),
    ({"clip_rho_thres": float("nan")}, "rho_thresh must be > 0.0, got rho_thresh=nan"),
    ({"storage": "vanilla", "clip_c_thres": -1.0}, "c_thresh must be > 0.0, got c_thresh=-1.0"),
    ({"num_mini_batch": 0, "mini_batch_size": 2}, "num_mini_batch must be an int >= 1, got num_mini_batch=0"),
])
def test_pytorchrl_preset_checks_the_arguments_its_storage_does_not_use(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pytorchrl_on_policy_buffer(4, **kwargs)
    assert pytorchrl_on_policy_buffer(4, storage="vanilla", gae_lambda=None).gae_lambda is None


@pytest.mark.parametrize("case", ["vanilla_extint", "gae_extint"])
@pytest.mark.parametrize("preset", [False, True])
def test_vtrace_intrinsic_stream_runs_gae_with_gae_lambda(case, preset):
    """The V-trace storage's intrinsic stream is OnPolicyReplayBuffer's: GAE with ``gae_lambda``
    (``None``: discounted returns), as in pytorchrl's vectors; the preset forwards ``gae_lambda``."""
    data = load_npz("pytorchrl_returns_advantages.npz")
    gamma, lmbda, gamma_int = (float(p) for p in data["params"])
    steps, envs = data["in_rewards"].shape
    kwargs = dict(gamma=gamma, gae_lambda=lmbda if case.startswith("gae") else None, gamma_intrinsic=gamma_int,
                  intrinsic_filter="backward", advantage_eps=1e-5)
    rb = (pytorchrl_on_policy_buffer(steps, storage="vtrace", **kwargs) if preset
          else VTraceReplayBuffer(steps, **kwargs))
    assert rb.gae_lambda == kwargs["gae_lambda"]
    for t in range(steps):
        rb.insert(step(np.arange(envs) + 10 * t, data["in_values"][t], data["in_rewards"][t], data["in_dones"][t + 1],
                       ireward=data["in_irew"][t], ivalue=data["in_ival"][t], log_prob=np.zeros(envs)))
    rb.compute_returns(critic({"state_value": torch.from_numpy(data["in_boot_val"]),
                               "intrinsic_state_value": torch.from_numpy(data["in_boot_ival"])}))
    out = rb.storage.data
    for key, want in (("intrinsic_value_target", data[f"{case}__IRET"][:steps]),
                      ("intrinsic_advantage", data[f"{case}__IADV"])):
        torch.testing.assert_close(out[key][:steps, :, 0], torch.from_numpy(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [OnPolicyReplayBuffer, VTraceReplayBuffer])
@pytest.mark.parametrize("eps", [None, 0.0])
def test_one_step_one_env_rollout_gives_finite_advantages(cls, eps):
    """A single advantage has no spread: normalised it is 0 (its unbiased std alone is NaN),
    also with advantage_eps=0; the intrinsic stream's too."""
    rb = cls(16, gamma=0.5, **({} if eps is None else {"advantage_eps": eps}))
    rb.insert(step([1.0], [0.0], [1.0], [False], ireward=[2.0], ivalue=[0.5], log_prob=[-1.0]))
    rb.compute_returns()
    for key in ("advantage", "intrinsic_advantage"):
        assert rb.storage.data[key][:1].flatten().tolist() == [0.0]
    assert rb.storage.data["value_target"][:1].flatten().tolist() == [1.0]


def test_constant_advantages_with_advantage_eps_zero_are_zero_not_nan():
    rb = OnPolicyReplayBuffer(2, gamma=0.0, advantage_eps=0.0)
    for _ in range(2):
        rb.insert(step([1.0, 2.0], [0.0, 0.0], [1.0, 1.0], [False, False]))
    rb.compute_returns()
    assert rb.storage.data["advantage"][:2].flatten().tolist() == [0.0] * 4
