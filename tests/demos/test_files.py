"""Demo files: npz round trip, loud loading errors, top-demo saving, Minari conversion."""
from __future__ import annotations

import doctest
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import torchrl_ext.demos.files as files_module
from torchrl_ext.demos import (
    DemoDirPoller,
    DemoStore,
    load_demo,
    load_demo_dir,
    load_minari_demos,
    save_demo,
    save_top_demos,
)


def _demo(length: int = 3, total: float = 1.0, obs_dtype=torch.float32) -> dict:
    reward = torch.zeros(length)
    reward[-1] = total
    return {"observation": torch.arange(length * 4).reshape(length, 2, 2).to(obs_dtype),
            "action": torch.arange(length, dtype=torch.int64), "reward": reward}


def _write_npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def test_docstring_examples_run() -> None:
    result = doctest.testmod(files_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("obs_dtype", [torch.float32, torch.uint8])
def test_round_trip_keeps_values_and_dtypes(tmp_path: Path, obs_dtype) -> None:
    demo = _demo(4, 2.5, obs_dtype)
    path = save_demo(tmp_path / "sub" / "d.npz", demo, frame_skip=4)
    loaded = load_demo(path, frame_skip=4)
    for key in ("observation", "action"):
        assert loaded[key].dtype == demo[key].dtype
        torch.testing.assert_close(loaded[key], demo[key])
    torch.testing.assert_close(loaded["reward"], demo["reward"].reshape(4, 1))
    assert loaded["frame_skip"] == 4
    with np.load(path) as data:  # pytorchrl's file layout
        assert sorted(data.files) == ["Action", "FrameSkip", "Observation", "Reward"]
        assert int(data["FrameSkip"]) == 4
    assert [p.name for p in path.parent.iterdir()] == ["d.npz"]  # no temporary file left


def test_loaded_demos_feed_the_store(tmp_path: Path) -> None:
    for k, total in enumerate((3.0, 1.0)):
        save_demo(tmp_path / f"{k}.npz", _demo(2, total), frame_skip=1)
    store = DemoStore()
    store.add_initial_demos(load_demo_dir(tmp_path, frame_skip=1), human=True)
    assert [d["total_reward"] for d in store.reward_demos] == [3.0, 1.0]
    assert store.num_human_demos == 2 and store.reward_threshold == 1.0


def test_missing_key(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "bad.npz", Observation=np.zeros((2, 1)), Reward=np.zeros(2),
                      FrameSkip=np.array(1))
    with pytest.raises(ValueError, match=r"bad\.npz has no key\(s\) \['Action'\].*save_demo"):
        load_demo(path)


def test_mismatched_lengths(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "len.npz", Observation=np.zeros((3, 1)), Action=np.zeros(2),
                      Reward=np.zeros(2), FrameSkip=np.array(1))
    with pytest.raises(ValueError, match=r"len\.npz: keys 'Observation', 'Action' and 'Reward' "
                                         r"must have the same number of rows"):
        load_demo(path)
    path = _write_npz(tmp_path / "rew.npz", Observation=np.zeros((2, 1)), Action=np.zeros(2),
                      Reward=np.zeros((2, 2)), FrameSkip=np.array(1))
    with pytest.raises(ValueError, match=r"rew\.npz.*Reward \[L\] or \[L, 1\]"):
        load_demo(path)


def test_frame_skip_mismatch_and_bad_frame_skip(tmp_path: Path) -> None:
    path = save_demo(tmp_path / "fs.npz", _demo(), frame_skip=4)
    with pytest.raises(ValueError, match=r"fs\.npz: key 'FrameSkip' is 4 but frame_skip=2"):
        load_demo(path, frame_skip=2)
    assert load_demo(path)["frame_skip"] == 4  # no check without frame_skip
    bad = _write_npz(tmp_path / "bad.npz", Observation=np.zeros((1, 1)), Action=np.zeros(1),
                     Reward=np.zeros(1), FrameSkip=np.array([1, 2]))
    with pytest.raises(ValueError, match=r"key 'FrameSkip' must be one integer"):
        load_demo(bad)
    with pytest.raises(ValueError, match=r"frame_skip must be an int >= 0, got frame_skip=-1"):
        save_demo(tmp_path / "x.npz", _demo(), frame_skip=-1)


def test_frame_skip_zero_is_pytorchrls_default(tmp_path: Path) -> None:
    """pytorchrl's envs default to frame_skip=0 and write it into their demo files."""
    path = _write_npz(tmp_path / "pytorchrl.npz", Observation=np.zeros((2, 1)), Action=np.zeros(2),
                      Reward=np.array([0.0, 1.0]), FrameSkip=np.array(0))
    assert load_demo(path, frame_skip=0)["frame_skip"] == 0
    with pytest.raises(ValueError, match=r"'FrameSkip' is 0 but frame_skip=1"):
        load_demo(path, frame_skip=1)
    saved = save_demo(tmp_path / "ours.npz", _demo(), frame_skip=0)
    assert int(np.load(saved)["FrameSkip"]) == 0
    store = DemoStore(capacity=2)
    assert len(DemoDirPoller(store, tmp_path, frame_skip=0).poll()) == 2


def test_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"text\.npz is not a readable \.npz demo file"):
        load_demo(tmp_path / "text.npz")
    np.save(tmp_path / "single.npy", np.zeros(2))
    with pytest.raises(ValueError, match="single array"):
        load_demo(tmp_path / "single.npy")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_demo(tmp_path / "missing.npz")
    with pytest.raises(FileNotFoundError, match="demo directory"):
        load_demo_dir(tmp_path / "nowhere")


def test_load_demo_dir_is_sorted_and_skips_other_files(tmp_path: Path) -> None:
    for name, total in (("b.npz", 2.0), ("a.npz", 1.0), ("c.npz", 3.0)):
        save_demo(tmp_path / name, _demo(2, total), frame_skip=1)
    (tmp_path / "notes.txt").write_text("ignored")
    totals = [float(d["reward"].sum()) for d in load_demo_dir(tmp_path)]
    assert totals == [1.0, 2.0, 3.0]


def _store_with_agent_demos(totals, lengths=None) -> DemoStore:
    store = DemoStore(num_demos_to_save=3)
    store.add_initial_demos([_demo(2, 100.0)], human=True)  # a human demo is never saved
    lengths = lengths or [2] * len(totals)
    store.add_initial_demos([_demo(n, t) for n, t in zip(lengths, totals)], human=False)
    return store


def test_save_top_demos_ranks_and_removes_stale_files(tmp_path: Path) -> None:
    store = _store_with_agent_demos([1.0, 5.0, 3.0, 4.0, 2.0])
    written = save_top_demos(store, tmp_path / "out", frame_skip=2)
    assert [p.name for p in written] == [f"reward_demo_{k}.npz" for k in (1, 2, 3)]
    assert [float(load_demo(p, 2)["reward"].sum()) for p in written] == [5.0, 4.0, 3.0]
    (tmp_path / "out" / "keep_me.npz").write_bytes(b"")
    # A later save with fewer agent demos: reward_demo_2/3 of the first save must go
    # (pytorchrl leaves them, so they would be reloaded as demos).
    smaller = _store_with_agent_demos([7.0])
    save_top_demos(smaller, tmp_path / "out", frame_skip=2)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["keep_me.npz", "reward_demo_1.npz"]
    assert float(load_demo(tmp_path / "out" / "reward_demo_1.npz")["reward"].sum()) == 7.0


def test_save_top_demos_ties_rank_the_newest_first(tmp_path: Path) -> None:
    """pytorchrl ranks by np.flip(np.argsort(totals)): among equal totals, the newest first."""
    totals = [2.0, 1.0, 2.0, 2.0]
    store = _store_with_agent_demos(totals, lengths=[2, 3, 4, 5])
    written = save_top_demos(store, tmp_path, frame_skip=1)
    expected = [[2, 3, 4, 5][k] for k in np.flip(np.argsort(totals))[: store.num_demos_to_save]]
    assert [load_demo(p)["action"].shape[0] for p in written] == expected == [5, 4, 2, 3][: len(expected)]


# --------------------------------------------------------------------------- Minari


class _FakeMinari:
    """The part of ``minari.MinariDataset`` the loader uses."""

    def __init__(self, episodes):
        self.episodes = episodes
        self.requested = None

    def iterate_episodes(self, episode_indices=None):
        self.requested = episode_indices
        indices = range(len(self.episodes)) if episode_indices is None else episode_indices
        for k in indices:
            yield self.episodes[k]


def _episode(k: int, length: int, obs=None):
    return SimpleNamespace(
        id=k,
        observations=np.arange(length + 1, dtype=np.float32)[:, None] if obs is None else obs,
        actions=np.full((length, 2), k, dtype=np.float32),
        rewards=np.arange(length, dtype=np.float64),
    )


def test_minari_conversion_drops_the_last_observation() -> None:
    dataset = _FakeMinari([_episode(0, 3), _episode(1, 2)])
    demos = load_minari_demos(dataset)
    assert [d["id"] for d in demos] == ["minari-0", "minari-1"]
    assert demos[0]["observation"].flatten().tolist() == [0.0, 1.0, 2.0]
    assert demos[0]["action"].shape == (3, 2) and demos[0]["reward"].shape == (3, 1)
    store = DemoStore()
    store.add_initial_demos(demos, human=True)
    assert [d["total_reward"] for d in store.reward_demos] == [3.0, 1.0]
    assert [d["id"] for d in store.reward_demos] == ["minari-0", "minari-1"]


def test_minari_indices_limits_and_errors() -> None:
    dataset = _FakeMinari([_episode(k, 2) for k in range(4)])
    demos = load_minari_demos(dataset, episode_indices=[3, 1], max_episodes=1)
    assert dataset.requested == [3, 1] and [d["id"] for d in demos] == ["minari-3"]
    with pytest.raises(ValueError, match="minari episode 0 has dict observations"):
        load_minari_demos(_FakeMinari([_episode(0, 2, obs={"a": np.zeros((3, 1))})]))
    with pytest.raises(ValueError, match="minari episode 0 has mismatched lengths"):
        load_minari_demos(_FakeMinari([_episode(0, 2, obs=np.zeros((5, 1)))]))


def test_minari_id_without_minari_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "minari", None)  # import fails, installed or not
    with pytest.raises(ImportError, match="pip install minari"):
        load_minari_demos("D4RL/door/human-v2")


def _reward_demo(total: float, length: int = 3) -> dict[str, torch.Tensor]:
    reward = torch.zeros(length)
    reward[-1] = total
    return {"observation": torch.arange(length * 2.0).view(length, 2), "action": torch.zeros(length, 1),
            "reward": reward}


def test_poller_adds_each_new_file_once(tmp_path: Path) -> None:
    from torchrl_ext.demos import DemoDirPoller, DemoStore

    folder = tmp_path / "supplementary"
    store = DemoStore(rho=0.1, phi=0.0, initial_reward_threshold=0.5)
    poller = DemoDirPoller(store, folder, frame_skip=1)
    assert poller.poll() == []  # the folder does not exist yet
    save_demo(folder / "b.npz", _reward_demo(1.0), frame_skip=1)
    save_demo(folder / "a.npz", _reward_demo(0.2), frame_skip=1)  # below the threshold: seen, not kept
    added = poller.poll()
    assert len(added) == 1 and [d["id"] for d in store.reward_demos] == added
    assert poller.seen == {"a.npz", "b.npz"}
    assert poller.poll() == [] and len(store.reward_demos) == 1
    save_demo(folder / "c.npz", _reward_demo(2.0), frame_skip=1)
    assert len(poller.poll()) == 1 and sorted(d["total_reward"] for d in store.reward_demos) == [1.0, 2.0]


def test_poller_refuses_a_bad_file_and_adds_nothing(tmp_path: Path) -> None:
    from torchrl_ext.demos import DemoDirPoller, DemoStore

    store = DemoStore(rho=0.1, phi=0.0, initial_reward_threshold=0.5)
    save_demo(tmp_path / "a_good.npz", _reward_demo(1.0), frame_skip=1)
    np.savez(tmp_path / "b_bad.npz", Observation=np.zeros((3, 2)), Action=np.zeros((3, 1)), FrameSkip=np.array(1))
    poller = DemoDirPoller(store, tmp_path, frame_skip=1)
    with pytest.raises(ValueError, match="b_bad.npz"):
        poller.poll()
    assert store.reward_demos == [] and poller.seen == set()
    (tmp_path / "b_bad.npz").unlink()
    assert len(poller.poll()) == 1
