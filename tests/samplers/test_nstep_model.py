"""NStepSampler under random call sequences, against a plain float64 walk of each env's history.

A hypothesis state machine writes steps of random env subsets (random rewards and episode
ends), changes ``n_step``, ``gamma`` and the reward key between samples, empties the
buffer, and round-trips it through ``state_dict`` and ``dumps``/``loads``. Every sample's
chains are checked against :func:`tests.samplers.test_nstep.reference`: a Python walk
(float64) of the stored stream that stops at an episode end, at the newest step or after
``n_step`` steps.
"""
from __future__ import annotations

import random
import tempfile

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tests._hypothesis import machine_settings
from tests.samplers.test_nstep import reference, transition
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import NStepSampler

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

NUM_ENVS, MAX_LENGTH = 3, 6


class NStepMachine(RuleBasedStateMachine):
    @initialize(n_step=st.integers(1, 4), gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]), seed=st.integers(0, 999))
    def build(self, n_step: int, gamma: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rb = self._new_buffer(n_step, gamma)
        self.history: list[list[tuple]] = [[] for _ in range(NUM_ENVS)]
        self.obs = [float(1000 * e) for e in range(NUM_ENVS)]
        self.bonus = False  # reward_key switched to ("next", "bonus") = 10 * reward

    def _new_buffer(self, n_step: int, gamma: float) -> EnvRingReplayBuffer:
        sampler = NStepSampler(n_step, gamma)
        return EnvRingReplayBuffer(num_envs=NUM_ENVS, max_length=MAX_LENGTH, sampler=sampler,
                                   generator=torch.Generator().manual_seed(self.rng.randrange(1000)))

    @property
    def sampler(self) -> NStepSampler:
        return self.rb.sampler

    @rule(envs=st.sets(st.integers(0, NUM_ENVS - 1), min_size=1))
    def write(self, envs: set[int]) -> None:
        envs = sorted(envs)
        rows = []
        for e in envs:
            done = self.rng.random() < 0.25
            nxt = self.obs[e] + 1
            row = (self.obs[e], nxt, round(self.rng.uniform(-1, 1), 3), done)
            self.history[e].append(row)
            rows.append(row)
            self.obs[e] = nxt + 100 if done else nxt
        data = transition(*[list(c) for c in zip(*rows)])
        data["next", "bonus"] = data["next", "reward"] * 10
        self.rb.extend(data, env_ids=envs)

    @rule(n_step=st.integers(1, 4))
    def set_n_step(self, n_step: int) -> None:
        self.sampler.n_step = n_step

    @rule(gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    def set_gamma(self, gamma: float) -> None:
        self.sampler.gamma = gamma

    @rule()
    def switch_reward_key(self) -> None:
        self.bonus = not self.bonus
        self.sampler.reward_key = ("next", "bonus") if self.bonus else ("next", "reward")

    @rule()
    def empty(self) -> None:
        self.rb.empty()
        self.history = [[] for _ in range(NUM_ENVS)]

    @rule(files=st.booleans())
    def round_trip(self, files: bool) -> None:
        old = self.rb
        new = self._new_buffer(old.sampler.n_step, old.sampler.gamma)
        new.sampler.reward_key = old.sampler.reward_key
        if files:
            with tempfile.TemporaryDirectory() as folder:
                old.dumps(folder)
                new.loads(folder)
        else:
            new.load_state_dict(old.state_dict())
        self.rb = new

    @precondition(lambda self: len(self.rb) > 0)
    @rule()
    def sample(self) -> None:
        count = min(16, len(self.rb))
        batch = self.rb.sample(count)
        storage, n_step, gamma = self.rb.storage, self.sampler.n_step, self.sampler.gamma
        key = self.sampler.reward_key
        scale = 10.0 if self.bonus else 1.0
        for i in range(count):
            env, start, end = batch["index"][i].tolist()
            newest = int(storage.current_pos[env]) - 1
            assert int(storage.earliest_position()[env]) <= start <= end <= newest
            want_reward, want_next, want_done, steps = reference(self.history, env, start, n_step, gamma, newest)
            assert batch["observation"][i, 0] == self.history[env][start][0]
            assert batch["next", "observation"][i, 0] == want_next
            assert bool(batch["next", "done"][i, 0]) == want_done
            assert batch["steps_to_next_obs"][i, 0] == steps == end - start + 1
            assert batch[key][i, 0].item() == pytest.approx(scale * want_reward, abs=1e-4)
            assert batch["nstep_discount"][i, 0].item() == pytest.approx(gamma ** steps, rel=1e-6, abs=1e-12)


TestNStepMachine = NStepMachine.TestCase
TestNStepMachine.settings = machine_settings(step_count=30)
