"""EnvRingWriter: env-id routing, [N, T] writes, dequeue / remove / clear, blocking writes."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.replay_buffers import EnvRingReplayBuffer
from torchrl_ext.samplers import TrajectorySampler


def block(env_ids, first_values, length) -> TensorDict:
    """[N, T] steps: env i gets x = first_values[i] + t."""
    first = torch.as_tensor(first_values, dtype=torch.float32).unsqueeze(1)
    x = first + torch.arange(length, dtype=torch.float32)
    n = x.shape[0]
    return TensorDict({"x": x, "env_id": torch.as_tensor(env_ids).unsqueeze(1).expand(n, length)},
                      [n, length])


def one_step(env_ids, values) -> TensorDict:
    return TensorDict({"x": torch.as_tensor(values, dtype=torch.float32)}, [len(values)]).set(
        "env_id", torch.as_tensor(env_ids))


def test_time_blocks_wrap_around_each_ring():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=5)
    index = rb.extend(block([1], [10], 3))
    assert index.tolist() == [[1, 0], [1, 1], [1, 2]]
    index = rb.extend(block([1, 0], [13, 0], 4))
    # env 1 continues at position 3 (slots 3, 4, 0, 1); env 0 starts at 0.
    assert index.tolist() == [[1, 3], [1, 4], [1, 5], [1, 6], [0, 0], [0, 1], [0, 2], [0, 3]]
    assert rb.storage.current_pos.tolist() == [4, 7]
    assert rb.storage.current_size.tolist() == [4, 5]
    assert rb.storage._rings.data["x"][1].tolist() == [15.0, 16.0, 12.0, 13.0, 14.0]
    data, _ = rb.storage.read(torch.tensor([1] * 5), torch.arange(2, 7)), None
    assert data["x"].tolist() == [12.0, 13.0, 14.0, 15.0, 16.0]


def test_env_ids_argument_and_index_entry():
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    data = TensorDict({"x": torch.tensor([1.0, 2.0])}, [2])
    rb.extend(data, env_ids=[2, 0])
    assert rb.storage.current_size.tolist() == [1, 0, 1]
    assert "env_id" not in data.keys()  # the caller's batch is not given an env id entry
    assert rb.write_count == 2
    # Without ids, the batch must hold every env in order.
    index = rb.extend(TensorDict({"x": torch.tensor([5.0, 6.0, 7.0])}, [3]))
    assert index.tolist() == [[0, 1], [1, 0], [2, 1]]


@pytest.mark.parametrize(
    "env_ids, message",
    [
        ([0, 0], r"env ids must be distinct within one write, got \[0\] more than once"),
        ([0, 3], r"env id 3 is out of range; env ids must lie in \[0, 2\]"),
        ([-1, 0], "env id -1 is out of range"),
    ],
)
def test_bad_env_ids_raise_and_write_nothing(env_ids, message):
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    rb.extend(one_step([1], [1.0]))
    before = rb.storage._rings.data["x"].clone()
    with pytest.raises(ValueError, match=message):
        rb.extend(one_step(env_ids, [8.0, 9.0]))
    assert torch.equal(rb.storage._rings.data["x"], before)
    assert rb.storage.current_pos.tolist() == [0, 1, 0] and rb.write_count == 1


def test_other_bad_batches():
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    with pytest.raises(ValueError, match=r"data has no 'env_id' entry and 2 rows, but the storage has num_envs=3"):
        rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    with pytest.raises(TypeError, match="must hold integer env ids, got dtype=torch.float32"):
        rb.extend(TensorDict({"x": torch.zeros(2), "env_id": torch.tensor([0.0, 1.0])}, [2]))
    with pytest.raises(ValueError, match="holds 5 steps per env but each ring keeps max_length=4"):
        rb.extend(block([0], [0], 5))
    changing = block([0, 1], [0, 0], 2)
    changing["env_id"] = torch.tensor([[0, 2], [1, 1]])
    with pytest.raises(ValueError, match="changes along time"):
        rb.extend(changing)
    with pytest.raises(ValueError, match=r"batch size \[N\] \(one step per env\) or \[N, T\]"):
        rb.extend(TensorDict({"x": torch.zeros(3, 1, 1)}, [3, 1, 1]))
    assert len(rb) == 0 and rb.write_count == 0


def test_dequeue_returns_the_oldest_steps_and_frees_room():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=4)
    rb.extend(block([0, 1], [0, 100], 4))
    rb.extend(block([0, 1], [4, 104], 2))  # slots now hold 4, 5, 2, 3 (env 0)
    out = rb.dequeue(2, env_ids=[1])
    assert out.batch_size == torch.Size([1, 2]) and out["x"].tolist() == [[102.0, 103.0]]
    assert rb.storage.current_size.tolist() == [4, 2]
    assert rb.storage.current_pos.tolist() == [6, 6]
    assert rb.dequeue(1)["x"].tolist() == [[2.0], [104.0]]
    with pytest.raises(ValueError, match="cannot dequeue n=2 steps: env 1 holds only 1"):
        rb.dequeue(2)
    assert rb.storage.current_size.tolist() == [3, 1]  # unchanged by the failed call
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        rb.dequeue(0)


def test_remove_up_to_works_on_env_subsets():
    # ALF raises a shape error for a subset (its bug Q10).
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    rb.extend(block([0, 1, 2], [0, 10, 20], 3))
    rb.remove_up_to(2, env_ids=[0, 2])
    assert rb.storage.current_size.tolist() == [1, 3, 1]
    rb.remove_up_to(5, env_ids=[1])
    assert rb.storage.current_size.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        rb.remove_up_to(-1)


def test_clear_resets_positions_of_the_given_envs():
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4)
    rb.extend(block([0, 1, 2], [0, 10, 20], 3))
    rb.clear(env_ids=[1])
    assert rb.storage.current_pos.tolist() == [3, 0, 3]
    assert rb.storage.current_size.tolist() == [3, 0, 3]
    rb.empty()
    assert len(rb) == 0 and rb.write_count == 0


def _extend_in_thread(rb, data, results, **kwargs):
    def run():
        results.append(rb.extend(data, blocking=True, **kwargs))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_blocking_extend_waits_for_dequeue_without_stalling_samplers():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3,
                             sampler=TrajectorySampler(batch_length=2))
    rb.extend(block([0, 1], [0, 10], 3))  # both rings full
    results = []
    thread = _extend_in_thread(rb, one_step([0], [3.0]), results)
    time.sleep(0.2)
    assert thread.is_alive() and results == []
    # The waiting producer holds no lock: sampling and reading still work.
    assert rb.sample(4).shape == torch.Size([4, 2])
    assert rb.storage.current_pos.tolist() == [3, 3]
    assert rb.dequeue(1, env_ids=[0])["x"].tolist() == [[0.0]]
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert results[0].tolist() == [[0, 3]]
    assert rb.storage.read(torch.tensor([0]), torch.tensor([3]))["x"].tolist() == [3.0]


def test_blocking_extend_wakes_on_clear_and_returns_none_on_stop():
    rb = EnvRingReplayBuffer(num_envs=1, max_length=2)
    rb.extend(block([0], [0], 2))
    results = []
    thread = _extend_in_thread(rb, one_step([0], [7.0]), results)
    time.sleep(0.1)
    rb.clear()
    thread.join(timeout=5)
    assert results[0].tolist() == [[0, 0]]
    rb.extend(block([0], [0], 2))
    thread = _extend_in_thread(rb, one_step([0], [9.0]), results)
    time.sleep(0.1)
    rb.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and results[1] is None
    # After the clear: 7.0 went to position 0 (slot 0), then positions 1, 2
    # took 0.0 (slot 1) and 1.0 (slot 0); the stopped write changed nothing.
    assert rb.storage._rings.data["x"][0].tolist() == [1.0, 0.0]
    rb.revive()
    rb.dequeue(1)
    assert rb.extend(one_step([0], [5.0]), blocking=True).tolist() == [[0, 3]]


def test_blocking_extend_times_out_with_a_clear_error():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=2)
    rb.extend(block([0, 1], [0, 0], 2))
    with pytest.raises(TimeoutError, match=r"no room for 1 step\(s\) in envs \[1\] after 0.05 s"):
        rb.extend(one_step([1], [5.0]), blocking=True, timeout=0.05)
    assert rb.storage._rings.data["x"][1].tolist() == [0.0, 1.0]


def test_blocking_extend_with_room_writes_at_once():
    rb = EnvRingReplayBuffer(num_envs=2, max_length=2)
    assert rb.extend(one_step([1], [5.0]), blocking=True).tolist() == [[1, 0]]


def test_writer_pickles_without_its_condition():
    import pickle

    rb = EnvRingReplayBuffer(num_envs=2, max_length=2)
    rb.extend(one_step([0], [1.0]))
    writer = pickle.loads(pickle.dumps(rb._writer))
    assert writer._write_count == 1
    writer.notify_room()  # a fresh condition works


@pytest.mark.parametrize("timeout", [None, 0.05])
def test_a_blocking_extend_of_more_steps_than_a_ring_holds_is_refused_at_once(timeout):
    # Was: with timeout=None it waited forever (even after clear()), with a timeout it
    # raised a misleading TimeoutError; the non-blocking write refuses it at once.
    rb = EnvRingReplayBuffer(num_envs=2, max_length=3)
    rb.extend(block([0, 1], [0, 10], 2))
    rb.clear()
    results, errors = [], []

    def run():
        try:
            results.append(rb.extend(block([0, 1], [0, 10], 4), blocking=True, timeout=timeout))
        except ValueError as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "the blocking write waited for room it can never get"
    assert results == [] and len(errors) == 1
    assert "data holds 4 steps per env but each ring keeps max_length=3" in str(errors[0])
    assert len(rb) == 0
    with pytest.raises(ValueError, match="data holds 4 steps per env but each ring keeps max_length=3"):
        rb.extend(block([0, 1], [0, 10], 4))
