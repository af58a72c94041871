"""Smoke test for ``examples/dqn_per``: ``conf/dqn_per.yaml`` with ``experiment=dqn_per_smoke``."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"


@pytest.mark.slow
def test_dqn_per_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("dqn_per")
    # Anything written relative to the cwd must land in tmp_path, not the repo.
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="dqn_per", overrides=["experiment=dqn_per_smoke"])
    # The primary config links the buffer to the example's settings.
    assert cfg.buffer.batch_size == cfg.optim.batch_size == 32
    assert cfg.buffer.sampler.gamma == cfg.loss.gamma
    assert cfg.buffer.sampler.max_capacity == cfg.buffer.storage.max_size == 1024

    result = example.train(cfg, output_dir=tmp_path / "run")

    with open(result["csv_path"], newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    # 256 frames in batches of 64; the first batch is the random warm-up only.
    assert [int(r["frames"]) for r in rows] == [128, 192, 256]
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
        assert 1.0 <= float(row["episode_return"]) <= 500.0
        assert 0.0 < float(row["mean_priority_weight"]) <= 1.0
        assert 1.0 <= float(row["mean_steps_to_next_obs"]) <= cfg.buffer.sampler.n_step
    # beta grows to per.beta_end over the run.
    assert float(rows[-1]["beta"]) == pytest.approx(cfg.per.beta_end)
    assert result["frames"] == 256
    assert 1.0 <= result["eval_return"] <= 500.0
    assert Path(result["png_path"]).read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    # Nothing leaked into the working directory besides the run dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_buffer_config_instantiates_on_its_own() -> None:
    """``conf/buffer/prioritized_nstep.yaml`` alone builds a working buffer."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from tensordict import TensorDict

    import torchrl_ext.configs  # noqa: F401  (the file composes the registered ext_* configs)
    from torchrl_ext.samplers import PrioritizedNStepSampler

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose(config_name="buffer/prioritized_nstep",
                      overrides=["buffer.storage.max_size=64", "buffer.batch_size=8"]).buffer
    rb = instantiate(cfg)
    assert isinstance(rb.sampler, PrioritizedNStepSampler)
    assert rb.sampler.max_size == 64
    obs = torch.arange(16.0).reshape(4, 4, 1)
    rb.extend(TensorDict({"observation": obs, "next": {
        "observation": obs + 1, "reward": torch.ones(4, 4, 1),
        "done": torch.zeros(4, 4, 1, dtype=torch.bool)}}, [4, 4]))
    batch = rb.sample()
    assert batch["index"].shape == (8, 2) and batch["priority_weight"].shape == (8,)
    batch["td_error"] = torch.rand(8)
    rb.update_tensordict_priority(batch)
