"""Side-by-side CPU benchmark of torchrl_ext's per-env ring buffer against cpprb and TorchRL.

Usage::

    python benchmarks/bench_ring.py                  # full run (about 1 min on a quiet machine; ~2.9 GB peak RSS)
    python benchmarks/bench_ring.py --quick          # smoke run: same sizes, 3 short repetitions (~30 s)
    python benchmarks/bench_ring.py --only insert --json benchmarks/results/bench_ring.json --no-wait
    python benchmarks/bench_ring.py --profile 25     # also print cProfile's top 25 of the torchrl_ext paths

Everything runs in one process. ALF-style experience of 64 envs, one step per env per call:
obs f32[64], reward f32, discount f32, step_type int32 (268 B per step), 16,384 steps kept per
env (1,048,576 steps in all). Every peer is filled to capacity with the same 64 streams
(step ``p`` of env ``e`` is the same in every peer), then two cases are timed:

* ``sample_B256_T8`` (get_batch): 256 windows of 8 consecutive steps of one env.
  torchrl_ext ``EnvRingReplayBuffer(sampler=TrajectorySampler(8)).sample(256)`` ([256, 8])
  against TorchRL ``TensorDictReplayBuffer(LazyTensorStorage(64 * 16384),
  SliceSampler(slice_len=8, traj_key="traj"), batch_size=2048).sample()`` holding each env's
  stream as one trajectory, with ``cache_values=False`` and ``=True``; and a reference
  gather (``index_select`` of the 2,048 steps into new tensors).
* ``insert_E64`` (add_batch): one ``[64]`` step into the FULL buffers (ring overwrite).
  torchrl_ext ``rb.extend(td, env_ids=...)`` (and without ``env_ids``, for information)
  against cpprb ``ReplayBuffer(64 * 16384, env_dict).add(**arrays[64])`` and the TorchRL
  composition a user needs today (TorchRL issue #3194): 64
  ``TensorDictReplayBuffer(storage=LazyTensorStorage(16384))``, each extended with its
  env's row, as ``extend(td[e:e+1])`` and as ``add(row)`` over ``td.unbind(0)``; and a
  reference write (``index_copy_`` of the 64 rows of each field into preallocated tensors).

The timing method is the other scripts' (see _harness.py): warm-up, k calls per repetition,
repetitions interleaved round-robin with the GC off, torch at 1 thread, background load
measured and waited out before each case. After the checks, a diagnostic table times each
piece of the torchrl_ext paths alone (interleaved too).

Prints markdown tables and a Targets table. Exits with 1 only if a correctness check fails
(sizes after the fill; sampled windows are consecutive stored steps of one env and equal the
source data, for torchrl_ext and both TorchRL peers; after the timed inserts, every peer holds
exactly the last 16,384 steps of every env); a missed speed target is reported, not an error.
Without cpprb (``pip install -e .[bench]``) its rows are skipped and its target is reported
as not measured.
"""
from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

from _harness import write_results
from _harness import (selected, Impl, proc_status, profile, diagnose, BgLoad, Check, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, quiet_before_case, report_checks, run_interleaved, target_row, utc_now)
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler

try:
    import cpprb
except ImportError:  # optional peer: the bench extra installs it
    cpprb = None

NUM_ENVS, MAX_LENGTH, OBS_DIM = 64, 16_384, 64
BATCH, BATCH_LENGTH = 256, 8  # get_batch(256, batch_length=8)
POOL = 7  # distinct [64] input steps: step p of every stream is pool[p % POOL] (7 is coprime with 16384)
FILL_CHUNK = 1_024  # steps per env per fill call
# torch field -> (per-step shape, dtype); cpprb uses the same names and dtypes (scalars as [N, 1]).
FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "obs": ((OBS_DIM,), torch.float32),
    "reward": ((), torch.float32),
    "discount": ((), torch.float32),
    "step_type": ((), torch.int32),
}
STEP_BYTES = sum(int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
                 for shape, dt in FIELDS.values())
GiB = 2**30

# Implementation keys (used in the tables, the targets and the JSON file).
EXT, EXT_NOIDS = "torchrl_ext", "torchrl_ext (no env_ids)"
CPPRB = "cpprb"
ROUTE_EXTEND, ROUTE_ADD = "torchrl routing extend(td[e:e+1])", "torchrl routing add(unbind)"
REF_COPY = "ref index_copy_"
SLICE, SLICE_CACHED = "torchrl SliceSampler", "torchrl SliceSampler cache_values"
REF_GATHER = "ref index_select"
INSERT_KEY, SAMPLE_KEY = "insert_E64", f"sample_B{BATCH}_T{BATCH_LENGTH}"
# (case key, implementation, baselines (the fastest of them is used), minimum ratio
#  baseline time / implementation time; None = information only)
TARGETS: list[tuple[str, str, tuple[str, ...], float | None]] = [
    (INSERT_KEY, EXT, (CPPRB,), 1.0),
    (INSERT_KEY, EXT, (ROUTE_EXTEND, ROUTE_ADD), 5.0),
    (SAMPLE_KEY, EXT, (SLICE, SLICE_CACHED), 3.0),
    (INSERT_KEY, EXT_NOIDS, (CPPRB,), None),
    (INSERT_KEY, EXT, (REF_COPY,), None),
    (SAMPLE_KEY, EXT, (SLICE,), None),
    (SAMPLE_KEY, EXT, (SLICE_CACHED,), None),
    (SAMPLE_KEY, EXT, (REF_GATHER,), None),
]


# ---------------------------------------------------------------- the 64 streams
@dataclass
class Source:
    """The POOL distinct [64] steps; step p of env e in every peer is pool[p % POOL][e]."""

    steps: list[TensorDict]  # POOL TensorDicts of batch size [64]
    stacked: dict[str, torch.Tensor]  # field -> [POOL, 64, ...]

    def expected(self, env: torch.Tensor, position: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field of step ``position`` of env ``env`` (broadcast shapes)."""
        return {key: t[position % POOL, env] for key, t in self.stacked.items()}

    def stream(self, p0: int, n: int) -> dict[str, torch.Tensor]:
        """Steps p0 .. p0+n-1 of every env, as field -> [64, n, ...] (env-major)."""
        pos = torch.arange(p0, p0 + n) % POOL
        return {key: t[pos].transpose(0, 1).contiguous() for key, t in self.stacked.items()}


def make_source(seed: int = 0) -> Source:
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(POOL):
        step_type = torch.randint(0, 3, (NUM_ENVS,), generator=g, dtype=torch.int32)  # FIRST / MID / LAST
        steps.append(TensorDict({
            "obs": torch.randn(NUM_ENVS, OBS_DIM, generator=g),
            "reward": torch.randn(NUM_ENVS, generator=g),
            "discount": (step_type != 2).float(),
            "step_type": step_type,
        }, batch_size=[NUM_ENVS]))
    stacked = {key: torch.stack([s[key] for s in steps]) for key in FIELDS}
    return Source(steps, stacked)


class Feed:
    """Call i of one peer gets input step (start + i) % POOL; counts the steps written per env."""

    def __init__(self, pool: list[Any], start: int) -> None:
        self.pool, self.n = pool, start

    def __call__(self) -> Any:
        item = self.pool[self.n % POOL]
        self.n += 1
        return item


# ---------------------------------------------------------------- peers (filled once)
def build_ext(src: Source) -> EnvRingReplayBuffer:
    rb = EnvRingReplayBuffer(num_envs=NUM_ENVS, max_length=MAX_LENGTH, sampler=TrajectorySampler(BATCH_LENGTH))
    for p0 in range(0, MAX_LENGTH, FILL_CHUNK):
        n = min(FILL_CHUNK, MAX_LENGTH - p0)
        rb.extend(TensorDict(src.stream(p0, n), batch_size=[NUM_ENVS, n]))  # [E, n]: n steps of every env
    return rb


def build_slice_buffer(src: Source, cache_values: bool) -> TensorDictReplayBuffer:
    """Env e's stream is trajectory e, stored contiguously at rows [e * L, (e + 1) * L)."""
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(NUM_ENVS * MAX_LENGTH),
        sampler=SliceSampler(slice_len=BATCH_LENGTH, traj_key="traj", cache_values=cache_values),
        batch_size=BATCH * BATCH_LENGTH,
    )
    pos = torch.arange(MAX_LENGTH)
    for e in range(NUM_ENVS):
        data = src.expected(torch.tensor(e), pos)
        data["traj"] = torch.full((MAX_LENGTH,), e, dtype=torch.int64)
        rb.extend(TensorDict(data, batch_size=[MAX_LENGTH]))
    return rb


def cpprb_env_dict() -> dict[str, dict[str, Any]]:
    return {key: {"shape": shape or 1, "dtype": torch.empty((), dtype=dt).numpy().dtype}
            for key, (shape, dt) in FIELDS.items()}


def build_cpprb(src: Source) -> Any:
    """One ring of 64 x 16384 rows, filled step-major: row (p % L) * 64 + e holds step p of env e."""
    cb = cpprb.ReplayBuffer(NUM_ENVS * MAX_LENGTH, cpprb_env_dict())
    for p0 in range(0, MAX_LENGTH, FILL_CHUNK):
        n = min(FILL_CHUNK, MAX_LENGTH - p0)
        chunk = src.stream(p0, n)
        cb.add(**{k: v.transpose(0, 1).reshape(n * NUM_ENVS, *v.shape[2:]).numpy() for k, v in chunk.items()})
    return cb


def build_routing(src: Source) -> list[TensorDictReplayBuffer]:
    """What a TorchRL user does today: one buffer per env (TorchRL issue #3194)."""
    rbs = []
    pos = torch.arange(MAX_LENGTH)
    for e in range(NUM_ENVS):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(MAX_LENGTH))
        rb.extend(TensorDict(src.expected(torch.tensor(e), pos), batch_size=[MAX_LENGTH]))
        rbs.append(rb)
    return rbs


# ---------------------------------------------------------------- ops
def ext_sample(rb: EnvRingReplayBuffer) -> Callable[[], Any]:
    def op() -> Any:
        return rb.sample(BATCH)
    return op


def slice_sample(rb: TensorDictReplayBuffer) -> Callable[[], Any]:
    def op() -> Any:
        return rb.sample()
    return op


def ref_gather(leaves: list[torch.Tensor]) -> Callable[[], Any]:
    """Physical reference: random window starts, then index_select of the 2048 steps of every field
    from the rings' time-major rows (step p of env e at row (p % L) * E + e)."""
    offsets = torch.arange(BATCH_LENGTH)

    def op() -> Any:
        env = torch.randint(NUM_ENVS, (BATCH, 1))
        start = torch.randint(MAX_LENGTH - BATCH_LENGTH + 1, (BATCH, 1))
        flat = ((start + offsets) * NUM_ENVS + env).reshape(-1)
        return [t.index_select(0, flat) for t in leaves]
    return op


def ext_extend(rb: EnvRingReplayBuffer, feed: Feed, env_ids: torch.Tensor | None) -> Callable[[], Any]:
    if env_ids is None:
        def op() -> Any:
            return rb.extend(feed())
    else:
        def op() -> Any:
            return rb.extend(feed(), env_ids=env_ids)
    return op


def cpprb_add(cb: Any, feed: Feed) -> Callable[[], Any]:
    def op() -> Any:
        return cb.add(**feed())
    return op


def route_extend(rbs: list[TensorDictReplayBuffer], feed: Feed) -> Callable[[], Any]:
    def op() -> None:
        td = feed()
        for e, rb in enumerate(rbs):
            rb.extend(td[e:e + 1])
    return op


def route_add(rbs: list[TensorDictReplayBuffer], feed: Feed) -> Callable[[], Any]:
    def op() -> None:
        for rb, row in zip(rbs, feed().unbind(0)):
            rb.add(row)
    return op


def ref_copy(dest: list[torch.Tensor], feed: Feed) -> Callable[[], Any]:
    """Physical reference: each field's 64 rows index_copy_'d into preallocated [L * 64] tensors,
    at the rows the rings keep a step of every env (one block per slot)."""
    env_rows = torch.arange(NUM_ENVS)

    def op() -> None:
        slot = feed.n % MAX_LENGTH
        for d, s in zip(dest, feed()):
            d.index_copy_(0, env_rows + slot * NUM_ENVS, s)
    return op


# ---------------------------------------------------------------- checks
def stored_leaves(rb: EnvRingReplayBuffer) -> list[torch.Tensor]:
    """torchrl_ext's stored memory as [L * 64, ...] rows (the references' sources), in the rings'
    time-major order: step p of env e at row (p % L) * 64 + e."""
    return [rb.storage.flat_leaf(key) for key in FIELDS]


def fields_equal(got: TensorDictBase | dict, want: dict[str, torch.Tensor]) -> list[str]:
    """Fields of ``want`` that differ (values or dtype) in ``got``."""
    bad = []
    for key, value in want.items():
        g = got[key]
        if g.dtype != value.dtype or g.shape != value.shape or not torch.equal(g, value):
            bad.append(key)
    return bad


def check_ext_fill(ext: EnvRingReplayBuffer) -> Check:
    total, st = NUM_ENVS * MAX_LENGTH, ext.storage
    ok = (len(ext) == total and bool((st.current_size == MAX_LENGTH).all())
          and bool((st.current_pos == MAX_LENGTH).all()))
    return Check(f"{EXT} after the fill: sizes", ok,
                 f"len {len(ext):,} (expected {total:,}); current_size in [{int(st.current_size.min())}, "
                 f"{int(st.current_size.max())}], current_pos in [{int(st.current_pos.min())}, "
                 f"{int(st.current_pos.max())}] (expected {MAX_LENGTH:,} for all {NUM_ENVS} envs)")


def check_sizes(name: str, sizes: list[int], expected: int) -> Check:
    """Stored steps of one peer (one entry per buffer) after the fill."""
    ok = all(n == expected for n in sizes)
    what = f"len {sizes[0]:,}" if len(sizes) == 1 else f"{len(sizes)} buffers, len in [{min(sizes):,}, {max(sizes):,}]"
    each = " each" if len(sizes) > 1 else ""
    return Check(f"{name} after the fill: size", ok, f"{what} (expected {expected:,}{each})")


def check_ext_sample(rb: EnvRingReplayBuffer, src: Source, when: str) -> list[Check]:
    """Windows of 8 consecutive stored steps of one env, equal to the source; 4 windows per env."""
    batch = rb.sample(BATCH)
    name = f"{EXT} sample({BATCH}) {when}: windows"
    if tuple(batch.batch_size) != (BATCH, BATCH_LENGTH):
        return [Check(name, False, f"batch size {list(batch.batch_size)}, expected [{BATCH}, {BATCH_LENGTH}]")]
    st = rb.storage
    index = batch["index"]  # [B, T, 2]: (env, position) -- or (env, slot) in older versions of the ring
    env, where = index[..., 0], index[..., 1]
    # The sampler info (window start, env) is [B]; the buffer may broadcast it over T.
    start, env_ids = (t if t.ndim == 1 else t[:, 0] for t in (batch["positions"], batch["env_ids"]))
    one_env = bool((env == env[:, :1]).all()) and bool((env[:, 0] == env_ids).all())
    consecutive = bool((((where[:, 1:] - where[:, :-1]) % MAX_LENGTH) == 1).all())
    pos = start.unsqueeze(1) + torch.arange(BATCH_LENGTH)
    e0 = env[:, 0]
    stored = bool((start >= st.earliest_position()[e0]).all()) and bool((pos[:, -1] < st.current_pos[e0]).all())
    index_ok = bool((where == pos).all()) or bool((where == pos % MAX_LENGTH).all())
    bad = fields_equal(batch, src.expected(env, pos))
    per_env = torch.bincount(e0, minlength=NUM_ENVS)
    return [
        Check(name, one_env and consecutive and stored and index_ok,
              f"[{BATCH}, {BATCH_LENGTH}]; one env per window: {one_env}; consecutive steps: {consecutive}; "
              f"positions stored: {stored}; index == window positions: {index_ok}; window starts in "
              f"[{int(start.min()):,}, {int(start.max()):,}]"),
        Check(f"{EXT} sample({BATCH}) {when}: data == source steps", not bad,
              "every field equals step (start + t) of its env" if not bad else f"differs: {', '.join(bad)}"),
        Check(f"{EXT} sample({BATCH}) {when}: env balance", bool((per_env == BATCH // NUM_ENVS).all()),
              f"windows per env in [{int(per_env.min())}, {int(per_env.max())}] (expected {BATCH // NUM_ENVS})"),
    ]


def check_slice_sample(name: str, rb: TensorDictReplayBuffer, src: Source) -> list[Check]:
    """Slices of 8 consecutive storage rows of one trajectory (env), equal to the source."""
    batch = rb.sample()
    if tuple(batch.batch_size) != (BATCH * BATCH_LENGTH,):
        return [Check(f"{name}: slices", False, f"batch size {list(batch.batch_size)}")]
    b = batch.reshape(BATCH, BATCH_LENGTH)
    traj, row = b["traj"], b["index"].reshape(BATCH, BATCH_LENGTH)
    one_traj = bool((traj == traj[:, :1]).all())
    consecutive = bool((row[:, 1:] - row[:, :-1] == 1).all())
    inside = bool((row // MAX_LENGTH == traj).all())
    bad = fields_equal(b, src.expected(traj, row - traj * MAX_LENGTH))
    return [Check(f"{name}: slices", one_traj and consecutive and inside and not bad,
                  f"one trajectory per slice: {one_traj}; consecutive rows: {consecutive}; rows inside the "
                  f"env's stream: {inside}; data == source: {not bad}")]


def latest_positions(total: int) -> torch.Tensor:
    """For a ring of L slots after ``total`` steps: the step held by each slot ([L])."""
    slots = torch.arange(MAX_LENGTH)
    return total - MAX_LENGTH + (slots - (total - MAX_LENGTH)) % MAX_LENGTH


def check_ext_contents(rb: EnvRingReplayBuffer, feed: Feed, src: Source) -> Check:
    """Every env holds exactly its last L steps (read back through rb.read, in chunks)."""
    st, total = rb.storage, feed.n
    name = f"{EXT} after the timed inserts: contents"
    if not (bool((st.current_pos == total).all()) and bool((st.current_size == MAX_LENGTH).all())):
        return Check(name, False, f"current_pos {st.current_pos.unique().tolist()} (expected {total}), "
                     f"current_size {st.current_size.unique().tolist()}")
    env = torch.arange(NUM_ENVS).unsqueeze(1)
    bad: set[str] = set()
    for p0 in range(total - MAX_LENGTH, total, FILL_CHUNK):
        pos = torch.arange(p0, min(p0 + FILL_CHUNK, total)).unsqueeze(0)
        bad.update(fields_equal(rb.read(env, pos), src.expected(env, pos)))
    return Check(name, not bad, f"{total:,} steps per env written; positions [{total - MAX_LENGTH:,}, {total:,}) of "
                 f"all {NUM_ENVS} envs equal the source" if not bad else f"differs: {sorted(bad)}")


def check_cpprb_contents(cb: Any, feed: Feed, src: Source) -> Check:
    name = f"{CPPRB} after the timed inserts: contents"
    total = feed.n
    if cb.get_stored_size() != NUM_ENVS * MAX_LENGTH:
        return Check(name, False, f"stored size {cb.get_stored_size():,}")
    stored = cb.get_all_transitions()  # rows in storage order: row s * 64 + e = slot s of env e
    pos = latest_positions(total).unsqueeze(1)
    env = torch.arange(NUM_ENVS).unsqueeze(0)
    bad = []
    for key, want in src.expected(env, pos).items():  # [L, 64, ...]
        got = torch.from_numpy(stored[key]).reshape(want.shape)
        if got.dtype != want.dtype or not torch.equal(got, want):
            bad.append(key)
    return Check(name, not bad, f"stored size {NUM_ENVS * MAX_LENGTH:,}; every row holds the last write of its slot "
                 f"({total:,} steps per env)" if not bad else f"differs: {bad}")


def check_routing_contents(name: str, rbs: list[TensorDictReplayBuffer], feed: Feed, src: Source) -> Check:
    total, pos = feed.n, latest_positions(feed.n)
    bad: set[str] = set()
    sizes = {len(rb) for rb in rbs}
    for e, rb in enumerate(rbs):
        stored = rb.storage._storage  # slot j of env e's buffer holds its latest step p with p % L == j
        bad.update(fields_equal(stored, src.expected(torch.tensor(e), pos)))
    ok = not bad and sizes == {MAX_LENGTH}
    return Check(f"{name} after the timed inserts: contents", ok,
                 f"sizes {sorted(sizes)}; {total:,} steps per env; every env's ring equals the source"
                 if ok else f"sizes {sorted(sizes)}; differs: {sorted(bad)}")


# ---------------------------------------------------------------- reporting
def fmt_rate(x: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.0f}"


def report_case(title: str, impls: list[Impl], baseline: str, steps: int, unit: str, bg: float,
                waited: float, pre: float, args: argparse.Namespace) -> dict[str, Any]:
    base_rows = [i for i in impls if i.name == baseline]
    base = statistics.median(base_rows[0].per_rep) if base_rows else None
    speed = f" Speed = `{baseline}` median / this median (>1 = faster)." if base else ""
    print(f"## {title}\n\n{bg_note(bg, waited, pre, args)}.{speed} MB/s = {unit} x {STEP_BYTES} B.\n")
    speed_head = f" speed vs {baseline} |" if base else ""
    print(f"| implementation | median us/call | min | max | {unit}/s | MB/s |{speed_head} k |\n"
          f"|---|---:|---:|---:|---:|---:|{'---:|' if base else ''}---:|")
    rows = {}
    for impl in impls:
        med = statistics.median(impl.per_rep)
        r = rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                               "max_ms": max(impl.per_rep) * 1e3, "steps_per_s": steps / med,
                               "mb_per_s": steps * STEP_BYTES / med / 1e6, "k": impl.k,
                               "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
        col = ""
        if base:
            r["speed_vs_baseline"] = base / med
            col = f" {base / med:.2f}x |"
        print(f"| {impl.label} | {med * 1e6:,.1f} | {min(impl.per_rep) * 1e6:,.1f} | {max(impl.per_rep) * 1e6:,.1f} | "
              f"{fmt_rate(steps / med)} | {steps * STEP_BYTES / med / 1e6:,.0f} |{col} {impl.k} |")
    print()
    return rows


def report_targets(results: dict[str, dict[str, Any]], checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = baseline median time / torchrl_ext median time per call (same run, same bytes "
          "per call, so also the throughput ratio); paired = range over repetitions of (baseline rep time / "
          "torchrl_ext rep time), same round-robin round. Where two variants of a TorchRL peer were timed, the "
          "faster one (lower median) is the baseline.\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    out = []
    for key, impl, baselines, target in TARGETS:
        if key not in results:
            continue
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        present = [b for b in baselines if b in rows]
        baseline = min(present, key=lambda b: rows[b]["median_ms"]) if present else baselines[0]
        label = f"{impl} vs {baseline}"
        if len(baselines) > 1:
            label += " (faster of: " + ", ".join(baselines) + ")"
        out.append(target_row(key, label, rows, impl, baseline, target, bg, checks_ok))
    print()
    return out


# ---------------------------------------------------------------- diagnostics


# ---------------------------------------------------------------- memory

# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: same sizes, 3 reps of >= 0.05 s, wait <= 5 s", min_rep_default=0.4)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print cProfile's top N functions of torchrl_ext's extend and sample")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    # The objects created by the imports make every gc.collect() slow; the harness collects
    # before each repetition (untimed). Everything built from here on stays collectable.
    gc.freeze()
    # TorchRL logs "Initialized LazyTensorStorage ..." to stdout, which would break the markdown.
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict"), "numpy": np.__version__}
    if cpprb is not None:
        extra["cpprb"] = version("cpprb")
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print(f"# torchrl_ext per-env ring buffer benchmark\n\n{environment_line(started, load_start, a, extra)}\n")
    notes = [f"Experience: {NUM_ENVS} envs x obs f32[{OBS_DIM}] + reward f32 + discount f32 + step_type int32 "
             f"({STEP_BYTES} B per step), {MAX_LENGTH:,} steps per env ({NUM_ENVS * MAX_LENGTH:,} in all)."]
    if cpprb is None:
        notes.append("**cpprb is not installed: its rows are skipped and its target is not measured.** "
                     "Install the bench extra: `pip install -e .[bench]`.")
    if a.quick:
        notes.append("**--quick**: 3 repetitions of >= 0.05 s: a smoke run, not a measurement.")
    for n in notes:
        print(n + "\n")

    results: dict[str, dict[str, Any]] = {}
    all_checks: list[Check] = []
    diagnostics: dict[str, list[dict[str, Any]]] = {}

    def run(key: str, title: str, impls: list[Impl], baseline: str, steps: int, unit: str) -> None:
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        rows = report_case(title, impls, baseline, steps, unit, bg, waited, pre, a)
        results[key] = {"title": title, "baseline": baseline, "bg_load": bg, "waited_s": waited,
                        "steps_per_call": steps, "step_bytes": STEP_BYTES, "impls": rows}

    def checked(checks: list[Check]) -> None:
        report_checks(checks)
        all_checks.extend(checks)

    src = make_source()
    t0 = time.perf_counter()
    ext = build_ext(src)
    print(f"Filled torchrl_ext in {time.perf_counter() - t0:.1f} s (16 extends of [64, 1024]).\n")
    fill_checks = [check_ext_fill(ext)]
    diag_reps, diag_rep_s = (3, 0.05) if a.quick else (5, 0.1)

    # ---- get_batch: sample 256 windows of 8 steps (all peers hold steps 0 .. L-1 of every env)
    if selected(a, SAMPLE_KEY):
        t0 = time.perf_counter()
        slices = {SLICE: build_slice_buffer(src, cache_values=False),
                  SLICE_CACHED: build_slice_buffer(src, cache_values=True)}
        print(f"Filled the two TorchRL SliceSampler buffers in {time.perf_counter() - t0:.1f} s.\n")
        checked(fill_checks + [check_sizes(name, [len(rb)], NUM_ENVS * MAX_LENGTH) for name, rb in slices.items()])
        fill_checks = []
        impls = [
            Impl(SLICE, f"torchrl TensorDictReplayBuffer(LazyTensorStorage({NUM_ENVS * MAX_LENGTH:,}), "
                        f"SliceSampler(slice_len={BATCH_LENGTH}, traj_key=\"traj\"), batch_size={BATCH * BATCH_LENGTH})"
                        ".sample() -> [2048]", slice_sample(slices[SLICE])),
            Impl(SLICE_CACHED, "the same with SliceSampler(..., cache_values=True)",
                 slice_sample(slices[SLICE_CACHED])),
            Impl(EXT, f"torchrl_ext EnvRingReplayBuffer(sampler=TrajectorySampler({BATCH_LENGTH}))"
                      f".sample({BATCH}) -> [{BATCH}, {BATCH_LENGTH}]", ext_sample(ext)),
            Impl(REF_GATHER, "reference: random windows + index_select of the 2,048 steps of the 4 fields "
                             "(new tensors)", ref_gather(stored_leaves(ext))),
        ]
        run(SAMPLE_KEY, f"get_batch: sample {BATCH} windows of {BATCH_LENGTH} steps from a full "
                        f"{NUM_ENVS} x {MAX_LENGTH:,} buffer", impls, SLICE_CACHED, BATCH * BATCH_LENGTH, "steps")
        checked(check_ext_sample(ext, src, "on the filled buffer") + [c for name, rb in slices.items()
                                              for c in check_slice_sample(name, rb, src)])
        # Where the time goes (after the checks: these pieces do not change any contents).
        st, smp, cached = ext.storage, ext._sampler, slices[SLICE_CACHED]
        index, _ = smp.sample(st, BATCH)
        flat = st.flat_index(index[0], index[1]).reshape(-1)
        leaves = stored_leaves(ext)
        slice_index, _ = cached._sampler.sample(cached.storage, BATCH * BATCH_LENGTH)
        diagnostics[SAMPLE_KEY] = diagnose(f"sample({BATCH}) x {BATCH_LENGTH} steps", [
            ("torchrl_ext rb.sample(256), end to end", ext_sample(ext)),
            ("  TrajectorySampler.sample(storage, 256) (index only)", lambda: smp.sample(st, BATCH)),
            ("  EnvRingStorage.get((env, position)) (fixed index)", lambda: st.get(index)),
            ("  index_select of the 4 fields (fixed flat index), new tensors",
             lambda: [t.index_select(0, flat) for t in leaves]),
            ("torchrl SliceSampler(cache_values=True) rb.sample(), end to end", slice_sample(cached)),
            ("  SliceSampler.sample(storage, 2048) (index only)",
             lambda: cached._sampler.sample(cached.storage, BATCH * BATCH_LENGTH)),
            ("  LazyTensorStorage.get(index) (fixed index)", lambda: cached.storage.get(slice_index)),
        ], diag_reps, diag_rep_s)
        if a.profile:
            profile("torchrl_ext rb.sample(256)", ext_sample(ext), 300, a.profile)
        del slices, cached, impls
        gc.collect()
        print(f"Freed the SliceSampler buffers. RSS {proc_status('VmRSS') / GiB:.2f} GiB.\n")

    # ---- add_batch: one [64] step into the full buffers
    if selected(a, INSERT_KEY):
        t0 = time.perf_counter()
        cb = build_cpprb(src) if cpprb is not None else None
        routes = {ROUTE_EXTEND: build_routing(src), ROUTE_ADD: build_routing(src)}
        ref_dest = [t.clone() for t in stored_leaves(ext)]
        print(f"Filled {'cpprb, ' if cb is not None else ''}the 2 x 64 TorchRL buffers and the reference tensors in "
              f"{time.perf_counter() - t0:.1f} s. RSS {proc_status('VmRSS') / GiB:.2f} GiB.\n")
        fill_checks += [check_sizes(name, [len(rb) for rb in rbs], MAX_LENGTH) for name, rbs in routes.items()]
        if cb is not None:
            fill_checks.append(check_sizes(CPPRB, [cb.get_stored_size()], NUM_ENVS * MAX_LENGTH))
        checked(fill_checks)
        feeds = {name: Feed(src.steps, MAX_LENGTH) for name in (EXT, ROUTE_EXTEND, ROUTE_ADD)}
        feeds[REF_COPY] = Feed([[s[k] for k in FIELDS] for s in src.steps], MAX_LENGTH)
        # ext with and without env_ids write the same buffer, so they share one feed.
        env_ids = torch.arange(NUM_ENVS)
        impls = []
        if cb is not None:
            feeds[CPPRB] = Feed([{k: s[k].numpy() for k in FIELDS} for s in src.steps], MAX_LENGTH)
            impls.append(Impl(CPPRB, f"cpprb ReplayBuffer({NUM_ENVS * MAX_LENGTH:,}, env_dict).add(**ndarrays[64])",
                              cpprb_add(cb, feeds[CPPRB])))
        impls += [
            Impl(ROUTE_EXTEND, "torchrl 64 x TensorDictReplayBuffer(LazyTensorStorage(16384)): "
                               "for e: rbs[e].extend(td[e:e+1])",
                 route_extend(routes[ROUTE_EXTEND], feeds[ROUTE_EXTEND])),
            Impl(ROUTE_ADD, "torchrl 64 x TensorDictReplayBuffer(LazyTensorStorage(16384)): "
                            "for rb, row in zip(rbs, td.unbind(0)): rb.add(row)",
                 route_add(routes[ROUTE_ADD], feeds[ROUTE_ADD])),
            Impl(EXT, "torchrl_ext EnvRingReplayBuffer.extend(td[64], env_ids=arange(64))",
                 ext_extend(ext, feeds[EXT], env_ids)),
            Impl(EXT_NOIDS, "torchrl_ext EnvRingReplayBuffer.extend(td[64]) (all envs in order, no env_ids)",
                 ext_extend(ext, feeds[EXT], None)),
            Impl(REF_COPY, "reference: index_copy_ of the 64 rows of the 4 fields into preallocated [16384 x 64] "
                           "tensors (the rings' time-major layout)", ref_copy(ref_dest, feeds[REF_COPY])),
        ]
        run(INSERT_KEY, f"add_batch: one step of {NUM_ENVS} envs ([64] TensorDict, {NUM_ENVS * STEP_BYTES:,} B) "
                        f"into full {NUM_ENVS} x {MAX_LENGTH:,} buffers (ring overwrite)",
            impls, CPPRB if cb is not None else ROUTE_ADD, NUM_ENVS, "steps")
        # The rings have wrapped by now (positions beyond max_length): sample once more.
        checks = [check_ext_contents(ext, feeds[EXT], src)] + check_ext_sample(ext, src, "after the inserts")
        if cb is not None:
            checks.append(check_cpprb_contents(cb, feeds[CPPRB], src))
        checks += [check_routing_contents(name, rbs, feeds[name], src) for name, rbs in routes.items()]
        unchanged = all(set(s.keys()) == set(FIELDS) for s in src.steps)
        checks.append(Check("input steps unchanged by the peers", unchanged,
                            f"keys {sorted(src.steps[0].keys())}"))
        checked(checks)
        del routes, ref_dest, impls
        gc.collect()
        # Where the time goes (after the checks: these pieces write the ring out of sequence).
        st, writer, td = ext.storage, ext._writer, src.steps[0]
        slot = st.current_pos % MAX_LENGTH  # a stored step's (env, position) in any version of the ring
        leaves, ref_rows = stored_leaves(ext), st.flat_index(env_ids, slot)
        values = [td[k] for k in FIELDS]
        pieces = [
            ("torchrl_ext rb.extend(td, env_ids=arange(64)), end to end", lambda: ext.extend(td, env_ids=env_ids)),
            ("  rb.extend(td) (no env_ids: no copy of td, no env_id entry)", lambda: ext.extend(td)),
            ("  EnvRingWriter.extend(td) (no ReplayBuffer.extend wrapper)", lambda: writer.extend(td)),
            ("  EnvRingStorage.set((env, position), td) (checks + index_copy_ per field)",
             lambda: st.set((env_ids, slot), td)),
            ("  EnvRingStorage.advance(env_ids, 1) (counters)", lambda: st.advance(env_ids, 1)),
            ("  index_copy_ of the 4 fields (the bytes)",
             lambda: [d.index_copy_(0, ref_rows, v) for d, v in zip(leaves, values)]),
        ]
        if cb is not None:
            arrays = {k: td[k].numpy() for k in FIELDS}
            pieces.append(("cpprb rb.add(**ndarrays[64])", lambda: cb.add(**arrays)))
        diagnostics[INSERT_KEY] = diagnose("extend of one [64] step", pieces, diag_reps, diag_rep_s)
        if a.profile:
            profile("torchrl_ext rb.extend(td, env_ids=arange(64))", lambda: ext.extend(td, env_ids=env_ids),
                    3000, a.profile)
        del cb
        gc.collect()

    checks_ok = all(c.ok for c in all_checks)
    targets = report_targets(results, checks_ok)
    load_end, peak, wall = loadavg(), proc_status("VmHWM"), time.perf_counter() - wall0
    print(f"Peak RSS (VmHWM) {peak / GiB:.2f} GiB. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(num_envs=NUM_ENVS, max_length=MAX_LENGTH, step_bytes=STEP_BYTES, quick=a.quick,
                    wall_s=wall, peak_rss=peak, notes=notes)
        payload = {"meta": meta, "cases": results, "diagnostics": diagnostics, "targets": targets}
        write_results(a.json, payload, all_checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
