"""Demonstration bookkeeping of PPO+D (pytorchrl's ``PPODBuffer``), independent of any env.

Driving envs (replaying a demo, frame stacking, resets) is left to the caller.
"""
from __future__ import annotations

import copy
import math
import uuid
from typing import Any, Callable, Iterable, Literal, NamedTuple, Sequence

import torch
from torch import Tensor

from torchrl_ext._checks import check_device, check_int, check_real, makes_kept_tensors
from torchrl_ext.demos._demo import (
    DEMO_KEYS,
    check_settings,
    cut_episode,
    demo_tensors,
    demos_from_state,
    demos_state,
    env_index,
    make_demo,
    priority_weights,
    running_from_state,
    running_state,
    step_batch,
)

__all__ = ["DemoStore", "EpisodeOutcome", "Source"]

Source = Literal["reward_demo", "value_demo", "env"]

_RUN_KEYS = (*DEMO_KEYS, "value")  # what a running episode tracks per step
_INTS = ("capacity", "num_demos_to_save", "episodes_finished")
_SCALARS = ("rho", "phi", "rho0", "phi0", "alpha", "initial_reward_threshold", "reward_threshold",
            "max_demo_reward", *_INTS)


class EpisodeOutcome(NamedTuple):
    """What :meth:`DemoStore.track` did with one finished episode."""

    env: int
    outcome: Literal["reward_demo", "value_demo", "rejected"]
    demo_id: str
    total_reward: float
    length: int
    max_value: float


class DemoStore:
    """Reward and value demos of PPO+D, with per-env tracking of the running episodes.

    :meth:`track` gets each real env step. A finished episode, cut after its last positive
    reward, becomes a *reward demo* if its total reward is ``>= reward_threshold``, otherwise it
    is offered to the *value demo* archive scored by its highest value estimate. A new best
    reward demo removes the agent's reward demos, and every added one anneals ``rho``/``phi``
    and raises the threshold to the lowest reward-demo total. :meth:`check_capacity` keeps
    ``len(self) <= capacity``; human demos are never removed. :meth:`sample_source` and
    :meth:`sample_demo` pick what the next episode of an env is.

    Differences from pytorchrl:
        * ``initial_reward_threshold=0.0`` is a threshold of 0 (pytorchrl: falsy 0 means -inf).
        * A value demo's ``max_value`` is the highest value estimate over all steps of the
          episode (pytorchrl's bug stores the value of the episode's last step).
        * A value demo is admitted when there is room or its ``max_value`` is ``>=`` the lowest
          stored one (pytorchrl compares a key that is always -inf: it admits only when there
          is room or no value demo yet).
        * A new best reward demo removes only non-human reward demos (pytorchrl clears all,
          humans included, after which its position-based protection guards the wrong demos).
          Human demos carry a flag and always stay in front.
        * Value-demo weights are ``max(max_value, 0) ** alpha`` (uniform if all are 0): finite
          and non-negative for any ``alpha > 0``. pytorchrl's ``max_value ** alpha`` is NaN or
          negative for negative values with fractional or odd alpha, and ranks ``-v`` like ``v``
          for even alpha. Same result when all values are ``>= 0``.
        * Draws use a ``torch.Generator`` (pytorchrl: numpy's global RNG).
        * :meth:`add_initial_demos` must come before the first finished episode; later demos go
          through :meth:`add_supplementary_demos` (pytorchrl's supplementary folder).
        * Demo tensors keep their dtypes (pytorchrl casts to float32).

    Args:
        rho: Probability of replaying a reward demo, in ``[0, 1]``.
        phi: Probability of replaying a value demo, in ``[0, 1]``, with ``rho + phi <= 1``.
        alpha: Prioritisation exponent of the value demos (``> 0``).
        capacity: Maximum number of reward + value demos (``>= 1``).
        initial_reward_threshold: Lowest total reward of a reward demo; ``None`` means -inf.
        num_demos_to_save: How many agent reward demos
            :func:`~torchrl_ext.demos.files.save_top_demos` writes.
        generator: Torch generator of the draws (``None``: torch's global RNG).
        device: Device the demos and running episodes are kept on.
        id_factory: Makes a demo id, once per finished episode (default: ``str(uuid.uuid4())``).

    Examples:
        >>> store = DemoStore(rho=0.3, phi=0.3, capacity=4)
        >>> for t in range(3):  # one env; reward 1 at step 1, episode ends at step 2
        ...     out = store.track(None, torch.full((1, 2), float(t)), torch.zeros(1, 1),
        ...                       torch.tensor([float(t == 1)]), torch.tensor([0.5]),
        ...                       torch.tensor([t == 2]))
        >>> out[0].outcome, out[0].length, out[0].total_reward  # step 2 was cut (no reward)
        ('reward_demo', 2, 1.0)
        >>> store.reward_threshold, len(store.reward_demos), len(store.value_demos)
        (1.0, 1, 0)
        >>> store.sample_demo("reward_demo")["observation"][:, 0]
        tensor([0., 1.])
    """

    def __init__(
        self,
        rho: float = 0.1,
        phi: float = 0.3,
        alpha: float = 10.0,
        capacity: int = 51,
        initial_reward_threshold: float | None = None,
        num_demos_to_save: int = 10,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | str = "cpu",
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        rho, phi, self.alpha, initial_reward_threshold = check_settings(
            rho, phi, alpha, num_demos_to_save, initial_reward_threshold
        )
        self.capacity = capacity
        self.rho0, self.phi0, self.rho, self.phi = rho, phi, rho, phi
        self.initial_reward_threshold = initial_reward_threshold
        self.reward_threshold = -math.inf if initial_reward_threshold is None else initial_reward_threshold
        self.max_demo_reward = -math.inf
        self.num_demos_to_save = num_demos_to_save
        self.generator = generator
        self.device = check_device("device", device)
        self.id_factory = id_factory or (lambda: str(uuid.uuid4()))
        self.episodes_finished = 0
        self._reward_demos: list[dict[str, Any]] = []
        self._value_demos: list[dict[str, Any]] = []
        # env index -> {"observation": [...], "action": [...], "reward": [...], "value": [...]}
        self._running: dict[int, dict[str, list]] = {}

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Maximum number of reward + value demos; lowering it takes effect at the next check."""
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        check_int("capacity", value, minimum=1, hint="the default is 51")
        self._capacity = value

    @property
    def reward_demos(self) -> list[dict[str, Any]]:
        """The reward demos, human ones first (a new list; do not mutate the demos)."""
        return list(self._reward_demos)

    @property
    def value_demos(self) -> list[dict[str, Any]]:
        """The value demos in arrival order (a new list; do not mutate the demos)."""
        return list(self._value_demos)

    @property
    def num_human_demos(self) -> int:
        """Number of protected human reward demos."""
        return sum(d["human"] for d in self._reward_demos)

    def __len__(self) -> int:
        return len(self._reward_demos) + len(self._value_demos)

    # ------------------------------------------------------------------ loading
    def add_initial_demos(self, demos: Iterable[Any], human: bool = True) -> None:
        """Adds loaded demos as reward demos (human ones before all others) and sets the threshold.

        The threshold becomes ``max(initial_reward_threshold, min total reward)`` over all loaded
        demos and ``max_demo_reward`` their maximum. A demo mapping may carry an ``"id"``.

        Raises:
            ValueError: The demos would exceed ``capacity``, or a demo is malformed.
            RuntimeError: An episode has already finished (use :meth:`add_supplementary_demos`).
        """
        if self.episodes_finished:
            raise RuntimeError(
                "add_initial_demos() must be called before the first tracked episode ends; "
                "use add_supplementary_demos() to add demos later."
            )
        new = [self._checked(demo, f"initial demo #{k}", human) for k, demo in enumerate(demos)]
        if len(self) + len(new) > self.capacity:
            raise ValueError(
                f"{len(self._reward_demos)} stored + {len(new)} new initial demos exceed "
                f"capacity={self.capacity}; raise `capacity` or load fewer demo files."
            )
        if not new:
            return
        at = self.num_human_demos if human else len(self._reward_demos)
        self._reward_demos[at:at] = new
        self._update_thresholds(-math.inf if self.initial_reward_threshold is None else self.initial_reward_threshold)

    def add_supplementary_demos(self, demos: Iterable[Any]) -> list[str]:
        """Adds the (non-human) demos whose total reward is ``>= reward_threshold``.

        Neither the threshold, ``max_demo_reward`` nor ``rho``/``phi`` change; the capacity check
        runs afterwards. Returns the ids of the demos added.
        """
        records = [self._checked(demo, f"supplementary demo #{k}", False) for k, demo in enumerate(demos)]
        # All checked first: a malformed demo adds none of them.
        added = [record for record in records if record["total_reward"] >= self.reward_threshold]
        self._reward_demos.extend(added)
        self.check_capacity()
        present = {d["id"] for d in self._reward_demos}
        return [record["id"] for record in added if record["id"] in present]

    def _checked(self, demo: Any, where: str, human: bool) -> dict[str, Any]:
        obs, act, rew = demo_tensors(demo, where=where, device=self.device)
        demo_id = str(demo["id"]) if "id" in demo.keys() else self.id_factory()
        return make_demo(obs, act, rew, demo_id=demo_id, human=human)

    # ------------------------------------------------------------------ tracking
    def track(
        self,
        env_ids: int | Sequence[int] | Tensor | None,
        observation: Tensor,
        action: Tensor,
        reward: Tensor,
        value: Tensor,
        done: Tensor,
    ) -> list[EpisodeOutcome]:
        """Appends one real env step per selected env and processes the episodes that end.

        Args:
            env_ids: Which envs the ``N`` rows belong to: ``None`` (rows ``0..N-1``), a sequence
                or long tensor of ``N`` indices, a bool mask with ``N`` true entries, or an int
                (then the inputs have no env dim).
            observation: ``[N, *obs_shape]`` (pass one frame, not a frame stack).
            action: ``[N, *action_shape]``.
            reward: ``[N]`` or ``[N, 1]``.
            value: ``[N]`` or ``[N, 1]`` value estimates of the observations.
            done: ``[N]`` or ``[N, 1]``, true where the episode ended (terminated or truncated).

        Returns:
            One :class:`EpisodeOutcome` per finished episode, in env order.
        """
        ids, obs, act, rew, values, dones = step_batch(
            env_ids, observation, action, reward, value, done, self.device
        )
        self._check_continues(ids, obs, act)
        outcomes = []
        for j, env in enumerate(ids):
            run = self._running.setdefault(env, {key: [] for key in _RUN_KEYS})
            for key, column in zip(_RUN_KEYS, (obs, act, rew, values)):
                run[key].append(column[j])
            if dones[j]:
                outcomes.append(self._finish(env))
        return outcomes

    def _check_continues(self, ids: list[int], obs: Tensor, act: Tensor) -> None:
        """Refuses a step whose rows cannot be stacked onto their env's running episode."""
        for j, env in enumerate(ids):
            run = self._running.get(env)
            if not run or not run["action"]:
                continue
            for name, new, old in (("observation", obs[j], run["observation"][0]),
                                   ("action", act[j], run["action"][0])):
                if new.shape != old.shape or new.dtype != old.dtype:
                    raise ValueError(
                        f"`{name}` of env {env} has shape {tuple(new.shape)} and dtype {new.dtype}, but "
                        f"its running episode has {tuple(old.shape)} and {old.dtype}; pass the same "
                        "layout every step (or discard_running(env) after a change)."
                    )

    def discard_running(self, env_ids: int | Sequence[int] | Tensor | None = None) -> None:
        """Forgets the running episode of the given envs (all if ``None``), e.g. on a reset."""
        if env_ids is None:
            self._running.clear()
            return
        for env in env_index(env_ids, None):
            self._running.pop(env, None)

    def running_length(self, env: int) -> int:
        """Number of steps tracked so far in ``env``'s running episode."""
        return len(self._running.get(env, {}).get("action", ()))

    def _finish(self, env: int) -> EpisodeOutcome:
        obs, act, rew, max_value = cut_episode(self._running.pop(env))
        self.episodes_finished += 1
        demo = make_demo(obs, act, rew, demo_id=self.id_factory())
        total = demo["total_reward"]
        if total >= self.reward_threshold:
            # The capacity check may evict the new demo at once (the longest agent demo goes).
            outcome = "reward_demo" if self._add_reward_demo(demo) else "rejected"
        else:
            demo["max_value"] = max_value
            outcome = "value_demo" if self._offer_value_demo(demo) else "rejected"
        return EpisodeOutcome(env, outcome, demo["id"], total, demo["length"], max_value)

    def _add_reward_demo(self, demo: dict[str, Any]) -> bool:
        """Adds ``demo`` as pytorchrl does; whether it is still stored afterwards."""
        if demo["total_reward"] > self.max_demo_reward:
            self._reward_demos = [d for d in self._reward_demos if d["human"]]
        self._reward_demos.append(demo)
        self.check_capacity()
        self.anneal()
        self._update_thresholds(self.reward_threshold)
        return any(d is demo for d in self._reward_demos)

    def _update_thresholds(self, floor: float) -> None:
        """``reward_threshold``: the lowest reward-demo total (at least ``floor``); ``max_demo_reward``: the highest."""
        totals = [d["total_reward"] for d in self._reward_demos]
        self.reward_threshold = max(floor, min(totals))
        self.max_demo_reward = max(totals)

    def _offer_value_demo(self, demo: dict[str, Any]) -> bool:
        room = len(self) < self.capacity
        lowest = min((d["max_value"] for d in self._value_demos), default=None)
        if not (room or (lowest is not None and demo["max_value"] >= lowest)):
            return False
        self._value_demos.append(demo)
        self.check_capacity()
        return any(d is demo for d in self._value_demos)

    def update_value_demo(self, demo_id: str, max_value: float) -> bool:
        """Sets a value demo's ``max_value`` (e.g. the highest value seen while replaying it).

        Returns ``False`` if no value demo has that id any more.
        """
        for demo in self._value_demos:
            if demo["id"] == demo_id:
                demo["max_value"] = check_real("max_value", max_value, low=-math.inf, finite=False)
                return True
        return False

    # ------------------------------------------------------------------ policies
    def check_capacity(self) -> None:
        """Evicts demos until ``len(self) <= capacity``.

        First ``min(excess, len(value_demos))`` value demos, each time the lowest ``max_value``
        (the oldest on ties); then, while there are more than ``capacity`` reward demos, the
        longest non-human reward demo (the oldest on ties).
        """
        excess = len(self) - self.capacity
        for _ in range(min(max(excess, 0), len(self._value_demos))):
            scores = [d["max_value"] for d in self._value_demos]
            del self._value_demos[scores.index(min(scores))]
        for _ in range(max(len(self._reward_demos) - self.capacity, 0)):
            agent = [i for i, d in enumerate(self._reward_demos) if not d["human"]]
            if not agent:
                break
            del self._reward_demos[max(agent, key=lambda i: self._reward_demos[i]["length"])]

    def anneal(self) -> None:
        """Moves ``phi0 / len(value_demos)`` of probability from ``phi`` to ``rho``.

        ``rho`` and ``phi`` each change only while strictly between 0 and 1, are clipped to
        ``[0, rho0 + phi0]``, and stay put when there are no value demos.
        """
        n = len(self._value_demos)
        if n == 0:
            return
        high = self.rho0 + self.phi0
        if 0.0 < self.rho < 1.0:
            self.rho = min(max(self.rho + self.phi0 / n, 0.0), high)
        if 0.0 < self.phi < 1.0:
            self.phi = min(max(self.phi - self.phi0 / n, 0.0), high)

    def value_demo_probabilities(self) -> Tensor:
        """Replay probabilities of the value demos, ``∝ max(max_value, 0) ** alpha`` (float64).

        Computed in log space (no overflow); uniform when every weight is 0; empty without demos.
        """
        return priority_weights([d["max_value"] for d in self._value_demos], self.alpha)

    def sample_source(self) -> Source:
        """Draws ``"reward_demo"``/``"value_demo"``/``"env"`` with ``rho``/``phi``/the rest.

        A draw of a demo kind whose list is empty falls back to ``"env"``.
        """
        u = float(torch.rand((), dtype=torch.float64, generator=self.generator))
        if u < self.rho:
            return "reward_demo" if self._reward_demos else "env"
        if u < self.rho + self.phi:
            return "value_demo" if self._value_demos else "env"
        return "env"

    def sample_demo(self, kind: Source) -> dict[str, Any]:
        """A deep copy of a reward demo (uniform) or a value demo (by its probability).

        Raises:
            ValueError: ``kind`` is not a demo kind or its list is empty.
        """
        demos = {"reward_demo": self._reward_demos, "value_demo": self._value_demos}.get(kind)
        if demos is None:
            raise ValueError(f"`kind` must be 'reward_demo' or 'value_demo', got {kind!r}.")
        if not demos:
            raise ValueError(f"no {kind}s stored; check sample_source() before sample_demo().")
        if kind == "reward_demo":
            index = int(torch.randint(len(demos), (), generator=self.generator))
        else:
            probs = self.value_demo_probabilities()
            index = int(torch.multinomial(probs, 1, generator=self.generator))
        return copy.deepcopy(demos[index])  # tensors cloned: callers never alter the stored demo

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: settings, counters, demos, running episodes, RNG state.

        Nested dicts of numbers, strings and lists of tensors, so
        :func:`torchrl_ext.io.state_files.save_state` can write it without pickling.
        """
        return {**{name: getattr(self, name) for name in _SCALARS},
                "reward_demos": demos_state(self._reward_demos), "value_demos": demos_state(self._value_demos),
                "running": running_state(self._running),
                "generator_state": [] if self.generator is None else [self.generator.get_state()]}

    @makes_kept_tensors
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (the id factory and device stay as built)."""
        missing = sorted({*_SCALARS, "reward_demos", "value_demos", "running"} - set(state))
        if missing:
            raise ValueError(f"state is missing {missing}; pass DemoStore.state_dict() output.")
        try:  # everything is rebuilt and checked before the store changes
            scalars = {name: state[name] if state[name] is None or name in _INTS else float(state[name])
                       for name in _SCALARS}
            reward_demos = demos_from_state(state["reward_demos"], self.device)
            value_demos = demos_from_state(state["value_demos"], self.device)
            running = running_from_state(state["running"], self.device)
            generator_state = None
            if state.get("generator_state") and self.generator is not None:
                generator_state = state["generator_state"][0].to("cpu", torch.uint8)
                torch.Generator(self.generator.device).set_state(generator_state)  # a trial on a scratch one
        except (AttributeError, IndexError, KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"state is not a DemoStore.state_dict() ({type(error).__name__}: {error}); nothing was loaded."
            ) from error
        check_settings(scalars["rho"], scalars["phi"], scalars["alpha"], scalars["num_demos_to_save"],
                       scalars["initial_reward_threshold"])
        self.capacity = scalars.pop("capacity")  # its setter checks it: the first (and last) change that can fail
        if generator_state is not None:
            self.generator.set_state(generator_state)
        for name, value in scalars.items():
            setattr(self, name, value)
        self._reward_demos, self._value_demos, self._running = reward_demos, value_demos, running
