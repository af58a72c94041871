"""Smoke test for ``examples/impala_vtrace``: ``conf/impala_vtrace.yaml`` with
``experiment=impala_vtrace_smoke``, and the V-trace path of the example's helpers checked
against plain discounted returns."""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import pytest

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"


@pytest.mark.slow
def test_impala_vtrace_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("impala_vtrace")
    # Anything written relative to the cwd must land in tmp_path, not the repo.
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="impala_vtrace", overrides=["experiment=impala_vtrace_smoke"])
    # 500 frames rounded up to 512 = 8 rollouts of 4 envs x 16 steps; the buffer follows.
    assert (cfg.collector.num_envs, cfg.collector.rollout_length) == (4, 16)
    assert (cfg.buffer.num_steps, cfg.buffer.num_mini_batch, cfg.vtrace.actor_lag) == (16, 2, 3)

    result = example.train(cfg, output_dir=tmp_path / "run")

    csv_path = Path(result["csv_path"])
    assert csv_path == tmp_path / "run" / "metrics.csv"
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    assert [int(r["frames"]) for r in rows] == [64 * (i + 1) for i in range(8)]
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
        assert 1.0 <= float(row["episode_return"]) <= 500.0
        assert 0.0 < float(row["rho_mean"]) <= 1.0  # min(rho_bar = 1, pi / mu)
    # Two updates per rollout and a lag of 3: the first rollout is collected by the current
    # (initial) weights, later ones by weights the learner has moved away from.
    assert float(rows[0]["ratio_max"]) == pytest.approx(1.0, abs=1e-5)
    assert any(abs(float(r["ratio_max"]) - 1.0) > 1e-4 for r in rows[2:])

    png_path = Path(result["png_path"])
    assert png_path.read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    assert result["frames"] == 512
    assert 1.0 <= result["eval_return"] <= 500.0
    # Nothing leaked into the working directory besides the run dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _discounted_returns(reward, terminated, bootstrap, gamma):
    """Plain lambda = 1 targets over ``[N, T]`` lists: cut at terminations, bootstrap after the last step."""
    returns = []
    for rew, term, boot in zip(reward, terminated, bootstrap):
        acc, out = boot, [0.0] * len(rew)
        for t in range(len(rew) - 1, -1, -1):
            acc = rew[t] + (0.0 if term[t] else gamma * acc)
            out[t] = acc
        returns.append(out)
    return returns


def test_refresh_with_the_collecting_actor_gives_discounted_returns() -> None:
    """Ratio pi / mu = 1 after a refresh with an unchanged actor: V-trace's ``vs`` is the lambda = 1
    return and the advantage is ``vs - V``. With a changed actor the refresh takes effect."""
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from torchrl_ext.replay_buffers import VTraceReplayBuffer

    example = load_example("impala_vtrace")
    torch.manual_seed(0)
    num_envs, steps, gamma = 3, 40, 0.9
    env = example.make_env(functools.partial(GymEnv, "CartPole-v1"), num_envs, seed=0)
    actor, critic = example.make_modules(env, [16, 16])
    # Sampled actions, as the collector takes them (env.rollout defaults to the mode).
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        data = env.rollout(steps, TensorDictSequential(actor, critic), break_when_any_done=False)
    env.close()
    assert data.batch_size == (num_envs, steps)
    terminated = data["next", "terminated"].squeeze(-1)
    assert bool(terminated.any())  # a near-uniform policy: CartPole episodes end within 40 steps
    assert not bool((data["next", "done"] & ~data["next", "terminated"]).any())  # no truncation

    rb = VTraceReplayBuffer(steps, gamma=gamma, normalize_advantage=False)
    stats = example.compute_vtrace(rb, data, actor, critic)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["ratio_max"] == pytest.approx(1.0, abs=1e-5)

    with torch.no_grad():
        bootstrap = critic(data[:, -1]["next"].clone())["state_value"].squeeze(-1)
    expected = torch.tensor(_discounted_returns(
        data["next", "reward"].squeeze(-1).tolist(), terminated.tolist(), bootstrap.tolist(), gamma,
    ))
    stored = rb.storage.data[:steps]  # [T, N]
    vs = stored["value_target"].squeeze(-1).T
    torch.testing.assert_close(vs, expected, rtol=1e-5, atol=1e-4)
    advantage = stored["advantage"].squeeze(-1).T
    value = stored["state_value"].squeeze(-1).T
    torch.testing.assert_close(advantage, expected - value, rtol=1e-5, atol=1e-4)

    # The learner moves on: the refresh writes its log-probs, the ratios leave 1 and vs changes.
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.5 * torch.randn_like(p))
    rb.after_update()
    stats = example.compute_vtrace(rb, data, actor, critic)
    assert abs(stats["ratio_max"] - 1.0) > 1e-3
    with torch.no_grad():
        current = actor.get_dist(data.clone()).log_prob(data["action"])
    torch.testing.assert_close(rb.storage.data["action_log_prob"][:steps].squeeze(-1).T, current)
    assert not torch.allclose(rb.storage.data["value_target"][:steps].squeeze(-1).T, expected, atol=1e-3)


def test_actor_lag_trails_the_learner_by_lag_updates() -> None:
    import torch
    from torch import nn

    example = load_example("impala_vtrace")
    learner = nn.Linear(1, 1, bias=False)
    lag = example.ActorLag(learner, 2)
    seen = []
    for update in range(1, 5):
        with torch.no_grad():
            learner.weight.fill_(float(update))
        lag.step()
        seen.append(lag.behaviour.weight.item())
    initial = seen[0]
    assert seen[1:] == [initial, 1.0, 2.0]  # after update k the behaviour holds update k - 2
    assert not lag.behaviour.weight.requires_grad
    with pytest.raises(ValueError, match="actor_lag must be a non-negative int"):
        example.ActorLag(learner, -1)
