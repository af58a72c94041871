"""DQN on gymnasium ``CartPole-v1``, stock TorchRL against torchrl_ext, one storage apart.

Usage::

    python benchmarks/training/dqn_cartpole.py --variant stock|torchrl_ext [--quick] [--seed N]

The loop is TorchRL's ``sota-implementations/dqn/dqn_cartpole.py`` with its
``config_cartpole.yaml``: one ``GymEnv("CartPole-v1")`` with ``RewardSum``, a ``Collector``
of 10 frames per batch whose policy is a ``QValueActor`` (``MLP`` of ``[120, 84]`` ReLU cells)
followed by ``EGreedyModule`` (epsilon 1.0 -> 0.05), random actions for the first
``init_random_frames``, a replay buffer of 10,000 transitions and batch 128, one
update per batch (``DQNLoss(loss_function="l2", delay_value=True)``, TD(0) with gamma 0.99,
``Adam(lr=2.5e-4)``, ``HardUpdate`` of the target network every 50 updates).

Differences from the reference, and why:

* 10,000 frames instead of 500,100, with the other frame counts scaled alike: epsilon
  annealed over the first 5,000 (the reference: 250,000, half the run) and 200 random frames
  before the first update (the reference: 10,000, 2% of the run). A run must fit in ~25 s
  on one CPU thread, where TorchRL's collector takes about 1.5 ms per CartPole step; with
  the reference's one update per 10 frames the returns still rise from ~20 to 40-70;
* no ``StepCounter`` transform: it only feeds the reference's episode-length log, and costs
  about a tenth of the collection time here;
* no ``prefetch=10``: prefetching samples in background threads, which would make the two
  variants draw their batches in a nondeterministic order and blur the buffer's timing;
* no evaluation episodes and no logger; the curve is the training episodes' returns.

Variants (the README's row "off-policy, uniform": two imports change, nothing else):

* **stock**: TorchRL's ``TensorDictReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=128)``;
* **torchrl_ext**: torchrl_ext's ``TensorDictReplayBuffer(storage=FastTensorStorage(10_000),
  batch_size=128)`` (TorchRL's sampler and writer; lean ``extend`` and ``sample``).

Both variants consume random numbers identically, so they compute the same losses (``EXACT``).
DQN's value step (the target network's TD(0) target) runs inside ``DQNLoss`` and is timed as
part of "network".
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv, RewardSum, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate

from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer
from torchrl_ext.storages import FastTensorStorage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import PartTimer, Record, case_main, episode_returns, mean_or_nan, storage_bytes  # noqa: E402

NAME = "DQN CartPole"
FULL = {"total_frames": 10_000, "init_random_frames": 200, "annealing_frames": 5_000}
QUICK = {"total_frames": 1_200, "init_random_frames": 1_000, "annealing_frames": 600}
EXACT = True

# config_cartpole.yaml
FRAMES_PER_BATCH, BUFFER_SIZE, BATCH_SIZE, UPDATES_PER_BATCH = 10, 10_000, 128, 1
EPS_START, EPS_END, LR, GAMMA, HARD_UPDATE_FREQ = 1.0, 0.05, 2.5e-4, 0.99, 50


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    return env


def make_model(env: TransformedEnv) -> QValueActor:
    """The reference's Q-network, an ``MLP`` of ``[120, 84]`` ReLU cells (``dqn_per_nstep`` too)."""
    action_spec = env.full_action_spec_unbatched["action"]
    mlp = MLP(in_features=env.observation_spec["observation"].shape[-1], out_features=action_spec.space.n,
              num_cells=[120, 84], activation_class=torch.nn.ReLU)
    return QValueActor(module=mlp, spec=action_spec, in_keys=["observation"])


def make_buffer(variant: str) -> TensorDictReplayBuffer:
    if variant == "stock":
        return TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE), batch_size=BATCH_SIZE)
    return ExtTensorDictReplayBuffer(storage=FastTensorStorage(BUFFER_SIZE), batch_size=BATCH_SIZE)


def run(variant: str, seed: int, timer: PartTimer, *, total_frames: int, init_random_frames: int,
        annealing_frames: int) -> Record:
    torch.manual_seed(seed)
    env = make_env(seed)
    model = make_model(env)
    greedy_module = EGreedyModule(spec=model.spec, eps_init=EPS_START, eps_end=EPS_END,
                                  annealing_num_steps=annealing_frames)
    collector = Collector(env, TensorDictSequential(model, greedy_module), frames_per_batch=FRAMES_PER_BATCH,
                          total_frames=total_frames, init_random_frames=init_random_frames,
                          auto_register_policy_transforms=False)  # feed-forward policy: no InitTracker needed
    rb = make_buffer(variant)
    loss_module = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss_module.make_value_estimator(gamma=GAMMA)
    target_updater = HardUpdate(loss_module, value_network_update_interval=HARD_UPDATE_FREQ)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

    record = Record(case=NAME, variant=variant, seed=seed, frames=0, updates=0)
    collector_iter = iter(collector)
    for _ in range(len(collector)):
        with timer("collect"):
            data = next(collector_iter)
        with timer("buffer"):
            rb.extend(data)
        record.frames += data.numel()
        greedy_module.step(data.numel())
        record.curve.append((record.frames, mean_or_nan(episode_returns(data))))
        # The reference's warm-up: the buffer fills with random actions, no updates yet.
        if record.frames >= init_random_frames:
            for _ in range(UPDATES_PER_BATCH):
                with timer("buffer"):
                    batch = rb.sample()
                with timer("network"):
                    loss = loss_module(batch)["loss"]
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    target_updater.step()
                record.updates += 1
                record.add_loss(loss.detach())
            collector.update_policy_weights_()
        timer.end_iteration()
    collector.shutdown()
    record.buffer_bytes = storage_bytes(rb)
    return record


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
