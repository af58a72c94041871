"""The fast-path switch: its settings, and the same data with every fast path on or off."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import RandomSampler

import torchrl_ext
from torchrl_ext import _fastpath as fastpath_module
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import NStepSampler, PrioritizedSampler, TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage, EnvRingStorage, FastTensorStorage

from tests._buffer_runs import ROUNDS, RUNS, assert_same
from tests.storages.test_dedup import Streams, to_td


def _setting_in_a_new_process(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != fastpath_module.ENV_VAR}
    if value is not None:
        env[fastpath_module.ENV_VAR] = value
    code = "import torchrl_ext; print(torchrl_ext.fastpath_enabled())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("value, want", [(None, "True"), ("on", "True"), (" OFF ", "False")])
def test_the_environment_variable_sets_the_switch_at_import(value, want):
    result = _setting_in_a_new_process(value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == want


@pytest.mark.slow
def test_a_bad_environment_value_is_refused_at_import_with_the_fix():
    result = _setting_in_a_new_process("maybe")
    assert result.returncode != 0
    assert "TORCHRL_EXT_FASTPATH must be 0 or 1, got TORCHRL_EXT_FASTPATH='maybe'; set it to 0" in result.stderr


def test_set_fastpath_and_the_context_manager_restore_the_setting():
    before = torchrl_ext.fastpath_enabled()
    with torchrl_ext.fastpath(not before):
        assert torchrl_ext.fastpath_enabled() is (not before)
        with torchrl_ext.fastpath(before):
            assert torchrl_ext.fastpath_enabled() is before
        assert torchrl_ext.fastpath_enabled() is (not before)
    assert torchrl_ext.fastpath_enabled() is before
    with pytest.raises(RuntimeError, match="boom"), torchrl_ext.fastpath(not before):
        raise RuntimeError("boom")
    assert torchrl_ext.fastpath_enabled() is before


@pytest.mark.parametrize("bad", [1, 0, "0", None])
def test_set_fastpath_refuses_non_bools_and_keeps_the_setting(bad):
    before = torchrl_ext.fastpath_enabled()
    with pytest.raises(TypeError, match=rf"enabled must be True or False, got enabled={bad!r}"):
        torchrl_ext.set_fastpath(bad)
    assert torchrl_ext.fastpath_enabled() is before


# ---------------------------------------------------------------- same data both ways

def _frames(start: int, n: int, shape=(2, 8, 8)) -> TensorDict:
    values = torch.arange(start, start + n)
    obs = (values.view(n, 1, 1, 1) + torch.arange(shape[0] * shape[1] * shape[2]).view(1, *shape)) % 251
    return TensorDict({"obs": obs.to(torch.uint8), "reward": values.float().unsqueeze(-1),
                       "next": {"obs": ((obs + 1) % 251).to(torch.uint8),
                                "done": (values % 7 == 6).unsqueeze(-1)}}, [n])


def _flat_buffer(sampler):
    return TensorDictReplayBuffer(storage=FastTensorStorage(50), sampler=sampler, batch_size=16)


def _run_flat(make_sampler, seed: int) -> list[TensorDict]:
    torch.manual_seed(seed)
    rb = _flat_buffer(make_sampler())
    out = []
    for k in range(7):  # wraps: 7 x 9 rows into 50
        rb.extend(_frames(9 * k, 9))
        sample = rb.sample()
        if "td_error" not in sample.keys():
            sample.set("td_error", sample["reward"].squeeze(-1).abs() + 1.0)
        if isinstance(rb.sampler, PrioritizedSampler):
            rb.update_tensordict_priority(sample)
        out.append(sample.exclude("td_error"))
    out.append(rb.storage.get(torch.arange(len(rb))))
    return out


def _run_rings(storage_factory, sampler_factory, seed: int) -> list[TensorDict]:
    """Steps of 3 envs (every env together, then subsets, so both write paths run), sampled
    as they come, then every stored step read back."""
    torch.manual_seed(seed)
    streams = Streams(3, 2, 0, "reset", random.Random(seed))
    rb = EnvRingReplayBuffer(storage=storage_factory(), sampler=sampler_factory(), batch_size=6)
    out = []
    for k in range(14):
        env_ids = [0, 1, 2] if k % 3 != 2 else [2, 0]
        data, ids = to_td(env_ids, [[streams.step(e)] for e in env_ids], blocks=False)
        data.set(("next", "reward"), data["reward"].unsqueeze(-1))
        if env_ids == [0, 1, 2]:
            rb.extend(data)
        else:
            rb.extend(data, env_ids=ids)
        if k >= 3:
            out.append(rb.sample())
    storage = rb.storage
    for env in range(3):  # the newest 6 steps: older ones may need overwritten frames (dedup)
        end = int(storage.current_pos[env])
        positions = torch.arange(end - 6, end)
        out.append(rb.read(torch.full_like(positions, env), positions))
    # Whether the every-env step write (a fast path) ran.
    out.append(TensorDict({"step_path": torch.tensor(bool(storage._rings.step_columns_cache))}, []))
    return out


@pytest.mark.parametrize("make_sampler", [RandomSampler, lambda: PrioritizedSampler(50, alpha=0.7, beta=0.5)],
                         ids=["random", "prioritized"])
def test_a_flat_buffer_stores_and_samples_the_same_with_the_fast_paths_on_or_off(make_sampler, monkeypatch):
    lean = []
    real = TensorDictReplayBuffer._lean_extend
    monkeypatch.setattr(TensorDictReplayBuffer, "_lean_extend", lambda self, *a: lean.append(1) or real(self, *a))
    with torchrl_ext.fastpath(True):
        on = _run_flat(make_sampler, seed=3)
    assert lean  # the fast paths ran
    lean.clear()
    with torchrl_ext.fastpath(False):
        off = _run_flat(make_sampler, seed=3)
    assert not lean
    assert_same(on, off)


@pytest.mark.parametrize(
    "storage_factory, sampler_factory",
    [
        (lambda: EnvRingStorage(3, 8), lambda: TrajectorySampler(batch_length=2)),
        (lambda: EnvRingStorage(3, 8, time_major=False), lambda: NStepSampler(n_step=2, gamma=0.9)),
        (lambda: DedupEnvRingStorage(3, 8, num_stack=2), lambda: TrajectorySampler(batch_length=1)),
    ],
    ids=["ring-trajectory", "ring-nstep", "dedup"],
)
def test_the_rings_store_and_sample_the_same_with_the_fast_paths_on_or_off(storage_factory, sampler_factory):
    with torchrl_ext.fastpath(True):
        on = _run_rings(storage_factory, sampler_factory, seed=5)
    with torchrl_ext.fastpath(False):
        off = _run_rings(storage_factory, sampler_factory, seed=5)
    # The frame-deduplicating storage writes its own way; the plain rings take the step path.
    dedup = isinstance(storage_factory(), DedupEnvRingStorage)
    assert bool(on[-1]["step_path"]) is not dedup and not bool(off[-1]["step_path"])
    assert_same(on[:-1], off[:-1])


@pytest.mark.parametrize("case", RUNS)
def test_every_buffer_family_gives_the_same_data_with_the_fast_paths_on_or_off(case):
    def whole_run(enabled: bool) -> list[TensorDict]:
        torch.manual_seed(0)
        with torchrl_ext.fastpath(enabled):
            run = RUNS[case]()
            return [run.run(k) for k in range(ROUNDS)]

    assert_same(whole_run(True), whole_run(False))
