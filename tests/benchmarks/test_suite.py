"""The benchmark suite's bookkeeping: best-peer ratios, targets, the regression check, the report.

The timings themselves are never asserted here (they belong to ``benchmarks/``); these tests pin
down what the suite does with them, on hand-built result files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import _harness  # noqa: E402
import report  # noqa: E402
import suite  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def impl(median_ms: float, reps: list[float] | None = None) -> dict:
    return {"median_ms": median_ms, "per_rep_ms": reps or [median_ms] * 3}


def storage_results() -> dict:
    """One storage case: cpprb is the fastest peer, the reference rows are faster still."""
    return {"storage": {
        "meta": {"started": "2026-11-23", "torch": "2.14.1", "torchrl": "0.14.1", "threads": 1, "reps": 3,
                 "quick": True, "platform": "Linux"},
        "cases": {"vec_sample_B256": {"title": "vec sample(256)", "bg_load": 0.05, "impls": {
            "torchrl": impl(4.0, [4.0, 4.0, 4.0]),
            "cpprb": impl(1.0, [1.0, 1.2, 0.8]),
            "sb3": impl(2.0),
            "torchrl_ext": impl(0.5, [0.5, 0.4, 0.5]),
            "ref index_select new": impl(0.1),
        }}},
        "targets": [{"case": "vec_sample_B256", "impl": "torchrl_ext", "baseline": "cpprb", "target": 1.0,
                     "ratio": 2.0, "result": "PASS"},
                    {"case": "vec_sample_B256", "impl": "torchrl_ext", "baseline": "torchrl", "target": None,
                     "ratio": 8.0, "result": "-"}],
    }}


def test_best_peer_is_the_fastest_library_peer_not_a_reference() -> None:
    (c,) = report.comparisons(storage_results())
    assert (c.bench, c.case, c.impl, c.peer) == ("storage", "vec_sample_B256", "torchrl_ext", "cpprb")
    assert c.ratio == pytest.approx(2.0)
    assert c.paired == pytest.approx((1.6, 3.0))  # 1.0/0.5, 1.2/0.4, 0.8/0.5 per round
    assert c.others == pytest.approx({"torchrl": 8.0, "cpprb": 2.0, "sb3": 4.0})
    assert c.key == "storage/vec_sample_B256/torchrl_ext"


def test_comparisons_pair_like_with_like() -> None:
    """A sampler-only row is compared with TorchRL's sampler only, never with a whole buffer."""
    results = {"prioritized": {"cases": {"per_1M_B256": {"title": "t", "impls": {
        "cpprb": impl(1.0), "torchrl": impl(3.0), "torchrl sampler only": impl(0.2),
        "torchrl_ext": impl(2.0), "torchrl_ext sampler only": impl(0.4)}}}}}
    rows = {c.impl: c for c in report.comparisons(results)}
    assert rows["torchrl_ext"].peer == "cpprb" and rows["torchrl_ext"].ratio == pytest.approx(0.5)
    assert rows["torchrl_ext sampler only"].peer == "torchrl sampler only"
    assert rows["torchrl_ext sampler only"].ratio == pytest.approx(0.5)


def test_targets_keep_lower_is_better_limits_and_skip_information_rows() -> None:
    results = storage_results()
    results["nstep"] = {"targets": [
        {"case": "scaling", "impl": "1M B256", "baseline": "10k B256", "target_max": 2.0, "ratio": 1.1,
         "result": "PASS"},
        {"case": "scaling", "impl": "100k B256", "baseline": "10k B256", "target_max": None, "ratio": 1.0}]}
    results["value"] = {"targets": [{"case": "gae", "impl": "torchrl_ext", "baseline": "torchrl vec_gae",
                                     "target": 20.0, "ratio": 9.0, "pass": False}]}
    rows = report.targets(results)
    assert [(t["bench"], t["case"], t["upper"], t["result"]) for t in rows] == [
        ("storage", "vec_sample_B256", False, "PASS"), ("nstep", "scaling", True, "PASS"),
        ("value", "gae", False, "FAIL")]


def test_regression_needs_half_the_stored_ratio_twice() -> None:
    verdicts = {v.key: v for v in suite.compare({"a/x/e": 0.99, "b/y/e": 1.01, "c/z/e": 0.5, "d/w/e": 3.0},
                                                {"a/x/e": 2.0, "b/y/e": 2.0, "c/z/e": 2.0, "e/v/e": 1.0})}
    assert verdicts["a/x/e"].status == "REGRESSION"
    assert verdicts["b/y/e"].status == "ok"
    assert verdicts["e/v/e"].status == "MISSING"
    assert verdicts["d/w/e"].status.startswith("new")
    assert suite.retry_plan(list(verdicts.values())) == {"a": ["x"], "c": ["z"]}
    verdicts["a/x/e"].retried = 1.2  # the re-run is back above half: noise, not a regression
    verdicts["c/z/e"].retried = 0.9
    assert [v.key for v in suite.regressed(list(verdicts.values()))] == ["c/z/e", "e/v/e"]


def test_a_better_ratio_never_fails() -> None:
    (v,) = suite.compare({"s/c/e": 100.0}, {"s/c/e": 1.0})
    assert v.status == "ok"


def test_write_report_makes_the_table_and_the_plots(tmp_path: Path) -> None:
    results = storage_results()
    results["sweep"] = {"meta": {"started": "2026-11-23", "quick": True}, "cases": {
        f"sample_B{b}": {"title": f"sample({b})", "sweep": "sample_batch", "x": b, "items_per_call": b,
                         "impls": {"torchrl_ext": impl(b / 1e3), "torchrl": impl(b / 5e2), "cpprb": impl(b / 8e2)}}
        for b in (32, 512)} | {
        f"gae_T{t}": {"title": f"GAE T={t}", "sweep": "gae_T", "x": t, "items_per_call": t * 64,
                      "impls": {"torchrl_ext": impl(t / 1e3), "torchrl vec_gae": impl(t / 10)}} for t in (16, 256)} | {
        "vtrace_T32_N64": {"title": "V", "sweep": "vtrace_TN", "x": 2048, "T": 32, "N": 64, "items_per_call": 2048,
                           "impls": {"torchrl_ext": impl(0.2), "torchrl vtrace": impl(0.8)}}},
        "memory": {"capacity": 1000, "row_bytes": 533, "impls": {"torchrl_ext": {"peak_delta_per_tr": 560.0},
                                                                 "cpprb": {"peak_delta_per_tr": 546.0}}}}
    res_dir = tmp_path / "results"
    res_dir.mkdir()
    for name, payload in results.items():
        (res_dir / f"{name}.json").write_text(json.dumps(payload))
    md, img = tmp_path / "RESULTS.md", tmp_path / "img"
    written = report.write_report(res_dir, md, img, partial=True)  # storage and sweep only
    assert {p.name for p in written} == {"bench_throughput.png", "bench_value.png", "benchmark_summary.png",
                                         "RESULTS.md"}
    for p in written[:-1]:
        assert p.read_bytes()[:8] == PNG_MAGIC
    text = md.read_text()
    assert ("| vec sample(256) | torchrl_ext | cpprb | 2.00x | 1.60-3.00x | 0.500 | 1.000 | "
            "torchrl 8.00x, cpprb 2.00x, sb3 4.00x | 0.05 |") in text
    assert "| storage | vec_sample_B256 | torchrl_ext | cpprb | 2.00x | >= 1x | PASS |" in text
    assert "| vec (533 B of data), capacity 1,000 | torchrl_ext | 560 | 1.05x |" in text
    assert "sample(32)" in text and "GAE T=256" in text


def test_write_report_without_results_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run `python benchmarks/suite.py` first"):
        report.write_report(tmp_path, tmp_path / "R.md", tmp_path / "img")


def test_write_report_refuses_to_drop_the_scripts_without_results(tmp_path: Path) -> None:
    (tmp_path / "storage.json").write_text(json.dumps(storage_results()["storage"]))
    (tmp_path / "bench_value.json").write_text("{}")  # the prefixed name counts too
    missing = report.missing_results(report.load_results(tmp_path))
    assert missing == [name for name in report.BENCHES if name not in ("storage", "value")]
    md = tmp_path / "R.md"
    md.write_text("the previous report")
    with pytest.raises(FileNotFoundError, match=r"no results for prioritized, nstep, .*--scripts prioritized,nstep"):
        report.write_report(tmp_path, md, tmp_path / "img")
    assert md.read_text() == "the previous report"
    assert not (tmp_path / "img").exists()


def test_a_partial_full_run_leaves_the_report_as_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(script: str, out_dir: Path, quick: bool) -> suite.Run:
        (out_dir / f"{script}.json").write_text(json.dumps(storage_results()[script]))
        return suite.Run(script, 0, 0.0, out_dir / f"{script}.json", out_dir / f"{script}.md")

    def no_report(*args: object, **kwargs: object) -> list[Path]:
        raise AssertionError("write_report must not run on a partial results folder")

    monkeypatch.setattr(suite, "run_script", fake_run)
    monkeypatch.setattr(report, "write_report", no_report)
    monkeypatch.setattr(sys, "argv", ["suite.py", "--scripts", "storage", "--results", str(tmp_path)])
    assert suite.main() == 0
    out = capsys.readouterr().out
    assert "left as they are" in out and "--scripts prioritized,nstep,ring" in out
    assert str(tmp_path / "storage.md") in out


def test_run_inline_returns_the_exit_code_and_keeps_the_output(tmp_path: Path) -> None:
    ok, bad, crash = (tmp_path / f"{n}.py" for n in ("ok", "bad", "crash"))
    ok.write_text("import sys\nprint('hello', sys.argv[1:])\n")
    bad.write_text("import sys\nsys.exit(3)\n")
    crash.write_text("raise RuntimeError('boom')\n")
    out = tmp_path / "out.md"
    with out.open("w") as f:
        codes = [suite.run_inline([str(ok), "--x"], f), suite.run_inline([str(bad)], f),
                 suite.run_inline([str(crash)], f)]
    assert codes == [0, 3, 1]
    text = out.read_text()
    assert "hello ['--x']" in text and "RuntimeError: boom" in text


def test_stored_baseline_covers_every_quick_script() -> None:
    """Every script the quick run measures has stored ratios, and every stored key is one it produces."""
    stored = json.loads(suite.BASELINE.read_text())
    assert stored["factor"] == suite.REGRESSION_FACTOR == 2.0
    scripts = {k.split("/", 1)[0] for k in stored["ratios"]}
    assert scripts == set(suite.SCRIPTS) == set(suite.QUICK)
    assert all(v > 0 for v in stored["ratios"].values())
    for name in suite.SCRIPTS:
        assert (BENCH_DIR / f"bench_{name}.py").exists()
        assert name in report.BENCHES and name in report.COMPARISONS


@pytest.mark.parametrize("only, key, expected", [
    ("", "vec_insert", True), ("vec", "vec_insert", True), ("img", "vec_insert", False),
    ("img,insert", "vec_insert", True), ("gae_T32,vtrace", "vtrace_T128_N256", True),
    ("gae_T32,vtrace", "gae_T2048", False)])
def test_only_selects_by_any_comma_separated_substring(only: str, key: str, expected: bool) -> None:
    assert _harness.selected(argparse.Namespace(only=only), key) is expected


def test_suite_rejects_unknown_scripts(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["suite.py", "--scripts", "value,nope"])
    with pytest.raises(SystemExit) as exc:
        suite.main()
    assert exc.value.code == 2
    assert "--scripts: unknown ['nope']" in capsys.readouterr().err


def test_update_readme_rewrites_only_the_marked_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:start -->\nold table\n<!-- bench:end -->\noutro\n")
    assert report.update_readme(readme, storage_results())
    text = readme.read_text()
    assert text.startswith("intro\n<!-- bench:start -->\nMeasured 2026-11-23 by `make bench`")
    assert text.endswith("<!-- bench:end -->\noutro\n")
    assert "old table" not in text
    assert "| storage | vec_sample_B256 | cpprb | 2.00x | >= 1x | met |" in text
    plain = tmp_path / "other.md"
    plain.write_text("no markers\n")
    assert not report.update_readme(plain, storage_results())
    assert plain.read_text() == "no markers\n"
