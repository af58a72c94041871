"""Smoke test for ``examples/ppod_demos``: ``conf/ppod_demos.yaml`` with ``experiment=ppod_demos_smoke``."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"


def test_scripted_demo_reaches_the_goal() -> None:
    example = load_example("ppod_demos")
    demo = example.scripted_demo(5, 20)
    assert demo["reward"].sum() == 1.0 and len(demo["action"]) == 8
    assert demo["action"].shape == (8, 4) and demo["observation"].shape == (8, 2)


@pytest.mark.slow
def test_ppod_demos_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    from torchrl_ext.demos import load_demo

    example = load_example("ppod_demos")
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="ppod_demos", overrides=["experiment=ppod_demos_smoke"])
    # 3 rollouts of 2 envs x 32 steps on a 5x5 grid; the buffer follows the rollout length.
    assert (cfg.env.num_envs, cfg.env.size, cfg.collector.rollout_length) == (2, 5, 32)
    assert (cfg.buffer.num_steps, cfg.buffer.gae_lambda) == (32, cfg.loss.lmbda)
    assert (cfg.demos.rho, cfg.demos.save_every) == (0.5, 1)
    result = example.train(cfg, output_dir=tmp_path / "run")

    with Path(result["csv_path"]).open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    assert [int(r["frames"]) for r in rows] == [64, 128, 192]
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
    # rho = 0.5: demo episodes are replayed alongside env episodes.
    assert sum(int(r["demo_episodes"]) for r in rows) > 0
    assert sum(int(r["env_episodes"]) for r in rows) > 0
    demo = load_demo(tmp_path / "run" / "demos" / "scripted_0.npz", frame_skip=1)
    assert float(demo["reward"].sum()) == 1.0
    assert (tmp_path / "run" / "top_demos").is_dir()
    assert Path(result["png_path"]).read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    assert result["eval_success"] in (0.0, 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.slow
def test_ppod_demos_polls_the_supplementary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo in demos.supplementary_dir joins the store once (first poll), never twice."""
    from hydra import compose, initialize_config_dir

    from torchrl_ext.demos import save_demo

    example = load_example("ppod_demos")
    monkeypatch.chdir(tmp_path)
    supplementary = tmp_path / "supplementary"
    save_demo(supplementary / "extra_0.npz", example.scripted_demo(5, 12), frame_skip=1)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="ppod_demos", overrides=[
            "experiment=ppod_demos_smoke", f"demos.supplementary_dir={supplementary}", "demos.save_dir=null"])
    result = example.train(cfg, output_dir=tmp_path / "run")
    with Path(result["csv_path"]).open(newline="") as f:
        rows = list(csv.DictReader(f))
    # The scripted initial demo sets the threshold to its total reward, 1; the supplementary
    # demo (the same path) reaches it and is added at the first poll only.
    assert [int(r["supplementary_added"]) for r in rows] == [1, 0, 0]
    assert int(rows[0]["reward_demos"]) >= 2
