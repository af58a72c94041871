"""DedupEnvRingStorage in an EnvRingReplayBuffer against a plain-Python frame-stream model.

A hypothesis state machine feeds env subsets (``[N]`` steps and ``[N, T]``
blocks) of small pixel-like frames with random dones to a
``DedupEnvRingStorage`` (``num_stack`` 1..3, ``stack_dim`` 0 or -1, ``"reset"``
or ``"zero"`` padding), dequeues with ``remove_up_to`` and round-trips the
buffer through ``state_dict`` and ``dumps``/``loads`` mid-run. The model is
the documented contract, kept as frame ids:

* ``obs`` of a step is the last ``num_stack`` frames of its episode up to the
  step, padded at the episode start with the episode's first frame
  (``"reset"``) or zeros (``"zero"``); ``("next", obs)`` is the same window
  shifted by one frame (the step's next frame appended); a ``done`` step ends
  the episode and the following step of the env starts a new one;
* a stored step is readable iff the oldest frame of its stack
  (``max(p - (num_stack - 1), episode begin)``) is still in its slot
  (``>= current_pos - max_length``); other stored steps raise ``ValueError``
  on ``get`` and steps that are no longer stored raise on ``read``.
"""
from __future__ import annotations


import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from tensordict import TensorDict

from tests._hypothesis import FileRoundTrip, machine_settings
from tests.storages.test_ring_model import subsets
from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.storages import DedupEnvRingStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples

FRAME_SHAPE = (2, 3)
ZERO = 0  # frame id of a zero padding frame (real frames are numbered from 1)


def frame(fid: int) -> torch.Tensor:
    """A pixel-like ``[2, 3]`` frame, distinct per id, exact in float32."""
    if fid == ZERO:
        return torch.zeros(FRAME_SHAPE)
    return (fid * 8 + torch.arange(6, dtype=torch.float32)).reshape(FRAME_SHAPE)


class DedupModel:
    """Per env: positions -> (obs frame ids, next frame ids, reward uid) and the ring counters."""

    def __init__(self, num_envs: int, max_length: int, num_stack: int, padding: str) -> None:
        self.E, self.L, self.S, self.padding = num_envs, max_length, num_stack, padding
        self.pos = [0] * num_envs
        self.size = [0] * num_envs
        self.steps: list[dict[int, tuple[list[int], list[int], bool]]] = [{} for _ in range(num_envs)]
        self.begin: list[dict[int, int]] = [{} for _ in range(num_envs)]
        self.episode: list[list[int]] = [[] for _ in range(num_envs)]  # frames of the current episode
        self.episode_begin = [0] * num_envs
        self.next_fid = 1

    def _new_frame(self) -> int:
        self.next_fid += 1
        return self.next_fid - 1

    def _window(self, frames: list[int]) -> list[int]:
        pad = frames[0] if self.padding == "reset" else ZERO
        padded = [pad] * (self.S - 1) + frames
        return padded[-self.S:]

    def step(self, e: int, done: bool) -> tuple[list[int], list[int]]:
        """One new step of env ``e``: its obs and next-obs frame ids (the stream an env would emit)."""
        if not self.episode[e]:
            self.episode[e] = [self._new_frame()]
            self.episode_begin[e] = self.pos[e]
        obs = self._window(self.episode[e])
        nxt_frames = self.episode[e] + [self._new_frame()]
        nxt = self._window(nxt_frames)
        p = self.pos[e]
        self.steps[e][p] = (obs, nxt, done)
        self.begin[e][p] = self.episode_begin[e]
        self.pos[e] += 1
        self.size[e] = min(self.size[e] + 1, self.L)
        if done:
            self.episode[e] = []
        else:
            self.episode[e] = nxt_frames
        return obs, nxt

    def earliest(self, e: int) -> int:
        return self.pos[e] - self.size[e]

    def readable(self, e: int, p: int) -> bool:
        oldest = max(p - (self.S - 1), self.begin[e][p])
        return oldest >= self.pos[e] - self.L

    def remove_up_to(self, n: int, env_ids: list[int]) -> None:
        for e in env_ids:
            self.size[e] -= min(n, self.size[e])


def stack_of(fids: list[int], stack_dim: int, num_stack: int) -> torch.Tensor:
    if num_stack == 1:
        return frame(fids[0])
    return torch.stack([frame(f) for f in fids], stack_dim)


class DedupMachine(FileRoundTrip, RuleBasedStateMachine):
    @initialize(num_envs=st.integers(1, 3), max_length=st.integers(1, 6), num_stack=st.integers(1, 3),
                stack_dim=st.sampled_from([0, -1]), padding=st.sampled_from(["reset", "zero"]))
    def build(self, num_envs: int, max_length: int, num_stack: int, stack_dim: int, padding: str) -> None:
        self.E, self.L, self.S, self.dim, self.padding = num_envs, max_length, num_stack, stack_dim, padding
        self.rb = self._new_buffer()
        self.model = DedupModel(num_envs, max_length, num_stack, padding)

    def _new_buffer(self) -> EnvRingReplayBuffer:
        storage = DedupEnvRingStorage(self.E, self.L, obs_key="pixels", num_stack=self.S,
                                      stack_dim=self.dim, padding=self.padding)
        return EnvRingReplayBuffer(storage=storage)

    @property
    def storage(self) -> DedupEnvRingStorage:
        return self.rb.storage

    # ------------------------------------------------------------------ writes and removals
    @rule(data=st.data())
    def extend(self, data) -> None:
        env_ids = sorted(data.draw(subsets(self.E, min_size=1), label="env_ids"))
        two_d = data.draw(st.booleans(), label="two_d")
        length = data.draw(st.integers(1, self.L), label="T") if two_d else 1
        obs, nxt, done = [], [], []
        for e in env_ids:
            flags = [data.draw(st.booleans() if data.draw(st.booleans(), label="rare") else st.just(False),
                               label="done") for _ in range(length)]
            rows = [self.model.step(e, d) for d in flags]
            obs.append(torch.stack([stack_of(o, self.dim, self.S) for o, _ in rows]))
            nxt.append(torch.stack([stack_of(n, self.dim, self.S) for _, n in rows]))
            done.append(torch.tensor(flags).unsqueeze(-1))
        td = TensorDict({"pixels": torch.stack(obs),
                         "next": {"pixels": torch.stack(nxt), "done": torch.stack(done)}},
                        [len(env_ids), length])
        if not two_d:
            td = td[:, 0]
        self.rb.extend(td, env_ids=torch.tensor(env_ids))

    @rule(data=st.data())
    def remove_up_to(self, data) -> None:
        env_ids = data.draw(subsets(self.E), label="env_ids")
        n = data.draw(st.integers(0, self.L), label="n")
        self.rb.remove_up_to(n, env_ids=env_ids)
        self.model.remove_up_to(n, env_ids)

    # ------------------------------------------------------------------ reads
    @rule(data=st.data())
    def read_by_env_and_position(self, data) -> None:
        m = self.model
        e = data.draw(st.integers(0, self.E - 1), label="env")
        if m.pos[e] == 0:
            return
        p = data.draw(st.integers(max(0, m.pos[e] - self.L - 2), m.pos[e] - 1), label="position")
        if p < m.earliest(e):
            with pytest.raises(ValueError, match="not stored"):
                self.rb.read(torch.tensor([e]), torch.tensor([p]))
            return
        if not m.readable(e, p):
            with pytest.raises(ValueError, match="overwritten"):
                self.rb.read(torch.tensor([e]), torch.tensor([p]))
            return
        out = self.rb.read(torch.tensor([e]), torch.tensor([p]))
        self._check_step(out[0], e, p)

    def _check_step(self, out: TensorDict, e: int, p: int) -> None:
        obs, nxt, done = self.model.steps[e][p]
        assert torch.equal(out["pixels"], stack_of(obs, self.dim, self.S)), (e, p, obs)
        assert torch.equal(out["next", "pixels"], stack_of(nxt, self.dim, self.S)), (e, p, nxt)
        assert bool(out["next", "done"].reshape(-1)[0]) == done

    # ------------------------------------------------------------------ invariants
    @invariant()
    def every_readable_step_rebuilds_whole(self) -> None:
        m = self.model
        if not hasattr(self, "rb"):
            return
        assert self.storage.current_pos.tolist() == m.pos
        assert self.storage.current_size.tolist() == m.size
        envs, positions = [], []
        for e in range(self.E):
            for p in range(m.earliest(e), m.pos[e]):
                if m.readable(e, p):
                    envs.append(e)
                    positions.append(p)
        if not envs:
            return
        out = self.storage.get((torch.tensor(envs), torch.tensor(positions)))
        for b, (e, p) in enumerate(zip(envs, positions)):
            self._check_step(out[b], e, p)

    @invariant()
    def stored_unreadable_steps_are_refused(self) -> None:
        m = self.model
        if not hasattr(self, "rb") or not self.storage.initialized:
            return
        for e in range(self.E):
            for p in range(m.earliest(e), m.pos[e]):
                if not m.readable(e, p):
                    with pytest.raises(ValueError, match="overwritten"):
                        self.storage.get((torch.tensor([e]), torch.tensor([p])))


DedupMachine.TestCase.settings = machine_settings(max_examples=20)
TestDedupMachine = DedupMachine.TestCase
