"""The replay-bound case: DQN-style updates on 84x84x4 uint8 frame stacks, 4 updates of batch 256
per collected step, 100,000-transition buffers.

Usage::

    python benchmarks/training/pixel_dqn.py --variant stock|torchrl_ext [--quick] [--seed N]
    python benchmarks/training/pixel_dqn.py --variant torchrl_ext --device cuda   # learner on a GPU

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

Both buffers are filled to capacity first (not timed): the measured iterations replay from a
full buffer, as a long run does. With ``device="cuda"`` the network trains on the GPU and both
buffers sample into pinned memory, copied with ``non_blocking=True``. The rewards are random, so
there is no learning curve; the check is that in samples each next stack is its stack shifted by
one frame, as the collector wrote it (``extra["stacks_ok"]``). ``EXACT`` is False: the two
buffers draw different indices.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import LOSSES_KEPT, PartTimer, Record, case_main, storage_bytes  # noqa: E402

NAME = "pixel DQN (replay-bound)"
FULL = {"capacity": 100_000, "iterations": 24}
SEEDS = 2  # no learning curve to compare; each run first fills its 100k buffer
QUICK = {"capacity": 4_000, "iterations": 6}
EXACT = False

ENVS, STACK, SIZE, ACTIONS, BATCH, UPDATES, GAMMA = 8, 4, 84, 6, 256, 4, 0.99


class SyntheticPixelCollector:
    """8 envs of frame stacks; every frame is new and carries its id in its first 8 bytes.

    The frames' pixels cycle through a pool of random frames (generating 8 x 84 x 84 random
    bytes per step would make filling the 100k buffers the slowest part of a run); the id
    makes each frame distinct.
    """

    POOL = 4096

    def __init__(self, seed: int = 0) -> None:
        self.rng = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(256, (self.POOL, SIZE, SIZE), dtype=torch.uint8, generator=self.rng)
        self.frame_id = 0
        self.stacks = torch.stack([self._reset_stack() for _ in range(ENVS)])
        self.remaining = torch.randint(100, 1001, (ENVS,), generator=self.rng)

    def _frames(self, n: int) -> torch.Tensor:
        """``n`` new frames ``[n, 84, 84]``, ids stamped."""
        ids = torch.arange(self.frame_id, self.frame_id + n, dtype=torch.int64)
        frames = self.pool[ids % self.POOL]
        frames.view(n, -1)[:, :8] = ids.view(torch.uint8).view(n, 8)
        self.frame_id += n
        return frames

    def _reset_stack(self) -> torch.Tensor:
        return self._frames(1).expand(STACK, SIZE, SIZE).clone()  # "reset" padding: the first frame repeated

    def step(self) -> TensorDict:
        """One step of the 8 envs as a collector returns it: ``[8]``."""
        obs = self.stacks.clone()
        next_obs = torch.cat([obs[:, 1:], self._frames(ENVS).unsqueeze(1)], 1)
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


def make_buffer(variant: str, capacity: int, pin_memory: bool) -> Any:
    if variant == "stock":
        return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), pin_memory=pin_memory)
    storage = DedupEnvRingStorage(ENVS, capacity // ENVS, num_stack=STACK)
    return EnvRingReplayBuffer(storage=storage, sampler=TrajectorySampler(1), pin_memory=pin_memory)


def extend(buffer: Any, data: TensorDict) -> None:
    if isinstance(buffer, EnvRingReplayBuffer):
        buffer.extend(data, env_ids=torch.arange(ENVS))  # the rings are written per env
    else:
        buffer.extend(data)


def sample(buffer: Any) -> TensorDict:
    batch = buffer.sample(BATCH)
    return batch.reshape(-1) if batch.batch_dims > 1 else batch  # rings: [B, 1] windows


def check_stacks(batch: TensorDict) -> bool:
    """Each sampled next stack is the stack shifted by one frame, as the collector wrote it."""
    return torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])


def run(variant: str, seed: int, timer: PartTimer, capacity: int, iterations: int, device: str = "cpu") -> Record:
    torch.manual_seed(seed)
    device_ = torch.device(device)
    net = q_network().to(device_)
    target = copy.deepcopy(net)
    optim = torch.optim.Adam(net.parameters(), lr=1e-4)
    buffer = make_buffer(variant, capacity, pin_memory=device_.type == "cuda")
    collector = SyntheticPixelCollector(seed)
    for _ in range(capacity // ENVS):  # fill (not timed): the iterations replay from a full buffer
        extend(buffer, collector.step())
    stacks_ok = all(check_stacks(sample(buffer)) for _ in range(3))
    losses: list[float] = []
    for _ in range(iterations):
        with timer("collect"):
            data = collector.step()
        with timer("buffer"):
            extend(buffer, data)
            batches = [sample(buffer).to(device_, non_blocking=True) for _ in range(UPDATES)]
        with timer("network"):
            for batch in batches:
                obs = batch["observation"].float().div_(255)
                next_obs = batch["next", "observation"].float().div_(255)
                q = net(obs).gather(1, batch["action"].view(-1, 1)).squeeze(1)
                with torch.no_grad():
                    best = net(next_obs).argmax(1, keepdim=True)  # Double-DQN: online argmax, target value
                    bootstrap = target(next_obs).gather(1, best).squeeze(1)
                    not_terminal = (~batch["next", "terminated"].view(-1)).float()
                    td_target = batch["next", "reward"].view(-1) + GAMMA * not_terminal * bootstrap
                loss = torch.nn.functional.smooth_l1_loss(q, td_target)
                optim.zero_grad()
                loss.backward()
                optim.step()
                if len(losses) < LOSSES_KEPT:
                    losses.append(loss.detach())  # float() later: no GPU sync inside the timed part
            if device_.type == "cuda":
                torch.cuda.synchronize(device_)  # the network part ends when the GPU has finished it
        timer.end_iteration()
    return Record(case=NAME, variant=variant, seed=seed, frames=iterations * ENVS, updates=iterations * UPDATES,
                  losses=[float(x) for x in losses], buffer_bytes=storage_bytes(buffer),
                  extra={"stacks_ok": stacks_ok, "device": str(device_), "capacity": capacity})


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
