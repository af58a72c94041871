"""All-or-nothing calls of the on-policy buffers: a refused call leaves the buffer as it was.

The same idea as ``test_refused_calls_model.py`` for the rollout buffers, whose calls are
their own: ``OnPolicyReplayBuffer`` and ``VTraceReplayBuffer`` (``insert``,
``compute_returns``, ``generate_batches``, ``after_update``, ``update_storage_parameter``) and
l2r's ``PathGAEReplayBuffer`` (``store``, ``finish_path``, ``sample_batch``). Valid calls keep
the rollout moving (partly filled, full, with truncated steps, after returns and updates,
reloaded); before each invalid call everything observable is snapshot (stored steps and
derived entries, counters, parameters, normalizer and extra state), the call must raise
``ValueError`` or ``TypeError``, and the snapshot after it must equal the one before.
"""
from __future__ import annotations

import math
import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from tensordict import TensorDict

from tests._hypothesis import machine_settings
from tests.test_errors import assert_refused, assert_same, damaged_checkpoint, freeze
from torchrl_ext.presets import l2r_ppo_buffer
from torchrl_ext.replay_buffers.on_policy import OnPolicyReplayBuffer, VTraceReplayBuffer

pytestmark = pytest.mark.soak

STEPS, ENVS, PATH_SIZE = 4, 2, 6
KINDS = ["on_policy", "vtrace", "l2r_ppo"]


def rollout_step(value: float, *, truncated: bool = False, dtype: torch.dtype = torch.float32,
                 width: int = 1) -> TensorDict:
    """One collector step ``[ENVS]`` (env 0 truncates when ``truncated``)."""
    obs = torch.full((ENVS, width), value, dtype=torch.float64).to(dtype)
    done = torch.zeros(ENVS, 1, dtype=torch.bool)
    done[0] = truncated
    return TensorDict({
        "observation": obs, "state_value": torch.full((ENVS, 1), value / 100),
        "action_log_prob": torch.full((ENVS,), -value / 1000),
        "next": {"observation": obs + 1, "reward": torch.ones(ENVS, 1), "done": done,
                 "terminated": torch.zeros(ENVS, 1, dtype=torch.bool)},
    }, [ENVS])


def path_step(value: float, *, dtype: torch.dtype = torch.float32, width: int = 1) -> TensorDict:
    obs = torch.full((1, width), value, dtype=torch.float64).to(dtype)
    return TensorDict({"observation": obs, "state_value": torch.full((1, 1), value / 100),
                       "next": {"reward": torch.ones(1, 1)}}, [1])


def critic(data):
    """A value network: ``V(obs) = mean(obs) / 100``, written where the buffers read it."""
    return data.set("state_value", data.get("observation").mean(-1, keepdim=True) / 100)


def snapshot(rb) -> dict:
    storage = rb.storage.state_dict()
    if isinstance(rb, OnPolicyReplayBuffer):  # the stored entries, in any order
        storage = {"step": storage["step"], "data": rb.storage._storage, "carry_keys": storage["carry_keys"],
                   "step_keys": sorted(map(str, storage["step_keys"]))}
    state = {"len": len(rb), "storage": storage, "writer": rb.writer.state_dict(),
             "sampler": rb.sampler.state_dict(), "extra": rb._extra_state()}
    for name in rb._parameters if hasattr(rb, "_parameters") else ("gamma", "lam", "eps"):
        state[name] = getattr(rb, name)
    return freeze(state)


class RolloutRefusedCallsMachine(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0.0

    @initialize(kind=st.sampled_from(KINDS))
    def build(self, kind: str) -> None:
        self.kind = kind
        self.rb = self._new_buffer()

    def _new_buffer(self):
        if self.kind == "on_policy":
            return OnPolicyReplayBuffer(STEPS, num_mini_batch=2)
        if self.kind == "vtrace":
            return VTraceReplayBuffer(STEPS, num_mini_batch=2)
        return l2r_ppo_buffer(obs_dim=1, act_dim=1, size=PATH_SIZE, batch_size=2)

    @property
    def rollout(self) -> bool:
        return self.kind != "l2r_ppo"

    def _step(self, **kwargs) -> TensorDict:
        self.counter += 1.0
        return (rollout_step if self.rollout else path_step)(self.counter, **kwargs)

    def _stored(self) -> int:
        return self.rb.storage.step if self.rollout else len(self.rb)

    def _truncated(self) -> bool:
        data = self.rb.storage.data[: self.rb.storage.step]
        return bool((data["next", "done"] & ~data["next", "terminated"]).any())

    def refused(self, call) -> None:
        assert_refused(lambda: snapshot(self.rb), call)

    # ------------------------------------------------------------------ valid calls
    @rule(truncated=st.booleans())
    def insert(self, truncated: bool) -> None:
        if not self.rollout:
            self.rb.store(self._step())
            return
        if self.rb.storage.step >= STEPS:
            self.rb.after_update()
        self.rb.insert(self._step(truncated=truncated))

    @rule()
    def compute_returns(self) -> None:
        if not self._stored():
            return
        if not self.rollout:
            self.rb.finish_path(0.5)
            return
        self.rb.compute_returns(critic, **({"refresh": critic} if self.kind == "vtrace" else {}))

    @rule()
    def sample(self) -> None:
        if not self.rollout:
            if bool(self.rb._finished[: len(self.rb)].any()):
                self.rb.sample_batch()
            return
        if self._stored():
            for _ in self.rb.generate_batches(num_mini_batch=1):
                pass

    @rule()
    def after_update(self) -> None:
        if self.rollout:
            self.rb.after_update()

    @rule(gamma=st.sampled_from([0.5, 0.9, 1.0]))
    def set_gamma(self, gamma: float) -> None:
        if self.rollout:
            self.rb.update_storage_parameter("gamma", gamma)

    def _saveable(self) -> bool:
        return self.rollout or len(self.rb) > 0  # TorchRL refuses to save an unwritten storage

    @rule()
    def round_trip(self) -> None:
        if not self._saveable():
            return
        restored = self._new_buffer()
        with tempfile.TemporaryDirectory() as folder:
            self.rb.dumps(folder)
            restored.loads(folder)
        if self.rollout:  # dumps saves the rollout, not the settings (the constructor's arguments)
            for name in self.rb._parameters:
                restored.update_storage_parameter(name, getattr(self.rb, name))
        assert_same(snapshot(self.rb), snapshot(restored), "state after a round trip")
        self.rb = restored

    # ------------------------------------------------------------------ refused calls
    @rule(kwargs=st.sampled_from([{"dtype": torch.float64}, {"dtype": torch.int64}, {"width": 3}]))
    def insert_another_layout(self, kwargs: dict) -> None:
        if not self._stored() or (self.rollout and self.rb.storage.step >= STEPS):
            return
        step = self._step(**kwargs)
        if self.rollout and "dtype" in kwargs:
            return  # a rollout casts, as TorchRL's storages do
        self.refused(lambda: self.rb.insert(step) if self.rollout else self.rb.store(step))

    @rule(key=st.sampled_from(["observation", ("next", "reward"), "state_value"]))
    def insert_without_a_key(self, key) -> None:
        if not self._stored() or (self.rollout and self.rb.storage.step >= STEPS):
            return
        step = self._step().exclude(key)
        self.refused(lambda: self.rb.insert(step) if self.rollout else self.rb.store(step))

    @rule(setting=st.sampled_from([("gamma", 1.5), ("gamma", math.nan), ("gae_lambda", -0.1),
                                   ("advantage_eps", math.inf), ("rho_thresh", 0.0), ("no_such", 1.0)]))
    def bad_parameter(self, setting: tuple[str, float]) -> None:
        if self.rollout:
            self.refused(lambda: self.rb.update_storage_parameter(*setting))

    @rule(bad=st.sampled_from(["shape", "nan", "missing"]))
    def bad_value_network(self, bad: str) -> None:
        """A critic or refresh that returns unusable values changes nothing."""
        if not self.rollout or not self._stored():
            return

        def broken(data):
            if bad == "shape":
                return data.set("state_value", torch.zeros(*data.shape, 3))
            if bad == "nan":
                return data.set("state_value", torch.full((*data.shape, 1), math.nan))
            return data.exclude("state_value")

        if self.kind == "vtrace":
            self.refused(lambda: self.rb.compute_returns(critic, refresh=broken))
        self.refused(lambda: self.rb.compute_returns(broken))

    @rule()
    def truncation_without_a_critic(self) -> None:
        if self.rollout and self._stored() and self._truncated():
            self.refused(lambda: self.rb.compute_returns())

    @rule(last_val=st.sampled_from([math.nan, math.inf, [1.0, 2.0], "0"]))
    def bad_last_value(self, last_val) -> None:
        if not self.rollout and self.rb._path_length:
            self.refused(lambda: self.rb.finish_path(last_val))

    @rule(n=st.sampled_from([0, -1, 2.5]))
    def bad_split(self, n) -> None:
        if self.rollout and self._stored():
            self.refused(lambda: list(self.rb.generate_batches(num_mini_batch=n)))

    @rule(where=st.sampled_from(["first", "largest"]))
    def load_a_damaged_checkpoint(self, where: str) -> None:
        if not self._saveable():
            return
        with damaged_checkpoint(self.rb.dumps, where) as folder:
            self.refused(lambda: self.rb.loads(folder))


TestRolloutRefusedCalls = RolloutRefusedCallsMachine.TestCase
TestRolloutRefusedCalls.settings = machine_settings(step_count=25)
