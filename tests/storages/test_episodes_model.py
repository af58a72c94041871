"""EpisodicEnvRingStorage as a hypothesis state machine over the brute-force model of ``test_episodes.py``.

``test_episodes.py`` replays a few seeded random streams; here hypothesis
chooses (and shrinks) the streams: ``[N]`` writes of env subsets, ``[N, T]``
blocks (quiet stretches take the vectorised path), clears of env subsets,
dequeues, ``remove_up_to``, and ``state_dict`` / ``dumps``-``loads`` round trips
in the middle. After every step the episode begin of each stored position,
the steps to its episode end, the latest discount-0 position and the recorded
discounted return equal the model's (episode starts: ``step_type == FIRST``
or the first step written since creation or a clear; an episode's returns
are recorded when a step with discount 0 arrives).
"""
from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests._hypothesis import FileRoundTrip, machine_settings
from tests.storages import test_episodes as episodes
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.storages import EpisodicEnvRingStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

FIRST, MID, LAST = episodes.FIRST, episodes.MID, episodes.LAST
GAMMA, DEFAULT = 0.9, -50.0

REWARDS = st.integers(-200, 200).map(lambda r: r / 100)
STEPS = st.one_of(
    st.tuples(st.just(MID), st.just(1.0), REWARDS),  # most steps go on
    st.tuples(st.just(FIRST), st.just(1.0), REWARDS),
    st.tuples(st.just(LAST), st.just(0.0), REWARDS),  # terminal: returns recorded
    st.tuples(st.just(LAST), st.just(1.0), REWARDS),  # time limit: no return
    st.tuples(st.just(MID), st.just(0.0), REWARDS),  # life loss
)


class EpisodicMachine(FileRoundTrip, RuleBasedStateMachine):
    @initialize(num_envs=st.integers(1, 3), max_length=st.integers(2, 7), clip=st.booleans())
    def build(self, num_envs: int, max_length: int, clip: bool) -> None:
        self.E, self.L = num_envs, max_length
        self.clip = (-1.0, 1.5) if clip else None
        self.rb = self._new_buffer()
        self.model = episodes.Model(num_envs, max_length, GAMMA, self.clip, DEFAULT)

    def _new_buffer(self) -> EnvRingReplayBuffer:
        storage = EpisodicEnvRingStorage(self.E, self.L, record_episodic_return=True, gamma=GAMMA,
                                         reward_clip=self.clip, default_return=DEFAULT)
        return EnvRingReplayBuffer(storage=storage)

    def envs(self, data, min_size: int = 1) -> list[int]:
        return sorted(data.draw(st.lists(st.integers(0, self.E - 1), min_size=min_size,
                                         max_size=self.E, unique=True), label="env_ids"))

    # ------------------------------------------------------------------ writes
    @rule(data=st.data())
    def write_steps(self, data) -> None:
        envs = self.envs(data)
        steps = [data.draw(STEPS, label="step") for _ in envs]
        self.rb.extend(episodes.batch(envs, *zip(*steps)))
        for e, step in zip(envs, steps):
            self.model.add(e, *step)

    @rule(data=st.data())
    def write_block(self, data) -> None:
        envs = self.envs(data)
        length = data.draw(st.integers(2, self.L), label="T")
        quiet = data.draw(st.booleans(), label="quiet")
        step = st.tuples(st.just(MID), st.just(1.0), REWARDS) if quiet else STEPS
        rows = [[data.draw(step, label="step") for _ in range(length)] for _ in envs]
        self.rb.extend(episodes.batch(envs, *[[[s[i] for s in row] for row in rows] for i in range(3)]))
        for e, row in zip(envs, rows):
            for s in row:
                self.model.add(e, *s)

    @rule(data=st.data())
    def clear(self, data) -> None:
        envs = self.envs(data, min_size=0)
        self.rb.clear(env_ids=envs)
        for e in envs:
            self.model.clear(e)

    @rule(data=st.data())
    def dequeue(self, data) -> None:
        e = data.draw(st.integers(0, self.E - 1), label="env")
        if self.model.size[e] == 0:
            return
        n = data.draw(st.integers(1, self.model.size[e]), label="n")
        self.rb.dequeue(n, env_ids=[e])
        self.model.dequeue(e, n)

    @rule(data=st.data())
    def remove_up_to(self, data) -> None:
        envs = self.envs(data, min_size=0)
        n = data.draw(st.integers(0, self.L + 1), label="n")
        self.rb.remove_up_to(n, env_ids=envs)
        for e in envs:
            self.model.dequeue(e, min(n, self.model.size[e]))

    # ------------------------------------------------------------------ checkpoints
    # ------------------------------------------------------------------ invariant
    @invariant()
    def index_and_returns_match(self) -> None:
        episodes.check(self.rb.storage, self.model)
        assert self.rb.storage.current_size.tolist() == self.model.size
        assert self.rb.storage.current_pos.tolist() == [len(h) for h in self.model.hist]


EpisodicMachine.TestCase.settings = machine_settings()
TestEpisodicMachine = EpisodicMachine.TestCase
