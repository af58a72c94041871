"""Smoke test for ``examples/mappo_vmas``: ``conf/mappo_vmas.yaml`` with ``experiment=mappo_vmas_smoke``."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"

pytest.importorskip("vmas")


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="mappo_vmas", overrides=overrides)


def _reference_value_target(batch, gamma: float, lmbda: float) -> torch.Tensor:
    """Per-agent GAE value targets of ``batch`` ``[T + 1, N]``, a plain float64 backward loop.

    Slot ``t + 1`` bootstraps step ``t``; the team ``done``/``terminated`` flags
    of ``("next", ...)`` stop the recursion and the bootstrap for every agent.
    """
    steps = batch.shape[0] - 1
    value = batch["agents", "state_value"].double()  # [T + 1, N, A, 1]
    reward = batch["next", "agents", "reward"].double()
    done = batch["next", "done"].double().unsqueeze(-2)  # [T + 1, N, 1, 1]: team-level
    terminated = batch["next", "terminated"].double().unsqueeze(-2)
    target = torch.zeros_like(value[:steps])
    gae = torch.zeros_like(value[0])
    for t in reversed(range(steps)):
        delta = reward[t] + gamma * (1 - terminated[t]) * value[t + 1] - value[t]
        gae = delta + gamma * lmbda * (1 - done[t]) * gae
        target[t] = gae + value[t]
    return target


@pytest.mark.slow
def test_mappo_vmas_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("mappo_vmas")
    monkeypatch.chdir(tmp_path)
    cfg = _compose(["experiment=mappo_vmas_smoke"])
    # The primary config links the buffer's rollout length to the collector's.
    assert cfg.buffer.episode_length == cfg.collector.rollout_length == 10
    result = example.train(cfg, output_dir=tmp_path / "run")

    with open(result["csv_path"], newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    per_batch = cfg.env.num_envs * cfg.collector.rollout_length
    assert len(rows) == cfg.collector.total_frames // per_batch == 2
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
    assert [int(r["frames"]) for r in rows] == [per_batch, 2 * per_batch]
    # max_steps == rollout_length: every env finishes exactly one episode per batch.
    assert [int(r["episodes_finished"]) for r in rows] == [cfg.env.num_envs] * 2
    assert Path(result["png_path"]).read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    assert result["frames"] == 2 * per_batch
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]

    # The stored rollout is [T + 1, N] with the agents nested inside each step.
    batch = result["last_batch"]
    n_agents, steps = cfg.env.n_agents, cfg.collector.rollout_length
    assert tuple(batch.batch_size) == (steps + 1, cfg.env.num_envs)
    assert batch["agents"].batch_size[-1] == n_agents
    assert batch["agents", "observation"].shape[:3] == (steps + 1, cfg.env.num_envs, n_agents)
    assert batch["done"].shape == (steps + 1, cfg.env.num_envs, 1)  # team-level

    # torchrl_ext's GAE on the rollout equals a float64 loop, for every agent.
    expected = _reference_value_target(batch, cfg.value.gamma, cfg.value.lmbda)
    value_target = batch["agents", "value_target"][:steps].double()
    torch.testing.assert_close(value_target, expected, rtol=1e-5, atol=1e-5)
    # average_gae standardises each agent's advantages separately.
    raw = expected - batch["agents", "state_value"][:steps].double()
    dims = [0, 1, 3]
    standardised = (raw - raw.mean(dims, keepdim=True)) / raw.std(dims, keepdim=True).clamp_min(1e-4)
    advantage = batch["agents", "advantage"][:steps].double()
    torch.testing.assert_close(advantage, standardised, rtol=1e-4, atol=1e-4)


def test_mappo_vmas_config_checks() -> None:
    """Bad sizes fail before any env is built, naming the keys to fix."""
    example = load_example("mappo_vmas")
    cfg = _compose(["experiment=mappo_vmas_smoke", "collector.total_frames=10"])
    with pytest.raises(ValueError, match="collector.total_frames=10"):
        example._check_config(cfg)
    cfg = _compose(["experiment=mappo_vmas_smoke", "optim.epochs=0"])
    with pytest.raises(ValueError, match="optim.epochs"):
        example._check_config(cfg)
