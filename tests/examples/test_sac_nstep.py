"""Smoke test for ``examples/sac_nstep``: a tiny n-step SAC run through Hydra's compose API."""
from __future__ import annotations

import csv
import math

import pytest

from tests.examples._load import EXAMPLES_DIR, load_example

EXAMPLE_DIR = EXAMPLES_DIR / "sac_nstep"




@pytest.mark.slow
def test_sac_nstep_smoke(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    example = load_example("sac_nstep")
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
