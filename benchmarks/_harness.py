"""Timing harness shared by the benchmark scripts in this folder.

Not a script: ``bench_value.py`` and ``bench_prioritized.py`` import it (running a script puts
its folder on ``sys.path``, so a plain ``from _harness import ...`` works). It holds the parts
of the method in ``README.md`` ("Method") that do not depend on what is being measured:

* :class:`BgLoad` and :func:`wait_for_quiet`: CPU used by other processes (``/proc/stat``
  busy time minus this process's CPU time), and waiting for it to drop before a case;
* :func:`run_interleaved`: warm-up, calibration of ``k`` calls per repetition, then timed
  repetitions interleaved round-robin over the implementations with the GC off;
* :func:`make_parser` / :func:`apply_quick`: the command-line flags every script shares;
* :func:`environment_line` / :func:`environment_meta`: machine and version info for the
  report header and the JSON file;
* small formatting helpers (:func:`bg_note`, :func:`paired_range`, :func:`target_row`).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Protocol, Sequence

import torch
import torchrl


# ---------------------------------------------------------------- load
class BgLoad:
    """CPU cores used by other processes since start(): /proc/stat busy time minus our CPU time."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start()

    @staticmethod
    def _busy_jiffies() -> int:
        with open("/proc/stat") as f:
            v = [int(s) for s in f.readline().split()[1:]]
        return v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq

    def start(self) -> None:
        self.t0, self.busy0, self.own0 = time.monotonic(), self._busy_jiffies(), time.process_time()

    def cores(self) -> float:
        wall = time.monotonic() - self.t0
        others = (self._busy_jiffies() - self.busy0) / self.tick - (time.process_time() - self.own0)
        return max(0.0, others / max(wall, 1e-9))


def wait_for_quiet(threshold: float, max_wait: float) -> tuple[float, float]:
    """Samples bg load over 1 s windows until it is <= threshold or max_wait passed.

    Returns (seconds waited, last bg load sample).
    """
    meter, waited = BgLoad(), 0.0
    time.sleep(0.5)
    load = meter.cores()
    while load > threshold and waited < max_wait:
        meter.start()
        time.sleep(1.0)
        waited += 1.0
        load = meter.cores()
    return waited, load


def quiet_before_case(args: argparse.Namespace) -> tuple[float, float]:
    """wait_for_quiet with the script's flags; (0, 0) under --no-wait."""
    return (0.0, 0.0) if args.no_wait else wait_for_quiet(args.bg_threshold, args.max_wait)


def bg_note(bg: float, waited: float, pre: float, args: argparse.Namespace) -> str:
    """'bg load X cores[; waited ...][ -- still above threshold ...]' for a case header."""
    return (f"bg load {bg:.2f} cores"
            + (f"; waited {waited:.0f} s for bg load to drop (now {pre:.2f})" if waited else "")
            + (" -- still above threshold, measured anyway"
               if pre > args.bg_threshold and not args.no_wait else ""))


# ---------------------------------------------------------------- timing
class Timed(Protocol):
    """What run_interleaved needs from an implementation: one call, k, and a result list."""

    fn: Callable[[], Any]
    k: int
    per_rep: list[float]  # seconds per call, one entry per repetition


def run_interleaved(impls: Sequence[Timed], reps: int, min_rep: float, warmup: int = 3) -> None:
    """Times every implementation in ``reps`` repetitions of ``k`` calls, round-robin.

    Each implementation gets ``warmup`` untimed calls, then a calibration run of about
    ``min_rep / 4`` seconds picks ``k`` so that one repetition lasts >= ``min_rep``. The
    repetitions are interleaved (rep 1 of A, B, C, then rep 2 ...) so that a change in
    background load hits every implementation alike. ``gc.collect()`` runs before each
    repetition and the collector is off inside it, so no implementation pays for another's
    garbage. Appends the time per call of each repetition to ``impl.per_rep``.
    """
    for impl in impls:
        for _ in range(warmup):
            impl.fn()
        n, t0 = 0, time.perf_counter()
        while n < 1 or time.perf_counter() - t0 < min_rep / 4:
            impl.fn()
            n += 1
        impl.k = max(1, math.ceil(min_rep / ((time.perf_counter() - t0) / n)))
    for _ in range(reps):
        for impl in impls:
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            for _ in range(impl.k):
                impl.fn()
            impl.per_rep.append((time.perf_counter() - t0) / impl.k)
            gc.enable()


def paired_range(baseline_per_rep: Sequence[float], impl_per_rep: Sequence[float]) -> tuple[float, float]:
    """(min, max) over rounds of baseline rep time / implementation rep time, same round."""
    paired = [b / i for b, i in zip(baseline_per_rep, impl_per_rep)]
    return min(paired), max(paired)


# ---------------------------------------------------------------- flags
def make_parser(doc: str | None, quick_help: str, min_rep_default: float = 0.2) -> argparse.ArgumentParser:
    """The flags shared by the benchmark scripts (scripts may add their own)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per implementation")
    ap.add_argument("--min-rep-seconds", type=float, default=min_rep_default,
                    help="minimum duration of one repetition")
    ap.add_argument("--bg-threshold", type=float, default=0.3, help="bg load (cores) that triggers waiting")
    ap.add_argument("--max-wait", type=float, default=30.0, help="max seconds to wait for quiet per case")
    ap.add_argument("--no-wait", action="store_true", help="never wait for background load to drop")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--only", default="",
                    help="run only cases whose key contains this substring (several: comma-separated)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    return ap


def selected(args: argparse.Namespace, key: str) -> bool:
    """Whether ``--only`` selects the case ``key``: empty, or one comma-separated part is a substring."""
    return not args.only or any(part in key for part in args.only.split(",") if part)


def apply_quick(args: argparse.Namespace, reps: int, min_rep: float, max_wait: float) -> None:
    """Under --quick, overrides reps / min-rep-seconds and caps max-wait."""
    if args.quick:
        args.reps, args.min_rep_seconds, args.max_wait = reps, min_rep, min(args.max_wait, max_wait)


# ---------------------------------------------------------------- machine and versions
def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def environment_line(started: str, load_start: str, args: argparse.Namespace,
                     extra_versions: dict[str, str] | None = None) -> str:
    """One line with date, versions, platform, CPUs, torch threads, reps and loadavg.

    ``extra_versions`` (e.g. ``{"cpprb": "11.0.0"}``) are listed after torchrl.
    """
    extras = "".join(f", {name} {version}" for name, version in (extra_versions or {}).items())
    return (f"{started}; torch {torch.__version__}, torchrl {torchrl.__version__}{extras}, "
            f"Python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} logical CPUs; "
            f"torch threads = {torch.get_num_threads()}; reps = {args.reps}, "
            f"repetition >= {args.min_rep_seconds} s; loadavg at start `{load_start}`")


def environment_meta(started: str, load_start: str, load_end: str, args: argparse.Namespace,
                     extra_versions: dict[str, str] | None = None) -> dict[str, Any]:
    """The same information as environment_line, for the JSON file."""
    meta: dict[str, Any] = {"started": started, "torch": torch.__version__, "torchrl": torchrl.__version__}
    meta.update(extra_versions or {})
    meta.update({"threads": torch.get_num_threads(), "reps": args.reps, "quick": bool(getattr(args, "quick", False)),
                 "min_rep_seconds": args.min_rep_seconds, "loadavg_start": load_start,
                 "loadavg_end": load_end, "platform": platform.platform()})
    return meta


def target_row(
    key: str,
    label: str,
    rows: dict[str, dict[str, Any]],
    impl: str,
    baseline: str,
    target: float | None,
    bg: float,
    checks_ok: bool,
) -> dict[str, Any]:
    """Prints one markdown row of a Targets table and returns its JSON entry.

    ``rows`` maps implementation names to ``{"median_ms", "per_rep_ms"}``. The
    ratio is baseline time / implementation time from the same run; a fast
    but wrong implementation (``checks_ok`` false) never passes.
    """
    goal = f">= {target:g}x" if target is not None else "(info)"
    entry: dict[str, Any] = {"case": key, "impl": impl, "baseline": baseline, "target": target}
    if baseline not in rows:  # an optional peer that is not installed
        entry.update(ratio=None, paired=None, result="not measured")
        print(f"| {key} | {label} | - | - | {goal} | not measured (no {baseline}) | {bg:.2f} |")
        return entry
    ratio = rows[baseline]["median_ms"] / rows[impl]["median_ms"]
    lo, hi = paired_range(rows[baseline]["per_rep_ms"], rows[impl]["per_rep_ms"])
    if target is None:
        result = "-"
    elif not checks_ok:
        result = "FAIL (checks)"
    else:
        result = "PASS" if ratio >= target else "**FAIL**"
    entry.update(ratio=ratio, paired=[lo, hi], result=result)
    print(f"| {key} | {label} | {ratio:.2f}x | {lo:.2f}-{hi:.2f}x | {goal} | {result} | {bg:.2f} |")
    return entry


@dataclass
class Check:
    """One correctness check of a benchmark: a fast but wrong result never passes."""

    name: str
    ok: bool
    detail: str


def report_checks(checks: list[Check]) -> None:
    print("| check | result | detail |\n|---|:-:|---|")
    for c in checks:
        print(f"| {c.name} | {'ok' if c.ok else '**FAILED**'} | {c.detail} |")
    print()


# ---------------------------------------------------------------- shared pieces
@dataclass
class Impl:
    """One implementation in a timed case: ``fn`` is called ``k`` times per repetition."""

    name: str
    label: str
    fn: Callable[[], Any]
    per_rep: list[float] = field(default_factory=list)  # seconds per call, one per repetition
    k: int = 1


def proc_status(field_name: str) -> int:
    """A /proc/self/status field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def profile(label: str, fn: Callable[[], Any], calls: int, top: int) -> None:
    """Prints cProfile's top ``top`` functions (own time) over ``calls`` calls of ``fn``."""
    import cProfile
    import pstats
    import sys

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    print(f"### cProfile: {label}, {calls} calls, top {top} by own time (cProfile adds overhead per Python call)\n")
    print("```")
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(top)
    print("```\n")


def diagnose(title: str, pieces: Sequence[tuple[str, Callable[[], Any]]], reps: int, min_rep: float,
             args: argparse.Namespace | None = None, unit: str = "us") -> list[dict[str, Any]]:
    """Each piece of a path timed on its own (interleaved, median of ``reps``), as a table.

    With ``args``, waits for a quiet machine first and reports the background load.
    """
    import statistics

    scale = {"us": 1e6, "ms": 1e3}[unit]
    impls = [Impl(label, label, fn) for label, fn in pieces]
    note = ""
    if args is not None:
        waited, pre = quiet_before_case(args)
        meter = BgLoad()
    run_interleaved(impls, reps, min_rep)
    if args is not None:
        note = bg_note(meter.cores(), waited, pre, args) + ". "
    print(f"### Diagnostic: {title}\n\n{note}Each piece called on its own (interleaved, median of {reps} "
          "repetitions). Indented rows are parts of the call above them.\n")
    print(f"| piece | median {unit}/call | k |\n|---|---:|---:|")
    rows = []
    for impl in impls:
        med = statistics.median(impl.per_rep)
        rows.append({"piece": impl.label, f"median_{unit}": med * scale, "k": impl.k})
        print(f"| {impl.label} | {med * scale:,.{1 if unit == 'us' else 3}f} | {impl.k} |")
    print()
    return rows


def write_results(path: str, payload: dict[str, Any], checks: Sequence[Check]) -> None:
    """``payload`` plus the checks and their verdict as JSON at ``path`` (its folder is created)."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "checks": [c.__dict__ for c in checks], "checks_ok": all(c.ok for c in checks)}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
