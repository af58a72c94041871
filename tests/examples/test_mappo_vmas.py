"""Smoke tests for ``examples/mappo_vmas``: ``conf/mappo_vmas.yaml`` with ``experiment=mappo_vmas_smoke``,
``experiment=mappo_vmas_rnn_smoke`` (GRU actor + EP critic) and ``experiment=mappo_vmas_fp_smoke``
(feed-forward actor + FP critic)."""
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


def _read_rows(csv_path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    with open(csv_path, newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == columns
        rows = list(reader)
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
    return rows


@pytest.mark.slow
def test_mappo_vmas_rnn_smoke(tmp_path: Path) -> None:
    """GRU actor + EP critic: runs, stores the hidden state per step and the EP state per env."""
    example = load_example("mappo_vmas")
    cfg = _compose(["experiment=mappo_vmas_rnn_smoke"])
    assert cfg.model.recurrent and cfg.buffer.use_recurrent_policy  # linked by interpolation
    result = example.train(cfg, output_dir=tmp_path / "run")
    rows = _read_rows(result["csv_path"], example.CSV_COLUMNS)
    assert len(rows) == 2 and result["frames"] == 80

    batch = result["last_batch"]
    steps, n_envs, n_agents = cfg.collector.rollout_length, cfg.env.num_envs, cfg.env.n_agents
    hidden = cfg.model.rnn_hidden_size
    assert batch["agents", "rnn_state"].shape == (steps + 1, n_envs, n_agents, 1, hidden)
    assert batch["is_init"].shape == (steps + 1, n_envs, 1)  # team-level, like "done"
    # The primer zeroes the hidden state wherever an episode starts.
    is_init = batch["is_init"][:steps, :, 0]
    assert is_init.any()
    assert (batch["agents", "rnn_state"][:steps][is_init] == 0).all()
    # EP: one joint state per env, one value per env seen by every agent.
    obs = batch["agents", "observation"]
    torch.testing.assert_close(batch["state"], obs.flatten(-2, -1), rtol=0, atol=0)
    assert ("agents", "state") not in batch.keys(True)
    value = batch["agents", "state_value"]
    torch.testing.assert_close(value, value[..., :1, :].expand_as(value), rtol=0, atol=0)
    expected = _reference_value_target(batch, cfg.value.gamma, cfg.value.lmbda)
    torch.testing.assert_close(batch["agents", "value_target"][:steps].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_mappo_vmas_rnn_chunks_start_from_stored_state(tmp_path: Path) -> None:
    """Each [k, L] chunk starts from the stored hidden state at its first step and reproduces
    the collector's hidden states, resets inside the chunk included.

    With ``optim.lr=0`` the weights used in the update are those that collected
    the rollout, so rerunning the GRU over a chunk must give the stored
    ``("next", "agents", "rnn_state")`` at every step.
    """
    from hydra.utils import instantiate
    from torchrl.modules import set_recurrent_mode

    example = load_example("mappo_vmas")
    cfg = _compose(["experiment=mappo_vmas_rnn_smoke", "optim.lr=0.0"])
    result = example.train(cfg, output_dir=tmp_path / "run")
    actor, rollout = result["actor"], result["last_batch"]
    steps, chunk = cfg.collector.rollout_length, cfg.buffer.data_chunk_length

    # Refill a buffer like the training one with the stored steps (derived entries are
    # recomputed in training, not inserted) and draw one epoch of chunks.
    derived = [key for key in rollout.keys(True, True) if "state_value" in key
               or key[-1] in ("advantage", "value_target")]
    rb = instantiate(cfg.buffer)
    rb.storage.write_rollout(rollout.exclude(*derived))
    gru = next(m for m in actor.modules() if isinstance(m, torch.nn.GRU))
    fed: list[torch.Tensor] = []
    handle = gru.register_forward_pre_hook(lambda module, args: fed.append(args[1].detach().clone()))
    chunks_with_reset = 0
    try:
        for batch in rb:
            assert tuple(batch.shape[1:]) == (chunk,)
            stored_next = batch["next", "agents", "rnn_state"].clone()
            inner_reset = batch["is_init"][:, 1:, 0].any(-1)
            chunks_with_reset += int(inner_reset.sum())

            # Chunks without a reset inside: the GRU gets exactly the stored state of
            # step 0, one sequence per (chunk, agent): [layers, k * A, H].
            plain = batch[~inner_reset].clone()
            fed.clear()
            with torch.no_grad(), set_recurrent_mode(True):
                actor(plain)
            assert len(fed) == 1
            torch.testing.assert_close(
                fed[0], plain["agents", "rnn_state"][:, 0].flatten(0, 1).transpose(0, 1), rtol=0, atol=0
            )

            # All chunks: the recurrent pass reproduces the collector's GRU features at
            # every step ("rnn_out", computed step by step while collecting). In
            # recurrent mode GRUModule's hidden output is only the final one of each
            # sequence, so the features are what can be compared per step.
            recomputed = batch.clone()
            with torch.no_grad(), set_recurrent_mode(True):
                actor(recomputed)
            torch.testing.assert_close(
                recomputed["agents", "rnn_out"], batch["agents", "rnn_out"], rtol=1e-5, atol=1e-5
            )
            # The last step of a chunk ends a sequence: its hidden output is the stored one.
            torch.testing.assert_close(
                recomputed["next", "agents", "rnn_state"][:, -1], stored_next[:, -1], rtol=1e-5, atol=1e-5
            )
            # The log-probs of the stored actions match the collector's too.
            with torch.no_grad(), set_recurrent_mode(True):
                dist = actor.get_dist(batch.clone())
            log_prob = dist.log_prob(batch["agents", "action"])
            torch.testing.assert_close(log_prob, batch["agents", "action_log_prob"], rtol=1e-4, atol=1e-4)
    finally:
        handle.remove()
    assert chunks_with_reset > 0  # max_steps=7 < rollout_length: resets fall inside chunks
    assert steps % chunk == 0


@pytest.mark.slow
def test_mappo_vmas_fp_smoke(tmp_path: Path) -> None:
    """Feed-forward actor + FP critic: per-agent ("agents", "state"), per-agent critic inputs."""
    example = load_example("mappo_vmas")
    cfg = _compose(["experiment=mappo_vmas_fp_smoke"])
    result = example.train(cfg, output_dir=tmp_path / "run")
    rows = _read_rows(result["csv_path"], example.CSV_COLUMNS)
    assert len(rows) == 2 and result["frames"] == 80

    batch = result["last_batch"]
    steps, n_envs, n_agents = cfg.collector.rollout_length, cfg.env.num_envs, cfg.env.n_agents
    obs = batch["agents", "observation"]  # [T + 1, N, A, D]
    dim = obs.shape[-1]
    state = batch["agents", "state"]
    assert state.shape == (steps + 1, n_envs, n_agents, dim + n_agents * dim)  # agent dim kept
    assert "state" not in batch.keys()  # no env-level state in FP
    joint = obs.flatten(-2, -1).unsqueeze(-2).expand(-1, -1, n_agents, -1)
    torch.testing.assert_close(state, torch.cat([obs, joint], -1), rtol=0, atol=0)

    # The critic reads the per-agent input, one row per agent, and values agents differently.
    critic = result["critic"]
    assert list(critic.in_keys) == [("agents", "state")]
    net = critic.module
    assert not net.centralized and net.n_agent_inputs == dim + n_agents * dim
    with torch.no_grad():
        values = critic(batch.select(("agents", "state")).clone())["agents", "state_value"]
    assert values.shape == (steps + 1, n_envs, n_agents, 1)
    assert not torch.allclose(values[..., 0, :], values[..., 1, :])
    expected = _reference_value_target(batch, cfg.value.gamma, cfg.value.lmbda)
    torch.testing.assert_close(batch["agents", "value_target"][:steps].double(), expected, rtol=1e-5, atol=1e-5)


def test_mappo_vmas_variant_config_checks() -> None:
    """Unknown layouts and chunk lengths that do not divide the rollout fail early."""
    example = load_example("mappo_vmas")
    cfg = _compose(["experiment=mappo_vmas_fp_smoke", "model.critic_layout=XP"])
    with pytest.raises(ValueError, match="model.critic_layout"):
        example._check_config(cfg)
    cfg = _compose(["experiment=mappo_vmas_rnn_smoke", "buffer.data_chunk_length=3"])
    with pytest.raises(ValueError, match="buffer.data_chunk_length=3"):
        example._check_config(cfg)
    cfg = _compose(["experiment=mappo_vmas_rnn_smoke", "buffer.use_recurrent_policy=false"])
    with pytest.raises(ValueError, match="buffer.use_recurrent_policy"):
        example._check_config(cfg)
