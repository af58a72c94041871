"""Every buffer emptied mid-run (``rb.empty()``) goes on exactly as a new buffer fed the same data:
nothing it held before (rows, priorities, chains, episode indices, cached views) leaks through."""
from __future__ import annotations

import pytest
import torch

from tests._buffer_runs import ROUNDS, RUNS, assert_same

# Left out: the on-policy buffers, which start over with after_update(), not empty(); and the
# frame-deduplicating rings, which (new or emptied) take an env's steps from an episode's first
# step only, where this stream goes on mid-episode.
CASES = [case for case in RUNS if not case.startswith(("on-policy", "path-gae", "dedup"))]


@pytest.mark.parametrize("case", CASES)
def test_an_emptied_buffer_goes_on_as_a_new_one(case: str) -> None:
    emptied, fresh = RUNS[case](), RUNS[case]()
    for run in (emptied, fresh):  # the same data through both streams, into one buffer each
        torch.manual_seed(0)
        for k in range(ROUNDS // 2):
            run.run(k)
    emptied.buffer.empty()
    fresh.buffer = RUNS[case]().buffer
    halfway = torch.get_rng_state()
    got = [emptied.run(k) for k in range(ROUNDS // 2, ROUNDS)]
    torch.set_rng_state(halfway)
    want = [fresh.run(k) for k in range(ROUNDS // 2, ROUNDS)]
    assert_same(got, want)
