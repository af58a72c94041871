"""Sweeps for the suite's plots: throughput against batch size and capacity, GAE time against T, V-trace at several (T, N).

Usage::

    python benchmarks/bench_sweep.py                  # full run (about 4 min on a quiet machine, ~3 GB of RAM)
    python benchmarks/bench_sweep.py --quick          # smaller sweeps, 3 short repetitions (~40 s)
    python benchmarks/bench_sweep.py --only gae,vtrace --json results.json

The other scripts time one or two sizes against their targets; this one sweeps one size at a time,
so that ``benchmarks/report.py`` can draw how each implementation scales. Every point is its own
case (peers and torchrl_ext in one process, interleaved repetitions, see ``_harness.py``). The
builders come from the scripts that own the cases (``bench_storage``, ``bench_prioritized``,
``bench_value``), so a sweep point measures the same thing as the script's own case.

Sweeps (case keys for ``--only``):

* ``sample_cap<C>``: uniform ``sample(256)`` of vec transitions (obs f32[64], next obs, action
  f32[4], reward, done; 533 B) from full buffers of capacity C: torchrl_ext
  ``TensorDictReplayBuffer(FastTensorStorage)``, TorchRL ``TensorDictReplayBuffer(LazyTensorStorage)``,
  cpprb ``ReplayBuffer``, SB3 ``ReplayBuffer.sample``. C = 10k, 100k, 1M (quick: 10k, 100k).
* ``sample_B<B>``: the same buffers at capacity 100k, ``sample(B)`` for B = 32 ... 8192.
* ``per_B<B>``: prioritized ``sample(B)`` + ``update_priority(B)`` on a full buffer (1M, quick
  100k), alpha 0.6, beta 0.4: torchrl_ext ``PrioritizedReplayBuffer``, TorchRL
  ``PrioritizedSampler`` buffer, cpprb ``PrioritizedReplayBuffer``.
* ``gae_T<T>``: GAE at N = 64 envs, P(done) = 0.01 (half truncated): torchrl_ext, TorchRL
  ``vec_generalized_advantage_estimate`` and its loop, SB3 ``RolloutBuffer.compute_returns_and_advantage``
  (numpy loop; truncation bootstraps folded into its rewards outside timing, so it computes
  the same advantages), and a plain torch loop as a reference.
* ``vtrace_T<T>_N<N>``: V-trace, torchrl_ext against TorchRL ``vtrace_advantage_estimate``.
* ``memory_vec`` (full run only): peak resident bytes per stored vec transition. Each
  implementation is filled to 200,000 transitions in its own fresh (spawned) process, after its
  inputs are built and VmHWM is reset; bytes = VmHWM at the end of the fill - VmRSS before it.
  A check fails if that is below 0.9x the data bytes (pages reused, not measured).

Checks (exit code 1 if one fails): every GAE and V-trace output, SB3's included, is within
``1e-5 x max(1, max |reference|)`` of bench_value's float64 loop; every sample has B rows.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
import torch

import bench_prioritized as bp
import bench_storage as bs
import bench_value as bv
from _harness import (BgLoad, Check, Impl, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, proc_status, quiet_before_case, report_checks, run_interleaved, selected,
                      utc_now, write_results)

try:
    import gymnasium
    from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer
except ImportError:  # optional peer: the bench extra installs it
    SB3RolloutBuffer = None

SAMPLE_CAPACITIES = (10_000, 100_000, 1_000_000)
SAMPLE_CAPACITIES_QUICK = (10_000, 100_000)
SWEEP_CAPACITY = 100_000  # the capacity of the batch-size sweep
SAMPLE_BATCHES = (32, 128, 512, 2048, 8192)
SAMPLE_BATCHES_QUICK = (32, 512, 8192)
PER_CAPACITY, PER_CAPACITY_QUICK = 1_000_000, 100_000
PER_BATCHES = (64, 256, 1024, 4096)
PER_BATCHES_QUICK = (256, 4096)
GAE_T = (16, 64, 256, 1024, 4096)
GAE_T_QUICK = (16, 256, 4096)
GAE_N, P_DONE = 64, 0.01
VTRACE_TN = ((32, 64), (128, 256), (512, 64), (128, 1024), (1024, 256))
VTRACE_TN_QUICK = ((32, 64), (128, 256), (1024, 256))
SB3_GAE = "sb3 RolloutBuffer"
MEMORY_CAPACITY = 200_000
MEMORY_KEY = "memory_vec"


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ---------------------------------------------------------------- one case
class Runner:
    """Times cases and collects their rows; every case is one point of one sweep."""

    def __init__(self, args: Any) -> None:
        self.args, self.cases, self.checks = args, {}, []

    def run(self, key: str, sweep: str, x: float, title: str, impls: list[Impl], items: int, unit: str) -> None:
        waited, pre = quiet_before_case(self.args)
        meter = BgLoad()
        run_interleaved(impls, self.args.reps, self.args.min_rep_seconds)
        bg = meter.cores()
        print(f"## {title}\n\n{bg_note(bg, waited, pre, self.args)}.\n")
        print(f"| implementation | median ms/call | min | max | median {unit}/s | k |\n|---|---:|---:|---:|---:|---:|")
        rows = {}
        for impl in impls:
            med = statistics.median(impl.per_rep)
            rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                               "max_ms": max(impl.per_rep) * 1e3, "items_per_s": items / med, "k": impl.k,
                               "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
            r = rows[impl.name]
            print(f"| {impl.label} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | "
                  f"{r['items_per_s']:,.0f} | {impl.k} |")
        print()
        self.cases[key] = {"title": title, "sweep": sweep, "x": x, "items_per_call": items, "unit": unit,
                           "bg_load": bg, "waited_s": waited, "impls": rows}


# ---------------------------------------------------------------- uniform sample
def sample_impls(p: bs.Peers, batch_size: int) -> list[Impl]:
    impls = [Impl(bs.EXT, "torchrl_ext TensorDictReplayBuffer(FastTensorStorage).sample(B)",
                  bs.torch_sample(p.ext, batch_size)),
             Impl(bs.TRL, "torchrl TensorDictReplayBuffer(LazyTensorStorage).sample(B)",
                  bs.torch_sample(p.torchrl, batch_size))]
    if p.cpprb is not None:
        impls.append(Impl(bs.CPPRB, "cpprb ReplayBuffer.sample(B)", bs.cpprb_sample(p.cpprb, batch_size)))
    if p.sb3 is not None:
        impls.append(Impl(bs.SB3, "SB3 ReplayBuffer.sample(B) (torch tensors)", lambda: p.sb3.sample(batch_size)))
    return impls


def sample_rows(out: Any) -> int:
    if isinstance(out, dict):  # cpprb
        return len(out["obs"])
    if hasattr(out, "observations"):  # SB3 ReplayBufferSamples
        return len(out.observations)
    return out.shape[0]


def check_sample_sizes(name: str, impls: list[Impl], batch_size: int) -> Check:
    sizes = {impl.name: sample_rows(impl.fn()) for impl in impls}
    return Check(name, all(s == batch_size for s in sizes.values()), f"rows per sample {sizes} (expected {batch_size})")


def uniform_sweeps(runner: Runner, capacities: tuple[int, ...], batches: tuple[int, ...]) -> None:
    a = runner.args
    for cap in capacities:
        keys = [f"sample_cap{cap}"] + ([f"sample_B{b}" for b in batches] if cap == SWEEP_CAPACITY else [])
        if not any(selected(a, k) for k in keys):
            continue
        t0 = time.perf_counter()
        peers = bs.build_peers(bs.vec_schema(cap), bs.SB3ReplayBuffer is not None, bs.CHUNK)
        print(f"Built and filled the vec peers at capacity {cap:,} in {time.perf_counter() - t0:.1f} s.\n")
        if selected(a, keys[0]):
            impls = sample_impls(peers, 256)
            runner.checks.append(check_sample_sizes(f"sample(256) at capacity {cap:,}", impls, 256))
            runner.run(keys[0], "sample_capacity", cap, f"uniform sample(256), full vec buffers of {cap:,} "
                       f"transitions (533 B each)", impls, 256, "transitions")
        for b, key in zip(batches, keys[1:]):
            if selected(a, key):
                impls = sample_impls(peers, b)
                runner.checks.append(check_sample_sizes(f"sample({b}) at capacity {cap:,}", impls, b))
                runner.run(key, "sample_batch", b, f"uniform sample({b}), full vec buffers of {cap:,} "
                           "transitions", impls, b, "transitions")
        del peers
        gc.collect()


# ---------------------------------------------------------------- prioritized
def per_sweep(runner: Runner, capacity: int, batches: tuple[int, ...]) -> None:
    keys = [f"per_B{b}" for b in batches]
    if not any(selected(runner.args, k) for k in keys):
        return
    t0 = time.perf_counter()
    bufs = bp.build_buffers(capacity)
    print(f"Built the prioritized buffers at capacity {capacity:,} in {time.perf_counter() - t0:.1f} s.\n")
    for b, key in zip(batches, keys):
        if not selected(runner.args, key):
            continue
        pool = bp.priority_pool(b, seed=b)
        impls = [Impl(bp.EXT, "torchrl_ext PrioritizedReplayBuffer: sample(B) + update_priority",
                      bp.ext_op(bufs.ext, b, pool)),
                 Impl(bp.TRL, "torchrl TensorDictReplayBuffer(PrioritizedSampler): sample(B) + update_priority",
                      bp.torchrl_op(bufs.torchrl, b, pool))]
        if bufs.cpprb is not None:
            impls.append(Impl(bp.CPPRB, "cpprb PrioritizedReplayBuffer: sample(B, beta) + update_priorities",
                              bp.cpprb_op(bufs.cpprb, b, pool)))
        runner.run(key, "per_batch", b, f"prioritized sample({b}) + update_priority({b}), full buffers of "
                   f"{capacity:,}", impls, b, "transitions")
        runner.checks += bp.ext_checks(bufs, b)
    del bufs
    gc.collect()


# ---------------------------------------------------------------- GAE and V-trace
def sb3_gae_impl(x: dict[str, torch.Tensor]) -> tuple[Impl, Callable[[], bv.Pair]]:
    """SB3's RolloutBuffer GAE on the inputs of bench_value.gae_case, and its result as [N, T, 1].

    SB3 reads V(s_{t+1}) from values[t + 1] and knows no truncation; folding
    ``gamma * (nv_t * (1 - term_t) - v_{t+1} * (1 - done_t))`` into the rewards (untimed) makes its
    delta equal ours at every step, and episode_starts[t + 1] = done_t cuts the recursion where ours does.
    """
    gamma = bv.GAMMA
    v, nv, r = (x[k][..., 0].t().contiguous() for k in ("state_value", "next_state_value", "reward"))
    done, term = (x[k][..., 0].t().contiguous() for k in ("done", "terminated"))
    t_len, n_env = v.shape
    r_folded = r + gamma * nv * (~term)
    r_folded[:-1] -= gamma * v[1:] * (~done[:-1])
    space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    rb = SB3RolloutBuffer(t_len, space, space, device="cpu", gae_lambda=bv.LMBDA, gamma=gamma, n_envs=n_env)
    rb.rewards[:] = r_folded.numpy()
    rb.values[:] = v.numpy()
    rb.episode_starts[:] = 0.0
    rb.episode_starts[1:] = done[:-1].numpy()
    last_values = v[-1].clone()  # unused by the folded delta: (1 - dones) multiplies it by 0 ...
    dones = np.ones(n_env, dtype=np.float32)  # ... because the last step's bootstrap is in the rewards
    rb.full = True

    def op() -> None:
        rb.compute_returns_and_advantage(last_values, dones)

    def result() -> bv.Pair:
        adv = torch.from_numpy(rb.advantages.copy()).t().unsqueeze(-1)
        return adv, torch.from_numpy(rb.returns.copy()).t().unsqueeze(-1)

    impl = Impl(SB3_GAE, "SB3 RolloutBuffer.compute_returns_and_advantage (numpy loop over T)", op)
    return impl, result


def accuracy_checks(key: str, impls: list[Any], case: bv.Case, extra: dict[str, Callable[[], bv.Pair]]) -> list[Check]:
    checks = []
    for impl in impls:
        if impl.name in extra:
            impl.fn()
            outs = extra[impl.name]()
        else:
            outs = tuple(impl.to_ntf(o) for o in impl.fn())
        errs = [bv.max_err(o, r) for o, r in zip(outs, case.reference)]
        checks.append(Check(f"{key}: {impl.name} within tolerance", all(ok for _, ok in errs),
                            "max abs err " + ", ".join(f"{e:.2e}" for e, _ in errs)))
    return checks


def value_sweeps(runner: Runner, horizons: tuple[int, ...], vtrace_tn: tuple[tuple[int, int], ...]) -> None:
    for t in horizons:
        key = f"gae_T{t}"
        if not selected(runner.args, key):
            continue
        case = bv.gae_case(GAE_N, t, P_DONE)
        impls, extra = list(case.impls), {}
        if SB3RolloutBuffer is not None:
            impl, result = sb3_gae_impl(bv.make_inputs(GAE_N, t, P_DONE))
            impls.append(impl)
            extra[impl.name] = result
        runner.run(key, "gae_T", t, f"GAE T={t} x N={GAE_N}, P(done)={P_DONE}", impls, t * GAE_N, "steps")
        runner.checks += accuracy_checks(key, impls, case, extra)
    for t, n in vtrace_tn:
        key = f"vtrace_T{t}_N{n}"
        if not selected(runner.args, key):
            continue
        case = bv.vtrace_case(n, t, P_DONE)
        impls = [i for i in case.impls if i.name != "plain torch loop"]
        runner.run(key, "vtrace_TN", t * n, f"V-trace T={t} x N={n}, P(done)={P_DONE}", impls, t * n, "steps")
        runner.checks += accuracy_checks(key, impls, case, {})
        runner.cases[key].update(T=t, N=n)


# ---------------------------------------------------------------- memory
def fill_one(impl: str, capacity: int) -> Callable[[], Any]:
    """Builds the input chunks of ``impl``; returns a call that constructs its buffer and fills it.

    Construction is inside the returned call: cpprb and SB3 allocate (and touch) their arrays in
    the constructor, torchrl_ext and TorchRL at the first write, and both belong to the measure.
    """
    schema = bs.vec_schema(capacity)
    inputs = bs.make_inputs(schema, impl == bs.SB3)

    def fill() -> Any:
        rb, _, insert = bs.new_peer(impl, schema, inputs)
        for _ in range(capacity // bs.CHUNK):
            insert()
        return rb
    return fill


def stored(rb: Any) -> int:
    if hasattr(rb, "get_stored_size"):  # cpprb
        return rb.get_stored_size()
    if hasattr(rb, "full"):  # SB3
        return rb.buffer_size * rb.n_envs if rb.full else rb.pos * rb.n_envs
    return len(rb)


def _memory_child(impl: str, capacity: int, send: Any) -> None:
    fill = fill_one(impl, capacity)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS, so the peak is the fill's own
        f.write("5")
    base = proc_status("VmRSS")
    rb = fill()
    send.send({"impl": impl, "capacity": capacity, "stored": stored(rb), "peak_delta_per_tr": (proc_status("VmHWM") - base) / capacity,
               "final_delta_per_tr": (proc_status("VmRSS") - base) / capacity})


def memory_case(runner: Runner) -> dict[str, Any]:
    impls = [bs.EXT, bs.TRL] + ([bs.CPPRB] if bs.cpprb is not None else []) + \
        ([bs.SB3] if bs.SB3ReplayBuffer is not None else [])
    # spawn, not fork: a forked child inherits the parent's heap, and after the other sweeps
    # its free but resident chunks can take the whole fill without any RSS growth (seen here:
    # 9-31 B per 533 B transition after a full sweep, 546-575 B in a fresh process).
    ctx, rows = mp.get_context("spawn"), {}
    for impl in impls:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_memory_child, args=(impl, MEMORY_CAPACITY, send))
        proc.start()
        send.close()
        try:
            rows[impl] = recv.recv()
        except EOFError:
            rows[impl] = {"impl": impl, "error": "the child process died without a result"}
        proc.join()
    row_bytes = bs.vec_schema(1).row_bytes
    print(f"## Memory: peak resident bytes per stored vec transition ({row_bytes} B of data), capacity "
          f"{MEMORY_CAPACITY:,}, one spawned process per implementation\n")
    print("| implementation | peak RSS delta B/transition | x data | final RSS delta B/transition |\n|---|---:|---:|---:|")
    for impl, r in rows.items():
        if "error" in r:
            print(f"| {impl} | failed: {r['error']} | | |")
            runner.checks.append(Check(f"memory child {impl}", False, r["error"]))
            continue
        runner.checks.append(Check(f"memory child {impl}: full", r["stored"] == MEMORY_CAPACITY,
                                   f"stored {r['stored']:,} of {MEMORY_CAPACITY:,}"))
        # Every stored byte is resident after the fill: less growth means a broken measure.
        runner.checks.append(Check(f"memory child {impl}: data resident", r["peak_delta_per_tr"] >= 0.9 * row_bytes,
                                   f"peak growth {r['peak_delta_per_tr']:,.0f} B per {row_bytes} B transition"))
        print(f"| {impl} | {r['peak_delta_per_tr']:,.0f} | {r['peak_delta_per_tr'] / row_bytes:.2f}x | "
              f"{r['final_delta_per_tr']:,.0f} |")
    print()
    return {"capacity": MEMORY_CAPACITY, "row_bytes": row_bytes, "impls": rows}


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smaller sweeps (capacities 10k/100k, fewer batch sizes and horizons), 3 reps of "
                     ">= 0.05 s, wait <= 5 s")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    gc.freeze()  # the imports' objects: keeps the harness's gc.collect() before each repetition short
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {name: v for name in ("tensordict", "cpprb", "stable-baselines3", "numpy")
             if (v := package_version(name))}
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print(f"# torchrl_ext sweeps\n\n{environment_line(started, load_start, a, extra)}\n")
    if a.quick:
        print("**--quick**: smaller sweeps and 3 repetitions of >= 0.05 s: a smoke run, not a measurement.\n")
    runner = Runner(a)
    uniform_sweeps(runner, SAMPLE_CAPACITIES_QUICK if a.quick else SAMPLE_CAPACITIES,
                   SAMPLE_BATCHES_QUICK if a.quick else SAMPLE_BATCHES)
    per_sweep(runner, PER_CAPACITY_QUICK if a.quick else PER_CAPACITY, PER_BATCHES_QUICK if a.quick else PER_BATCHES)
    value_sweeps(runner, GAE_T_QUICK if a.quick else GAE_T, VTRACE_TN_QUICK if a.quick else VTRACE_TN)
    memory = memory_case(runner) if not a.quick and selected(a, MEMORY_KEY) else None
    report_checks(runner.checks)
    checks_ok = all(c.ok for c in runner.checks)
    load_end, wall = loadavg(), time.perf_counter() - wall0
    print(f"Peak RSS {proc_status('VmHWM') / 2**30:.2f} GiB. Wall time {wall:.0f} s. loadavg at end `{load_end}`. "
          f"Checks: {'all passed' if checks_ok else 'FAILED'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(quick=a.quick, wall_s=wall)
        write_results(a.json, {"meta": meta, "cases": runner.cases, "memory": memory}, runner.checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
