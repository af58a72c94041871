"""Every buffer given a ``torch.Generator`` (``set_rng``, as TorchRL's ``generator=`` does) draws
from it alone: reseeding torch's global generator between rounds changes nothing it samples."""
from __future__ import annotations

import copy

import pytest
import torch

from tests._buffer_runs import ROUNDS, RUNS, assert_same


def _play(case: str, reseed: bool) -> list:
    run = RUNS[case]()
    run.buffer.set_rng(torch.Generator().manual_seed(3))
    got = []
    for k in range(ROUNDS):
        torch.manual_seed(100 + k if reseed else 0)
        got.append(run.run(k))
    return got


@pytest.mark.parametrize("case", RUNS)
def test_a_buffer_with_a_generator_ignores_the_global_one(case: str) -> None:
    assert_same(_play(case, reseed=True), _play(case, reseed=False))


@pytest.mark.parametrize("case", RUNS)
def test_a_deep_copy_draws_what_the_original_would_have_drawn(case: str) -> None:
    want = _play(case, reseed=False)
    run = RUNS[case]()
    run.buffer.set_rng(torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    got = [run.run(k) for k in range(ROUNDS // 2)]
    original = run.buffer
    run.buffer = copy.deepcopy(original)  # the copy's generator continues from the same state
    for k in range(ROUNDS // 2, ROUNDS):
        torch.manual_seed(0)
        got.append(run.run(k))
    assert_same(got, want)


# TorchRL warns when a memory-mapped storage's state is loaded before its first write.
@pytest.mark.filterwarnings("ignore:Loading the storage on an uninitialized TensorDict")
@pytest.mark.parametrize("how", ["dumps", "state_dict"])
@pytest.mark.parametrize("case", RUNS)
def test_a_loaded_buffer_draws_on_from_the_saved_generator(case: str, how: str, tmp_path) -> None:
    # As TorchRL's buffers do: the generator's state is saved with the buffer and restored.
    want = _play(case, reseed=False)
    run = RUNS[case]()
    run.buffer.set_rng(torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    got = [run.run(k) for k in range(ROUNDS // 2)]
    fresh = RUNS[case]().buffer  # no generator of its own: the loaded one must be used
    if how == "dumps":
        run.buffer.dumps(tmp_path / "buffer")
        fresh.loads(tmp_path / "buffer")
    else:
        fresh.load_state_dict(run.buffer.state_dict())
    run.buffer = fresh
    for k in range(ROUNDS // 2, ROUNDS):
        torch.manual_seed(100 + k)
        got.append(run.run(k))
    assert_same(got, want)
