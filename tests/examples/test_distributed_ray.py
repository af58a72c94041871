"""Smoke test for ``examples/distributed_ray``: ``conf/distributed_ray.yaml`` with
``experiment=distributed_ray_smoke`` on a local 2-CPU Ray cluster."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

pytest.importorskip("ray")
pytest.importorskip("gymnasium")

CONF_DIR = EXAMPLES_DIR.parent / "conf"


@pytest.mark.slow
def test_distributed_ray_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("distributed_ray")
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="distributed_ray", overrides=["experiment=distributed_ray_smoke"])
    assert cfg.buffer.prioritized_sampling and cfg.buffer.num_environments == cfg.collector.num_envs
    assert cfg.ray.address is None and cfg.ray.num_cpus == 2

    result = example.train(cfg, output_dir=tmp_path)

    with Path(result["csv_path"]).open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    # 2 actors x 2 envs x 16 steps per call: 16 calls of 32 frames make 512.
    assert [int(r["frames"]) for r in rows] == [32 * i for i in range(1, 17)]
    assert result["frames"] == 512 and int(rows[-1]["buffer_size"]) == 512  # nothing lost
    trained = [r for r in rows if int(r["updates"]) > 0]
    assert trained and int(rows[-1]["updates"]) == 2 * len(trained)
    assert all(math.isfinite(float(r["td_abs"])) for r in trained)
    assert int(rows[-1]["episodes_finished"]) > 0
    assert Path(result["png_path"]).read_bytes()[:8] == PNG_MAGIC
