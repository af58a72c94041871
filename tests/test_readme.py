"""The README's quickstart runs as written and does what its comments say."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text()
    section = text[text.index("## Quickstart"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quickstart_runs_and_its_n_step_rewards_are_right() -> None:
    code = quickstart_code()
    assert len(code.strip().splitlines()) <= 20
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README quickstart", "exec"), namespace)
    batch = namespace["batch"]
    steps = batch["steps_to_next_obs"].flatten()
    assert set(steps.tolist()) <= {1, 2, 3}
    assert out.getvalue().strip().splitlines()[-1].startswith("[")
    # Rewards are all 1: a chain of m steps sums 1 + 0.99 + ... + 0.99 ** (m - 1).
    expected = (1 - 0.99 ** steps.double()) / (1 - 0.99)
    assert (batch["next", "reward"].flatten().double() - expected).abs().max() < 1e-5
    # A chain shorter than 3 ends at a done, or at the newest of the 100 stored steps.
    time = batch["index"][:, 0]  # (time, env) of the start
    end = time + steps - 1
    short = steps < 3
    ends_at_done = batch["next", "done"].flatten()
    assert bool((ends_at_done | (end == 99))[short].all())
    assert not bool(ends_at_done[~short][end[~short] < time[~short] + 2].any())
