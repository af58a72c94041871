"""Naive and chunked recurrent minibatch samplers over a RolloutStorage, model-based.

A hypothesis state machine fills a ``[T + 1, N]`` rollout (``rb.extend`` of
``[N, L]`` blocks, ``after_update``) and runs epochs of
``NaiveRecurrentMinibatchSampler`` or ``ChunkedRecurrentMinibatchSampler``
(``num_mini_batch`` or ``mini_batch_size``, ``drop_last`` or not), sometimes
checkpointing buffer and sampler mid-epoch. The model is the documented
contract over the ``step`` filled steps of each of the ``N`` threads:

* naive: a unit is one thread's whole sequence, minibatches ``[k, step]``;
* chunked: a unit is ``data_chunk_length`` consecutive steps of one thread,
  starting at a multiple of the chunk length (never crossing threads),
  minibatches ``[k, L]``; a chunk length that does not divide ``step`` raises;
* every unit appears exactly once per epoch (``drop_last=False``: sizes differ
  by at most one with ``num_mini_batch``, full batches then the remainder with
  ``mini_batch_size``; ``drop_last=True``: equal sizes, leftovers unused);
* each minibatch holds the data the model stored at those ``(t, thread)``;
* a buffer restored from ``state_dict`` mid-epoch yields exactly the
  remaining minibatches of the same epoch.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from tests._hypothesis import machine_settings
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import ChunkedRecurrentMinibatchSampler, NaiveRecurrentMinibatchSampler
from torchrl_ext.storages import RolloutStorage

pytestmark = pytest.mark.soak  # `make test-soak` reruns it with TORCHRL_EXT_SOAK examples


class MinibatchModel:
    """Action uid of each filled ``(t, thread)`` and the expected units of an epoch."""

    def __init__(self, num_steps: int, num_envs: int) -> None:
        self.T, self.N = num_steps, num_envs
        self.action = [[0] * num_envs for _ in range(num_steps)]
        self.step = 0

    def write(self, uids: list[list[int]]) -> None:
        """``uids[t][n]``: the action uid of thread ``n`` at the next ``len(uids)`` steps."""
        for row in uids:
            self.action[self.step] = list(row)
            self.step += 1

    def units(self, chunk: int | None) -> list[tuple[int, tuple[int, ...]]]:
        """``(thread, steps)`` of every unit: whole sequences, or chunks of ``chunk`` steps."""
        if chunk is None:
            return [(n, tuple(range(self.step))) for n in range(self.N)]
        return [(n, tuple(range(t0, t0 + chunk))) for n in range(self.N)
                for t0 in range(0, self.step, chunk)]


class MinibatchMachine(RuleBasedStateMachine):
    @initialize(
        num_steps=st.integers(1, 6),
        num_envs=st.integers(1, 4),
        chunked=st.booleans(),
        chunk=st.integers(1, 3),
        split=st.one_of(st.integers(1, 5).map(lambda k: ("num", k)),
                        st.integers(1, 5).map(lambda k: ("size", k))),
        drop_last=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def build(self, num_steps, num_envs, chunked, chunk, split, drop_last, seed) -> None:
        self.T, self.N, self.split, self.drop_last, self.seed = num_steps, num_envs, split, drop_last, seed
        self.chunk = chunk if chunked else None
        self.rb = self._new_buffer()
        self.model = MinibatchModel(num_steps, num_envs)
        self.uid = 1

    def _new_buffer(self) -> TensorDictReplayBuffer:
        kind, k = self.split
        kwargs = {"num_mini_batch": k} if kind == "num" else {"mini_batch_size": k}
        if self.chunk is None:
            sampler = NaiveRecurrentMinibatchSampler(drop_last=self.drop_last, **kwargs)
        else:
            sampler = ChunkedRecurrentMinibatchSampler(data_chunk_length=self.chunk,
                                                       drop_last=self.drop_last, **kwargs)
        sampler._rng = torch.Generator().manual_seed(self.seed)
        return TensorDictReplayBuffer(storage=RolloutStorage(self.T), sampler=sampler)

    # ------------------------------------------------------------------ writes
    @precondition(lambda self: self.model.step < self.T)
    @rule(data=st.data())
    def extend(self, data) -> None:
        length = data.draw(st.integers(1, self.T - self.model.step), label="L")
        uids = [list(range(self.uid + t * self.N, self.uid + (t + 1) * self.N)) for t in range(length)]
        self.uid += length * self.N
        action = torch.tensor(uids, dtype=torch.int64)  # [L, N]
        td = TensorDict({"observation": action.float().unsqueeze(-1), "action": action,
                         "next": {"observation": action.float().unsqueeze(-1) + 0.5}}, [length, self.N])
        self.rb.extend(td.transpose(0, 1))  # a collector's [N, L]
        self.model.write(uids)

    @rule()
    def after_update(self) -> None:
        self.rb.storage.after_update()
        self.model.step = 0

    # ------------------------------------------------------------------ epochs
    def _check_batch(self, out: TensorDict, info: dict) -> list[tuple[int, tuple[int, ...]]]:
        m = self.model
        time, thread = info["index"]
        width = m.step if self.chunk is None else self.chunk
        assert time.shape == thread.shape and time.shape[1] == width
        assert out["action"].shape == time.shape
        units = []
        for b in range(time.shape[0]):
            threads = set(thread[b].tolist())
            assert len(threads) == 1  # never crosses a thread
            n = threads.pop()
            steps = tuple(time[b].tolist())
            assert steps == tuple(range(steps[0], steps[0] + width))  # consecutive steps
            if self.chunk is not None:
                assert steps[0] % self.chunk == 0
            assert out["action"][b].tolist() == [m.action[t][n] for t in steps]
            units.append((n, steps))
        return units

    @precondition(lambda self: self.model.step > 0)
    @rule(checkpoint_after=st.one_of(st.none(), st.integers(0, 3)))
    def epoch(self, checkpoint_after: int | None) -> None:
        m = self.model
        kind, k = self.split
        expected = m.units(self.chunk)
        count = len(expected)
        self.rb.sampler._empty()  # a fresh epoch
        if self.chunk is not None and m.step % self.chunk:
            with pytest.raises(ValueError, match="data_chunk_length"):
                self.rb.sample()
            return
        if kind == "num" and k > count:
            with pytest.raises(ValueError, match="num_mini_batch"):
                self.rb.sample()
            return
        if kind == "size" and k > count and self.drop_last:
            with pytest.raises(ValueError, match="drop_last"):
                self.rb.sample()
            return
        seen, sizes, twin = [], [], None
        while True:
            if checkpoint_after is not None and len(sizes) == checkpoint_after:
                fresh = self._new_buffer()
                fresh.load_state_dict(self.rb.state_dict())
                # Mid-epoch, the original keeps going alongside; before the first batch
                # the epoch has not begun (its permutation is drawn later).
                twin = self.rb if sizes else None
                self.rb = fresh
            out, info = self.rb.sample(return_info=True)
            units = self._check_batch(out, info)
            if twin is not None:
                _, twin_info = twin.sample(return_info=True)
                assert [t.tolist() for t in twin_info["index"]] == [t.tolist() for t in info["index"]]
            seen += units
            sizes.append(len(units))
            if self.rb.sampler.ran_out:
                break
            assert len(sizes) <= count
        if twin is not None:
            assert twin.sampler.ran_out
        self.rb.sampler.ran_out = False
        assert len(seen) == len(set(seen))  # each unit at most once
        assert set(seen) <= set(expected)
        if kind == "num":
            assert len(sizes) == k
            if self.drop_last:
                assert sizes == [count // k] * k
            else:
                assert max(sizes) - min(sizes) <= 1
        else:
            full = [k] * (count // k)
            assert sizes == (full if self.drop_last else full + ([count % k] if count % k else []))
        if not self.drop_last:
            assert sorted(seen) == sorted(expected)  # every unit exactly once

    @invariant()
    def storage_step_matches(self) -> None:
        if hasattr(self, "rb"):
            assert self.rb.storage.step == self.model.step


MinibatchMachine.TestCase.settings = machine_settings(max_examples=20)
TestMinibatchMachine = MinibatchMachine.TestCase
