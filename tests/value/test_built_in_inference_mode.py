"""Value components built inside ``torch.inference_mode()`` work outside it.

Their buffers are updated in place (``update``, ``load_state_dict``); made inside inference
mode they would be inference tensors, which no in-place update outside it may touch, so every
later update outside it failed. Each case is compared with the same component built outside.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.modules import ProbabilisticActor

from torchrl_ext.value import GAE, TDLambda, VTrace
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer, RunningMeanStd, ValueNorm

NORMALIZERS = {
    "ValueNorm": (lambda: ValueNorm(1, beta=0.9), lambda m, x: m.update(x)),
    "ValueNorm-per-element": (lambda: ValueNorm(1, beta=0.9, per_element_update=True), lambda m, x: m.update(x)),
    "RunningMeanStd": (lambda: RunningMeanStd((1,)), lambda m, x: m.update(x)),
    "Intrinsic-backward": (lambda: IntrinsicRewardNormalizer(0.9), lambda m, x: m(x.view(4, 2))),
    "Intrinsic-forward": (lambda: IntrinsicRewardNormalizer(0.9, mode="forward"), lambda m, x: m(x.view(4, 2))),
}


@pytest.mark.parametrize("name", list(NORMALIZERS))
def test_a_normalizer_built_inside_inference_mode_updates_outside_it(name):
    make, use = NORMALIZERS[name]
    with torch.inference_mode():
        inside = make()
    outside = make()
    assert not any(buffer.is_inference() for buffer in inside.buffers())
    batches = [torch.arange(8.0).view(8, 1), torch.linspace(-3.0, 5.0, 8).view(8, 1)]
    for x in batches:
        use(inside, x)
        use(outside, x)
    inside.load_state_dict(outside.state_dict())  # copies into the buffers in place
    for (key, mine), (_, reference) in zip(inside.state_dict().items(), outside.state_dict().items()):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0, msg=key)


def _critic():
    return TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])


def _actor():
    module = TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
                              in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal,
                              return_log_prob=True)


ESTIMATORS = {
    "GAE": lambda critic, actor: GAE(gamma=0.9, lmbda=0.8, value_network=critic),
    "TDLambda": lambda critic, actor: TDLambda(gamma=0.9, lmbda=0.8, value_network=critic),
    "VTrace": lambda critic, actor: VTrace(gamma=0.9, value_network=critic, actor_network=actor),
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_an_estimator_built_inside_inference_mode_loads_a_state_outside_it(name):
    critic, actor = _critic(), _actor()  # the user's networks, built outside
    with torch.inference_mode():
        inside = ESTIMATORS[name](critic, actor)
    outside = ESTIMATORS[name](critic, actor)
    outside.gamma.fill_(0.5)  # TorchRL's gamma buffer, as a checkpoint may hold it
    assert not any(buffer.is_inference() for buffer in inside.buffers())
    inside.load_state_dict(outside.state_dict())
    assert inside.gamma.item() == 0.5
    gen = torch.Generator().manual_seed(0)
    td = TensorDict({
        "observation": torch.randn(2, 5, 3, generator=gen),
        "next": {"observation": torch.randn(2, 5, 3, generator=gen), "reward": torch.randn(2, 5, 1, generator=gen),
                 "done": torch.zeros(2, 5, 1, dtype=torch.bool), "terminated": torch.zeros(2, 5, 1, dtype=torch.bool)},
    }, [2, 5])
    with torch.no_grad():
        td.update(actor(td.clone()).select("action", "action_log_prob"))
    if name == "TDLambda":
        torch.testing.assert_close(inside.value_estimate(td.clone()), outside.value_estimate(td.clone()))
    else:
        torch.testing.assert_close(inside(td.clone())["advantage"], outside(td.clone())["advantage"])
