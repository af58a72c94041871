"""save_state names tensors by their path joined with dots; two paths that join alike are refused."""
from __future__ import annotations

import pytest
import torch

from tests.test_errors import assert_same, freeze
from torchrl_ext.io import load_state, save_state

FILES = {"tensors_file": "t.safetensors", "metadata_file": "m.json"}


@pytest.mark.parametrize("state", [
    {"a.b": [torch.tensor([1.0])], "a": {"b": [torch.tensor([2.0])]}},
    {"a": {"b": [torch.tensor([2.0])]}, "a.b": [torch.tensor([1.0]), torch.tensor([3.0])]},
    {"x": {"1": [torch.zeros(1)]}, "y": 5, "x.1": [torch.ones(1)]},
    {"x": {"1.0": [torch.zeros(1)], "1": {"0": [torch.ones(1)]}}},
])
def test_paths_sharing_a_tensor_name_are_refused_before_writing(tmp_path, state):
    save_state(tmp_path, {"kept": [torch.arange(3)]}, **FILES)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=r"both map to the tensor name '.*'; rename the keys"):
        save_state(tmp_path, state, **FILES)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_dotted_keys_whose_names_differ_round_trip(tmp_path):
    state = {"a.b": [torch.tensor([1.0])], "a": {"c": [torch.tensor([2.0])], "b": 4},
             "x": [torch.zeros(1), torch.ones(1)], "x.1": {"0.5": [torch.full((2,), 7.0)]}}
    save_state(tmp_path, state, **FILES)
    assert_same(freeze(state), freeze(load_state(tmp_path, **FILES)))
