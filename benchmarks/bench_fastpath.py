"""What each fast path buys on the README's buffer cases: every fast path on, all off, and each one off.

Usage::

    python benchmarks/bench_fastpath.py            # full sizes (about 3 min; ~3 GB peak RSS)
    python benchmarks/bench_fastpath.py --quick    # smaller storages, 3 short repetitions
    python benchmarks/bench_fastpath.py --json benchmarks/results/bench_fastpath.json

A fast path is an optimisation that is not plain torch/numpy (:mod:`torchrl_ext._fastpath`).
The project keeps one only if it buys at least 1.25x on a case a user sees; this script is
where that is measured. Each case is the README's (same shapes as ``bench_storage.py``,
``bench_ring.py`` and ``bench_dedup.py``, smaller storages under ``--quick``) and runs, in one
process and interleaved round-robin (see ``_harness.py``), with

* every fast path on (the default),
* every fast path off (``torchrl_ext.set_fastpath(False)``: plain torch/numpy and TorchRL's layers),
* each fast path off alone, the others on (its module's switch patched for the call).

The table gives time per call and "buys" = (time with that path off) / (time with all on).
The buffers are shared by the variants, so every variant reads and writes the same memory;
a check confirms the variants sample the same rows.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import statistics
import sys
from typing import Any, Callable, Iterator

import torch
from tensordict import TensorDict

from _harness import (Check, Impl, apply_quick, bg_note, environment_line, loadavg, make_parser, quiet_before_case,
                      run_interleaved, selected, utc_now, write_results, BgLoad)
import torchrl_ext
from torchrl_ext.replay_buffers import EnvRingReplayBuffer, TensorDictReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage, FastTensorStorage

#: Each fast path, by the modules whose ``fastpath_enabled`` gates it.
FAST_PATHS = {
    "one-layer extend": ("torchrl_ext.replay_buffers._lean_extend",),
    "one-layer sample": ("torchrl_ext.replay_buffers.tensordict",),
    "ring step write": ("torchrl_ext.storages.ring",),
    "ring buffer write": ("torchrl_ext.replay_buffers.env_ring",),
}


@contextlib.contextmanager
def paths_off(module_names: tuple[str, ...]) -> Iterator[None]:
    modules = [importlib.import_module(name) for name in module_names]
    saved = [module.fastpath_enabled for module in modules]
    for module in modules:
        module.fastpath_enabled = lambda: False
    try:
        yield
    finally:
        for module, switch in zip(modules, saved):
            module.fastpath_enabled = switch


def variants(fn: Callable[[], Any]) -> list[Impl]:
    """``fn`` with every fast path on, all off, and each off alone."""
    def all_off() -> None:
        with torchrl_ext.fastpath(False):
            fn()

    impls = [Impl("all on", "all on", fn), Impl("all off", "all off", all_off)]
    for name, modules in FAST_PATHS.items():
        def call(modules: tuple[str, ...] = modules) -> None:
            with paths_off(modules):
                fn()
        impls.append(Impl(name, f"{name} off", call))
    return impls


def pixel_batch(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, generator=g)
    return TensorDict({"obs": obs, "action": torch.randint(0, 6, (n,), generator=g),
                       "reward": torch.rand(n, generator=g),
                       "next": {"obs": torch.roll(obs, 1, 0), "done": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def vector_batch(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 17, generator=g)
    return TensorDict({"obs": obs, "action": torch.randn(n, 6, generator=g), "reward": torch.rand(n, generator=g),
                       "next": {"obs": obs + 1, "done": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def flat_cases(capacity: int, make: Callable[[int, int], TensorDict], prefix: str) -> dict[str, Callable[[], Any]]:
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(capacity), batch_size=256)
    for start in range(0, capacity, 1000):
        rb.extend(make(1000, start))
    batch = make(1000, -1)
    cases = {f"{prefix}_insert": lambda: rb.extend(batch), f"{prefix}_sample_B256": lambda: rb.sample()}
    if prefix == "img":  # the README's large-batch pixel row
        cases["img_sample_B4096"] = lambda: rb.sample(4096)
    return cases


def ring_cases(max_length: int) -> dict[str, Callable[[], Any]]:
    num_envs = 64
    rb = EnvRingReplayBuffer(num_envs=num_envs, max_length=max_length, sampler=TrajectorySampler(8))
    step = TensorDict({"obs": torch.randn(num_envs, 64), "reward": torch.rand(num_envs),
                       "discount": torch.ones(num_envs), "step_type": torch.ones(num_envs, dtype=torch.int32)},
                      [num_envs])
    for _ in range(max_length):
        rb.extend(step)
    env_ids = torch.arange(num_envs)
    return {"ring_insert_E64": lambda: rb.extend(step, env_ids=env_ids), "ring_sample_B256_T8": lambda: rb.sample(256)}


def dedup_cases(max_length: int) -> dict[str, Callable[[], Any]]:
    num_envs = 8
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(num_envs, max_length, num_stack=4),
                             sampler=TrajectorySampler(1))
    frames = torch.randint(0, 256, (num_envs, 84, 84), dtype=torch.uint8)
    window = [frames.clone() for _ in range(4)]

    def next_step() -> TensorDict:
        obs = torch.stack(window, 1)
        window.append(window[-1] + 1)  # uint8 wraps
        window.pop(0)
        return TensorDict({"observation": obs, "action": torch.zeros(num_envs, dtype=torch.int64),
                           "reward": torch.zeros(num_envs),
                           "next": {"observation": torch.stack(window, 1),
                                    "done": torch.zeros(num_envs, 1, dtype=torch.bool)}}, [num_envs])

    for _ in range(max_length):
        rb.extend(next_step())
    return {"dedup_insert_E8": lambda: rb.extend(next_step()), "dedup_sample_B256": lambda: rb.sample(256)}


def check_same_samples(cases: dict[str, Callable[[], Any]]) -> list[str]:
    """Each sampling case, seeded alike, gives the same batch with all fast paths on and off."""
    failures = []
    for key, fn in cases.items():
        if "sample" not in key:
            continue
        torch.manual_seed(0)
        on = fn()
        torch.manual_seed(0)
        with torchrl_ext.fastpath(False):
            off = fn()
        if not all(torch.equal(on[k], off[k]) for k in on.keys(True, True)):
            failures.append(key)
    return failures


def main() -> int:
    ap = make_parser(__doc__, "smaller storages, 3 short repetitions (~1 min)")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.1, max_wait=5.0)
    torch.set_num_threads(a.threads)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    started, load_start = utc_now(), loadavg()
    print(environment_line(started, load_start, a), flush=True)
    pixel_capacity, vector_capacity, ring_length, dedup_length = (
        (10_000, 100_000, 2_048, 4_096) if a.quick else (50_000, 1_000_000, 16_384, 50_000))
    cases: dict[str, Callable[[], Any]] = {}
    for build in (lambda: flat_cases(pixel_capacity, pixel_batch, "img"),
                  lambda: flat_cases(vector_capacity, vector_batch, "vec"),
                  lambda: ring_cases(ring_length), lambda: dedup_cases(dedup_length)):
        built = build()
        cases.update({key: fn for key, fn in built.items() if selected(a, key)})
    different = check_same_samples(cases)
    checks = [Check("samples equal with the fast paths on and off", not different,
                    "every sampling case" if not different else f"differ: {different}")]
    print(f"check: samples equal with the fast paths on and off: {'ok' if not different else different}\n")
    results: dict[str, dict[str, float]] = {}
    print("| case | " + " | ".join(["all on", "all off"] + [f"{n} off" for n in FAST_PATHS]) + " |")
    print("|---|" + "---:|" * (2 + len(FAST_PATHS)))
    for key, fn in cases.items():
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        impls = variants(fn)
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        medians = {impl.name: statistics.median(impl.per_rep) for impl in impls}
        base = medians["all on"]
        results[key] = {name: t for name, t in medians.items()}
        cells = [f"{base * 1e3:.3f} ms"] + [f"{medians[n] / base:.2f}x" for n in ["all off", *FAST_PATHS]]
        print(f"| {key} | " + " | ".join(cells) + f" |  <!-- {bg_note(meter.cores(), waited, pre, a)} -->",
              flush=True)
    print("\nCells after the first: time with that setting / time with every fast path on "
          "(what the path buys on that case; 1.00x: it does not apply there).")
    if a.json:
        write_results(a.json, {"cases": results, "paths": list(FAST_PATHS), "quick": a.quick}, checks)
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
