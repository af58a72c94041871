"""Plots ``docs/benchmark_summary.csv`` (headline ratios of the benchmark scripts) as ``docs/img/benchmark_summary.png``.

The CSV holds the ratios the scripts printed in their latest documented runs
(``benchmarks/README.md`` gives each run's date, load and paired range). Each
bar is torchrl_ext's speed relative to the named peer (higher is better), on a
log scale, with its target as a tick: green bars meet the target, red ones do not.

    python benchmarks/plot_summary.py
"""
from __future__ import annotations

import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "benchmark_summary.csv"
OUTPUT = ROOT / "docs" / "img" / "benchmark_summary.png"


def main() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with SOURCE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    labels = [f"{r['case']}\n{r['comparison']}" for r in rows]
    ratios = [float(r["ratio"]) for r in rows]
    colors = {"PASS": "tab:green", "FAIL": "tab:red"}
    fig = Figure(figsize=(9, 0.5 * len(rows) + 1.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    y = list(range(len(rows)))[::-1]
    ax.barh(y, ratios, color=[colors.get(r["result"], "tab:grey") for r in rows])
    for yi, r in zip(y, rows):
        if r["target"]:
            ax.plot([float(r["target"])] * 2, [yi - 0.4, yi + 0.4], color="black", linewidth=2)
        ax.text(float(r["ratio"]) * 1.08, yi, f"{float(r['ratio']):.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("torchrl_ext speed / peer speed (log; black tick = target; green met, red missed)")
    ax.set_title("torchrl_ext against its peers, same process, 2-core CPU, 1 torch thread")
    fig.tight_layout()
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUTPUT, format="png")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
