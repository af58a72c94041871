"""Smoke test for ``examples/ppo_cartpole``: a tiny PPO run through Hydra's compose API."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

EXAMPLE_DIR = EXAMPLES_DIR / "ppo_cartpole"




@pytest.mark.slow
def test_ppo_cartpole_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("ppo_cartpole")
    frames_per_batch, total_frames = 256, 512
    overrides = [
        f"collector.total_frames={total_frames}",
        f"collector.frames_per_batch={frames_per_batch}",
        "optim.epochs=1",
        "optim.minibatch_size=128",
        "eval.episodes=1",
        "logging.progress=false",
    ]
    # Anything written relative to the cwd must land in tmp_path, not the repo.
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(EXAMPLE_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)

    result = example.train(cfg, output_dir=tmp_path / "run")

    csv_path = Path(result["csv_path"])
    png_path = Path(result["png_path"])
    assert csv_path == tmp_path / "run" / "metrics.csv"
    assert png_path == tmp_path / "run" / "learning_curve.png"

    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    assert len(rows) == total_frames // frames_per_batch
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
    assert [int(r["frames"]) for r in rows] == [256, 512]
    # A uniform-ish initial policy keeps CartPole episodes short, so some end
    # in every 256-frame batch; returns are bounded by the 500-step limit.
    for row in rows:
        assert 1.0 <= float(row["episode_return"]) <= 500.0

    with png_path.open("rb") as f:
        assert f.read(len(PNG_MAGIC)) == PNG_MAGIC
    assert png_path.stat().st_size > 1000

    assert result["frames"] == total_frames
    assert math.isfinite(result["final_return"])
    assert 1.0 <= result["eval_return"] <= 500.0
    # Nothing leaked into the working directory besides the run dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.slow
def test_ppo_cartpole_cli(tmp_path: Path) -> None:
    """The ``@hydra.main`` entry point accepts overrides and writes into ``hydra.run.dir``."""
    run_dir = tmp_path / "hydra_run"
    cmd = [
        sys.executable,
        str(EXAMPLE_DIR / "train.py"),
        # Not a multiple of frames_per_batch: train() rounds up to 384 frames.
        "collector.total_frames=300",
        "collector.frames_per_batch=128",
        "optim.epochs=1",
        "eval.episodes=0",
        "logging.progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run dir: {run_dir}" in proc.stdout
    assert "final mean return:" in proc.stdout
    with (run_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["frames"]) for r in rows] == [128, 256, 384]
    assert (run_dir / "learning_curve.png").read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    # Hydra saves the composed config next to the outputs.
    assert (run_dir / ".hydra" / "config.yaml").is_file()
