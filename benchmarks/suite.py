"""The whole benchmark suite in one command: every script, then RESULTS.md and the plots.

    python benchmarks/suite.py                        # full run (`make bench`): about 25 min, ~18 GB of RAM
    python benchmarks/suite.py --quick                # CI's regression check (`make bench-quick`): < 3 min
    python benchmarks/suite.py --quick --update-baseline   # store the median quick ratios of 3 runs
    python benchmarks/suite.py --scripts value,sweep  # a subset (full or quick)

Each script runs in its own process (peers and torchrl_ext together in that process, as the
method requires) and writes ``<results>/<script>.json`` and ``<script>.md`` (its markdown report).

**Full run**: the results go to ``benchmarks/results/`` (not in git); ``report.py`` then
regenerates ``benchmarks/RESULTS.md`` and the plots in ``docs/img/``.

**Quick run** (CI): every script with ``--quick --no-wait`` and the smaller sizes of ``QUICK``,
into ``benchmarks/results/quick/``. The scripts run one after the other inside this process
(``runpy``), which saves the ~7 s of imports each would pay in a fresh interpreter. Each torchrl_ext-vs-best-peer ratio (see ``report.py``) is
compared with the ratio stored for it in ``benchmarks/baseline_quick.json``, measured in the same
quick mode on this project's 2-core machine. Only ratios are compared, never absolute times, so a
slower or faster machine does not trip the check. A ratio below ``stored / 2`` is a regression
candidate; its script is re-run on just those cases, and a regression is reported (exit 1) only
if the second measurement is also below half the stored ratio. A script that fails its own
correctness checks, or a stored comparison that is no longer measured, also fails the run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import runpy
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import report

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline_quick.json"
REGRESSION_FACTOR = 2.0

# Script order of a run, and the extra arguments of each under --quick (on top of --quick --no-wait).
SCRIPTS = ["value", "prioritized", "storage", "ring", "minibatch", "dedup", "nstep", "onpolicy", "sweep", "ppo_loop"]
QUICK: dict[str, list[str]] = {
    "value": ["--only", "gae_T2048_N64_p0.01,gae_T32_N64_p0.01,vtrace"],
    "prioritized": ["--only", "per_1M"],  # the 10M tree is a memory target, measured in full runs
    # img sample(4096) is left out: 231 MB per call, one call per quick repetition, page-fault
    # bound; its quick ratio moved 0.27-0.74x between runs of the same code.
    "storage": ["--vec-capacity", "100000", "--img-capacity", "4000",
                "--only", "vec_insert,vec_sample,img_insert,img_sample_B256"],
    "ring": [],
    "minibatch": [],
    "dedup": [],
    "nstep": ["--only", "sample_B256_n5,insert"],  # the scaling case builds three more buffers
    "onpolicy": [],
    "sweep": [],
    "ppo_loop": [],
}


@dataclass
class Run:
    script: str
    returncode: int
    seconds: float
    json_path: Path
    md_path: Path


def run_script(script: str, out_dir: Path, quick: bool, only: str | None = None, tag: str = "") -> Run:
    """Runs ``bench_<script>.py`` in its own process; its markdown goes to ``<out_dir>/<script><tag>.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{script}{tag}.json", out_dir / f"{script}{tag}.md"
    cmd = [sys.executable, str(HERE / f"bench_{script}.py"), "--json", str(json_path)]
    if quick:
        extra = list(QUICK[script])
        if only is not None and "--only" in extra:  # a re-run: the regressed cases replace the quick subset
            i = extra.index("--only")
            del extra[i:i + 2]
        cmd += ["--quick", "--no-wait", *extra]
    if only is not None:
        cmd += ["--only", only]
    t0 = time.perf_counter()
    with md_path.open("w") as out:
        code = run_inline(cmd[1:], out) if quick else \
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE.parent).returncode
    run = Run(script, code, time.perf_counter() - t0, json_path, md_path)
    status = "ok" if code == 0 else f"FAILED (exit {code}; see {md_path})"
    print(f"  {script}{' (re-run: ' + only + ')' if only else ''}: {run.seconds:.0f} s, {status}", flush=True)
    if code:
        print("\n".join(md_path.read_text().splitlines()[-25:]))
    return run


def run_inline(argv: list[str], out: Any) -> int:
    """Runs a script as ``__main__`` in this process with ``sys.argv = argv``; returns its exit code."""
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:  # a crashing script fails the run, the others still run
        traceback.print_exc(file=out)
        return 1
    finally:
        sys.argv = saved


def load(out_dir: Path, scripts: list[str], tag: str = "") -> dict[str, dict]:
    results = {}
    for script in scripts:
        path = out_dir / f"{script}{tag}.json"
        if path.exists():
            with path.open() as f:
                results[script] = json.load(f)
    return results


def ratios(results: dict[str, dict]) -> dict[str, report.Comparison]:
    return {c.key: c for c in report.comparisons(results)}


@dataclass
class Verdict:
    key: str
    stored: float | None
    measured: float | None
    retried: float | None = None

    @property
    def best(self) -> float | None:
        values = [v for v in (self.measured, self.retried) if v is not None]
        return max(values) if values else None

    @property
    def status(self) -> str:
        if self.stored is None:
            return "new (no stored ratio)"
        if self.best is None:
            return "MISSING"
        return "REGRESSION" if self.best < self.stored / REGRESSION_FACTOR else "ok"


def compare(measured: dict[str, float], stored: dict[str, float]) -> list[Verdict]:
    """One verdict per comparison in either set (ratios only: peer time / torchrl_ext time)."""
    keys = list(stored) + [k for k in measured if k not in stored]
    return [Verdict(k, stored.get(k), measured.get(k)) for k in keys]


def regressed(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.status in ("REGRESSION", "MISSING")]


def retry_plan(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """``{script: [case keys]}`` of the regression candidates (missing ones are not re-run)."""
    plan: dict[str, list[str]] = {}
    for v in verdicts:
        if v.status == "REGRESSION":
            script, case, _ = v.key.split("/", 2)
            plan.setdefault(script, [])
            if case not in plan[script]:
                plan[script].append(case)
    return plan


def print_verdicts(verdicts: list[Verdict]) -> None:
    print("\n| comparison (script/case/torchrl_ext impl) | stored | measured | re-run | status |\n|---|---:|---:|---:|:-:|")
    for v in verdicts:
        cells = ["-" if x is None else f"{x:.2f}x" for x in (v.stored, v.measured, v.retried)]
        status = v.status if v.status in ("ok",) or v.status.startswith("new") else f"**{v.status}**"
        print(f"| {v.key} | {cells[0]} | {cells[1]} | {cells[2]} | {status} |")


def quick_check(scripts: list[str], out_dir: Path, update_baseline: bool, repeat: int = 1) -> int:
    runs = [run_script(s, out_dir, quick=True) for s in scripts]
    failed = [r.script for r in runs if r.returncode]
    measured = {k: c.ratio for k, c in ratios(load(out_dir, scripts)).items()}
    if update_baseline:
        samples = {k: [v] for k, v in measured.items()}
        for i in range(1, repeat):
            print(f"Baseline measurement {i + 1} of {repeat}:")
            runs = [run_script(s, out_dir, quick=True, tag=f"_{i}") for s in scripts]
            failed += [r.script for r in runs if r.returncode]
            for k, c in ratios(load(out_dir, scripts, tag=f"_{i}")).items():
                samples.setdefault(k, []).append(c.ratio)
        if failed:
            print(f"not updating the baseline: {', '.join(sorted(set(failed)))} failed")
            return 1
        stored_all = json.loads(BASELINE.read_text())["ratios"] if BASELINE.exists() else {}
        stored_all = {k: v for k, v in stored_all.items() if k.split("/", 1)[0] not in scripts}
        stored_all.update({k: statistics.median(v) for k, v in samples.items()})
        BASELINE.write_text(json.dumps({"about": "torchrl_ext vs best-peer ratios (peer time / torchrl_ext time) of "
                                                 "`python benchmarks/suite.py --quick`, median of "
                                                 f"{repeat} runs on the project's 2-core machine; CI fails below "
                                                 f"1/{REGRESSION_FACTOR:g} of each", "factor": REGRESSION_FACTOR,
                                        "ratios": dict(sorted(stored_all.items()))}, indent=1) + "\n")
        print(f"wrote {len(samples)} ratios (median of {repeat} runs) to {BASELINE}")
        return 0
    stored = json.loads(BASELINE.read_text())["ratios"]
    stored = {k: v for k, v in stored.items() if k.split("/", 1)[0] in scripts}
    verdicts = compare(measured, stored)
    plan = retry_plan(verdicts)
    if plan:
        print("\nRe-running the regression candidates once:")
        by_key = {v.key: v for v in verdicts}
        for script, cases in plan.items():
            r = run_script(script, out_dir, quick=True, only=",".join(cases), tag="_rerun")
            if r.returncode:
                failed.append(script)
            for key, c in ratios(load(out_dir, [script], tag="_rerun")).items():
                if key in by_key:
                    by_key[key].retried = c.ratio
    print_verdicts(verdicts)
    bad = regressed(verdicts)
    print(f"\n{len(verdicts)} ratios compared with {BASELINE.name} (regression: below 1/{REGRESSION_FACTOR:g} of "
          f"the stored ratio twice); {len(bad)} regressed or missing; scripts failing their checks: "
          f"{', '.join(failed) or 'none'}.")
    return 1 if bad or failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI mode: quick scripts, compare ratios with the baseline")
    ap.add_argument("--update-baseline", action="store_true", help="with --quick: store the measured ratios")
    ap.add_argument("--repeat", type=int, default=3, help="with --update-baseline: runs whose median is stored")
    ap.add_argument("--scripts", default=",".join(SCRIPTS), help="comma-separated subset of " + ",".join(SCRIPTS))
    ap.add_argument("--results", type=Path, default=None,
                    help="output folder (default benchmarks/results, or benchmarks/results/quick)")
    ap.add_argument("--no-report", action="store_true", help="full run: do not regenerate RESULTS.md and the plots")
    a = ap.parse_args()
    scripts = [s for s in a.scripts.split(",") if s]
    unknown = [s for s in scripts if s not in SCRIPTS]
    if unknown:
        ap.error(f"--scripts: unknown {unknown}; choose from {SCRIPTS}")
    if a.update_baseline and not a.quick:
        ap.error("--update-baseline stores quick-mode ratios: add --quick")
    out_dir = a.results or (HERE / "results" / ("quick" if a.quick else ""))
    t0 = time.perf_counter()
    print(f"Benchmark suite ({'quick' if a.quick else 'full'}): {', '.join(scripts)} -> {out_dir}", flush=True)
    if a.quick:
        code = quick_check(scripts, out_dir, a.update_baseline, a.repeat)
        print(f"Suite wall time {time.perf_counter() - t0:.0f} s.")
        return code
    runs = [run_script(s, out_dir, quick=False) for s in scripts]
    missing = report.missing_results(report.load_results(out_dir))
    if not a.no_report and missing:
        # The other scripts' results are not in git: regenerating would drop their sections.
        print(f"RESULTS.md, the plots and the README table are left as they are: {out_dir} has no results for "
              f"{', '.join(missing)}. Run those scripts too (--scripts {','.join(missing)}) to regenerate them; "
              f"this run's reports are {', '.join(str(out_dir / f'{s}.md') for s in scripts)}.")
    elif not a.no_report:
        for path in report.write_report(out_dir, HERE / "RESULTS.md", HERE.parent / "docs" / "img",
                                        HERE.parent / "README.md"):
            print(f"wrote {path}")
    print(f"Suite wall time {time.perf_counter() - t0:.0f} s.")
    return 1 if any(r.returncode for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
