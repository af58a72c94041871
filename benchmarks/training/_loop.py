"""What every training-loop case shares: the part timer, the result record and the case CLI.

Not a script. Each case module (``dqn_cartpole.py``, ``pixel_dqn.py``, ...) defines

* ``NAME`` (the case's row name), ``FULL`` and ``QUICK`` (keyword arguments of ``run`` for a
  full and a ``--quick`` run), and ``EXACT`` (True when both variants must compute the same
  losses: the swap changes components, not the algorithm);
* ``run(variant, seed, timer, **size) -> Record``: one training run of one variant
  (``"stock"`` or ``"torchrl_ext"``), its parts timed with ``timer``;

and ends with ``if __name__ == "__main__": sys.exit(case_main(sys.modules[__name__]))``, which
runs one variant and seed and prints the record as JSON (``run.py`` calls it in a fresh process
per run, so peak memory is per variant).

Parts of an iteration (one collected batch and the updates it feeds):

* ``collect``: the collector yielding the batch (env steps and policy);
* ``buffer``: ``extend``, ``sample`` and priority updates;
* ``value``: advantage / return estimation (GAE, V-trace) including the critic calls it makes;
* ``network``: losses, backward and optimiser steps.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import time
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Iterator

import torch
from tensordict import TensorDictBase

PARTS = ("collect", "buffer", "value", "network")
LOSSES_KEPT = 20
VARIANTS = ("stock", "torchrl_ext")


class PartTimer:
    """Seconds spent in each part, per iteration.

    Example::

        timer = PartTimer()
        with timer("buffer"):
            rb.extend(data)
        timer.end_iteration()   # timer.iterations[-1] == {"collect": 0.0, "buffer": ..., ...}
    """

    def __init__(self) -> None:
        self.iterations: list[dict[str, float]] = []
        self._current = dict.fromkeys(PARTS, 0.0)

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        if part not in self._current:
            raise ValueError(f"part={part!r} is not one of {PARTS}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self._current[part] += time.perf_counter() - start

    def end_iteration(self) -> None:
        self.iterations.append(self._current)
        self._current = dict.fromkeys(PARTS, 0.0)


@dataclass
class Record:
    """One run of one variant: what ``run.py`` aggregates.

    ``curve`` holds ``(frames, mean return of the episodes finished so far in that batch)``
    points (``nan`` where none finished); ``losses`` the first losses of the run, for the
    agreement check of ``EXACT`` cases; ``buffer_bytes`` the bytes of the tensors the buffer
    stores (its storage's state).
    """

    case: str
    variant: str
    seed: int
    frames: int
    updates: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    buffer_bytes: int = 0
    iterations: list[dict[str, float]] = field(default_factory=list)
    peak_rss_bytes: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def add_loss(self, loss: float | torch.Tensor) -> None:
        """Keeps the run's first ``LOSSES_KEPT`` losses (what the agreement check compares)."""
        if len(self.losses) < LOSSES_KEPT:
            self.losses.append(float(loss))


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) state: dicts, lists, tuples and TensorDicts."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, TensorDictBase):
        return sum(tensor_bytes(t) for t in obj.values(True, True))
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def storage_bytes(buffer: Any) -> int:
    """Bytes of the tensors a replay buffer's storage holds (its ``state_dict``)."""
    return tensor_bytes(buffer.storage.state_dict())


def episode_returns(data: TensorDictBase, key: Any = ("next", "episode_reward"),
                    done_key: Any = ("next", "done")) -> list[float]:
    """Returns of the episodes that end in a collected batch (``RewardSum``'s running sum at
    the done steps)."""
    done = data.get(done_key)
    if not done.any():
        return []
    returns = data.get(key)
    if returns.shape != done.shape:  # multi-agent sums: one value per env step
        returns = returns.reshape(*done.shape[:-1], -1).mean(-1, keepdim=True)
    return returns[done].tolist()


def mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def timed_run(case: ModuleType, variant: str, seed: int, size: dict[str, Any], with_rss: bool = True) -> Record:
    """``case.run`` with a fresh :class:`PartTimer`; the record gets its iterations, wall time
    and (``with_rss``) this process's peak RSS."""
    timer = PartTimer()
    start = time.perf_counter()
    record = case.run(variant, seed, timer, **size)
    record.wall_s = time.perf_counter() - start
    record.iterations = timer.iterations
    if with_rss:
        record.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return record


def case_main(case: ModuleType) -> int:
    """Runs one variant of ``case`` for one seed and prints its :class:`Record` as JSON."""
    ap = argparse.ArgumentParser(description=case.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few iterations (CI)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="the learner's device, for cases that take one (pixel_dqn)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    size = dict(case.QUICK if args.quick else case.FULL)
    if args.device is not None:
        size["device"] = args.device
    print(json.dumps(asdict(timed_run(case, args.variant, args.seed, size))))
    return 0
