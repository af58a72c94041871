"""Exact resume: ``rb.dumps`` in one process, ``rb.loads`` in a fresh one, same next draws.

For every preset and the two prioritized TensorDict buffers, a buffer is
filled with seeded data (and sampled a little, so RNG, epoch and priority
state are mid-stream), saved with ``rb.dumps(path)``, and a fresh Python
process builds the same buffer with a *different* generator seed,
``rb.loads(path)`` and continues. Its next 100 draws (indices, data,
importance weights, with priority updates and, for the on-policy buffers, a
new rollout in between) must equal those of the uninterrupted run.

One child process serves every scenario (importing torch costs seconds).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_ext.presets import (
    alf_replay_buffer,
    harl_off_policy_buffer,
    harl_rollout_buffer,
    l2r_ppo_buffer,
    l2r_simple_replay_buffer,
    pytorchrl_on_policy_buffer,
    velora_replay_buffer,
)
from torchrl_ext.replay_buffers import PrioritizedReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import PrioritizedNStepSampler
from torchrl_ext.storages import FastTensorStorage

ROOT = Path(__file__).resolve().parents[1]
SEED, OTHER_SEED = 7, 12345  # the resumed buffer starts from OTHER_SEED: loads must restore SEED's stream
DRAWS = 100


@dataclass(frozen=True)
class Scenario:
    """How to build, fill (before the save) and continue (after it) one buffer."""

    build: Callable[[torch.Generator], Any]
    fill: Callable[[Any], None]
    draw: Callable[[Any], list[TensorDictBase]]


def _plain_draws(rb: Any, n: int = DRAWS) -> list[TensorDictBase]:
    return [rb.sample() for _ in range(n)]


def _priority_draws(rb: Any, n: int = DRAWS) -> list[TensorDictBase]:
    """Samples, each followed by a priority update that depends on the sample's indices."""
    out = []
    for k in range(n):
        batch = rb.sample()
        index = batch["index"].reshape(batch.shape[0], -1).float().sum(-1)
        priority = 0.1 + ((index * 0.37 + k * 0.11) % 2.0)
        batch.set("td_error", priority.reshape(batch.shape[:1] + (1,) * (batch.ndim - 1)).expand(batch.shape))
        rb.update_tensordict_priority(batch)
        out.append(batch)
    return out


# -- alf ---------------------------------------------------------------------------------
def _alf_step(t: int, data: torch.Generator, envs: int = 3) -> TensorDict:
    step_type = torch.full((envs,), 0 if t % 5 == 0 else (2 if t % 5 == 4 else 1), dtype=torch.int64)
    return TensorDict({"obs": torch.randn(envs, 2, generator=data), "step_type": step_type,
                       "t": torch.full((envs,), t)}, [envs])


def _alf_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(1)
    for t in range(25):  # 16-step rings wrap
        rb.extend(_alf_step(t, data))
        if t % 7 == 6:  # a partial write moves one env's cursor only
            rb.extend(_alf_step(t, data, envs=1), env_ids=torch.tensor([1]))
    _priority_draws(rb, 3) if rb.sampler.__class__.__name__.startswith("Prioritized") else _plain_draws(rb, 3)


# -- harl --------------------------------------------------------------------------------
def _harl_rollout_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(2)
    for _ in range(8):
        obs = torch.randn(3, 2, generator=data)
        rb.storage.insert(TensorDict({"obs": obs, "next": {"obs": obs + 1}}, [3]))
    _plain_draws(rb, 2)  # mid-epoch: 2 of 4 minibatches handed out


def _harl_off_policy_fill(fp: bool) -> Callable[[Any], None]:
    from tests.presets.test_harl_off_policy import harl_step

    def fill(rb: Any) -> None:
        for t in range(40):  # 30-step rings wrap
            rb.extend(harl_step(t, 2, 2 if fp else 1, fp, done_at=17))
        _plain_draws(rb, 3)
    return fill


# -- pytorchrl ---------------------------------------------------------------------------
def _pytorchrl_steps(rb: Any, seed: int) -> None:
    data = torch.Generator().manual_seed(seed)
    for t in range(6):
        obs = torch.randn(4, 2, generator=data)
        done = torch.rand(4, 1, generator=data) < 0.2
        rb.insert(TensorDict({
            "observation": obs, "state_value": torch.randn(4, 1, generator=data),
            "intrinsic_state_value": torch.randn(4, 1, generator=data),
            "action_log_prob": -torch.rand(4, 1, generator=data),
            "next": {"observation": obs + 1, "reward": torch.randn(4, 1, generator=data),
                     "intrinsic_reward": torch.rand(4, 1, generator=data) * 3,
                     "done": done, "terminated": done},
        }, [4]))


def _pytorchrl_fill(rb: Any) -> None:
    _pytorchrl_steps(rb, 3)
    rb.compute_returns()  # updates the intrinsic reward normalizer
    _plain_draws(rb, 1)  # mid-epoch: 1 of 3 minibatches


def _pytorchrl_draw(rb: Any) -> list[TensorDictBase]:
    out = _plain_draws(rb, DRAWS // 2)
    rb.after_update()
    _pytorchrl_steps(rb, 4)
    rb.compute_returns()  # normalised with the restored running statistics
    return out + _plain_draws(rb, DRAWS // 2)


# -- l2r ---------------------------------------------------------------------------------
def _l2r_ppo_store(rb: Any, data: torch.Generator, n: int) -> None:
    rb.store(TensorDict({
        "observation": torch.randn(n, 3, generator=data), "action": torch.randn(n, 2, generator=data),
        "state_value": torch.randn(n, 1, generator=data),
        "action_log_prob": -torch.rand(n, 1, generator=data),
        "next": {"reward": torch.randn(n, 1, generator=data)},
    }, [n]))


def _l2r_ppo_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(5)
    for _ in range(3):  # 27 steps in a 20-step ring
        _l2r_ppo_store(rb, data, 9)
        rb.finish_path(0.5)
    _l2r_ppo_store(rb, data, 4)  # an unfinished path at the save
    [rb.sample_batch() for _ in range(2)]


def _l2r_ppo_draw(rb: Any) -> list[TensorDictBase]:
    out = [rb.sample_batch() for _ in range(DRAWS // 2)]
    rb.finish_path(0.25)  # finishes the 4 steps stored before the save
    return out + [rb.sample_batch() for _ in range(DRAWS // 2)]


def _l2r_simple_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(6)
    for _ in range(10):
        obs = torch.randn(3, 2, generator=data)
        rb.extend(TensorDict({"observation": obs, "action": torch.randn(3, 1, generator=data),
                              "next": {"observation": obs + 1, "reward": torch.randn(3, 1, generator=data),
                                       "done": torch.zeros(3, 1, dtype=torch.bool)}}, [3]))
    _plain_draws(rb, 2)


# -- velora ------------------------------------------------------------------------------
def _velora_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(8)
    for _ in range(5):  # 25 rows in a 16-row ring
        rb.add_multi(torch.randn(5, 3, generator=data), torch.randn(5, 2, generator=data),
                     torch.randn(5, generator=data), torch.randn(5, 3, generator=data),
                     torch.rand(5, generator=data) < 0.1, torch.randn(5, 4, generator=data))
    _plain_draws(rb, 2)


# -- prioritized TensorDict buffers ------------------------------------------------------
def _prb_fill(rb: Any) -> None:
    data = torch.Generator().manual_seed(9)
    for _ in range(8):  # 40 rows in a 32-row ring
        rb.extend(TensorDict({"obs": torch.randn(5, 2, generator=data),
                              "td_error": torch.rand(5, generator=data) * 4}, [5]))
    _priority_draws(rb, 3)


def _nstep_fill(rb: Any) -> None:
    from tests.samplers.test_prioritized_nstep import collect

    rng, history = random.Random(10), [[] for _ in range(3)]
    for chunk in (3, 4, 2, 4, 3, 4):  # 20 steps per env in 7-row rings
        rb.extend(collect(rng, history, chunk))
    _priority_draws(rb, 3)


def _gen(build: Callable[..., Any], **kwargs: Any) -> Callable[[torch.Generator], Any]:
    return lambda generator: build(**kwargs, generator=generator)


SCENARIOS: dict[str, Scenario] = {
    "alf_uniform": Scenario(
        _gen(alf_replay_buffer, num_environments=3, max_length=16, batch_length=2, batch_size=8),
        _alf_fill, _plain_draws),
    "alf_prioritized": Scenario(
        _gen(alf_replay_buffer, num_environments=3, max_length=16, batch_length=2, batch_size=8,
             prioritized_sampling=True, keep_episodic_info=True, num_earliest_frames_ignored=1),
        _alf_fill, _priority_draws),
    "harl_rollout": Scenario(
        _gen(harl_rollout_buffer, episode_length=8, num_mini_batch=4), _harl_rollout_fill, _plain_draws),
    "harl_off_policy_EP": Scenario(
        _gen(harl_off_policy_buffer, buffer_size=60, n_rollout_threads=2, batch_size=8, n_step=3,
             gamma=0.9, state_type="EP"), _harl_off_policy_fill(False), _plain_draws),
    "harl_off_policy_FP": Scenario(
        _gen(harl_off_policy_buffer, buffer_size=60, n_rollout_threads=2, batch_size=8, n_step=3,
             gamma=0.9, state_type="FP"), _harl_off_policy_fill(True), _plain_draws),
    **{f"pytorchrl_{kind}": Scenario(
        _gen(pytorchrl_on_policy_buffer, size=6, storage=kind, num_mini_batch=3),
        _pytorchrl_fill, _pytorchrl_draw) for kind in ("gae", "vanilla", "vtrace")},
    "l2r_ppo": Scenario(
        _gen(l2r_ppo_buffer, obs_dim=3, act_dim=2, size=20, batch_size=8), _l2r_ppo_fill, _l2r_ppo_draw),
    "l2r_simple": Scenario(
        _gen(l2r_simple_replay_buffer, obs_dim=2, act_dim=1, size=20, batch_size=8),
        _l2r_simple_fill, _plain_draws),
    "velora": Scenario(
        _gen(velora_replay_buffer, capacity=16, state_dim=3, action_dim=2, hidden_dim=4, batch_size=8),
        _velora_fill, _plain_draws),
    "prioritized_fast": Scenario(
        lambda generator: PrioritizedReplayBuffer(
            alpha=0.7, beta=0.5, storage=FastTensorStorage(32), batch_size=8, generator=generator),
        _prb_fill, _priority_draws),
    "prioritized_nstep_fast_2d": Scenario(
        lambda generator: TensorDictReplayBuffer(
            storage=FastTensorStorage(21, ndim=2),
            sampler=PrioritizedNStepSampler(21, alpha=0.8, beta=0.5, n_step=3, gamma=0.9),
            batch_size=16, generator=generator, priority_key="td_error"),
        _nstep_fill, _priority_draws),
}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _records(batches: list[TensorDictBase]) -> list[dict[str, torch.Tensor]]:
    return [{".".join(k) if isinstance(k, tuple) else k: v.clone()
             for k, v in b.items(include_nested=True, leaves_only=True)} for b in batches]


def _child_main(root: str) -> None:
    """Fresh-process half: load each saved scenario and record its next draws."""
    torch.set_num_threads(1)
    failed = []
    for name, scenario in SCENARIOS.items():
        folder = Path(root) / name
        try:
            rb = scenario.build(_generator(OTHER_SEED))
            rb.loads(folder / "buffer")
            torch.save(_records(scenario.draw(rb)), folder / "resumed.pt")
        except Exception:  # report every scenario, not only the first failure
            traceback.print_exc()
            print(f"^^^ scenario {name} failed", file=sys.stderr)
            failed.append(name)
    sys.exit(1 if failed else 0)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per scenario: the uninterrupted draws, the saver's own continuation and the child's draws."""
    root = tmp_path_factory.mktemp("resume")
    results: dict[str, Any] = {}
    for name, scenario in SCENARIOS.items():
        reference = scenario.build(_generator(SEED))
        scenario.fill(reference)
        saver = scenario.build(_generator(SEED))
        scenario.fill(saver)
        (root / name).mkdir()
        saver.dumps(root / name / "buffer")
        results[name] = {"reference": _records(scenario.draw(reference)),
                         "after_save": _records(scenario.draw(saver))}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from tests.test_resume import _child_main; _child_main(sys.argv[1])",
         str(root)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    for name in SCENARIOS:
        path = root / name / "resumed.pt"
        results[name]["resumed"] = torch.load(path) if path.exists() else None
    results["_child"] = proc
    return results


def _child_error(stderr: str, name: str) -> str:
    """The child's traceback for scenario ``name``."""
    chunks = stderr.split("^^^ scenario ")
    for k, chunk in enumerate(chunks[1:], 1):
        if chunk.startswith(f"{name} failed"):
            return chunks[k - 1].rsplit("failed", 1)[-1][-4000:]
    return stderr[-4000:]


def _assert_same(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]], label: str) -> None:
    assert len(got) == len(want) == DRAWS
    for k, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), f"{label}: draw {k} has keys {sorted(g)}, expected {sorted(w)}"
        for key in w:
            assert torch.equal(g[key], w[key]), f"{label}: draw {k}, key {key!r}: {g[key]} != {w[key]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_resume_in_a_fresh_process_gives_the_same_draws(resumed: dict[str, Any], name: str) -> None:
    result = resumed[name]
    want = result["reference"]
    assert "index" in want[0], f"{name}: samples carry no index"
    _assert_same(result["after_save"], want, f"{name} (saving process)")
    got = result["resumed"]
    proc = resumed["_child"]
    assert got is not None, f"{name}: the child wrote no draws; its stderr:\n{_child_error(proc.stderr, name)}"
    _assert_same(got, want, f"{name} (fresh process)")


@pytest.mark.slow
def test_scenarios_have_weights_where_prioritized(resumed: dict[str, Any]) -> None:
    """The comparison covers importance weights for the prioritized buffers."""
    for name in ("alf_prioritized", "prioritized_fast", "prioritized_nstep_fast_2d"):
        weights = torch.cat([r["priority_weight"].flatten() for r in resumed[name]["reference"]])
        assert weights.numel() > 0 and bool((weights > 0).all()) and bool((weights < 1).any()), name
