"""Smoke test for ``examples/sac_nstep``: ``conf/sac_nstep.yaml`` with ``experiment=sac_nstep_smoke``."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"


@pytest.mark.slow
def test_sac_nstep_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("sac_nstep")
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="sac_nstep", overrides=["experiment=sac_nstep_smoke"])
    # The smoke config shrinks the run; the primary config links the buffer to it.
    assert cfg.buffer.batch_size == cfg.optim.batch_size == 32
    assert cfg.buffer.sampler.n_step == 3 and cfg.buffer.sampler.gamma == cfg.loss.gamma
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
    assert result["frames"] == 800
    assert Path(result["png_path"]).read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    # Nothing leaked into the working directory besides the run dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
