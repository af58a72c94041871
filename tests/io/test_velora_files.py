"""velora's buffer files: read the ones velora wrote, write ones with velora's exact layout."""
from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from tests._vectors import load_npz, vectors_path
from torchrl_ext.io import VELORA_KEYS, VeloraCheckpointer, read_velora_metadata
from torchrl_ext.presets.velora import load_velora_replay_buffer, velora_replay_buffer

NAMES = ("states", "actions", "rewards", "next_states", "dones", "hiddens")


@pytest.fixture
def semantics():
    return json.loads(vectors_path("velora_buffer_semantics.json").read_text())


@pytest.fixture
def example(tmp_path):
    """A writable copy of the files velora's ``save(dir)`` wrote."""
    folder = tmp_path / "example"
    shutil.copytree(vectors_path("velora_save_example"), folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


def header(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def trace_buffer(states_npz):
    """velora's trace: add(i) for i < 3, then add_multi(ids 3..6) into capacity 5."""
    rb = velora_replay_buffer(5, state_dim=3, action_dim=2, hidden_dim=4)
    done = {int(s[0]): float(d[0]) for s, d in zip(states_npz["states"], states_npz["dones"])}
    for i in range(3):
        rb.add([i] * 3, [i] * 2, i, [i + 0.5] * 3, done.get(i, 0.0), [i] * 4)
    ids = torch.arange(3.0, 7.0)[:, None]
    rb.add_multi(ids.expand(4, 3), ids.expand(4, 2), ids[:, 0], ids.expand(4, 3) + 0.5,
                 torch.tensor([done[i] for i in range(3, 7)]), ids.expand(4, 4))
    return rb


def test_reads_the_files_velora_wrote(semantics):
    rb = load_velora_replay_buffer(vectors_path("velora_save_example"))
    vectors = load_npz("velora_buffer_state.npz")
    assert [rb.position, len(rb)] == semantics["loaded_position_size"]
    assert rb.metadata() == semantics["metadata_json_written"]
    assert rb.config() == semantics["config"]
    stored = rb.storage.get(torch.arange(rb.capacity))
    for name in NAMES:
        value = stored[VELORA_KEYS[name]]
        expected = torch.from_numpy(vectors[name])
        if name == "dones":
            assert value.dtype is torch.bool
            value = value.float()
        assert torch.equal(value, expected), name


def test_reads_into_a_plain_torchrl_storage():
    storage = LazyTensorStorage(5)
    VeloraCheckpointer().loads(storage, vectors_path("velora_save_example"))
    assert len(storage) == 5 and storage._last_cursor_index == 1
    assert storage._storage["next", "done"].dtype is torch.bool
    assert storage._storage["next", "hidden"].shape == (5, 4)


def test_writes_velora_layout_exactly(tmp_path, semantics):
    rb = trace_buffer(load_npz("velora_buffer_state.npz"))
    rb.save(tmp_path)
    example = vectors_path("velora_save_example")
    assert sorted(p.name for p in tmp_path.iterdir()) == semantics["files"]
    written = (tmp_path / "buffer_metadata.json").read_text()
    assert written == semantics["metadata_json_raw_text"] == (example / "buffer_metadata.json").read_text()
    assert list(json.loads(written)) == list(semantics["metadata_json_written"])
    ours, our_data = header(tmp_path / "buffer_state.safetensors")
    theirs, their_data = header(example / "buffer_state.safetensors")
    # checksums of the metadata text and of the tensors, ignored by velora
    assert set(ours.pop("__metadata__")) == {"torchrl_ext.metadata_sha256", "torchrl_ext.tensors_sha256"}
    assert ours == theirs == semantics["safetensors_header"]  # names, dtypes, shapes, offsets
    assert our_data == their_data
    # velora's own reader (safetensors' load_file) sees the six tensors and nothing else
    assert sorted(load_file(tmp_path / "buffer_state.safetensors")) == sorted(NAMES)


def test_same_draws_as_velora_for_the_same_seed(semantics):
    rb = load_velora_replay_buffer(vectors_path("velora_save_example"))
    torch.manual_seed(42)
    batch = rb.sample(5)
    assert batch["index"].tolist() == semantics["sample_idx_torch_seed42"]
    assert batch["observation"][:, 0].tolist() == semantics["sample_states_first_col"]


def test_prefix_with_dots_keeps_full_names(tmp_path):
    rb = trace_buffer(load_npz("velora_buffer_state.npz"))
    rb.save(tmp_path, prefix="run.v1_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.v1_metadata.json", "run.v1_state.safetensors"]
    assert read_velora_metadata(tmp_path, "run.v1_")["position"] == 2
    loaded = load_velora_replay_buffer(tmp_path, prefix="run.v1_")
    everything = torch.arange(5)
    assert (loaded.storage.get(everything) == rb.storage.get(everything)).all()
    with pytest.raises(ValueError, match=r"prefix='run/v1_' contains a path separator"):
        rb.save(tmp_path, prefix="run/v1_")
    with pytest.raises(ValueError, match="contains a path separator"):
        load_velora_replay_buffer(tmp_path, prefix="../run.v1_")


def test_null_device_and_custom_keys(example, tmp_path):
    meta = json.loads((example / "buffer_metadata.json").read_text())
    (example / "buffer_metadata.json").write_text(json.dumps({**meta, "device": None}, indent=2))
    keys = {**VELORA_KEYS, "hiddens": "hidden", "states": "obs"}
    rb = load_velora_replay_buffer(example, keys=keys)
    assert rb.storage._storage["hidden"].shape == (5, 4) and "obs" in rb.storage._storage.keys()
    rb.save(tmp_path)
    assert sorted(load_file(tmp_path / "buffer_state.safetensors")) == sorted(NAMES)


# -- bad files -----------------------------------------------------------------------------
def edit_metadata(folder, **changes):
    path = folder / "buffer_metadata.json"
    meta = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in meta.items() if v != "DROP"}, indent=2))


def test_metadata_and_tensor_shapes_that_disagree(example):
    edit_metadata(example, state_dim=4)
    with pytest.raises(ValueError, match=r"tensor 'states' has shape \[5, 3\] but .*buffer_metadata.json "
                                         r"says capacity=5, state_dim=4 .*restore both from the same save"):
        load_velora_replay_buffer(example)
    edit_metadata(example, state_dim=3, capacity=6, position=2, size=6)
    disagree = r"tensor 'states' has shape \[5, 3\] but .*capacity=6, state_dim=3 \(expected \[6, 3\]\)"
    with pytest.raises(ValueError, match=disagree):
        load_velora_replay_buffer(example)


def test_metadata_fields_missing_or_invalid(example):
    edit_metadata(example, hidden_dim="DROP")
    with pytest.raises(ValueError, match=r"lacks velora's fields \['hidden_dim'\]"):
        read_velora_metadata(example)
    edit_metadata(example, hidden_dim=0)
    with pytest.raises(ValueError, match=r"'hidden_dim' must be a positive int, got 0"):
        load_velora_replay_buffer(example)
    edit_metadata(example, hidden_dim=4, position=7)
    with pytest.raises(ValueError, match=r"0 <= position < capacity, got capacity=5, size=5, position=7"):
        load_velora_replay_buffer(example)
    (example / "buffer_metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"buffer_metadata.json is not valid JSON"):
        read_velora_metadata(example)


def test_tensor_names_that_are_not_velora(example):
    tensors = load_file(example / "buffer_state.safetensors")
    tensors["state"] = tensors.pop("states")
    save_file(tensors, example / "buffer_state.safetensors")
    with pytest.raises(ValueError, match=r"holds tensors \[.*'state'.*\]; velora files hold"):
        load_velora_replay_buffer(example)


def test_missing_files(example, tmp_path):
    hint = r"old_state.safetensors not found.*found there: \['buffer_'\]"
    with pytest.raises(FileNotFoundError, match=hint):
        load_velora_replay_buffer(example, prefix="old_")
    (example / "buffer_metadata.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"buffer_metadata.json not found \(prefix='buffer_'\)"):
        load_velora_replay_buffer(example)
    with pytest.raises(FileNotFoundError, match="buffer_state.safetensors not found"):
        velora_replay_buffer(5, 3, 2, 4).load(tmp_path / "nowhere")


def test_loading_into_a_buffer_of_other_dims(tmp_path):
    rb = velora_replay_buffer(10, 3, 2, 4)
    with pytest.raises(ValueError, match=r"describes \{'capacity': 5, .*this buffer has \{'capacity': 10.*"
                                         r"velora_replay_buffer\(5, 3, 2, 4\)"):
        rb.load(vectors_path("velora_save_example"))


def test_storage_that_velora_files_cannot_hold(tmp_path):
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), TensorDict({"obs": torch.zeros(2, 3)}, [2]))
    with pytest.raises(ValueError, match=r"velora files hold exactly the keys .*has \['obs'\]"):
        VeloraCheckpointer().dumps(storage, tmp_path)
    rb = velora_replay_buffer(4, 3, 2, 4)
    rb.storage._storage.set("extra", torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"also has \['extra'\] and lacks \[\]"):
        rb.save(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_vectors_agree_with_the_example_files():
    tensors = load_file(vectors_path("velora_save_example") / "buffer_state.safetensors")
    for name, array in load_npz("velora_buffer_state.npz").items():
        np.testing.assert_array_equal(tensors[name].numpy(), array)
