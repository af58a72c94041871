"""torchrl_ext._keys: nested keys as constructors receive them, and leaf lookups."""
from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from torchrl_ext._keys import has_leaf, nested_key, next_key


def _step() -> TensorDict:
    return TensorDict({"obs": torch.zeros(3, 2), "next": {"reward": torch.zeros(3, 1),
                                                          "deeper": {"done": torch.zeros(3, 1)}}}, [3])


@pytest.mark.parametrize("lazy", [False, True], ids=["dense", "lazy-stack"])
def test_has_leaf_finds_nested_leaves_in_dense_and_lazy_stacks(lazy: bool) -> None:
    # Was: `key in td.keys(True, True)` misses a lazy stack's nested leaves (tensordict 0.14).
    td = LazyStackedTensorDict.lazy_stack(list(_step().unbind(0))) if lazy else _step()
    for key in ("obs", ("obs",), ("next", "reward"), ("next", "deeper", "done")):
        assert has_leaf(td, key), key
    for key in ("next", ("next", "deeper"), ("next", "obs"), "missing"):  # sub-TensorDicts are not leaves
        assert not has_leaf(td, key), key


def test_nested_key_takes_lists_from_configs_and_refuses_the_rest() -> None:
    assert nested_key(["next", "reward"], "reward_key") == ("next", "reward")
    assert nested_key(["reward"], "reward_key") == "reward"
    with pytest.raises(TypeError, match=r"reward_key must be a key: .* got reward_key=3"):
        nested_key(3, "reward_key")
    assert next_key("obs") == ("next", "obs") and next_key(("a", "b")) == ("next", "a", "b")
