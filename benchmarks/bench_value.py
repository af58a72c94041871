"""Side-by-side CPU benchmark of torchrl_ext's value estimators against TorchRL and plain loops.

Usage::

    python benchmarks/bench_value.py                 # full run (about 1-2 min on a quiet machine)
    python benchmarks/bench_value.py --quick         # smoke run: 3 short repetitions
    python benchmarks/bench_value.py --threads 2 --json results.json --no-wait

Everything runs in one process. Per case, every implementation is warmed up, then timed in
R repetitions of k calls (k chosen so that one repetition lasts >= --min-rep-seconds),
interleaved round-robin (rep 1 of A, B, C, then rep 2 ...) with the garbage collector off.
Background load (CPU used by other processes, from /proc/stat minus this process's CPU time)
is measured per case; before a case the script waits up to --max-wait seconds while it is above
--bg-threshold cores. Every output is checked against a float64 reverse loop; the script
prints markdown tables and a Targets table, and exits non-zero only if an accuracy check fails.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torchrl.objectives.value.functional as trl

import torchrl_ext.value.functional as ext
from _harness import (selected, BgLoad, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, paired_range, quiet_before_case, run_interleaved, utc_now)

Pair = tuple[torch.Tensor, torch.Tensor]
GAMMA, LMBDA, LOGP_NOISE = 0.99, 0.95, 0.3
# (case, implementation, baseline implementation, minimum speed ratio baseline/implementation)
TARGETS = [
    ("gae_T2048_N64_p0.01", "torchrl_ext", "torchrl vec_gae", 20.0),
    ("gae_T2048_N64_p0.01", "torchrl_ext", "plain torch loop", 3.0),
    ("gae_T32_N64_p0.01", "torchrl_ext", "torchrl vec_gae", 1.0),
    ("vtrace_T128_N256_p0.01", "torchrl_ext", "torchrl vtrace", 5.0),
]


@dataclass
class Impl:
    name: str
    label: str
    fn: Callable[[], Pair]
    to_ntf: Callable[[torch.Tensor], torch.Tensor] = lambda x: x  # output -> [N, T, 1]
    per_rep: list[float] = field(default_factory=list)  # seconds per call, one per repetition
    k: int = 1


@dataclass
class Case:
    key: str
    title: str
    baseline: str
    out_names: tuple[str, str]
    impls: list[Impl]
    reference: Pair


# ---------------------------------------------------------------- inputs and implementations
def make_inputs(n: int, t: int, p_done: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """[N, T, 1] float32 signals; half of the dones are terminations, the rest truncations."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, t, 1)
    done = torch.rand(shape, generator=g) < p_done
    log_mu = -torch.rand(shape, generator=g) * 2
    return {
        "state_value": torch.randn(shape, generator=g),
        "next_state_value": torch.randn(shape, generator=g),
        "reward": torch.randn(shape, generator=g),
        "done": done,
        "terminated": done & (torch.rand(shape, generator=g) < 0.5),
        "log_mu": log_mu,
        "log_pi": log_mu + LOGP_NOISE * torch.randn(shape, generator=g),
    }


def time_major(x: torch.Tensor) -> torch.Tensor:
    """[N, T, 1] -> contiguous [T, N] (layout conversion is not timed)."""
    return x.squeeze(-1).t().contiguous()


def loop_gae(gamma: float, lmbda: float, v: torch.Tensor, nv: torch.Tensor, r: torch.Tensor,
             done: torch.Tensor, term: torch.Tensor) -> Pair:
    """Plain torch reverse loop on time-major [T, N] tensors, one fused addcmul per step."""
    delta = torch.addcmul(r - v, (~term).to(r.dtype), nv, value=gamma)
    coef = (~done).to(r.dtype).mul_(gamma * lmbda)
    adv = torch.empty_like(delta)
    nxt = torch.zeros_like(delta[0])
    for d, c, out in zip(reversed(delta.unbind(0)), reversed(coef.unbind(0)), reversed(adv.unbind(0))):
        nxt = torch.addcmul(d, c, nxt, out=out)
    return adv, adv + v


def loop_vtrace(gamma: float, log_pi: torch.Tensor, log_mu: torch.Tensor, v: torch.Tensor,
                nv: torch.Tensor, r: torch.Tensor, done: torch.Tensor, term: torch.Tensor,
                rho_bar: float = 1.0, c_bar: float = 1.0) -> Pair:
    """Plain torch V-trace on time-major [T, N] tensors (TorchRL's semantics), fused loop step."""
    rho = (log_pi - log_mu).exp()
    crho = rho.clamp(max=rho_bar)
    r_minus_v = r - v
    delta = torch.addcmul(r_minus_v, (~term).to(r.dtype), nv, value=gamma).mul_(crho)
    coef = rho.clamp_(max=c_bar).mul_((~done).to(r.dtype)).mul_(gamma)
    acc = torch.empty_like(delta)
    nxt = torch.zeros_like(delta[0])
    for d, c, out in zip(reversed(delta.unbind(0)), reversed(coef.unbind(0)), reversed(acc.unbind(0))):
        nxt = torch.addcmul(d, c, nxt, out=out)
    vs = acc.add_(v)
    vs_next = torch.where(done, nv, torch.cat([vs[1:], nv[-1:]]))
    adv = torch.addcmul(r_minus_v, (~term).to(r.dtype), vs_next, value=gamma).mul_(crho)
    return adv, vs


def reference_gae(x: dict[str, torch.Tensor]) -> Pair:
    """float64 reverse loop over T on [N, T, 1] inputs."""
    v, nv, r = (x[k].double() for k in ("state_value", "next_state_value", "reward"))
    done, term = x["done"], x["terminated"]
    adv, last = torch.zeros_like(v), torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + GAMMA * (~term[:, t]) * nv[:, t] - v[:, t]
        last = delta + GAMMA * LMBDA * (~done[:, t]) * last
        adv[:, t] = last
    return adv, adv + v


def reference_vtrace(x: dict[str, torch.Tensor], rho_bar: float = 1.0, c_bar: float = 1.0) -> Pair:
    """float64 V-trace loop (IMPALA; at a done step the advantage bootstraps from V(s'_t))."""
    v, nv, r, lp, lm = (x[k].double() for k in
                        ("state_value", "next_state_value", "reward", "log_pi", "log_mu"))
    done, term = x["done"], x["terminated"]
    rho = (lp - lm).exp()
    crho, c = rho.clamp(max=rho_bar), rho.clamp(max=c_bar)
    n_steps = v.shape[1]
    vs, acc = torch.zeros_like(v), torch.zeros_like(v[:, 0])
    for t in reversed(range(n_steps)):
        delta = crho[:, t] * (r[:, t] + GAMMA * (~term[:, t]) * nv[:, t] - v[:, t])
        acc = delta + GAMMA * (~done[:, t]) * c[:, t] * acc
        vs[:, t] = acc + v[:, t]
    adv = torch.zeros_like(v)
    for t in range(n_steps):
        boot = nv[:, t] if t == n_steps - 1 else torch.where(done[:, t], nv[:, t], vs[:, t + 1])
        adv[:, t] = crho[:, t] * (r[:, t] + GAMMA * (~term[:, t]) * boot - v[:, t])
    return adv, vs


def gae_case(n: int, t: int, p_done: float) -> Case:
    x = make_inputs(n, t, p_done)
    args = (x["state_value"], x["next_state_value"], x["reward"], x["done"], x["terminated"])
    tm = tuple(time_major(a) for a in args)
    impls = [
        Impl("torchrl vec_gae", "torchrl vec_generalized_advantage_estimate [N,T,1]",
             lambda: trl.vec_generalized_advantage_estimate(GAMMA, LMBDA, *args)),
        Impl("torchrl gae loop", "torchrl generalized_advantage_estimate (loop over T) [N,T,1]",
             lambda: trl.generalized_advantage_estimate(GAMMA, LMBDA, *args)),
        Impl("plain torch loop", "plain torch reverse loop, fused addcmul per step [T,N]",
             lambda: loop_gae(GAMMA, LMBDA, *tm), to_ntf=lambda x: x.t().unsqueeze(-1)),
        Impl("torchrl_ext", "torchrl_ext generalized_advantage_estimate [N,T,1]",
             lambda: ext.generalized_advantage_estimate(GAMMA, LMBDA, *args)),
    ]
    title = (f"GAE T={t} x N={n} (gamma={GAMMA}, lambda={LMBDA}, P(done)={p_done}"
             f"{', half terminated / half truncated' if p_done else ''})")
    return Case(f"gae_T{t}_N{n}_p{p_done}", title, "torchrl vec_gae",
                ("adv", "value target"), impls, reference_gae(x))


def vtrace_case(n: int, t: int, p_done: float) -> Case:
    x = make_inputs(n, t, p_done)
    args = (x["log_pi"], x["log_mu"], x["state_value"], x["next_state_value"], x["reward"],
            x["done"], x["terminated"])
    tm = tuple(time_major(a) for a in args)
    impls = [
        Impl("torchrl vtrace", "torchrl vtrace_advantage_estimate [N,T,1]",
             lambda: trl.vtrace_advantage_estimate(GAMMA, *args)),
        Impl("plain torch loop", "plain torch V-trace, fused addcmul per step [T,N]",
             lambda: loop_vtrace(GAMMA, *tm), to_ntf=lambda x: x.t().unsqueeze(-1)),
        Impl("torchrl_ext", "torchrl_ext vtrace_advantage_estimate [N,T,1]",
             lambda: ext.vtrace_advantage_estimate(GAMMA, *args)),
    ]
    title = (f"V-trace T={t} x N={n} (gamma={GAMMA}, rho_bar=c_bar=1, log-prob noise std "
             f"{LOGP_NOISE}, P(done)={p_done}, half terminated)")
    return Case(f"vtrace_T{t}_N{n}_p{p_done}", title, "torchrl vtrace", ("adv", "vs"), impls,
                reference_vtrace(x))


def all_cases() -> list[Callable[[], Case]]:
    return [
        lambda: gae_case(64, 2048, 0.01), lambda: gae_case(64, 32, 0.01),
        lambda: vtrace_case(256, 128, 0.01), lambda: gae_case(1024, 128, 0.01),
        lambda: gae_case(1024, 128, 0.0), lambda: gae_case(64, 2048, 0.0),
    ]


# ---------------------------------------------------------------- accuracy
def max_err(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    err = (out.double() - ref).abs().max().item()
    return err, err <= 1e-5 * max(1.0, ref.abs().max().item())


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: 3 reps of >= 0.02 s, wait <= 5 s")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.02, max_wait=5.0)
    torch.set_num_threads(a.threads)
    started, load_start = utc_now(), loadavg()
    print(f"# torchrl_ext value-estimation benchmark\n\n{environment_line(started, load_start, a)}\n")
    results: dict[str, dict] = {}
    accuracy_ok = True
    for make in all_cases():
        case = make()
        if not selected(a, case.key):
            continue
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(case.impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        base = statistics.median(next(i for i in case.impls if i.name == case.baseline).per_rep)
        n1, n2 = case.out_names
        print(f"## {case.title}\n\n{bg_note(bg, waited, pre, a)}"
              + f". Speed = `{case.baseline}` median / this median (>1 = faster).\n")
        print(f"| implementation | median ms | min | max | speed vs {case.baseline} | k | "
              f"max abs err {n1} | max abs err {n2} | within tol |\n|---|---:|---:|---:|---:|---:|---:|---:|:-:|")
        rows = {}
        for impl in case.impls:
            outs = impl.fn()
            (e1, ok1), (e2, ok2) = (max_err(impl.to_ntf(o), r) for o, r in zip(outs, case.reference))
            accuracy_ok &= ok1 and ok2
            med = statistics.median(impl.per_rep)
            rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                               "max_ms": max(impl.per_rep) * 1e3, "k": impl.k, "speed_vs_baseline": base / med,
                               "per_rep_ms": [s * 1e3 for s in impl.per_rep], "err": [e1, e2], "ok": ok1 and ok2}
            r = rows[impl.name]
            print(f"| {impl.label} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | "
                  f"{r['speed_vs_baseline']:.2f}x | {impl.k} | {e1:.2e} | {e2:.2e} | {'yes' if r['ok'] else 'NO'} |")
        print()
        results[case.key] = {"title": case.title, "baseline": case.baseline, "bg_load": bg,
                             "waited_s": waited, "impls": rows}
    targets = []
    print("## Targets\n\nratio = baseline median / torchrl_ext median; paired = range over repetitions of "
          "(baseline rep time / torchrl_ext rep time), same round-robin round.\n")
    print("| case | comparison | measured ratio | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    for key, impl, baseline, target in TARGETS:
        if key not in results:
            continue
        rows = results[key]["impls"]
        ratio = rows[baseline]["median_ms"] / rows[impl]["median_ms"]
        lo, hi = paired_range(rows[baseline]["per_rep_ms"], rows[impl]["per_rep_ms"])
        ok = ratio >= target and rows[impl]["ok"]  # a fast but inaccurate result does not pass
        targets.append({"case": key, "impl": impl, "baseline": baseline, "ratio": ratio,
                        "paired": [lo, hi], "target": target, "pass": ok})
        print(f"| {key} | {impl} vs {baseline} | {ratio:.2f}x | {lo:.2f}-{hi:.2f}x | "
              f">= {target:g}x | {'PASS' if ok else 'FAIL' if rows[impl]['ok'] else 'FAIL (inaccurate)'} | {results[key]['bg_load']:.2f} |")
    load_end = loadavg()
    print(f"\nloadavg at end `{load_end}`. Accuracy: "
          f"{'all within 1e-5 x max(1, max |reference|)' if accuracy_ok else 'FAILED (see tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a)
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "cases": results, "targets": targets,
                       "accuracy_ok": accuracy_ok}, f, indent=1)
    return 0 if accuracy_ok else 1


if __name__ == "__main__":
    sys.exit(main())
