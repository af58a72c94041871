# The two commands of the README, each doing all set-up on a fresh machine:
#   make demo   create the venv, install torchrl_ext with the examples extra, train PPO on CartPole
#   make test   create the venv, install the test extras, run the whole test suite
# `make test-nightly` runs the same suite against torchrl-nightly + tensordict-nightly,
# `make test-plain` runs it with every fast path off (TORCHRL_EXT_FASTPATH=0), and
# `make test-soak` reruns the model-based hypothesis machines with SOAK examples each, and
# `make docs` builds the documentation with warnings as errors (all called by .ci/run).
# Override the venv locations with VENV=... / NIGHTLY_VENV=...

PYTHON ?= python3
VENV ?= .venv
NIGHTLY_VENV ?= .venv-nightly
PYTEST_ARGS ?=
DEMO_ARGS ?=
# pytest-xdist workers: one per core, at most 4 (each worker imports torch and, for some
# tests, starts Ray). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))" 2>/dev/null || echo 2)
# Examples per model-based machine in `make test-soak` (the suite itself runs 25).
SOAK ?= 200
PYTEST := -m pytest -n $(PYTEST_WORKERS) --durations=15

# torch is pinned here as well so pip never resolves a CUDA build of another release.
TORCH_SPEC := torch>=2.14,<2.15

.PHONY: demo test test-plain test-soak test-nightly bench bench-quick bench-train bench-train-quick docs clean

$(VENV)/.installed-%: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install "$(TORCH_SPEC)"
	$(VENV)/bin/python -m pip install -e ".[$(subst +,$(comma),$*)]"
	touch $@

comma := ,

demo: $(VENV)/.installed-examples
	$(VENV)/bin/python examples/ppo_cartpole/train.py $(DEMO_ARGS)

test: $(VENV)/.installed-test+examples+ray
	$(VENV)/bin/python $(PYTEST) $(PYTEST_ARGS)

# The same suite with every fast path off (torchrl_ext.fastpath): results must not change.
test-plain: $(VENV)/.installed-test+examples+ray
	TORCHRL_EXT_FASTPATH=0 $(VENV)/bin/python $(PYTEST) $(PYTEST_ARGS)

test-soak: $(VENV)/.installed-test+examples+ray
	TORCHRL_EXT_SOAK=$(SOAK) $(VENV)/bin/python $(PYTEST) -m soak $(PYTEST_ARGS)

$(NIGHTLY_VENV)/.installed: pyproject.toml .ci/requirements.py
	$(PYTHON) -m venv $(NIGHTLY_VENV)
	$(NIGHTLY_VENV)/bin/python -m pip install "$(TORCH_SPEC)" torchrl-nightly tensordict-nightly
	$(NIGHTLY_VENV)/bin/python -m pip install --no-deps -e .
	$(PYTHON) .ci/requirements.py --without torch torchrl tensordict --extras test examples ray > $(NIGHTLY_VENV)/requirements.txt
	$(NIGHTLY_VENV)/bin/python -m pip install -r $(NIGHTLY_VENV)/requirements.txt
	touch $@

test-nightly: $(NIGHTLY_VENV)/.installed
	TORCHRL_EXT_NIGHTLY=1 $(NIGHTLY_VENV)/bin/python $(PYTEST) $(PYTEST_ARGS)

# `make bench` runs the whole benchmark suite (benchmarks/suite.py: every script, then
# benchmarks/RESULTS.md and the plots in docs/img/); `make bench-quick` is CI's regression check
# (< 3 min; ratios against benchmarks/baseline_quick.json). BENCH_ARGS are passed to suite.py.
# The bench extra brings the peers (cpprb, stable-baselines3) the scripts compare against.
# bench_storage.py needs about 18 GB of free RAM, bench_dedup.py about 12 GB (full run only).
# bench_onpolicy.py's peer, pytorchrl, is installed with --no-deps: its requirements pull ray[default]
# and about 50 more packages that its on-policy storages never import (they need gym 0.26.2 only).
# `pip check` then lists pytorchrl's missing ray/pandas/scipy/lz4; torch keeps its pinned release.
$(VENV)/.installed-peers: $(VENV)/.installed-test+examples+bench
	$(VENV)/bin/python -m pip install gym==0.26.2
	$(VENV)/bin/python -m pip install --no-deps pytorchrl==3.2.15
	touch $@

bench: $(VENV)/.installed-peers
	$(VENV)/bin/python benchmarks/suite.py $(BENCH_ARGS)

bench-quick: $(VENV)/.installed-peers
	$(VENV)/bin/python benchmarks/suite.py --quick $(BENCH_ARGS)

# Training loops, stock TorchRL against torchrl_ext (benchmarks/training/run.py): `make bench-train`
# runs every case with 3 seeds per variant (about 15 min) and rewrites the training tables of
# README.md and benchmarks/RESULTS.md; `make bench-train-quick` (CI) runs each case for a few
# iterations and checks that both variants run and agree. TRAIN_ARGS are passed to run.py.
bench-train: $(VENV)/.installed-examples
	$(VENV)/bin/python benchmarks/training/run.py --write-docs $(TRAIN_ARGS)

bench-train-quick: $(VENV)/.installed-examples
	$(VENV)/bin/python benchmarks/training/run.py --quick $(TRAIN_ARGS)

# The documentation (docs/conf.py): API reference and guides, warnings are errors (CI builds it).
docs: $(VENV)/.installed-docs
	$(VENV)/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs built: docs/_build/html/index.html"

clean:
	rm -rf $(VENV) $(NIGHTLY_VENV) outputs .pytest_cache docs/_build
