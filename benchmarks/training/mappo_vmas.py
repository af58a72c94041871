"""MAPPO on VMAS ``balance``: TorchRL's multi-agent PPO loop with stock components against the
README's swap (issue 37's multi-agent case).

Usage::

    python benchmarks/training/mappo_vmas.py --variant stock|torchrl_ext [--quick] [--seed N]

The loop has the structure of TorchRL's ``sota-implementations/multiagent/mappo_ippo.py``:
``VmasEnv`` with ``frames_per_batch // max_steps`` vectorised envs and ``RewardSum`` into
``("agents", "episode_reward")``, a ``Collector`` whose post-processing expands the team
``done`` / ``terminated`` over the agents (the reference's ``DoneTransform``), then per batch: GAE
once under ``torch.no_grad()`` through ``loss_module.value_estimator`` (with the loss's critic
parameters), ``extend`` with the flattened batch, ``num_epochs`` epochs of minibatches drawn
without replacement, each a ``ClipPPOLoss`` step (keys under ``"agents"``), gradient-norm
clipping, Adam. Shared-parameter ``MultiAgentMLP``s (depth 2, 256 cells, tanh): a decentralised
``TanhNormal`` actor and a centralised critic (MAPPO). As ``mappo_ippo.yaml``: 3 agents,
``max_steps=100``, ``gamma=0.9``, ``lmbda=0.9``, ``clip_epsilon=0.2``, ``entropy_eps=0``,
``max_grad_norm=40``. Reduced to fit about 20 s on one CPU thread, where one VMAS step of
balance costs about 20 ms whatever the number of envs and one update of 4,096 steps x 3 agents
about 0.2 s:

* iterations: 5 instead of 500;
* ``frames_per_batch``: 3,000 (30 envs of 100 steps) instead of 60,000 (600 envs),
  ``minibatch_size`` 500 instead of 4,096, ``num_epochs`` 5 instead of 45 (30 updates per batch
  instead of 630);
* ``lr``: 1e-3 instead of 5e-5: with so few updates, 5e-5 would leave the policy where it started.

Balance is slow to learn: with these sizes (seed 0) the mean return of finished episodes goes
from -9.8 in the first batch to about -7 in the next few, and only takes off after about 20
iterations (-4.9 at iteration 19, +12.8 at iteration 30; ``n_iters=30`` takes about 2 minutes
here). A FULL run measures the loop's parts at the reference's layout, not a learning curve.

Variants (the README's rows, nothing else changed):

* **stock**: TorchRL's ``TensorDictReplayBuffer(storage=LazyTensorStorage(frames_per_batch), ...)``
  and ``loss_module.make_value_estimator(ValueEstimators.GAE, gamma=, lmbda=)``;
* **torchrl_ext**: torchrl_ext's ``TensorDictReplayBuffer(storage=FastTensorStorage(frames_per_batch),
  ...)`` and ``torchrl_ext.value.make_value_estimator(loss_module, GAE, gamma=, lmbda=)``.

Both variants draw the same random numbers (VMAS resets, policy sampling, minibatch
permutations), so they compute the same losses (``EXACT``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
from torchrl.envs import RewardSum, TransformedEnv
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.modules.models.multiagent import MultiAgentMLP
from torchrl.objectives import ClipPPOLoss, ValueEstimators

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loop import PartTimer, Record, case_main, episode_returns, mean_or_nan, storage_bytes  # noqa: E402

from torchrl_ext.replay_buffers import TensorDictReplayBuffer as ExtTensorDictReplayBuffer  # noqa: E402
from torchrl_ext.storages import FastTensorStorage  # noqa: E402
from torchrl_ext.value import GAE, make_value_estimator  # noqa: E402

NAME = "MAPPO VMAS balance"
SIZE = {"frames_per_batch": 3_000, "num_epochs": 5, "minibatch_size": 500, "lr": 1e-3}
FULL = {"n_iters": 5, **SIZE}
QUICK = {"n_iters": 2, **SIZE, "num_epochs": 1}
EXACT = True
NOTE = "balance only starts to learn after about 20 iterations; a run has 5"
SCENARIO, N_AGENTS, MAX_STEPS, GAMMA, LMBDA, CLIP, MAX_GRAD_NORM = "balance", 3, 100, 0.9, 0.9, 0.2, 40.0


def make_env(num_envs: int, seed: int) -> TransformedEnv:
    env = VmasEnv(scenario=SCENARIO, num_envs=num_envs, continuous_actions=True, max_steps=MAX_STEPS,
                  device="cpu", seed=seed, n_agents=N_AGENTS)
    return TransformedEnv(env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")]))


def make_models(env: TransformedEnv) -> tuple[ProbabilisticActor, ValueOperator]:
    """The reference's shared-parameter actor (decentralised) and critic (centralised)."""
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched[env.action_key]
    common = {"n_agents": env.n_agents, "share_params": True, "depth": 2, "num_cells": 256,
              "activation_class": nn.Tanh}
    actor_net = nn.Sequential(
        MultiAgentMLP(n_agent_inputs=obs_dim, n_agent_outputs=2 * action_spec.shape[-1], centralised=False,
                      **common),
        NormalParamExtractor())
    policy = ProbabilisticActor(
        module=TensorDictModule(actor_net, in_keys=[("agents", "observation")],
                                out_keys=[("agents", "loc"), ("agents", "scale")]),
        spec=env.full_action_spec_unbatched, in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[env.action_key], distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=True)
    critic = ValueOperator(
        MultiAgentMLP(n_agent_inputs=obs_dim, n_agent_outputs=1, centralised=True, **common),
        in_keys=[("agents", "observation")])
    return policy, critic


def expand_done(data: TensorDictBase) -> TensorDictBase:
    """The reference's ``DoneTransform``: team ``done`` / ``terminated`` copied to every agent
    (``("next", "agents", ...)``, the reward's shape), where the loss's keys point."""
    reward_shape = data.get(("next", "agents", "reward")).shape
    for key in ("done", "terminated"):
        data.set(("next", "agents", key), data.get(("next", key)).unsqueeze(-1).expand(reward_shape))
    return data


def run(variant: str, seed: int, timer: PartTimer, n_iters: int = FULL["n_iters"],
        frames_per_batch: int = SIZE["frames_per_batch"], num_epochs: int = SIZE["num_epochs"],
        minibatch_size: int = SIZE["minibatch_size"], lr: float = SIZE["lr"]) -> Record:
    torch.manual_seed(seed)
    env = make_env(frames_per_batch // MAX_STEPS, seed)
    policy, critic = make_models(env)
    collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=frames_per_batch * n_iters,
                          postproc=expand_done, auto_register_policy_transforms=False)
    buffer_cls, storage_cls = {"stock": (TensorDictReplayBuffer, LazyTensorStorage),
                               "torchrl_ext": (ExtTensorDictReplayBuffer, FastTensorStorage)}[variant]
    replay_buffer = buffer_cls(storage=storage_cls(frames_per_batch), sampler=SamplerWithoutReplacement(),
                                           batch_size=minibatch_size)
    loss_module = ClipPPOLoss(actor_network=policy, critic_network=critic, clip_epsilon=CLIP, entropy_coeff=0.0,
                              normalize_advantage=False)
    loss_module.set_keys(reward=env.reward_key, action=env.action_key, done=("agents", "done"),
                         terminated=("agents", "terminated"))
    if variant == "stock":
        loss_module.make_value_estimator(ValueEstimators.GAE, gamma=GAMMA, lmbda=LMBDA)
    else:
        make_value_estimator(loss_module, GAE, gamma=GAMMA, lmbda=LMBDA)
    optim = torch.optim.Adam(loss_module.parameters(), lr)

    record = Record(case=NAME, variant=variant, seed=seed, frames=0, updates=0)
    collector_iter = iter(collector)
    for _ in range(n_iters):
        with timer("collect"):
            data = next(collector_iter)
        record.frames += data.numel()
        returns = episode_returns(data, key=("next", "agents", "episode_reward"))
        record.curve.append((record.frames, mean_or_nan(returns)))
        with timer("value"):
            with torch.no_grad():
                loss_module.value_estimator(data, params=loss_module.critic_network_params,
                                            target_params=loss_module.target_critic_network_params)
        with timer("buffer"):
            replay_buffer.extend(data.reshape(-1))
        for _ in range(num_epochs):
            for _ in range(frames_per_batch // minibatch_size):
                with timer("buffer"):
                    subdata = replay_buffer.sample()
                with timer("network"):
                    loss_vals = loss_module(subdata)
                    loss_value = loss_vals["loss_objective"] + loss_vals["loss_critic"] + loss_vals["loss_entropy"]
                    loss_value.backward()
                    torch.nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
                    optim.step()
                    optim.zero_grad()
                record.updates += 1
                record.add_loss(loss_value.detach())
        timer.end_iteration()
        collector.update_policy_weights_()  # a no-op here (same device), kept as in the reference
    collector.shutdown()
    record.buffer_bytes = storage_bytes(replay_buffer)
    return record


if __name__ == "__main__":
    sys.exit(case_main(sys.modules[__name__]))
