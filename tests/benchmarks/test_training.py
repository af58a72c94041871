"""The training-loop benchmarks' bookkeeping (``benchmarks/training/``): part timing, the per-case
summary, the target verdicts and the report block that survives ``report.py``.

Timings are never asserted; hand-built records with known times pin down what ``run.py`` does
with them. The cases themselves run in CI's ``make bench-train-quick``.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR / "training"))

import _loop  # noqa: E402
import report  # noqa: E402
import run as training_run  # noqa: E402


def record(variant: str, seed: int, buffer_s: float, value_s: float, network_s: float, returns: list[float],
           losses: list[float] | None = None, iterations: int = 4, buffer_bytes: int = 1000) -> dict:
    """A run whose every iteration takes the given seconds per part; one curve point per return."""
    its = [{"collect": 0.001, "buffer": buffer_s, "value": value_s, "network": network_s}] * iterations
    curve = [(100 * (i + 1), r) for i, r in enumerate(returns)]
    return {"case": "c", "variant": variant, "seed": seed, "frames": 400, "updates": 8, "curve": curve,
            "losses": losses or [1.0, 0.5], "buffer_bytes": buffer_bytes, "iterations": its,
            "peak_rss_bytes": 2**20, "wall_s": 1.0, "extra": {"stacks_ok": True}}


def test_part_timer_sums_each_part_per_iteration() -> None:
    timer = _loop.PartTimer()
    with timer("buffer"):
        time.sleep(0.01)
    with timer("buffer"):
        pass
    timer.end_iteration()
    timer.end_iteration()
    assert len(timer.iterations) == 2
    assert timer.iterations[0]["buffer"] >= 0.01 and timer.iterations[0]["network"] == 0.0
    assert timer.iterations[1] == dict.fromkeys(_loop.PARTS, 0.0)


def test_part_timer_names_an_unknown_part() -> None:
    with pytest.raises(ValueError, match=r"part='learn' is not one of \('collect', 'buffer', 'value', 'network'\)"):
        with _loop.PartTimer()("learn"):
            pass


def test_episode_returns_reads_reward_sum_at_done_steps() -> None:
    import torch
    from tensordict import TensorDict

    data = TensorDict({"next": {"done": torch.tensor([[False], [True], [False], [True]]),
                                "episode_reward": torch.tensor([[1.0], [2.0], [1.0], [5.0]])}}, [4])
    assert _loop.episode_returns(data) == [2.0, 5.0]
    data["next", "done"] = torch.zeros(4, 1, dtype=torch.bool)
    assert _loop.episode_returns(data) == []


def test_per_iteration_ms_and_final_return_by_hand() -> None:
    r = record("stock", 0, buffer_s=0.002, value_s=0.001, network_s=0.010, returns=[10, math.nan, 30, 50, 70])
    ms = training_run.per_iteration_ms(r)
    assert ms["buffer+value"] == pytest.approx(3.0)
    assert ms["total"] == pytest.approx(14.0)
    # frames 100..500, last point at 500: the last fifth is frames >= 400 -> returns 50 and 70
    assert training_run.final_return(r) == pytest.approx(60.0)
    assert math.isnan(training_run.final_return(record("stock", 0, 0.1, 0, 0.1, returns=[math.nan])))


def test_summarise_pairs_seeds_and_checks_the_targets() -> None:
    records = {
        "stock": [record("stock", s, 0.004, 0.002, 0.010, returns=[0, 100 + 10 * s]) for s in range(3)],
        "torchrl_ext": [record("torchrl_ext", s, 0.002, 0.001, 0.010, returns=[0, 105 + 10 * s]) for s in range(3)],
    }
    row = training_run.summarise("ppo", records, exact=True, name="PPO")
    assert row["ratios"]["buffer+value"] == pytest.approx((0.5, 0.5, 0.5))
    assert row["ratios"]["end_to_end"][0] == pytest.approx(17 / 14)  # collect 1 ms + parts
    assert row["return_gap"] == pytest.approx(5.0) and row["return_spread"] == pytest.approx(20.0)
    assert row["checks"] == {"buffer+value <= 0.5 of stock": True, "not slower end to end": True,
                             "same losses": True, "returns agree": True}
    # a return gap larger than both variants' seed ranges, and losses that differ, are reported
    records["torchrl_ext"] = [record("torchrl_ext", s, 0.003, 0.002, 0.012, returns=[0, 200 + s], losses=[1.0, 0.6])
                              for s in range(3)]
    row = training_run.summarise("ppo", records, exact=True, name="PPO")
    assert row["checks"] == {"buffer+value <= 0.5 of stock": False, "not slower end to end": False,
                             "same losses": False, "returns agree": False}
    table = training_run.markdown([row], "meta")
    assert "| PPO | stock | 17.0 | 1.0 | 4.00 | 2.00 | 10.0 |" in table and "**missed**" in table


def test_summarise_pixel_case_checks_memory_and_updates_per_second() -> None:
    records = {"stock": [record("stock", 0, 0.1, 0, 0.9, returns=[], buffer_bytes=600)],
               "torchrl_ext": [record("torchrl_ext", 0, 0.04, 0, 0.9, returns=[], buffer_bytes=90)]}
    row = training_run.summarise("pixel_dqn", records, exact=False, name="pixel")
    assert row["ratios"]["memory"] == pytest.approx(0.15)
    assert row["checks"]["buffer memory <= 1/6 of stock"] and row["checks"]["buffer+value <= 0.5 of stock"]
    assert not row["checks"]["updates/s >= 1.5x stock"]  # 1.001 / 0.941: the network dominates
    assert row["checks"]["samples consistent"]


def test_losses_agree_is_relative() -> None:
    assert training_run.losses_agree([100.0, 1e-3], [100.005, 1e-3 * (1 + 5e-5)])
    assert not training_run.losses_agree([100.0], [100.02])
    assert not training_run.losses_agree([1.0], [1.0, 2.0])


def test_report_keeps_the_training_block(tmp_path: Path) -> None:
    md = tmp_path / "RESULTS.md"
    assert "Not measured yet" in report.training_block(md)
    md.write_text(f"# old\n{report.TRAINING_START}\n| a | b |\n{report.TRAINING_END}\nrest\n")
    block = report.training_block(md)
    assert block == f"{report.TRAINING_START}\n| a | b |\n{report.TRAINING_END}"
    assert block in report.markdown({}, "img", block)


def test_replace_block_rewrites_only_the_marked_part(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{training_run.START}\nold\n{training_run.END}\noutro\n")
    training_run.replace_block(readme, "| new |")
    assert readme.read_text() == f"intro\n{training_run.START}\n| new |\n{training_run.END}\noutro\n"
    readme.write_text("no markers")
    with pytest.raises(SystemExit, match="has no <!-- training:start -->"):
        training_run.replace_block(readme, "x")
