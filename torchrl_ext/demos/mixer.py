"""PPO+D's env side: replays demos in place of env episodes on TorchRL step TensorDicts.

:class:`DemoMixer` sits between an env loop and an on-policy buffer; the policy is handed the
demo's observations, so what it sees is always what is stored.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor

from torchrl_ext._checks import check_int, makes_kept_tensors
from torchrl_ext._keys import has_leaf, nested_key, next_key
from torchrl_ext.demos._demo import DEMO_KEYS
from torchrl_ext.demos.store import DemoStore, EpisodeOutcome

__all__ = ["DemoMixer"]

#: Per-env replay state: ``state_dict`` key -> (attribute, type).
_PER_ENV = {"source": ("sources", str), "step": ("_k", int), "max_value": ("_max_value", float),
            "return": ("_return", float), "length": ("_length", int)}


class DemoMixer:
    """Swaps env episodes for demo replays in a stream of TorchRL steps ``[N]`` (PPO+D).

    Loop contract (one call of each per collected step)::

        td = mixer.reset(env.reset())              # root of step 0, [N]
        for t in range(T):
            td = critic(actor(td))                 # policy sees td["observation"]
            step = mixer.process(env.step(td))     # demo rows overwritten, real rows tracked
            buffer.insert(step)
            td = mixer.next_observation(step, reset_fn)   # root of step t + 1

    * :meth:`process` gets the step after ``env.step``. For an env replaying a demo (demo step
      ``k`` of ``L``) it writes ``action <- demo.action[k]``, ``log_prob <- 0`` (probability 1),
      ``("next", reward) <- demo.reward[k]`` and ``("next", observation) <- demo.observation
      [k + 1]``, with done/terminated/truncated false; at ``k = L - 1`` the next observation is
      ``demo.observation[L - 1]`` (a placeholder) and ``done = terminated = True``, so the
      return is not bootstrapped past the demo's end (as pytorchrl's done mask). The policy's
      value stays; its maximum over the replay becomes a value demo's new ``max_value``
      (:meth:`DemoStore.update_value_demo`). Rows of envs running the real env are left as
      they are and fed to :meth:`DemoStore.track`.
    * :meth:`next_observation` builds the next root: :func:`torchrl.envs.utils.step_mdp` of the
      step, done flags cleared, and for every env whose episode (real or demo) ended a new
      source: a demo puts its ``observation[0]`` there, the env puts a fresh real observation
      from ``reset_fn(mask)``. Where the root holds ``is_init`` (TorchRL's ``InitTracker``),
      it is true exactly on those rows, so a recurrent policy starts every episode, demo or
      real, from its initial state (as pytorchrl's zeroed hidden state).
    * With ``frame_stack=k`` the observations are ``k`` frames stacked along their first dim
      (TorchRL's ``CatFrames`` on images or vectors) and demos hold single frames, as
      pytorchrl's: a replay starts with its first frame in every slot and shifts the next
      frame in at each step, and real episodes are tracked (and saved) by their last frame.
    * The real env of a row replaying a demo keeps stepping with the policy's action; those
      transitions are neither stored nor tracked (pytorchrl tracks them), and ``reset_fn``
      restarts it when it ends and when the row goes back to the env, so an env episode always
      starts from a real reset (pytorchrl kept a stale observation there).

    Args:
        store: The demo archives and the source draws.
        num_envs: ``N``, the batch size of every step.

    Keyword Args:
        observation_key, action_key, log_prob_key, value_key: root entries of a step
            (``log_prob_key`` defaults to TorchRL 0.14's ``"action_log_prob"``).
        reward_key, done_key, terminated_key, truncated_key: entries under ``"next"``
            (``truncated_key`` is optional in the steps).
        is_init_key: root entry marking an episode's first step, set where present.
        frame_stack: frames per observation (pytorchrl's ``frame_stack``), ``k >= 1``.

    Shape contract:
        Steps are TensorDicts ``[N]``: ``observation [N, *obs]``, ``action [N, *act]`` (the same
        row shape as the demos' actions, e.g. one-hot), ``state_value [N, 1]`` (or ``[N]``),
        log-prob ``[N]`` or ``[N, 1]``, ``("next", reward/done/terminated) [N, 1]`` (or
        ``[N]``). ``reset_fn(mask)`` takes a bool ``[N]`` mask and returns a TensorDict ``[N]``
        whose masked rows hold fresh observations (other rows are ignored).

    Examples:
        >>> from tensordict import TensorDict
        >>> store = DemoStore(rho=1.0, phi=0.0, capacity=2)
        >>> store.add_initial_demos([{"observation": torch.tensor([[0.0], [5.0]]),
        ...                           "action": torch.tensor([[1.0], [2.0]]),
        ...                           "reward": torch.tensor([0.0, 1.0])}])
        >>> mixer = DemoMixer(store, 1)
        >>> td = mixer.reset(TensorDict({"observation": torch.zeros(1, 1)}, [1]))
        >>> def env_step(td):  # a fake env: obs + 1, reward 0, never done
        ...     flag = torch.zeros(1, 1, dtype=torch.bool)
        ...     return td.set("next", TensorDict({"observation": td["observation"] + 1,
        ...         "reward": torch.zeros(1, 1), "done": flag, "terminated": flag}, [1]))
        >>> def policy(td):
        ...     return td.update({"action": torch.zeros(1, 1), "action_log_prob": torch.full((1,), -0.7),
        ...                       "state_value": torch.zeros(1, 1)})
        >>> reset_fn = lambda mask: TensorDict({"observation": torch.full((1, 1), 9.0)}, [1])
        >>> for t in range(3):
        ...     step = mixer.process(env_step(policy(td)))
        ...     print(step["observation"].item(), step["action"].item(), step["action_log_prob"].item(),
        ...           step["next", "reward"].item(), step["next", "done"].item(), mixer.sources[0])
        ...     td = mixer.next_observation(step, reset_fn)
        0.0 1.0 0.0 0.0 False reward_demo
        5.0 2.0 0.0 1.0 True reward_demo
        0.0 1.0 0.0 0.0 False reward_demo
    """

    def __init__(
        self,
        store: DemoStore,
        num_envs: int,
        *,
        observation_key: Any = "observation",
        action_key: Any = "action",
        log_prob_key: Any = "action_log_prob",
        value_key: Any = "state_value",
        reward_key: Any = "reward",
        done_key: Any = "done",
        terminated_key: Any = "terminated",
        truncated_key: Any = "truncated",
        is_init_key: Any = "is_init",
        frame_stack: int = 1,
    ) -> None:
        if not isinstance(store, DemoStore):
            raise TypeError(f"`store` must be a DemoStore, got {type(store).__name__}.")
        check_int("num_envs", num_envs, minimum=1)
        self.store = store
        self.num_envs = num_envs
        self.observation_key = nested_key(observation_key, "observation_key")
        self.action_key = nested_key(action_key, "action_key")
        self.log_prob_key = nested_key(log_prob_key, "log_prob_key")
        self.value_key = nested_key(value_key, "value_key")
        self.reward_key = next_key(nested_key(reward_key, "reward_key"))
        self.done_key = next_key(nested_key(done_key, "done_key"))
        self.terminated_key = next_key(nested_key(terminated_key, "terminated_key"))
        self.truncated_key = next_key(nested_key(truncated_key, "truncated_key"))
        self.is_init_key = nested_key(is_init_key, "is_init_key")
        self.frame_stack = check_int("frame_stack", frame_stack, minimum=1)
        self._init_state()

    def _init_state(self) -> None:
        n = self.num_envs
        #: Source of each env's current episode: ``"env"``, ``"reward_demo"`` or ``"value_demo"``.
        self.sources: list[str] = ["env"] * n
        self._demos: list[dict[str, Any] | None] = [None] * n
        self._k = [0] * n
        self._max_value = [-math.inf] * n
        self._return = [0.0] * n
        self._length = [0] * n
        self._real_done = torch.zeros(n, dtype=torch.bool)
        self._ended = torch.zeros(n, dtype=torch.bool)
        self._finished: list[dict[str, Any]] = []
        #: :class:`EpisodeOutcome` of the real episodes that ended in the last :meth:`process`.
        self.outcomes: list[EpisodeOutcome] = []

    # ------------------------------------------------------------------ checks
    def _check(self, td: Any, keys: list[Any], where: str) -> None:
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"{where} needs a TensorDict [{self.num_envs}], got {type(td).__name__}.")
        if tuple(td.batch_size) != (self.num_envs,):
            raise ValueError(
                f"{where} got a TensorDict with batch size {list(td.batch_size)}; the mixer was "
                f"built with num_envs={self.num_envs}, so steps must be [{self.num_envs}]."
            )
        present = td.keys(True, True)
        missing = [key for key in keys if key not in present]
        if missing:
            raise KeyError(
                f"{where} is missing {missing}; a step needs {keys} (set the mixer's *_key "
                "arguments if your modules write elsewhere)."
            )

    # ------------------------------------------------------------------ frames
    def _frame_shape(self, obs: Tensor) -> tuple[int, ...]:
        """The shape of one frame of the ``[N, *obs]`` observations."""
        if self.frame_stack == 1:
            return tuple(obs.shape[1:])
        if obs.ndim < 2 or obs.shape[1] % self.frame_stack:
            raise ValueError(
                f"frame_stack={self.frame_stack} must divide the observations' first dim, got "
                f"{self.observation_key!r} of shape {tuple(obs.shape[1:])} per env; pass the "
                "env's number of stacked frames."
            )
        return (obs.shape[1] // self.frame_stack, *obs.shape[2:])

    def _last_frame(self, obs: Tensor) -> Tensor:
        """The newest frame of each ``[*, k * C, ...]`` stacked observation (``[*, C, ...]``)."""
        if self.frame_stack == 1:
            return obs
        return obs[:, -(obs.shape[1] // self.frame_stack):]

    # ------------------------------------------------------------------ demos
    def _start(self, env: int, obs: Tensor) -> bool:
        """Draws the source of ``env``'s next episode; writes a demo's first observation."""
        frame_shape = self._frame_shape(obs)
        kind = self.store.sample_source()
        self.sources[env] = kind
        self._k[env], self._max_value[env] = 0, -math.inf
        self._return[env], self._length[env] = 0.0, 0
        demo = self._demos[env] = None if kind == "env" else self.store.sample_demo(kind)
        if demo is None:
            return False
        first = demo["observation"][0]
        if first.shape != frame_shape:
            raise ValueError(
                f"demo {demo['id']!r} has observations of shape {tuple(first.shape)} but the "
                f"env's frames are {frame_shape}; load demos recorded in this env (one frame "
                "per step, with frame_stack set to the env's stacked frames)."
            )
        # Every frame slot holds the first frame, as pytorchrl starts a replay.
        obs[env] = first.to(obs.device, obs.dtype).repeat(self.frame_stack, *([1] * (first.ndim - 1)))
        return True

    def reset(self, td: TensorDictBase) -> TensorDictBase:
        """Starts a run: draws a source for every env of the freshly reset ``td`` (root, [N]).

        Forgets any replay in progress and the store's running episodes; returns ``td`` with
        the demo rows' observations replaced by their demos' first observations.
        """
        self._check(td, [self.observation_key], "reset()")
        self._init_state()
        self.store.discard_running()
        obs = td.get(self.observation_key).clone()
        for env in range(self.num_envs):
            self._start(env, obs)
        return td.set(self.observation_key, obs)

    @torch.no_grad()
    def process(self, step: TensorDictBase) -> TensorDictBase:
        """Overwrites the demo rows of a collected step and tracks the real rows; see the class doc.

        Returns ``step`` (modified in place). Raises if keys or shapes are wrong, or if a demo
        row's observation is not the one :meth:`next_observation` handed out.
        """
        keys = [self.observation_key, self.action_key, self.log_prob_key, self.value_key,
                self.reward_key, self.done_key, self.terminated_key,
                next_key(self.observation_key)]
        self._check(step, keys, "process()")
        demo_rows = [i for i in range(self.num_envs) if self._demos[i] is not None]
        real_rows = [i for i in range(self.num_envs) if self._demos[i] is None]
        self._check_demo_rows(step, demo_rows)  # before anything changes: a refused step can be retried
        done = step.get(self.done_key).reshape(self.num_envs, -1).any(-1)
        self._real_done = done.cpu()  # a new tensor (any), never written in place
        self._ended = torch.zeros(self.num_envs, dtype=torch.bool)
        self.outcomes = []
        obs = step.get(self.observation_key)
        value = step.get(self.value_key).reshape(self.num_envs, -1)[:, 0]
        reward = step.get(self.reward_key)
        if real_rows:
            rows = torch.tensor(real_rows)
            self.outcomes = self.store.track(
                rows, self._last_frame(obs[rows]), step.get(self.action_key)[rows], reward[rows],
                value[rows], done[rows],
            )
            flat_reward = reward.reshape(self.num_envs, -1)[:, 0]
            for i in real_rows:
                self._return[i] += float(flat_reward[i])
                self._length[i] += 1
                if bool(done[i]):
                    self._end(i)
        if demo_rows:
            self._replay(step, demo_rows, value)
        return step

    def _check_demo_rows(self, step: TensorDictBase, rows: list[int]) -> None:
        """Refuses a step whose demo rows are not the observations handed out, or whose actions
        cannot take the demos' (``ValueError``)."""
        obs, action = step.get(self.observation_key), step.get(self.action_key)
        frames = self._last_frame(obs)
        for i in rows:
            demo, k = self._demos[i], self._k[i]
            if not torch.equal(frames[i], demo["observation"][k].to(obs.device, obs.dtype)):
                raise ValueError(
                    f"env {i} is replaying demo {demo['id']!r} (step {k}) but the step's "
                    f"{self.observation_key!r} is not the demo's observation; feed the policy the "
                    "TensorDict returned by reset()/next_observation()."
                )
            if demo["action"][k].numel() != action[i].numel():
                raise ValueError(
                    f"demo {demo['id']!r} has actions of shape {tuple(demo['action'][k].shape)} but the "
                    f"step's {self.action_key!r} rows are {tuple(action[i].shape)}; record demos "
                    "in the env's action format (e.g. one-hot)."
                )

    def _replay(self, step: TensorDictBase, rows: list[int], value: Tensor) -> None:
        action, log_prob = step.get(self.action_key), step.get(self.log_prob_key)
        reward = step.get(self.reward_key)
        obs, next_obs = step.get(self.observation_key), step.get(next_key(self.observation_key))
        channels = obs.shape[1] // self.frame_stack if self.frame_stack > 1 else 0
        flags = [step.get(self.done_key), step.get(self.terminated_key)]
        truncated = step.get(self.truncated_key, None)
        for i in rows:
            demo, k = self._demos[i], self._k[i]
            length = demo["length"]
            action[i] = demo["action"][k].reshape(action[i].shape).to(action.device, action.dtype)
            log_prob[i] = 0.0
            reward[i] = demo["reward"][k].reshape(reward[i].shape).to(reward.device, reward.dtype)
            last = k + 1 >= length
            frame = demo["observation"][min(k + 1, length - 1)].to(next_obs.device, next_obs.dtype)
            # The oldest frame drops out and the demo's next frame comes in, as pytorchrl shifts.
            next_obs[i] = torch.cat([obs[i][channels:].to(next_obs.dtype), frame]) if channels else frame
            for flag in flags:
                flag[i] = last
            if truncated is not None:
                truncated[i] = False
            self._max_value[i] = max(self._max_value[i], float(value[i]))
            self._return[i] += float(demo["reward"][k].sum())
            self._length[i] += 1
            self._k[i] = k + 1
            if last:
                if self.sources[i] == "value_demo":
                    self.store.update_value_demo(demo["id"], self._max_value[i])
                self._end(i)

    def _end(self, env: int) -> None:
        self._ended[env] = True
        self._finished.append({"env": env, "source": self.sources[env],
                               "total_reward": self._return[env], "length": self._length[env]})

    @torch.no_grad()
    def next_observation(
        self, step: TensorDictBase, reset_fn: Callable[[Tensor], TensorDictBase]
    ) -> TensorDictBase:
        """The root of the next step after the step :meth:`process` returned; see the class doc.

        ``reset_fn(mask)`` is called once, if any real env needs a reset, with a bool ``[N]``
        mask; rows whose real env is done are included even if they start a demo.
        """
        from torchrl.envs.utils import step_mdp

        self._check(step, [next_key(self.observation_key)], "next_observation()")
        td = step_mdp(step, keep_other=False, exclude_action=True, exclude_reward=True)
        obs = td.get(self.observation_key).clone()
        to_env = torch.zeros(self.num_envs, dtype=torch.bool)
        for env in self._ended.nonzero().flatten().tolist():
            if not self._start(env, obs):
                to_env[env] = True
        reset_mask = self._real_done | to_env
        if bool(reset_mask.any()):
            fresh = reset_fn(reset_mask.to(obs.device))
            if not isinstance(fresh, TensorDictBase) or not has_leaf(fresh, self.observation_key):
                raise TypeError(
                    f"reset_fn(mask) must return a TensorDict [{self.num_envs}] holding "
                    f"{self.observation_key!r}, got {type(fresh).__name__}."
                )
            fresh_obs = fresh.get(self.observation_key)
            if fresh_obs.shape != obs.shape:
                raise ValueError(
                    f"reset_fn(mask) returned {self.observation_key!r} of shape "
                    f"{tuple(fresh_obs.shape)}; expected {tuple(obs.shape)} (all N rows)."
                )
            rows = to_env.to(obs.device)
            obs[rows] = fresh_obs[rows].to(obs.dtype)
            # A real episode that the reset restarted must not carry its old tracked steps.
            self.store.discard_running(to_env)
        if has_leaf(td, self.is_init_key):  # a recurrent policy restarts where an episode starts
            is_init = td.get(self.is_init_key)
            td.set(self.is_init_key, self._ended.to(is_init.device).reshape(
                self.num_envs, *[1] * (is_init.ndim - 1)).expand_as(is_init).clone())
        self._real_done = torch.zeros(self.num_envs, dtype=torch.bool)
        self._ended = torch.zeros(self.num_envs, dtype=torch.bool)
        for key in (self.done_key, self.terminated_key, self.truncated_key):
            root = key[1:] if len(key) > 2 else key[1]
            if has_leaf(td, root):
                td.set(root, torch.zeros_like(td.get(root)))
        return td.set(self.observation_key, obs)

    def pop_finished(self) -> list[dict[str, Any]]:
        """Episodes (real and demo) that ended since the last call.

        Each is ``{"env", "source", "total_reward", "length"}``; ``source`` is ``"env"`` for
        real episodes (their untruncated return), else the demo kind.
        """
        finished, self._finished = self._finished, []
        return finished

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The per-env replay state (the store has its own ``state_dict``).

        Columns of numbers, strings and lists of tensors (an env without a demo has empty
        tensors and ``{}`` metadata), so :func:`torchrl_ext.io.state_files.save_state` can
        write it. Take it between :meth:`next_observation` and the next :meth:`process`.
        """
        empty = torch.zeros(0)
        demos = self._demos
        return {
            "num_envs": self.num_envs,
            **{key: list(getattr(self, attr)) for key, (attr, _) in _PER_ENV.items()},
            **{f"demo_{key}": [empty if d is None else d[key].clone() for d in demos] for key in DEMO_KEYS},
            "demo_meta": [{} if d is None else {k: v for k, v in d.items() if not isinstance(v, Tensor)}
                          for d in demos],
        }

    @makes_kept_tensors
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` output (``num_envs`` must match)."""
        if state.get("num_envs") != self.num_envs or len(state.get("source", ())) != self.num_envs:
            raise ValueError(
                f"state is for num_envs={state.get('num_envs')!r} but this mixer has "
                f"num_envs={self.num_envs}."
            )
        self._init_state()
        device = self.store.device
        for i in range(self.num_envs):
            for key, (attr, cast) in _PER_ENV.items():
                getattr(self, attr)[i] = cast(state[key][i])
            meta = state["demo_meta"][i]
            if meta:
                self._demos[i] = {**{key: state[f"demo_{key}"][i].to(device) for key in DEMO_KEYS}, **meta}
