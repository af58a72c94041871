"""make_value_estimator: a refused call changes nothing; TorchRL's classes get the registry defaults."""
from __future__ import annotations

import pytest
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss, ValueEstimators
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import TD0Estimator, TDLambdaEstimator

from torchrl_ext.value import GAE, make_value_estimator


def _loss():
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
                         in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal, return_log_prob=True)
    return ClipPPOLoss(actor, ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"]))


@pytest.mark.parametrize("hyperparams, error, match", [
    (dict(lmbda=2.0), ValueError, r"lmbda must be a number in \[0, 1\], got lmbda=2.0"),
    (dict(gamma=1.5), ValueError, r"gamma must be a number in \[0, 1\], got gamma=1.5"),
    (dict(agent_dim="x"), TypeError, "agent_dim must be an int"),
])
@pytest.mark.parametrize("earlier", [True, False])
def test_a_refused_call_leaves_the_loss_as_it_was(hyperparams, error, match, earlier):
    """TorchRL's estimator (built for the wiring) does not stay in the loss when ours is refused."""
    loss = make_value_estimator(_loss(), GAE, gamma=0.99, lmbda=0.95) if earlier else _loss()
    before = loss._value_estimator, loss.value_type
    with pytest.raises(error, match=match):
        make_value_estimator(loss, GAE, **hyperparams)
    assert loss._value_estimator is before[0] and loss.value_type is before[1]
    if earlier:
        assert type(loss.value_estimator) is GAE and float(loss.value_estimator.lmbda) == pytest.approx(0.95)


@pytest.mark.parametrize("cls, value_type", [(TorchRLGAE, ValueEstimators.GAE),
                                             (TDLambdaEstimator, ValueEstimators.TDLambda),
                                             (TD0Estimator, ValueEstimators.TD0)])
def test_torchrl_classes_get_the_registry_defaults(cls, value_type):
    """As loss.make_value_estimator(ValueEstimators.X) builds TorchRL's class X."""
    reference = _loss()
    reference.make_value_estimator(value_type)
    loss = make_value_estimator(_loss(), cls)
    ours, theirs = loss.value_estimator, reference.value_estimator
    assert type(ours) is type(theirs) is cls
    assert float(ours.gamma) == float(theirs.gamma) == pytest.approx(0.99)
    assert float(getattr(ours, "lmbda", 0.0)) == float(getattr(theirs, "lmbda", 0.0))
    assert ours.differentiable is theirs.differentiable is True
