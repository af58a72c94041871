"""DQN with prioritized 3-step replay on gymnasium ``CartPole-v1``, stock TorchRL against torchrl_ext.

Usage::

    python benchmarks/training/dqn_per_nstep.py --variant stock|torchrl_ext [--quick] [--seed N]

TorchRL has no reference script for DQN with prioritized n-step replay; the loop is
``sota-implementations/dqn/dqn_cartpole.py`` (see ``dqn_cartpole.py`` here, scaled down alike)
with its uniform buffer replaced by a prioritized n-step one: ``MLP`` of ``[120, 84]`` cells in
a ``QValueActor`` + ``EGreedyModule`` (1.0 -> 0.05 over the first half of the run), a buffer of
10,000 transitions, batch 128, one update per collected batch, ``DQNLoss(loss_function="l2",
delay_value=True)`` whose TD(0) estimator discounts the bootstrap by ``gamma ** steps_to_next_obs``
(gamma 0.99), ``Adam(lr=2.5e-4)``, ``HardUpdate`` every 50 updates. Prioritized replay as in
Schaul et al.: alpha 0.6, beta annealed linearly from 0.4 to 1.0 over the updates, the loss
weighed by ``priority_weight`` (``DQNLoss`` reads it) and each update's absolute TD errors
written back as the sampled transitions' priorities (``DQNLoss`` writes squared ones: their
square root is written back). n = 3.

Differences from ``dqn_cartpole.py``: 4 CartPole envs in a ``SerialEnv`` (as
``examples/dqn_per``) and 12 frames per batch (4 envs x 3 steps, the multiple of 4 nearest the
reference's 10) instead of one env and 10 frames: both n-step buffers are built for the
collector's ``[num_envs, T]`` batches on an ``ndim=2`` storage.

Variants (the README's row "prioritized n-step replay (DQN + PER)"):

* **stock**: TorchRL's way: ``TensorDictPrioritizedReplayBuffer(alpha, beta,
  storage=LazyTensorStorage(10_000, ndim=2), transform=MultiStepTransform(n_steps=3, gamma))``
  extended with the collector's ``[4, T]`` batches; the transform holds back each env's last 3
  steps until their successors arrive and stores n-step transitions;
* **torchrl_ext**: ``TensorDictReplayBuffer(storage=FastTensorStorage(10_000, ndim=2),
  sampler=PrioritizedNStepSampler(10_000, alpha, beta, n_step=3, gamma))`` (as
  ``conf/buffer/prioritized_nstep.yaml``): the storage keeps one-step data and the sampler builds
  the chains at sampling.

Not ``EXACT``: the algorithms differ. TorchRL's transform keeps the start step's done flags
while moving ``("next", "observation")`` up to the terminal one, so the n - 1 transitions
before each termination bootstrap from the terminal observation (README: "would bootstrap past
the end of an episode"); torchrl_ext's chains take the flags from the chain's last step. On
CartPole, where every early episode ends in a termination, this slows the stock variant's
learning beyond the spread of seeds. The TD target is computed inside ``DQNLoss`` and timed as
"network"; the priority write-back as "buffer".
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
from torchrl.envs import GymEnv, MultiStepTransform, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import EGreedyModule
from torchrl.objectives import DQNLoss, HardUpdate

from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import PrioritizedNStepSampler
from torchrl_ext.storages import FastTensorStorage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import PartTimer, Record, case_main, episode_returns, mean_or_nan, storage_bytes  # noqa: E402
from dqn_cartpole import (  # noqa: E402  the reference's network and hyper-parameters
    BATCH_SIZE, BUFFER_SIZE, EPS_END, EPS_START, GAMMA, HARD_UPDATE_FREQ, LR, UPDATES_PER_BATCH, make_model,
)

NAME = "DQN + PER 3-step CartPole"
FULL = {"total_frames": 10_800, "init_random_frames": 216, "annealing_frames": 5_400}  # multiples of 12
QUICK = {"total_frames": 1_200, "init_random_frames": 960, "annealing_frames": 600}
EXACT = False
NOTE = ("returns may differ: TorchRL's MultiStepTransform bootstraps the n - 1 steps before a "
        "termination from the terminal observation")

NUM_ENVS, FRAMES_PER_BATCH = 4, 12
N_STEP, ALPHA, BETA_START, BETA_END = 3, 0.6, 0.4, 1.0


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(SerialEnv(NUM_ENVS, lambda: GymEnv("CartPole-v1")), RewardSum())
    env.set_seed(seed)
    return env


def make_buffer(variant: str, seed: int) -> TensorDictPrioritizedReplayBuffer | TensorDictReplayBuffer:
    # Without a generator TorchRL's prioritized sampler draws from numpy's global RNG, unseeded.
    generator = torch.Generator().manual_seed(seed)
    # ndim=2: the storage keeps the [time, env] layout of the collector's [env, time] batches.
    if variant == "stock":
        return TensorDictPrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA_START, storage=LazyTensorStorage(BUFFER_SIZE, ndim=2),
            transform=MultiStepTransform(n_steps=N_STEP, gamma=GAMMA), batch_size=BATCH_SIZE,
            generator=generator)
    sampler = PrioritizedNStepSampler(BUFFER_SIZE, alpha=ALPHA, beta=BETA_START, n_step=N_STEP, gamma=GAMMA)
    return TensorDictReplayBuffer(storage=FastTensorStorage(BUFFER_SIZE, ndim=2), sampler=sampler,
                                  batch_size=BATCH_SIZE, generator=generator)


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
    rb = make_buffer(variant, seed)
    loss_module = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss_module.make_value_estimator(gamma=GAMMA)
    target_updater = HardUpdate(loss_module, value_network_update_interval=HARD_UPDATE_FREQ)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)
    learn_frames = max(total_frames - init_random_frames, 1)

    record = Record(case=NAME, variant=variant, seed=seed, frames=0, updates=0)
    collector_iter = iter(collector)
    for _ in range(len(collector)):
        with timer("collect"):
            data = next(collector_iter)  # [NUM_ENVS, T]
        with timer("buffer"):
            rb.extend(data)
        record.frames += data.numel()
        greedy_module.step(data.numel())
        record.curve.append((record.frames, mean_or_nan(episode_returns(data))))
        if record.frames >= init_random_frames:
            # PER's schedule: beta grows to 1, removing the sampling bias by the end of the run.
            progress = min((record.frames - init_random_frames) / learn_frames, 1.0)
            rb.sampler.beta = BETA_START + (BETA_END - BETA_START) * progress
            for _ in range(UPDATES_PER_BATCH):
                with timer("buffer"):
                    batch = rb.sample()
                with timer("network"):
                    loss = loss_module(batch)["loss"]  # also writes batch["td_error"] = delta ** 2
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    target_updater.step()
                with timer("buffer"):
                    batch["td_error"] = batch["td_error"].sqrt()  # PER's priority: |delta|
                    rb.update_tensordict_priority(batch)
                record.updates += 1
                record.add_loss(loss.detach())
            collector.update_policy_weights_()
        timer.end_iteration()
    collector.shutdown()
    record.buffer_bytes = storage_bytes(rb)
    return record


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
