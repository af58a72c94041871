"""torchrl_ext.value.functional against a float64 loop, TorchRL, and properties."""
from __future__ import annotations

import pytest
import torch
import torchrl.objectives.value.functional as trl
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl_ext.value import _scan
from torchrl_ext.value import functional as F

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ---------------------------------------------------------------------------
# Independent float64 references: one plain Python loop over time per estimator
# ---------------------------------------------------------------------------


def _to_time_major(*tensors, time_dim):
    return [t.movedim(time_dim, 0).double() for t in tensors]


def _discount_time_major(discount, like, time_dim):
    if not isinstance(discount, torch.Tensor):
        return discount
    return discount.double().expand(like.shape).movedim(time_dim, 0)


def gae_loop(gamma, lmbda, value, next_value, reward, done, terminated, time_dim=-2):
    gamma = _discount_time_major(gamma, value, time_dim)
    lmbda = _discount_time_major(lmbda, value, time_dim)
    v, nv, r = _to_time_major(value, next_value, reward, time_dim=time_dim)
    d, term = _to_time_major(done, terminated, time_dim=time_dim)
    adv = torch.zeros_like(v)
    running = torch.zeros_like(v[0])
    for t in reversed(range(v.shape[0])):
        g = gamma[t] if isinstance(gamma, torch.Tensor) else gamma
        lm = lmbda[t] if isinstance(lmbda, torch.Tensor) else lmbda
        delta = r[t] + g * (1 - term[t]) * nv[t] - v[t]
        running = delta + g * lm * (1 - d[t]) * running
        adv[t] = running
    return adv.movedim(0, time_dim), (adv + v).movedim(0, time_dim)


def td_lambda_loop(gamma, lmbda, next_value, reward, done, terminated, time_dim=-2):
    gamma = _discount_time_major(gamma, reward, time_dim)
    lmbda = _discount_time_major(lmbda, reward, time_dim)
    nv, r, d, term = _to_time_major(next_value, reward, done, terminated, time_dim=time_dim)
    out = torch.zeros_like(r)
    following = torch.zeros_like(r[0])
    for t in reversed(range(r.shape[0])):
        bootstrap = (1 - term[t]) * nv[t]
        end = torch.ones_like(d[t]) if t == r.shape[0] - 1 else d[t]
        tail = end * bootstrap + (1 - end) * following
        g = gamma[t] if isinstance(gamma, torch.Tensor) else gamma
        lm = lmbda[t] if isinstance(lmbda, torch.Tensor) else lmbda
        following = r[t] + g * ((1 - lm) * bootstrap + lm * tail)
        out[t] = following
    return out.movedim(0, time_dim)


def vtrace_loop(gamma, log_pi, log_mu, value, next_value, reward, done, terminated,
                rho_bar, c_bar, time_dim=-2):
    lp, lm, v, nv, r, d, term = _to_time_major(
        log_pi, log_mu, value, next_value, reward, done, terminated, time_dim=time_dim
    )
    length = v.shape[0]
    rho = (lp - lm).exp()
    vs = torch.zeros_like(v)
    acc = torch.zeros_like(v[0])
    for t in reversed(range(length)):
        delta = rho[t].clamp(max=rho_bar) * (r[t] + gamma * (1 - term[t]) * nv[t] - v[t])
        acc = delta + gamma * (1 - d[t]) * rho[t].clamp(max=c_bar) * acc
        vs[t] = v[t] + acc
    adv = torch.zeros_like(v)
    for t in range(length):
        following = nv[t] if (t == length - 1) else torch.where(d[t].bool(), nv[t], vs[t + 1])
        adv[t] = rho[t].clamp(max=rho_bar) * (r[t] + gamma * (1 - term[t]) * following - v[t])
    return adv.movedim(0, time_dim), vs.movedim(0, time_dim)


def cumsum_loop(x, gamma, done, time_dim=-2):
    xs, d = _to_time_major(x, done, time_dim=time_dim)
    out = torch.zeros_like(xs)
    running = torch.zeros_like(xs[0])
    for t in reversed(range(xs.shape[0])):
        running = xs[t] + gamma * (1 - d[t]) * running
        out[t] = running
    return out.movedim(0, time_dim)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def make_rollout(shape, time_dim=-2, p_done=0.15, dtype=torch.float32, seed=0, device="cpu"):
    """Random rollout with terminations and truncations (done & ~terminated)."""
    gen = torch.Generator().manual_seed(seed)
    data = {k: torch.randn(shape, generator=gen, dtype=dtype) for k in
            ("value", "next_value", "reward", "log_pi", "log_mu")}
    data["log_pi"] *= 0.5
    data["log_mu"] *= 0.5
    done = torch.rand(shape, generator=gen) < p_done
    terminated = done & (torch.rand(shape, generator=gen) < 0.5)
    data.update(done=done, terminated=terminated)
    return {k: v.to(device) for k, v in data.items()}


def tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    scale = max(1.0, reference.abs().max().item())
    return (1e-5 if dtype == torch.float32 else 1e-10) * scale


def assert_close_to_reference(ours, reference):
    tol = tolerance(reference, ours.dtype)
    err = (ours.double().cpu() - reference.cpu()).abs().max().item()
    assert err <= tol, f"max abs error {err:.3e} > tolerance {tol:.3e}"


SHAPES = [
    ((64, 1), -2),          # a single trajectory [T, 1]
    ((4, 200, 1), -2),      # [N, T, 1]
    ((3, 2, 50, 1), -2),    # per-agent [N, A, T, 1]
    ((60, 5, 1), 0),        # time-major [T, N, 1]
    ((5, 40, 3), 1),        # several features
]


# ---------------------------------------------------------------------------
# Against the float64 loop
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,time_dim", SHAPES)
@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (1.0, 1.0), (1.0, 0.0), (0.9, 1.0), (0.0, 0.5)])
def test_gae_matches_float64_loop(device, dtype, shape, time_dim, gamma, lmbda):
    d = make_rollout(shape, time_dim, dtype=dtype, device=device)
    args = (d["value"], d["next_value"], d["reward"], d["done"], d["terminated"])
    adv, target = F.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=time_dim)
    ref_adv, ref_target = gae_loop(gamma, lmbda, *args, time_dim=time_dim)
    assert adv.dtype == dtype and adv.shape == d["value"].shape
    assert_close_to_reference(adv, ref_adv)
    assert_close_to_reference(target, ref_target)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,time_dim", SHAPES)
@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (1.0, 1.0), (0.97, 0.0)])
def test_td_lambda_matches_float64_loop(device, shape, time_dim, gamma, lmbda):
    d = make_rollout(shape, time_dim, device=device)
    args = (d["next_value"], d["reward"], d["done"], d["terminated"])
    ours = F.td_lambda_return_estimate(gamma, lmbda, *args, time_dim=time_dim)
    assert_close_to_reference(ours, td_lambda_loop(gamma, lmbda, *args, time_dim=time_dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,time_dim", SHAPES)
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.8, 1.3), (2.0, 0.5)])
@pytest.mark.parametrize("gamma", [0.99, 1.0])
def test_vtrace_matches_float64_loop(device, shape, time_dim, rho_bar, c_bar, gamma):
    d = make_rollout(shape, time_dim, device=device)
    args = (d["log_pi"], d["log_mu"], d["value"], d["next_value"], d["reward"], d["done"],
            d["terminated"])
    adv, vs = F.vtrace_advantage_estimate(gamma, *args, rho_bar, c_bar, time_dim=time_dim)
    ref_adv, ref_vs = vtrace_loop(gamma, *args, rho_bar, c_bar, time_dim=time_dim)
    assert_close_to_reference(adv, ref_adv)
    assert_close_to_reference(vs, ref_vs)


@pytest.mark.parametrize("shape,time_dim", SHAPES)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_discounted_cumsum_matches_float64_loop(shape, time_dim, gamma):
    d = make_rollout(shape, time_dim)
    ours = F.discounted_cumsum(d["reward"], gamma, d["done"], time_dim=time_dim)
    assert_close_to_reference(ours, cumsum_loop(d["reward"], gamma, d["done"], time_dim=time_dim))


def test_long_horizon_float32_accuracy():
    """T=2048 with gamma=lambda=1 accumulates the most rounding: still within 1e-5 x scale."""
    d = make_rollout((8, 2048, 1), p_done=0.0)
    args = (d["value"], d["next_value"], d["reward"], d["done"], d["terminated"])
    adv, _ = F.generalized_advantage_estimate(1.0, 1.0, *args)
    assert_close_to_reference(adv, gae_loop(1.0, 1.0, *args)[0])


def test_tensor_discounts_per_step_and_per_env():
    d = make_rollout((4, 30, 1))
    gen = torch.Generator().manual_seed(1)
    gamma = torch.rand(4, 30, 1, generator=gen)          # per step
    lmbda = torch.rand(4, 1, 1, generator=gen)           # per env, broadcast over time
    args = (d["value"], d["next_value"], d["reward"], d["done"], d["terminated"])
    adv, _ = F.generalized_advantage_estimate(gamma, lmbda, *args)
    assert_close_to_reference(adv, gae_loop(gamma.double(), lmbda.double(), *args)[0])
    ret = F.td_lambda_return_estimate(gamma, lmbda, *args[1:])
    assert_close_to_reference(ret, td_lambda_loop(gamma.double(), lmbda.double(), *args[1:]))


def test_hand_computed_truncation_and_termination():
    """gamma=0.9, lambda=1, V=0, V'=10, r=1 (TorchRL's documented semantics)."""
    value, next_value, reward = torch.zeros(4, 1), torch.full((4, 1), 10.0), torch.ones(4, 1)
    end = torch.tensor([[False], [True], [False], [False]])
    truncated = F.generalized_advantage_estimate(
        0.9, 1.0, value, next_value, reward, end, torch.zeros_like(end))[0]
    terminated = F.generalized_advantage_estimate(0.9, 1.0, value, next_value, reward, end, end)[0]
    # truncation at t=1 bootstraps from V'=10 and cuts the trace
    assert truncated.flatten().tolist() == pytest.approx([10 + 0.9 * 10, 10.0, 19.0, 10.0])
    # termination at t=1: no bootstrap there
    assert terminated.flatten().tolist() == pytest.approx([10 + 0.9 * 1, 1.0, 19.0, 10.0])


# ---------------------------------------------------------------------------
# Against TorchRL's own functions: same inputs, same outputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("terminated_given", [True, False])
@pytest.mark.parametrize("shape", [(3, 50, 1), (2, 4, 37, 2)])
def test_same_outputs_as_torchrl(shape, terminated_given):
    d = make_rollout(shape, seed=3)
    term = d["terminated"] if terminated_given else None
    ours = F.generalized_advantage_estimate(0.97, 0.9, d["value"], d["next_value"], d["reward"],
                                            d["done"], term)
    theirs = trl.generalized_advantage_estimate(0.97, 0.9, d["value"], d["next_value"],
                                                d["reward"], d["done"], term)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours = F.td_lambda_return_estimate(0.97, 0.9, d["next_value"], d["reward"], d["done"], term)
    theirs = trl.td_lambda_return_estimate(0.97, 0.9, d["next_value"], d["reward"], d["done"], term)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours = F.vtrace_advantage_estimate(0.97, d["log_pi"], d["log_mu"], d["value"],
                                       d["next_value"], d["reward"], d["done"], term, 0.8, 1.3)
    theirs = trl.vtrace_advantage_estimate(0.97, d["log_pi"], d["log_mu"], d["value"],
                                           d["next_value"], d["reward"], d["done"], term,
                                           rho_thresh=0.8, c_thresh=1.3)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        F.discounted_cumsum(d["reward"], 0.97, d["done"]),
        trl.reward2go(d["reward"], d["done"], 0.97), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(2, 40),
    cut=st.integers(1, 39),
    gamma=st.floats(0.0, 1.0),
    lmbda=st.floats(0.0, 1.0),
    last_terminal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_episode_break_equals_two_halves(length, cut, gamma, lmbda, last_terminal, seed):
    """A done at step cut-1 makes the estimate of the whole equal the two halves'."""
    cut = min(cut, length - 1)
    d = make_rollout((2, length, 1), p_done=0.0, seed=seed, dtype=torch.float64)
    d["done"][:, cut - 1] = True
    d["terminated"][:, cut - 1] = last_terminal
    names = ("value", "next_value", "reward", "done", "terminated")
    whole = F.generalized_advantage_estimate(gamma, lmbda, *(d[k] for k in names))[0]
    first = F.generalized_advantage_estimate(gamma, lmbda, *(d[k][:, :cut] for k in names))[0]
    second = F.generalized_advantage_estimate(gamma, lmbda, *(d[k][:, cut:] for k in names))[0]
    torch.testing.assert_close(whole, torch.cat([first, second], 1))
    returns = [F.td_lambda_return_estimate(gamma, lmbda, *(x[k] for k in names[1:]))
               for x in (d, {k: d[k][:, :cut] for k in names}, {k: d[k][:, cut:] for k in names})]
    torch.testing.assert_close(returns[0], torch.cat(returns[1:], 1))


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 40), gamma=st.floats(0.0, 1.0), p_done=st.floats(0.0, 0.5),
       seed=st.integers(0, 2**16))
def test_vtrace_on_policy_equals_gae_lambda_one(length, gamma, p_done, seed):
    """log_pi == log_mu and thresholds 1: V-trace is GAE(lambda=1) on consistent data."""
    d = make_rollout((3, length, 1), p_done=p_done, seed=seed, dtype=torch.float64)
    # consistent data: inside a trajectory the next value is the following value
    inner = ~d["done"][:, :-1]
    d["next_value"][:, :-1] = torch.where(inner, d["value"][:, 1:], d["next_value"][:, :-1])
    args = (d["value"], d["next_value"], d["reward"], d["done"], d["terminated"])
    adv_gae, target_gae = F.generalized_advantage_estimate(gamma, 1.0, *args)
    adv_vt, vs = F.vtrace_advantage_estimate(gamma, d["log_pi"], d["log_pi"], *args, 1.0, 1.0)
    torch.testing.assert_close(vs, target_gae)
    torch.testing.assert_close(adv_vt, adv_gae)


def test_inputs_are_not_modified():
    d = make_rollout((3, 20, 1))
    before = {k: v.clone() for k, v in d.items()}
    F.generalized_advantage_estimate(0.9, 0.9, d["value"], d["next_value"], d["reward"],
                                     d["done"], d["terminated"])
    F.vtrace_advantage_estimate(0.9, d["log_pi"], d["log_mu"], d["value"], d["next_value"],
                                d["reward"], d["done"], d["terminated"])
    F.td_lambda_return_estimate(0.9, 0.9, d["next_value"], d["reward"], d["done"])
    F.discounted_cumsum(d["reward"], 0.9, d["done"])
    for key, tensor in d.items():
        assert torch.equal(tensor, before[key]), key


def test_half_precision_computes_in_float32():
    d = make_rollout((2, 300, 1))
    args = [d[k] for k in ("value", "next_value", "reward")]
    half = F.generalized_advantage_estimate(0.99, 0.95, *(a.half() for a in args),
                                            d["done"], d["terminated"])[0]
    assert half.dtype == torch.float16
    ref = gae_loop(0.99, 0.95, *(a.half() for a in args), d["done"], d["terminated"])[0]
    assert (half.double() - ref).abs().max() < 0.05


# ---------------------------------------------------------------------------
# Bad input: clear errors naming the argument
# ---------------------------------------------------------------------------


def _gae_args(**overrides):
    d = make_rollout((2, 5, 1))
    args = dict(gamma=0.9, lmbda=0.9, state_value=d["value"], next_state_value=d["next_value"],
                reward=d["reward"], done=d["done"], terminated=d["terminated"])
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(reward=torch.zeros(2, 5, 1, dtype=torch.bool)), TypeError, "reward must be a floating"),
        (dict(state_value=torch.zeros(2, 5, 1, dtype=torch.long)), TypeError, "state_value must be"),
        (dict(done=torch.zeros(2, 5, 1)), TypeError, "done must be a boolean"),
        (dict(terminated=torch.zeros(2, 5, 1, dtype=torch.int64)), TypeError, "terminated must be"),
        (dict(reward=torch.zeros(2, 5)), ValueError, r"must share one shape.*reward=\(2, 5\)"),
        (dict(next_state_value=torch.zeros(2, 6, 1)), ValueError, "next_state_value=\\(2, 6, 1\\)"),
        (dict(gamma=1.5), ValueError, r"gamma must be a number in \[0, 1\], got gamma=1.5"),
        (dict(gamma=-0.1), ValueError, r"gamma must be a number in \[0, 1\]"),
        (dict(gamma=float("nan")), ValueError, r"gamma must be a number in \[0, 1\], got gamma=nan"),
        (dict(lmbda=2.0), ValueError, r"lmbda must be a number in \[0, 1\]"),
        (dict(lmbda=torch.tensor([0.5, 1.2]).view(1, 1, 2)), ValueError, "does not broadcast"),
        (dict(lmbda=torch.full((2, 5, 1), 1.1)), ValueError, r"lmbda must be a number in \[0, 1\], got values in"),
        (dict(gamma="0.9"), TypeError, "gamma must be a real number or a tensor of them, got '0.9'"),
        (dict(reward=[1.0, 2.0]), TypeError, "reward must be a torch.Tensor"),
    ],
)
def test_gae_bad_input(overrides, error, match):
    with pytest.raises(error, match=match):
        F.generalized_advantage_estimate(**_gae_args(**overrides))


@pytest.mark.parametrize("time_dim", [3, -4])
def test_time_dim_out_of_range(time_dim):
    with pytest.raises(ValueError, match=f"time_dim={time_dim} is out of range"):
        F.generalized_advantage_estimate(**_gae_args(), time_dim=time_dim)


@pytest.mark.parametrize("name,value", [("rho_thresh", 0.0), ("c_thresh", -1.0),
                                        ("rho_thresh", torch.tensor(0.0))])
def test_vtrace_rejects_non_positive_thresholds(name, value):
    d = make_rollout((2, 5, 1))
    kwargs = {name: value}
    with pytest.raises(ValueError, match=f"{name} must be > 0.0, got"):
        F.vtrace_advantage_estimate(0.9, d["log_pi"], d["log_mu"], d["value"], d["next_value"],
                                    d["reward"], d["done"], d["terminated"], **kwargs)


def test_vtrace_rejects_log_prob_shape_mismatch():
    d = make_rollout((2, 5, 1))
    with pytest.raises(ValueError, match=r"log_pi=\(2, 5\)"):
        F.vtrace_advantage_estimate(0.9, d["log_pi"].squeeze(-1), d["log_mu"], d["value"],
                                    d["next_value"], d["reward"], d["done"])


def test_discounted_cumsum_bad_input():
    with pytest.raises(ValueError, match="x and done must share one shape"):
        F.discounted_cumsum(torch.zeros(3, 1), 0.9, torch.zeros(4, 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="done must be a boolean"):
        F.discounted_cumsum(torch.zeros(3, 1), 0.9, torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\]"):
        F.discounted_cumsum(torch.zeros(3, 1), 1.01, torch.zeros(3, 1, dtype=torch.bool))


# ---------------------------------------------------------------------------
# Reused scan workspaces: results never alias them, threads never share them
# ---------------------------------------------------------------------------


def _random_signals(seed, shape=(4, 16, 1)):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(shape, generator=g),
        torch.randn(shape, generator=g),
        torch.randn(shape, generator=g),
        torch.rand(shape, generator=g) < 0.2,
    )


def test_results_survive_later_calls_with_the_same_shape():
    value, next_value, reward, done = _random_signals(0)
    first = F.generalized_advantage_estimate(0.9, 0.8, value, next_value, reward, done)
    kept = [t.clone() for t in first]
    for seed in range(1, 4):  # same shape, so the same workspace is reused
        F.generalized_advantage_estimate(0.9, 0.8, *_random_signals(seed))
        F.vtrace_advantage_estimate(0.9, value, value, *_random_signals(seed))
    assert all(torch.equal(a, b) for a, b in zip(first, kept))


def test_concurrent_threads_get_their_own_workspace():
    import threading

    inputs = [_random_signals(seed, shape=(64, 128, 1)) for seed in range(4)]
    expected = [gae_loop(0.95, 0.9, v, nv, r, d, d) for v, nv, r, d in inputs]
    failures = []

    def worker(k):
        for _ in range(30):
            adv, target = F.generalized_advantage_estimate(0.95, 0.9, *inputs[k])
            if not torch.allclose(adv.double(), expected[k][0], atol=1e-4):
                failures.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def _four_estimates(data, gamma=0.9, lmbda=0.8):
    """The fast-path result of every function on ``data`` (a :func:`make_rollout` dict)."""
    v, nv, r, d, term = (data[k] for k in ("value", "next_value", "reward", "done", "terminated"))
    return {
        "gae": F.generalized_advantage_estimate(gamma, lmbda, v, nv, r, d, term)[0],
        "td_lambda": F.td_lambda_return_estimate(gamma, lmbda, nv, r, d, term),
        "cumsum": F.discounted_cumsum(r, gamma, d),
        "vtrace": F.vtrace_advantage_estimate(gamma, data["log_pi"], data["log_mu"], v, nv, r, d, term)[0],
    }


@pytest.mark.parametrize("length", [1, 2, 9, 16])
@pytest.mark.parametrize("first_inside", [True, False])
def test_calls_inside_and_outside_inference_mode_share_workspaces(length, first_inside, monkeypatch):
    """A workspace made under inference_mode is written (out=) by later calls outside it,
    and the reverse: both must work and give the float64 loop's results."""
    monkeypatch.delattr(_scan._WORKSPACES, "cache", raising=False)  # the first call makes them
    data = make_rollout((3, length, 1), seed=length)
    v, nv, r, d, term = (data[k] for k in ("value", "next_value", "reward", "done", "terminated"))
    reference = {
        "gae": gae_loop(0.9, 0.8, v, nv, r, d, term)[0],
        "td_lambda": td_lambda_loop(0.9, 0.8, nv, r, d, term),
        "cumsum": cumsum_loop(r, 0.9, d),
        "vtrace": vtrace_loop(0.9, data["log_pi"], data["log_mu"], v, nv, r, d, term, 1.0, 1.0)[0],
    }
    for inside in (first_inside, not first_inside, first_inside):
        with torch.inference_mode(inside):
            results = _four_estimates(data)
        for name, result in results.items():
            assert_close_to_reference(result, reference[name])


@pytest.mark.parametrize("shape", [(3, 0, 1), (0, 1), (0, 0, 2)])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_empty_time_dim_gives_empty_results(shape, requires_grad):
    """T = 0: every estimator returns empty results of the input's shape (no IndexError)."""
    x = torch.zeros(shape, requires_grad=requires_grad)
    done = torch.zeros(shape, dtype=torch.bool)
    outputs = [
        *F.generalized_advantage_estimate(0.9, 0.8, x, x, x, done),
        F.td_lambda_return_estimate(0.9, 0.8, x, x, done),
        F.discounted_cumsum(x, 0.9, done),
        *F.vtrace_advantage_estimate(0.9, x, x, x, x, x, done),
    ]
    assert [tuple(out.shape) for out in outputs] == [shape] * 6


@pytest.mark.parametrize("name", ["rho_thresh", "c_thresh"])
@pytest.mark.parametrize("bad_shape", [(7,), (2, 5, 3)])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_vtrace_threshold_tensors_must_broadcast_to_the_data(name, bad_shape, requires_grad):
    x = torch.zeros(2, 5, 1)
    value = x.clone().requires_grad_(requires_grad)
    done = torch.zeros(2, 5, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=rf"{name} of shape \({', '.join(map(str, bad_shape))},?\) "
                                         r"does not broadcast to the data shape \(2, 5, 1\)"):
        F.vtrace_advantage_estimate(0.9, x, x, value, x, x, done, **{name: torch.full(bad_shape, 2.0)})


def test_vtrace_threshold_tensors_that_broadcast_match_the_loop():
    data = make_rollout((2, 6, 1), seed=3)
    v, nv, r, d, term = (data[k] for k in ("value", "next_value", "reward", "done", "terminated"))
    rho = torch.tensor([0.5, 2.0]).view(2, 1, 1)  # per env
    adv, vs = F.vtrace_advantage_estimate(0.9, data["log_pi"], data["log_mu"], v, nv, r, d, term, rho_thresh=rho)
    for k in range(2):
        ref_adv, ref_vs = vtrace_loop(0.9, *(data[n][k] for n in ("log_pi", "log_mu", "value", "next_value",
                                      "reward", "done", "terminated")), float(rho[k]), 1.0)
        assert_close_to_reference(adv[k], ref_adv)
        assert_close_to_reference(vs[k], ref_vs)


# ---------------------------------------------------------------------------
# Memory layouts: the scan copies into flat workspaces, so strides must not matter
# ---------------------------------------------------------------------------

LAYOUTS = {
    "transposed": lambda t: t.transpose(0, 1).contiguous().transpose(0, 1),  # same values, other strides
    "strided": lambda t: torch.stack([t, t], -1)[..., 1],  # every stride doubled
    "expanded": lambda t: t[:, :1].expand_as(t),  # stride 0 along time: one step repeated
    "feature-expanded": lambda t: t[..., :1].expand_as(t),  # stride 0 along the features
}
ESTIMATORS = {
    "gae": lambda d, g: F.generalized_advantage_estimate(g, 0.9, d["value"], d["next_value"], d["reward"],
                                                         d["done"], d["terminated"]),
    "td_lambda": lambda d, g: (F.td_lambda_return_estimate(g, 0.9, d["next_value"], d["reward"], d["done"],
                                                           d["terminated"]),),
    "vtrace": lambda d, g: F.vtrace_advantage_estimate(g, d["log_pi"], d["log_mu"], d["value"], d["next_value"],
                                                       d["reward"], d["done"], d["terminated"]),
    "cumsum": lambda d, g: (F.discounted_cumsum(d["reward"], g, d["done"]),),
}


@pytest.mark.parametrize("tensor_gamma", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_any_memory_layout_gives_the_results_of_its_contiguous_copy(estimator, layout, tensor_gamma):
    data = make_rollout((4, 30, 3), seed=7)
    gamma = torch.full((4, 30, 3), 0.97) if tensor_gamma else 0.97
    laid_out = {key: LAYOUTS[layout](value) for key, value in data.items()}
    if tensor_gamma:
        gamma = LAYOUTS[layout](gamma)
    assert not all(value.is_contiguous() for value in laid_out.values())
    got = ESTIMATORS[estimator](laid_out, gamma)
    want = ESTIMATORS[estimator]({key: value.contiguous() for key, value in laid_out.items()},
                                 gamma.contiguous() if tensor_gamma else gamma)
    for ours, theirs in zip(got, want):
        assert torch.equal(ours, theirs)
    if estimator == "gae":  # and the layout is read right: against the float64 loop
        adv, ret = gae_loop(gamma, 0.9, *(laid_out[k] for k in ("value", "next_value", "reward", "done",
                                                                  "terminated")))
        assert_close_to_reference(got[0], adv)
        assert_close_to_reference(got[1], ret)
