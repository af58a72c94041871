"""Save server for ``test_atomic_save.py``: imports torch once, forks one saver per trial.

Run as ``python -m tests.io._atomic_worker <checkpoint folder>`` with
``OMP_NUM_THREADS=1`` (so forking is safe). Commands on stdin, one per line:

* ``save <v>``: saves version ``v`` in this process; answers ``saved <seconds>``;
* ``fork <v>``: forks a child that saves version ``v`` and exits; answers
  ``pid <pid>`` at once, then ``exit <status>`` when the child is gone
  (``-9`` when the test SIGKILLed it);
* ``quit``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import PrioritizedReplayBuffer
from torchrl_ext.storages import FastTensorStorage

CAPACITY, WIDTH = 12_000, 48  # two float32 [12000, 48] entries: ~4.6 MB of storage


def build() -> PrioritizedReplayBuffer:
    """The empty buffer every version is written into."""
    return PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=FastTensorStorage(CAPACITY), batch_size=64,
                                   generator=torch.Generator().manual_seed(0))


def version(v: int) -> PrioritizedReplayBuffer:
    """Buffer contents ``v``: rows, ring cursor, priorities and RNG all differ between versions."""
    rb = build()
    data = torch.Generator().manual_seed(100 + v)
    rows = CAPACITY + 3_000 * (v + 1)  # wraps; the cursor ends at 3000 * (v + 1) % CAPACITY
    for start in range(0, rows, 4_000):
        n = min(4_000, rows - start)
        obs = torch.randn(n, WIDTH, generator=data) + v
        rb.extend(TensorDict({"obs": obs, "next": {"obs": obs + 1},
                              "td_error": torch.rand(n, generator=data) + 0.1 * v}, [n]))
    for _ in range(v + 1):  # moves the RNG and the priorities
        batch = rb.sample()
        batch.set("td_error", torch.rand(batch.shape[0], generator=data) * 5)
        rb.update_tensordict_priority(batch)
    return rb


def main(folder: str) -> None:
    torch.set_num_threads(1)
    target = Path(folder) / "buffer"
    buffers = {v: version(v) for v in (0, 1)}
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "quit":
            return
        v = int(args[0])
        if command == "save":
            start = time.perf_counter()
            buffers[v].dumps(target)
            print(f"saved {time.perf_counter() - start:.6f}", flush=True)
        elif command == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    buffers[v].dumps(target)
                finally:
                    os._exit(0)
            print(f"pid {pid}", flush=True)
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            print(f"exit {code}", flush=True)
        else:
            raise ValueError(f"unknown command {command!r}; use save <v>, fork <v> or quit.")


if __name__ == "__main__":
    main(sys.argv[1])
