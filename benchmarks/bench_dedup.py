"""Memory and speed of torchrl_ext's DedupEnvRingStorage (each pixel frame stored once), against
the plain EnvRingStorage, TorchRL's LazyTensorStorage and cpprb's own frame deduplication.

Usage::

    python benchmarks/bench_dedup.py                 # full run (about 5 min; ~12.1 GiB peak RSS in the timing part)
    python benchmarks/bench_dedup.py --quick         # smoke run: 4,000-transition buffers, 3 short reps (< 1 min)
    python benchmarks/bench_dedup.py --only memory --json benchmarks/results/bench_dedup.json

Data: 8 envs, each a stream of episodes of 100-1,000 steps (uniform) of unique 84x84 uint8
frames, stacked 4 deep like gymnasium's ``FrameStackObservation(padding_type="reset")``:
``observation`` u8[4, 84, 84], ``("next", "observation")`` u8[4, 84, 84] (equal to the next
step's ``observation`` within an episode), ``("next", "done")`` bool[1], ``action`` int64,
``reward`` float32. Every frame carries its id in its first 8 bytes, so any frame can be
checked against the stream it came from.

Two parts:

* **memory** (issue 4's target): each implementation in its OWN subprocess, filled with the
  same kind of stream to capacity (8 envs x 12,500 = 100,000 transitions; the rings wrap by a
  further 10%): torchrl_ext ``EnvRingReplayBuffer(storage=DedupEnvRingStorage(8, 12500,
  num_stack=4))``, the plain ``EnvRingStorage`` (full stacks and next stacks), TorchRL
  ``TensorDictReplayBuffer(storage=LazyTensorStorage(100000))`` and cpprb
  ``ReplayBuffer(100000, next_of="obs", stack_compress="obs")`` (one stream, its native
  [84, 84, 4] layout, ``on_episode_end()`` after each episode). Reported per transition:
  the bytes of the storage's own tensors (cpprb: its numpy allocations, via tracemalloc) and
  the peak-RSS growth of the process over the fill (VmHWM, reset after imports and a warm-up),
  both against one 84x84 frame (7,056 B). Target: resident bytes per stored transition
  <= 1.1 x 7,056 B.
* **speed** (information, no target): one process holds the dedup buffer, the plain ring and
  the TorchRL buffer, filled with the same stream (100,000 transitions each if memory allows,
  else 20,000; ``--time-max-length`` sets the steps per env). Timed with the harness
  (interleaved repetitions): uniform ``sample(256)`` end to end, and ``extend`` of one step of
  the 8 envs into the full buffers.

Checks (exit code 1 if one fails): sampled dedup data equals the plain ring's data at the same
``(env, position)`` and the source stream, on the filled buffers and after the timed inserts;
after the inserts every readable step of every env is compared (dedup vs plain vs source);
TorchRL's samples equal the source; in each memory subprocess a sample of 256 is a valid
stack of intact frames; the dedup storage keeps one frame per step.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing as mp
import random
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from _harness import write_results
from _harness import (selected, Impl, proc_status, mem_available, BgLoad, Check, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, quiet_before_case, report_checks, run_interleaved, utc_now)
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage

try:
    import cpprb
except ImportError:  # optional peer: the bench extra installs it
    cpprb = None

NUM_ENVS, NUM_STACK, H, W = 8, 4, 84, 84
FRAME_BYTES = H * W  # 7,056
TARGET_RATIO = 1.1  # issue 4: resident bytes per stored transition <= 1.1 x one frame
MAX_LENGTH, MAX_LENGTH_QUICK = 12_500, 500  # memory part: 8 x 12,500 = 100,000 transitions
TIME_MAX_LENGTH_LOW = 2_500  # timing part when 100,000 does not fit: 8 x 2,500 = 20,000
WRAP = 0.1  # fill max_length * (1 + WRAP) steps per env: the rings wrap (steady state)
EP_MIN, EP_MAX = 100, 1_000  # episode lengths, uniform
POOL = 61  # random base frames; frame id i is pool[i % POOL] with i in its first 8 bytes
CYCLE = 64  # insert case: a cycle of 64 steps per env, repeated (ends with done for every env)
BATCH = 256
RAM_CAP = 14 * 2**30  # the timing part stays under this
GiB, MiB = 2**30, 2**20

DEDUP, PLAIN, TRL, CPPRB, REF = "dedup", "plain ring", "torchrl", "cpprb", "ref index_select"
DEDUP_NOCHECK = "dedup check_next=False"
MEMORY_KEY, SAMPLE_KEY, INSERT_KEY = "memory", f"sample_B{BATCH}", f"insert_E{NUM_ENVS}"


# ---------------------------------------------------------------- frames and streams
class Frames:
    """Renders frame ids as 84x84 uint8 frames: base frame id % POOL, id written in the first 8 bytes."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, 256, (POOL, FRAME_BYTES), dtype=torch.uint8, generator=g)

    def render(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``ids`` int64 [...] -> uint8 [..., 84, 84] (into ``out`` if given, contiguous)."""
        flat = ids.reshape(-1)
        if out is None:
            out = torch.empty(*ids.shape, H, W, dtype=torch.uint8)
        rows = out.view(-1, FRAME_BYTES)
        torch.index_select(self.pool, 0, flat % POOL, out=rows)
        rows[:, :8].view(torch.int64).copy_(flat.unsqueeze(1))
        return out

    @staticmethod
    def decode(frames: torch.Tensor) -> torch.Tensor:
        """uint8 [..., 84, 84] -> the frame ids [...]."""
        rows = frames.reshape(-1, FRAME_BYTES)[:, :8].contiguous()
        return rows.view(torch.int64).reshape(frames.shape[:-2])


class Streams:
    """``num_envs`` endless episode streams of unique frame ids, stacked like gymnasium's
    ``FrameStackObservation(padding_type="reset")``: an episode starts at ``[f0, f0, f0, f0]``;
    ``next`` of a step is its stack shifted by one new frame; after a done the env resets."""

    def __init__(self, num_envs: int, seed: int) -> None:
        self.num_envs, self.rng = num_envs, random.Random(seed)
        self.next_id = 1
        self.win = torch.zeros(num_envs, NUM_STACK, dtype=torch.int64)
        self.left = [0] * num_envs
        for e in range(num_envs):
            self._reset(e)

    def _reset(self, e: int) -> None:
        self.win[e] = self.next_id
        self.next_id += 1
        self.left[e] = self.rng.randint(EP_MIN, EP_MAX)

    def step(self, force_done: list[bool] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every env: obs ids [E, 4], next obs ids [E, 4], done bool [E]."""
        new = torch.arange(self.next_id, self.next_id + self.num_envs)
        self.next_id += self.num_envs
        obs = self.win.clone()
        nxt = torch.cat([obs[:, 1:], new.unsqueeze(1)], 1)
        self.win = nxt.clone()
        done = []
        for e in range(self.num_envs):
            self.left[e] -= 1
            d = self.left[e] <= 0 or bool(force_done and force_done[e])
            done.append(d)
            if d:
                self._reset(e)
        return obs, nxt, torch.tensor(done)


def empty_step(n: int) -> TensorDict:
    return TensorDict({
        "observation": torch.zeros(n, NUM_STACK, H, W, dtype=torch.uint8),
        "action": torch.zeros(n, dtype=torch.int64),
        "reward": torch.zeros(n, dtype=torch.float32),
        "next": {"observation": torch.zeros(n, NUM_STACK, H, W, dtype=torch.uint8),
                 "done": torch.zeros(n, 1, dtype=torch.bool)},
    }, batch_size=[n])


def fill_step(td: TensorDict, frames: Frames, obs: torch.Tensor, nxt: torch.Tensor, done: torch.Tensor) -> TensorDict:
    """Writes one step of ids into ``td`` in place (action / reward derived from the ids)."""
    frames.render(obs, out=td["observation"])
    frames.render(nxt, out=td["next", "observation"])
    td["next", "done"].copy_(done.unsqueeze(1))
    td["action"].copy_(obs[:, -1] % 18)
    td["reward"].copy_((nxt[:, -1] % 7).float())
    return td


def expected_fields(frames: Frames, obs: torch.Tensor, nxt: torch.Tensor,
                    done: torch.Tensor) -> dict[Any, torch.Tensor]:
    """The stored step for ids of any batch shape S: field -> tensor [S, ...]."""
    return {"observation": frames.render(obs), ("next", "observation"): frames.render(nxt),
            ("next", "done"): done.unsqueeze(-1), "action": obs[..., -1] % 18, "reward": (nxt[..., -1] % 7).float()}


FIELDS = ["observation", ("next", "observation"), ("next", "done"), "action", "reward"]


def stack_sanity(obs: torch.Tensor, nxt: torch.Tensor, frames: Frames) -> tuple[bool, str]:
    """A batch [B, 4, 84, 84] of obs / next obs is made of intact frames and valid stacks."""
    io, inx = frames.decode(obs), frames.decode(nxt)
    intact = torch.equal(frames.render(io), obs) and torch.equal(frames.render(inx), nxt)
    shifted = bool((inx[:, :-1] == io[:, 1:]).all())
    ordered = bool((io[:, 1:] >= io[:, :-1]).all()) and bool((inx[:, -1] > io[:, -1]).all())
    ok = intact and shifted and ordered
    return ok, f"frames intact: {intact}; next = obs shifted by one frame: {shifted}; frame ids ordered: {ordered}"


# ---------------------------------------------------------------- memory accounting


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return proc_status("VmHWM") <= proc_status("VmRSS") + 64 * 1024
    except OSError:
        return False


def tensor_bytes(obj: Any, prefix: str = "", seen: set | None = None, depth: int = 0) -> dict[str, int]:
    """Bytes of every distinct tensor / ndarray memory block reachable from ``obj``'s attributes.

    Views share their base block and are counted once (e.g. the ring's flat leaf views and
    the torch views of its numpy counters). Returns attribute path -> bytes.
    """
    seen = set() if seen is None else seen
    out: dict[str, int] = {}

    def add(path: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            st = value.untyped_storage()
            key = st.data_ptr()
            if key and key not in seen:
                seen.add(key)
                out[path] = st.nbytes()
        elif isinstance(value, np.ndarray):
            base = value
            while isinstance(base.base, np.ndarray):
                base = base.base
            key = base.__array_interface__["data"][0]
            if key and key not in seen:
                seen.add(key)
                out[path] = base.nbytes
        elif isinstance(value, TensorDictBase):
            for k, leaf in value.items(include_nested=True, leaves_only=True):
                add(f"{path}[{k!r}]", leaf)
        elif isinstance(value, (list, tuple)) and depth < 3:
            for i, v in enumerate(value):
                add(f"{path}[{i}]", v)
        elif isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                add(f"{path}[{k!r}]", v)

    # The storage's own TensorDict first, so that views of its leaves are named after it.
    for name, value in sorted(vars(obj).items(), key=lambda kv: (kv[0] != "_storage", kv[0])):
        add(prefix + name, value)
    return out


# ---------------------------------------------------------------- buffers
def make_buffer(impl: str, max_length: int) -> Any:
    if impl == DEDUP:
        return EnvRingReplayBuffer(storage=DedupEnvRingStorage(NUM_ENVS, max_length, num_stack=NUM_STACK),
                                   sampler=TrajectorySampler(1), batch_size=BATCH)
    if impl == PLAIN:
        return EnvRingReplayBuffer(num_envs=NUM_ENVS, max_length=max_length, sampler=TrajectorySampler(1),
                                   batch_size=BATCH)
    if impl == TRL:
        return TensorDictReplayBuffer(storage=LazyTensorStorage(NUM_ENVS * max_length), batch_size=BATCH)
    if impl == CPPRB:
        return cpprb.ReplayBuffer(NUM_ENVS * max_length,
                                  {"obs": {"shape": (H, W, NUM_STACK), "dtype": np.uint8},
                                   "act": {"dtype": np.int64}, "rew": {}, "done": {}},
                                  next_of=("obs",), stack_compress="obs")
    raise ValueError(impl)


def writer(impl: str, rb: Any) -> Callable[[TensorDict], Any]:
    """One [8] step into ``rb`` the way its library takes it."""
    env_ids = torch.arange(NUM_ENVS)
    if impl in (DEDUP, PLAIN):
        return lambda td: rb.extend(td, env_ids=env_ids)
    return rb.extend


# ---------------------------------------------------------------- memory part (one subprocess per implementation)
def child_main(impl: str, max_length: int) -> dict[str, Any]:
    """Fills one implementation in this process and measures its memory; returns a JSON-able dict."""
    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    rss_imports = proc_status("VmRSS")
    frames = Frames()
    capacity = NUM_ENVS * max_length
    steps_per_env = int(max_length * (1 + WRAP))
    # Warm-up: the same calls on a tiny buffer of the same kind, so that one-time lazy
    # initialisation (kernels, caches) is not counted as storage.
    if impl == CPPRB:
        streams = Streams(1, seed=1)
        obs_buf = torch.empty(1, NUM_STACK, H, W, dtype=torch.uint8)
        next_buf = torch.empty_like(obs_buf)

        def add_cpprb(rb: Any) -> None:
            obs, nxt, done = streams.step()
            frames.render(obs, out=obs_buf)
            frames.render(nxt, out=next_buf)
            rb.add(obs=obs_buf[0].permute(1, 2, 0).numpy(), next_obs=next_buf[0].permute(1, 2, 0).numpy(),
                   act=int(obs[0, -1] % 18), rew=float(nxt[0, -1] % 7), done=float(done[0]))
            if bool(done[0]):
                rb.on_episode_end()

        tiny = make_buffer(CPPRB, 4)
        for _ in range(64):
            add_cpprb(tiny)
        tiny.sample(8)
        del tiny
        streams = Streams(1, seed=0)
    else:
        streams = Streams(NUM_ENVS, seed=0)
        td = empty_step(NUM_ENVS)
        tiny = make_buffer(impl, 16)
        warm_streams, write = Streams(NUM_ENVS, seed=1), writer(impl, tiny)
        for _ in range(40):
            write(fill_step(td, frames, *warm_streams.step()))
        tiny.sample(BATCH)
        del tiny, write, warm_streams
    gc.collect()
    hwm_reset = reset_peak_rss()
    rss0, maxrss0 = proc_status("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    traced = None
    t0 = time.perf_counter()
    if impl == CPPRB:
        import tracemalloc  # numpy reports its allocations to tracemalloc: cpprb's buffers
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        rb = make_buffer(CPPRB, max_length)
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        for _ in range(capacity + int(capacity * WRAP)):  # one stream: cpprb dedups consecutive adds
            add_cpprb(rb)
        stored = rb.get_stored_size()
    else:
        rb = make_buffer(impl, max_length)
        write = writer(impl, rb)
        for _ in range(steps_per_env):
            write(fill_step(td, frames, *streams.step()))
        stored = len(rb)
    fill_s = time.perf_counter() - t0
    gc.collect()
    rss1, hwm1 = proc_status("VmRSS"), proc_status("VmHWM")
    maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = hwm1 if hwm_reset else max(hwm1, maxrss1)

    if impl == CPPRB:
        breakdown = {"numpy buffers (tracemalloc, at construction)": traced}
        batch = rb.sample(BATCH)
        obs = torch.from_numpy(batch["obs"]).permute(0, 3, 1, 2).contiguous()
        nxt = torch.from_numpy(batch["next_obs"]).permute(0, 3, 1, 2).contiguous()
        readable = stored
    else:
        storage = rb.storage
        breakdown = tensor_bytes(storage)
        batch = rb.sample(BATCH)
        obs = batch["observation"].reshape(-1, NUM_STACK, H, W)
        nxt = batch["next", "observation"].reshape(-1, NUM_STACK, H, W)
        readable = stored - (NUM_ENVS * storage.required_lookback if impl == DEDUP else 0)
    sane, sane_detail = stack_sanity(obs, nxt, frames)
    result = {
        "impl": impl, "capacity": capacity, "stored": stored, "readable": readable, "fill_s": fill_s,
        "steps_written": capacity + int(capacity * WRAP) if impl == CPPRB else steps_per_env * NUM_ENVS,
        "rss_after_imports": rss_imports, "rss_baseline": rss0, "rss_final": rss1, "peak_rss": peak,
        "hwm_reset": hwm_reset, "maxrss_before_fill": maxrss0,
        "storage_bytes": sum(breakdown.values()), "breakdown": breakdown,
        "sample_ok": sane, "sample_detail": sane_detail,
    }
    if impl == DEDUP:
        st = rb.storage
        result["obs_leaf_shape"] = list(st.shape) + list(st.flat_leaf("observation").shape[1:])
        result["terminal_rows"] = int(st._terminal.shape[0]) if st._terminal is not None else 0
        result["terminal_rows_used"] = int((st._terminal_row >= 0).sum())
    return result


def _forked_child(impl: str, max_length: int, conn: Any) -> None:
    try:
        conn.send(child_main(impl, max_length))
    except BaseException as error:  # report, never hang the parent
        conn.send({"impl": impl, "error": f"{type(error).__name__}: {error}"})
    finally:
        conn.close()


def run_child(impl: str, max_length: int, exec_child: bool) -> dict[str, Any]:
    """Measures one implementation in its own process: forked from this one (the imports are
    already done, so a child starts in well under a second), or a fresh interpreter."""
    if not exec_child:
        ctx = mp.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_forked_child, args=(impl, max_length, send))
        proc.start()
        send.close()
        try:
            result = recv.recv()
        except EOFError:
            result = {"impl": impl, "error": "the child process died without a result"}
        proc.join()
        if proc.exitcode:
            result.setdefault("error", f"exit code {proc.exitcode}")
        return result
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, "--child-max-length", str(max_length)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"impl": impl, "error": f"exit code {out.returncode}: {out.stderr.strip()[-2000:]}"}


def report_memory(results: list[dict[str, Any]], quick: bool) -> tuple[list[Check], dict[str, Any]]:
    limit = TARGET_RATIO * FRAME_BYTES
    print("## Memory: bytes per stored transition (each implementation in its own process)\n")
    print(f"Per transition = bytes / capacity. **tensor bytes**: the storage object's own tensors (torchrl_ext, "
          f"TorchRL: every distinct tensor reachable from the storage's attributes; cpprb: its numpy allocations "
          f"at construction, via tracemalloc). **peak RSS delta**: VmHWM at the end of the fill minus VmRSS at "
          f"the baseline (after imports, the input buffers and a warm-up on a tiny buffer of the same kind; "
          f"VmHWM reset there). x frame = / {FRAME_BYTES:,} B.\n")
    print("| implementation | capacity | stored (readable) | tensor B/transition | x frame | peak RSS | "
          "peak RSS delta B/transition | x frame | final RSS delta B/transition | fill s |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    checks, summary = [], {}
    for r in results:
        if "error" in r:
            print(f"| {r['impl']} | - | - | - | - | - | - | - | - | failed: {r['error'][:200]} |")
            checks.append(Check(f"memory subprocess {r['impl']}", False, r["error"][-300:]))
            continue
        cap = r["capacity"]
        tb, pk, fin = r["storage_bytes"] / cap, (r["peak_rss"] - r["rss_baseline"]) / cap, \
            (r["rss_final"] - r["rss_baseline"]) / cap
        summary[r["impl"]] = {"tensor_per_tr": tb, "peak_delta_per_tr": pk, "final_delta_per_tr": fin}
        print(f"| {r['impl']} | {cap:,} | {r['stored']:,} ({r['readable']:,}) | {tb:,.1f} | {tb / FRAME_BYTES:.3f} | "
              f"{r['peak_rss'] / GiB:.2f} GiB | {pk:,.1f} | {pk / FRAME_BYTES:.3f} | {fin:,.1f} | {r['fill_s']:.1f} |")
        checks.append(Check(f"{r['impl']} memory subprocess: full, sample of {BATCH} valid",
                            r["stored"] == cap and r["sample_ok"],
                            f"stored {r['stored']:,} of {cap:,} after {r['steps_written']:,} steps written; "
                            f"{r['sample_detail']}; VmHWM reset: {r['hwm_reset']}"))
        if r["impl"] == DEDUP:
            shape = r["obs_leaf_shape"]
            checks.append(Check("dedup stores one frame per step", shape == [NUM_ENVS, cap // NUM_ENVS, H, W],
                                f"observation leaf {shape}; terminal side table {r['terminal_rows']} rows, "
                                f"{r['terminal_rows_used']} in use"))
    print()
    by = {r["impl"]: r for r in results if "error" not in r}
    if DEDUP in by:
        r = by[DEDUP]
        cap = r["capacity"]
        print(f"Dedup tensor bytes per transition, by attribute of the storage (capacity {cap:,}):\n")
        print("| attribute | bytes | B/transition |\n|---|---:|---:|")
        for name, b in sorted(r["breakdown"].items(), key=lambda kv: -kv[1]):
            print(f"| `{name}` | {b:,} | {b / cap:,.2f} |")
        print()
    if DEDUP in summary:
        s = summary[DEDUP]
        worst = max(s["tensor_per_tr"], s["peak_delta_per_tr"])
        ok = worst <= limit and all(c.ok for c in checks)
        scope = (f" (**--quick: capacity {by[DEDUP]['capacity']:,}, not the target's "
                 f"{NUM_ENVS * MAX_LENGTH:,}: a smoke run**)") if quick else ""
        print("## Target (issue 4)\n")
        print("| target | dedup tensor B/transition | dedup peak RSS delta B/transition | limit | result |\n"
              "|---|---:|---:|---:|:-:|")
        result = "PASS" if ok else "**FAIL**"
        print(f"| resident bytes per stored transition <= {TARGET_RATIO} x {FRAME_BYTES:,} B (4-frame 84x84 stack "
              f"+ next obs){scope} | {s['tensor_per_tr']:,.1f} ({s['tensor_per_tr'] / FRAME_BYTES:.3f}x) | "
              f"{s['peak_delta_per_tr']:,.1f} ({s['peak_delta_per_tr'] / FRAME_BYTES:.3f}x) | {limit:,.1f} | "
              f"{result} |")
        print("\nBoth measures must be within the limit (the larger one decides).")
        for other in (PLAIN, TRL, CPPRB):
            if other in summary:
                o = summary[other]
                print(f"- {other}: {o['tensor_per_tr']:,.0f} tensor B/transition "
                      f"({o['tensor_per_tr'] / FRAME_BYTES:.2f}x a frame), {o['peak_delta_per_tr']:,.0f} peak RSS "
                      f"B/transition; dedup uses {o['peak_delta_per_tr'] / max(s['peak_delta_per_tr'], 1):.2f}x less "
                      f"(peak RSS).")
        print()
        summary["target"] = {"limit": limit, "result": "PASS" if ok else "FAIL", "quick": quick}
    return checks, summary


# ---------------------------------------------------------------- timing part (one process, three buffers)
class Source:
    """The stream written into the timing buffers, remembered as frame ids for the checks.

    Positions ``< fill`` come from the fill; position ``p >= fill`` is cycle step ``(p - fill) % CYCLE``.
    """

    def __init__(self, frames: Frames, fill: int) -> None:
        self.frames, self.fill = frames, fill
        self.obs = torch.zeros(fill, NUM_ENVS, NUM_STACK, dtype=torch.int64)
        self.next = torch.zeros_like(self.obs)
        self.done = torch.zeros(fill, NUM_ENVS, dtype=torch.bool)
        self.cyc_obs = torch.zeros(CYCLE, NUM_ENVS, NUM_STACK, dtype=torch.int64)
        self.cyc_next = torch.zeros_like(self.cyc_obs)
        self.cyc_done = torch.zeros(CYCLE, NUM_ENVS, dtype=torch.bool)

    def ids(self, env: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        in_fill = pos < self.fill
        p = pos.clamp(max=self.fill - 1)
        c = (pos - self.fill).clamp(min=0) % CYCLE
        m = in_fill.unsqueeze(-1)
        return (torch.where(m, self.obs[p, env], self.cyc_obs[c, env]),
                torch.where(m, self.next[p, env], self.cyc_next[c, env]),
                torch.where(in_fill, self.done[p, env], self.cyc_done[c, env]))

    def expected(self, env: torch.Tensor, pos: torch.Tensor) -> dict[Any, torch.Tensor]:
        return expected_fields(self.frames, *self.ids(env, pos))


class Feed:
    """Call i of one buffer gets cycle step (i % CYCLE); counts the steps written per env."""

    def __init__(self, pool: list[TensorDict], start: int) -> None:
        self.pool, self.n, self.start = pool, start, start

    def __call__(self) -> TensorDict:
        item = self.pool[(self.n - self.start) % CYCLE]
        self.n += 1
        return item


def compare(got: TensorDictBase, want: dict[Any, Any] | TensorDictBase) -> list[str]:
    bad = []
    for key in FIELDS:
        g, w = got.get(key), want[key]
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            bad.append(str(key))
    return bad


def check_dedup_sample(dedup: EnvRingReplayBuffer, plain: EnvRingReplayBuffer, src: Source, when: str) -> list[Check]:
    batch = dedup.sample(BATCH)
    env, pos = batch["index"][..., 0], batch["index"][..., 1]
    st = dedup.storage
    readable = bool((pos >= st.earliest_position()[env] + st.required_lookback).all()) and bool(
        (pos < st.current_pos[env]).all())
    want_plain = plain.storage.get((env, pos))
    bad_plain, bad_src = compare(batch, want_plain), compare(batch, src.expected(env, pos))
    dones = int(batch["next", "done"].sum())
    return [Check(f"dedup sample({BATCH}) {when} == plain ring at the same (env, position) and == source",
                  readable and not bad_plain and not bad_src and batch.batch_size == torch.Size([BATCH, 1]),
                  f"batch {list(batch.batch_size)}; positions readable: {readable}; differs from plain: "
                  f"{bad_plain or 'none'}; differs from source: {bad_src or 'none'} (5 fields; {dones} terminal steps "
                  "in the batch)")]


def check_trl_sample(rb: TensorDictReplayBuffer, src: Source, steps: int, max_length: int) -> Check:
    """Row r of the TorchRL buffer holds env r % 8 at its latest step s with s % L == r // 8."""
    batch = rb.sample(BATCH)
    r = batch["index"]
    env, slot = r % NUM_ENVS, r // NUM_ENVS
    pos = slot + max_length * torch.div(steps - 1 - slot, max_length, rounding_mode="floor")
    bad = compare(batch, src.expected(env, pos))
    return Check(f"torchrl sample({BATCH}) == source", not bad,
                 f"{steps:,} steps per env written; differs: {bad or 'none'}")


def check_all_readable(dedup: EnvRingReplayBuffer, plain: EnvRingReplayBuffer, src: Source, when: str) -> Check:
    """Every readable step of every env: dedup == plain == source (read in chunks)."""
    st, pst = dedup.storage, plain.storage
    same_counters = torch.equal(st.current_pos, pst.current_pos) and torch.equal(st.current_size, pst.current_size)
    bad: set[str] = set()
    n = 0
    chunk = 1024
    for e in range(NUM_ENVS):
        first = int(st.earliest_position()[e]) + st.required_lookback
        end = int(st.current_pos[e])
        for p0 in range(first, end, chunk):
            pos = torch.arange(p0, min(p0 + chunk, end))
            env = torch.full_like(pos, e)
            got = st.get((env, pos))
            bad.update(compare(got, pst.get((env, pos))))
            bad.update(compare(got, src.expected(env, pos)))
            n += pos.numel()
    return Check(f"dedup {when}: every readable step == plain ring == source", same_counters and not bad,
                 f"{n:,} steps compared (5 fields); same counters as the plain ring: {same_counters}; "
                 f"differs: {sorted(bad) or 'none'}")


def faults_interleaved(impls: list[Impl], rounds: int = 10) -> dict[str, float]:
    """Minor page faults per call of each implementation, in an untimed round-robin pass (the
    allocator state the timed repetitions see: large frees of one implementation change where
    the next one's temporaries come from)."""
    total = dict.fromkeys((i.name for i in impls), 0)
    for _ in range(rounds):
        for impl in impls:
            f0 = minflt()
            impl.fn()
            total[impl.name] += minflt() - f0
    return {name: n / rounds for name, n in total.items()}


def report_case(title: str, impls: list[Impl], baseline: str, items: int, unit: str, bg: float, waited: float,
                pre: float, args: argparse.Namespace, faults: dict[str, float]) -> dict[str, Any]:
    base = statistics.median(next(i for i in impls if i.name == baseline).per_rep)
    print(f"## {title}\n\n{bg_note(bg, waited, pre, args)}. Speed = `{baseline}` median / this median (>1 = faster). "
          "Minor faults/call: process minor page faults per call in an untimed round-robin pass after the timing.\n")
    print(f"| implementation | median us/call | min | max | {unit}/s | speed vs {baseline} | minor faults/call | k |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for impl in impls:
        med = statistics.median(impl.per_rep)
        rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                           "max_ms": max(impl.per_rep) * 1e3, "items_per_s": items / med,
                           "speed_vs_baseline": base / med, "k": impl.k, "minflt_per_call": faults[impl.name],
                           "per_rep_ms": [s * 1e3 for s in impl.per_rep]}
        print(f"| {impl.label} | {med * 1e6:,.1f} | {min(impl.per_rep) * 1e6:,.1f} | {max(impl.per_rep) * 1e6:,.1f} | "
              f"{items / med:,.0f} | {base / med:.2f}x | {faults[impl.name]:,.0f} | {impl.k} |")
    print()
    return rows


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def diagnose_sample(dedup: EnvRingReplayBuffer, plain: EnvRingReplayBuffer, reps: int,
                    min_rep: float) -> list[dict[str, Any]]:
    """Each piece of the dedup sample path alone (interleaved, median of ``reps``), with minor faults."""
    st, pst = dedup.storage, plain.storage
    (env, pos), _ = dedup._sampler.sample(st, BATCH)
    ec, pc = env.cpu(), pos.cpu()
    begin = st._begin(ec, pc)
    leaf = st._frame_leaf()
    frames_flat = torch.randint(leaf.shape[0], (2 * NUM_STACK * env.numel(),))
    parent = type(st).__mro__[1]  # EpisodicEnvRingStorage: the stored one-frame leaves and the other fields
    pieces: list[tuple[str, Callable[[], Any]]] = [
        ("dedup rb.sample(256), end to end", lambda: dedup.sample(BATCH)),
        ("  TrajectorySampler.sample (index only)", lambda: dedup._sampler.sample(st, BATCH)),
        ("  DedupEnvRingStorage.gather (fixed index)", lambda: st.gather(env, pos)),
        ("    the other stored fields via the parent's gather (the obs leaf skipped, as in the call)",
         lambda: parent.gather(st, env, pos, skip=(st.obs_key,))),
        ("    _stack: observation (its 4 frames in one gather)", lambda: st._stack(ec, pc, begin)),
        ("    _stack: next observation (4 frames in one gather, the newest patched from the side tables)",
         lambda: st._stack(ec, pc, begin, shift=1)),
        ("plain rb.sample(256), end to end", lambda: plain.sample(BATCH)),
        ("  EnvRingStorage.gather (fixed index)", lambda: pst.gather(env, pos)),
        ("reference: index_select of the 2,048 frames of obs + next obs, one new tensor",
         lambda: leaf.index_select(0, frames_flat)),
    ]
    impls = [Impl(label, label, fn) for label, fn in pieces]
    run_interleaved(impls, reps, min_rep)
    print(f"### Diagnostic: where the dedup sample({BATCH}) time goes\n\nEach piece called on its own "
          f"(interleaved, median of {reps} repetitions), and the process's minor page faults per call "
          "(mean of 10 calls). Indented rows are parts of the call above them.\n")
    print("| piece | median us/call | minor faults/call | k |\n|---|---:|---:|---:|")
    rows = []
    for impl in impls:
        f0 = minflt()
        for _ in range(10):
            impl.fn()
        faults = (minflt() - f0) / 10
        med = statistics.median(impl.per_rep)
        rows.append({"piece": impl.label, "median_us": med * 1e6, "minflt": faults, "k": impl.k})
        print(f"| {impl.label} | {med * 1e6:,.1f} | {faults:,.0f} | {impl.k} |")
    print()
    return rows


def time_capacity(args: argparse.Namespace) -> tuple[int, str | None]:
    """max_length per env of the timing buffers and a note if it was lowered."""
    if args.time_max_length:
        return args.time_max_length, None
    if args.quick:
        return MAX_LENGTH_QUICK, None
    per_step_full = 2 * NUM_STACK * FRAME_BYTES + 64
    need = lambda L: NUM_ENVS * L * (2 * per_step_full + FRAME_BYTES + 64) + 2 * GiB  # noqa: E731
    avail = mem_available()
    if need(MAX_LENGTH) <= min(RAM_CAP, avail - GiB):
        return MAX_LENGTH, None
    return TIME_MAX_LENGTH_LOW, (f"**timing capacity lowered to {NUM_ENVS * TIME_MAX_LENGTH_LOW:,}**: the three "
                                 f"100,000 buffers need about {need(MAX_LENGTH) / GiB:.1f} GiB (cap "
                                 f"{RAM_CAP / GiB:.0f} GiB, MemAvailable {avail / GiB:.1f} GiB).")


def timing_part(a: argparse.Namespace, results: dict[str, Any], all_checks: list[Check]) -> dict[str, Any]:
    max_length, note = time_capacity(a)
    if note:
        print(note + "\n")
    frames = Frames()
    fill = int(max_length * (1 + WRAP))
    src = Source(frames, fill)
    streams = Streams(NUM_ENVS, seed=0)
    bufs = {name: make_buffer(name, max_length) for name in (DEDUP, PLAIN, TRL)}
    writes = {name: writer(name, rb) for name, rb in bufs.items()}
    td = empty_step(NUM_ENVS)
    t0 = time.perf_counter()
    fill_s = dict.fromkeys(bufs, 0.0)
    for p in range(fill):
        # The last fill step ends every episode, so the insert cycle starts fresh episodes.
        obs, nxt, done = streams.step(force_done=[True] * NUM_ENVS if p == fill - 1 else None)
        src.obs[p], src.next[p], src.done[p] = obs, nxt, done
        fill_step(td, frames, obs, nxt, done)
        for name, write in writes.items():
            t1 = time.perf_counter()
            write(td)
            fill_s[name] += time.perf_counter() - t1
    wall = time.perf_counter() - t0
    # The insert cycle: CYCLE steps per env, staggered dones, every env done at the last step.
    pool = []
    for c in range(CYCLE):
        force = [c == CYCLE - 1 or c == 5 + 7 * e for e in range(NUM_ENVS)]
        obs, nxt, done = streams.step(force_done=force)
        src.cyc_obs[c], src.cyc_next[c], src.cyc_done[c] = obs, nxt, done
        pool.append(fill_step(empty_step(NUM_ENVS), frames, obs, nxt, done))
    dedup, plain, trl = bufs[DEDUP], bufs[PLAIN], bufs[TRL]
    cap = NUM_ENVS * max_length
    print(f"Timing buffers: {NUM_ENVS} envs x {max_length:,} = {cap:,} transitions each (dedup, plain ring, "
          f"TorchRL), filled with the same {fill:,} steps per env in {wall:.0f} s (extend [8] per step; cold "
          f"fill per step: dedup {fill_s[DEDUP] / fill * 1e6:,.0f} us, plain {fill_s[PLAIN] / fill * 1e6:,.0f} us, "
          f"TorchRL {fill_s[TRL] / fill * 1e6:,.0f} us). RSS {proc_status('VmRSS') / GiB:.2f} GiB.\n")
    checks = [Check("timing buffers full", len(dedup) == len(plain) == len(trl) == cap,
                    f"len dedup {len(dedup):,}, plain {len(plain):,}, torchrl {len(trl):,} (capacity {cap:,})")]
    checks += check_dedup_sample(dedup, plain, src, "on the filled buffers")
    checks.append(check_trl_sample(trl, src, fill, max_length))
    report_checks(checks)
    all_checks.extend(checks)

    def run(key: str, title: str, impls: list[Impl], baseline: str, items: int, unit: str) -> None:
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        faults = faults_interleaved(impls)
        rows = report_case(title, impls, baseline, items, unit, bg, waited, pre, a, faults)
        results[key] = {"title": title, "baseline": baseline, "bg_load": bg, "waited_s": waited, "impls": rows,
                        "capacity": cap}

    if selected(a, SAMPLE_KEY):
        leaves = [leaf for _, leaf in plain.storage.flat_leaves]

        def ref() -> Any:
            flat = torch.randint(cap, (BATCH,))
            return [t.index_select(0, flat) for t in leaves]

        impls = [
            Impl(TRL, f"torchrl TensorDictReplayBuffer(LazyTensorStorage({cap:,})).sample({BATCH})",
                 lambda: trl.sample(BATCH)),
            Impl(PLAIN, f"torchrl_ext EnvRingReplayBuffer(EnvRingStorage, TrajectorySampler(1)).sample({BATCH})",
                 lambda: plain.sample(BATCH)),
            Impl(DEDUP, f"torchrl_ext EnvRingReplayBuffer(DedupEnvRingStorage(num_stack=4), TrajectorySampler(1))"
                        f".sample({BATCH})", lambda: dedup.sample(BATCH)),
            Impl(REF, f"reference: randint + index_select of the 5 fields of the plain ring's tensors ({BATCH} "
                      "full transitions, new tensors)", ref),
        ]
        run(SAMPLE_KEY, f"uniform sample({BATCH}) from full {cap:,}-transition buffers", impls, TRL, BATCH,
            "transitions")
        diag_reps, diag_rep_s = (3, 0.05) if a.quick else (5, 0.2)
        try:
            results[SAMPLE_KEY]["diagnostic"] = diagnose_sample(dedup, plain, diag_reps, diag_rep_s)
        except (AttributeError, TypeError) as error:  # private pieces renamed: skip the diagnostic only
            print(f"Diagnostic skipped: {error!r}\n")

    if selected(a, INSERT_KEY):
        env_ids = torch.arange(NUM_ENVS)
        feeds = {name: Feed(pool, fill) for name in (DEDUP, PLAIN, TRL)}

        def ext(rb: EnvRingReplayBuffer, feed: Feed) -> Callable[[], Any]:
            return lambda: rb.extend(feed(), env_ids=env_ids)

        def ext_nocheck() -> Any:
            dedup.storage.check_next = False
            try:
                return dedup.extend(feeds[DEDUP](), env_ids=env_ids)
            finally:
                dedup.storage.check_next = True

        impls = [
            Impl(TRL, "torchrl TensorDictReplayBuffer(LazyTensorStorage).extend(td[8])",
                 lambda: trl.extend(feeds[TRL]())),
            Impl(PLAIN, "torchrl_ext EnvRingReplayBuffer(EnvRingStorage).extend(td[8], env_ids=arange(8))",
                 ext(plain, feeds[PLAIN])),
            Impl(DEDUP, "torchrl_ext EnvRingReplayBuffer(DedupEnvRingStorage).extend(td[8], env_ids=arange(8))",
                 ext(dedup, feeds[DEDUP])),
            Impl(DEDUP_NOCHECK, "the same with check_next=False (no continuity check; same buffer and feed)",
                 ext_nocheck),
        ]
        run(INSERT_KEY, f"insert: extend of one step of {NUM_ENVS} envs into the full {cap:,}-transition "
                        f"buffers ({NUM_ENVS * (2 * NUM_STACK * FRAME_BYTES + 13):,} B of input)",
            impls, TRL, NUM_ENVS, "transitions")
        # Bring the two rings to the same number of steps (untimed), then compare everything.
        n = max(feeds[DEDUP].n, feeds[PLAIN].n)
        extra = {name: n - feeds[name].n for name in (DEDUP, PLAIN)}
        for name, rb in ((DEDUP, dedup), (PLAIN, plain)):
            for _ in range(extra[name]):
                rb.extend(feeds[name](), env_ids=env_ids)
        checks = check_dedup_sample(dedup, plain, src, f"after the timed inserts ({n - fill:,} steps per env, "
                                                       f"untimed catch-up: {extra})")
        checks.append(check_all_readable(dedup, plain, src, "after the timed inserts"))
        checks.append(check_trl_sample(trl, src, feeds[TRL].n, max_length))
        unchanged = all(set(p.keys(True, True)) == {"observation", "action", "reward", ("next", "observation"),
                                                    ("next", "done")} for p in pool)
        checks.append(Check("input steps unchanged by the buffers", unchanged, "same keys as built"))
        report_checks(checks)
        all_checks.extend(checks)
    return {"max_length": max_length, "capacity": cap, "note": note, "fill_wall_s": wall,
            "fill_us_per_step": {k: v / fill * 1e6 for k, v in fill_s.items()}}


# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, f"smoke run: {NUM_ENVS} x {MAX_LENGTH_QUICK:,} buffers, 3 reps of >= 0.05 s, "
                     "wait <= 5 s", min_rep_default=0.4)
    ap.add_argument("--max-length", type=int, default=None,
                    help=f"memory part: steps kept per env (default {MAX_LENGTH:,}; {MAX_LENGTH_QUICK:,} "
                         "under --quick)")
    ap.add_argument("--time-max-length", type=int, default=None,
                    help=f"timing part: steps kept per env (default {MAX_LENGTH:,} if the three buffers fit in "
                         f"{RAM_CAP / GiB:.0f} GiB and MemAvailable, else {TIME_MAX_LENGTH_LOW:,})")
    ap.add_argument("--exec-children", action="store_true",
                    help="memory part: start each measured process as a fresh interpreter instead of a fork")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-max-length", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        gc.freeze()
        print("RESULT " + json.dumps(child_main(a.child, a.child_max_length)))
        return 0
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    gc.freeze()
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict"), "numpy": np.__version__}
    if cpprb is not None:
        extra["cpprb"] = version("cpprb")
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print(f"# torchrl_ext DedupEnvRingStorage benchmark\n\n{environment_line(started, load_start, a, extra)}\n")
    max_length = a.max_length or (MAX_LENGTH_QUICK if a.quick else MAX_LENGTH)
    notes = [f"Data: {NUM_ENVS} envs, episodes of {EP_MIN}-{EP_MAX} steps, observation u8[{NUM_STACK}, {H}, {W}] "
             f"(4-frame stack, reset padding) + next observation + done + action int64 + reward f32; one 84x84 "
             f"frame = {FRAME_BYTES:,} B; a full transition as TorchRL stores it = "
             f"{2 * NUM_STACK * FRAME_BYTES + 8 + 4 + 1:,} B (+ 8 B of index)."]
    if cpprb is None:
        notes.append("**cpprb is not installed: its memory row is skipped.** Install the bench extra: "
                     "`pip install -e .[bench]`.")
    if a.quick:
        notes.append(f"**--quick**: {NUM_ENVS} x {max_length:,} buffers and 3 repetitions of >= 0.05 s: a smoke "
                     "run, not a measurement.")
    for n in notes:
        print(n + "\n")

    all_checks: list[Check] = []
    results: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    if selected(a, MEMORY_KEY):
        impls = [DEDUP, PLAIN, TRL] + ([CPPRB] if cpprb is not None else [])
        child_results = []
        for impl in impls:
            need = NUM_ENVS * max_length * (2 * NUM_STACK * FRAME_BYTES + 64) if impl in (PLAIN, TRL) else 0
            if need and need + GiB > mem_available():
                child_results.append({"impl": impl, "error": f"skipped: needs {need / GiB:.1f} GiB, MemAvailable "
                                                             f"{mem_available() / GiB:.1f} GiB"})
                continue
            child_results.append(run_child(impl, max_length, a.exec_children))
        checks, summary = report_memory(child_results, a.quick)
        report_checks(checks)
        all_checks.extend(checks)
        memory = {"children": child_results, "summary": summary}
    timing = None
    if selected(a, SAMPLE_KEY) or selected(a, INSERT_KEY):
        timing = timing_part(a, results, all_checks)

    checks_ok = all(c.ok for c in all_checks)
    load_end, peak, wall = loadavg(), proc_status("VmHWM"), time.perf_counter() - wall0
    print(f"Peak RSS of the timing process (VmHWM) {peak / GiB:.2f} GiB. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(max_length=max_length, quick=a.quick, wall_s=wall, peak_rss=peak, notes=notes)
        write_results(a.json, {"meta": meta, "memory": memory, "timing": timing, "cases": results}, all_checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
