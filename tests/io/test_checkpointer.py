"""SafetensorsCheckpointer: TorchRL round trips, the atomic pair, crash recovery, clear errors."""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import time

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage

from torchrl_ext.io import SafetensorsCheckpointer
from torchrl_ext.io.checkpoint_pair import CheckpointPair, read_pair, write_pair
from torchrl_ext.presets.velora import load_velora_replay_buffer, velora_replay_buffer
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.storages import FastTensorStorage


def chunk(start: int, n: int) -> TensorDict:
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": step.float()[:, None].expand(n, 3).clone(),
            "pixels": (step % 256).to(torch.uint8).view(n, 1, 1).expand(n, 2, 2).clone(),
            "next": {"obs": step.float()[:, None] + 1, "done": (step % 3 == 0)[:, None]},
        },
        [n],
    )


def make_rb(storage_cls, prefix="run.v1_", capacity=8, seed=0):
    return TensorDictReplayBuffer(
        storage=storage_cls(capacity),
        checkpointer=SafetensorsCheckpointer(prefix),
        batch_size=5,
        generator=torch.Generator().manual_seed(seed),
    )


@pytest.mark.parametrize("storage_cls", [FastTensorStorage, LazyTensorStorage, LazyMemmapStorage])
def test_dumps_loads_round_trip(tmp_path, storage_cls):
    rb = make_rb(storage_cls)
    for start in (0, 5, 10):  # 15 items into 8 slots: wrapped
        rb.extend(chunk(start, 5))
    rb.sample()  # advance the generator
    rb.dumps(tmp_path)
    names = sorted(p.name for p in (tmp_path / "storage").iterdir())
    assert names == ["run.v1_metadata.json", "run.v1_state.safetensors"]
    meta = json.loads((tmp_path / "storage" / "run.v1_metadata.json").read_text())
    assert (meta["capacity"], meta["size"], meta["position"]) == (8, 8, 7)
    assert sorted(meta["keys"]) == ["index", "next.done", "next.obs", "obs", "pixels"]

    restored = make_rb(storage_cls, seed=123)  # different generator: loads restores it
    restored.loads(tmp_path)
    assert len(restored) == len(rb) and restored.writer._cursor == rb.writer._cursor == 7
    assert restored.storage._last_cursor_index == rb.storage._last_cursor_index
    everything = torch.arange(8)
    assert (restored.storage.get(everything) == rb.storage.get(everything)).all()
    for _ in range(3):  # same sampler/generator state: same next samples
        assert (restored.sample() == rb.sample()).all()
    # writes continue at the same place
    rb.extend(chunk(100, 3))
    restored.extend(chunk(100, 3))
    assert (restored.storage.get(everything) == rb.storage.get(everything)).all()


def test_storage_checkpointer_attribute_and_reload_into_used_storage(tmp_path):
    storage = FastTensorStorage(4)
    storage.checkpointer = SafetensorsCheckpointer()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(chunk(0, 3))
    storage.dumps(tmp_path)
    rb.extend(chunk(3, 3))
    storage.loads(tmp_path)  # in place, initialised storage
    assert len(storage) == 3 and storage.get(torch.arange(3))["obs"][:, 0].tolist() == [0, 1, 2]


def test_partial_storage_and_empty_errors(tmp_path):
    rb = make_rb(FastTensorStorage)
    with pytest.raises(RuntimeError, match="non-initialized storage: write data"):
        rb.storage.dumps(tmp_path)
    rb.extend(chunk(0, 3))
    rb.storage.dumps(tmp_path)
    wrong_capacity = make_rb(FastTensorStorage, capacity=5)
    fix = r"capacity 8 but the storage has max_size=5; build the storage with max_size=8"
    with pytest.raises(ValueError, match=fix):
        wrong_capacity.storage.loads(tmp_path)
    other = TensorDictReplayBuffer(storage=FastTensorStorage(8),
                                   checkpointer=SafetensorsCheckpointer("run.v1_"))
    other.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    with pytest.raises(ValueError, match="does not fit the initialised storage.*Load into a fresh storage"):
        other.storage.loads(tmp_path)


def test_prefix_with_path_separator_is_rejected():
    for prefix in ("sub/run_", f"..{os.sep}x_", "/abs"):
        with pytest.raises(ValueError, match=r"contains a path separator.*put folders in the path"):
            SafetensorsCheckpointer(prefix)
    with pytest.raises(TypeError, match="prefix must be a str"):
        SafetensorsCheckpointer(3)


def test_missing_files_name_the_file_and_the_prefixes_found(tmp_path):
    rb = make_rb(FastTensorStorage)
    rb.extend(chunk(0, 2))
    rb.storage.dumps(tmp_path)
    loader = SafetensorsCheckpointer("other_")
    hint = r"other_state\.safetensors not found.*found there: \['run\.v1_'\]"
    with pytest.raises(FileNotFoundError, match=hint):
        loader.loads(make_rb(FastTensorStorage).storage, tmp_path)
    (tmp_path / "run.v1_metadata.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"run\.v1_metadata\.json not found"):
        rb.storage.loads(tmp_path)


def test_metadata_and_tensors_that_disagree(tmp_path):
    pair = CheckpointPair(tmp_path, "p_")
    meta = {"format": "torchrl_ext.safetensors_storage", "version": 1, "capacity": 4, "size": 2,
            "position": 2, "device": "cpu", "keys": {"obs": ["obs"]}}
    write_pair(pair, {"obs": torch.zeros(3, 2)}, json.dumps(meta))
    storage = FastTensorStorage(4)
    disagree = r"tensor 'obs' has shape \[3, 2\] but .*p_metadata.json says capacity=4"
    with pytest.raises(ValueError, match=disagree):
        SafetensorsCheckpointer("p_").loads(storage, tmp_path)
    write_pair(pair, {"obs": torch.zeros(4, 2)}, json.dumps({**meta, "size": 1}))
    with pytest.raises(ValueError, match="a ring that is not full has position == size"):
        SafetensorsCheckpointer("p_").loads(storage, tmp_path)
    write_pair(pair, {"obs": torch.zeros(4, 2)}, json.dumps({**meta, "keys": {"x": ["x"]}}))
    with pytest.raises(ValueError, match=r"lists tensors \['x'\] but .* holds \['obs'\]"):
        SafetensorsCheckpointer("p_").loads(storage, tmp_path)


# -- the atomic pair ---------------------------------------------------------------------
def _save_generation(pair: CheckpointPair, gen: int) -> None:
    write_pair(pair, {"x": torch.full((4,), float(gen))}, json.dumps({"gen": gen}))


def _load_generation(pair: CheckpointPair) -> int:
    meta, tensors, verified = read_pair(pair)
    assert verified and torch.equal(tensors["x"], torch.full((4,), float(meta["gen"])))
    return meta["gen"]


def test_crash_between_the_renames_rolls_forward(tmp_path, monkeypatch):
    pair = CheckpointPair(tmp_path, "run.v1_")
    _save_generation(pair, 1)
    real_replace = os.replace

    def replace_state_then_die(src, dst):
        real_replace(src, dst)
        if str(dst).endswith("state.safetensors"):
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(os, "replace", replace_state_then_die)
    with pytest.raises(KeyboardInterrupt):
        _save_generation(pair, 2)
    monkeypatch.setattr(os, "replace", real_replace)
    assert json.loads(pair.metadata.read_text()) == {"gen": 1}  # the old metadata is still there
    assert pair.pending_metadata.exists()
    assert _load_generation(pair) == 2  # rolled forward in memory, files untouched
    assert json.loads(pair.metadata.read_text()) == {"gen": 1}
    # a save killed while writing its temporaries must not lose the pending commit
    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("torchrl_ext.io.checkpoint_pair.save_file", disk_full)
    with pytest.raises(OSError, match="disk full"):
        _save_generation(pair, 3)
    assert _load_generation(pair) == 2 and json.loads(pair.metadata.read_text()) == {"gen": 2}
    assert not pair.pending_metadata.exists() and not pair.pending_state.exists()


def test_crash_before_the_renames_keeps_the_old_pair(tmp_path, monkeypatch):
    pair = CheckpointPair(tmp_path, "")
    _save_generation(pair, 1)
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _save_generation(pair, 2)
    monkeypatch.undo()
    assert pair.pending_state.exists() and _load_generation(pair) == 1
    _save_generation(pair, 3)
    assert _load_generation(pair) == 3 and not pair.pending_state.exists()


def test_a_pair_from_two_saves_is_refused(tmp_path):
    first, second = CheckpointPair(tmp_path / "a", "b_"), CheckpointPair(tmp_path / "b", "b_")
    _save_generation(first, 1)
    _save_generation(second, 2)
    second.metadata.replace(first.metadata)  # metadata of save 2 next to the state of save 1
    refused = r"b_metadata.json does not belong to .*b_state.safetensors.*different saves"
    with pytest.raises(ValueError, match=refused):
        read_pair(first)


def _save_until_killed(rb, folder: str, first_gen: int) -> None:
    torch.set_num_threads(1)
    deadline = time.monotonic() + 10.0  # never outlive the test
    gen = first_gen
    while time.monotonic() < deadline:
        _add_generation(rb, gen)
        rb.save(folder)
        gen += 1


def _add_generation(rb, gen: int) -> None:
    g = float(gen)
    rb.add(torch.full((16,), g), [g], g, torch.full((16,), g + 0.5), gen % 7 == 0, torch.full((16,), g))


def _check_consistent(rb) -> int:
    """The newest generation in a loaded buffer whose every field and count agree with it."""
    size, capacity = len(rb), rb.capacity
    newest = int(rb.storage.get(torch.tensor([(rb.position - 1) % capacity]))["action"].item())
    assert size == min(newest, capacity) and rb.position == newest % capacity
    order = (torch.arange(rb.position - size, rb.position) % capacity)
    data = rb.storage.get(order)
    gens = torch.arange(newest - size + 1, newest + 1, dtype=torch.float32)
    assert torch.equal(data["action"][:, 0], gens)
    assert torch.equal(data["observation"], gens[:, None].expand(size, 16))
    assert torch.equal(data["next", "observation"], gens[:, None].expand(size, 16) + 0.5)
    assert torch.equal(data["next", "hidden"], gens[:, None].expand(size, 16))
    assert torch.equal(data["next", "reward"][:, 0], gens)
    assert torch.equal(data["next", "done"][:, 0], gens.long() % 7 == 0)
    return newest


def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path):
    """24 saving children killed at random moments: the folder loads the old or a newer complete pair."""
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    rb = velora_replay_buffer(3000, state_dim=16, action_dim=1, hidden_dim=16)
    for gen in range(1, 4):
        _add_generation(rb, gen)
    rb.save(tmp_path)
    pair = CheckpointPair(tmp_path, "buffer_")
    last, advanced, interrupted, started = 3, 0, 0, time.monotonic()
    for _ in range(24):
        child = ctx.Process(target=_save_until_killed, args=(rb, str(tmp_path), last + 1), daemon=True)
        child.start()
        time.sleep(rng.uniform(0.0, 0.12))
        child.kill()
        child.join()
        assert child.exitcode == -9
        interrupted += pair.pending_state.exists() or pair.pending_metadata.exists()
        rb = load_velora_replay_buffer(tmp_path)
        newest = _check_consistent(rb)
        assert newest >= last  # the previous checkpoint or a newer one, never older or torn
        advanced += newest > last
        last = newest
    # about half the kills land inside a save (temporaries on disk) on a typical machine
    assert advanced >= 5 and interrupted >= 1, (advanced, interrupted)
    assert time.monotonic() - started < 15
