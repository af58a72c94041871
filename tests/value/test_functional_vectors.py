"""``torchrl_ext.value.functional`` against vectors produced by the original libraries.

Each test feeds our estimators with inputs translated from an original library's
conventions and compares with what that library computed (``tests/data/vectors``, whose
README says what each file holds). The translation is the point of these tests:

* HARL (``OnPolicyCriticBuffer{EP,FP}.compute_returns``): ``masks[t+1] == 0`` means
  "the env finished during step ``t``" and ``bad_masks[t+1] == 0`` "that was a
  truncation". Our ``done[t]`` / ``terminated[t]`` describe step ``t`` itself, so
  HARL's shifted masks map to ``done = terminated = (masks[t+1] == 0)``, and
  ``next_state_value[t] = D(value_preds[t+1])`` with ``value_preds[T] = next_value``.
* pytorchrl: ``DONE`` has ``T + 1`` rows and row ``t + 1`` flags transition ``t``, so
  ``done = terminated = DONE[1:]`` and ``next_state_value = VAL[1:]`` (bootstrap in row T).
* l2r (SpinningUp-style ``PPOBuffer.finish_path``): each finished path segment is one
  trajectory ending in a truncation that bootstraps from ``last_val``.

All comparisons are float32 with ``rtol = atol = 1e-5``.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from torchrl_ext.value.functional import (
    discounted_cumsum,
    generalized_advantage_estimate,
    td_lambda_return_estimate,
)
from torchrl_ext.value.normalizers import ValueNorm

from tests._vectors import load_npz as _npz

TOL = dict(rtol=1e-5, atol=1e-5)


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array))


def _assert_close(ours: torch.Tensor, ref: torch.Tensor, **kw) -> None:
    torch.testing.assert_close(ours, ref.to(ours.dtype), **{**TOL, **kw})


########################################################################
# HARL: OnPolicyCriticBuffer{EP,FP}.compute_returns
# --------------------------------------------------
#
# HARL_CASES holds all 32 combinations stored in harl_critic_returns.npz:
# (buffer kind, bad-mask set, use_proper_time_limits, use_gae, ValueNorm).

HARL_GAMMA = 0.95
HARL_LAMBDA = 0.9

HARL_CASES = list(itertools.product(("ep", "fp"), ("real", "arb"), (0, 1), (0, 1), (0, 1)))


def _harl_id(case) -> str:
    kind, bad, ptl, gae, vn = case
    return f"{kind}-bad{bad}-ptl{ptl}-gae{gae}-vn{vn}"


def _harl_value_norm() -> ValueNorm:
    """ValueNorm(1) holding the HARL normaliser state stored with the vectors."""
    data = _npz("harl_critic_returns.npz")
    vn = ValueNorm(1)
    vn.load_state_dict(
        {
            "running_mean": _t(data["vn_running_mean"]),
            "running_mean_sq": _t(data["vn_running_mean_sq"]),
            "debiasing_term": _t(data["vn_debiasing_term"]),
        }
    )
    return vn


def _harl_layout(kind: str):
    """EP ``(T, N, 1)`` is moved to ``[N, T, 1]`` (default ``time_dim=-2``); FP
    ``(T, N, A, 1)`` stays time-major with ``time_dim=0``. Returns
    ``(to_ours, to_time_major, time_dim)``."""
    if kind == "ep":
        return (lambda x: x.movedim(0, -2)), (lambda x: x.movedim(-2, 0)), -2
    return (lambda x: x), (lambda x: x), 0


def _harl_inputs(kind: str, bad: str, ptl: int, vn: int) -> dict[str, torch.Tensor]:
    """HARL buffer contents in HARL's time-major layout, plus the derived flags.

    ``ended[t]``: ``masks[t+1] == 0`` (the env finished during step ``t``).
    ``trunc[t]``: ``use_proper_time_limits and bad_masks[t+1] == 0``; HARL ignores the
    bad masks without proper time limits.
    """
    data = _npz("harl_critic_returns.npz")
    bad_key = "bad_masks_in" if bad == "real" else "bad_masks_arbitrary_in"
    masks_next = _t(data[f"{kind}_masks_in"])  # row t holds masks[t+1]
    bad_next = _t(data[f"{kind}_{bad_key}"])  # row t holds bad_masks[t+1]
    ended = masks_next == 0
    trunc = (bad_next == 0) if ptl else torch.zeros_like(ended)
    norm = _harl_value_norm()
    denorm = norm.denormalize if vn else (lambda x: x)
    value_preds = _t(data[f"{kind}_value_preds_in"])
    next_value = _t(data[f"{kind}_next_value"])
    return {
        "reward": _t(data[f"{kind}_rewards"]),
        # D(value_preds[0..T]) with value_preds[T] = next_value (GAE writes it there).
        "values": denorm(torch.cat([value_preds, next_value[None]])),
        "raw_next_value": next_value,
        "ended": ended,
        "trunc": trunc,
        "done": ended | trunc,
        "terminated": ended & ~trunc,
    }


def _harl_reference(kind: str, bad: str, ptl: int, gae: int, vn: int) -> torch.Tensor:
    """HARL's ``returns[:T]`` (``returns[T]`` is bookkeeping, not an estimate)."""
    data = _npz("harl_critic_returns.npz")
    return _t(data[f"{kind}_bad{bad}_ptl{ptl}_gae{gae}_vn{vn}_returns"])[:-1]


def _implied_bootstrap(value: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """The next-state value ``v'`` for which ``r + gamma * v' - value == 0``.

    Passing it as ``next_state_value`` at a non-terminated ``done`` step makes that
    step's TD error, hence its advantage, exactly 0 and its return ``value``: HARL's
    crude truncation expressed as a truncation with a synthetic bootstrap.
    """
    return (value - reward) / HARL_GAMMA


def _harl_ours(kind, bad, ptl, gae, vn, *, crude_truncation=True, denormalize_bootstrap=False):
    """Our returns for one HARL configuration, in HARL's time-major layout.

    ``crude_truncation``: at truncated steps, bootstrap from :func:`_implied_bootstrap`
    (reproduces HARL) instead of ``D(value_preds[t+1])`` (plain truncation semantics).
    ``denormalize_bootstrap`` (plain discounted only): bootstrap the rollout from
    ``D(next_value)`` instead of HARL's raw ``next_value`` (quirk Q8).
    """
    x = _harl_inputs(kind, bad, ptl, vn)
    to_ours, to_time_major, time_dim = _harl_layout(kind)
    reward, values = x["reward"], x["values"]
    value, next_value = values[:-1], values[1:].clone()
    if not gae and not denormalize_bootstrap:
        # Plain discounted: returns[T] = next_value is never denormalized (Q8).
        next_value[-1] = x["raw_next_value"]
    if crude_truncation:
        next_value = torch.where(x["trunc"], _implied_bootstrap(value, reward), next_value)
    args = [to_ours(t) for t in (value, next_value, reward, x["done"], x["terminated"])]
    if gae:
        _, target = generalized_advantage_estimate(
            HARL_GAMMA, HARL_LAMBDA, *args, time_dim=time_dim
        )
    else:
        # lmbda=1: G_t = r_t + gamma * (G_{t+1} inside a trajectory, else the
        # bootstrap next_state_value[t] unless terminated); state_value is unused.
        target = td_lambda_return_estimate(HARL_GAMMA, 1.0, *args[1:], time_dim=time_dim)
    return to_time_major(target), x


@pytest.mark.parametrize("case", HARL_CASES, ids=_harl_id)
def test_harl_compute_returns_reproduced(case):
    """HARL ``compute_returns``: every one of the 32 stored combinations, exactly.

    Mapping (``m``/``b`` = masks/bad_masks, ``D`` = ValueNorm denormalize or identity):

    * ``done[t] = (m[t+1] == 0) or trunc[t]``, ``terminated[t] = (m[t+1] == 0) and not
      trunc[t]`` with ``trunc[t] = use_proper_time_limits and b[t+1] == 0``.
    * GAE: ``state_value = D(V[:T])``, ``next_state_value[t] = D(V[t+1])`` with
      ``V[T] = next_value``; ``returns[:T]`` is our ``value_target``.
    * Plain discounted: ``td_lambda_return_estimate(lmbda=1)`` whose only bootstrap is
      the raw ``next_value`` at the last step (HARL quirk Q8: never denormalized, and
      with ``ptl=0`` the normalizer is ignored altogether).
    * ``use_proper_time_limits``: HARL zeroes the advantage at a truncated step
      (``returns[t] = D(V[t])``) and cuts the trace. Our truncation (done, not
      terminated) cuts the trace too and bootstraps from ``next_state_value[t]``; the
      implied bootstrap ``(D(V[t]) - r[t]) / gamma`` makes that step's TD error 0, so the
      crude truncation is representable. It is not a real next-state value: see
      ``test_harl_crude_truncation_vs_bootstrap`` for what a real bootstrap changes.
    * ``badarb`` (``b[t+1] == 0`` while ``m[t+1] == 1``: a truncation flag on a step
      where the episode went on) is the same thing for HARL: the step gets advantage 0
      and the trace is cut there, though ``obs[t+1]`` is the true next observation. So
      it maps to a truncation as well, with the same implied bootstrap.
    """
    ours, _ = _harl_ours(*case)
    _assert_close(ours, _harl_reference(*case))


CRUDE_CASES = [c for c in HARL_CASES if c[2] == 1]


@pytest.mark.parametrize("case", CRUDE_CASES, ids=_harl_id)
def test_harl_crude_truncation_vs_bootstrap(case):
    """HARL ``use_proper_time_limits=1`` versus our truncation with a real bootstrap.

    With the natural mapping, a truncated step bootstraps from
    ``next_state_value[t] = D(V[t+1])`` (done, not terminated): the next slot's value, as
    ``RolloutStorage.fill_next`` sets it. After a real auto-reset that slot holds the reset
    observation, so a user sets the true final observation's value there (the
    ``harl_rollout_buffer`` docstring says so); the vectors give no other. HARL instead sets that
    step's advantage to 0 (the "crude truncation": its ``obs[t+1]`` is already the reset
    observation after a real truncation, so it does not try to bootstrap). Both
    recursions share the same trace coefficients ``c[t] = gamma * lambda * (1 - done[t])``
    (``lambda = 1`` for plain discounted returns), so ours minus HARL is the TD error
    ``delta[t] = r[t] + gamma * next_state_value[t] - D(V[t])`` that HARL drops at each
    truncated step, carried back along the trace:
    ``diff[t] = sum_k prod_{t <= j < k} c[j] * delta[k]`` over truncated ``k``. It is
    therefore nonzero only at truncated steps and at the steps whose trace reaches one,
    and our result equals HARL's everywhere else. That is the documented difference.
    """
    kind, bad, ptl, gae, vn = case
    ref = _harl_reference(*case)
    ours, x = _harl_ours(*case, crude_truncation=False)
    trunc = x["trunc"]
    assert trunc.any(), "the vectors must contain truncated steps for this case"

    # Independent float64 loop over time for the expected difference.
    values = x["values"].double()
    next_value = values[1:].clone()
    if not gae:
        next_value[-1] = x["raw_next_value"].double()
    delta = x["reward"].double() + HARL_GAMMA * next_value - values[:-1]
    lam = HARL_LAMBDA if gae else 1.0
    expected = torch.zeros_like(delta)
    carry = torch.zeros_like(delta[0])
    for t in reversed(range(delta.shape[0])):
        carry = torch.where(trunc[t], delta[t], 0.0) + HARL_GAMMA * lam * (
            ~x["done"][t]
        ).double() * carry
        expected[t] = carry

    _assert_close(ours - ref, expected.float())
    # The dropped TD errors are real: HARL and the bootstrap disagree at every
    # truncated step, and agree wherever no truncated step is reachable.
    assert bool((expected.abs() > 1e-3)[trunc].all())
    unaffected = expected == 0
    assert bool(unaffected.any())
    _assert_close(ours[unaffected], ref[unaffected])


Q8_CASES = [c for c in HARL_CASES if c[3] == 0 and c[4] == 1]


@pytest.mark.parametrize("case", Q8_CASES, ids=_harl_id)
def test_harl_plain_returns_raw_bootstrap_quirk(case):
    """HARL quirk Q8: plain discounted returns with ValueNorm bootstrap from the raw
    (normalized-scale) ``next_value``.

    ``returns[T] = next_value`` is never denormalized, while the rewards (and, with
    ``use_proper_time_limits``, the ``D(V[t])`` written at truncations) are in raw
    scale. Bootstrapping from ``D(next_value)`` instead, as a scale-consistent port
    would, changes every return whose discounted chain reaches the end of the rollout
    by ``gamma ** (T - t) * (D(next_value) - next_value)``, and nothing else. Both are
    representable: passing the raw value reproduces HARL
    (``test_harl_compute_returns_reproduced``); this test pins down the difference.
    """
    ref = _harl_reference(*case)
    ours, x = _harl_ours(*case, denormalize_bootstrap=True)
    gap = (x["values"][-1] - x["raw_next_value"]).double()
    expected = torch.zeros(ref.shape, dtype=torch.float64)
    reach = HARL_GAMMA * (~x["done"][-1]).double() * gap  # last step bootstraps unless done
    for t in reversed(range(ref.shape[0])):
        expected[t] = reach
        if t:
            reach = HARL_GAMMA * (~x["done"][t - 1]).double() * reach
    _assert_close(ours - ref, expected.float())
    assert bool((expected.abs() > 1e-3).any()), "ValueNorm must shift the bootstrap here"


########################################################################
# pytorchrl: VanillaOnPolicyBuffer / GAEBuffer
# --------------------------------------------

PYTORCHRL_CASES = ["vanilla_ext", "gae_ext", "vanilla_extint", "gae_extint"]


def _pytorchrl_normalise(adv: torch.Tensor) -> torch.Tensor:
    """pytorchrl ``compute_advantages`` (spec 1.5): whole ``(T, N)`` block, unbiased
    std, eps ``1e-5``."""
    return (adv - adv.mean()) / (adv.std(correction=1) + 1e-5)


def _pytorchrl_returns(case, reward, value_with_bootstrap, dones_next, gamma, lmbda):
    """Our returns for pytorchrl's ``(T, N)`` layout (time first, ``time_dim=0``)."""
    value = value_with_bootstrap[:-1]
    next_value = value_with_bootstrap[1:]
    if case.startswith("gae"):
        _, ret = generalized_advantage_estimate(
            gamma, lmbda, value, next_value, reward, dones_next, dones_next, time_dim=0
        )
    else:
        ret = td_lambda_return_estimate(
            gamma, 1.0, next_value, reward, dones_next, dones_next, time_dim=0
        )
    return ret


@pytest.mark.parametrize("case", PYTORCHRL_CASES)
def test_pytorchrl_extrinsic_returns_and_advantages(case):
    """pytorchrl ``compute_returns`` (Vanilla 1.4, GAE 1.9) and ``compute_advantages`` (1.5).

    ``DONE[t+1]`` ("transition t ended an episode") masks both the bootstrap and the
    trace, with no truncation/termination split, so ``done = terminated = DONE[1:]``.
    ``VAL`` carries the bootstrap in row T, so ``next_state_value = VAL[1:]``. Vanilla is
    ``td_lambda_return_estimate`` with ``lmbda=1``, GAE is our ``value_target``; both
    equal ``RET[:T]``. ``ADV`` is ``RET[:T] - VAL[:T]`` normalised over the whole block
    with the unbiased std and eps 1e-5.
    """
    data = _npz("pytorchrl_returns_advantages.npz")
    gamma, lmbda, _ = (float(p) for p in data["params"])
    dones_next = _t(data["in_dones"])[1:] != 0
    assert dones_next.any() and not dones_next.all()
    value = _t(data[f"{case}__VAL_with_bootstrap"])
    ret = _pytorchrl_returns(case, _t(data["in_rewards"]), value, dones_next, gamma, lmbda)
    _assert_close(ret, _t(data[f"{case}__RET"])[:-1])
    _assert_close(_pytorchrl_normalise(ret - value[:-1]), _t(data[f"{case}__ADV"]))


@pytest.mark.parametrize("case", ["vanilla_extint", "gae_extint"])
def test_pytorchrl_intrinsic_returns_and_advantages(case):
    """pytorchrl intrinsic stream (spec 1.3 step 6, 1.9): ``IRET``/``IADV``.

    The intrinsic stream is non-episodic: pytorchrl passes ``zeros_like(DONE)``, so
    ``done = terminated = False`` everywhere and only the last step bootstraps from
    ``IVAL[T]``. It uses ``gamma_intrinsic`` with the same lambda, and the already
    normalised intrinsic rewards ``IREW_normalized[:T]`` (row T is never written). IADV
    is normalised like ADV.
    """
    data = _npz("pytorchrl_returns_advantages.npz")
    _, lmbda, gamma_int = (float(p) for p in data["params"])
    ival = _t(data[f"{case}__IVAL_with_bootstrap"])
    irew = _t(data[f"{case}__IREW_normalized"])[:-1]
    never = torch.zeros(irew.shape, dtype=torch.bool)
    iret = _pytorchrl_returns(case, irew, ival, never, gamma_int, lmbda)
    _assert_close(iret, _t(data[f"{case}__IRET"])[:-1])
    _assert_close(_pytorchrl_normalise(iret - ival[:-1]), _t(data[f"{case}__IADV"]))
    # The episode ends of the extrinsic stream must not leak into the intrinsic one.
    episodic = _pytorchrl_returns(
        case, irew, ival, _t(data["in_dones"])[1:] != 0, gamma_int, lmbda
    )
    assert not torch.allclose(episodic, _t(data[f"{case}__IRET"])[:-1], **TOL)


########################################################################
# l2r-lab: discount_cumsum and PPOBuffer.finish_path
# --------------------------------------------------


def test_l2r_discount_cumsum():
    """l2r ``discount_cumsum(x, 0.9)`` (``y_t = sum_k 0.9**k x_{t+k}``, a scipy
    ``lfilter``) is ``discounted_cumsum`` with no ``done``; float64 in, float64 out."""
    data = _npz("l2r_discount_cumsum.npz")
    x = _t(data["x"])[:, None]
    never = torch.zeros(x.shape, dtype=torch.bool)
    y = discounted_cumsum(x, float(data["discount"]), never, time_dim=0)[:, 0]
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, _t(data["y"]), rtol=1e-12, atol=1e-12)


def _l2r_segments(case: str, data) -> tuple[list[int], list[float]]:
    """Path ends and bootstrap values of one ``finish_path`` vector.

    ``buffer``: three ``finish_path`` calls (ends 4, 9, 11; ``last_val`` 0, 0.7, -1.3).
    ``runner_style``: ``ModelFreeRunner`` finishing one 6-step path with the last step's
    own ``ActionSample``, so ``last_val = V(s_5)`` (spec 3.2 quirk).
    """
    if case == "buffer":
        return [int(e) for e in data["path_ends"]], [float(v) for v in data["last_vals"]]
    end = 6
    return [end], [float(data["in_val"][end - 1])]


@pytest.mark.parametrize("case", ["buffer", "runner_style"])
def test_l2r_ppobuffer_finish_path(case):
    """l2r ``PPOBuffer.finish_path`` (SpinningUp GAE-lambda) over consecutive paths.

    Every ``finish_path`` call closes one segment ``[start, end)`` with
    ``r = rew + [last_val]``, ``v = val + [last_val]``; advantages are the GAE of that
    segment and the (intended) returns ``discount_cumsum(r, gamma)[:-1]``. SpinningUp
    always bootstraps from ``last_val`` (0 for a terminal end), so each segment end is a
    truncation: ``done = True``, ``terminated = False``, ``next_state_value = last_val``
    there and ``val[t+1]`` inside. All segments go through one call as one sequence.
    Advantages match ``adv_buf`` before ``sample_batch`` normalises it; returns are
    ``td_lambda_return_estimate(lmbda=1)`` and match ``ret_buf`` (the original's
    ``sample_batch`` then hands out the rewards as ``ret``, a bug we do not copy).
    """
    data = _npz("l2r_ppobuffer_finish_path.npz")
    gamma, lam = float(data["params"][0]), float(data["params"][1])
    ends, last_vals = _l2r_segments(case, data)
    n = ends[-1]
    reward = _t(data["in_rew"])[:n, None]
    value = _t(data["in_val"])[:n, None]
    next_value = torch.cat([value[1:], value[:1]])  # last row overwritten below
    done = torch.zeros(n, 1, dtype=torch.bool)
    for end, last_val in zip(ends, last_vals):
        next_value[end - 1] = last_val
        done[end - 1] = True
    terminated = torch.zeros_like(done)

    adv, _ = generalized_advantage_estimate(
        gamma, lam, value, next_value, reward, done, terminated, time_dim=0
    )
    ret = td_lambda_return_estimate(gamma, 1.0, next_value, reward, done, terminated, time_dim=0)

    ref_adv = _t(data[f"{case}_adv" if case == "runner_style" else "adv_buf_after_finish"])
    ref_ret = _t(data[f"{case}_ret" if case == "runner_style" else "ret_buf_after_finish"])
    _assert_close(adv[:, 0], ref_adv[:n])
    _assert_close(ret[:, 0], ref_ret[:n])
    # Slots after the last finished path were never written by finish_path.
    assert bool((ref_adv[n:] == 0).all()) and bool((ref_ret[n:] == 0).all())


def test_l2r_sample_batch_normalises_and_hands_out_rewards():
    """l2r ``sample_batch`` on top of our ``finish_path`` advantages.

    ``sample_batch`` normalises the *whole* ``adv_buf`` (all ``max_size`` slots,
    unfilled zeros included) in place with the population std and eps 1e-3, on every
    call, so two calls normalise twice. Our advantages, padded with the unfilled slot,
    reproduce both stored buffers. The sampled ``ret`` equals ``rew_buf`` (the original's
    bug) and not the GAE returns, which is why the project returns the latter.
    """
    data = _npz("l2r_ppobuffer_finish_path.npz")
    gamma, lam, eps = (float(p) for p in data["params"][:3])
    ends, last_vals = _l2r_segments("buffer", data)
    size = int(data["params"][3])
    n = ends[-1]
    reward = _t(data["in_rew"])[:n, None]
    value = _t(data["in_val"])[:n, None]
    next_value = torch.cat([value[1:], value[:1]])
    done = torch.zeros(n, 1, dtype=torch.bool)
    for end, last_val in zip(ends, last_vals):
        next_value[end - 1] = last_val
        done[end - 1] = True
    adv, _ = generalized_advantage_estimate(
        gamma, lam, value, next_value, reward, done, torch.zeros_like(done), time_dim=0
    )
    ret = td_lambda_return_estimate(
        gamma, 1.0, next_value, reward, done, torch.zeros_like(done), time_dim=0
    )[:, 0]

    buf = torch.zeros(size)
    buf[:n] = adv[:, 0]
    for call in ("sample1", "sample2"):
        buf = (buf - buf.mean()) / (buf.std(correction=0) + eps)
        _assert_close(buf, _t(data[f"adv_buf_after_{call}"]))

    idxs = _t(data["sample1__idxs_np_seed1234"])
    sampled_ret = _t(data["sample1__ret"])
    _assert_close(sampled_ret, _t(data["in_rew"])[idxs])
    in_range = idxs < n
    assert not torch.allclose(sampled_ret[in_range], ret[idxs[in_range]], **TOL)
