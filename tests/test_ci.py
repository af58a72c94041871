"""The suite and CI end in bounded time: a hang fails by name instead of eating CI's 90 minutes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI_LIMIT_MINUTES = 90  # what CI gives one `bash .ci/run`


def test_a_hanging_test_is_stopped_with_every_threads_stack(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    # The soak machines, the slowest tests, take well under a minute on CI's machine.
    assert float(request.config.getini("timeout")) == 600
    # The signal method cannot interrupt a hang inside C code (a lock in torch); the thread one can.
    assert request.config.getini("timeout_method") == "thread"


def test_each_ci_stage_has_a_limit_and_all_fit_in_cis_time() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    stages = re.findall(r"^stage (\d+) ([\w-]+)$", script, flags=re.MULTILINE)
    assert [target for _, target in stages] == [
        "test", "test-plain", "test-soak", "bench-quick", "bench-train-quick", "docs", "test-nightly",
    ]
    assert not re.search(r"^make ", script, flags=re.MULTILINE), "a stage runs without a limit"
    # The clone and the stage messages need a little time of their own.
    assert sum(int(minutes) for minutes, _ in stages) <= CI_LIMIT_MINUTES - 5
    makefile = (ROOT / "Makefile").read_text()
    for _, target in stages:
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.MULTILINE), target
