from __future__ import annotations

import doctest
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import torchrl_ext.value.normalizers as normalizers_module
from torchrl_ext.value import _scan
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer, RunningMeanStd, ValueNorm


F32 = dict(rtol=1e-5, atol=1e-6)


def _close(actual, expected, **tol) -> None:
    if isinstance(actual, torch.Tensor):
        actual = actual.detach().cpu().numpy()
    np.testing.assert_allclose(actual, np.asarray(expected), **(tol or F32))


def test_docstring_examples_run() -> None:
    result = doctest.testmod(normalizers_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------- ValueNorm

HARL_CONFIGS = {
    "default": dict(beta=0.99999),
    "beta09": dict(beta=0.9),
    "beta09_perelem": dict(beta=0.9, per_element_update=True),
    "beta09_axes2": dict(beta=0.9, norm_axes=2),
}


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch_in", "numpy_in"])
@pytest.mark.parametrize("cfg", list(HARL_CONFIGS))
def test_valuenorm_matches_harl_vectors(vectors_dir: Path, cfg: str, as_numpy: bool) -> None:
    data = np.load(vectors_dir / "harl_valuenorm.npz")
    vn = ValueNorm(1, **HARL_CONFIGS[cfg])
    mean, var = vn.running_mean_var()
    _close(mean, data[f"{cfg}_init_mean"])
    _close(var, data[f"{cfg}_init_var"])
    probe = data["probe"].reshape(-1, 2, 1) if cfg.endswith("axes2") else data["probe"]
    for step in range(6):
        x = data[f"{cfg}_step{step}_input"]
        vn.update(x if as_numpy else torch.from_numpy(x))
        prefix = f"{cfg}_step{step}_"
        _close(vn.running_mean, data[prefix + "running_mean"])
        _close(vn.running_mean_sq, data[prefix + "running_mean_sq"])
        _close(vn.debiasing_term, data[prefix + "debiasing_term"])
        mean, var = vn.running_mean_var()
        _close(mean, data[prefix + "mean"])
        _close(var, data[prefix + "var"])
        p = probe if as_numpy else torch.from_numpy(probe)
        normalized, denormalized = vn.normalize(p), vn.denormalize(p)
        assert isinstance(denormalized, torch.Tensor) and denormalized.dtype == torch.float32
        assert normalized.shape == denormalized.shape == probe.shape
        assert probe.shape == data[prefix + "normalize_probe"].shape
        _close(normalized, data[prefix + "normalize_probe"])
        _close(denormalized, data[prefix + "denormalize_probe"])


@pytest.mark.parametrize("per_element_update", [False, True])
def test_valuenorm_float64_hand_computed(per_element_update: bool) -> None:
    vn = ValueNorm(2, beta=0.5, per_element_update=per_element_update, dtype=torch.float64)
    batches = [[[1.0, 2.0], [3.0, 6.0]], [[0.0, 0.0], [1.0, -1.0], [2.0, 0.5]]]
    rm, rmsq, d = [0.0, 0.0], [0.0, 0.0], 0.0
    for batch in batches:
        vn.update(torch.tensor(batch, dtype=torch.float64))
        w = 0.5 ** len(batch) if per_element_update else 0.5
        for j in range(2):
            col = [row[j] for row in batch]
            rm[j] = w * rm[j] + (1 - w) * sum(col) / len(col)
            rmsq[j] = w * rmsq[j] + (1 - w) * sum(c * c for c in col) / len(col)
        d = w * d + (1 - w)
    mean = [m / d for m in rm]
    var = [max(s / d - m * m, 1e-2) for s, m in zip(rmsq, mean)]
    got_mean, got_var = vn.running_mean_var()
    assert got_mean.dtype == torch.float64
    _close(got_mean, mean, rtol=1e-12, atol=0)
    _close(got_var, var, rtol=1e-12, atol=0)
    probe = [[1.0, 1.0], [-2.0, 4.0]]
    expected = [[(v - mean[j]) / math.sqrt(var[j]) for j, v in enumerate(row)] for row in probe]
    _close(vn.normalize(torch.tensor(probe, dtype=torch.float64)), expected, rtol=1e-12, atol=1e-15)
    restored = vn.denormalize(torch.tensor(expected, dtype=torch.float64))
    _close(restored, probe, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_valuenorm_normalize_keeps_input_dtype(dtype: torch.dtype) -> None:
    vn = ValueNorm(1)
    vn.update(torch.tensor([[1.0], [4.0], [-2.0]]))
    x = torch.tensor([[0.5], [2.0]], dtype=dtype)
    assert vn.normalize(x).dtype == dtype
    assert vn.denormalize(x).dtype == dtype
    assert vn.normalize(x.numpy()).dtype == dtype
    rtol = 1e-2 if dtype == torch.float16 else 1e-5
    _close(vn.denormalize(vn.normalize(x)).float(), x.float(), rtol=rtol)


def test_valuenorm_broadcasts_over_extra_leading_dims() -> None:
    vn = ValueNorm(1, beta=0.9)
    vn.update(torch.tensor([[1.0], [2.0], [6.0]]))
    x = torch.arange(12.0).reshape(4, 3, 1)
    out = vn.normalize(x)
    assert out.shape == x.shape
    _close(out.reshape(-1, 1), vn.normalize(x.reshape(-1, 1)))


def test_valuenorm_variance_floor_and_fresh_state() -> None:
    vn = ValueNorm(1, beta=0.9)
    _close(vn.normalize(torch.tensor([[0.3]])), [[3.0]])  # mean 0, var floor 0.01
    vn.update(torch.full((4, 1), 7.0))
    mean, var = vn.running_mean_var()
    _close(mean, [7.0])
    _close(var, [1e-2])


def test_valuenorm_beta_one_never_moves() -> None:
    vn = ValueNorm(1, beta=1.0)
    vn.update(torch.tensor([[5.0], [9.0]]))
    assert vn.debiasing_term.item() == 0.0
    mean, var = vn.running_mean_var()
    _close(mean, [0.0])
    _close(var, [1e-2])


def test_valuenorm_state_dict_round_trip() -> None:
    vn = ValueNorm((2, 3), beta=0.9, per_element_update=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        vn.update(torch.randn(5, 2, 3, generator=gen) * 4 + 1)
    state = vn.state_dict()
    assert set(state) == {"running_mean", "running_mean_sq", "debiasing_term"}
    fresh = ValueNorm((2, 3), beta=0.9, per_element_update=True)
    fresh.load_state_dict(state)
    probe = torch.randn(4, 2, 3, generator=gen)
    torch.testing.assert_close(fresh.normalize(probe), vn.normalize(probe), rtol=0, atol=0)
    for a, b in zip(fresh.running_mean_var(), vn.running_mean_var()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_valuenorm_to_dtype_keeps_state_dict() -> None:
    # HARL quirk Q9: after a converting .to(), its state_dict was empty.
    vn = ValueNorm(1, beta=0.9)
    vn.update(torch.tensor([[1.0], [2.0]]))
    expected = vn.running_mean.double().clone()
    vn = vn.to(torch.float64)
    state = vn.state_dict()
    assert set(state) == {"running_mean", "running_mean_sq", "debiasing_term"}
    assert all(v.dtype == torch.float64 for v in state.values())
    torch.testing.assert_close(state["running_mean"], expected)
    vn.update(np.array([[3.0], [4.0]]))
    assert vn.running_mean.dtype == torch.float64


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(beta=0.0), r"beta must be a number in \(0, 1\], got beta=0.0"),
        (dict(beta=1.5), r"beta must be a number in \(0, 1\], got beta=1.5"),
        (dict(beta=-0.1), r"beta must be .*got beta=-0.1"),
        (dict(epsilon=0.0), r"epsilon must be > 0.0, got epsilon=0.0; the default is 1e-5"),
        (dict(epsilon=-1e-5), r"epsilon must be > 0.0, got epsilon=-1e-05"),
        (dict(norm_axes=0), r"norm_axes must be an int >= 1, got norm_axes=0"),
        (dict(norm_axes=1.0), r"norm_axes must be an int >= 1, got norm_axes=1.0"),
        (dict(norm_axes=True), r"norm_axes must be an int >= 1, got norm_axes=True"),
        (dict(input_shape=0), r"`input_shape`.*got 0"),
        (dict(input_shape=(2, -1)), r"`input_shape`"),
    ],
)
def test_valuenorm_constructor_validation(kwargs: dict, match: str) -> None:
    kwargs = {"input_shape": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        ValueNorm(**kwargs)


def test_valuenorm_rejects_non_float_dtype() -> None:
    with pytest.raises(TypeError, match="`dtype` must be a floating dtype"):
        ValueNorm(1, dtype=torch.int64)


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (torch.zeros(4, 2), ValueError, r"shape \(4, 2\).*\(1,\)"),
        (torch.zeros(4), ValueError, r"shape \(4,\).*\(1,\)"),
        (torch.zeros(4, 3, 1), ValueError, r"shape \(4, 3, 1\).*1 leading dim"),
        (torch.zeros(0, 1), ValueError, "empty batch"),
        (torch.ones(4, 1, dtype=torch.bool), TypeError, "torch.bool"),
        (np.ones((4, 1), dtype=np.int64), TypeError, "torch.int64"),
    ],
    ids=["wrong_trailing", "missing_dim", "extra_dim", "empty", "bool", "int_numpy"],
)
def test_valuenorm_failing_update_leaves_state_unchanged(bad, error: type, match: str) -> None:
    vn = ValueNorm(1, beta=0.9)
    vn.update(torch.tensor([[1.0], [3.0]]))
    before = {k: v.clone() for k, v in vn.state_dict().items()}
    with pytest.raises(error, match=match):
        vn.update(bad)
    for key, value in vn.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


@pytest.mark.parametrize("method", ["normalize", "denormalize"])
def test_valuenorm_normalize_validation(method: str) -> None:
    vn = ValueNorm((3,))
    with pytest.raises(ValueError, match=r"shape \(5, 2\).*\(3,\)"):
        getattr(vn, method)(torch.zeros(5, 2))
    with pytest.raises(TypeError, match="floating-point"):
        getattr(vn, method)(torch.zeros(5, 3, dtype=torch.bool))


# --------------------------------------------------------------------------- RunningMeanStd


def _chan_reference(batches: list[np.ndarray], epsilon: float = 1e-4) -> tuple[float, float, float]:
    mean, var, count = 0.0, 1.0, epsilon
    for b in batches:
        b = np.asarray(b, dtype=np.float64)
        n = len(b)
        bm = float(b.mean())
        bv = float(b.var(ddof=1)) if n > 1 else 0.0
        delta, total = bm - mean, count + n
        mean = mean + delta * n / total
        var = (var * count + bv * n + delta**2 * count * n / total) / total
        count = total
    return mean, var, count


def test_running_mean_std_matches_pytorchrl_sequence(vectors_dir: Path) -> None:
    data = np.load(vectors_dir / "pytorchrl_int_reward_norm_sequence.npz")
    rms = RunningMeanStd((1,))
    for it in range(4):
        rms.update(data[f"it{it}__rewems_fed_to_rms"].reshape(-1, 1))
        assert rms.mean.dtype == rms.var.dtype == rms.count.dtype == torch.float64
        _close(rms.mean, data[f"it{it}__rms_mean"], rtol=1e-6, atol=0)
        _close(rms.var, data[f"it{it}__rms_var"], rtol=1e-6, atol=0)
        _close(rms.count, data[f"it{it}__rms_count"], rtol=1e-12, atol=0)


@pytest.mark.parametrize("sizes", [[5], [3, 7, 2], [10, 1, 4], [2, 2, 2, 2]])
def test_running_mean_std_hand_computed(sizes: list[int]) -> None:
    rng = np.random.default_rng(sum(sizes))
    batches = [rng.normal(2.0, 3.0, size=n) for n in sizes]
    rms = RunningMeanStd()
    for b in batches:
        rms.update(torch.from_numpy(b))
    mean, var, count = _chan_reference(batches)
    _close(rms.mean, mean, rtol=1e-12, atol=1e-14)
    _close(rms.var, var, rtol=1e-12, atol=0)
    _close(rms.count, count, rtol=1e-15, atol=0)


def test_running_mean_std_single_sample_batch_has_zero_variance() -> None:
    rms = RunningMeanStd(epsilon=1e-4)
    rms.update(torch.tensor([2.5]))
    assert torch.isfinite(rms.var).all()
    total = 1e-4 + 1
    _close(rms.mean, 2.5 / total, rtol=1e-14, atol=0)
    _close(rms.var, (1.0 * 1e-4 + 0.0 + 2.5**2 * 1e-4 / total) / total, rtol=1e-14, atol=0)
    _close(rms.count, total, rtol=1e-15, atol=0)


def test_running_mean_std_empty_batch_is_noop() -> None:
    rms = RunningMeanStd((2,))
    rms.update(torch.ones(3, 2))
    before = {k: v.clone() for k, v in rms.state_dict().items()}
    rms.update(torch.zeros(0, 2))
    for key, value in rms.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_running_mean_std_update_from_moments_matches_update() -> None:
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a, b = RunningMeanStd((3,)), RunningMeanStd((3,))
    a.update(x)
    b.update_from_moments(x.mean(0), x.var(0), 9)
    for key, value in a.state_dict().items():
        torch.testing.assert_close(value, b.state_dict()[key])


def test_running_mean_std_state_dict_round_trip() -> None:
    rms = RunningMeanStd((2,), epsilon=1e-3)
    rms.update(np.arange(10.0).reshape(5, 2))
    fresh = RunningMeanStd((2,))
    fresh.load_state_dict(rms.state_dict())
    assert set(fresh.state_dict()) == {"mean", "var", "count"}
    for key, value in rms.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)
    _close(fresh.count, 5.001, rtol=1e-15, atol=0)


def test_running_mean_std_validation() -> None:
    rms = RunningMeanStd((3,))
    with pytest.raises(ValueError, match=r"shape \(5, 2\).*\(3,\)"):
        rms.update(torch.zeros(5, 2))
    with pytest.raises(TypeError, match="torch.bool"):
        rms.update(torch.zeros(5, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_count must be >= 0.0, got batch_count=-1.0"):
        rms.update_from_moments(torch.zeros(3), torch.ones(3), -1)
    with pytest.raises(ValueError, match="epsilon must be > 0.0, got epsilon=0.0; the default is 1e-4"):
        RunningMeanStd(epsilon=0.0)
    with pytest.raises(ValueError, match="`shape`"):
        RunningMeanStd((0,))


# ---------------------------------------------------------------- IntrinsicRewardNormalizer


@pytest.mark.parametrize("layout", ["TN", "TN1", "numpy"])
def test_intrinsic_backward_matches_pytorchrl_sequence(vectors_dir: Path, layout: str) -> None:
    data = np.load(vectors_dir / "pytorchrl_int_reward_norm_sequence.npz")
    gamma, gae_lambda, gamma_int, num_steps, num_envs, num_iters = data["params"]
    norm = IntrinsicRewardNormalizer(float(gamma_int), mode="backward")
    fed: list[torch.Tensor] = []
    original_merge = norm.rms._merged_samples  # what the normaliser feeds its statistics

    def spy(x, name):
        fed.append(x.clone())
        return original_merge(x, name)

    norm.rms._merged_samples = spy
    for it in range(int(num_iters)):
        irew = data[f"it{it}__in_irew"]
        assert irew.shape == (num_steps, num_envs)  # time-major rows, env columns
        as_torch = torch.from_numpy(irew)
        x = {"TN": as_torch, "TN1": as_torch[..., None], "numpy": irew}[layout]
        out = norm(x)
        assert out.shape == x.shape and out.dtype == torch.float32
        _close(fed[-1].reshape(-1), data[f"it{it}__rewems_fed_to_rms"])
        _close(norm.rms.mean, data[f"it{it}__rms_mean"], rtol=1e-6, atol=0)
        _close(norm.rms.var, data[f"it{it}__rms_var"], rtol=1e-6, atol=0)
        _close(norm.rms.count, data[f"it{it}__rms_count"], rtol=1e-12, atol=0)
        # pytorchrl keeps a T+1-row buffer whose last row is never written (stays 0).
        expected = data[f"it{it}__IREW_normalized"]
        np.testing.assert_array_equal(expected[-1], 0.0)
        _close(out.reshape(irew.shape), expected[:-1])


@pytest.mark.parametrize("case", ["vanilla_extint", "gae_extint"])
def test_intrinsic_backward_matches_pytorchrl_returns_vectors(vectors_dir: Path, case: str) -> None:
    data = np.load(vectors_dir / "pytorchrl_returns_advantages.npz")
    gamma_int = data["params"][2]  # (gamma, lambda, gamma_int); a numpy float is accepted
    norm = IntrinsicRewardNormalizer(gamma_int)
    out = norm(torch.from_numpy(data["in_irew"]))
    _close(out, data[f"{case}__IREW_normalized"][:-1])
    _close(norm.rms.mean, data[f"{case}__rms_mean"], rtol=1e-6, atol=0)
    _close(norm.rms.var, data[f"{case}__rms_var"], rtol=1e-6, atol=0)
    _close(norm.rms.count, data[f"{case}__rms_count"], rtol=1e-12, atol=0)


def _forward_reference(
    rollouts: list[np.ndarray], gamma: float
) -> tuple[list[np.ndarray], list[float]]:
    num_envs = rollouts[0].shape[1]
    filt = [0.0] * num_envs
    seen: list[np.ndarray] = []
    outputs = []
    for r in rollouts:
        sums = []
        for t in range(r.shape[0]):
            for n in range(num_envs):
                filt[n] = gamma * filt[n] + float(r[t, n])
                sums.append(filt[n])
        seen.append(np.array(sums))
        _, var, _ = _chan_reference(seen)
        outputs.append(r / math.sqrt(var))
    return outputs, filt


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_intrinsic_forward_hand_computed(gamma: float) -> None:
    rng = np.random.default_rng(7)
    rollouts = [rng.uniform(0, 1, size=(t, 3)) for t in (4, 1, 6)]
    expected, final_filter = _forward_reference(rollouts, gamma)
    norm = IntrinsicRewardNormalizer(gamma, mode="forward")
    for r, exp in zip(rollouts, expected):
        out = norm(torch.from_numpy(r))
        assert out.dtype == torch.float64
        _close(out, exp, rtol=1e-12, atol=1e-14)
    _close(norm.forward_filter, final_filter, rtol=1e-12, atol=0)


def test_intrinsic_backward_hand_computed_float64() -> None:
    r = np.array([[1.0, 0.5], [2.0, 0.0], [0.0, 3.0]])
    gamma = 0.5
    sums = np.zeros_like(r)
    acc = np.zeros(2)
    for t in (2, 1, 0):
        acc = gamma * acc + r[t]
        sums[t] = acc
    norm = IntrinsicRewardNormalizer(gamma)
    out = norm(torch.from_numpy(r))
    _, var, _ = _chan_reference([sums.reshape(-1)])
    _close(out, r / math.sqrt(var), rtol=1e-12, atol=0)
    # A second rollout restarts the backward sum from 0: only the statistics carry over.
    out2 = norm(torch.from_numpy(r))
    _, var2, _ = _chan_reference([sums.reshape(-1), sums.reshape(-1)])
    _close(out2, r / math.sqrt(var2), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_intrinsic_state_dict_round_trip(mode: str) -> None:
    gen = torch.Generator().manual_seed(1)
    norm = IntrinsicRewardNormalizer(0.95, mode=mode)
    for _ in range(2):
        norm(torch.rand(5, 4, generator=gen))
    fresh = IntrinsicRewardNormalizer(0.95, mode=mode)
    fresh.load_state_dict(norm.state_dict())
    expected_keys = {"rms.mean", "rms.var", "rms.count"}
    if mode == "forward":
        expected_keys.add("forward_filter")
    assert set(fresh.state_dict()) == expected_keys
    nxt = torch.rand(3, 4, generator=gen)
    torch.testing.assert_close(fresh(nxt), norm(nxt), rtol=0, atol=0)
    for key, value in norm.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)


def test_intrinsic_forward_rejects_changed_num_envs() -> None:
    norm = IntrinsicRewardNormalizer(0.9, mode="forward")
    norm(torch.ones(2, 3))
    with pytest.raises(ValueError, match="4 envs but the forward filter holds 3"):
        norm(torch.ones(2, 4))


@pytest.mark.parametrize("gamma", [-0.1, 1.01, float("nan")])
def test_intrinsic_rejects_bad_gamma(gamma) -> None:
    with pytest.raises(ValueError, match=f"gamma must be a number in \\[0, 1\\], got gamma={gamma}; e.g. gamma=0.99"):
        IntrinsicRewardNormalizer(gamma)


@pytest.mark.parametrize("gamma", [True, "0.9", None])
def test_intrinsic_rejects_a_gamma_that_is_not_a_number(gamma) -> None:
    with pytest.raises(TypeError, match="gamma must be a real number"):
        IntrinsicRewardNormalizer(gamma)


def test_intrinsic_rejects_bad_mode_and_shapes() -> None:
    with pytest.raises(ValueError, match="`mode` must be 'backward' or 'forward', got 'sideways'"):
        IntrinsicRewardNormalizer(0.9, mode="sideways")
    norm = IntrinsicRewardNormalizer(0.9)
    for bad in (torch.ones(5), torch.ones(5, 2, 2)):
        with pytest.raises(ValueError, match=r"\[T, N\] or \[T, N, 1\]"):
            norm(bad)
    with pytest.raises(TypeError, match="torch.int64"):
        norm(torch.ones(5, 2, dtype=torch.int64))


# ---------------------------------------------------------------------------
# NaN / inf never reach the running statistics.

def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in module.state_dict().items()}


def _assert_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    for name, value in module.state_dict().items():
        assert torch.equal(value, state[name]), name


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_update_is_refused_and_leaves_the_statistics(bad):
    # Was: one NaN made ValueNorm / RunningMeanStd NaN for good, and every
    # GAE(value_normalizer=...) result after it.
    value_norm, rms = ValueNorm(1), RunningMeanStd(shape=(1,))
    value_norm.update(torch.randn(8, 1))
    rms.update(torch.randn(8, 1))
    batch = torch.randn(8, 1)
    batch[3, 0] = bad
    for module in (value_norm, rms):
        state = _state(module)
        with pytest.raises(ValueError, match=r"`x` holds 1 NaN or infinite value\(s\) of 8"):
            module.update(batch)
        _assert_state(module, state)
        module.update(batch[torch.isfinite(batch)].reshape(-1, 1))  # the fix the message gives
        assert all(torch.isfinite(v).all() for v in module.state_dict().values())


def test_non_finite_moments_are_refused():
    rms = RunningMeanStd(shape=(2,))
    rms.update(torch.randn(4, 2))
    state = _state(rms)
    with pytest.raises(ValueError, match="`batch_mean` holds 1 NaN or infinite"):
        rms.update_from_moments(torch.tensor([0.0, math.nan]), torch.ones(2), 3)
    with pytest.raises(ValueError, match="`batch_var` holds 1 NaN or infinite"):
        rms.update_from_moments(torch.zeros(2), torch.tensor([math.inf, 1.0]), 3)
    with pytest.raises(ValueError, match="`batch_var` must be >= 0"):
        rms.update_from_moments(torch.zeros(2), torch.tensor([-1.0, 1.0]), 3)
    with pytest.raises(ValueError, match="batch_count must be a finite number, got batch_count=inf"):
        rms.update_from_moments(torch.zeros(2), torch.ones(2), math.inf)
    _assert_state(rms, state)


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_intrinsic_normalizer_refuses_non_finite_rewards_before_moving_its_filter(mode):
    normalizer = IntrinsicRewardNormalizer(gamma=0.99, mode=mode)
    normalizer(torch.rand(5, 3))
    state = _state(normalizer)
    rewards = torch.rand(5, 3)
    rewards[2, 1] = math.nan
    with pytest.raises(ValueError, match="`intrinsic_reward` holds 1 NaN or infinite"):
        normalizer(rewards)
    _assert_state(normalizer, state)


def _harl_reference(batches: list[list[float]], beta: float) -> tuple[float, float]:
    """HARL's debiased EMA (``mean``, floored ``var``) of scalar batches, in Python floats."""
    mean = mean_sq = debias = 0.0
    for b in batches:
        mean = beta * mean + (1 - beta) * sum(b) / len(b)
        mean_sq = beta * mean_sq + (1 - beta) * sum(x * x for x in b) / len(b)
        debias = beta * debias + (1 - beta)
    m = mean / max(debias, 1e-5)
    return m, max(mean_sq / max(debias, 1e-5) - m * m, 1e-2)


@pytest.mark.parametrize("dtype, big", [(torch.float16, 300.0), (torch.float32, 2e19)])
def test_valuenorm_moments_do_not_overflow_the_state_dtype(dtype, big):
    """x * x overflows the state dtype while x does not: the moments are taken in float64."""
    vn = ValueNorm(1, beta=0.9, dtype=dtype)
    batches = [[1.0, 3.0], [big, 1.0], [1.0, 3.0]]
    if dtype == torch.float16:  # the mean square of [300, 310] exceeds float16's 65504: refused
        vn.update(torch.tensor([[1.0], [3.0]]))
        state = _state(vn)
        with pytest.raises(ValueError, match=r"`x` \(largest \|x\| = 310\) has a mean square that "
                                             r"overflows the state dtype torch.float16.*dtype=torch.float32"):
            vn.update(torch.tensor([[big], [310.0]]))
        _assert_state(vn, state)
        return
    for b in batches:
        vn.update(torch.tensor(b).view(-1, 1))
    mean, var = vn.running_mean_var()
    ref_mean, ref_var = _harl_reference(batches, 0.9)
    assert torch.isfinite(var).all()
    _close(mean, [ref_mean], rtol=1e-5, atol=0)
    _close(var, [ref_var], rtol=1e-4, atol=0)


def test_running_mean_std_refuses_a_variance_overflow_and_keeps_its_state():
    rms = RunningMeanStd(shape=(2,))
    rms.update(torch.randn(4, 2, dtype=torch.float64))
    state = _state(rms)
    huge = torch.tensor([[1e200, 1.0], [-1e200, 2.0]], dtype=torch.float64)  # finite, var overflows
    with pytest.raises(ValueError, match=r"`x` makes the running variance overflow float64.*Scale `x` down"):
        rms.update(huge)
    with pytest.raises(ValueError, match=r"`batch_mean` / `batch_var` makes the running variance overflow"):
        rms.update_from_moments(torch.tensor([1e200, 0.0], dtype=torch.float64), torch.ones(2), 3)  # delta**2
    _assert_state(rms, state)
    rms.update(huge / 1e190)  # the fix the message gives
    assert all(torch.isfinite(v).all() for v in rms.state_dict().values())


def test_intrinsic_forward_refused_call_leaves_filter_and_statistics():
    norm = IntrinsicRewardNormalizer(0.99, mode="forward")
    norm(torch.ones(4, 2, dtype=torch.float64))
    state = _state(norm)
    with pytest.raises(ValueError, match=r"`intrinsic_reward` makes the running variance overflow"):
        norm(torch.tensor([[1e300, 1.0], [-1e300, 1.0]], dtype=torch.float64))
    _assert_state(norm, state)
    # Unchanged filter: the next call gives the uninterrupted sequence's result.
    rollouts = [np.ones((4, 2)), np.full((3, 2), 0.5)]
    expected, final_filter = _forward_reference(rollouts, 0.99)
    _close(norm(torch.from_numpy(rollouts[1])), expected[1], rtol=1e-12, atol=1e-14)
    _close(norm.forward_filter, final_filter, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_intrinsic_empty_rollout_returns_empty_and_changes_nothing(mode):
    norm = IntrinsicRewardNormalizer(0.9, mode=mode)
    assert norm(torch.zeros(0, 3)).shape == (0, 3)  # before any call too
    norm(torch.rand(5, 3))
    state = _state(norm)
    assert norm(torch.zeros(0, 3, 1)).shape == (0, 3, 1)
    _assert_state(norm, state)


@pytest.mark.parametrize("mode", ["backward", "forward"])
@pytest.mark.parametrize("first_inside", [True, False])
def test_intrinsic_inside_and_outside_inference_mode(mode, first_inside, monkeypatch):
    monkeypatch.delattr(_scan._WORKSPACES, "cache", raising=False)  # the first call makes them
    rollouts = [np.random.default_rng(s).uniform(0, 1, size=(6, 3)) for s in range(3)]
    plain, switching = IntrinsicRewardNormalizer(0.9, mode=mode), IntrinsicRewardNormalizer(0.9, mode=mode)
    for k, r in enumerate(rollouts):
        with torch.inference_mode(first_inside if k % 2 == 0 else not first_inside):
            out = switching(torch.from_numpy(r))
        expected = plain(torch.from_numpy(r))
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    switching.load_state_dict(plain.state_dict())  # its buffers stay writable
    _assert_state(switching, _state(plain))
    if mode == "forward":
        expected, final_filter = _forward_reference(rollouts, 0.9)
        _close(plain.forward_filter, final_filter, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- settings set later


VN, IRN = (ValueNorm, {"input_shape": 1, "beta": 0.9}), (IntrinsicRewardNormalizer, {"gamma": 0.9})


@pytest.mark.parametrize(
    ("made", "name", "bad", "match"),
    [
        (VN, "beta", 1.5, r"beta must be a number in \(0, 1\], got beta=1.5; typical values"),
        (VN, "beta", math.nan, r"beta must be a number in \(0, 1\], got beta=nan"),
        (VN, "beta", 0.0, r"beta must be a number in \(0, 1\], got beta=0.0"),
        (VN, "epsilon", 0.0, r"epsilon must be > 0.0, got epsilon=0.0; the default is 1e-5"),
        (VN, "epsilon", math.inf, r"epsilon must be a finite number, got epsilon=inf"),
        (VN, "norm_axes", 0, r"norm_axes must be an int >= 1, got norm_axes=0; use norm_axes=1"),
        (VN, "norm_axes", 1.0, r"norm_axes must be an int >= 1, got norm_axes=1.0"),
        (IRN, "gamma", 5.0, r"gamma must be a number in \[0, 1\], got gamma=5.0; e.g. gamma=0.99"),
        (IRN, "gamma", math.nan, r"gamma must be a number in \[0, 1\], got gamma=nan"),
    ],
)
def test_a_setting_set_later_is_checked_like_the_constructor_argument(made, name, bad, match):
    # Was: a plain attribute, so ValueNorm.beta = 1.5 gave a running mean of -225000 for inputs 1 and 3.
    cls, kwargs = made
    with pytest.raises(ValueError, match=match):
        cls(**{**kwargs, name: bad})
    module = cls(**kwargs)
    before = getattr(module, name)
    with pytest.raises(ValueError, match=match):
        setattr(module, name, bad)
    assert getattr(module, name) == before


@pytest.mark.parametrize("bad", ["False", "True", 0, 1, None, torch.tensor(True)])
def test_valuenorm_per_element_update_must_be_a_bool(bad):
    """Was: ``bool(per_element_update)``, so the string "False" turned the weighting on; the
    setter stored anything."""
    match = r"per_element_update must be True or False, got per_element_update="
    with pytest.raises(TypeError, match=match):
        ValueNorm(1, per_element_update=bad)
    vn = ValueNorm(1, beta=0.9)
    with pytest.raises(TypeError, match=match):
        vn.per_element_update = bad
    assert vn.per_element_update is False


def test_valuenorm_per_element_update_set_later_is_used():
    x = torch.tensor([[1.0], [3.0]])
    vn = ValueNorm(1, beta=0.9, per_element_update=np.bool_(False))
    assert vn.per_element_update is False
    vn.per_element_update = True
    vn.update(x)
    # One batch of 2 with weight w = 0.9 ** 2: the debiased mean is the batch mean, and the
    # debiasing term is 1 - w.
    _close(vn.debiasing_term, 1 - 0.9**2)
    _close(vn.running_mean_var()[0], [2.0])
    assert "per_element_update=True" in repr(vn)


def test_settings_set_later_are_used_and_stay_plain_attributes():
    vn = ValueNorm(1, beta=0.9)
    vn.update(torch.tensor([[1.0]]))
    vn.beta, vn.epsilon = 0.5, 1e-3
    vn.update(torch.tensor([[3.0]]))
    # Reference: EMAs of 1 (weight 0.9) then 3 (weight 0.5), debiased by the sum of weights.
    running_mean, debias = (0.1 * 1.0) * 0.5 + 0.5 * 3.0, 0.1 * 0.5 + 0.5
    _close(vn.running_mean_var()[0], [running_mean / debias])
    assert (vn.beta, vn.epsilon) == (0.5, 1e-3)
    assert set(vn.state_dict()) == {"running_mean", "running_mean_sq", "debiasing_term"}
    assert set(dict(vn.named_buffers())) == set(vn.state_dict())
    vn.norm_axes = 2
    vn.update(torch.full((2, 3, 1), 3.0))  # two leading dims now
    with pytest.raises(ValueError, match="2 leading dim"):
        vn.update(torch.ones(4, 1))
    norm = IntrinsicRewardNormalizer(0.9)
    norm.gamma = 0.5
    norm(torch.tensor([[1.0], [2.0]]))
    # Backward sums with gamma 0.5: e = [1 + 0.5 * 2, 2] = [2, 2], so a zero variance plus epsilon.
    _close(norm.rms.mean, [2.0], rtol=1e-3, atol=0)


# --------------------------------------------------------------------------- damaged states


def _used_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(module, IntrinsicRewardNormalizer):
        module(torch.tensor([[1.0, 2.0], [3.0, 0.5]]))
    else:
        module.update(torch.tensor([[1.0], [3.0]]))
    return _state(module)


@pytest.mark.parametrize(
    ("make", "key", "bad", "match"),
    [
        (lambda: ValueNorm(1), "running_mean", math.nan, r"`state_dict\['running_mean'\]` holds 1 NaN or infinite"),
        (lambda: ValueNorm(1), "running_mean_sq", -1.0, r"state_dict\['running_mean_sq'\] must be >= 0.0"),
        (lambda: ValueNorm(1), "debiasing_term", math.inf, r"`state_dict\['debiasing_term'\]` holds 1 NaN"),
        (lambda: RunningMeanStd((1,)), "mean", -math.inf, r"`state_dict\['mean'\]` holds 1 NaN or infinite"),
        (lambda: RunningMeanStd((1,)), "var", -4.0, r"state_dict\['var'\] must be >= 0.0, got values in \[-4.0"),
        (lambda: RunningMeanStd((1,)), "count", -1.0, r"state_dict\['count'\] must be >= 0.0"),
        (lambda: IntrinsicRewardNormalizer(0.9, mode="forward"), "forward_filter", math.nan,
         r"`state_dict\['forward_filter'\]` holds 2 NaN"),
        (lambda: IntrinsicRewardNormalizer(0.9, mode="forward"), "rms.var", -1.0,
         r"state_dict\['rms.var'\] must be >= 0.0"),
        (lambda: torch.nn.ModuleDict({"norm": ValueNorm(1)}), "norm.running_mean", math.nan,
         r"`state_dict\['norm.running_mean'\]` holds"),
    ],
)
def test_a_damaged_state_is_refused_and_nothing_is_loaded(make, key, bad, match):
    # Was: loaded silently; a NaN mean made every normalize() NaN, a negative var a NaN std.
    source, target = make(), make()
    inner = source["norm"] if isinstance(source, torch.nn.ModuleDict) else source
    _used_state(inner)
    state = _state(source)
    state[key] = torch.full_like(state[key], bad)
    before = _state(target)  # a fresh forward filter is still empty: a refused load must not resize it
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(state)
    assert set(target.state_dict()) == set(before)
    _assert_state(target, before)
    with pytest.raises(ValueError, match=match):
        target.load_state_dict({key: state[key]}, strict=False)
    _assert_state(target, before)


def test_a_sound_state_still_loads_and_missing_keys_are_torchs_errors():
    source = IntrinsicRewardNormalizer(0.9, mode="forward")
    expected = _used_state(source)
    target = IntrinsicRewardNormalizer(0.9, mode="forward")
    target.load_state_dict(expected)
    _assert_state(target, expected)
    partial = ValueNorm(1)
    partial.load_state_dict({"running_mean": torch.tensor([2.0])}, strict=False)  # strict=False still loads a part
    assert partial.running_mean.tolist() == [2.0]
    with pytest.raises(RuntimeError, match="Missing key"):
        ValueNorm(1).load_state_dict({"running_mean": torch.tensor([2.0])})
