"""A replay-bound training loop: DQN-style updates on 84x84x4 uint8 frame stacks, stock TorchRL
against torchrl_ext, one flag apart (issue 37's pixel case; the other cases follow).

Usage::

    python benchmarks/training/pixel_dqn.py                 # 100,000-transition buffers, 60 iterations
    python benchmarks/training/pixel_dqn.py --quick         # 4,000 transitions, a few iterations
    python benchmarks/training/pixel_dqn.py --variant stock # one variant only

The loop has the structure of TorchRL's DQN reference (collector, buffer, loss, optimiser) with
the collector replaced by a synthetic one, so that the buffer is what is measured: 8 envs whose
observations are stacks of the last 4 frames (``FrameStackObservation(padding_type="reset")``),
each frame 84x84 uint8 and new at every step, episodes of 100-1,000 steps. One iteration = one
collected step of the 8 envs, ``extend`` into the buffer, then 4 updates of batch 256: sample,
a small conv net's TD loss against a target net (Double-DQN target, gamma 0.99), backward, Adam.

* **stock**: ``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))``, storing
  ``observation`` and ``("next", "observation")`` stacks as collected.
* **torchrl_ext**: ``EnvRingReplayBuffer(storage=DedupEnvRingStorage(8, capacity // 8,
  num_stack=4), sampler=TrajectorySampler(1))``: each frame stored once, stacks and next
  stacks rebuilt at sampling (the README's row for pixel observations).

Both buffers are filled to capacity first (not timed). The two variants then run interleaved,
iteration by iteration, from the same network parameters, with the same collected steps; the
time of each iteration is split into collection, buffer (extend, sample) and network (forward,
backward, step). Reported: median and spread of each part, updates per second, and the bytes of
each buffer's stored tensors. Check: in samples from both buffers, each next stack is its
stack shifted by one frame, as the collector wrote it.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage

ENVS, STACK, SIZE, ACTIONS, BATCH, UPDATES, GAMMA = 8, 4, 84, 6, 256, 4, 0.99


class SyntheticPixelCollector:
    """8 envs of frame stacks; every frame is new and carries its id in its first 8 bytes."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = torch.Generator().manual_seed(seed)
        self.frame_id = 0
        self.stacks = torch.stack([self._reset_stack() for _ in range(ENVS)])
        self.remaining = torch.randint(100, 1001, (ENVS,), generator=self.rng)

    def _frame(self) -> torch.Tensor:
        frame = torch.randint(256, (SIZE, SIZE), dtype=torch.uint8, generator=self.rng)
        frame.view(-1)[:8] = torch.tensor([self.frame_id], dtype=torch.int64).view(torch.uint8)
        self.frame_id += 1
        return frame

    def _reset_stack(self) -> torch.Tensor:
        return self._frame().expand(STACK, SIZE, SIZE).clone()  # "reset" padding: the first frame repeated

    def step(self) -> TensorDict:
        """One step of the 8 envs as a collector returns it: ``[8]``."""
        obs = self.stacks.clone()
        next_obs = torch.cat([obs[:, 1:], torch.stack([self._frame() for _ in range(ENVS)]).unsqueeze(1)], 1)
        self.remaining -= 1
        done = self.remaining <= 0
        data = TensorDict({
            "observation": obs,
            "action": torch.randint(ACTIONS, (ENVS,), generator=self.rng),
            "next": {"observation": next_obs, "reward": torch.randn(ENVS, 1, generator=self.rng),
                     "done": done.unsqueeze(-1), "terminated": done.unsqueeze(-1).clone()},
        }, [ENVS])
        self.stacks = next_obs.clone()  # the resets below must not touch the collected batch
        for env in torch.nonzero(done).flatten().tolist():
            self.stacks[env] = self._reset_stack()
            self.remaining[env] = int(torch.randint(100, 1001, (1,), generator=self.rng))
        return data


def q_network() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(STACK, 16, 8, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 4, stride=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * 9 * 9, 256), torch.nn.ReLU(), torch.nn.Linear(256, ACTIONS))


class Learner:
    """One variant: its buffer, Q network, target network and optimiser, and its timings."""

    def __init__(self, name: str, buffer: object, net: torch.nn.Module) -> None:
        self.name, self.buffer = name, buffer
        self.net, self.target = copy.deepcopy(net), copy.deepcopy(net)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=1e-4)
        self.times: dict[str, list[float]] = {"collect": [], "buffer": [], "network": []}

    def extend(self, data: TensorDict) -> None:
        if isinstance(self.buffer, EnvRingReplayBuffer):
            self.buffer.extend(data, env_ids=torch.arange(ENVS))
        else:
            self.buffer.extend(data)

    def sample(self) -> TensorDict:
        batch = self.buffer.sample(BATCH)
        return batch.reshape(-1) if batch.batch_dims > 1 else batch  # rings: [B, 1] windows

    def update(self, batch: TensorDict) -> float:
        obs = batch["observation"].float().div_(255)
        next_obs = batch["next", "observation"].float().div_(255)
        q = self.net(obs).gather(1, batch["action"].view(-1, 1)).squeeze(1)
        with torch.no_grad():
            best = self.net(next_obs).argmax(1, keepdim=True)
            bootstrap = self.target(next_obs).gather(1, best).squeeze(1)
            not_terminal = (~batch["next", "terminated"].view(-1)).float()
            target = batch["next", "reward"].view(-1) + GAMMA * not_terminal * bootstrap
        loss = torch.nn.functional.smooth_l1_loss(q, target)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return float(loss.detach())

    def iteration(self, data: TensorDict, collect_seconds: float) -> None:
        t0 = time.perf_counter()
        self.extend(data)
        batches = [self.sample() for _ in range(UPDATES)]
        t1 = time.perf_counter()
        for batch in batches:
            self.update(batch)
        t2 = time.perf_counter()
        self.times["collect"].append(collect_seconds)
        self.times["buffer"].append(t1 - t0)
        self.times["network"].append(t2 - t1)


def stored_bytes(buffer: object) -> int:
    """Bytes of the tensors in the storage's state (its data and, for dedup, its frame tables)."""
    def walk(obj: object) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, TensorDictBase):
            return sum(walk(t) for t in obj.values(True, True))
        if isinstance(obj, dict):
            return sum(walk(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(walk(v) for v in obj)
        return 0
    return walk(buffer.storage.state_dict())


def check_stacks(batch: TensorDict) -> bool:
    """Each sampled next stack is the stack shifted by one frame, as the collector wrote it."""
    return torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="4,000 transitions, 6 iterations")
    ap.add_argument("--variant", choices=["both", "stock", "torchrl_ext"], default="both")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.quick:
        args.capacity, args.iterations = 4_000, 6
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = q_network()
    learners = []
    if args.variant in ("both", "stock"):
        learners.append(Learner("stock", TensorDictReplayBuffer(storage=LazyTensorStorage(args.capacity)), net))
    if args.variant in ("both", "torchrl_ext"):
        storage = DedupEnvRingStorage(ENVS, args.capacity // ENVS, num_stack=STACK)
        learners.append(Learner("torchrl_ext", EnvRingReplayBuffer(storage=storage, sampler=TrajectorySampler(1)), net))
    collector = SyntheticPixelCollector()
    t0 = time.perf_counter()
    for _ in range(args.capacity // ENVS):  # fill (not timed)
        data = collector.step()
        for learner in learners:
            learner.extend(data)
    print(f"filled {args.capacity:,} transitions per buffer in {time.perf_counter() - t0:.0f} s")
    checks = {learner.name: all(check_stacks(learner.sample()) for _ in range(3)) for learner in learners}
    print("check, next stacks are the stacks shifted by one frame:", checks)
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        data = collector.step()
        collect = time.perf_counter() - t0
        for learner in learners:
            learner.iteration(data, collect)
    print(f"\n{args.iterations} iterations of 1 collected step (8 envs) + {UPDATES} updates of batch {BATCH}; "
          f"{torch.get_num_threads()} torch thread(s)\n")
    print("| variant | iteration (ms) | collect | buffer (extend + sample) | network | updates/s | buffer MB |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    rows = {}
    for learner in learners:
        parts = {k: statistics.median(v) * 1e3 for k, v in learner.times.items()}
        total = [sum(x) for x in zip(*learner.times.values())]
        it_ms = statistics.median(total) * 1e3
        spread = (min(total) * 1e3, max(total) * 1e3)
        rows[learner.name] = {"iteration_ms": it_ms, **parts, "bytes": stored_bytes(learner.buffer)}
        print(f"| {learner.name} | {it_ms:,.0f} ({spread[0]:,.0f}-{spread[1]:,.0f}) | {parts['collect']:,.1f} | "
              f"{parts['buffer']:,.1f} | {parts['network']:,.0f} | {UPDATES / it_ms * 1e3:,.2f} | "
              f"{rows[learner.name]['bytes'] / 2**20:,.0f} |")
    if len(rows) == 2:
        s, e = rows["stock"], rows["torchrl_ext"]
        print(f"\nupdates per second: {s['iteration_ms'] / e['iteration_ms']:.2f}x stock (target >= 1.5x); "
              f"buffer time: {e['buffer'] / s['buffer']:.2f} of stock's (target <= 0.5); "
              f"buffer memory: {e['bytes'] / s['bytes']:.3f} of stock's (target <= 1/6)")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
