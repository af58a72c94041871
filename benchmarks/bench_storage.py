"""Side-by-side CPU benchmark of torchrl_ext's FastTensorStorage against TorchRL, cpprb and SB3.

Usage::

    python benchmarks/bench_storage.py                  # full run (about 3 min on a quiet machine; ~18 GB of RAM)
    python benchmarks/bench_storage.py --quick          # smoke run: img capacity 10,000, 3 short repetitions
    python benchmarks/bench_storage.py --only img --json results.json --no-wait

Everything runs in one process. Two transition schemas (the peer baselines' B1/B2 cases):
vec (obs f32[64], next obs f32[64], action f32[4], reward f32[1], done bool[1]; 1,000,000
capacity) and img (obs u8[84,84,4], next obs u8[84,84,4], action i64[1], reward, done; 100,000
capacity). Per schema, every peer is filled to capacity with the same 1,000-row chunks, then
three cases are timed: insert (extend / add of 1,000 rows on the FULL buffer: steady-state
ring overwrite), uniform sample(256) and sample(4096). The peers: TorchRL
``TensorDictReplayBuffer(storage=LazyTensorStorage(C))``, torchrl_ext
``torchrl_ext.replay_buffers.TensorDictReplayBuffer(storage=FastTensorStorage(C))`` (TorchRL's default writer and
RandomSampler in both), cpprb ``ReplayBuffer(C, env_dict)``, SB3 ``ReplayBuffer(n_envs=1000)``
(vec insert only), and physical references: a per-field slice ``copy_`` of the 1,000 rows into
preallocated tensors (insert), and ``torch.randint`` + per-field ``index_select`` of B rows of
preallocated tensors into new tensors and into preallocated outputs (``out=``) (sample: the
gather bandwidth). The timing method is bench_prioritized.py's (see _harness.py): warm-up, k
calls per repetition, repetitions interleaved round-robin with the GC off, torch at 1 thread,
background load measured and waited out before each case.

The schemas are built and freed one at a time: the img buffers take 5.6 GB each (three of them
plus inputs: about 18 GB). If /proc/meminfo's MemAvailable is too small for 100,000, the img
capacity drops to 50,000 and the report says so.

Prints markdown tables, a diagnostic table (time and minor page faults per call for the img
sample path) and a Targets table. Exits with 1 only if a correctness check fails (torchrl_ext's
sampled rows equal its stored rows and TorchRL's; after the same writes, torchrl_ext's and
TorchRL's storages hold identical contents); a missed speed target is reported, not an error.
Without cpprb / stable-baselines3 (``pip install -e .[bench]``) their rows are skipped and
their targets reported as not measured.
"""
from __future__ import annotations

import argparse
import gc
import logging
import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from _harness import Impl as _HarnessImpl
from _harness import write_results
from _harness import (selected, proc_status, mem_available, BgLoad, Check, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, report_checks, target_row, quiet_before_case, run_interleaved, utc_now)
from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer
from torchrl_ext.storages import FastTensorStorage

try:
    import cpprb
except ImportError:  # optional peer: the bench extra installs it
    cpprb = None
try:
    import gymnasium
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
except ImportError:  # optional peer: the bench extra installs it
    SB3ReplayBuffer = None

CHUNK = 1_000  # rows per insert call
POOL = 3  # distinct input chunks, cycled; coprime with capacity / CHUNK (see Feed)
BATCH_SIZES = (256, 4096)
VEC_CAPACITY, IMG_CAPACITY, IMG_CAPACITY_LOW, IMG_CAPACITY_QUICK = 1_000_000, 100_000, 50_000, 10_000
IMG_SHAPE = (84, 84, 4)
OBS_DIM, ACT_DIM = 64, 4
GiB = 2**30

# Implementation keys (used in the tables, the targets and the JSON file).
TRL, EXT, CPPRB, SB3 = "torchrl", "torchrl_ext", "cpprb", "sb3"
REF_COPY, REF_NEW, REF_OUT = "ref slice copy", "ref index_select new", "ref index_select out="
# (case key, implementation, baseline, minimum ratio baseline time / implementation time; None = info)
TARGETS = [
    ("img_insert", EXT, CPPRB, 1.0),
    ("img_insert", EXT, TRL, 10.0),
    ("img_sample_B256", EXT, CPPRB, 1.0),
    ("img_sample_B4096", EXT, REF_NEW, 0.9),  # same bytes per sample: time ratio == bytes/s ratio
    ("img_sample_B4096", EXT, REF_OUT, None),
    ("vec_insert", EXT, CPPRB, 1.0),
    ("vec_sample_B256", EXT, CPPRB, 1.0),
    ("vec_insert", EXT, TRL, None),
    ("vec_sample_B256", EXT, TRL, None),
    ("vec_sample_B4096", EXT, CPPRB, None),
    ("vec_sample_B4096", EXT, TRL, None),
    ("img_sample_B256", EXT, TRL, None),
    ("img_sample_B4096", EXT, CPPRB, None),
    ("img_sample_B4096", EXT, TRL, None),
]


@dataclass
class Impl(_HarnessImpl):
    fill_s: float | None = None  # insert cases: seconds of the cold fill through the same call
    fill_items: int = 0  # insert cases: rows written by that fill


@dataclass
class Schema:
    name: str  # "vec" | "img"
    capacity: int
    fields: dict[str, tuple[tuple[int, ...], torch.dtype]]  # torch key -> (item shape, dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one transition (obs, next obs, action, reward, done), as every peer returns it."""
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                   for shape, dtype in self.fields.values())


def vec_schema(capacity: int) -> Schema:
    return Schema("vec", capacity, {"obs": ((OBS_DIM,), torch.float32), ("next", "obs"): ((OBS_DIM,), torch.float32),
                                    "action": ((ACT_DIM,), torch.float32), "reward": ((1,), torch.float32),
                                    "done": ((1,), torch.bool)})


def img_schema(capacity: int) -> Schema:
    return Schema("img", capacity, {"obs": (IMG_SHAPE, torch.uint8), ("next", "obs"): (IMG_SHAPE, torch.uint8),
                                    "action": ((1,), torch.int64), "reward": ((1,), torch.float32),
                                    "done": ((1,), torch.bool)})


# ---------------------------------------------------------------- inputs
@dataclass
class Inputs:
    """POOL chunks of CHUNK rows, in every peer's input format, built once outside timing."""

    tds: list[TensorDict]
    cpprb: list[dict[str, np.ndarray]]  # numpy views of the same memory; done as float32
    sb3: list[tuple] | None
    leaves: list[list[torch.Tensor]]  # per chunk, the schema fields in Schema.fields order


def make_chunk(schema: Schema, g: torch.Generator) -> TensorDict:
    data = {}
    for key, (shape, dtype) in schema.fields.items():
        size = (CHUNK, *shape)
        if dtype is torch.uint8:
            data[key] = torch.randint(0, 256, size, dtype=dtype, generator=g)
        elif dtype is torch.int64:
            data[key] = torch.randint(0, 18, size, dtype=dtype, generator=g)
        elif dtype is torch.bool:
            data[key] = torch.rand(size, generator=g) < 0.01
        else:
            data[key] = torch.randn(size, generator=g)
    td = TensorDict({}, batch_size=[CHUNK])
    for key, value in data.items():
        td.set(key, value)
    return td


def make_inputs(schema: Schema, with_sb3: bool, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    tds = [make_chunk(schema, g) for _ in range(POOL)]
    cb, sb, leaves = [], [], []
    for td in tds:
        cb.append({"obs": td["obs"].numpy(), "next_obs": td["next", "obs"].numpy(), "act": td["action"].numpy(),
                   "rew": td["reward"].numpy(), "done": td["done"].numpy().astype(np.float32)})
        if with_sb3:
            sb.append((td["obs"].numpy(), td["next", "obs"].numpy(), td["action"].numpy(),
                       td["reward"].numpy()[:, 0], td["done"].numpy()[:, 0].astype(np.float32),
                       [{} for _ in range(CHUNK)]))
        leaves.append([td[key] for key in schema.fields])
    return Inputs(tds, cb, sb if with_sb3 else None, leaves)


class Feed:
    """Call i of one peer gets input chunk i % POOL; counts the calls (fill included).

    With POOL coprime with capacity / CHUNK the stored contents depend on the number of calls
    (modulo POOL x capacity / CHUNK), so two peers with the same call count made the same writes.
    """

    def __init__(self, pool: list[Any]) -> None:
        self.pool, self.n = pool, 0

    def __call__(self) -> Any:
        item = self.pool[self.n % POOL]
        self.n += 1
        return item


# ---------------------------------------------------------------- peers
@dataclass
class Peers:
    """Every peer of one schema, filled to capacity, with the counters of its insert calls."""

    schema: Schema
    inputs: Inputs
    torchrl: TensorDictReplayBuffer
    ext: TensorDictReplayBuffer
    cpprb: Any | None
    sb3: Any | None
    ref_dest: list[torch.Tensor]  # slice-copy reference destination (a smaller ring)
    feeds: dict[str, Feed]
    inserts: dict[str, Callable[[], Any]]
    fill_s: dict[str, float]


def torch_insert(rb: TensorDictReplayBuffer, feed: Feed) -> Callable[[], Any]:
    def op() -> Any:
        return rb.extend(feed())
    return op


def cpprb_insert(rb: Any, feed: Feed) -> Callable[[], Any]:
    def op() -> Any:
        return rb.add(**feed())
    return op


def sb3_insert(rb: Any, feed: Feed) -> Callable[[], Any]:
    def op() -> Any:
        return rb.add(*feed())
    return op


def copy_insert(dest: list[torch.Tensor], feed: Feed) -> Callable[[], Any]:
    """Reference: the 1,000 rows of every field copied as one slice into preallocated tensors."""
    rows = dest[0].shape[0]

    def op() -> Any:
        start = (feed.n * CHUNK) % rows
        for d, s in zip(dest, feed()):
            d[start:start + CHUNK].copy_(s)
    return op


def new_peer(name: str, schema: Schema, inputs: Inputs) -> tuple[Any, Feed, Callable[[], Any]]:
    """An empty buffer of peer ``name`` (TRL, EXT, CPPRB or SB3) for ``schema``, its input feed and insert op."""
    C = schema.capacity
    if name in (TRL, EXT):
        rb = (TensorDictReplayBuffer(storage=LazyTensorStorage(C)) if name == TRL
              else ExtTensorDictReplayBuffer(storage=FastTensorStorage(C)))
        feed = Feed(inputs.tds)
        return rb, feed, torch_insert(rb, feed)
    if name == CPPRB:
        def spec(key: Any) -> dict[str, Any]:
            shape, dtype = schema.fields[key]
            return {"shape": shape, "dtype": torch.empty((), dtype=dtype).numpy().dtype}
        # cpprb keeps its native dtypes: rew and done are float32 [N, 1].
        rb = cpprb.ReplayBuffer(C, {"obs": spec("obs"), "next_obs": spec("obs"), "act": spec("action"),
                                    "rew": {}, "done": {}})
        feed = Feed(inputs.cpprb)
        return rb, feed, cpprb_insert(rb, feed)
    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    act_space = gymnasium.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    # One add() stores one step of 1000 envs (the baselines' vectorised SB3 setup).
    rb = SB3ReplayBuffer(C, obs_space, act_space, device="cpu", n_envs=CHUNK)
    feed = Feed(inputs.sb3)
    return rb, feed, sb3_insert(rb, feed)


def build_peers(schema: Schema, with_sb3: bool, ref_rows: int) -> Peers:
    inputs = make_inputs(schema, with_sb3)
    C = schema.capacity
    names = [TRL, EXT] + ([CPPRB] if cpprb is not None else []) + ([SB3] if with_sb3 else [])
    buffers, feeds, inserts = {}, {}, {}
    for name in names:
        buffers[name], feeds[name], inserts[name] = new_peer(name, schema, inputs)
    trl, ext, cb, sb = buffers[TRL], buffers[EXT], buffers.get(CPPRB), buffers.get(SB3)
    ref_dest = [torch.empty((ref_rows, *shape), dtype=dtype) for shape, dtype in schema.fields.values()]
    feeds[REF_COPY] = Feed(inputs.leaves)
    inserts[REF_COPY] = copy_insert(ref_dest, feeds[REF_COPY])

    # Cold fill through the same call (first touch of every page included), one peer at a time.
    fill_s = {}
    for name, op in inserts.items():
        calls = (ref_rows if name == REF_COPY else C) // CHUNK
        t0 = time.perf_counter()
        for _ in range(calls):
            op()
        fill_s[name] = time.perf_counter() - t0
    assert len(trl) == len(ext) == C
    if cb is not None:
        assert cb.get_stored_size() == C
    if sb is not None:
        assert sb.full
    return Peers(schema, inputs, trl, ext, cb, sb, ref_dest, feeds, inserts, fill_s)


# ---------------------------------------------------------------- sample ops
def stored_leaves(rb: TensorDictReplayBuffer, schema: Schema) -> list[torch.Tensor]:
    """The storage's preallocated tensors of the schema fields (the gather references' sources)."""
    return [rb.storage._storage.get(key) for key in schema.fields]


def torch_sample(rb: TensorDictReplayBuffer, batch_size: int) -> Callable[[], Any]:
    def op() -> Any:
        return rb.sample(batch_size)
    return op


def cpprb_sample(rb: Any, batch_size: int) -> Callable[[], Any]:
    def op() -> Any:
        return rb.sample(batch_size)
    return op


def ref_gather_new(src: list[torch.Tensor], batch_size: int) -> Callable[[], Any]:
    high = src[0].shape[0]

    def op() -> Any:
        index = torch.randint(high, (batch_size,))
        return [t.index_select(0, index) for t in src]
    return op


def ref_gather_out(src: list[torch.Tensor], batch_size: int) -> Callable[[], Any]:
    high = src[0].shape[0]
    outs = [torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype) for t in src]

    def op() -> Any:
        index = torch.randint(high, (batch_size,))
        for t, o in zip(src, outs):
            torch.index_select(t, 0, index, out=o)
        return outs
    return op


# ---------------------------------------------------------------- checks
def leaf_items(td: TensorDictBase) -> list[tuple[Any, torch.Tensor]]:
    return list(td.items(include_nested=True, leaves_only=True))


def check_same_writes(p: Peers) -> list[Check]:
    """Brings torchrl_ext to torchrl's call count (mod POOL x capacity / CHUNK), then compares storages.

    The timed insert case gives each peer its own number of calls; the extra calls are
    untimed extends of torchrl_ext through the same API, continuing its own input sequence.
    """
    period = POOL * (p.schema.capacity // CHUNK)
    extra = (p.feeds[TRL].n - p.feeds[EXT].n) % period
    for _ in range(extra):
        p.inserts[EXT]()
    name = f"{p.schema.name}: torchrl_ext storage == torchrl storage after the same writes"
    detail = (f"{p.feeds[TRL].n} torchrl extends, {p.feeds[EXT].n} torchrl_ext extends "
              f"({extra} untimed ones added to match modulo {period})")
    trl_st, ext_st = p.torchrl.storage, p.ext.storage
    if len(trl_st) != len(ext_st) or p.torchrl._writer._cursor != p.ext._writer._cursor:
        return [Check(name, False, detail + f"; len {len(trl_st)} vs {len(ext_st)}, cursor "
                      f"{p.torchrl._writer._cursor} vs {p.ext._writer._cursor}")]
    a, b = dict(leaf_items(trl_st._storage)), dict(leaf_items(ext_st._storage))
    if a.keys() != b.keys():
        return [Check(name, False, detail + f"; keys {sorted(map(str, a))} vs {sorted(map(str, b))}")]
    bad = [str(key) for key in a if a[key].dtype != b[key].dtype or not torch.equal(a[key], b[key])]
    return [Check(name, not bad, detail + ("; all fields equal (incl. index), same cursor" if not bad
                                           else f"; differs: {', '.join(bad)}"))]


def check_sample(p: Peers, batch_size: int) -> list[Check]:
    """torchrl_ext's sample rows equal its stored rows (and torchrl's) at the sampled index."""
    batch = p.ext.sample(batch_size)
    index = batch["index"]
    C = p.schema.capacity
    name = f"{p.schema.name} B={batch_size}: torchrl_ext sample == stored rows at its index"
    if index.shape != (batch_size,) or index.min() < 0 or index.max() >= C:
        return [Check(name, False, f"index shape {tuple(index.shape)}, range [{index.min()}, {index.max()}]")]
    bad = []
    for source, st in (("torchrl_ext", p.ext.storage), ("torchrl", p.torchrl.storage)):
        for key, stored in leaf_items(st._storage):
            got = batch.get(key)
            if got.dtype != stored.dtype or not torch.equal(got, stored[index]):
                bad.append(f"{key} vs {source}")
    missing = [str(k) for k in p.schema.fields if k not in batch.keys(include_nested=True)]
    ok = not bad and not missing and batch.batch_size == torch.Size([batch_size])
    detail = (f"{len(leaf_items(p.ext.storage._storage))} fields equal to torchrl_ext's and torchrl's stored rows"
              if ok else f"differs: {', '.join(bad)}; missing: {missing}")
    return [Check(name, ok, detail)]


# ---------------------------------------------------------------- diagnostics
def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def diagnose(p: Peers, batch_size: int, budget_s: float) -> list[dict[str, Any]]:
    """Time and minor page faults per call of the pieces of the sample path (not interleaved)."""
    ext, src = p.ext, stored_leaves(p.ext, p.schema)
    fixed_index = torch.randint(p.schema.capacity, (batch_size,))
    outs = [torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype) for t in src]
    pieces: list[tuple[str, Callable[[], Any]]] = [
        ("torchrl_ext rb.sample(B), end to end", torch_sample(ext, batch_size)),
        ("  RandomSampler.sample (torch.randint)", lambda: ext._sampler.sample(ext.storage, batch_size)),
        ("  FastTensorStorage.get(index) (aminmax + gather_rows)", lambda: ext.storage.get(fixed_index)),
        ("  index_select of the 6 stored fields (incl. index), new outputs",
         lambda: [t.index_select(0, fixed_index) for _, t in leaf_items(ext.storage._storage)]),
        ("index_select of the 5 schema fields, new outputs", lambda: [t.index_select(0, fixed_index) for t in src]),
        ("index_select of the 5 schema fields, out= (preallocated)",
         lambda: [torch.index_select(t, 0, fixed_index, out=o) for t, o in zip(src, outs)]),
        ("torch.empty of the 5 output tensors + first write of every page",
         lambda: [torch.empty_like(o).fill_(0) for o in outs]),
        ("torchrl rb.sample(B)", torch_sample(p.torchrl, batch_size)),
    ]
    if p.cpprb is not None:
        pieces.append(("cpprb rb.sample(B) (numpy fancy indexing, new arrays)", cpprb_sample(p.cpprb, batch_size)))
    rows = []
    for label, fn in pieces:
        fn()
        fn()
        gc.collect()
        gc.disable()
        n, t_total, f_total = 0, 0.0, 0
        while n < 3 or t_total < budget_s:
            f0, t0 = minflt(), time.perf_counter()
            fn()
            t_total += time.perf_counter() - t0
            f_total += minflt() - f0
            n += 1
        gc.enable()
        ms = t_total / n * 1e3
        rows.append({"piece": label, "ms": ms, "minflt": f_total / n, "calls": n,
                     "gb_s": batch_size * p.schema.row_bytes / (ms * 1e-3) / 1e9})
    return rows


def report_diagnostics(rows: list[dict[str, Any]], schema: Schema, batch_size: int) -> None:
    print(f"### Diagnostic: {schema.name} sample({batch_size}), where the time goes\n\n"
          "Each piece called alone (not interleaved; mean over >= 3 calls), with the process's minor page "
          "faults per call (`getrusage`). GB/s = B x schema bytes / time, for comparison only. Indented rows "
          "are parts of the torchrl_ext call above them; the gather pieces use one fixed index.\n")
    print("| piece | ms/call | minor faults/call | GB/s (B x schema bytes) | calls |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['piece']} | {r['ms']:.3f} | {r['minflt']:,.0f} | {r['gb_s']:.2f} | {r['calls']} |")
    print()


# ---------------------------------------------------------------- cases
def insert_case(p: Peers) -> tuple[str, str, list[Impl]]:
    labels = {
        TRL: "torchrl TensorDictReplayBuffer(LazyTensorStorage): rb.extend(TensorDict[1000])",
        EXT: "torchrl_ext TensorDictReplayBuffer(FastTensorStorage): rb.extend(TensorDict[1000])",
        CPPRB: "cpprb ReplayBuffer: rb.add(**ndarrays[1000])",
        SB3: "SB3 ReplayBuffer(n_envs=1000): 1 add() of 1000 envs x 1 step",
        REF_COPY: f"reference: per-field slice copy_ into preallocated tensors (ring of "
                  f"{p.ref_dest[0].shape[0]:,} rows)",
    }
    filled = {name: (p.ref_dest[0].shape[0] if name == REF_COPY else p.schema.capacity) for name in p.inserts}
    impls = [Impl(name, labels[name], op, fill_s=p.fill_s[name], fill_items=filled[name])
             for name, op in p.inserts.items()]
    title = (f"{p.schema.name} insert: {CHUNK:,} transitions per call into a FULL {p.schema.capacity:,} buffer "
             f"(ring overwrite), {p.schema.row_bytes:,} B/transition")
    return f"{p.schema.name}_insert", title, impls


def sample_case(p: Peers, batch_size: int) -> tuple[str, str, list[Impl]]:
    src = stored_leaves(p.ext, p.schema)
    impls = [
        Impl(TRL, "torchrl TensorDictReplayBuffer(LazyTensorStorage): rb.sample(B)",
             torch_sample(p.torchrl, batch_size)),
        Impl(EXT, "torchrl_ext TensorDictReplayBuffer(FastTensorStorage): rb.sample(B)",
             torch_sample(p.ext, batch_size)),
    ]
    if p.cpprb is not None:
        impls.append(Impl(CPPRB, "cpprb ReplayBuffer: rb.sample(B)", cpprb_sample(p.cpprb, batch_size)))
    impls += [
        Impl(REF_NEW, "reference: torch.randint + index_select of the 5 fields into NEW tensors",
             ref_gather_new(src, batch_size)),
        Impl(REF_OUT, "reference: torch.randint + index_select of the 5 fields into PREALLOCATED outputs (out=)",
             ref_gather_out(src, batch_size)),
    ]
    title = (f"{p.schema.name} uniform sample({batch_size}) from a full {p.schema.capacity:,} buffer, "
             f"{p.schema.row_bytes:,} B/transition")
    return f"{p.schema.name}_sample_B{batch_size}", title, impls


# ---------------------------------------------------------------- reporting
def fmt_si(x: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix}" if x < 10 * div else f"{x / div:.1f}{suffix}"
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def report_case(title: str, impls: list[Impl], items: int, row_bytes: int, unit: str, bg: float,
                waited: float, pre: float, args: argparse.Namespace) -> dict[str, Any]:
    base = statistics.median(next(i for i in impls if i.name == TRL).per_rep)
    has_fill = any(i.fill_s is not None for i in impls)
    print(f"## {title}\n\n{bg_note(bg, waited, pre, args)}. Speed = `{TRL}` median time / this median time "
          f"(>1 = faster). GB/s = {unit} x {row_bytes:,} B.\n")
    fill_head = " cold fill tr/s |" if has_fill else ""
    print(f"| implementation | median ms/call | min | max | median {unit} | GB/s | speed vs {TRL} | k |{fill_head}\n"
          f"|---|---:|---:|---:|---:|---:|---:|---:|{'---:|' if has_fill else ''}")
    rows = {}
    for impl in impls:
        med = statistics.median(impl.per_rep)
        r = rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                               "max_ms": max(impl.per_rep) * 1e3, "items_per_s": items / med,
                               "gb_per_s": items * row_bytes / med / 1e9, "speed_vs_torchrl": base / med,
                               "k": impl.k, "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
        fill = ""
        if has_fill:
            rate = impl.fill_items / impl.fill_s if impl.fill_s else None
            r.update(cold_fill_s=impl.fill_s, cold_fill_items_per_s=rate)
            fill = f" {fmt_si(rate)} |" if rate else " - |"
        print(f"| {impl.label} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | "
              f"{fmt_si(r['items_per_s'])} | {r['gb_per_s']:.2f} | {r['speed_vs_torchrl']:.2f}x | {impl.k} |{fill}")
    print()
    return rows


def report_targets(results: dict[str, dict[str, Any]], checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = baseline median time / torchrl_ext median time (same run; every row of a case "
          "moves the same bytes per sample, so for the index_select rows this is also the bytes/s ratio); "
          "paired = range over repetitions of (baseline rep time / torchrl_ext rep time), same round-robin round.\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    out = []
    for key, impl, baseline, target in TARGETS:
        if key not in results:
            continue
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        what = {REF_NEW: "torchrl_ext bytes/s vs index_select (new outputs) bytes/s",
                REF_OUT: "torchrl_ext bytes/s vs index_select (out=) bytes/s"}.get(baseline, f"{impl} vs {baseline}")
        entry = target_row(key, what, rows, impl, baseline, target, bg, checks_ok)
        out.append(entry)
    print()
    return out


# ---------------------------------------------------------------- memory


def img_bytes_needed(capacity: int, with_cpprb: bool) -> int:
    """Three (two without cpprb) full buffers + inputs + reference ring + transient sample outputs + 1 GiB."""
    row = img_schema(capacity).row_bytes + 8  # the torch buffers also store the writer's "index"
    buffers = (3 if with_cpprb else 2) * capacity * row
    return buffers + POOL * CHUNK * row + min(capacity, 10 * CHUNK) * row + 3 * 4096 * row + GiB


def rss_line(label: str) -> str:
    return (f"Memory {label}: RSS {proc_status('VmRSS') / GiB:.2f} GiB, peak RSS so far (VmHWM) "
            f"{proc_status('VmHWM') / GiB:.2f} GiB, MemAvailable {mem_available() / GiB:.2f} GiB.")


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: img capacity 10,000 (vec stays 1,000,000), 3 reps of >= 0.05 s, "
                     "wait <= 5 s")
    ap.add_argument("--img-capacity", type=int, default=None,
                    help=f"img capacity (default {IMG_CAPACITY:,}, {IMG_CAPACITY_QUICK:,} under --quick; "
                         f"lowered to {IMG_CAPACITY_LOW:,} automatically if memory is short)")
    ap.add_argument("--vec-capacity", type=int, default=VEC_CAPACITY, help=f"vec capacity (default {VEC_CAPACITY:,})")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    img_capacity_asked = a.img_capacity or (IMG_CAPACITY_QUICK if a.quick else IMG_CAPACITY)
    for cap in (img_capacity_asked, a.vec_capacity):
        if cap % CHUNK or math.gcd(cap // CHUNK, POOL) != 1:
            ap.error(f"capacities must be multiples of {CHUNK} with capacity / {CHUNK} not a multiple of {POOL}")
    torch.set_num_threads(a.threads)
    # The ~370k objects of the imports (torch, torchrl, SB3) make every gc.collect() take ~0.2 s
    # here; the harness collects before each repetition (untimed). Freezing them keeps that
    # collect short. Everything built from here on (the buffers) stays collectable.
    gc.freeze()
    # TorchRL logs "Initialized LazyTensorStorage ..." to stdout, which would break the markdown.
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict"), "numpy": np.__version__}
    if cpprb is not None:
        extra["cpprb"] = version("cpprb")
    if SB3ReplayBuffer is not None:
        extra["stable-baselines3"] = version("stable-baselines3")
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print(f"# torchrl_ext storage benchmark\n\n{environment_line(started, load_start, a, extra)}\n")
    notes = []
    if cpprb is None:
        notes.append("**cpprb is not installed: its rows are skipped and its targets are not measured.** "
                     "Install the bench extra: `pip install -e .[bench]`.")
    if SB3ReplayBuffer is None:
        notes.append("stable-baselines3 is not installed: its vec insert row is skipped.")
    notes.append("SB3 is timed for vec insert only: a fourth 5.6 GB img buffer does not fit next to the "
                 "other three in this machine's memory, and its sample is not a target.")
    if a.quick:
        notes.append(f"**--quick: img capacity {img_capacity_asked:,}** (the targets are defined at "
                     f"{IMG_CAPACITY:,}), 3 repetitions of >= 0.05 s: a smoke run, not a measurement.")
    for n in notes:
        print(n + "\n")

    results: dict[str, dict[str, Any]] = {}
    all_checks: list[Check] = []
    diagnostics: dict[str, list[dict[str, Any]]] = {}
    memory: dict[str, Any] = {}

    def run(key: str, title: str, impls: list[Impl], items: int, schema: Schema, unit: str) -> None:
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        rows = report_case(title, impls, items, schema.row_bytes, unit, bg, waited, pre, a)
        results[key] = {"title": title, "bg_load": bg, "waited_s": waited, "items_per_call": items,
                        "row_bytes": schema.row_bytes, "capacity": schema.capacity, "impls": rows}

    def run_schema(schema: Schema, with_sb3: bool, ref_rows: int) -> None:
        keys = [f"{schema.name}_insert"] + [f"{schema.name}_sample_B{b}" for b in BATCH_SIZES]
        if not any(selected(a, k) for k in keys):
            return
        t0 = time.perf_counter()
        p = build_peers(schema, with_sb3, ref_rows)
        print(f"Built and filled the {schema.name} peers ({schema.capacity:,} transitions each) in "
              f"{time.perf_counter() - t0:.1f} s. {rss_line('after filling')}\n")
        memory[f"{schema.name}_after_fill"] = {"rss": proc_status("VmRSS"), "hwm": proc_status("VmHWM")}
        if selected(a, keys[0]):
            run(*insert_case(p), CHUNK, schema, "tr/s")
        checks = check_same_writes(p)
        for b, key in zip(BATCH_SIZES, keys[1:]):
            if selected(a, key):
                run(*sample_case(p, b), b, schema, "samples/s")
        for b in BATCH_SIZES:
            checks += check_sample(p, b)
        report_checks(checks)
        all_checks.extend(checks)
        for key in keys:
            if key in results:
                results[key]["checks"] = [c.__dict__ for c in checks]
        if schema.name == "img":
            for b in BATCH_SIZES:
                rows = diagnose(p, b, budget_s=0.3 if not a.quick else 0.05)
                report_diagnostics(rows, schema, b)
                diagnostics[f"{schema.name}_sample_B{b}"] = rows
        print(rss_line(f"at the end of {schema.name}") + "\n")
        del p
        gc.collect()

    run_schema(vec_schema(a.vec_capacity), SB3ReplayBuffer is not None, min(a.vec_capacity, 100 * CHUNK))

    img_capacity, img_note = img_capacity_asked, None
    if any(selected(a, k) for k in ("img_insert", "img_sample_B256", "img_sample_B4096")):
        avail, need = mem_available(), img_bytes_needed(img_capacity, cpprb is not None)
        if need > avail and a.img_capacity is None and img_capacity > IMG_CAPACITY_LOW:
            img_capacity = IMG_CAPACITY_LOW
            img_note = (f"**img capacity reduced to {img_capacity:,}**: {need / GiB:.1f} GiB needed at "
                        f"{img_capacity_asked:,}, MemAvailable {avail / GiB:.1f} GiB.")
        elif need > avail:
            img_note = (f"**warning**: img at {img_capacity:,} needs about {need / GiB:.1f} GiB, MemAvailable "
                        f"{avail / GiB:.1f} GiB; running anyway.")
        if img_note:
            print(img_note + "\n")
        run_schema(img_schema(img_capacity), False, min(img_capacity, 10 * CHUNK))

    checks_ok = all(c.ok for c in all_checks)
    targets = report_targets(results, checks_ok)
    load_end = loadavg()
    peak = proc_status("VmHWM")
    memory["peak_rss"] = peak
    wall = time.perf_counter() - wall0
    print(f"Peak RSS (VmHWM) {peak / GiB:.2f} GiB; img capacity {img_capacity:,}"
          + (" (reduced: see above)" if img_capacity != img_capacity_asked else "")
          + (" (--quick)" if a.quick else "") + f"; vec capacity {a.vec_capacity:,}. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(img_capacity=img_capacity, vec_capacity=a.vec_capacity, quick=a.quick, wall_s=wall,
                    notes=notes + ([img_note] if img_note else []))
        payload = {"meta": meta, "cases": results, "diagnostics": diagnostics, "memory": memory,
                   "targets": targets}
        write_results(a.json, payload, all_checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
