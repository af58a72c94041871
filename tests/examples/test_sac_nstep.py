"""Smoke test for ``examples/sac_nstep``: a tiny n-step SAC run through Hydra's compose API."""
from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "sac_nstep"


def _load_example():
    name = "sac_nstep_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE_DIR / "train.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.slow
def test_sac_nstep_smoke(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    example = _load_example()
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(EXAMPLE_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "collector.total_frames=800", "collector.frames_per_batch=200",
            "collector.init_random_frames=200", "optim.updates_per_batch=4",
            "optim.batch_size=32", "model.hidden_sizes=[32,32]", "buffer.n_step=3",
        ])
    result = example.train(cfg, output_dir=tmp_path / "run")
    with open(result["csv_path"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == example.CSV_COLUMNS
    assert len(rows) == 3  # 4 batches, the first one is random warm-up only
    for row in rows:
        assert math.isfinite(float(row["loss_qvalue"])) and math.isfinite(float(row["loss_actor"]))
        # Pendulum episodes last 200 steps: most 3-step chains are whole, none is longer.
        assert 1.0 <= float(row["mean_steps_to_next_obs"]) <= 3.0
    assert math.isfinite(result["eval_return"])
