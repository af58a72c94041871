"""PPO on gymnasium ``CartPole-v1``: TorchRL's PPO loop with stock components against the
README's swap (issue 37's on-policy case).

Usage::

    python benchmarks/training/ppo_cartpole.py --variant stock|torchrl_ext [--quick] [--seed N]

The loop has the structure of TorchRL's ``sota-implementations/ppo/ppo_mujoco.py``: a
``Collector``, then for each collected batch ``ppo_epochs`` times: GAE on the whole batch under
``torch.no_grad()`` (with the critic of that epoch), ``extend`` the buffer with the flattened
batch, one ``ClipPPOLoss`` step per minibatch drawn without replacement; separate Adam optimisers
for actor and critic, learning rate annealed linearly to 0 over the run (the reference's
``anneal_lr``, here over the short run). Hyper-parameters are the reference's
(``config_mujoco.yaml``): ``frames_per_batch=2048``, ``mini_batch_size=64``, ``ppo_epochs=10``,
``clip_epsilon=0.2``, ``gamma=0.99``, ``gae_lambda=0.95``, ``lr=3e-4`` (Adam ``eps=1e-5``),
``critic_coef=0.25``, ``entropy_coef=0``, l2 critic loss, normalised advantages, two hidden
layers of 64 (tanh). They differ in:

* the actor: CartPole's actions are discrete, so the policy outputs the logits of a
  ``OneHotCategorical`` (the env's one-hot action spec) instead of a ``TanhNormal``;
* the envs: 8 CartPoles in one process (``[8, 256]`` batches, as the 8 envs of TorchRL's
  ``config_atari.yaml``) instead of one env, which more than halves the collection time here;
  transforms ``RewardSum`` and ``StepCounter`` only, no ``VecNorm`` / ``ClipTransform`` /
  ``DoubleToFloat`` (CartPole's observations are float32 and small);
* the total frame budget: 4 batches (8,192 frames, 1,280 updates) instead of 1M, to fit about
  20 s on one CPU thread; the returns rise from about 22 to 65 within it (seed 0; with the
  learning rate annealed over 30 batches instead, they reach CartPole's 500 after 12).

Variants (the README's first row of "Which buffer do I want?", nothing else changed):

* **stock**: ``ReplayBuffer(storage=LazyTensorStorage(2048), sampler=SamplerWithoutReplacement(),
  batch_size=64)`` and ``torchrl.objectives.value.GAE``;
* **torchrl_ext**: ``FastTensorStorage(2048)`` and ``torchrl_ext.value.GAE`` (same arguments).

Both variants draw the same random numbers (policy sampling, minibatch permutations), so they
compute the same losses (``EXACT``).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import Compose, GymWrapper, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE as TorchRLGAE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import PartTimer, Record, case_main, episode_returns, mean_or_nan, storage_bytes  # noqa: E402

from torchrl_ext.storages import FastTensorStorage  # noqa: E402
from torchrl_ext.value import GAE as ExtGAE  # noqa: E402

NAME = "PPO CartPole"
FRAMES_PER_BATCH, MINI_BATCH, EPOCHS, NUM_ENVS = 2048, 64, 10, 8
FULL = {"total_frames": 4 * FRAMES_PER_BATCH}
QUICK = {"total_frames": 2 * FRAMES_PER_BATCH, "epochs": 1}
EXACT = True
GAMMA, LMBDA, CLIP, LR, CRITIC_COEF = 0.99, 0.95, 0.2, 3e-4, 0.25


def make_env(seed: int, num_envs: int = NUM_ENVS) -> TransformedEnv:
    """``num_envs`` CartPoles stepped in one process (``[num_envs]`` batch).

    gymnasium's ``SyncVectorEnv`` with autoreset disabled: TorchRL resets the done envs itself
    (``reset_mask``), so no fake transitions at episode ends (which the default autoreset of
    ``GymEnv(num_envs=...)`` gives), and one policy call serves all envs, unlike ``SerialEnv``.
    """
    vec_env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs,
                                       autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    env = TransformedEnv(GymWrapper(vec_env), Compose(RewardSum(), StepCounter()))
    env.set_seed(seed)
    return env


def make_models(env: TransformedEnv, orthogonal_init: bool = True) -> tuple[ProbabilisticActor, ValueOperator]:
    """Two MLPs of 64 x 64 (tanh), as the reference's ``make_ppo_models``; a categorical head
    (``impala_cartpole`` too, with PyTorch's default init)."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    policy_net = MLP(in_features=obs_dim, out_features=env.action_spec.shape[-1], num_cells=[64, 64],
                     activation_class=nn.Tanh)
    value_net = MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh)
    if orthogonal_init:  # a near-uniform initial policy (small head gain): the usual PPO recipe
        for net, head_gain in ((policy_net, 0.01), (value_net, 1.0)):
            linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
            for i, layer in enumerate(linears):
                nn.init.orthogonal_(layer.weight, gain=head_gain if i == len(linears) - 1 else math.sqrt(2.0))
                nn.init.zeros_(layer.bias)
    actor = ProbabilisticActor(
        module=TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], spec=env.action_spec, distribution_class=OneHotCategorical, return_log_prob=True)
    critic = ValueOperator(value_net, in_keys=["observation"])
    return actor, critic


def run(variant: str, seed: int, timer: PartTimer, total_frames: int = FULL["total_frames"],
        epochs: int = EPOCHS) -> Record:
    storage_cls, gae_cls = {"stock": (LazyTensorStorage, TorchRLGAE),
                            "torchrl_ext": (FastTensorStorage, ExtGAE)}[variant]
    torch.manual_seed(seed)
    env = make_env(seed)
    actor, critic = make_models(env)
    collector = Collector(env, actor, frames_per_batch=FRAMES_PER_BATCH, total_frames=total_frames,
                          max_frames_per_traj=-1, auto_register_policy_transforms=False)
    data_buffer = ReplayBuffer(storage=storage_cls(FRAMES_PER_BATCH), sampler=SamplerWithoutReplacement(),
                               batch_size=MINI_BATCH)
    adv_module = gae_cls(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=CLIP,
                              loss_critic_type="l2", entropy_coeff=0.0, critic_coeff=CRITIC_COEF,
                              normalize_advantage=True)
    actor_optim = torch.optim.Adam(actor.parameters(), lr=LR, eps=1e-5)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=LR, eps=1e-5)
    num_mini_batches = FRAMES_PER_BATCH // MINI_BATCH
    total_updates = (total_frames // FRAMES_PER_BATCH) * epochs * num_mini_batches

    record = Record(case=NAME, variant=variant, seed=seed, frames=0, updates=0)
    collector_iter = iter(collector)
    while record.frames < total_frames:
        with timer("collect"):
            data = next(collector_iter)
        record.frames += data.numel()
        record.curve.append((record.frames, mean_or_nan(episode_returns(data))))
        for _ in range(epochs):
            with timer("value"):
                with torch.no_grad():
                    data = adv_module(data)
            with timer("buffer"):
                data_buffer.extend(data.reshape(-1))
            for _ in range(num_mini_batches):
                with timer("buffer"):
                    batch = data_buffer.sample()
                with timer("network"):
                    # The reference's linear learning-rate annealing (anneal_lr: True).
                    alpha = 1.0 - record.updates / total_updates
                    for group in (*actor_optim.param_groups, *critic_optim.param_groups):
                        group["lr"] = LR * alpha
                    loss = loss_module(batch)
                    actor_loss = loss["loss_objective"] + loss["loss_entropy"]
                    actor_loss.backward()
                    loss["loss_critic"].backward()
                    actor_optim.step()
                    critic_optim.step()
                    actor_optim.zero_grad()
                    critic_optim.zero_grad()
                record.updates += 1
                record.add_loss(actor_loss.detach() + loss["loss_critic"].detach())
        timer.end_iteration()
    collector.shutdown()
    record.buffer_bytes = storage_bytes(data_buffer)
    return record


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
