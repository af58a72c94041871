"""Tests for ``examples/alf_trajectory``: the smoke config through Hydra's compose API, and the
example's window targets against a float64 loop written from the lambda-return definition."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from tests.examples._load import EXAMPLES_DIR, PNG_MAGIC, load_example

CONF_DIR = EXAMPLES_DIR.parent / "conf"


@pytest.mark.slow
def test_alf_trajectory_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    example = load_example("alf_trajectory")
    # Anything written relative to the cwd must land in tmp_path, not the repo.
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="alf_trajectory", overrides=["experiment=alf_trajectory_smoke"])
    # The group values are linked to the example's settings by interpolation.
    assert cfg.buffer.batch_length == cfg.loss.batch_length == 4
    assert cfg.buffer.num_environments == cfg.collector.num_envs

    result = example.train(cfg, output_dir=tmp_path)

    csv_path = Path(result["csv_path"])
    assert csv_path == tmp_path / "metrics.csv"
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == example.CSV_COLUMNS
        rows = list(reader)
    # 8 batches of 4 x 16 frames; the first (64 frames < learning_starts=128) is warm-up only.
    assert [int(r["frames"]) for r in rows] == [64 * i for i in range(2, 9)]
    assert [int(r["updates"]) for r in rows] == [4 * i for i in range(1, 8)]
    for row in rows:
        for column, value in row.items():
            assert math.isfinite(float(value)), (column, value)
        assert 1.0 <= float(row["episode_return"]) <= 500.0
        assert 0.0 <= float(row["windows_with_end"]) <= 1.0
    # The epsilon schedule is annealed over 256 frames, then stays at eps_end.
    assert float(rows[0]["epsilon"]) > float(rows[-1]["epsilon"]) == pytest.approx(0.04)
    assert Path(result["png_path"]).read_bytes()[: len(PNG_MAGIC)] == PNG_MAGIC
    assert result["frames"] == 512
    assert 1.0 <= result["eval_return"] <= 500.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learning_curve.png", "metrics.csv"]


def _lambda_return_loop(reward, done, terminated, bootstrap, gamma, lmbda):
    """Forward-view lambda-returns over ``[B][T]`` lists, in Python floats (float64).

    From step ``t`` the horizon ``N`` runs to the first episode end at or after ``t``, or to
    the window's last step. The ``n``-step return sums ``n`` discounted rewards and adds
    ``gamma ** n`` times the bootstrap of step ``t + n - 1`` (zero if that step terminated);
    the lambda-return weighs the ``n``-step returns ``(1 - lmbda) * lmbda ** (n - 1)`` for
    ``n < N`` and gives the rest, ``lmbda ** (N - 1)``, to the ``N``-step return.
    """
    out = []
    for rew, dn, term, boot in zip(reward, done, terminated, bootstrap):
        length = len(rew)
        row = []
        for t in range(length):
            last = t
            while last < length - 1 and not dn[last]:
                last += 1
            horizon = last - t + 1

            def n_step(n: int) -> float:
                end = t + n - 1
                total = sum(gamma**k * rew[t + k] for k in range(n))
                return total + (0.0 if term[end] else gamma**n * boot[end])

            value = sum((1 - lmbda) * lmbda ** (n - 1) * n_step(n) for n in range(1, horizon))
            row.append(value + lmbda ** (horizon - 1) * n_step(horizon))
        out.append(row)
    return out


@pytest.mark.parametrize("lmbda", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("double_dqn", [False, True])
def test_window_targets_match_the_lambda_return_definition(lmbda: float, double_dqn: bool) -> None:
    example = load_example("alf_trajectory")
    gamma = 0.9
    # Two windows of 6 steps, 3 actions. Window 0: the episode terminates after step 2 and
    # a new one starts at step 3. Window 1: a truncation (done, not terminated) after
    # step 1, so that step bootstraps, and no end after it: step 5 bootstraps.
    reward = [[1.0, -0.5, 2.0, 0.25, 1.5, -1.0], [0.5, 1.0, -2.0, 3.0, 0.0, 1.0]]
    done = [[False, False, True, False, False, False], [False, True, False, False, False, False]]
    terminated = [[False, False, True, False, False, False], [False] * 6]
    generator = torch.Generator().manual_seed(0)
    next_q_target = torch.randn(2, 6, 3, dtype=torch.float64, generator=generator)
    next_q_online = torch.randn(2, 6, 3, dtype=torch.float64, generator=generator)

    # The bootstrap value of each step, picked by hand from the Q-value lists.
    q_target, q_online = next_q_target.tolist(), next_q_online.tolist()
    bootstrap = []
    for b in range(2):
        row = []
        for t in range(6):
            if double_dqn:
                scores = q_online[b][t]
                row.append(q_target[b][t][scores.index(max(scores))])
            else:
                row.append(max(q_target[b][t]))
        bootstrap.append(row)
    expected = torch.tensor(
        _lambda_return_loop(reward, done, terminated, bootstrap, gamma, lmbda), dtype=torch.float64
    )

    as_column = lambda x, dtype: torch.tensor(x, dtype=dtype).unsqueeze(-1)  # noqa: E731
    targets = example.window_targets(
        as_column(reward, torch.float64),
        as_column(done, torch.bool),
        as_column(terminated, torch.bool),
        next_q_target,
        gamma,
        lmbda,
        next_q_online=next_q_online if double_dqn else None,
    )
    assert targets.shape == (2, 6)
    torch.testing.assert_close(targets, expected, rtol=1e-12, atol=1e-12)
    # The terminated step of window 0 is its reward alone, whatever lambda is.
    assert targets[0, 2].item() == pytest.approx(2.0)


def test_window_loss_uses_the_taken_actions_and_no_target_gradient() -> None:
    from tensordict import TensorDict

    example = load_example("alf_trajectory")
    torch.manual_seed(0)
    qnet = example.make_qnet(4, 2, [8])
    target_qnet = example.make_qnet(4, 2, [8])
    b, t = 3, 5
    window = TensorDict(
        {
            "observation": torch.randn(b, t, 4),
            "action": torch.nn.functional.one_hot(torch.randint(2, (b, t)), 2),
            "next": {
                "observation": torch.randn(b, t, 4),
                "reward": torch.ones(b, t, 1),
                "done": torch.zeros(b, t, 1, dtype=torch.bool),
                "terminated": torch.zeros(b, t, 1, dtype=torch.bool),
            },
        },
        [b, t],
    )
    window["next", "done"][1, 2] = True
    loss, stats = example.window_loss(window, qnet, target_qnet, 0.99, 0.9, double_dqn=True)
    loss.backward()
    assert all(p.grad is not None for p in qnet.parameters())
    assert all(p.grad is None for p in target_qnet.parameters())
    assert stats["windows_with_end"] == pytest.approx(1 / 3)
    with torch.no_grad():
        taken = qnet(window["observation"]).gather(-1, window["action"].argmax(-1, keepdim=True))
    assert stats["q_mean"] == pytest.approx(taken.mean().item(), rel=1e-6)
