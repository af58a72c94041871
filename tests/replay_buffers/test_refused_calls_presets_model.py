"""All-or-nothing calls of the presets, the frame-deduplicating ring and the demo store.

The same idea as ``test_refused_calls_model.py`` for the components with calls of their own:
velora's buffer (``add``/``add_multi``/``save``/``load``), HARL's off-policy buffer (per-env
n-step rings), :class:`DedupEnvRingStorage` (frame stacks that must continue each env's stream)
and PPO+D's :class:`DemoStore` (``track``, ``add_supplementary_demos``, ``load_state_dict``).
Valid calls keep each one in use; before every invalid call everything observable is snapshot,
the call must raise ``ValueError`` or ``TypeError``, and the snapshot after it must equal the
one before.
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
from torchrl_ext.demos import DemoStore
from torchrl_ext.presets import harl_off_policy_buffer, velora_replay_buffer
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler
from torchrl_ext.storages import DedupEnvRingStorage

pytestmark = pytest.mark.soak

ENVS, LENGTH, STACK = 2, 5, 2
KINDS = ["velora", "harl", "dedup", "demos"]


def snapshot(target) -> dict:
    if isinstance(target, DemoStore):
        return freeze(target.state_dict())
    return freeze({"len": len(target), "storage": target.storage.state_dict(),
                   "writer": target.writer.state_dict(), "sampler": target.sampler.state_dict()})


class PresetRefusedCallsMachine(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0.0
        self.frames = [[0.0] * STACK for _ in range(ENVS)]  # each env's current frame stack
        self.steps = [0] * ENVS  # steps tracked per env by the demo store

    @initialize(kind=st.sampled_from(KINDS))
    def build(self, kind: str) -> None:
        self.kind = kind
        self.target = self._new()

    def _new(self):
        if self.kind == "velora":
            return velora_replay_buffer(4, state_dim=2, action_dim=1, hidden_dim=3, batch_size=2)
        if self.kind == "harl":
            return harl_off_policy_buffer(8, ENVS, batch_size=3, n_step=2, gamma=0.5)
        if self.kind == "dedup":
            storage = DedupEnvRingStorage(ENVS, LENGTH, obs_key="pixels", num_stack=STACK)
            return EnvRingReplayBuffer(storage=storage, sampler=TrajectorySampler(1))
        return DemoStore(rho=0.3, phi=0.3, capacity=3, generator=torch.Generator().manual_seed(0),
                         id_factory=self._new_id)

    def _new_id(self) -> str:
        self.counter += 1
        return f"demo-{self.counter:g}"

    def refused(self, call) -> None:
        assert_refused(lambda: snapshot(self.target), call)

    # ------------------------------------------------------------------ batches
    def _velora_args(self, n: int, state_dim: int = 2):
        self.counter += 1
        x = torch.full((n, state_dim), self.counter)
        return x, torch.ones(n, 1), torch.ones(n), x + 1, torch.zeros(n), torch.zeros(n, 3)

    def _harl_step(self, dtype: torch.dtype = torch.float32, width: int = 5) -> TensorDict:
        self.counter += 1
        state = torch.full((ENVS, width), self.counter, dtype=torch.float64).to(dtype)
        return TensorDict({"state": state, "next": {
            "state": state + 1, "reward": torch.ones(ENVS, 1),
            "done": torch.zeros(ENVS, 1, dtype=torch.bool), "terminated": torch.zeros(ENVS, 1, dtype=torch.bool)}},
            [ENVS])

    def _dedup_step(self, *, done: bool = False, broken: bool = False) -> TensorDict:
        """One step per env whose stacks continue each env's stream (``broken``: env 1's does not)."""
        self.counter += 1
        pixels, following = [], []
        for env in range(ENVS):
            stack = self.frames[env]
            nxt = stack[1:] + [self.counter * 10 + env]
            pixels.append(torch.tensor(stack))
            following.append(torch.tensor(nxt))
        pixels = torch.stack(pixels)[..., None].expand(ENVS, STACK, 3).clone()  # [E, stack, 3]
        following = torch.stack(following)[..., None].expand(ENVS, STACK, 3).clone()
        if broken:
            pixels[1, -1] += 0.5
        return TensorDict({"pixels": pixels, "next": {
            "pixels": following, "done": torch.full((ENVS,), done)}}, [ENVS])

    def _dedup_advance(self, step: TensorDict) -> None:
        done = bool(step["next", "done"][0])
        for env in range(ENVS):
            newest = float(step["next", "pixels"][env, -1, 0])
            self.frames[env] = [newest] * STACK if done else self.frames[env][1:] + [newest]

    def _track(self, env: int, done: bool, **bad) -> tuple:
        self.counter += 1
        obs = bad.get("obs", torch.full((1, 2), self.counter))
        reward = bad.get("reward", torch.tensor([float(self.steps[env] % 2)]))
        return bad.get("ids", [env]), obs, torch.zeros(1, 1), reward, torch.tensor([self.counter / 10]), \
            torch.tensor([done])

    # ------------------------------------------------------------------ valid calls
    @rule(n=st.integers(1, 6), done=st.booleans())
    def write(self, n: int, done: bool) -> None:
        if self.kind == "velora":
            self.target.add_multi(*self._velora_args(n))
        elif self.kind == "harl":
            self.target.extend(self._harl_step())
        elif self.kind == "dedup":
            step = self._dedup_step(done=done)
            self.target.extend(step)
            self._dedup_advance(step)
        else:
            env = n % ENVS
            self.target.track(*self._track(env, done))
            self.steps[env] = 0 if done else self.steps[env] + 1

    @rule()
    def sample(self) -> None:
        if self.kind == "demos":
            source = self.target.sample_source()
            if source != "env":
                self.target.sample_demo(source)
        elif self.kind == "velora" and len(self.target) >= 2:
            self.target.sample(2)
        elif self.kind == "harl" and len(self.target) >= 3:  # batch_size=3
            self.target.sample()
        elif self.kind == "dedup" and int(self.target.storage.current_size.min()) > STACK:
            self.target.sample(2)

    @rule()
    def round_trip(self) -> None:
        restored = self._new()
        if self.kind == "demos":
            restored.load_state_dict(self.target.state_dict())
        elif self.kind == "velora":
            with tempfile.TemporaryDirectory() as folder:
                self.target.save(folder)
                restored.load(folder)
        elif len(self.target):
            with tempfile.TemporaryDirectory() as folder:
                self.target.dumps(folder)
                restored.loads(folder)
        else:
            return
        before, after = snapshot(self.target), snapshot(restored)
        if self.kind == "velora":  # velora's files keep position and size, not TorchRL's write counter
            before["writer"].pop("_write_count"), after["writer"].pop("_write_count")
        assert_same(before, after, "state after a round trip")
        self.target = restored

    # ------------------------------------------------------------------ refused calls
    @rule(bad=st.sampled_from(["width", "batch", "missing", "text"]))
    def velora_bad_rows(self, bad: str) -> None:
        if self.kind != "velora":
            return
        args = list(self._velora_args(3))
        if bad == "width":
            args[0] = torch.zeros(3, 5)
        elif bad == "batch":
            args[2] = torch.ones(2)
        elif bad == "missing":
            args[5] = None
        else:
            args[1] = "left"
        self.refused(lambda: self.target.add_multi(*args))
        if bad != "batch":  # one row of each argument is a valid transition then
            self.refused(lambda: self.target.add(*(a[0] if isinstance(a, torch.Tensor) else a for a in args)))

    @rule(kwargs=st.sampled_from([{"dtype": torch.float64}, {"width": 4}]))
    def harl_another_layout(self, kwargs: dict) -> None:
        if self.kind == "harl" and len(self.target):
            step = self._harl_step(**kwargs)
            self.refused(lambda: self.target.extend(step))

    @rule(ids=st.sampled_from([[0, 0], [0, ENVS], [-1, 0]]))
    def harl_bad_env_ids(self, ids: list[int]) -> None:
        if self.kind == "harl":
            step = self._harl_step()
            self.refused(lambda: self.target.extend(step, env_ids=ids))

    @rule(bad=st.sampled_from(["broken", "shape", "dtype"]))
    def dedup_bad_stream(self, bad: str) -> None:
        if self.kind != "dedup" or not len(self.target):
            return
        step = self._dedup_step(broken=bad == "broken")
        if bad == "shape":
            step = TensorDict({"pixels": step["pixels"][..., :2], "next": {
                "pixels": step["next", "pixels"][..., :2], "done": step["next", "done"]}}, [ENVS])
        elif bad == "dtype":
            step = step.apply(lambda x: x.double() if x.is_floating_point() else x)
        self.counter -= 1
        self.refused(lambda: self.target.extend(step))

    @rule(bad=st.sampled_from(["obs_shape", "reward_nan", "env", "rows"]))
    def demos_bad_step(self, bad: str) -> None:
        if self.kind != "demos":
            return
        env = 0
        if bad == "obs_shape" and self.target.running_length(env):
            args = self._track(env, True, obs=torch.zeros(1, 5))
        elif bad == "reward_nan":
            args = self._track(env, True, reward=torch.tensor([math.nan]))
        elif bad == "env":
            args = self._track(env, False, ids=[0, 1])
        elif bad == "rows":
            args = self._track(env, False, obs=torch.zeros(3, 2))
        else:
            return
        self.refused(lambda: self.target.track(*args))

    @rule(which=st.integers(0, 2))
    def demos_bad_supplementary(self, which: int) -> None:
        if self.kind != "demos":
            return
        good = {"observation": torch.zeros(2, 2), "action": torch.zeros(2, 1), "reward": torch.full((2,), 1e6)}
        bad = {"observation": torch.zeros(2, 2), "action": torch.zeros(3, 1), "reward": torch.ones(2)}
        demos = [good, good, good]
        demos[which] = bad
        self.refused(lambda: self.target.add_supplementary_demos(demos))

    @rule(damage=st.sampled_from(["missing", "tensor", "meta"]))
    def demos_bad_state(self, damage: str) -> None:
        if self.kind != "demos":
            return
        state = self.target.state_dict()
        if damage == "missing":
            del state["value_demos"]
        elif damage == "tensor":
            state["reward_demos"]["observation"] = ["not a tensor"] * len(state["reward_demos"]["meta"])
            state["rho"] = 0.05
            if not state["reward_demos"]["meta"]:
                state["running"]["env"] = [*state["running"]["env"], ENVS + 5]  # a run without steps
        else:
            state["rho"] = 0.05
            state["value_demos"]["meta"] = [{"id": "x"}] * (len(state["value_demos"]["meta"]) + 1)
        self.refused(lambda: self.target.load_state_dict(state))

    @rule(where=st.sampled_from(["first", "largest"]))
    def load_a_damaged_checkpoint(self, where: str) -> None:
        if self.kind in ("demos",) or not len(self.target):
            return
        velora = self.kind == "velora"
        with damaged_checkpoint(self.target.save if velora else self.target.dumps, where) as folder:
            self.refused(lambda: (self.target.load if velora else self.target.loads)(folder))


TestPresetRefusedCalls = PresetRefusedCallsMachine.TestCase
TestPresetRefusedCalls.settings = machine_settings(step_count=25)
