"""One on-policy update with intrinsic rewards: torchrl_ext vs pytorchrl's own GAE storage.

Usage::

    python benchmarks/bench_onpolicy.py                  # full run (about 40 s on a quiet machine)
    python benchmarks/bench_onpolicy.py --quick          # smoke run: same sizes, 3 short repetitions (~15 s)
    python benchmarks/bench_onpolicy.py --json benchmarks/results/bench_onpolicy.json
    python benchmarks/bench_onpolicy.py --profile 25     # also print cProfile's top 25 of torchrl_ext's update

Issue 8's target: "GAE + intrinsic stream + advantage normalisation + one epoch of 32 minibatches
at T=128, N=64, obs 64: >= 3x pytorchrl's own storage". Everything runs in one process on the
same filled rollout of T=128 steps x N=64 envs: ``observation`` f32[64], ``action``,
``reward``, ``intrinsic_reward``, ``value``, ``intrinsic_value``, ``log_prob`` f32[1] and ``done``
(P(done) = 0.01 per step), plus the critic's bootstrap values for the observation after the
last step. Filling is not timed (its wall time is printed once, for information).

One call = one update:

1. extrinsic GAE: gamma = 0.99, lambda = 0.95, trace and bootstrap cut by ``done``;
2. intrinsic stream: the intrinsic rewards divided by the running std of their discounted sum
   (pytorchrl's ``normalize_int_rewards``: backward sum over the rollout, dones ignored, running
   statistics carried across calls), then GAE with gamma_intrinsic = 0.99, the same lambda and
   NO done masking;
3. advantage normalisation;
4. one epoch of 32 shuffled feed-forward minibatches of 256 steps; one element of every field of
   every minibatch is read (``.item()``), so nothing is skipped lazily.

* pytorchrl (peer: ``pip install gym==0.26.2`` then ``pip install --no-deps pytorchrl==3.2.15``,
  see the README): ``pytorchrl.agent.storages.on_policy.gae_buffer.GAEBuffer(128, "cpu", actor,
  algorithm, envs, gae_lambda=0.95)`` filled by 128 ``insert_transition`` calls with the
  intrinsic keys present; one call = ``before_gradients()`` then ``for batch in
  generate_batches(32, 256, num_epochs=1, shuffle=True)``. The actor, algorithm and envs are
  minimal stand-ins: ``actor.get_value`` returns the precomputed bootstrap values,
  ``algorithm`` has ``gamma``/``gamma_intrinsic`` = 0.99 and a ``state_rms`` whose ``update`` is
  a no-op (RND's observation statistics are not part of the measured unit; a no-op only makes
  the peer faster). Its ``after_gradients`` is not called (see the README). ``before_gradients``
  replaces ``data["IntrinsicReward"]`` by the normalised rewards; each call starts by putting
  the raw tensor back (a reference assignment). pytorchrl normalises the two streams'
  advantages separately (eps 1e-5) and adds them in the loss (``rnd_ppo.py``:
  ``adv * ext_adv_coeff + iadv * int_adv_coeff``), so its ``Advantage`` and
  ``IntrinsicAdvantage`` are checked against that, not against the sum.
* torchrl_ext: the shipped component ``replay_buffers.OnPolicyReplayBuffer(128, gamma=0.99,
  gae_lambda=0.95, gamma_intrinsic=0.99, intrinsic_filter="backward", advantage_eps=1e-5)``
  (pytorchrl's per-rollout backward sum and eps), filled by 128 ``insert`` calls of TorchRL step
  TensorDicts; one call = ``rb.compute_returns(critic)`` then ``for batch in
  rb.generate_batches(num_mini_batch=32)``. ``critic`` is the stand-in of pytorchrl's
  ``actor.get_value``: it writes the precomputed bootstrap values into the slot after the last
  step. Like pytorchrl, the component normalises the extrinsic and the intrinsic advantages
  separately (unbiased std + 1e-5). ``compute_returns`` rewrites its derived entries from the
  inserted steps, which it never changes, so every call starts from the same filled rollout; the
  intrinsic normaliser's running statistics carry over from call to call, as the peer's do
  (neither side resets them).

The timing method is the other scripts' (see _harness.py): warm-up, k calls per repetition,
repetitions interleaved round-robin with the GC off, torch at 1 thread, background load measured
and waited out first. Besides the two full updates, the case times each half on its own
(advantages only, epoch only) for both sides; a diagnostic table then times the pieces of
torchrl_ext's update, and a cProfile of it is printed when the target fails (or with --profile).

Checks (exit code 1 if one fails), against a float64 time-major reverse loop written here:
extrinsic and intrinsic advantages before normalisation (value target - value), returns (value
targets), the normalised intrinsic rewards and the normalised advantages of both implementations
(each stream normalised on its own, eps 1e-5, on both sides), within 1e-5 x max(1, max
|reference|); and one epoch of each returns 32 minibatches of 256 steps
covering every step once, with every checked field equal to the rollout (or to the
implementation's own advantages) at the decoded step. None of the pytorchrl bugs documented in
the spec (pytorchrl_velora_l2r.md) reaches these outputs here: the first-rollout row-0 bug is
worked around outside timing and ``after_gradients`` is not called, so pytorchrl's checks must
pass as well. A missed speed target is reported as FAIL, not an error.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import torch
from tensordict import TensorDict

from _harness import (BgLoad, Check, Impl, apply_quick, bg_note, diagnose, environment_line, environment_meta,
                      loadavg, make_parser, profile, proc_status, quiet_before_case, report_checks,
                      run_interleaved, target_row, utc_now, write_results)
from torchrl_ext.replay_buffers import OnPolicyReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import FeedForwardMinibatchSampler
from torchrl_ext.value.functional import generalized_advantage_estimate
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer

# The peer: optional. gym 0.26.2 (imported by pytorchrl's storages package) prints a NumPy-2
# notice on stderr at import; it is swallowed here and the import error, if any, is reported.
PEER_ERROR: str | None = None
try:
    with contextlib.redirect_stderr(io.StringIO()):
        import pytorchrl as prl
        from pytorchrl.agent.storages.on_policy.gae_buffer import GAEBuffer
except Exception as exc:  # ImportError, or anything its package __init__ raises
    prl = GAEBuffer = None  # type: ignore[assignment]
    PEER_ERROR = f"{type(exc).__name__}: {exc}"

T, N, OBS = 128, 64, 64  # rollout length, envs, observation size
NUM_MINI_BATCH = 32
MINI_BATCH_SIZE = T * N // NUM_MINI_BATCH  # 256
GAMMA, LMBDA, GAMMA_INT = 0.99, 0.95, 0.99
P_DONE = 0.01
EPS = 1e-5  # advantage normalisation (pytorchrl's compute_advantages; OnPolicyReplayBuffer's advantage_eps)
RMS_EPSILON = 1e-4  # initial count of both running statistics (pytorchrl's default)
TOL = 1e-5
CASE = "onpolicy"

# Implementation keys (tables, targets, JSON).
EXT, PRL = "torchrl_ext", "pytorchrl GAEBuffer"
EXT_ADV, PRL_ADV = "torchrl_ext advantages only", "pytorchrl before_gradients only"
EXT_EPOCH, PRL_EPOCH = "torchrl_ext epoch only", "pytorchrl generate_batches epoch only"

# (case key, implementation, baseline, minimum ratio baseline time / implementation time; None = information)
TARGETS: list[tuple[str, str, str, float | None]] = [
    (CASE, EXT, PRL, 3.0),
    (CASE, EXT_ADV, PRL_ADV, None),
    (CASE, EXT_EPOCH, PRL_EPOCH, None),
]

# torchrl_ext's stored leaves (everything a minibatch returns, except the sampler's "index").
EXT_KEYS: list[Any] = [
    "observation", "action", "sample_log_prob", "state_value", "intrinsic_state_value",
    "advantage", "value_target", "intrinsic_advantage", "intrinsic_value_target",
    ("next", "observation"), ("next", "reward"), ("next", "intrinsic_reward"), ("next", "done"),
]


# ---------------------------------------------------------------- the rollout
def make_source(seed: int = 0) -> dict[str, torch.Tensor]:
    """Time-major source tensors. ``observation`` is [T + 1, N, 64], row T the observation after the last
    step; its element 0 is the step id ``t * N + n`` (exact in f32). ``value``/``intrinsic_value`` are
    [T + 1, N, 1], row T the critic's bootstrap. ``done[t]`` = the transition at t ended an episode."""
    g = torch.Generator().manual_seed(seed)
    src = {
        "observation": torch.randn(T + 1, N, OBS, generator=g),
        "action": torch.randn(T, N, 1, generator=g),
        "log_prob": torch.randn(T, N, 1, generator=g) - 1.0,
        "reward": torch.randn(T, N, 1, generator=g),
        "intrinsic_reward": torch.rand(T, N, 1, generator=g) * 0.1,  # RND prediction errors are >= 0
        "value": torch.randn(T + 1, N, 1, generator=g),
        "intrinsic_value": torch.randn(T + 1, N, 1, generator=g) * 0.1,
        "done": torch.rand(T, N, 1, generator=g) < P_DONE,
    }
    src["observation"][..., 0] = torch.arange((T + 1) * N, dtype=torch.float32).view(T + 1, N)
    return src


def decode(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """observation[..., 0] -> (t, n)."""
    i = ids.round().long()
    return i // N, i % N


def touch(tensors: Any) -> float:
    """Reads one element of every tensor (the last), so no field can be skipped lazily."""
    return sum(x.reshape(-1)[-1].item() for x in tensors)


# ---------------------------------------------------------------- pytorchrl's GAEBuffer
class _Envs:
    """What VanillaOnPolicyBuffer reads from its vec env: num_envs and env_kwargs (no frame stack)."""

    num_envs = N
    env_kwargs: dict[str, Any] = {}


class _NoStateRms:
    """RND's observation RunningMeanStd, as a no-op: not part of the measured unit."""

    def update(self, x: torch.Tensor) -> None:
        pass


class _Algorithm:
    gamma = GAMMA
    gamma_intrinsic = GAMMA_INT  # its presence makes before_gradients normalise the intrinsic rewards

    def __init__(self) -> None:
        self.state_rms = _NoStateRms()


class _Actor:
    """Feed-forward actor whose critic returns the precomputed bootstrap values of the last observation."""

    is_recurrent = False

    def __init__(self, src: dict[str, torch.Tensor]) -> None:
        self.values = {"value_net1": src["value"][T].clone(), "ivalue_net1": src["intrinsic_value"][T].clone(),
                       "rhs": torch.zeros(N, 1)}

    def get_action(self, obs: torch.Tensor, rhs: torch.Tensor, done: torch.Tensor) -> None:
        return None

    def get_value(self, obs: torch.Tensor, rhs: torch.Tensor, done: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.values


class PytorchrlPeer:
    """A filled GAEBuffer with intrinsic rewards, and its update (before_gradients + one epoch)."""

    def __init__(self, src: dict[str, torch.Tensor]) -> None:
        buf = GAEBuffer(T, "cpu", _Actor(src), _Algorithm(), _Envs(), gae_lambda=LMBDA)
        done = src["done"].float()
        prev_done = torch.cat([torch.zeros(1, N, 1), done[:-1]])
        for t in range(T):
            buf.insert_transition({
                prl.OBS: src["observation"][t], prl.OBS2: src["observation"][t + 1],
                prl.RHS: torch.zeros(N, 1), prl.RHS2: torch.zeros(N, 1),
                prl.DONE: prev_done[t], prl.DONE2: done[t],
                prl.ACT: src["action"][t], prl.REW: src["reward"][t], prl.IREW: src["intrinsic_reward"][t],
                prl.VAL: src["value"][t], prl.IVAL: src["intrinsic_value"][t], prl.LOGP: src["log_prob"][t],
            })
        # pytorchrl never writes row 0 of OBS/DONE on a storage's first rollout (spec 1.1 [bug]); its
        # synchronous pipeline fills it from the previous rollout's last row in after_gradients. Do
        # that here, outside timing, so the minibatches carry the real first observation.
        buf.data[prl.OBS][0].copy_(src["observation"][0])
        assert buf.step == 0 and buf.size == T  # full: before_gradients bootstraps from row T
        self.buf = buf
        self.raw_irew = buf.data[prl.IREW]  # before_gradients rebinds the key to the normalised rewards

    def before_gradients(self) -> None:
        self.buf.data[prl.IREW] = self.raw_irew
        self.buf.before_gradients()

    def epoch(self) -> float:
        total, n = 0.0, 0
        for batch in self.buf.generate_batches(NUM_MINI_BATCH, MINI_BATCH_SIZE, num_epochs=1, shuffle=True):
            total += touch(batch.values())
            n += 1
        return total

    def update(self) -> float:
        self.before_gradients()
        return self.epoch()


# ---------------------------------------------------------------- torchrl_ext
def build_ext(src: dict[str, torch.Tensor]) -> OnPolicyReplayBuffer:
    """OnPolicyReplayBuffer(T) filled with T TorchRL step TensorDicts; slot T holds the last next observation."""
    rb = OnPolicyReplayBuffer(T, gamma=GAMMA, gae_lambda=LMBDA, gamma_intrinsic=GAMMA_INT,
                              intrinsic_filter="backward", advantage_eps=EPS, num_mini_batch=NUM_MINI_BATCH)
    for t in range(T):
        rb.insert(TensorDict({
            "observation": src["observation"][t], "action": src["action"][t],
            "sample_log_prob": src["log_prob"][t], "state_value": src["value"][t],
            "intrinsic_state_value": src["intrinsic_value"][t],
            "next": {"observation": src["observation"][t + 1], "reward": src["reward"][t],
                     "intrinsic_reward": src["intrinsic_reward"][t], "done": src["done"][t]},
        }, [N]))
    assert rb.storage.carry_keys == ["observation"] and rb.used_capacity == T
    return rb


class Critic:
    """The critic on the slot after the last step (pytorchrl's ``actor.get_value`` stand-in): writes the
    precomputed bootstrap values of both streams."""

    def __init__(self, src: dict[str, torch.Tensor]) -> None:
        self.value = src["value"][T].clone()
        self.ivalue = src["intrinsic_value"][T].clone()

    def __call__(self, td: TensorDict) -> TensorDict:
        td.set("state_value", self.value)
        td.set("intrinsic_state_value", self.ivalue)
        return td


def torchrl_ext_epoch(rb: OnPolicyReplayBuffer) -> float:
    total = 0.0
    for batch in rb.generate_batches(num_mini_batch=NUM_MINI_BATCH):
        total += touch(batch.get(key) for key in EXT_KEYS)
    return total


def torchrl_ext_update(rb: OnPolicyReplayBuffer, critic: Critic) -> float:
    """The measured unit with the shipped component: compute_returns, then one epoch."""
    rb.compute_returns(critic)
    return torchrl_ext_epoch(rb)


# ---------------------------------------------------------------- float64 reference
def reference(src: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain time-major reverse loops in float64, with fresh running statistics (pytorchrl's formulas)."""
    f = {k: v.double().squeeze(-1) for k, v in src.items() if k != "observation"}
    cont = 1.0 - f["done"]  # [T, N]

    def gae(reward: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
        adv, a = torch.zeros(T, N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
        for t in range(T - 1, -1, -1):
            delta = reward[t] + gamma * value[t + 1] * mask[t] - value[t]
            a = delta + gamma * LMBDA * mask[t] * a
            adv[t] = a
        return adv

    adv = gae(f["reward"], f["value"], cont, GAMMA)
    # Intrinsic rewards: backward discounted sum (dones ignored), running stats from mean 0, var 1, count 1e-4.
    sums, e = torch.zeros(T, N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    for t in range(T - 1, -1, -1):
        e = GAMMA_INT * e + f["intrinsic_reward"][t]
        sums[t] = e
    x = sums.reshape(-1)
    n, bm, bv = x.numel(), x.mean(), x.var(correction=1)
    count, mean0, var0 = RMS_EPSILON, 0.0, 1.0
    tot = count + n
    delta = bm - mean0
    var = (var0 * count + bv * n + delta**2 * count * n / tot) / tot
    irew = f["intrinsic_reward"] / var.sqrt()
    iadv = gae(irew, f["intrinsic_value"], torch.ones(T, N, dtype=torch.float64), GAMMA_INT)

    def normalise(a: torch.Tensor) -> torch.Tensor:
        return (a - a.mean()) / (a.std(correction=1) + EPS)

    return {"adv": adv, "iadv": iadv, "ret": adv + f["value"][:T], "iret": iadv + f["intrinsic_value"][:T],
            "irew": irew, "norm_adv": normalise(adv), "norm_iadv": normalise(iadv), "rms_var": var}


def close(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    got = got.double().reshape(T, N)
    err = (got - want).abs().max().item()
    tol = TOL * max(1.0, want.abs().max().item())
    return err <= tol, f"{name} {err:.1e}"


def value_checks(impl: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> Check:
    results = [close(name, got, want) for name, got, want in pairs]
    ok = all(r[0] for r in results)
    bad = [r[1].split()[0] for r in results if not r[0]]
    return Check(f"{impl}: values vs float64 reference", ok,
                 "max abs err: " + ", ".join(r[1] for r in results)
                 + (f"; outside tolerance: {bad}" if bad else f"; all within {TOL:g} x max(1, max |ref|)"))


def epoch_check(impl: str, batches: list[dict[str, torch.Tensor]], fields: dict[str, torch.Tensor]) -> Check:
    """``batches``: per minibatch {name: [B, ...]}, "id" = observation[..., 0]; ``fields``: name -> [T, N, ...]."""
    sizes = [b["id"].shape[0] for b in batches]
    ids = torch.cat([b["id"] for b in batches])
    once = bool(torch.equal(ids.round().long().sort().values, torch.arange(T * N)))
    t, n = decode(ids)
    bad = [name for name, full in fields.items()
           if not torch.equal(torch.cat([b[name].reshape(b[name].shape[0], -1) for b in batches]),
                              full[t, n].reshape(t.numel(), -1))]
    ok = once and not bad and sizes == [MINI_BATCH_SIZE] * NUM_MINI_BATCH
    return Check(f"{impl}: one epoch", ok,
                 f"{len(sizes)} minibatches of {sorted(set(sizes))} steps; every step exactly once: {once}; "
                 + (f"fields equal at the decoded (t, n): {sorted(fields)}" if not bad else f"differ: {bad}"))


def check_ext(src: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> list[Check]:
    rb = build_ext(src)
    rb.compute_returns(Critic(src))
    d = rb.storage.data
    raw_irew = d["next", "intrinsic_reward"][:T]
    irew = raw_irew / rb.intrinsic_normalizer.rms.var.to(raw_irew.dtype).sqrt()  # what compute_returns used
    checks = [value_checks(EXT, [
        ("adv (extrinsic, value_target - state_value)", d["value_target"][:T] - d["state_value"][:T], ref["adv"]),
        ("iadv (intrinsic, intrinsic_value_target - intrinsic_state_value)",
         d["intrinsic_value_target"][:T] - d["intrinsic_state_value"][:T], ref["iadv"]),
        ("value_target", d["value_target"][:T], ref["ret"]),
        ("intrinsic_value_target", d["intrinsic_value_target"][:T], ref["iret"]),
        ("normalised intrinsic reward", irew, ref["irew"]),
        ("advantage (own stream, eps 1e-5)", d["advantage"][:T], ref["norm_adv"]),
        ("intrinsic_advantage (own stream, eps 1e-5)", d["intrinsic_advantage"][:T], ref["norm_iadv"]),
    ])]
    batches = [{"id": b["observation"][:, 0], "observation": b["observation"], "action": b["action"],
                "log_prob": b["sample_log_prob"], "value": b["state_value"], "reward": b["next", "reward"],
                "intrinsic_reward": b["next", "intrinsic_reward"], "done": b["next", "done"],
                "next_observation": b["next", "observation"], "advantage": b["advantage"],
                "value_target": b["value_target"], "intrinsic_advantage": b["intrinsic_advantage"],
                "intrinsic_value_target": b["intrinsic_value_target"]}
               for b in rb.generate_batches(num_mini_batch=NUM_MINI_BATCH)]
    fields = {k: src[k][:T] for k in ("observation", "action", "log_prob", "value", "reward", "intrinsic_reward",
                                      "done")}
    fields.update(next_observation=src["observation"][1:], advantage=d["advantage"][:T],
                  value_target=d["value_target"][:T], intrinsic_advantage=d["intrinsic_advantage"][:T],
                  intrinsic_value_target=d["intrinsic_value_target"][:T])
    checks.append(epoch_check(EXT, batches, fields))
    return checks


def check_prl(src: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> list[Check]:
    peer = PytorchrlPeer(src)
    peer.before_gradients()
    d = peer.buf.data
    checks = [value_checks(PRL, [
        ("adv (extrinsic, RET - VAL)", d[prl.RET][:T] - d[prl.VAL][:T], ref["adv"]),
        ("iadv (intrinsic, IRET - IVAL)", d[prl.IRET][:T] - d[prl.IVAL][:T], ref["iadv"]),
        ("ExternalReturn", d[prl.RET][:T], ref["ret"]), ("IntrinsicReturn", d[prl.IRET][:T], ref["iret"]),
        ("normalised IntrinsicReward", d[prl.IREW][:T], ref["irew"]),
        ("Advantage (own stream, eps 1e-5)", d[prl.ADV], ref["norm_adv"]),
        ("IntrinsicAdvantage (own stream, eps 1e-5)", d[prl.IADV], ref["norm_iadv"]),
    ])]
    batches = [{"id": b[prl.OBS][:, 0], "observation": b[prl.OBS], "action": b[prl.ACT], "log_prob": b[prl.LOGP],
                "value": b[prl.VAL], "reward": b[prl.REW], "advantage": b[prl.ADV], "return": b[prl.RET],
                "intrinsic_return": b[prl.IRET], "intrinsic_advantage": b[prl.IADV]}
               for b in peer.buf.generate_batches(NUM_MINI_BATCH, MINI_BATCH_SIZE, num_epochs=1, shuffle=True)]
    fields = {k: src[k][:T] for k in ("observation", "action", "log_prob", "value", "reward")}
    fields.update(advantage=d[prl.ADV], intrinsic_advantage=d[prl.IADV], **{"return": d[prl.RET][:T]},
                  intrinsic_return=d[prl.IRET][:T])
    checks.append(epoch_check(PRL, batches, fields))
    return checks


# ---------------------------------------------------------------- reporting
def report_case(impls: list[Impl], bg: float, waited: float, pre: float, args: argparse.Namespace) -> dict[str, Any]:
    print(f"## One update: T={T} x N={N}, {NUM_MINI_BATCH} minibatches of {MINI_BATCH_SIZE}\n\n"
          f"{bg_note(bg, waited, pre, args)}. The first two rows are the measured unit; the others time its two "
          "halves on their own.\n")
    print("| implementation | median ms/call | min | max | k |\n|---|---:|---:|---:|---:|")
    rows = {}
    for impl in impls:
        med = statistics.median(impl.per_rep)
        rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                           "max_ms": max(impl.per_rep) * 1e3, "k": impl.k,
                           "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
        print(f"| {impl.label} | {med * 1e3:,.2f} | {min(impl.per_rep) * 1e3:,.2f} | "
              f"{max(impl.per_rep) * 1e3:,.2f} | {impl.k} |")
    print()
    return rows


def report_targets(results: dict[str, dict[str, Any]], checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = pytorchrl median time per call / torchrl_ext median time per call (same run); "
          "paired = range over repetitions of (pytorchrl rep time / torchrl_ext rep time), same round-robin "
          "round.\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    out = []
    for key, impl, baseline, target in TARGETS:
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        out.append(target_row(key, f"{impl} vs {baseline}", rows, impl, baseline, target, bg, checks_ok))
    print()
    return out


def ext_pieces(src: dict[str, torch.Tensor], rb: OnPolicyReplayBuffer,
               critic: Critic) -> list[tuple[str, Callable[[], Any]]]:
    """The pieces of torchrl_ext's update, each callable on its own (on the already-filled rollout)."""
    rb.compute_returns(critic)
    data = rb.storage.data
    value, ivalue = data.get("state_value"), data.get("intrinsic_state_value")
    reward, done = data.get(("next", "reward"))[:T], data.get(("next", "done"))[:T]
    raw_irew = data.get(("next", "intrinsic_reward"))[:T]
    norm2 = IntrinsicRewardNormalizer(GAMMA_INT, mode="backward", epsilon=RMS_EPSILON)  # rb's stats stay as they are
    irew = norm2(raw_irew)
    no_done = torch.zeros_like(done)
    adv, _ = generalized_advantage_estimate(GAMMA, LMBDA, value[:T], value[1:], reward, done, time_dim=0)
    small = [torch.zeros(4) for _ in EXT_KEYS]
    # rb.sample() and sampler.sample() on their own get their own sampler: calling rb's mid-epoch would make
    # the next epoch a partial one.
    storage, sampler = rb.storage, FeedForwardMinibatchSampler(NUM_MINI_BATCH)
    rb_single = TensorDictReplayBuffer(storage=storage, sampler=FeedForwardMinibatchSampler(NUM_MINI_BATCH),
                                       batch_size=1)
    index, _ = sampler.sample(storage, 1)
    flat = index[0] * N + index[1]

    def store_advantage(advantage: torch.Tensor) -> None:  # what compute_returns does per derived entry
        advantage = (advantage - advantage.mean()) / (advantage.std(correction=1) + rb.advantage_eps)
        padded = advantage.new_zeros((T + 1, *advantage.shape[1:]))
        padded[:T] = advantage
        storage.set_derived("advantage", padded)
    leaves = [leaf.flatten(0, 1) for leaf in data.values(True, True)]  # [(T + 1) * N, ...] views

    bare_sampler = FeedForwardMinibatchSampler(NUM_MINI_BATCH)

    def bare_epoch() -> float:
        total = 0.0
        for _ in range(NUM_MINI_BATCH):
            batch = storage.get(bare_sampler.sample(storage, 1)[0])
            total += touch(batch.get(key) for key in EXT_KEYS)
        return total

    def flat_epoch() -> float:  # time-major flat rows t * N + n of the [T + 1, N] leaves: the first T * N rows
        total = 0.0
        for rows in torch.tensor_split(torch.randperm(T * N), NUM_MINI_BATCH):
            total += touch(leaf.index_select(0, rows) for leaf in leaves)
        return total

    return [
        ("torchrl_ext update (compute_returns + epoch)", lambda: torchrl_ext_update(rb, critic)),
        ("  rb.compute_returns(critic)", lambda: rb.compute_returns(critic)),
        ("    critic on data[T].clone() (the bootstrap slot)", lambda: critic(data[T].clone())),
        ("    generalized_advantage_estimate, extrinsic [128, 64, 1], time_dim=0",
         lambda: generalized_advantage_estimate(GAMMA, LMBDA, value[:T], value[1:], reward, done, time_dim=0)),
        ("    IntrinsicRewardNormalizer(mode='backward') (a second instance)", lambda: norm2(raw_irew)),
        ("    generalized_advantage_estimate, intrinsic (no dones)",
         lambda: generalized_advantage_estimate(GAMMA_INT, LMBDA, ivalue[:T], ivalue[1:], irew, no_done,
                                                time_dim=0)),
        ("    one stored advantage (normalise, pad to [T + 1, N, 1], set_derived)", lambda: store_advantage(adv)),
        ("  epoch: for batch in rb.generate_batches(num_mini_batch=32), one .item() per leaf",
         lambda: torchrl_ext_epoch(rb)),
        ("    rb.sample() (one minibatch of 256, end to end, TensorDictReplayBuffer on the same storage)",
         rb_single.sample),
        ("      FeedForwardMinibatchSampler.sample (index only)", lambda: sampler.sample(storage, 1)),
        ("      RolloutStorage.get((time, thread)) (fixed index)", lambda: storage.get(index)),
        (f"        the {len(leaves)} leaves as index_select of the flat rows time * N + thread",
         lambda: [leaf.index_select(0, flat) for leaf in leaves]),
        (f"    the {len(EXT_KEYS)} x {NUM_MINI_BATCH} .item() reads of the epoch alone",
         lambda: [touch(small) for _ in range(NUM_MINI_BATCH)]),
        ("  (not used) the epoch without the ReplayBuffer: 32 x (sampler.sample + storage.get), same reads",
         bare_epoch),
        ("  (not used) reference epoch: randperm, 32 x index_select of flat rows per leaf, same reads", flat_epoch),
    ]


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: same sizes, 3 reps of >= 0.05 s, wait <= 5 s", min_rep_default=0.4)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print cProfile's top N functions of torchrl_ext's update (always done when the "
                         "target fails, top 25)")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    gc.freeze()  # objects from the imports: every gc.collect() (untimed) would walk them
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict")}
    for dist in ("pytorchrl", "gym"):
        try:
            extra[dist] = version(dist)
        except PackageNotFoundError:
            pass
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print("# torchrl_ext on-policy update benchmark (GAE + intrinsic stream + normalisation + one epoch)\n\n"
          f"{environment_line(started, load_start, a, extra)}\n")
    notes = [f"Rollout: T={T} x N={N} envs; observation f32[{OBS}], action, log_prob, reward, intrinsic_reward, "
             f"value, intrinsic_value f32[1], done (P = {P_DONE}). gamma = {GAMMA}, lambda = {LMBDA}, "
             f"gamma_intrinsic = {GAMMA_INT}; {NUM_MINI_BATCH} shuffled minibatches of {MINI_BATCH_SIZE} steps."]
    if PEER_ERROR is not None:
        notes.append(f"**pytorchrl is unavailable**, its rows are not measured: `{PEER_ERROR}`. Install it with "
                     "`pip install gym==0.26.2` then `pip install --no-deps pytorchrl==3.2.15` "
                     "(see benchmarks/README.md).")
    if a.quick:
        notes.append("**--quick**: 3 repetitions of >= 0.05 s: a smoke run, not a measurement.")
    for note in notes:
        print(note + "\n")

    src = make_source()
    ref = reference(src)
    torch.manual_seed(0)  # pytorchrl shuffles with the global RNG

    # Checks first, on fresh objects (fresh running statistics, as the reference assumes).
    checks = check_ext(src, ref)
    if PEER_ERROR is None:
        checks += check_prl(src, ref)
    print("## Checks\n")
    report_checks(checks)

    # Filling: not timed, wall time once for information.
    t0 = time.perf_counter()
    rb, critic = build_ext(src), Critic(src)
    fill = {EXT: time.perf_counter() - t0}
    impls = [Impl(EXT, f"torchrl_ext `OnPolicyReplayBuffer({T})`: `compute_returns(critic)` + "
                       f"`generate_batches(num_mini_batch={NUM_MINI_BATCH})`", lambda: torchrl_ext_update(rb, critic))]
    halves = [Impl(EXT_ADV, "torchrl_ext `compute_returns(critic)` only", lambda: rb.compute_returns(critic)),
              Impl(EXT_EPOCH, "torchrl_ext `generate_batches` epoch only", lambda: torchrl_ext_epoch(rb))]
    if PEER_ERROR is None:
        t0 = time.perf_counter()
        peer = PytorchrlPeer(src)
        fill[PRL] = time.perf_counter() - t0
        impls.insert(0, Impl(PRL, f"pytorchrl {version('pytorchrl')} `GAEBuffer`: `before_gradients()` + "
                                  f"`generate_batches({NUM_MINI_BATCH}, {MINI_BATCH_SIZE})`", peer.update))
        halves = [Impl(PRL_ADV, "pytorchrl `before_gradients()` only", peer.before_gradients), halves[0],
                  Impl(PRL_EPOCH, "pytorchrl `generate_batches` epoch only", peer.epoch), halves[1]]
    print("Filling (not timed, one pass): " + ", ".join(f"{name} {s * 1e3:,.0f} ms ({T} inserts)"
                                                         for name, s in fill.items()) + ".\n")
    impls += halves
    waited, pre = quiet_before_case(a)
    meter = BgLoad()
    run_interleaved(impls, a.reps, a.min_rep_seconds)
    bg = meter.cores()
    rows = report_case(impls, bg, waited, pre, a)
    results = {CASE: {"bg_load": bg, "waited_s": waited, "impls": rows, "fill_s": fill}}

    checks_ok = all(c.ok for c in checks)
    targets = report_targets(results, checks_ok)

    diag_reps, diag_rep_s = (3, 0.05) if a.quick else (5, 0.2)
    diagnostics = diagnose("torchrl_ext's update, piece by piece", ext_pieces(src, rb, critic), diag_reps,
                           diag_rep_s, a, unit="ms")
    failed = PRL in rows and rows[PRL]["median_ms"] / rows[EXT]["median_ms"] < TARGETS[0][3]
    if a.profile or failed:
        profile("torchrl_ext update", lambda: torchrl_ext_update(rb, critic), 50, a.profile or 25)

    load_end, wall = loadavg(), time.perf_counter() - wall0
    print(f"Peak RSS (VmHWM) {proc_status('VmHWM') / 2**20:,.0f} MiB. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check table)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(T=T, N=N, obs=OBS, num_mini_batch=NUM_MINI_BATCH, quick=a.quick, wall_s=wall,
                    peer_error=PEER_ERROR, notes=notes)
        write_results(a.json, {"meta": meta, "cases": results, "diagnostics": diagnostics, "targets": targets},
                      checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
