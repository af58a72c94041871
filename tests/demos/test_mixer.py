"""DemoMixer: demo replay on TorchRL steps, with a tiny fake env and policy."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext.demos import DemoMixer, DemoStore
from torchrl_ext.replay_buffers import OnPolicyReplayBuffer

N = 3


class FakeEnv:
    """Obs ``[env, t, episode]``; episodes of ``length`` steps, reward 1 on the last one."""

    def __init__(self, n: int = N, length: int = 4) -> None:
        self.n, self.length = n, length
        self.t = torch.zeros(n)
        self.episode = torch.zeros(n)
        self.resets = []

    def _obs(self) -> torch.Tensor:
        return torch.stack([torch.arange(self.n, dtype=torch.float32), self.t, self.episode], -1)

    def reset(self, mask: torch.Tensor | None = None) -> TensorDict:
        mask = torch.ones(self.n, dtype=torch.bool) if mask is None else mask
        self.resets.append(mask.clone())
        self.t[mask] = 0
        self.episode[mask] += 1
        flag = torch.zeros(self.n, 1, dtype=torch.bool)  # root flags, as TorchRL envs reset
        return TensorDict({"observation": self._obs(), "done": flag, "terminated": flag.clone()},
                          [self.n])

    def step(self, td: TensorDict) -> TensorDict:
        self.t += 1
        done = (self.t >= self.length).unsqueeze(-1)
        reward = done.float()
        td.set("next", TensorDict({"observation": self._obs(), "reward": reward, "done": done.clone(),
                                   "terminated": done.clone()}, [self.n]))
        return td


def policy(td: TensorDict, value: float = 0.5) -> TensorDict:
    n = td.shape[0]
    return td.update({"action": torch.tensor([[1.0, 0.0]]).expand(n, 2).clone(),
                      "action_log_prob": torch.full((n,), -0.69),
                      "state_value": torch.full((n, 1), value)})


def make_demo(tag: float, length: int = 3) -> dict:
    obs = torch.stack([torch.full((length,), -1.0), torch.arange(length, dtype=torch.float32),
                       torch.full((length,), tag)], -1)
    reward = torch.zeros(length)
    reward[-1] = 2.0
    return {"observation": obs, "action": torch.tensor([[0.0, 1.0]]).expand(length, 2).clone(),
            "reward": reward}


def run(mixer: DemoMixer, env: FakeEnv, steps: int, value: float = 0.5) -> list[dict]:
    """Drives the loop; returns per step the policy input, the stored step and the sources."""
    td = mixer.reset(env.reset())
    log = []
    for _ in range(steps):
        seen = td["observation"].clone()
        sources = list(mixer.sources)
        demo_steps = list(mixer._k)
        step = mixer.process(env.step(policy(td, value)))
        td = mixer.next_observation(step, env.reset)
        log.append({"seen": seen, "step": step.clone(), "sources": sources, "k": demo_steps,
                    "next_root": td["observation"].clone(), "next_sources": list(mixer.sources),
                    "demo_first": [None if d is None else d["observation"][0] for d in mixer._demos],
                    "td": td})
    return log


def test_demo_steps_are_stored_with_demo_data() -> None:
    store = DemoStore(rho=1.0, phi=0.0, capacity=5, generator=torch.Generator().manual_seed(0))
    demo = make_demo(7.0)
    store.add_initial_demos([demo])
    mixer = DemoMixer(store, N)
    log = run(mixer, FakeEnv(), 7)
    for t, entry in enumerate(log):
        step, k = entry["step"], t % 3
        assert entry["sources"] == ["reward_demo"] * N
        torch.testing.assert_close(step["observation"], demo["observation"][k].expand(N, 3))
        torch.testing.assert_close(step["observation"], entry["seen"])
        torch.testing.assert_close(step["action"], demo["action"][k].expand(N, 2))
        assert (step["action_log_prob"] == 0).all()
        assert (step["next", "reward"] == demo["reward"][k]).all()
        assert (step["next", "done"] == (k == 2)).all() and (step["next", "terminated"] == (k == 2)).all()
        assert (step["state_value"] == 0.5).all()  # the policy's value is kept
        if k < 2:
            torch.testing.assert_close(step["next", "observation"], demo["observation"][k + 1].expand(N, 3))
    finished = mixer.pop_finished()
    assert len(finished) == 2 * N and {f["source"] for f in finished} == {"reward_demo"}
    assert all(f["total_reward"] == 2.0 and f["length"] == 3 for f in finished)
    assert len(store) == 1  # demo replays are never tracked as new demos


def test_policy_input_matches_stored_next_observation_at_every_switch() -> None:
    store = DemoStore(rho=0.4, phi=0.3, capacity=10, initial_reward_threshold=1.0,
                      generator=torch.Generator().manual_seed(3))
    store.add_initial_demos([make_demo(7.0), make_demo(8.0, length=2)])
    env = FakeEnv(length=3)
    mixer = DemoMixer(store, N)
    log = run(mixer, env, 60)
    rb = OnPolicyReplayBuffer(60, gamma=0.9, normalize_advantage=False)
    switches = set()
    for t, entry in enumerate(log):
        step = entry["step"]
        rb.insert(step)
        torch.testing.assert_close(step["observation"], entry["seen"])
        nxt = log[t + 1]["seen"] if t + 1 < len(log) else entry["next_root"]
        for i in range(N):
            ended = bool(step["next", "done"][i])
            if not ended:
                torch.testing.assert_close(step["next", "observation"][i], nxt[i])
                continue
            before, after = entry["sources"][i], entry["next_sources"][i]
            switches.add((before != "env", after != "env"))
            if after == "env":  # a fresh real reset: t = 0 of a new episode of this env
                assert nxt[i][0] == i and nxt[i][1] == 0
            else:
                torch.testing.assert_close(nxt[i], entry["demo_first"][i])  # the demo's first obs
    assert switches == {(True, True), (True, False), (False, True), (False, False)}
    # The rollout holds what the policy saw: slot t is the input of step t.
    stored = rb.storage.data["observation"][:60]
    torch.testing.assert_close(stored, torch.stack([e["seen"] for e in log]))
    rb.compute_returns()
    assert torch.isfinite(rb.storage.data["value_target"]).all()


def test_real_episodes_become_demos() -> None:
    store = DemoStore(rho=0.0, phi=0.0, capacity=4, initial_reward_threshold=1.0,
                      id_factory=iter(f"d{i}" for i in range(100)).__next__)
    env = FakeEnv(n=2, length=3)
    mixer = DemoMixer(store, 2)
    run(mixer, env, 3)
    assert [o.outcome for o in mixer.outcomes] == ["reward_demo", "reward_demo"]
    demo = store.reward_demos[0]
    torch.testing.assert_close(demo["observation"][:, 1], torch.tensor([0.0, 1.0, 2.0]))
    torch.testing.assert_close(demo["action"], torch.tensor([[1.0, 0.0]]).expand(3, 2))
    assert demo["total_reward"] == 1.0
    assert [f["source"] for f in mixer.pop_finished()] == ["env", "env"]


def test_value_demo_replay_updates_max_value() -> None:
    store = DemoStore(rho=0.0, phi=1.0, capacity=4, initial_reward_threshold=10.0)
    env = FakeEnv(n=1, length=2)
    mixer = DemoMixer(store, 1)
    log = run(mixer, env, 2, value=0.25)  # a real episode: reward 1 < 10, a value demo
    assert len(store.value_demos) == 1 and store.value_demos[0]["max_value"] == 0.25
    td = log[-1]["td"]
    assert mixer.sources == ["value_demo"] and td["observation"][0, 1] == 0.0
    for _ in range(2):
        step = mixer.process(env.step(policy(td, 3.0)))
        td = mixer.next_observation(step, env.reset)
    assert store.value_demos[0]["max_value"] == 3.0


def test_rho_phi_zero_leaves_the_stream_untouched() -> None:
    mixer = DemoMixer(DemoStore(rho=0.0, phi=0.0), N)
    log = run(mixer, FakeEnv(length=3), 10)
    plain_env = FakeEnv(length=3)
    td = plain_env.reset()
    for entry in log:
        step = plain_env.step(policy(td))
        assert (entry["step"] == step).all()
        done = step["next", "done"].squeeze(-1)
        nxt = step["next", "observation"].clone()
        if done.any():
            nxt[done] = plain_env.reset(done)["observation"][done]
        torch.testing.assert_close(entry["next_root"], nxt)
        td = TensorDict({"observation": nxt, "done": torch.zeros(N, 1, dtype=torch.bool),
                         "terminated": torch.zeros(N, 1, dtype=torch.bool)}, [N])


def test_state_dict_round_trip(tmp_path) -> None:
    from torchrl_ext.io.state_files import load_state, save_state

    store = DemoStore(rho=1.0, phi=0.0, capacity=2)
    store.add_initial_demos([make_demo(7.0)])
    mixer = DemoMixer(store, 2)
    env = FakeEnv(n=2)
    td = mixer.reset(env.reset())
    step = mixer.process(env.step(policy(td)))
    td = mixer.next_observation(step, env.reset)
    files = {"tensors_file": "mixer.safetensors", "metadata_file": "mixer.json"}
    save_state(tmp_path, mixer.state_dict(), **files)
    other = DemoMixer(store, 2)
    other.load_state_dict(load_state(tmp_path, **files))
    assert other.sources == mixer.sources and other._k == [1, 1]
    step = other.process(env.step(policy(td)))
    assert (step["action"] == torch.tensor([0.0, 1.0])).all()
    with pytest.raises(ValueError, match="num_envs=2"):
        DemoMixer(store, 3).load_state_dict(mixer.state_dict())


def test_bad_input_raises_clear_errors() -> None:
    store = DemoStore(rho=1.0, phi=0.0, capacity=2)
    store.add_initial_demos([make_demo(7.0)])
    with pytest.raises(ValueError, match="num_envs"):
        DemoMixer(store, 0)
    with pytest.raises(TypeError, match="DemoStore"):
        DemoMixer(object(), 2)
    mixer = DemoMixer(store, 2)
    env = FakeEnv(n=2)
    td = mixer.reset(env.reset())
    with pytest.raises(ValueError, match=r"batch size \[3\].*num_envs=2"):
        mixer.process(TensorDict({}, [3]))
    with pytest.raises(KeyError, match="action_log_prob"):
        mixer.process(env.step(policy(td.clone()).exclude("action_log_prob")))
    with pytest.raises(ValueError, match="not the demo's observation"):
        stale = td.clone().set("observation", torch.zeros(2, 3))
        mixer.process(env.step(policy(stale)))
    with pytest.raises(ValueError, match="action format"):
        bad = policy(td.clone())
        bad.set("action", torch.zeros(2, 3))
        mixer.process(env.step(bad))
    with pytest.raises(ValueError, match="observations of shape"):
        DemoMixer(store, 2).reset(TensorDict({"observation": torch.zeros(2, 5)}, [2]))


@pytest.mark.parametrize("sources", [["reward_demo", "reward_demo"], ["env", "reward_demo"]])
def test_a_refused_step_changes_nothing_and_can_be_retried(sources) -> None:
    """A step whose last demo row is wrong is refused before any row is replayed or tracked."""
    for seed in range(100):  # the first draw of the sources wanted
        store = DemoStore(rho=0.5, phi=0.0, capacity=2, generator=torch.Generator().manual_seed(seed))
        store.add_initial_demos([make_demo(7.0)])
        mixer, env = DemoMixer(store, 2), FakeEnv(n=2)
        td = mixer.reset(env.reset())
        if mixer.sources == sources:
            break
    assert mixer.sources == sources
    good = env.step(policy(td.clone()))
    bad = good.clone()
    bad["observation"][1] = 42.0
    with pytest.raises(ValueError, match="env 1 is replaying demo .* not the demo's observation"):
        mixer.process(bad)
    assert mixer._k == [0, 0] and store.running_length(0) == 0
    assert (bad.exclude("observation") == good.exclude("observation")).all()
    mixer.process(good)
    assert mixer._k == ([1, 1] if sources[0] != "env" else [0, 1])
    assert store.running_length(0) == (1 if sources[0] == "env" else 0)


def test_every_episode_start_is_marked_is_init_for_recurrent_policies() -> None:
    """pytorchrl zeroes the recurrent state at every switch; TorchRL's LSTMModule does so
    where ``is_init`` is true, so the mixer sets it on exactly the rows that start an episode."""
    from torchrl.modules import LSTMModule

    torch.manual_seed(0)
    lstm = LSTMModule(input_size=3, hidden_size=4, in_key="observation", out_key="feature")
    store = DemoStore(rho=0.5, phi=0.0, capacity=4, generator=torch.Generator().manual_seed(1))
    demo = make_demo(7.0, length=2)
    store.add_initial_demos([demo])
    env = FakeEnv(length=3)
    mixer = DemoMixer(store, N)

    def reset_fn(mask):
        return env.reset(mask).set("is_init", mask.unsqueeze(-1).clone())

    td = mixer.reset(reset_fn(torch.ones(N, dtype=torch.bool)))
    starts = 0
    for _ in range(30):
        td = lstm(td)
        # A step whose input starts an episode computes from the zero state, whatever came before.
        fresh = lstm(td.select("observation").set("is_init", torch.ones(N, 1, dtype=torch.bool)))
        starting = td["is_init"].squeeze(-1)
        torch.testing.assert_close(td["feature"][starting], fresh["feature"][starting])
        starts += int(starting.sum())
        step = env.step(policy(td))
        step["next"].set("is_init", torch.zeros(N, 1, dtype=torch.bool))  # as InitTracker steps
        step = mixer.process(step)
        ended = step["next", "done"].squeeze(-1).clone()
        td = mixer.next_observation(step, reset_fn)
        assert torch.equal(td["is_init"].squeeze(-1), ended)
    assert starts > 2 * N  # episodes of both kinds started during the run


def test_frame_stacks_replay_and_track_single_frames() -> None:
    """pytorchrl's demos hold one frame per step: a replay starts with the first frame in every
    slot and shifts the next one in; real episodes are tracked by their last frame."""
    store = DemoStore(rho=1.0, phi=0.0, capacity=4)
    frames = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # 3 steps of 2-channel frames
    store.add_initial_demos([{"observation": frames, "action": torch.zeros(3, 2),
                              "reward": torch.tensor([0.0, 0.0, 1.0])}])
    mixer = DemoMixer(store, 1, frame_stack=3)
    flag = torch.zeros(1, 1, dtype=torch.bool)
    td = mixer.reset(TensorDict({"observation": torch.zeros(1, 6)}, [1]))
    seen = []
    for _ in range(3):
        seen.append(td["observation"][0].tolist())
        td = policy(td)
        td.set("next", TensorDict({"observation": torch.zeros(1, 6), "reward": torch.zeros(1, 1),
                                   "done": flag.clone(), "terminated": flag.clone()}, [1]))
        step = mixer.process(td)
        td = mixer.next_observation(step, lambda mask: TensorDict({"observation": torch.zeros(1, 6)}, [1]))
    assert seen == [[1, 2, 1, 2, 1, 2], [1, 2, 1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]

    # Real episodes: a 2-step episode of stacked observations is kept as its last frames.
    store = DemoStore(rho=0.0, phi=0.0, capacity=4)
    mixer = DemoMixer(store, 1, frame_stack=2)
    td = mixer.reset(TensorDict({"observation": torch.tensor([[0.0, 0.0, 1.0, 1.0]])}, [1]))
    for t, nxt in enumerate(([1.0, 1.0, 2.0, 2.0], [2.0, 2.0, 3.0, 3.0])):
        done = torch.full((1, 1), t == 1)
        td = policy(td)
        td.set("next", TensorDict({"observation": torch.tensor([nxt]), "reward": done.float(),
                                   "done": done, "terminated": done.clone()}, [1]))
        td = mixer.next_observation(mixer.process(td), lambda mask: TensorDict(
            {"observation": torch.zeros(1, 4)}, [1]))
    assert len(store.reward_demos) == 1
    assert store.reward_demos[0]["observation"].tolist() == [[1.0, 1.0], [2.0, 2.0]]


def test_frame_stack_is_checked_against_the_observations() -> None:
    store = DemoStore(rho=1.0, phi=0.0, capacity=2)
    store.add_initial_demos([make_demo(7.0)])
    with pytest.raises(ValueError, match=r"frame_stack must be an int >= 1, got frame_stack=0"):
        DemoMixer(store, 1, frame_stack=0)
    with pytest.raises(ValueError, match=r"frame_stack=2 must divide the observations' first dim"):
        DemoMixer(store, 1, frame_stack=2).reset(TensorDict({"observation": torch.zeros(1, 3)}, [1]))
    with pytest.raises(ValueError, match=r"env's frames are \(2,\).*frame_stack set to"):
        DemoMixer(store, 1, frame_stack=3).reset(TensorDict({"observation": torch.zeros(1, 6)}, [1]))
