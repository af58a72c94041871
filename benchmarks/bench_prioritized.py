"""Side-by-side CPU benchmark of torchrl_ext's prioritized replay against TorchRL and cpprb.

Usage::

    python benchmarks/bench_prioritized.py                 # full run (about 70 s on a quiet machine)
    python benchmarks/bench_prioritized.py --quick         # smoke run: same cases, 3 short repetitions
    python benchmarks/bench_prioritized.py --only B4096 --json results.json --no-wait

Everything runs in one process. One op = sample(B) + update_priority(B) with fresh random
priorities on a full buffer of 1,000,000 vector transitions (alpha=0.6, beta=0.4), at B=256 and
B=4096, for: cpprb's PrioritizedReplayBuffer, TorchRL's TensorDictReplayBuffer with its
PrioritizedSampler (end to end and sampler only), and torchrl_ext's PrioritizedReplayBuffer
(end to end) and PrioritizedSampler (sampler only). Two sampler-only cases repeat B=256 on skewed
priorities (lognormal), where fewer rejection draws are accepted. A last case times torchrl_ext's sampler at
10,000,000 capacity and reports its tree memory. The timing method is bench_value.py's (see
_harness.py): warm-up, k calls per repetition, repetitions interleaved round-robin with the GC
off, torch at 1 thread, background load measured and waited out before each case.

Prints markdown tables and a Targets table. Exits with 1 only if a correctness check of
torchrl_ext fails (sampled rows equal the stored rows, importance weights finite in (0, 1]);
a missed speed target is reported, not an error. Without cpprb (``pip install -e .[bench]``)
its rows are skipped and its targets reported as not measured.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import statistics
import sys
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorStorage
from torchrl.data import PrioritizedSampler as TorchRLPrioritizedSampler
from torchrl.data.replay_buffers.storages import Storage

from _harness import (selected, BgLoad, Check, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, report_checks, target_row, quiet_before_case, run_interleaved, utc_now)
from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
from torchrl_ext.samplers import PrioritizedSampler

try:
    import cpprb
except ImportError:  # optional peer: the bench extra installs it
    cpprb = None

CAPACITY = 1_000_000
BIG_CAPACITY = 10_000_000
BATCH_SIZES = (256, 4096)
ALPHA, BETA = 0.6, 0.4
POOL = 16  # precomputed priority vectors per batch size, cycled through by every op
OBS_DIM, ACT_DIM = 64, 4
TREE_MEMORY_TARGET = 3.0  # tree bytes / (4 bytes x capacity), torchrl_ext at 10M

# Implementation keys (used in the tables, the targets and the JSON file).
CPPRB, TRL, TRL_S, EXT, EXT_S = ("cpprb", "torchrl", "torchrl sampler only", "torchrl_ext",
                                 "torchrl_ext sampler only")
# (case-key suffix, implementation, baseline, minimum speed ratio baseline time / implementation time)
TARGETS = [
    ("B256", EXT, CPPRB, 1.0),
    ("B4096", EXT, CPPRB, 1.5),
    ("B256", EXT_S, TRL_S, 1.0),
    ("B4096", EXT_S, TRL_S, 1.0),
]
# Sampler-only pairs on skewed priorities, |TD error| ~ lognormal(0, sigma): (key suffix, sigma).
SKEWED = [("skew1_B256", 1.0), ("skew3_B256", 3.0)]
INFO_RATIOS = [("B256", EXT, TRL), ("B4096", EXT, TRL),  # printed without a target
               *[(suffix, EXT_S, TRL_S) for suffix, _ in SKEWED]]


@dataclass
class Impl:
    name: str
    label: str
    returns_data: bool
    fn: Callable[[], Any]
    per_rep: list[float] = field(default_factory=list)  # seconds per op, one per repetition
    k: int = 1


@dataclass
class Case:
    key: str
    title: str
    baseline: str | None  # speed column reference; None: no speed column
    impls: list[Impl]
    checks: Callable[[], list[Check]]  # run after timing, on the same objects


# ---------------------------------------------------------------- buffers (built once)
@dataclass
class Buffers:
    """Every peer filled with the same transitions and the same priorities."""

    data: TensorDict  # the source rows: stored row i == data[i] in every peer
    torchrl: TensorDictReplayBuffer
    torchrl_sampler: TorchRLPrioritizedSampler
    ext: PrioritizedReplayBuffer
    ext_sampler: PrioritizedSampler
    cpprb: Any | None


def make_transitions(n: int, seed: int = 0) -> TensorDict:
    """vec schema: obs f32[64], ("next", "obs") f32[64], action f32[4], reward f32[1], done bool[1]."""
    g = torch.Generator().manual_seed(seed)
    return TensorDict({
        "obs": torch.randn(n, OBS_DIM, generator=g),
        "action": torch.randn(n, ACT_DIM, generator=g),
        "reward": torch.randn(n, 1, generator=g),
        "done": torch.rand(n, 1, generator=g) < 0.01,
        "next": {"obs": torch.randn(n, OBS_DIM, generator=g)},
    }, batch_size=[n])


def build_buffers(capacity: int, seed: int = 0) -> Buffers:
    data = make_transitions(capacity, seed)
    priority = torch.rand(capacity, generator=torch.Generator().manual_seed(seed + 1))
    everything = torch.arange(capacity)

    # torch buffers: one extend of the full data, then every priority at once.
    trl = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                 sampler=TorchRLPrioritizedSampler(capacity, ALPHA, BETA))
    trl.extend(data)
    trl.update_priority(everything, priority)
    ext = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity))
    ext.extend(data)
    ext.update_priority(everything, priority)

    # Sampler-only peers get their own trees; they read only the length of these storages.
    trl_s = TorchRLPrioritizedSampler(capacity, ALPHA, BETA)
    trl_s.update_priority(everything, priority)
    ext_s = PrioritizedSampler(capacity, ALPHA, BETA)
    ext_s.update_priority(everything, priority)

    cb = None
    if cpprb is not None:
        # cpprb keeps its native dtypes: rew and done are float32 [N, 1].
        env = {"obs": {"shape": OBS_DIM}, "next_obs": {"shape": OBS_DIM}, "act": {"shape": ACT_DIM},
               "rew": {}, "done": {}}
        cb = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA)
        cb.add(obs=data["obs"].numpy(), next_obs=data["next", "obs"].numpy(),
               act=data["action"].numpy(), rew=data["reward"].numpy(),
               done=data["done"].numpy().astype(np.float32), priorities=priority.numpy())
        assert cb.get_stored_size() == capacity
    return Buffers(data, trl, trl_s, ext, ext_s, cb)


# ---------------------------------------------------------------- one op per implementation
def priority_pool(batch_size: int, seed: int) -> list[torch.Tensor]:
    """Fresh random priorities for the timed ops, built outside timing."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(batch_size, generator=g) for _ in range(POOL)]


def cpprb_op(rb: Any, batch_size: int, pool: list[torch.Tensor]) -> Callable[[], Any]:
    priorities = itertools.cycle([p.numpy() for p in pool])  # float32, cpprb's own dtype

    def op() -> Any:
        sample = rb.sample(batch_size, beta=BETA)
        rb.update_priorities(sample["indexes"], next(priorities))
        return sample
    return op


def torchrl_op(rb: TensorDictReplayBuffer, batch_size: int, pool: list[torch.Tensor]) -> Callable[[], Any]:
    priorities = itertools.cycle(pool)

    def op() -> Any:
        data, info = rb.sample(batch_size, return_info=True)
        rb.update_priority(info["index"], next(priorities))
        return data
    return op


def ext_op(rb: PrioritizedReplayBuffer, batch_size: int, pool: list[torch.Tensor]) -> Callable[[], Any]:
    priorities = itertools.cycle(pool)

    def op() -> Any:
        batch = rb.sample(batch_size)
        rb.update_priority(batch["index"], next(priorities))
        return batch
    return op


def sampler_op(sampler: TorchRLPrioritizedSampler, storage: Storage, batch_size: int,
               pool: list[torch.Tensor]) -> Callable[[], Any]:
    """Indices and weights only (no data): works for TorchRL's and torchrl_ext's sampler."""
    priorities = itertools.cycle(pool)

    def op() -> Any:
        index, info = sampler.sample(storage, batch_size)
        sampler.update_priority(index, next(priorities))
        return index, info
    return op


# ---------------------------------------------------------------- checks
def check_weights(name: str, weight: torch.Tensor) -> Check:
    bad = int((~(torch.isfinite(weight) & (weight > 0) & (weight <= 1))).sum())
    detail = f"{weight.numel()} weights in [{weight.min().item():.4g}, {weight.max().item():.4g}]"
    return Check(name, bad == 0, detail + (f", {bad} not finite or outside (0, 1]" if bad else ""))


def check_indices(name: str, index: torch.Tensor, capacity: int) -> Check:
    ok = bool(index.numel() and index.min() >= 0 and index.max() < capacity)
    return Check(name, ok, f"indices in [{index.min().item()}, {index.max().item()}], capacity {capacity}")


def ext_checks(bufs: Buffers, batch_size: int) -> list[Check]:
    """torchrl_ext's batch rows equal the source rows at their index; weights in (0, 1]."""
    capacity = len(bufs.data)
    batch = bufs.ext.sample(batch_size)
    index = batch["index"]
    checks = [check_indices(f"{EXT} B={batch_size}: index", index, capacity)]
    if checks[0].ok:
        expected = bufs.data[index]
        bad = [str(key) for key, value in expected.items(include_nested=True, leaves_only=True)
               if not torch.equal(batch[key], value)]
        checks.append(Check(f"{EXT} B={batch_size}: data == stored rows", not bad,
                            "all fields equal" if not bad else f"differs: {', '.join(bad)}"))
    checks.append(check_weights(f"{EXT} B={batch_size}: priority_weight", batch["priority_weight"]))
    index, info = bufs.ext_sampler.sample(bufs.ext.storage, batch_size)
    checks.append(check_indices(f"{EXT_S} B={batch_size}: index", index, capacity))
    checks.append(check_weights(f"{EXT_S} B={batch_size}: priority_weight", info["priority_weight"]))
    return checks


# ---------------------------------------------------------------- cases
def per_case(bufs: Buffers, batch_size: int) -> Case:
    pool = priority_pool(batch_size, seed=batch_size)
    impls = []
    if bufs.cpprb is not None:
        impls.append(Impl(CPPRB, "cpprb PrioritizedReplayBuffer: sample(B, beta) + update_priorities",
                          True, cpprb_op(bufs.cpprb, batch_size, pool)))
    impls += [
        Impl(TRL, "torchrl TensorDictReplayBuffer(LazyTensorStorage, PrioritizedSampler): "
                  "sample(B, return_info=True) + update_priority", True,
             torchrl_op(bufs.torchrl, batch_size, pool)),
        Impl(TRL_S, "torchrl PrioritizedSampler.sample(storage, B) + update_priority (C++ trees)", False,
             sampler_op(bufs.torchrl_sampler, bufs.torchrl.storage, batch_size, pool)),
        Impl(EXT, "torchrl_ext PrioritizedReplayBuffer(LazyTensorStorage): sample(B) + update_priority",
             True, ext_op(bufs.ext, batch_size, pool)),
        Impl(EXT_S, "torchrl_ext PrioritizedSampler.sample(storage, B) + update_priority", False,
             sampler_op(bufs.ext_sampler, bufs.ext.storage, batch_size, pool)),
    ]
    capacity = len(bufs.data)
    title = (f"sample({batch_size}) + update_priority({batch_size}) on a full {capacity:,} buffer "
             f"(alpha={ALPHA}, beta={BETA})")
    return Case(f"per_1M_B{batch_size}", title, TRL, impls, lambda: ext_checks(bufs, batch_size))


def skewed_case(suffix: str, sigma: float, capacity: int, batch_size: int = 256) -> Case:
    """Sampler-only, TorchRL's C++ sampler against torchrl_ext's, on priorities drawn from
    lognormal(0, sigma), the timed updates too. The title gives the share of proposals
    torchrl_ext's rejection draws would accept (sums of 32 leaves against the largest):
    below about 0.12 at B=256 its sampler walks the tree instead."""
    storage = TensorStorage(TensorDict({"done": torch.zeros(capacity, 1, dtype=torch.bool)}, [capacity]))
    g = torch.Generator().manual_seed(3)
    priority = torch.randn(capacity, generator=g).mul_(sigma).exp_()
    pool = [torch.randn(batch_size, generator=g).mul_(sigma).exp_() for _ in range(POOL)]
    trl, ext = TorchRLPrioritizedSampler(capacity, ALPHA, BETA), PrioritizedSampler(capacity, ALPHA, BETA)
    for sampler in (trl, ext):
        sampler.update_priority(torch.arange(capacity), priority)
    impls = [
        Impl(TRL_S, f"torchrl PrioritizedSampler.sample(storage, {batch_size}) + update_priority (C++ trees)",
             False, sampler_op(trl, storage, batch_size, pool)),
        Impl(EXT_S, f"torchrl_ext PrioritizedSampler.sample(storage, {batch_size}) + update_priority",
             False, sampler_op(ext, storage, batch_size, pool)),
    ]
    rows = ext.tree._levels[1][: ext.tree._sizes[1]]
    acceptance = float(rows.mean() / rows.max())

    def checks() -> list[Check]:
        index, info = ext.sample(storage, batch_size)
        return [check_indices(f"{EXT_S} {suffix}: index", index, capacity),
                check_weights(f"{EXT_S} {suffix}: priority_weight", info["priority_weight"])]
    title = (f"sampler only, sample({batch_size}) + update_priority({batch_size}) on a full {capacity:,} "
             f"sampler, priorities lognormal(0, {sigma:g}) (alpha={ALPHA}, beta={BETA}; rejection "
             f"acceptance {acceptance:.2f} before timing)")
    return Case(f"per_1M_{suffix}", title, TRL_S, impls, checks)


def big_sampler_case(capacity: int) -> tuple[Case, PrioritizedSampler, dict[str, int]]:
    """torchrl_ext's sampler alone at 10M capacity, B=256 and B=4096 in one interleaved case.

    Also returns the tree's nbytes() right after construction and after setting every
    priority: buffers allocated by a large update stay with the tree, so the figure that
    counts is the one after timing (what a training process holds), read by the caller.
    """
    # A full storage of that length; the sampler reads only len() and ndim, so one bool per row.
    storage = TensorStorage(TensorDict({"done": torch.zeros(capacity, 1, dtype=torch.bool)}, [capacity]))
    sampler = PrioritizedSampler(capacity, ALPHA, BETA)
    nbytes = {"built": sampler.tree.nbytes()}
    sampler.update_priority(torch.arange(capacity),
                            torch.rand(capacity, generator=torch.Generator().manual_seed(2)))
    nbytes["after_setting_all_priorities"] = sampler.tree.nbytes()
    impls = [Impl(f"{EXT_S} B={b}", f"torchrl_ext PrioritizedSampler.sample(storage, {b}) + "
                  f"update_priority({b})", False, sampler_op(sampler, storage, b, priority_pool(b, seed=b)))
             for b in BATCH_SIZES]

    def checks() -> list[Check]:
        out = []
        for b in BATCH_SIZES:
            index, info = sampler.sample(storage, b)
            out += [check_indices(f"{EXT_S} 10M B={b}: index", index, capacity),
                    check_weights(f"{EXT_S} 10M B={b}: priority_weight", info["priority_weight"])]
        return out
    title = f"torchrl_ext sampler only on a full {capacity:,} sampler (alpha={ALPHA}, beta={BETA}; no peer)"
    return Case("per_10M_sampler", title, None, impls, checks), sampler, nbytes


# ---------------------------------------------------------------- reporting
def fmt_rate(ops: float) -> str:
    return f"{ops:,.0f}" if ops >= 100 else f"{ops:.2f}"


def report_case(case: Case, bg: float, waited: float, pre: float,
                args: argparse.Namespace) -> dict[str, Any]:
    base = (statistics.median(next(i for i in case.impls if i.name == case.baseline).per_rep)
            if case.baseline else None)
    speed_note = f" Speed = `{case.baseline}` median / this median (>1 = faster)." if base else ""
    print(f"## {case.title}\n\n{bg_note(bg, waited, pre, args)}.{speed_note}\n")
    speed_head = f" speed vs {case.baseline} |" if base else ""
    print(f"| implementation | data | median ms/op | min | max | median ops/s |{speed_head} k |\n"
          f"|---|:-:|---:|---:|---:|---:|{'---:|' if base else ''}---:|")
    rows = {}
    for impl in case.impls:
        med = statistics.median(impl.per_rep)
        rows[impl.name] = {"label": impl.label, "returns_data": impl.returns_data, "median_ms": med * 1e3,
                           "min_ms": min(impl.per_rep) * 1e3, "max_ms": max(impl.per_rep) * 1e3,
                           "ops_per_s": 1.0 / med, "k": impl.k, "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
        r = rows[impl.name]
        speed = f" {base / med:.2f}x |" if base else ""
        if base:
            r["speed_vs_baseline"] = base / med
        print(f"| {impl.label} | {'yes' if impl.returns_data else 'no'} | {r['median_ms']:.3f} | "
              f"{r['min_ms']:.3f} | {r['max_ms']:.3f} | {fmt_rate(r['ops_per_s'])} |{speed} {impl.k} |")
    print()
    return rows


def report_targets(results: dict[str, dict[str, Any]], tree_ratio: float | None,
                   checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = baseline median / torchrl_ext median (time per op, same run); paired = "
          "range over repetitions of (baseline rep time / torchrl_ext rep time), same round-robin round.\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    targets = []
    rows_to_print = [(s, i, b, t) for s, i, b, t in TARGETS] + [(s, i, b, None) for s, i, b in INFO_RATIOS]
    for suffix, impl, baseline, target in rows_to_print:
        key = f"per_1M_{suffix}"
        if key not in results:
            continue
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        entry = target_row(key, f"{impl} vs {baseline}", rows, impl, baseline, target, bg, checks_ok)
        targets.append(entry)
    if tree_ratio is not None:
        ok = tree_ratio <= TREE_MEMORY_TARGET
        result = "PASS" if ok else "**FAIL**"
        targets.append({"case": "per_10M_sampler", "impl": EXT_S, "baseline": None,
                        "target": TREE_MEMORY_TARGET, "ratio": tree_ratio, "result": result})
        print(f"| per_10M_sampler | torchrl_ext tree bytes / (4 B x {BIG_CAPACITY:,}) | {tree_ratio:.2f} | - | "
              f"<= {TREE_MEMORY_TARGET:g} | {result} | - |")
    return targets



# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: same cases, 3 reps of >= 0.05 s, wait <= 5 s",
                     min_rep_default=0.4)
    a = ap.parse_args()
    # Short repetitions, still every case (and still 1M / 10M capacity: filling is ~10 s).
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    # TorchRL logs "Initialized LazyTensorStorage ..." to stdout, which would break the markdown.
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict")}
    if cpprb is not None:
        extra["cpprb"] = version("cpprb")
    started, load_start = utc_now(), loadavg()
    print(f"# torchrl_ext prioritized replay benchmark\n\n{environment_line(started, load_start, a, extra)}\n")
    if cpprb is None:
        print("**cpprb is not installed: its rows are skipped and its targets are not measured.** "
              "Install the bench extra: `pip install -e .[bench]`.\n")

    results: dict[str, dict[str, Any]] = {}
    all_checks: list[Check] = []
    tree_ratio: float | None = None

    def run(case: Case) -> None:
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(case.impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        rows = report_case(case, bg, waited, pre, a)
        checks = case.checks()
        report_checks(checks)
        all_checks.extend(checks)
        results[case.key] = {"title": case.title, "baseline": case.baseline, "bg_load": bg,
                             "waited_s": waited, "impls": rows,
                             "checks": [c.__dict__ for c in checks]}

    keys = [f"per_1M_B{b}" for b in BATCH_SIZES]
    if any(selected(a, k) for k in keys):
        bufs = build_buffers(CAPACITY)
        for b, key in zip(BATCH_SIZES, keys):
            if selected(a, key):
                run(per_case(bufs, b))
        del bufs  # ~2 GB of buffers; free them before the 10M sampler
        gc.collect()
    for suffix, sigma in SKEWED:
        if selected(a, f"per_1M_{suffix}"):
            run(skewed_case(suffix, sigma, CAPACITY))
            gc.collect()
    if selected(a, "per_10M_sampler"):  # i.e. the case key contains --only
        case, sampler, nbytes = big_sampler_case(BIG_CAPACITY)
        run(case)
        nbytes["after_timing"] = sampler.tree.nbytes()
        tree_ratio = nbytes["after_timing"] / (4 * BIG_CAPACITY)
        print("Tree memory, `sampler.tree.nbytes()` / (4 B x capacity): "
              + ", ".join(f"{stage.replace('_', ' ')} {n / (4 * BIG_CAPACITY):.2f} ({n / 2**20:.0f} MiB)"
                          for stage, n in nbytes.items())
              + ". The target uses the value after timing.\n")
        results[case.key]["tree_nbytes"] = nbytes
        results[case.key]["tree_bytes_per_4B_priority"] = tree_ratio
        del case, sampler

    checks_ok = all(c.ok for c in all_checks)
    targets = report_targets(results, tree_ratio, checks_ok)
    load_end = loadavg()
    print(f"\nloadavg at end `{load_end}`. Checks: "
          f"{'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": environment_meta(started, load_start, load_end, a, extra),
                       "cases": results, "targets": targets, "checks_ok": checks_ok}, f, indent=1)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
