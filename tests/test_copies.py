"""Every buffer copied (``copy.deepcopy``, a pickle round trip) mid-run goes on exactly as the
original does, and the original goes on as if never copied: neither shares state with the other."""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import pytest
import torch

from tests._buffer_runs import ROUNDS, RUNS, assert_same

COPIES: dict[str, Callable[[Any], Any]] = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda buffer: pickle.loads(pickle.dumps(buffer)),
}


# Memory-mapped storages are left out of pickling: TorchRL's LazyMemmapStorage, which
# FastMemmapStorage extends, cannot be pickled ("cannot pickle 'mmap.mmap' object").
CASES = [(case, how) for case in RUNS for how in COPIES if not (how == "pickle" and "memmap" in case)]


@pytest.mark.parametrize("case, how", CASES)
def test_a_copied_buffer_and_its_original_go_on_as_one_never_copied(case: str, how: str) -> None:
    torch.manual_seed(0)
    reference = RUNS[case]()
    want = [reference.run(k) for k in range(ROUNDS)]

    original, twin = RUNS[case](), RUNS[case]()  # twin: the same data stream, for the copy
    for run in (original, twin):
        torch.manual_seed(0)
        first = [run.run(k) for k in range(ROUNDS // 2)]
    assert_same(first, want[: ROUNDS // 2])
    halfway = torch.get_rng_state()
    twin.buffer = COPIES[how](original.buffer)
    assert torch.equal(torch.get_rng_state(), halfway)  # copying draws no random numbers
    # The original first: were anything shared, its writes would reach the copy before it runs.
    assert_same([original.run(k) for k in range(ROUNDS // 2, ROUNDS)], want[ROUNDS // 2:])
    torch.set_rng_state(halfway)
    assert_same([twin.run(k) for k in range(ROUNDS // 2, ROUNDS)], want[ROUNDS // 2:])


@pytest.mark.parametrize("case", RUNS)
def test_a_buffer_saved_and_loaded_from_files_goes_on_as_the_original(case: str, tmp_path) -> None:
    torch.manual_seed(0)
    reference = RUNS[case]()
    want = [reference.run(k) for k in range(ROUNDS)]

    torch.manual_seed(0)
    run = RUNS[case]()
    got = [run.run(k) for k in range(ROUNDS // 2)]
    run.buffer.dumps(tmp_path / "buffer")
    run.buffer = RUNS[case]().buffer
    run.buffer.loads(tmp_path / "buffer")
    got += [run.run(k) for k in range(ROUNDS // 2, ROUNDS)]
    assert_same(got, want)
