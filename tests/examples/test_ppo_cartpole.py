"""Smoke test for ``examples/ppo_cartpole``: a tiny PPO run through Hydra's compose API."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples._load import CONF_DIR, EXAMPLES_DIR, PNG_MAGIC, load_example

EXAMPLE_DIR = EXAMPLES_DIR / "ppo_cartpole"




def compose_smoke(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="ppo_cartpole", overrides=["experiment=ppo_cartpole_smoke", *overrides])


@pytest.mark.slow
@pytest.mark.parametrize("buffer", ["rollout", "torchrl_lazy"])
def test_ppo_cartpole_smoke(buffer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke experiment runs with torchrl_ext's rollout buffer and, swapped by one override, TorchRL's."""
    example = load_example("ppo_cartpole")
    # Anything written relative to the cwd must land in tmp_path, not the repo.
    monkeypatch.chdir(tmp_path)
    cfg = compose_smoke(f"buffer={buffer}")
    frames_per_batch, total_frames = cfg.collector.frames_per_batch, cfg.collector.total_frames
    assert (frames_per_batch, total_frames) == (256, 512)

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
    # reached_at is the first row at or above the target, never made up.
    above = [int(r["frames"]) for r in rows if float(r["episode_return"]) >= cfg.target_return]
    assert result["reached_at"] == (above[0] if above else None)

    with png_path.open("rb") as f:
        assert f.read(len(PNG_MAGIC)) == PNG_MAGIC
    assert png_path.stat().st_size > 1000

    assert result["frames"] == total_frames
    assert math.isfinite(result["final_return"])
    assert 1.0 <= result["eval_return"] <= 500.0
    # Nothing leaked into the working directory besides the run dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_default_buffer_is_torchrl_ext_rollout() -> None:
    from hydra.utils import instantiate

    from torchrl_ext.samplers import FeedForwardMinibatchSampler
    from torchrl_ext.storages import RolloutStorage
    from torchrl_ext.value import GAE

    cfg = compose_smoke()
    buffer = instantiate(cfg.buffer)
    assert isinstance(buffer.storage, RolloutStorage) and buffer.storage.num_steps == 256
    assert isinstance(buffer.sampler, FeedForwardMinibatchSampler)
    assert buffer.sampler.mini_batch_size == cfg.optim.minibatch_size
    assert instantiate(cfg.value).func is GAE


@pytest.mark.slow
def test_ppo_cartpole_cli(tmp_path: Path) -> None:
    """The ``@hydra.main`` entry point accepts overrides and writes into ``hydra.run.dir``."""
    run_dir = tmp_path / "hydra_run"
    cmd = [
        sys.executable,
        str(EXAMPLE_DIR / "train.py"),
        "experiment=ppo_cartpole_smoke",
        # Not a multiple of frames_per_batch: train() rounds up to 384 frames.
        "collector.total_frames=300",
        "collector.frames_per_batch=128",
        "eval.episodes=0",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1].startswith("ppo_cartpole: final return ")
    assert "384 frames in " in proc.stdout and f"outputs in {run_dir}" in proc.stdout
    with (run_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["frames"]) for r in rows] == [128, 256, 384]
    assert (run_dir / "learning_curve.png").read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    # Hydra saves the composed config next to the outputs.
    assert (run_dir / ".hydra" / "config.yaml").is_file()
