"""Every byte of every checkpoint file is checked before a load changes anything in memory.

Each test damages one file of a saved checkpoint (one flipped bit, a truncation, a file
removed or added, a file of another save), loads it into a buffer that already holds other
data, and checks that the load raises a ``ValueError`` naming the file and that the buffer
(length, stored rows, writer cursor, sampler state) is exactly as before.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from tests.test_errors import assert_same, flip_bit, freeze
from torchrl_ext.io import SafetensorsCheckpointer, load_state, save_state
from torchrl_ext.io.atomic_dir import COMPLETE_MARKER
from torchrl_ext.presets import alf_replay_buffer
from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
from torchrl_ext.samplers import PrioritizedSampler
from torchrl_ext.storages import FastTensorStorage


def rows(start: int, n: int) -> TensorDict:
    obs = torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1).expand(n, 3).clone()
    return TensorDict({"obs": obs, "next": {"obs": obs + 1}}, [n])


def prioritized(start: int) -> PrioritizedReplayBuffer:
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(16), batch_size=4)
    rb.extend(rows(start, 6))
    rb.update_priority(torch.arange(6), torch.arange(1.0, 7.0) + start)
    return rb


def snapshot(rb) -> dict:
    return freeze({"len": len(rb), "rows": rb.storage.get(torch.arange(len(rb))) if len(rb) else None,
                   "writer": rb.writer.state_dict(), "sampler": rb.sampler.state_dict()})


def saved_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != COMPLETE_MARKER)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt") / "buffer"
    prioritized(100).dumps(folder)
    return folder


def _checkpoint_files() -> list[str]:
    folder = Path(tempfile.mkdtemp()) / "buffer"
    prioritized(100).dumps(folder)
    files = saved_files(folder)
    shutil.rmtree(folder.parent)
    return files


CHECKPOINT_FILES = _checkpoint_files()


def test_the_manifest_lists_every_file(saved):
    manifest = json.loads((saved / COMPLETE_MARKER).read_text())["files"]
    assert sorted(manifest) == saved_files(saved) == CHECKPOINT_FILES
    assert len(CHECKPOINT_FILES) >= 5  # storage, sampler, writer, metadata, extra state


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_one_flipped_bit_in_any_file_is_refused_and_changes_nothing(saved, tmp_path, name, where):
    # Was: only metadata text was checksummed; a flipped bit in tensor bytes loaded silently.
    folder = tmp_path / "buffer"
    shutil.copytree(saved, folder)
    path = folder / name
    size = path.stat().st_size
    flip_bit(path, {"start": 0, "middle": size // 2, "end": size - 1}[where])
    rb = prioritized(0)
    before = snapshot(rb)
    with pytest.raises(ValueError, match=f"{path}.*damaged"):
        rb.loads(folder)
    assert_same(before, snapshot(rb))


@pytest.mark.parametrize("damage", ["missing", "added", "truncated", "manifest"])
def test_missing_added_truncated_files_and_a_damaged_manifest_are_refused(saved, tmp_path, damage):
    folder = tmp_path / "buffer"
    shutil.copytree(saved, folder)
    target = folder / CHECKPOINT_FILES[0]
    if damage == "missing":
        target.unlink()
        match = f"{target} is missing from the checkpoint"
    elif damage == "added":
        target = folder / "notes.txt"
        target.write_text("hello")
        match = f"{target} is not part of the checkpoint"
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:-3])
        match = f"{target} has .* bytes, its manifest records"
    else:
        target = folder / COMPLETE_MARKER
        target.write_text("{not json")
        match = "manifest\\) is damaged"
    rb = prioritized(0)
    before = snapshot(rb)
    with pytest.raises(ValueError, match=match):
        rb.loads(folder)
    assert_same(before, snapshot(rb))
    rb.loads(saved)  # the intact checkpoint still loads
    assert rb.storage.get(torch.arange(6))["obs"][:, 0].tolist() == [100.0 + i for i in range(6)]


def test_a_damaged_writer_file_of_a_checkpoint_without_manifest_changes_nothing(tmp_path):
    # Was: TorchRL's loads replaced the storage, then failed on the writer file, leaving
    # the old cursor and sampler with the new rows (a later extend overwrote checkpoint rows).
    source = TorchRLTensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    source.extend(rows(100, 6))
    source.dumps(tmp_path / "buffer")  # TorchRL's own dumps: no manifest
    for path in (tmp_path / "buffer" / "writer").rglob("*.json"):
        path.write_text("{ damaged")
    rb = prioritized(0)
    before = snapshot(rb)
    with pytest.raises(ValueError, match="writer cannot be loaded into this buffer's"):
        rb.loads(tmp_path / "buffer")
    assert_same(before, snapshot(rb))


def test_a_sampler_checkpoint_of_another_capacity_changes_nothing(tmp_path):
    big = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(32), batch_size=4)
    big.extend(rows(100, 6))
    big.dumps(tmp_path / "buffer")
    rb = prioritized(0)
    before = snapshot(rb)
    with pytest.raises(ValueError, match="sampler cannot be loaded.*holds 32 priorities but this sampler has "
                                         "max_capacity=16"):
        rb.loads(tmp_path / "buffer")
    assert_same(before, snapshot(rb))


@pytest.mark.parametrize("which", ["tensors", "metadata"])
def test_component_state_files_are_checksummed(tmp_path, which):
    sampler = PrioritizedSampler(8, 0.6, 0.4)
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    sampler.dumps(tmp_path)
    name = "trees.safetensors" if which == "tensors" else "sampler_metadata.json"
    path = tmp_path / name
    flip_bit(path, path.stat().st_size - 2)
    other = PrioritizedSampler(8, 0.6, 0.4)
    other.update_priority(torch.arange(2), torch.tensor([5.0, 6.0]))
    before = freeze(other.state_dict())
    with pytest.raises(ValueError, match=f"{path}"):
        other.loads(tmp_path)
    assert_same(before, freeze(other.state_dict()))


def test_a_state_a_component_refuses_leaves_it_unchanged(tmp_path):
    # The files are intact, but of a sampler built differently: load_component restores it.
    PrioritizedSampler(8, 0.6, 0.4, weights="alf").dumps(tmp_path)
    sampler = PrioritizedSampler(8, 0.6, 0.4)
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 3.0]))
    before = freeze(sampler.state_dict())
    with pytest.raises(ValueError, match="sampler_metadata.json .* cannot load: state_dict was saved with "
                                         "weights='alf'"):
        sampler.loads(tmp_path)
    assert_same(before, freeze(sampler.state_dict()))


def test_load_state_names_the_damaged_file(tmp_path):
    save_state(tmp_path, {"step": 3, "levels": [torch.arange(4.0)]},
               tensors_file="t.safetensors", metadata_file="m.json")
    (tmp_path / "m.json").write_text('{"step": 4, "levels": {"__tensor_list__": "levels.", "length": 1}}')
    with pytest.raises(ValueError, match=f"{tmp_path / 'm.json'} does not match the checksum"):
        load_state(tmp_path, tensors_file="t.safetensors", metadata_file="m.json")
    (tmp_path / "t.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match=f"{tmp_path / 't.safetensors'} is not a readable safetensors file"):
        load_state(tmp_path, tensors_file="t.safetensors", metadata_file="m.json")


def test_the_safetensors_checkpointer_checks_the_tensor_bytes(tmp_path):
    rb = TorchRLTensorDictReplayBuffer(storage=FastTensorStorage(8), checkpointer=SafetensorsCheckpointer("p_"))
    rb.extend(rows(0, 5))
    rb.storage.dumps(tmp_path)
    path = tmp_path / "p_state.safetensors"
    flip_bit(path, path.stat().st_size - 1)
    other = TorchRLTensorDictReplayBuffer(storage=FastTensorStorage(8), checkpointer=SafetensorsCheckpointer("p_"))
    other.extend(rows(50, 3))
    with pytest.raises(ValueError, match=f"{path}: the tensors do not match the checksum"):
        other.storage.loads(tmp_path)
    assert other.storage.get(torch.arange(3))["obs"][:, 0].tolist() == [50.0, 51.0, 52.0]


def test_the_ring_checkpoint_checks_every_byte(tmp_path):
    rb = alf_replay_buffer(2, 4)
    for t in range(3):
        rb.extend(TensorDict({"x": torch.tensor([1.0, 2.0]) * t}, [2]))
    rb.dumps(tmp_path / "ring")
    files = saved_files(tmp_path / "ring")
    ring_file = next(name for name in files if name.endswith("ring_storage.safetensors"))
    flip_bit(tmp_path / "ring" / ring_file, -1)
    other = alf_replay_buffer(2, 4)
    other.extend(TensorDict({"x": torch.tensor([7.0, 8.0])}, [2]))
    with pytest.raises(ValueError, match="ring_storage.safetensors.*damaged"):
        other.loads(tmp_path / "ring")
    assert len(other) == 2 and other.storage.read(torch.tensor([0, 1]), torch.tensor([0, 0]))["x"].tolist() == [7.0, 8.0]


@pytest.mark.parametrize("text", ["{ damaged", '{"unexpected": 1}', "[1, 2]"])
def test_a_damaged_ring_writer_file_names_the_file_and_changes_nothing(tmp_path, text):
    # Was: a raw JSONDecodeError / KeyError / TypeError that named neither the file nor the fault.
    rb = alf_replay_buffer(2, 4)
    rb.extend(TensorDict({"x": torch.tensor([1.0, 2.0])}, [2]))
    rb.writer.dumps(tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text(text)
    before = freeze(rb.writer.state_dict())
    with pytest.raises(ValueError, match=f"{path} (is not valid JSON|holds a state that this EnvRingWriter cannot load)"):
        rb.writer.loads(tmp_path)
    assert_same(before, freeze(rb.writer.state_dict()))
