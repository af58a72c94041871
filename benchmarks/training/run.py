"""Runs the training-loop cases, stock TorchRL against torchrl_ext, and checks issue 37's targets.

    python benchmarks/training/run.py                 # `make bench-train`: every case, 3 seeds, < 15 min
    python benchmarks/training/run.py --quick         # CI: every case for a few iterations, 1 seed
    python benchmarks/training/run.py --cases dqn_cartpole,pixel_dqn --seeds 1
    python benchmarks/training/run.py --write-docs    # full run, then the tables in README.md and RESULTS.md

**Full run**: each (case, seed, variant) runs in a fresh process (a child of a fork server that
has imported the cases' libraries once; ``<case>.py --variant V --seed S`` runs one alone), so
that peak memory is per variant; the two variants of a seed run back to back, their order
alternating with the seed (paired runs). Each run's part times are summed over its iterations and
divided by their number; a case's row holds the median over seeds and, in brackets, the range.
Ratios are computed per seed pair and summarised the same way.

**Quick run**: every case in this process (imports paid once), seed 0, a few iterations; it checks
that both variants run, that ``EXACT`` cases compute the same losses and that the pixel samples
are consistent. Timings of a quick run are not reported: they are warm-up.

Targets (torchrl_ext against stock, same machine, same run):

* every case: buffer + value time per iteration at most half of stock's;
* every case: not slower end to end (iteration time ratio >= 1);
* every learning case: the mean final return (last fifth of the run's frames) of one variant is
  within the other's spread: ``|mean_ext - mean_stock| <= max(range_stock, range_ext)`` over seeds;
* the pixel case: updates per second at least 1.5x stock's, buffer memory at most 1/6 of stock's.

A case module may set ``NOTE``, a line the table prints beside its checks (what a missed check
means there), and ``SEEDS``, its number of seeds in a full run (the pixel case: 2, each run
fills a 100k buffer first).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from _loop import PARTS, VARIANTS, timed_run  # noqa: E402

CASES = ["dqn_cartpole", "ppo_cartpole", "mappo_vmas", "dqn_per_nstep", "impala_cartpole", "pixel_dqn"]
LOSS_RTOL = 1e-4
START, END = "<!-- training:start -->", "<!-- training:end -->"


def _child(case: str, variant: str, seed: int, threads: int, device: str | None, results: Any) -> None:
    """One run in a child process: the record, or the traceback, goes to ``results``."""
    try:
        import torch
        torch.set_num_threads(threads)
        module = importlib.import_module(case)
        size = dict(module.FULL)
        if device is not None:
            size["device"] = device
        results.put(asdict(timed_run(module, variant, seed, size)))
    except BaseException:
        results.put({"error": traceback.format_exc()})


def run_full(ctx: Any, case: str, variant: str, seed: int, out_dir: Path, threads: int,
             device: str | None) -> dict[str, Any]:
    """One run in a fresh child of the fork server (which has imported every case's libraries,
    so a run pays no import time and its peak memory is its own); returns its record (also
    written to ``out_dir``)."""
    results = ctx.SimpleQueue()
    child = ctx.Process(target=_child, args=(case, variant, seed, threads, device, results))
    child.start()
    record = results.get()
    child.join()
    if "error" in record:
        raise RuntimeError(f"{case} --variant {variant} --seed {seed} failed:\n{record['error']}")
    (out_dir / f"{case}-{variant}-{seed}.json").write_text(json.dumps(record))
    return record


def run_quick(case: str, variant: str, seed: int) -> dict[str, Any]:
    """One quick run in this process."""
    module = importlib.import_module(case)
    return asdict(timed_run(module, variant, seed, module.QUICK, with_rss=False))  # one shared process


def per_iteration_ms(record: dict[str, Any]) -> dict[str, float]:
    """Mean milliseconds per iteration of each part, and ``total``."""
    n = len(record["iterations"])
    parts = {p: 1e3 * sum(it[p] for it in record["iterations"]) / n for p in PARTS}
    parts["total"] = sum(parts.values())
    parts["buffer+value"] = parts["buffer"] + parts["value"]
    return parts


def final_return(record: dict[str, Any]) -> float:
    """Mean of the curve's finite points in the last fifth of the run's frames."""
    points = [(f, r) for f, r in record["curve"] if not math.isnan(r)]
    if not points:
        return math.nan
    last = max(f for f, _ in points)
    tail = [r for f, r in points if f >= 0.8 * last]
    return sum(tail) / len(tail)


def losses_agree(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= LOSS_RTOL * max(abs(x), abs(y), 1e-6) for x, y in zip(a, b))


def median_range(values: list[float]) -> tuple[float, float, float]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return statistics.median(finite), min(finite), max(finite)


def summarise(case: str, records: dict[str, list[dict[str, Any]]], exact: bool, name: str,
              note: str = "") -> dict[str, Any]:
    """A case's row: per-variant medians and ranges, paired ratios, target verdicts."""
    out: dict[str, Any] = {"case": case, "name": name, "exact": exact, "variants": {}, "checks": {}, "note": note}
    for variant, runs in records.items():
        times = [per_iteration_ms(r) for r in runs]
        returns = [final_return(r) for r in runs]
        out["variants"][variant] = {
            "ms": {k: median_range([t[k] for t in times]) for k in times[0]},
            "updates_per_s": median_range([r["updates"] / (per_iteration_ms(r)["total"] * len(r["iterations"]) / 1e3)
                                           for r in runs]),
            "buffer_mb": statistics.median(r["buffer_bytes"] for r in runs) / 2**20,
            "peak_rss_mb": max(r["peak_rss_bytes"] for r in runs) / 2**20,
            "final_return": median_range(returns),
            "final_return_mean": statistics.fmean([x for x in returns if not math.isnan(x)] or [math.nan]),
            "seeds": [r["seed"] for r in runs],
        }
    if set(records) != set(VARIANTS):
        return out
    pairs = list(zip(records["stock"], records["torchrl_ext"]))
    bv = [per_iteration_ms(e)["buffer+value"] / per_iteration_ms(s)["buffer+value"] for s, e in pairs]
    e2e = [per_iteration_ms(s)["total"] / per_iteration_ms(e)["total"] for s, e in pairs]
    out["ratios"] = {"buffer+value": median_range(bv), "end_to_end": median_range(e2e),
                     "memory": records["torchrl_ext"][0]["buffer_bytes"] / records["stock"][0]["buffer_bytes"]}
    checks = out["checks"]
    checks["buffer+value <= 0.5 of stock"] = out["ratios"]["buffer+value"][0] <= 0.5
    checks["not slower end to end"] = out["ratios"]["end_to_end"][0] >= 1.0
    if exact:
        checks["same losses"] = all(losses_agree(s["losses"], e["losses"]) for s, e in pairs)
    if case == "pixel_dqn":
        checks["updates/s >= 1.5x stock"] = out["ratios"]["end_to_end"][0] >= 1.5
        checks["buffer memory <= 1/6 of stock"] = out["ratios"]["memory"] <= 1 / 6
        checks["samples consistent"] = all(r["extra"]["stacks_ok"] for runs in records.values() for r in runs)
    else:
        s, e = out["variants"]["stock"], out["variants"]["torchrl_ext"]
        spread = max(s["final_return"][2] - s["final_return"][1], e["final_return"][2] - e["final_return"][1])
        gap = abs(s["final_return_mean"] - e["final_return_mean"])
        out["return_gap"], out["return_spread"] = gap, spread
        checks["returns agree"] = gap <= spread if not math.isnan(gap) else False
    return out


def fmt(mr: tuple[float, float, float], digits: int = 1) -> str:
    m, lo, hi = mr
    if math.isnan(m):
        return "-"
    return f"{m:,.{digits}f}" if lo == hi else f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def markdown(rows: list[dict[str, Any]], meta: str) -> str:
    lines = [meta, "",
             "| case | variant | iteration ms | collect | buffer | value | network | updates/s | buffer MB | peak RSS MB | final return |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        for variant, v in row["variants"].items():
            ms = v["ms"]
            rss = f"{v['peak_rss_mb']:,.0f}" if v["peak_rss_mb"] else "-"  # quick runs share one process
            lines.append(f"| {row['name']} | {variant} | {fmt(ms['total'])} | {fmt(ms['collect'])} | {fmt(ms['buffer'], 2)} | "
                         f"{fmt(ms['value'], 2)} | {fmt(ms['network'])} | {fmt(v['updates_per_s'])} | {v['buffer_mb']:,.1f} | "
                         f"{rss} | {fmt(v['final_return'])} |")
    checks_only = [row for row in rows if not row.get("ratios")]  # quick runs: no targets
    lines += [""] + [f"- {row['name']}: " + ("; ".join(f"{k}: {'yes' if ok else '**no**'}" for k, ok in row["checks"].items())
                                          or "ran") for row in checks_only]
    with_targets = [row for row in rows if row.get("ratios")]
    if with_targets:
        lines += ["| case | buffer + value, torchrl_ext / stock (target <= 0.5) | end to end, stock / torchrl_ext "
                  "(target >= 1) | other checks | verdict |", "|---|--:|--:|---|:-:|"]
    for row in with_targets:
        r = row["ratios"]
        other = [k for k in row["checks"] if not k.startswith(("buffer+value", "not slower"))]
        other_txt = "; ".join(f"{k}: {'yes' if row['checks'][k] else '**no**'}" for k in other)
        if "return_gap" in row:
            other_txt += f" (gap {row['return_gap']:.1f}, seed spread {row['return_spread']:.1f})"
        if row["case"] == "pixel_dqn":
            other_txt += f" (memory {r['memory']:.3f} of stock)"
        if row.get("note"):
            other_txt += f"; {row['note']}"
        verdict = "met" if all(row["checks"].values()) else "**missed**"
        lines.append(f"| {row['name']} | {fmt(r['buffer+value'], 2)} | {fmt(r['end_to_end'], 2)}x | {other_txt} | {verdict} |")
    return "\n".join(lines)


def replace_block(path: Path, table: str) -> None:
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path} has no {START} ... {END} block to rewrite")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{table}\n{END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds per case (full: 3, or the case's SEEDS; quick: 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="learner device of the pixel case (e.g. cuda)")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--write-docs", action="store_true", help="rewrite the training tables of README.md and RESULTS.md")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; choose from {CASES}")
    out_dir = args.out_dir or ROOT / "benchmarks" / "results" / ("training_quick" if args.quick else "training")
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    torch.set_num_threads(args.threads)
    ctx = None
    if not args.quick:
        ctx = multiprocessing.get_context("forkserver")
        # The server imports the cases once; it finds them through PYTHONPATH (it does not
        # inherit this process's sys.path).
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        ctx.set_forkserver_preload(cases)
    rows, start = [], time.perf_counter()
    quick_checks = ("same losses", "samples consistent")  # a quick run's timings and returns are warm-up
    for case in cases:
        module = importlib.import_module(case)
        records: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        case_seeds = 1 if args.quick else args.seeds or getattr(module, "SEEDS", 3)
        for seed in range(case_seeds):
            order = VARIANTS if seed % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                t0 = time.perf_counter()
                if args.quick:
                    record = run_quick(case, variant, seed)
                else:
                    device = args.device if case == "pixel_dqn" else None
                    record = run_full(ctx, case, variant, seed, out_dir, args.threads, device)
                records[variant].append(record)
                print(f"  {case} seed {seed} {variant}: {time.perf_counter() - t0:.0f} s", flush=True)
        row = summarise(case, records, module.EXACT, module.NAME, getattr(module, "NOTE", ""))
        if args.quick:
            row["checks"] = {k: ok for k, ok in row["checks"].items() if k in quick_checks}
            row["note"], row["ratios"] = "", {}
        rows.append(row)
    import platform

    import torchrl
    meta = (f"Measured {time.strftime('%Y-%m-%d')} by `python benchmarks/training/run.py"
            f"{' --quick' if args.quick else ''}` on {platform.machine()} ({torch.get_num_threads()} torch thread(s), "
            f"{'1 seed' if args.quick else f'{args.seeds} seed(s)' if args.seeds else '3 seeds (pixel: 2)'} per variant; torch {torch.__version__.split('+')[0]}, torchrl {torchrl.__version__}); "
            f"milliseconds per iteration, median over seeds (range).")
    table = markdown(rows, meta)
    (out_dir / "training.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "training.md").write_text(table + "\n")
    print(f"\n{table}\n\n{time.perf_counter() - start:.0f} s in all; results in {out_dir}")
    if args.quick:
        failed = [f"{row['case']}: {k}" for row in rows for k, ok in row["checks"].items() if not ok]
        if failed:
            print("FAILED:", "; ".join(failed))
            return 1
        print("quick check passed: both variants of every case ran; exact cases computed the same losses")
        return 0
    if args.write_docs:
        for path in (ROOT / "README.md", HERE.parent / "RESULTS.md"):
            replace_block(path, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
