"""Turns the JSON files of the benchmark scripts into ``benchmarks/RESULTS.md`` and the PNG plots.

    python benchmarks/report.py                          # reads benchmarks/results/*.json
    python benchmarks/report.py --results DIR --output-md PATH --img-dir DIR

``suite.py`` calls it after a full run. Every number comes from the JSON files: for each case,
torchrl_ext's time is compared with the **best peer** (the fastest library implementation of
the same operation in the same process; references such as a plain torch loop or a bare
``index_select`` are listed but are not peers), and every target a script defines is listed with
its verdict. Ratios are peer time / torchrl_ext time, so > 1 means torchrl_ext is faster.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Order of the scripts in the report, with a one-line description.
BENCHES = {
    "storage": "replay storage: insert and uniform sample, vec (533 B) and pixel (56 kB) transitions",
    "prioritized": "prioritized replay: sample + update_priority",
    "nstep": "n-step sampling from per-env rings",
    "ring": "per-env ring buffer: add_batch and trajectory windows",
    "minibatch": "on-policy epochs of recurrent minibatches (HARL layout)",
    "onpolicy": "on-policy GAE buffer with intrinsic rewards: returns + one epoch (pytorchrl)",
    "value": "GAE and V-trace",
    "dedup": "deduplicating pixel storage: insert and sample",
    "sweep": "sweeps: sample vs batch size and capacity, prioritized vs batch size, GAE vs T, V-trace vs (T, N)",
    "ppo_loop": "TorchRL's PPO loop: stock components vs the README's swap (storage and GAE)",
}

# bench -> [(case regex, torchrl_ext implementation, candidate peers)]; the best peer of a case
# is the fastest candidate present. Everything else in a case is a reference or a component.
COMPARISONS: dict[str, list[tuple[str, str, list[str]]]] = {
    "ppo_loop": [(r".", "torchrl_ext", ["stock"])],
    "storage": [(r".", "torchrl_ext", ["torchrl", "cpprb", "sb3"])],
    "prioritized": [(r"^per_1M_", "torchrl_ext", ["cpprb", "torchrl"]),
                    (r"^per_1M_", "torchrl_ext sampler only", ["torchrl sampler only"])],
    "nstep": [(r"^(sample|insert)_", "torchrl_ext", ["torchrl MultiStepTransform"])],
    "ring": [(r"^sample_", "torchrl_ext", ["torchrl SliceSampler", "torchrl SliceSampler cache_values"]),
             (r"^insert_", "torchrl_ext", ["cpprb", "torchrl routing extend(td[e:e+1])",
                                           "torchrl routing add(unbind)"])],
    "minibatch": [(r"^nmb", "torchrl_ext RolloutStorage", ["HARL numpy", "torchrl SliceSamplerWoR traj=chunk"])],
    "onpolicy": [(r".", "torchrl_ext", ["pytorchrl GAEBuffer"])],
    "value": [(r"^gae_", "torchrl_ext", ["torchrl vec_gae", "torchrl gae loop"]),
              (r"^vtrace_", "torchrl_ext", ["torchrl vtrace"])],
    "dedup": [(r".", "dedup", ["torchrl"])],
    "sweep": [(r"^(sample|per)_", "torchrl_ext", ["torchrl", "cpprb", "sb3"]),
              (r"^gae_", "torchrl_ext", ["torchrl vec_gae", "torchrl gae loop", "sb3 RolloutBuffer"]),
              (r"^vtrace_", "torchrl_ext", ["torchrl vtrace"])],
}


@dataclass
class Comparison:
    """torchrl_ext against the best peer in one case of one script."""

    bench: str
    case: str
    title: str
    impl: str
    peer: str
    ratio: float  # peer median time / torchrl_ext median time
    paired: tuple[float, float] | None  # min, max over repetitions of the same round
    ext_ms: float
    peer_ms: float
    others: dict[str, float]  # every candidate peer -> its ratio
    bg_load: float | None = None  # CPU cores used by other processes during the case

    @property
    def key(self) -> str:
        """Identifies the comparison across runs (the baseline file's keys)."""
        return f"{self.bench}/{self.case}/{self.impl}"


def load_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """``{bench: payload}`` for every ``<bench>.json`` (or ``bench_<bench>.json``) in the folder."""
    out = {}
    for path in sorted(results_dir.glob("*.json")):
        name = path.stem.removeprefix("bench_")
        if name in BENCHES:
            with path.open() as f:
                out[name] = json.load(f)
    return out


def missing_results(results: dict[str, dict[str, Any]]) -> list[str]:
    """The scripts of ``BENCHES`` without results in ``results`` (:func:`load_results`). The results
    are not in git, so on a fresh clone a partial run leaves the others missing."""
    return [name for name in BENCHES if name not in results]


def case_impls(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    impls = case.get("impls") or {}
    if isinstance(impls, list):
        return {r.get("name", r.get("impl")): r for r in impls}
    return impls


def comparisons(results: dict[str, dict[str, Any]]) -> list[Comparison]:
    """Every (case, torchrl_ext implementation) against its best peer, in BENCHES order."""
    rows = []
    for bench in BENCHES:
        for case_key, case in (results.get(bench, {}).get("cases") or {}).items():
            impls = case_impls(case)
            for pattern, ext, candidates in COMPARISONS[bench]:
                if not re.search(pattern, case_key) or ext not in impls:
                    continue
                present = [c for c in candidates if c in impls and impls[c].get("median_ms")]
                if not present:
                    continue
                best = min(present, key=lambda c: impls[c]["median_ms"])
                ext_ms, peer_ms = impls[ext]["median_ms"], impls[best]["median_ms"]
                paired = None
                a, b = impls[best].get("per_rep_ms"), impls[ext].get("per_rep_ms")
                if a and b and len(a) == len(b):
                    ratios = [x / y for x, y in zip(a, b)]
                    paired = (min(ratios), max(ratios))
                rows.append(Comparison(bench, case_key, case.get("title", case_key), ext, best, peer_ms / ext_ms,
                                       paired, ext_ms, peer_ms,
                                       {c: impls[c]["median_ms"] / ext_ms for c in present}, case.get("bg_load")))
    return rows


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target the scripts define, with the measured ratio and verdict."""
    out = []
    for bench in BENCHES:
        data = results.get(bench, {})
        for t in data.get("targets") or []:
            if t.get("target_max", t.get("target")) is None:  # an informational ratio
                continue
            result = t.get("result")
            if result is None and "pass" in t:
                result = "PASS" if t["pass"] else "FAIL"
            # "target_max" (nstep's scaling) and a target without a baseline (the 10M tree's bytes
            # per 4-byte priority) are upper limits: lower is better.
            upper = "target_max" in t or t.get("baseline") is None
            baseline = t.get("baseline") or ("tree bytes / (4 B x capacity)" if t["case"] == "per_10M_sampler" else "-")
            out.append({"bench": bench, "case": t["case"], "impl": t["impl"], "baseline": baseline,
                        "ratio": t.get("ratio"), "target": t.get("target_max", t.get("target")),
                        "result": (result or "-").strip("*"), "upper": upper})
        summary = (data.get("memory") or {}).get("summary") if isinstance(data.get("memory"), dict) else None
        if summary and "target" in summary:
            dedup = summary.get("dedup", {})
            worst = max(dedup.get("tensor_per_tr", 0), dedup.get("peak_delta_per_tr", 0))
            out.append({"bench": bench, "case": "memory", "impl": "dedup", "baseline": "bytes per pixel transition",
                        "ratio": worst, "target": summary["target"]["limit"],
                        "result": summary["target"]["result"], "unit": "B", "upper": True})
    return out


def memory_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Peak resident bytes per stored transition: vec (sweep) and pixel (dedup) transitions."""
    rows = []
    vec = (results.get("sweep") or {}).get("memory")
    if vec:
        for impl, r in vec["impls"].items():
            if "error" not in r:
                rows.append({"schema": f"vec ({vec['row_bytes']} B of data), capacity {vec['capacity']:,}",
                             "impl": impl, "peak": r["peak_delta_per_tr"], "data": vec["row_bytes"]})
    pix = ((results.get("dedup") or {}).get("memory") or {}).get("summary")
    if pix:
        names = {"dedup": "torchrl_ext DedupEnvRingStorage", "plain ring": "torchrl_ext EnvRingStorage"}
        for impl, r in pix.items():
            if impl != "target" and isinstance(r, dict):
                rows.append({"schema": "pixel (4 x 84 x 84 u8 stack + next: 56,448 B of data)",
                             "impl": names.get(impl, impl), "peak": max(r["peak_delta_per_tr"], r["tensor_per_tr"]),
                             "data": 56448})
    return rows


# ---------------------------------------------------------------- markdown
def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def meta_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for bench in BENCHES:
        m = results.get(bench, {}).get("meta")
        if not m:
            continue
        peers = ", ".join(f"{k} {m[k]}" for k in ("tensordict", "cpprb", "stable-baselines3", "pytorchrl", "numpy")
                          if k in m)
        lines.append(f"| {bench} | {m.get('started', '-')} | torch {m.get('torch')}, torchrl {m.get('torchrl')}"
                     f"{', ' + peers if peers else ''} | {m.get('threads')} | {m.get('reps')} | "
                     f"{'quick' if m.get('quick') else 'full'} | `{m.get('loadavg_start', '-')}` |")
    return lines


TRAINING_START, TRAINING_END = "<!-- training:start -->", "<!-- training:end -->"


def training_block(old_md: Path) -> str:
    """The training-loop table that ``benchmarks/training/run.py --write-docs`` wrote into the
    previous RESULTS.md, markers included; this report keeps it (it measures other things)."""
    text = old_md.read_text() if old_md.exists() else ""
    if TRAINING_START in text and TRAINING_END in text:
        return TRAINING_START + text.split(TRAINING_START, 1)[1].split(TRAINING_END, 1)[0] + TRAINING_END
    return f"{TRAINING_START}\nNot measured yet: run `make bench-train`.\n{TRAINING_END}"


def markdown(results: dict[str, dict[str, Any]], img_rel: str, training: str = "") -> str:
    comps, tgts, mem = comparisons(results), targets(results), memory_rows(results)
    platform = next((r["meta"].get("platform") for r in results.values() if r.get("meta")), "-")
    out = ["# Benchmark results", "",
           "Generated by `benchmarks/report.py` from the JSON files of `make bench` (`python benchmarks/suite.py`); "
           "do not edit by hand. Method: `benchmarks/README.md` (peers and torchrl_ext in one process, warm-up, "
           "median of the repetitions, one torch thread, repetitions interleaved round-robin, background load "
           "measured and waited out).", "",
           f"Machine: {platform}, 2 logical CPUs, no GPU. Ratios are **peer time / torchrl_ext time** "
           "(> 1: torchrl_ext is faster). The paired range is the min-max over repetitions of the same round. "
           "bg load: CPU cores used by other processes during the case (each script waits for it to drop "
           "below 0.3 before a case, up to 30 s).", "",
           "## Runs", "", "| script | started | versions | torch threads | reps | mode | loadavg at start |",
           "|---|---|---|---:|---:|---|---|", *meta_lines(results), "",
           "## Training loops", "",
           "Stock TorchRL against torchrl_ext in training loops (`benchmarks/training/`, `make bench-train`; "
           "issue 37's targets). The pixel case with the learner on a GPU (`--device cuda`): not measured, "
           "no GPU machine was available.", "", training, "",
           "## Targets", "",
           "Every target of the project issues, as the scripts measure it (a missed target stays listed).", "",
           "| script | case | torchrl_ext | against | measured | target | result |", "|---|---|---|---|---:|---:|:-:|"]
    for t in tgts:
        unit = t.get("unit")
        measured = f"{t['ratio']:,.0f} {unit}" if unit else fmt_ratio(t["ratio"])
        goal = (f"<= {t['target']:,.0f} {unit}" if unit else "-" if not t["target"]
                else f"{'<=' if t['upper'] else '>='} {t['target']:g}x")
        result = t["result"] if t["result"] != "FAIL" else "**FAIL**"
        out.append(f"| {t['bench']} | {t['case']} | {t['impl']} | {t['baseline'] or '-'} | {measured} | {goal} | "
                   f"{result} |")
    out += ["", "## torchrl_ext against the best peer, every case", ""]
    for bench, what in BENCHES.items():
        rows = [c for c in comps if c.bench == bench]
        if not rows:
            continue
        out += [f"### {bench}: {what}", "",
                "| case | torchrl_ext | best peer | ratio | paired | torchrl_ext ms | peer ms | all peers | bg load |",
                "|---|---|---|---:|---:|---:|---:|---|---:|"]
        for c in rows:
            paired = f"{c.paired[0]:.2f}-{c.paired[1]:.2f}x" if c.paired else "-"
            others = ", ".join(f"{k} {v:.2f}x" for k, v in c.others.items())
            bg = "-" if c.bg_load is None else f"{c.bg_load:.2f}"
            out.append(f"| {c.title} | {c.impl} | {c.peer} | {c.ratio:.2f}x | {paired} | {c.ext_ms:.3f} | "
                       f"{c.peer_ms:.3f} | {others} | {bg} |")
        out.append("")
    if mem:
        out += ["## Peak memory per stored transition", "",
                "Each implementation filled in its own process; bytes = peak RSS growth during construction and "
                "fill / capacity.", "", "| transitions | implementation | peak B/transition | x data |",
                "|---|---|---:|---:|"]
        out += [f"| {r['schema']} | {r['impl']} | {r['peak']:,.0f} | {r['peak'] / r['data']:.2f}x |" for r in mem]
        out.append("")
    out += ["## Plots", "", f"![throughput]({img_rel}/bench_throughput.png)", "",
            f"![value estimation]({img_rel}/bench_value.png)", "",
            f"![summary]({img_rel}/benchmark_summary.png)", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- plots
STYLE = {"torchrl_ext": ("tab:green", "o"), "torchrl": ("tab:blue", "s"), "cpprb": ("tab:orange", "^"),
         "sb3": ("tab:purple", "D"), "torchrl vec_gae": ("tab:blue", "s"), "torchrl gae loop": ("tab:cyan", "v"),
         "sb3 RolloutBuffer": ("tab:purple", "D"), "plain torch loop": ("tab:grey", "x"),
         "torchrl vtrace": ("tab:blue", "s")}


def sweep_series(results: dict[str, dict[str, Any]], sweep: str, per_item: bool) -> dict[str, list[tuple[float, float]]]:
    """``{impl: [(x, y)]}`` of one sweep: y = items/s if per_item else median ms."""
    series: dict[str, list[tuple[float, float]]] = {}
    for case in ((results.get("sweep") or {}).get("cases") or {}).values():
        if case.get("sweep") != sweep:
            continue
        for impl, r in case["impls"].items():
            y = case["items_per_call"] / (r["median_ms"] / 1e3) if per_item else r["median_ms"]
            series.setdefault(impl, []).append((case["x"], y))
    return {k: sorted(v) for k, v in series.items()}


def fmt_count(x: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div and x % div == 0:
            return f"{x / div:.0f}{suffix}"
    return f"{x:g}"


def _line_panel(ax: Any, series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str) -> None:
    for impl, points in series.items():
        color, marker = STYLE.get(impl, ("black", "."))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, color=color, label=impl,
                linestyle="--" if impl == "plain torch loop" else "-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = sorted({p[0] for points in series.values() for p in points})
    ax.set_xticks(xs, [fmt_count(x) for x in xs], fontsize=7)
    ax.xaxis.set_minor_formatter("")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def new_figure(w: float, h: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def plot_throughput(results: dict[str, dict[str, Any]], path: Path) -> bool:
    panels = [("sample_batch", "uniform sample(B), capacity 100k", "batch size B"),
              ("sample_capacity", "uniform sample(256)", "capacity (transitions)"),
              ("per_batch", "prioritized sample(B) + update_priority(B)", "batch size B")]
    panels = [(s, t, x, sweep_series(results, s, True)) for s, t, x in panels]
    panels = [p for p in panels if p[3]]
    if not panels:
        return False
    fig = new_figure(5 * len(panels), 4)
    for i, (_, title, xlabel, series) in enumerate(panels):
        _line_panel(fig.add_subplot(1, len(panels), i + 1), series, title, xlabel, "transitions / s (higher is better)")
    fig.suptitle("Replay throughput, vec transitions (533 B), 1 torch thread, 2-core CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def plot_value(results: dict[str, dict[str, Any]], path: Path) -> bool:
    gae = sweep_series(results, "gae_T", False)
    vtrace = [c for c in ((results.get("sweep") or {}).get("cases") or {}).values() if c.get("sweep") == "vtrace_TN"]
    if not gae and not vtrace:
        return False
    fig = new_figure(10, 4)
    if gae:
        _line_panel(fig.add_subplot(1, 2, 1), gae, "GAE, N = 64 envs, P(done) = 0.01", "horizon T",
                    "median ms per call (lower is better)")
    if vtrace:
        ax = fig.add_subplot(1, 2, 2)
        vtrace.sort(key=lambda c: (c["x"], c.get("T", 0)))
        labels = [f"T={c.get('T')}\nN={c.get('N')}" for c in vtrace]
        impls = ["torchrl vtrace", "torchrl_ext"]
        width = 0.38
        for j, impl in enumerate(impls):
            xs = [i + (j - 0.5) * width for i in range(len(vtrace))]
            ax.bar(xs, [c["impls"][impl]["median_ms"] for c in vtrace], width, label=impl,
                   color=STYLE[impl][0])
        ax.set_xticks(range(len(vtrace)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per call (lower is better)", fontsize=8)
        ax.set_title("V-trace", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle("Value estimation, float32, 1 torch thread, 2-core CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def plot_summary(results: dict[str, dict[str, Any]], path: Path) -> bool:
    """Targets as bars: measured ratio (log), the target as a black tick; green met, red missed."""
    rows = [t for t in targets(results) if t["ratio"] is not None and t["target"] and not t["upper"]]
    if not rows:
        return False
    fig = new_figure(9, 0.42 * len(rows) + 1.4)
    ax = fig.add_subplot(1, 1, 1)
    y = list(range(len(rows)))[::-1]
    colors = {"PASS": "tab:green", "FAIL": "tab:red"}
    ax.barh(y, [r["ratio"] for r in rows], color=[colors.get(r["result"], "tab:grey") for r in rows])
    for yi, r in zip(y, rows):
        ax.plot([r["target"]] * 2, [yi - 0.4, yi + 0.4], color="black", linewidth=2)
        ax.text(r["ratio"] * 1.08, yi, f"{r['ratio']:.2f}x", va="center", fontsize=7)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(y, [f"{r['bench']}: {r['case']} ({r['impl']} vs {r['baseline']})" for r in rows], fontsize=6)
    ax.set_xlabel("peer time / torchrl_ext time (log; black tick = target; green met, red missed)", fontsize=8)
    ax.set_title("torchrl_ext against its targets, same process, 2-core CPU, 1 torch thread", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def readme_table(results: dict[str, dict[str, Any]]) -> str:
    """The targets as a compact table for the project README (between its bench markers)."""
    dates = sorted({r["meta"]["started"][:10] for r in results.values() if r.get("meta", {}).get("started")})
    lines = [f"Measured {' to '.join(dict.fromkeys([dates[0], dates[-1]])) if dates else '-'} by `make bench`; "
             "generated from [benchmarks/RESULTS.md](benchmarks/RESULTS.md), which also has every case against "
             "its best peer and the memory table.", "",
             "| script | case | torchrl_ext vs | measured | target | |", "|---|---|---|---:|---:|:-:|"]
    for t in targets(results):
        unit = t.get("unit")
        measured = f"{t['ratio']:,.0f} {unit}" if unit else fmt_ratio(t["ratio"])
        goal = (f"<= {t['target']:,.0f} {unit}" if unit else f"{'<=' if t['upper'] else '>='} {t['target']:g}x")
        verdict = "met" if t["result"] == "PASS" else "**missed**" if t["result"] == "FAIL" else t["result"]
        # Cases measured for several torchrl_ext components name the component.
        impl = str(t["impl"]).removeprefix("torchrl_ext").strip()
        case = t["case"] if not impl or impl == "dedup" else f"{t['case']} ({impl})"
        lines.append(f"| {t['bench']} | {case} | {t['baseline']} | {measured} | {goal} | {verdict} |")
    return "\n".join(lines)


def update_readme(readme: Path, results: dict[str, dict[str, Any]]) -> bool:
    """Replaces the text between the README's bench markers; False if it has no markers."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        return False
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{readme_table(results)}\n{README_END}{tail}")
    return True


def write_report(results_dir: Path, output_md: Path, img_dir: Path, readme: Path | None = None,
                 partial: bool = False) -> list[Path]:
    """Writes RESULTS.md, the plots and (given ``readme``) the README's table; returns the files written.

    Raises:
        FileNotFoundError: if ``results_dir`` has no results, or (unless ``partial``) lacks some
            script's: the report would silently drop that script's sections and targets.
    """
    results = load_results(results_dir)
    if not results:
        raise FileNotFoundError(f"no benchmark JSON files in {results_dir}: run `python benchmarks/suite.py` first")
    missing = missing_results(results)
    if missing and not partial:
        raise FileNotFoundError(
            f"no results for {', '.join(missing)} in {results_dir}, so the report would drop their sections and "
            f"targets: run them (`python benchmarks/suite.py --scripts {','.join(missing)}`) or the full suite, "
            "or pass --partial to write a report of the scripts present only")
    img_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in (("bench_throughput.png", plot_throughput), ("bench_value.png", plot_value),
                       ("benchmark_summary.png", plot_summary)):
        if plot(results, img_dir / name):
            written.append(img_dir / name)
    rel = Path(os.path.relpath(img_dir.resolve(), output_md.parent.resolve()))
    training = training_block(output_md)
    output_md.write_text(markdown(results, rel.as_posix(), training) + "\n")
    written.append(output_md)
    if readme is not None and update_readme(readme, results):
        written.append(readme)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=HERE / "results", help="folder of the scripts' JSON files")
    ap.add_argument("--output-md", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md",
                    help="README whose bench:start/bench:end block is rewritten (--readme '' to skip)")
    ap.add_argument("--partial", action="store_true",
                    help="write the report even if some scripts have no results (their sections are left out)")
    a = ap.parse_args()
    readme = a.readme if str(a.readme) not in ("", ".") else None
    for path in write_report(a.results, a.output_md, a.img_dir, readme, partial=a.partial):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
