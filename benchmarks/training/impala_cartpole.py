"""IMPALA (V-trace actor-critic) on gymnasium ``CartPole-v1``: TorchRL's single-node IMPALA loop
with stock components against the README's swap (issue 37's V-trace case).

Usage::

    python benchmarks/training/impala_cartpole.py --variant stock|torchrl_ext [--quick] [--seed N]

The loop has the structure of TorchRL's ``sota-implementations/impala/impala_single_node.py``:
a ``Collector`` yields rollouts of ``frames_per_batch`` steps; ``batches_to_accumulate`` of them
are stacked into a ``[rollouts, T]`` learner batch, the loss's V-trace estimator
(``A2CLoss`` + ``make_value_estimator``) computes advantages and targets on it under
``torch.no_grad()``, the flattened batch is written into a ``TensorDictReplayBuffer``
(``SamplerWithoutReplacement``, storage of ``frames_per_batch * batches_to_accumulate``) and read
back in minibatches, each one ``A2CLoss`` step (policy gradient with the V-trace advantage, l2
critic loss, entropy bonus), gradient norm clipped, RMSprop, learning rate annealed linearly to 0.
Hyper-parameters kept from ``config_single_node.yaml``: ``gamma=0.99``, RMSprop ``lr=6e-4``,
``alpha=0.99``, ``eps=1e-8``, ``max_grad_norm=40``, ``critic_coef=0.5``, ``entropy_coef=0.01``,
``rho_thresh = c_thresh = 1`` (VTrace's defaults), ``anneal_lr``. They differ in:

* networks: actor and critic MLPs of 64 x 64 (tanh) on CartPole's 4 features, a categorical
  (one-hot) policy head, instead of the Atari conv nets; no frame skip, no ``eol`` done key;
* sizes: rollouts of 16 steps (reference: 80 frames = 20 agent steps) and learner batches of 4
  rollouts (reference: 32), 6,144 frames (reference: 200M), so that the run's 96 updates make
  the returns rise from ~20 to ~70; the buffer is still read as one minibatch of the whole
  learner batch (the reference's ``batch_size = frames_per_batch * batch_size``, one update per
  learner batch; ``mini_batch`` splits it further if wanted);
* collection: one env in this process, with the learner's own actor. The reference's workers
  get the new weights after every update, so its behaviour and target policies are the same
  when V-trace runs (up to asynchrony), as here: the importance ratios are 1 at estimation time.
  A lagged behaviour actor (``examples/impala_vtrace``) is not used because TorchRL's ``VTrace``
  scores a fresh sample (or, outside an exploration context, the mode) of the current policy
  instead of the stored action, so the two variants would compute different targets off-policy.
  On-policy both reduce to the same numbers: with ``rho_thresh = c_thresh = 1`` every clipped
  ratio is 1, since the mode's probability is at least the stored action's.

Variants (the README's rows for the buffer and for V-trace, nothing else changed):

* **stock**: TorchRL's ``TensorDictReplayBuffer`` over ``LazyTensorStorage(64)`` (the reference
  uses its memmap twin) and ``loss.make_value_estimator(ValueEstimators.VTrace, gamma=0.99)``;
* **torchrl_ext**: torchrl_ext's ``TensorDictReplayBuffer`` over ``FastTensorStorage(64)`` and
  ``torchrl_ext.value.make_value_estimator(loss, VTrace, gamma=0.99)``.

Both variants draw the same random numbers (policy sampling, minibatch permutations), so they
compute the same losses (``EXACT``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tensordict import TensorDictBase
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
from torchrl.envs import GymEnv, RewardSum, TransformedEnv
from torchrl.objectives import A2CLoss, ValueEstimators

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import PartTimer, Record, case_main, episode_returns, mean_or_nan, storage_bytes  # noqa: E402
from ppo_cartpole import make_models  # noqa: E402  actor and critic MLPs of 64 x 64

from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer  # noqa: E402
from torchrl_ext.storages import FastTensorStorage  # noqa: E402
from torchrl_ext.value import VTrace, make_value_estimator  # noqa: E402

NAME = "IMPALA CartPole"
FULL = {"total_frames": 6_144}
QUICK = {"total_frames": 1_024}
EXACT = True
GAMMA, LR, ALPHA, EPS, MAX_GRAD_NORM = 0.99, 6e-4, 0.99, 1e-8, 40.0
ENTROPY_COEF, CRITIC_COEF = 0.01, 0.5


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    return env


def run(variant: str, seed: int, timer: PartTimer, total_frames: int = FULL["total_frames"],
        frames_per_batch: int = 16, batches_to_accumulate: int = 4, mini_batch: int = 64) -> Record:
    """One run. An iteration of ``timer`` is one learner batch (``batches_to_accumulate`` collected
    rollouts and the ``capacity // mini_batch`` updates they feed); ``curve`` has one point per rollout."""
    torch.manual_seed(seed)
    env = make_env(seed)
    actor, critic = make_models(env, orthogonal_init=False)  # the reference's Atari nets, as CartPole MLPs
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=total_frames,
                          max_frames_per_traj=-1, auto_register_policy_transforms=False)
    capacity = frames_per_batch * batches_to_accumulate
    buffer_cls, storage_cls = {"stock": (TensorDictReplayBuffer, LazyTensorStorage),
                               "torchrl_ext": (ExtTensorDictReplayBuffer, FastTensorStorage)}[variant]
    data_buffer = buffer_cls(storage=storage_cls(capacity), sampler=SamplerWithoutReplacement(), batch_size=mini_batch)
    loss_module = A2CLoss(actor_network=actor, critic_network=critic, loss_critic_type="l2",
                          entropy_coeff=ENTROPY_COEF, critic_coeff=CRITIC_COEF)
    # The loss's own estimator, wired with its actor, critic and keys (action_log_prob = mu).
    if variant == "stock":
        loss_module.make_value_estimator(ValueEstimators.VTrace, gamma=GAMMA)
    else:
        make_value_estimator(loss_module, VTrace, gamma=GAMMA)
    optim = torch.optim.RMSprop(loss_module.parameters(), lr=LR, alpha=ALPHA, eps=EPS)
    num_mini_batches = capacity // mini_batch
    total_updates = total_frames // capacity * num_mini_batches

    record = Record(case=NAME, variant=variant, seed=seed, frames=0, updates=0)
    collector_iter = iter(collector)
    accumulator: list[TensorDictBase] = []
    while record.frames < total_frames:
        with timer("collect"):
            data = next(collector_iter)
        record.frames += data.numel()
        record.curve.append((record.frames, mean_or_nan(episode_returns(data))))
        accumulator.append(data)
        if len(accumulator) < batches_to_accumulate:
            continue
        with timer("buffer"):  # [rollouts, T]: V-trace runs along each rollout's time dim
            stacked = torch.stack(accumulator, 0).contiguous()
        with timer("value"), torch.no_grad():
            stacked = loss_module.value_estimator(stacked)
        # Flattened (as the reference): minibatches carry "advantage", so A2CLoss skips its estimator.
        with timer("buffer"):
            data_buffer.extend(stacked.reshape(-1))
        for _ in range(num_mini_batches):
            with timer("buffer"):
                batch = data_buffer.sample()
            with timer("network"):  # the reference's anneal_lr: linear decay to 0 over the run
                for group in optim.param_groups:
                    group["lr"] = LR * (1.0 - record.updates / total_updates)
                loss = loss_module(batch)
                loss_sum = loss["loss_critic"] + loss["loss_objective"] + loss["loss_entropy"]
                loss_sum.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), max_norm=MAX_GRAD_NORM)
                optim.step()
                optim.zero_grad()
            record.updates += 1
            record.add_loss(loss_sum.detach())
        accumulator = []
        timer.end_iteration()
    collector.shutdown()
    record.buffer_bytes = storage_bytes(data_buffer)
    return record


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
