"""n-step sampling on per-env rings (issue 7): torchrl_ext's NStepSampler against TorchRL's MultiStepTransform.

Usage::

    python benchmarks/bench_nstep.py                  # full run (about 1-1.5 min on a quiet machine; ~2.8 GiB peak RSS)
    python benchmarks/bench_nstep.py --quick          # smoke run: same sizes, 3 short repetitions (~25 s)
    python benchmarks/bench_nstep.py --only scaling --json benchmarks/results/bench_nstep.json
    python benchmarks/bench_nstep.py --profile 25     # also print cProfile's top 25 of torchrl_ext's sample

Everything runs in one process, torch at 1 thread. The experience: 16 envs, each an endless stream of
episodes of geometric length (mean 200 steps; half of the episode ends are terminations, half
truncations), per step ``obs`` f32[64], ``action`` f32[4], ``("next", "obs")`` f32[64] (the
reset observation follows an episode end), ``("next", "reward")`` f32[1], ``("next", "done" /
"terminated" / "truncated")`` bool[1] (535 B per transition); 62,500 transitions per env,
1,000,000 in all. Both pipelines get the stream as collector-shaped ``[16, 64]`` batches in time order.

* torchrl_ext: ``EnvRingReplayBuffer(num_envs=16, max_length=62_500, sampler=NStepSampler(5,
  gamma=0.99), batch_size=256)``, ``rb.sample()``: the buffer keeps one-step data; the sampler's
  chain table (each start's stop and n-step reward) is built from the whole buffer at the first
  sample after the fill (timed and printed, once) and updated by every later write, so the
  insert case pays for it like TorchRL's transform pays at ``extend``.
* TorchRL: ``ReplayBuffer(storage=LazyTensorStorage(1_000_000, ndim=2),
  transform=MultiStepTransform(n_steps=5, gamma=0.99))`` as its docstring shows (the transform
  runs at ``extend`` and stores n-step transitions), ``rb.sample(256)``. It is fed 5 more steps
  per env, which it holds back as look-ahead, so it stores the same 1,000,000 start steps.
* For reference: TorchRL's plain uniform ``sample(256)`` of 1-step transitions from
  ``LazyTensorStorage(1_000_000, ndim=2)`` (no transform), and a plain-torch n-step gather
  (random starts, ``index_select`` of the 5 chain steps' reward/done, the root fields at the
  start and the ``"next"`` fields at the chain end, no TensorDict).

Cases: ``sample_B256_n5`` (the target), ``scaling`` (torchrl_ext's sample(256) at buffer sizes
10k, 100k and 1M, and sample(1024) / sample(4096) on 1M) and ``insert_T64`` (one ``[16, 64]``
batch into each full buffer, information). The timing method is the other scripts' (see
_harness.py): warm-up, k calls per repetition, repetitions interleaved round-robin with the GC
off, background load measured and waited out before each case. After the sample case, a
diagnostic table times the pieces of both paths; a cProfile of torchrl_ext's sample is printed
when the target is missed (or with --profile).

Checks (exit code 1 if one fails): torchrl_ext's n-step transitions equal a float64 brute-force
walk of the stored streams (reward sum, chain end, ``("next", ...)`` entries from the chain end,
root entries from the start, ``steps_to_next_obs``, ``nstep_discount``): on small wrapped rings
of 3 envs written unevenly (n = 1, 3, 5), and on a sample of the 1M buffer; and the buffers hold
1,000,000 transitions after the fill. TorchRL's transform is not checked; how many of its stored
transitions bootstrap past a termination is printed for information. A missed speed target is
reported as FAIL, not an error.
"""
from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import sys
import time
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import MultiStepTransform

from _harness import write_results
from _harness import (selected, Impl, proc_status, profile, diagnose, BgLoad, Check, apply_quick, bg_note, environment_line,
                      environment_meta, loadavg, make_parser, quiet_before_case, report_checks, run_interleaved,
                      target_row, utc_now)
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import NStepSampler

NUM_ENVS, CAPACITY = 16, 1_000_000
LENGTH = CAPACITY // NUM_ENVS  # 62,500 transitions kept per env
N_STEP, GAMMA, BATCH = 5, 0.99, 256
OBS_DIM, ACT_DIM = 64, 4
MEAN_EPISODE, P_TERMINATED = 200, 0.5  # geometric episode lengths; share of episode ends that terminate
CHUNK = 64  # collector batch [16, 64] (1,024 frames)
POOL = 7  # distinct [16, 64] batches fed by the insert case
SCALING_SIZES = (10_000, 100_000, CAPACITY)
SCALING_BATCHES = (1_024, 4_096)  # on the 1M buffer, next to 256
SCALING_TARGET = 2.0  # sample time on 1M / on 10k at most this
STEP_BYTES = (2 * OBS_DIM + ACT_DIM + 1) * 4 + 3  # obs + next obs + action + reward (f32), 3 bool flags
GiB = 2**30
ROOT_KEYS = ["obs", "action"]
NEXT_KEYS = [("next", "obs"), ("next", "done"), ("next", "terminated"), ("next", "truncated")]

# Implementation keys (tables, targets, JSON).
EXT, MULTISTEP, PLAIN, REF = "torchrl_ext", "torchrl MultiStepTransform", "torchrl plain 1-step", "ref n-step gather"
SAMPLE_KEY, SCALING_KEY, INSERT_KEY = f"sample_B{BATCH}_n{N_STEP}", "scaling", f"insert_T{CHUNK}"
# (case key, implementation, baseline, minimum ratio baseline time / implementation time; None = information)
TARGETS: list[tuple[str, str, str, float | None]] = [
    (SAMPLE_KEY, EXT, MULTISTEP, 2.0),
    (SAMPLE_KEY, EXT, PLAIN, None),
    (SAMPLE_KEY, EXT, REF, None),
    (INSERT_KEY, EXT, MULTISTEP, None),
    (INSERT_KEY, EXT, PLAIN, None),
]


def size_label(size: int) -> str:
    return f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1_000}k"


def scaling_name(size: int, batch: int) -> str:
    return f"{size_label(size)} B{batch}"


# ---------------------------------------------------------------- the streams
def make_source(num_envs: int, steps: int, obs_dim: int, p_done: float, seed: int) -> TensorDict:
    """[E, S] transitions of endless episode streams: obs[t + 1] = next_obs[t] unless done[t] (then a reset obs)."""
    g = torch.Generator().manual_seed(seed)
    next_obs = torch.randn(num_envs, steps, obs_dim, generator=g)
    done = torch.rand(num_envs, steps, 1, generator=g) < p_done
    terminated = done & (torch.rand(num_envs, steps, 1, generator=g) < P_TERMINATED)
    obs = torch.empty_like(next_obs)
    obs[:, 0] = torch.randn(num_envs, obs_dim, generator=g)
    obs[:, 1:] = next_obs[:, :-1]
    reset = done[:, :-1, 0]
    obs[:, 1:][reset] = torch.randn(int(reset.sum()), obs_dim, generator=g)
    return TensorDict({
        "obs": obs,
        "action": torch.randn(num_envs, steps, ACT_DIM, generator=g),
        "next": {"obs": next_obs, "reward": torch.randn(num_envs, steps, 1, generator=g), "done": done,
                 "terminated": terminated, "truncated": done & ~terminated},
    }, batch_size=[num_envs, steps])


class Walk:
    """float64 brute-force n-step walk over a source's streams (numpy copies of reward and done)."""

    def __init__(self, src: TensorDict) -> None:
        self.src = src
        self.reward = src["next", "reward"][..., 0].double().numpy()
        self.done = src["next", "done"][..., 0].numpy()

    def chain(self, env: int, start: int, n_step: int, gamma: float, newest: int) -> tuple[float, int, str]:
        """(discounted reward sum, stop index m, why it stopped) for the chain from (env, start)."""
        total, k = 0.0, 0
        while True:
            p = start + k
            total += gamma ** k * float(self.reward[env, p])
            if self.done[env, p]:
                return total, k, "done"
            if p == newest:
                return total, k, "newest"
            if k == n_step - 1:
                return total, k, "n"
            k += 1


def compare_chains(batch: TensorDictBase, walk: Walk, earliest: torch.Tensor, newest: torch.Tensor,
                   n_step: int, gamma: float) -> tuple[list[str], dict[str, Any]]:
    """Fields of an n-step sample that differ from the walk; and stop reasons, max reward error."""
    index = batch["index"]
    if index.ndim != 2 or index.shape[-1] != 3:
        return [f"index of shape {list(index.shape)} (expected [B, 3] = (env, start, end))"], {}
    env, start, end = index.unbind(-1)
    stops = {"done": 0, "newest": 0, "n": 0}
    want_reward, ms = [], []
    for e, s in zip(env.tolist(), start.tolist()):
        if not int(earliest[e]) <= s <= int(newest[e]):
            return [f"start {s} of env {e} not stored ([{int(earliest[e])}, {int(newest[e])}])"], {}
        total, m, why = walk.chain(e, s, n_step, gamma, int(newest[e]))
        want_reward.append(total)
        ms.append(m)
        stops[why] += 1
    m = torch.tensor(ms)
    want_end = start + m
    src = walk.src
    bad = []
    if not torch.equal(end, want_end):
        bad.append(f"chain end ({int((end != want_end).sum())} of {len(m)})")
    for key in ROOT_KEYS:
        if not torch.equal(batch[key], src[key][env, start]):
            bad.append(str(key))
    for key in NEXT_KEYS:
        if not torch.equal(batch[key], src[key][env, want_end]):
            bad.append(str(key))
    if not torch.equal(batch["steps_to_next_obs"].reshape(-1), m + 1):
        bad.append("steps_to_next_obs")
    disc = torch.tensor(gamma, dtype=torch.float64) ** (m + 1).double()
    if not torch.allclose(batch["nstep_discount"].reshape(-1).double(), disc, rtol=1e-6, atol=0):
        bad.append("nstep_discount")
    want = torch.tensor(want_reward, dtype=torch.float64)
    err = (batch["next", "reward"].reshape(-1).double() - want).abs()
    if not bool((err <= 1e-5 * want.abs().clamp(min=1.0)).all()):
        bad.append("(\"next\", \"reward\")")
    return bad, {"stops": stops, "max_reward_err": float(err.max())}


# ---------------------------------------------------------------- buffers
def build_ext(src: TensorDict, length: int, batch_size: int = BATCH) -> EnvRingReplayBuffer:
    rb = EnvRingReplayBuffer(num_envs=NUM_ENVS, max_length=length, sampler=NStepSampler(N_STEP, gamma=GAMMA),
                             batch_size=batch_size)
    for p in range(0, length, CHUNK):
        rb.extend(src[:, p:min(p + CHUNK, length)])
    return rb


def build_multistep(src: TensorDict) -> ReplayBuffer:
    """TorchRL's documented n-step pipeline; fed LENGTH + N_STEP steps per env, it stores LENGTH."""
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY, ndim=2),
                      transform=MultiStepTransform(n_steps=N_STEP, gamma=GAMMA))
    total = LENGTH + N_STEP
    for p in range(0, total, CHUNK):
        rb.extend(src[:, p:min(p + CHUNK, total)])
    return rb


def build_plain(src: TensorDict) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY, ndim=2))
    for p in range(0, LENGTH, CHUNK):
        rb.extend(src[:, p:min(p + CHUNK, LENGTH)])
    return rb


# ---------------------------------------------------------------- ops
def sample_op(rb: Any, batch: int | None = None) -> Callable[[], Any]:
    if batch is None:
        def op() -> Any:
            return rb.sample()
    else:
        def op() -> Any:
            return rb.sample(batch)
    return op


def extend_op(rb: Any, pool: list[TensorDict]) -> Callable[[], Any]:
    state = {"n": 0}

    def op() -> Any:
        td = pool[state["n"] % POOL]
        state["n"] += 1
        return rb.extend(td)
    return op


def ref_nstep(src: TensorDict) -> Callable[[], Any]:
    """Plain torch n-step gather on the source viewed as [E * S, ...] (no TensorDict, no newest-step stop)."""
    steps = src.shape[1]
    flat = {key: src[key].reshape(NUM_ENVS * steps, *src[key].shape[2:])
            for key in ROOT_KEYS + NEXT_KEYS + [("next", "reward")]}  # views: src is contiguous
    k = torch.arange(N_STEP)
    weight = GAMMA ** k.double()

    def op() -> dict[Any, torch.Tensor]:
        rows = torch.randint(NUM_ENVS, (BATCH,)) * steps + torch.randint(LENGTH, (BATCH,))
        chain = (rows.unsqueeze(1) + k).reshape(-1)
        stop = flat["next", "done"].index_select(0, chain).view(BATCH, N_STEP).clone()
        stop[:, -1] = True
        m = stop.to(torch.int8).argmax(1)
        reward = flat["next", "reward"].index_select(0, chain).view(BATCH, N_STEP).double()
        end = rows + m
        out = {key: flat[key].index_select(0, rows) for key in ROOT_KEYS}
        out.update({key: flat[key].index_select(0, end) for key in NEXT_KEYS})
        out["next", "reward"] = (torch.where(k <= m.unsqueeze(1), weight, 0.0) * reward).sum(1, keepdim=True).float()
        out["steps_to_next_obs"] = (m + 1).unsqueeze(1)
        return out
    return op


# ---------------------------------------------------------------- checks
def check_small_rings() -> list[Check]:
    """3 envs written unevenly (random env subsets, chunks of 1-12 steps) into rings of 100 that wrap."""
    num_envs, max_length, steps = 3, 100, 400
    src = make_source(num_envs, steps, 8, p_done=0.1, seed=1)
    walk = Walk(src)
    rng = random.Random(1)
    goal, written = [steps, steps - 37, steps - 111], [0] * num_envs
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length, sampler=NStepSampler(N_STEP, gamma=GAMMA))
    while any(w < g for w, g in zip(written, goal)):
        open_envs = [e for e in range(num_envs) if written[e] < goal[e]]
        envs = [e for e in open_envs if rng.random() < 0.7] or open_envs[:1]
        t = min(rng.randint(1, 12), min(goal[e] - written[e] for e in envs))
        batch = torch.stack([src[e, written[e]:written[e] + t] for e in envs])
        rb.extend(batch, env_ids=torch.tensor(envs))
        for e in envs:
            written[e] += t
    st = rb.storage
    earliest, newest = st.earliest_position(), st.current_pos - 1
    sizes_ok = newest.tolist() == [g - 1 for g in goal] and earliest.tolist() == [g - max_length for g in goal]
    checks = [Check("small rings (3 envs x 100, written unevenly): positions", sizes_ok,
                    f"stored positions per env [{earliest.tolist()}, {newest.tolist()}] (expected the last "
                    f"{max_length} of {goal} written)")]
    for n_step, gamma in ((1, 0.99), (3, 0.9), (N_STEP, GAMMA)):
        view = EnvRingReplayBuffer(storage=st, sampler=NStepSampler(n_step, gamma=gamma), batch_size=128,
                                   generator=torch.Generator().manual_seed(n_step))
        bad: set[str] = set()
        stops = {"done": 0, "newest": 0, "n": 0}
        err = 0.0
        for _ in range(8):
            b, info = compare_chains(view.sample(), walk, earliest, newest, n_step, gamma)
            bad.update(b)
            for why, c in info.get("stops", {}).items():
                stops[why] += c
            err = max(err, info.get("max_reward_err", 0.0))
        checks.append(Check(
            f"small rings: NStepSampler({n_step}, gamma={gamma}) == float64 walk", not bad,
            (f"8 x sample(128); chains stopped at done {stops['done']}, at the env's newest step {stops['newest']}, "
             f"after n steps {stops['n']}; max reward error {err:.1e}") if not bad else f"differs: {sorted(bad)}"))
    return checks


def check_big_sample(ext: EnvRingReplayBuffer, walk: Walk) -> Check:
    earliest = torch.zeros(NUM_ENVS, dtype=torch.long)
    newest = torch.full((NUM_ENVS,), LENGTH - 1, dtype=torch.long)
    bad, info = compare_chains(ext.sample(), walk, earliest, newest, N_STEP, GAMMA)
    stops = info.get("stops", {})
    return Check(f"{EXT} sample({BATCH}) on the 1M buffer == float64 walk", not bad,
                 (f"chains stopped at done {stops['done']}, at the newest step {stops['newest']}, after n steps "
                  f"{stops['n']}; max reward error {info['max_reward_err']:.1e}") if not bad
                 else f"differs: {sorted(bad)}")


def check_sizes(name: str, n: int) -> Check:
    return Check(f"{name} after the fill: size", n == CAPACITY, f"len {n:,} (expected {CAPACITY:,})")


def multistep_bootstrap_info(rb: ReplayBuffer, src: TensorDict) -> dict[str, Any]:
    """MultiStepTransform's stored transitions whose ("next", "obs") is a terminal obs while
    ("next", "terminated") is False (information, not a check)."""
    stored = rb.storage._storage  # [LENGTH, NUM_ENVS] (time, env)
    mapped = bool(torch.equal(stored["obs"][..., 0], src["obs"][:, :LENGTH, 0].T))
    count = stored["steps_to_next_obs"].reshape(LENGTH, NUM_ENVS)
    end = torch.arange(LENGTH).unsqueeze(1) + count - 1
    term_at_end = src["next", "terminated"][..., 0].T.gather(0, end)
    flag = stored["next", "terminated"].reshape(LENGTH, NUM_ENVS)
    past = term_at_end & ~flag & (count > 1)
    return {"rows_match_source": mapped, "bootstrap_past_termination": int(past.sum()),
            "chains_ending_at_termination": int(term_at_end.sum()), "stored": LENGTH * NUM_ENVS}


# ---------------------------------------------------------------- reporting
def fmt_rate(x: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.0f}"


def report_case(title: str, impls: list[Impl], baseline: str, per_call: dict[str, int], unit: str, bg: float,
                waited: float, pre: float, args: argparse.Namespace) -> dict[str, Any]:
    base = statistics.median(next(i for i in impls if i.name == baseline).per_rep)
    print(f"## {title}\n\n{bg_note(bg, waited, pre, args)}. Speed = `{baseline}` median / this median "
          f"(>1 = faster).\n")
    print(f"| implementation | median us/call | min | max | {unit}/call | {unit}/s | us per {unit[:-1]} | "
          f"speed vs {baseline} | k |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for impl in impls:
        med, n = statistics.median(impl.per_rep), per_call[impl.name]
        rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                           "max_ms": max(impl.per_rep) * 1e3, "per_call": n, "k": impl.k,
                           "per_rep_ms": [s * 1e3 for s in impl.per_rep], "speed_vs_baseline": base / med}
        print(f"| {impl.label} | {med * 1e6:,.1f} | {min(impl.per_rep) * 1e6:,.1f} | {max(impl.per_rep) * 1e6:,.1f} | "
              f"{n:,} | {fmt_rate(n / med)} | {med / n * 1e6:.3f} | {base / med:.2f}x | {impl.k} |")
    print()
    return rows


def scaling_row(rows: dict[str, Any], big: int, small: int, target: float | None, bg: float,
                checks_ok: bool) -> dict[str, Any]:
    """A Targets row for torchrl_ext's sample(256) time on ``big`` / on ``small`` buffers, which must
    stay <= target (lower is better)."""
    b, s = scaling_name(big, BATCH), scaling_name(small, BATCH)
    goal = f"<= {target:g}x" if target is not None else "(info)"
    label = f"{EXT} sample({BATCH}) time, {size_label(big)} / {size_label(small)} buffer (O(buffer): {big // small}x)"
    entry: dict[str, Any] = {"case": SCALING_KEY, "impl": b, "baseline": s, "target_max": target}
    if b not in rows or s not in rows:
        print(f"| {SCALING_KEY} | {label} | - | - | {goal} | not measured | {bg:.2f} |")
        return {**entry, "ratio": None, "result": "not measured"}
    ratio = rows[b]["median_ms"] / rows[s]["median_ms"]
    paired = [x / y for x, y in zip(rows[b]["per_rep_ms"], rows[s]["per_rep_ms"])]
    if target is None:
        result = "-"
    elif not checks_ok:
        result = "FAIL (checks)"
    else:
        result = "PASS" if ratio <= target else "**FAIL**"
    print(f"| {SCALING_KEY} | {label} | {ratio:.2f}x | {min(paired):.2f}-{max(paired):.2f}x | {goal} | {result} | "
          f"{bg:.2f} |")
    return {**entry, "ratio": ratio, "paired": [min(paired), max(paired)], "result": result}


def report_targets(results: dict[str, dict[str, Any]], checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = baseline median time per call / torchrl_ext median time per call (same run, same "
          "batch); paired = range over repetitions of (baseline rep time / torchrl_ext rep time), same round-robin "
          "round. The scaling rows are time ratios of torchrl_ext's own sample (lower is better).\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    out = []
    for key, impl, baseline, target in TARGETS:
        if key not in results:
            continue
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        out.append(target_row(key, f"{impl} vs {baseline}", rows, impl, baseline, target, bg, checks_ok))
    if SCALING_KEY in results:
        rows, bg = results[SCALING_KEY]["impls"], results[SCALING_KEY]["bg_load"]
        out.append(scaling_row(rows, CAPACITY, SCALING_SIZES[0], SCALING_TARGET, bg, checks_ok))
        out.append(scaling_row(rows, SCALING_SIZES[1], SCALING_SIZES[0], None, bg, checks_ok))
    print()
    return out


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: same sizes, 3 reps of >= 0.05 s, wait <= 5 s", min_rep_default=0.4)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print cProfile's top N functions of torchrl_ext's sample (always done when the "
                         "MultiStepTransform target fails, top 25)")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    gc.freeze()  # objects from the imports: every gc.collect() (untimed) would walk them
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # "Initialized LazyTensorStorage ..." on stdout
    extra = {"tensordict": version("tensordict"), "numpy": np.__version__}
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print(f"# torchrl_ext n-step sampling benchmark\n\n{environment_line(started, load_start, a, extra)}\n")
    notes = [f"Experience: {NUM_ENVS} envs x {LENGTH:,} transitions ({CAPACITY:,} in all), episodes of geometric "
             f"length (mean {MEAN_EPISODE}, {P_TERMINATED:.0%} of the ends terminated), obs f32[{OBS_DIM}], action "
             f"f32[{ACT_DIM}], reward f32[1], done / terminated / truncated bool[1] ({STEP_BYTES} B per transition); "
             f"written as [{NUM_ENVS}, {CHUNK}] batches in time order. n_step = {N_STEP}, gamma = {GAMMA}."]
    if a.quick:
        notes.append("**--quick**: 3 repetitions of >= 0.05 s: a smoke run, not a measurement.")
    for note in notes:
        print(note + "\n")

    results: dict[str, dict[str, Any]] = {}
    all_checks: list[Check] = []
    diagnostics: dict[str, list[dict[str, Any]]] = {}
    info: dict[str, Any] = {}
    diag_reps, diag_rep_s = (3, 0.05) if a.quick else (5, 0.2)

    def checked(checks: list[Check]) -> None:
        report_checks(checks)
        all_checks.extend(checks)

    def run(key: str, title: str, impls: list[Impl], baseline: str, per_call: dict[str, int], unit: str) -> None:
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        rows = report_case(title, impls, baseline, per_call, unit, bg, waited, pre, a)
        results[key] = {"title": title, "baseline": baseline, "bg_load": bg, "waited_s": waited, "impls": rows}

    checked(check_small_rings())

    t0 = time.perf_counter()
    src = make_source(NUM_ENVS, LENGTH + N_STEP, OBS_DIM, p_done=1 / MEAN_EPISODE, seed=0)
    walk = Walk(src)
    t_src = time.perf_counter() - t0
    t0 = time.perf_counter()
    ext = build_ext(src, LENGTH)
    fill = {EXT: time.perf_counter() - t0}
    need_peers = selected(a, SAMPLE_KEY) or selected(a, INSERT_KEY)
    multistep = plain = None
    if need_peers:
        t0 = time.perf_counter()
        multistep = build_multistep(src)
        fill[MULTISTEP] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = build_plain(src)
        fill[PLAIN] = time.perf_counter() - t0
    calls = -(-LENGTH // CHUNK)
    print(f"Built the source in {t_src:.1f} s. Fill ({calls} extends of [{NUM_ENVS}, {CHUNK}], one pass, "
          "information): " + ", ".join(f"{name} {s:.1f} s ({CAPACITY / s / 1e3:,.0f}k transitions/s)"
                                       for name, s in fill.items())
          + f". RSS {proc_status('VmRSS') / GiB:.2f} GiB.\n")
    info["fill_s"] = fill
    t0 = time.perf_counter()
    ext.sample()
    info["first_sample_s"] = first = time.perf_counter() - t0
    print(f"First torchrl_ext sample after the fill (builds the chain table over {len(ext):,} starts, once; "
          f"information): {first:.2f} s.\n")
    fill_checks = [check_sizes(EXT, len(ext))]
    if need_peers:
        fill_checks += [check_sizes(MULTISTEP, len(multistep)), check_sizes(PLAIN, len(plain))]
    fill_checks.append(check_big_sample(ext, walk))
    checked(fill_checks)

    # ---- sample(256), n = 5, full 1M buffers
    if selected(a, SAMPLE_KEY):
        boot = multistep_bootstrap_info(multistep, src)
        info["multistep_bootstrap"] = boot
        frac = boot["bootstrap_past_termination"] / boot["stored"]
        print(f"Information (not a check): of the {boot['stored']:,} transitions `MultiStepTransform` stored, "
              f"{boot['bootstrap_past_termination']:,} ({frac:.2%}; about {frac * BATCH:.1f} per sample({BATCH})) have "
              "`(\"next\", \"obs\")` = an observation at which the episode terminated, 1-4 steps after the start, "
              "while `(\"next\", \"terminated\")` is False (the flags stay those of the start step): a TD target "
              f"bootstraps past the termination. {boot['chains_ending_at_termination']:,} chains end at a "
              "termination in all. Stored rows map to the source as (time, env): "
              f"{boot['rows_match_source']}. torchrl_ext's flags come from the chain end (checked above).\n")
        impls = [
            Impl(MULTISTEP, f"torchrl `ReplayBuffer(storage=LazyTensorStorage({CAPACITY:,}, ndim=2), transform="
                            f"MultiStepTransform(n_steps={N_STEP}, gamma={GAMMA}))`, `rb.sample({BATCH})`",
                 sample_op(multistep, BATCH)),
            Impl(EXT, f"torchrl_ext `EnvRingReplayBuffer(num_envs={NUM_ENVS}, max_length={LENGTH:,}, "
                      f"sampler=NStepSampler({N_STEP}, gamma={GAMMA}), batch_size={BATCH})`, `rb.sample()`",
                 sample_op(ext)),
            Impl(PLAIN, f"reference: torchrl `ReplayBuffer(storage=LazyTensorStorage({CAPACITY:,}, ndim=2))` of 1-step "
                        f"transitions, `rb.sample({BATCH})`", sample_op(plain, BATCH)),
            Impl(REF, "reference: plain torch n-step gather (randint starts, `index_select` of the 5 chain steps' "
                      "reward and done, root fields at the start, next fields at the chain end)", ref_nstep(src)),
        ]
        run(SAMPLE_KEY, f"sample({BATCH}) of {N_STEP}-step transitions from full {CAPACITY:,}-transition buffers",
            impls, MULTISTEP, {i.name: BATCH for i in impls}, "transitions")
        # Where the time goes (fixed indices: the rows are cache-warm after the first call).
        st, smp = ext.storage, ext._sampler
        index, _ = smp.sample(st, BATCH)
        env, start = index[0], index[1]
        rows = st.flat_index(env, start)
        leaves = [st.flat_leaf(key) for key in ROOT_KEYS + NEXT_KEYS + [("next", "reward")]]
        ms_index, _ = multistep._sampler.sample(multistep._storage, BATCH)
        pieces = [
            ("torchrl_ext rb.sample(), end to end", sample_op(ext)),
            (f"  NStepSampler.sample(storage, {BATCH}) (draw, chains, reward sum, info)",
             lambda: smp.sample(st, BATCH)),
            ("  EnvRingStorage.get((env, start, end)) (fixed index)", lambda: st.get(index)),
            (f"  index_select of the 7 fields at {BATCH} fixed rows (cache-warm)",
             lambda: [leaf.index_select(0, rows) for leaf in leaves]),
            (f"  index_select of the 7 fields at {BATCH} fresh random rows (cache-cold)",
             lambda: (lambda r: [leaf.index_select(0, r) for leaf in leaves])(torch.randint(CAPACITY, (BATCH,)))),
            (f"torchrl MultiStepTransform rb.sample({BATCH}), end to end", sample_op(multistep, BATCH)),
            (f"  RandomSampler.sample(storage, {BATCH}) (index only)",
             lambda: multistep._sampler.sample(multistep._storage, BATCH)),
            ("  LazyTensorStorage.get(index) (fixed index)", lambda: multistep._storage.get(ms_index)),
            ("reference plain torch n-step gather", ref_nstep(src)),
        ]
        diagnostics[SAMPLE_KEY] = diagnose(f"sample({BATCH}), n = {N_STEP}", pieces, diag_reps, diag_rep_s, a)
        r = results[SAMPLE_KEY]["impls"]
        failed = r[MULTISTEP]["median_ms"] / r[EXT]["median_ms"] < 2.0
        if a.profile or failed:
            profile(f"torchrl_ext rb.sample() (n = {N_STEP}, 1M buffer)", sample_op(ext), 300, a.profile or 25)
        del impls, pieces
        gc.collect()

    # ---- scaling: buffer size and batch size
    if selected(a, SCALING_KEY):
        t0 = time.perf_counter()
        bufs = {size: build_ext(src, size // NUM_ENVS) for size in SCALING_SIZES[:-1]}
        bufs[CAPACITY] = ext
        # Buffers over the same 1M storage with their own batch_size (rb.sample() stays on the lean path).
        views = {b: EnvRingReplayBuffer(storage=ext.storage, sampler=NStepSampler(N_STEP, gamma=GAMMA), batch_size=b)
                 for b in SCALING_BATCHES}
        print(f"Filled the {', '.join(size_label(s) for s in SCALING_SIZES[:-1])} buffers in "
              f"{time.perf_counter() - t0:.1f} s.\n")
        checked([Check(f"{size_label(s)} buffer after the fill: size", len(rb) == s, f"len {len(rb):,}")
                 for s, rb in bufs.items()])
        impls = [Impl(scaling_name(s, BATCH), f"torchrl_ext sample({BATCH}), {s:,}-transition buffer "
                      f"({NUM_ENVS} x {s // NUM_ENVS:,})", sample_op(rb)) for s, rb in bufs.items()]
        impls += [Impl(scaling_name(CAPACITY, b), f"torchrl_ext sample({b:,}), {CAPACITY:,}-transition buffer",
                       sample_op(view)) for b, view in views.items()]
        per_call = {scaling_name(s, BATCH): BATCH for s in SCALING_SIZES}
        per_call.update({scaling_name(CAPACITY, b): b for b in SCALING_BATCHES})
        run(SCALING_KEY, f"scaling: torchrl_ext sample(B), n = {N_STEP}, by buffer size and batch size", impls,
            scaling_name(SCALING_SIZES[0], BATCH), per_call, "transitions")
        del impls, views, bufs
        gc.collect()

    # ---- insert: one [16, 64] batch into the full buffers (information)
    if selected(a, INSERT_KEY):
        pool = [src[:, i * CHUNK:(i + 1) * CHUNK].clone() for i in range(POOL)]
        impls = [
            Impl(MULTISTEP, f"torchrl ReplayBuffer + MultiStepTransform: `rb.extend(td[{NUM_ENVS}, {CHUNK}])`",
                 extend_op(multistep, pool)),
            Impl(EXT, f"torchrl_ext EnvRingReplayBuffer: `rb.extend(td[{NUM_ENVS}, {CHUNK}])`", extend_op(ext, pool)),
            Impl(PLAIN, f"reference: torchrl ReplayBuffer(LazyTensorStorage(ndim=2)), no transform: "
                        f"`rb.extend(td[{NUM_ENVS}, {CHUNK}])`", extend_op(plain, pool)),
        ]
        run(INSERT_KEY, f"extend: one [{NUM_ENVS}, {CHUNK}] batch ({NUM_ENVS * CHUNK:,} transitions) into the full "
                        "buffers (ring overwrite)", impls, MULTISTEP, {i.name: NUM_ENVS * CHUNK for i in impls},
            "transitions")
        checked([Check(f"{name} after the timed inserts: size", len(rb) == CAPACITY, f"len {len(rb):,}")
                 for name, rb in ((EXT, ext), (MULTISTEP, multistep), (PLAIN, plain))])
        del impls, pool

    multistep = plain = None  # free the TorchRL buffers before the report
    gc.collect()
    checks_ok = all(c.ok for c in all_checks)
    targets = report_targets(results, checks_ok)
    load_end, peak, wall = loadavg(), proc_status("VmHWM"), time.perf_counter() - wall0
    print(f"Peak RSS (VmHWM) {peak / GiB:.2f} GiB. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(num_envs=NUM_ENVS, capacity=CAPACITY, n_step=N_STEP, gamma=GAMMA, batch=BATCH,
                    step_bytes=STEP_BYTES, quick=a.quick, wall_s=wall, peak_rss=peak, notes=notes)
        payload = {"meta": meta, "cases": results, "diagnostics": diagnostics, "targets": targets, "info": info}
        write_results(a.json, payload, all_checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
