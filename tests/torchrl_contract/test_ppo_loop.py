"""TorchRL's PPO loop (advantage, extend, epochs of minibatches without replacement) runs
unchanged with the README's swap (``FastTensorStorage``, ``torchrl_ext.value.GAE``) and learns
exactly as with TorchRL's components."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE as TorchRLGAE

from torchrl_ext.storages import FastTensorStorage
from torchrl_ext.value import GAE

OBS, ACT, FRAMES, MINI_BATCH, EPOCHS = 5, 2, 96, 16, 3


def collected(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(4, FRAMES // 4, 1, generator=g) < 0.05
    return TensorDict({
        "observation": torch.randn(4, FRAMES // 4, OBS, generator=g),
        "action": torch.rand(4, FRAMES // 4, ACT, generator=g) - 0.5,
        "action_log_prob": torch.randn(4, FRAMES // 4, generator=g) - 2,
        "next": {"observation": torch.randn(4, FRAMES // 4, OBS, generator=g),
                 "reward": torch.randn(4, FRAMES // 4, 1, generator=g), "done": done, "terminated": done.clone()},
    }, [4, FRAMES // 4])


def train(storage_cls: type, gae_cls: type, iterations: int = 2) -> list[float]:
    """TorchRL's ppo_mujoco.py loop on synthetic collector batches; the loss of every minibatch."""
    torch.manual_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(torch.nn.Linear(OBS, 2 * ACT), NormalParamExtractor()),
                         in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)
    critic = ValueOperator(torch.nn.Linear(OBS, 1), in_keys=["observation"])
    loss_module = ClipPPOLoss(actor, critic, normalize_advantage=True)
    adv_module = gae_cls(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    data_buffer = ReplayBuffer(storage=storage_cls(FRAMES), sampler=SamplerWithoutReplacement(),
                               batch_size=MINI_BATCH)
    losses = []
    for iteration in range(iterations):
        data = collected(iteration)
        for _ in range(EPOCHS):
            with torch.no_grad():
                data = adv_module(data)
            data_buffer.extend(data.reshape(-1))
            for _ in range(FRAMES // MINI_BATCH):
                batch = data_buffer.sample()
                out = loss_module(batch)
                loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                optim.step()
                losses.append(float(loss))
    return losses


@pytest.mark.parametrize("swap", ["storage", "estimator", "both"])
def test_the_swap_learns_exactly_as_stock(swap):
    stock = train(LazyTensorStorage, TorchRLGAE)
    ours = train(FastTensorStorage if swap != "estimator" else LazyTensorStorage,
                 GAE if swap != "storage" else TorchRLGAE)
    assert len(ours) == len(stock) == 2 * EPOCHS * FRAMES // MINI_BATCH
    assert ours == pytest.approx(stock, rel=1e-4, abs=1e-5)
