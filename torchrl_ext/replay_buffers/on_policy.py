"""On-policy buffers with returns, advantages and minibatch epochs (pytorchrl's storages).

:meth:`OnPolicyReplayBuffer.compute_returns` (GAE or discounted returns, an optional
intrinsic stream, advantage normalisation; V-trace in :class:`VTraceReplayBuffer`) writes
its results back as derived rollout entries, so every minibatch carries them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator

import torch
from tensordict import TensorDictBase

from torchrl_ext import _compat
from torchrl_ext._checks import CheckedSetting, check_bool, check_choice, check_finite, check_int, check_real, read_only
from torchrl_ext._keys import has_leaf, nested_key, next_key
from torchrl_ext.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl_ext.samplers.minibatch import (
    FeedForwardMinibatchSampler,
    NaiveRecurrentMinibatchSampler,
    check_optional_count,
)
from torchrl_ext.storages.rollout import RolloutStorage
from torchrl_ext.value.functional import generalized_advantage_estimate, vtrace_advantage_estimate
from torchrl_ext.value.normalizers import IntrinsicRewardNormalizer

__all__ = ["OnPolicyKeys", "OnPolicyReplayBuffer", "VTraceReplayBuffer"]


def check_gae_lambda(name: str, value: float | None) -> float | None:
    """A GAE lambda in ``[0, 1]``, or ``None`` for discounted returns (lambda 1)."""
    return None if value is None else check_real(name, value, low=0.0, high=1.0)


def check_clip_threshold(name: str, value: float) -> float:
    """A V-trace clip threshold ``> 0`` (``+inf``: no clipping)."""
    return check_real(name, value, low=0.0, open_low=True, finite=False,
                      hint="e.g. 1.0, the IMPALA default (+inf: no clipping)")


@dataclass(frozen=True)
class OnPolicyKeys:
    """Where the on-policy buffers read and write (TorchRL's names by default)."""

    reward: Any = ("next", "reward")
    done: Any = ("next", "done")
    terminated: Any = ("next", "terminated")
    value: Any = "state_value"
    log_prob: Any = "action_log_prob"
    intrinsic_reward: Any = ("next", "intrinsic_reward")
    intrinsic_value: Any = "intrinsic_state_value"
    advantage: Any = "advantage"
    value_target: Any = "value_target"
    intrinsic_advantage: Any = "intrinsic_advantage"
    intrinsic_value_target: Any = "intrinsic_value_target"

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, nested_key(getattr(self, field.name), field.name))


class OnPolicyReplayBuffer(TensorDictReplayBuffer):
    """One rollout ``[T + 1, N]``: insert steps, compute returns, iterate minibatch epochs.

    Args:
        num_steps: rollout length ``T``.

    Keyword Args:
        gamma: discount of the extrinsic stream.
        gae_lambda: GAE lambda, or ``None`` for discounted returns bootstrapped
            from the value after the last step (pytorchrl's vanilla storage).
        gamma_intrinsic: discount of the intrinsic stream (used when the steps
            carry ``keys.intrinsic_reward`` and ``keys.intrinsic_value``).
        intrinsic_filter: ``"forward"`` (the RND reward forward filter, carried
            across rollouts) or ``"backward"`` (pytorchrl's per-rollout sum).
        normalize_advantage: scale advantages to zero mean, unit std.
        advantage_eps: added to the std.
        recurrent: minibatches of whole env sequences ``[k, T]`` instead of steps.
        num_mini_batch, mini_batch_size, shuffle: default epoch split (see
            :meth:`generate_batches`); ``num_mini_batch`` is checked but unused when
            ``mini_batch_size`` is given.
        keys: an :class:`OnPolicyKeys` (or a dict of its fields).
        carry_keys, device: see :class:`~torchrl_ext.storages.RolloutStorage`.
        generator: RNG of the minibatch permutations.

    Shape contract:
        Steps are ``[N]`` TensorDicts; derived entries (``advantage``,
        ``value_target``, intrinsic ones) are ``[T + 1, N, 1]`` with rows past
        the filled steps zero. Minibatches are ``[B]`` (or ``[k, T]`` recurrent).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.replay_buffers import OnPolicyReplayBuffer
        >>> rb = OnPolicyReplayBuffer(3, gamma=0.5, gae_lambda=None, normalize_advantage=False)
        >>> for t in range(3):
        ...     rb.insert(TensorDict({"observation": torch.zeros(2, 1), "state_value": torch.zeros(2, 1),
        ...         "next": {"observation": torch.zeros(2, 1), "reward": torch.ones(2, 1),
        ...                  "done": torch.zeros(2, 1, dtype=torch.bool),
        ...                  "terminated": torch.zeros(2, 1, dtype=torch.bool)}}, [2]))
        >>> rb.compute_returns()  # the value after the last step is 0 (never set)
        >>> rb.storage.data["value_target"][:3, 0, 0].tolist()
        [1.75, 1.5, 1.0]
        >>> [batch.shape[0] for batch in rb.generate_batches(num_mini_batch=2)]
        [3, 3]
    """

    _parameters = ("gamma", "gae_lambda", "gamma_intrinsic", "normalize_advantage", "advantage_eps")

    def __init__(
        self,
        num_steps: int,
        *,
        gamma: float = 0.99,
        gae_lambda: float | None = 0.95,
        gamma_intrinsic: float = 0.99,
        intrinsic_filter: str = "forward",
        normalize_advantage: bool = True,
        advantage_eps: float = 1e-5,
        recurrent: bool = False,
        num_mini_batch: int | None = 1,
        mini_batch_size: int | None = None,
        shuffle: bool = True,
        keys: OnPolicyKeys | dict[str, Any] | None = None,
        carry_keys: Any = None,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        self.keys = keys if isinstance(keys, OnPolicyKeys) else OnPolicyKeys(**(keys or {}))
        self.recurrent = recurrent
        # Each setting checks its value (subclasses set their extra parameters first).
        self.gamma, self.gae_lambda, self.gamma_intrinsic = gamma, gae_lambda, gamma_intrinsic
        self.normalize_advantage, self.advantage_eps = normalize_advantage, advantage_eps
        check_choice("intrinsic_filter", intrinsic_filter, ("forward", "backward"))
        self.intrinsic_normalizer = IntrinsicRewardNormalizer(
            self.gamma_intrinsic, mode=intrinsic_filter, device=device
        )
        super().__init__(
            storage=RolloutStorage(num_steps, carry_keys=carry_keys, device=device),
            sampler=self._make_sampler(num_mini_batch, mini_batch_size, shuffle),
            batch_size=1,
            generator=generator,
        )
        self._constructor_sampler = self.sampler  # generate_batches() without a split returns to it

    # Settings: every assignment (update_storage_parameter's too) runs the constructor's check.
    gamma = CheckedSetting(check_real, "Discount of the extrinsic stream, in ``[0, 1]``.", low=0.0, high=1.0)
    gae_lambda = CheckedSetting(check_gae_lambda, "GAE lambda in ``[0, 1]``, or ``None`` for discounted returns.")
    gamma_intrinsic = CheckedSetting(
        check_real, "Discount of the intrinsic stream, in ``[0, 1]``.", hook="_gamma_intrinsic_changed",
        low=0.0, high=1.0,
    )
    normalize_advantage = CheckedSetting(check_bool, "Scale advantages to zero mean, unit std, a bool.")
    advantage_eps = CheckedSetting(check_real, "Added to the advantages' std, ``>= 0``.", low=0.0)
    recurrent = CheckedSetting(
        check_bool, "Minibatches of whole env sequences (used by the next :meth:`generate_batches` split), a bool."
    )

    def _gamma_intrinsic_changed(self, gamma_intrinsic: float) -> None:
        if hasattr(self, "intrinsic_normalizer"):  # absent while the constructor runs
            self.intrinsic_normalizer.gamma = gamma_intrinsic

    # ------------------------------------------------------------------
    def _make_sampler(self, num_mini_batch: int | None, mini_batch_size: int | None, shuffle: bool) -> Any:
        cls = NaiveRecurrentMinibatchSampler if self.recurrent else FeedForwardMinibatchSampler
        check_optional_count("num_mini_batch", num_mini_batch)  # checked even when mini_batch_size wins
        num_mini_batch = num_mini_batch if mini_batch_size is None else None  # mini_batch_size wins
        return cls(num_mini_batch, mini_batch_size=mini_batch_size, shuffle=shuffle)

    def _write(self, write: Callable[..., None], *args: Any) -> None:
        """Runs a storage write under the buffer's locks, as TorchRL's ``extend`` does, and
        wakes the waiters (``wait_until_sampleable``, ``sample(wait=True)``) after it: TorchRL
        only wakes them from its own ``extend``/``add``, which these writes bypass."""
        try:
            with _compat.replay_lock(self), _compat.write_lock(self):
                write(*args)
        finally:
            _compat.notify_state_change(self)

    def insert(self, step: TensorDictBase) -> None:
        """Writes one collector step ``[N]`` (pytorchrl's ``insert_transition``)."""
        self._write(self.storage.insert, step)

    insert_transition = insert

    used_capacity = read_only("storage.step", "Steps filled since the last :meth:`after_update` "
                              "(only these are used).")

    def after_update(self) -> None:
        """Moves the slot after the last step to slot 0 and restarts (pytorchrl's ``after_gradients``)."""
        self._write(self.storage.after_update)

    def get_all_buffer_data(self, to_cpu: bool = False) -> TensorDictBase:
        """The filled steps and the slot after them, ``[L + 1, N]`` (inserted entries only)."""
        storage = self.storage
        data = storage.data[: storage.step + 1].select(*storage.step_keys).clone()
        return data.to("cpu") if check_bool("to_cpu", to_cpu) else data

    def insert_data_slice(self, data: TensorDictBase) -> None:
        """Takes over a rollout from :meth:`get_all_buffer_data` (e.g. of a remote worker)."""
        self._write(self.storage.write_rollout, data)

    def update_storage_parameter(self, name: str, value: Any) -> None:
        """Changes ``gamma``, ``gae_lambda``, ... between rollouts; unknown names raise."""
        if name not in self._parameters:
            raise ValueError(
                f"{type(self).__name__} has no parameter {name!r}; it can update "
                f"{', '.join(self._parameters)}."
            )
        setattr(self, name, value)  # each parameter is a checked setting

    # ------------------------------------------------------------------
    @torch.no_grad()
    def compute_returns(self, value_network: Callable[[TensorDictBase], Any] | None = None) -> None:
        """Value targets and advantages of the filled steps (pytorchrl's ``before_gradients``).

        Everything is computed and checked before anything is stored: if
        ``value_network`` returns a missing key, another shape or a non-finite
        value, the call raises ``ValueError`` and the rollout is unchanged.

        Args:
            value_network: a TensorDict module writing ``keys.value`` (and
                ``keys.intrinsic_value``) from a step's observation. It runs on
                the slot after the last step (the bootstrap) and on the true
                final ``"next"`` entries of truncated steps. Without it the
                values already stored there are used.
        """
        if self.storage.step == 0:
            raise RuntimeError("the rollout is empty: insert steps before compute_returns().")
        self._commit(self._returns(self.storage.data, value_network))

    def _returns(
        self, data: TensorDictBase, value_network: Any, **estimate: Any
    ) -> dict[str, dict[Any, torch.Tensor]]:
        """The entries :meth:`compute_returns` stores, computed without storing any
        (``estimate``: extra inputs of :meth:`_estimate`)."""
        keys, filled = self.keys, self.storage.step
        stored = data.keys(True, True)
        intrinsic = keys.intrinsic_reward in stored and keys.intrinsic_value in stored
        derived_keys = (keys.advantage, keys.value_target) + (
            (keys.intrinsic_advantage, keys.intrinsic_value_target) if intrinsic else ())
        for key in derived_keys:  # before anything changes: the normalizer, the bootstrap, V-trace's refresh
            self.storage.check_derived_key(key)
        value = data.get(keys.value)[: filled + 1].clone()
        ivalue = data.get(keys.intrinsic_value)[: filled + 1].clone() if intrinsic else None
        updates: dict[Any, torch.Tensor] = {}
        if value_network is not None:
            boot = value_network(data[filled].clone())
            for key, leaf in ((keys.value, value), (keys.intrinsic_value, ivalue)):
                # keys.value first: _network_values raises if the network returned no TensorDict
                if leaf is not None and (key == keys.value or has_leaf(boot, key)):
                    leaf[filled] = _network_values(boot, key, leaf[filled].shape, "value_network")
                    updates[key] = leaf[filled]
        steps = data[:filled]
        done = steps.get(keys.done)
        terminated = steps.get(keys.terminated, done)
        next_value = self._next_values(steps, value[1:], done & ~terminated, value_network)
        advantage, target = self._estimate(steps, value[:filled], next_value, done, terminated, **estimate)
        derived = {keys.advantage: advantage, keys.value_target: target}
        if ivalue is not None:
            # Last: the normalizer updates its running statistics (all-or-nothing itself).
            reward = self.intrinsic_normalizer(steps.get(keys.intrinsic_reward))
            never = torch.zeros_like(done)
            advantage, target = self._gae(self.gamma_intrinsic, ivalue[:filled], ivalue[1:], reward, never, never)
            derived.update({keys.intrinsic_advantage: advantage, keys.intrinsic_value_target: target})
        return {"bootstrap": updates, "derived": derived}

    def _commit(self, results: dict[str, dict[Any, torch.Tensor]]) -> None:
        data, filled = self.storage.data, self.storage.step
        for key, value in results["bootstrap"].items():
            data.get(key)[filled] = value
        for key, value in results["derived"].items():
            if key in (self.keys.advantage, self.keys.intrinsic_advantage) and self.normalize_advantage:
                value = _normalized(value, self.advantage_eps)
            padded = value.new_zeros((self.storage.num_steps + 1, *value.shape[1:]))
            padded[:filled] = value
            self.storage.set_derived(key, padded)

    def _next_values(
        self, steps: TensorDictBase, next_value: torch.Tensor, truncated: torch.Tensor, value_network: Any
    ) -> torch.Tensor:
        """``V`` of the following slot, except at truncations: ``V`` of the true final observation."""
        if not bool(truncated.any()):
            return next_value
        rows = truncated.reshape(truncated.shape[:2] + (-1,)).any(-1)  # [L, N]
        stored_next = steps.get(next_key(self.keys.value), None)
        if stored_next is not None:
            final = stored_next[rows]
        elif value_network is not None:
            shape = next_value[rows].shape
            final = _network_values(value_network(steps.get("next")[rows].clone()), self.keys.value, shape,
                                    "value_network (on the final observations of truncated steps)")
        else:
            raise ValueError(
                "some steps are truncated (done but not terminated): their bootstrap needs V of the "
                "true final observation; pass compute_returns(value_network=critic) or store "
                f"{next_key(self.keys.value)!r} in the steps."
            )
        next_value = next_value.clone()
        next_value[rows] = final.to(next_value.dtype)
        return next_value

    def _estimate(self, steps, value, next_value, done, terminated) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gae(self.gamma, value, next_value, steps.get(self.keys.reward), done, terminated)

    def _gae(self, gamma: float, *signals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE of ``signals`` as the kernel takes them (value, next value, reward, done, terminated)."""
        lmbda = 1.0 if self.gae_lambda is None else self.gae_lambda
        return generalized_advantage_estimate(gamma, lmbda, *signals, time_dim=0)

    # ------------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        """Adds the intrinsic reward normalizer (running statistics, forward filter)."""
        state = super()._extra_state()
        normalizer = self.intrinsic_normalizer.state_dict()
        state["intrinsic_normalizer"] = {"names": list(normalizer),
                                         "values": [t.clone() for t in normalizer.values()]}
        log_prob = getattr(self, "behaviour_log_prob", None)
        state["behaviour_log_prob"] = [] if log_prob is None else [log_prob.clone()]
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        saved = state["intrinsic_normalizer"]
        self.intrinsic_normalizer.load_state_dict(dict(zip(saved["names"], saved["values"])))
        if state.get("behaviour_log_prob"):
            self.behaviour_log_prob = state["behaviour_log_prob"][0]
        else:  # saved before compute_returns: a previous rollout's must not outlive the load
            vars(self).pop("behaviour_log_prob", None)

    def generate_batches(
        self,
        num_mini_batch: int | None = None,
        mini_batch_size: int | None = None,
        num_epochs: int = 1,
        shuffle: bool | None = None,
    ) -> Iterator[TensorDictBase]:
        """``num_epochs`` epochs of minibatches over the filled steps.

        Give ``num_mini_batch`` or ``mini_batch_size`` (steps, or env sequences
        when ``recurrent``); with neither, the constructor's split is used.
        ``shuffle=None`` keeps the constructor's setting. Every filled step
        appears once per epoch. The arguments and the split are checked at the
        call, before anything changes; a split or ``shuffle`` other than the
        constructor's gets a sampler of its own (the buffer's sampler until the
        next call), so the constructor's sampler is never altered.
        """
        check_int("num_epochs", num_epochs, minimum=1)
        sampler = getattr(self, "_constructor_sampler", self.sampler)  # older pickles lack it
        shuffle = sampler.shuffle if shuffle is None else check_bool("shuffle", shuffle)
        if num_mini_batch is not None or mini_batch_size is not None or shuffle != sampler.shuffle:
            if num_mini_batch is None and mini_batch_size is None:
                num_mini_batch, mini_batch_size = sampler.num_mini_batch, sampler.mini_batch_size
            sampler = self._make_sampler(num_mini_batch, mini_batch_size, shuffle)
            _compat.set_generator(sampler, _compat.generator(self))
        sampler.check_split(self.storage)
        if self.sampler is not sampler:
            self.set_sampler(sampler)
        return self._epochs(num_epochs)

    def _epochs(self, num_epochs: int) -> Iterator[TensorDictBase]:
        for _ in range(num_epochs):
            self.sampler.new_epoch()
            yield from self


class VTraceReplayBuffer(OnPolicyReplayBuffer):
    """V-trace targets for off-policy actors (IMPALA), pytorchrl's ``VTraceBuffer`` intended behaviour.

    Keyword Args:
        rho_thresh, c_thresh: clip thresholds of the importance ratios.
        advantage_eps: defaults to 1e-8.
        **kwargs: see :class:`OnPolicyReplayBuffer`. ``gae_lambda`` is the lambda of the
            intrinsic stream's GAE, as in :class:`OnPolicyReplayBuffer` (``None``: the
            discounted returns of pytorchrl's vanilla storage, which its ``VTraceBuffer``
            derives from but whose intrinsic step it skips); the V-trace targets do not use it.

    :meth:`compute_returns` takes ``refresh``: called on the filled steps
    ``[L, N]`` before the targets, it returns them with ``keys.log_prob`` (the
    current actor's log-probs of the stored actions) and ``keys.value`` (the
    current critic). The behaviour log-probs are those stored at collection;
    afterwards ``keys.log_prob`` holds the refreshed ones, so a PPO-style ratio
    starts at 1, and :attr:`behaviour_log_prob` keeps the behaviour ones (for
    logging the importance ratios). Log-probs may be ``[N]`` per step (as
    TorchRL actors write them) or shaped like the values ``[N, 1]``.
    """

    _parameters = OnPolicyReplayBuffer._parameters + ("rho_thresh", "c_thresh")

    def __init__(self, num_steps: int, *, rho_thresh: float = 1.0, c_thresh: float = 1.0,
                 advantage_eps: float = 1e-8, **kwargs: Any) -> None:
        self.rho_thresh, self.c_thresh = rho_thresh, c_thresh  # checked by the settings
        super().__init__(num_steps, advantage_eps=advantage_eps, **kwargs)

    rho_thresh = CheckedSetting(check_clip_threshold, "Clip threshold of the importance ratios in the targets.")
    c_thresh = CheckedSetting(check_clip_threshold, "Clip threshold of the trace coefficients.")

    @torch.no_grad()
    def compute_returns(
        self,
        value_network: Callable[[TensorDictBase], Any] | None = None,
        refresh: Callable[[TensorDictBase], TensorDictBase] | None = None,
    ) -> None:
        """V-trace ``vs`` (``value_target``) and advantages; see the class docstring for ``refresh``.

        As in :meth:`OnPolicyReplayBuffer.compute_returns`, nothing is stored
        unless every output of ``refresh`` and ``value_network`` checks out.
        """
        keys, filled = self.keys, self.storage.step
        if filled == 0:
            raise RuntimeError("the rollout is empty: insert steps before compute_returns().")
        data = self.storage.data
        if not has_leaf(data, keys.log_prob):
            raise ValueError(
                f"the steps carry no {keys.log_prob!r}: insert the behaviour policy's log-prob of each "
                "action there (or set keys=OnPolicyKeys(log_prob=...) to where your actor writes it)."
            )
        behaviour = data.get(keys.log_prob)[:filled].clone()
        view = data
        if refresh is not None:
            out = refresh(data[:filled].clone())
            view = data.clone(False)  # the refreshed entries, without touching the rollout yet
            for key in (keys.log_prob, keys.value):
                leaf = data.get(key).clone()
                leaf[:filled] = _network_values(out, key, leaf[:filled].shape, "refresh")
                view.set(key, leaf)
        results = self._returns(view, value_network, behaviour=behaviour)
        if view is not data:
            for key in (keys.log_prob, keys.value):
                data.get(key)[:filled] = view.get(key)[:filled]
        #: Log-probs of the stored actions under the behaviour policy, ``[L, N, ...]``.
        self.behaviour_log_prob = behaviour
        self._commit(results)

    def _estimate(
        self, steps, value, next_value, done, terminated, behaviour
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Actors write log-probs [L, N]; values are [L, N, 1]: align them.
        log_pi = steps.get(self.keys.log_prob).reshape(value.shape)
        log_mu = behaviour.reshape(value.shape)
        return vtrace_advantage_estimate(
            self.gamma, log_pi, log_mu, value, next_value,
            steps.get(self.keys.reward), done, terminated, self.rho_thresh, self.c_thresh, time_dim=0,
        )


def _normalized(advantage: torch.Tensor, eps: float) -> torch.Tensor:
    """``advantage`` at zero mean, divided by its unbiased std plus ``eps`` (pytorchrl's rule).

    One value (a one-step, one-env rollout) has no spread: its std is taken as 0 (the unbiased
    std of one value is NaN), so it becomes 0. Without spread and with ``eps=0`` the centred
    zeros are kept rather than divided by 0."""
    std = advantage.std(correction=1) if advantage.numel() > 1 else advantage.new_zeros(())
    return (advantage - advantage.mean()) / (std + eps).clamp_min(torch.finfo(advantage.dtype).tiny)


def _network_values(out: Any, key: Any, shape: torch.Size, source: str) -> torch.Tensor:
    """``out[key]`` reshaped to ``shape``; a missing key, another size or a non-finite value raises."""
    if not isinstance(out, TensorDictBase) or not has_leaf(out, key):
        raise ValueError(
            f"{source} must return the steps with {key!r} set (the TensorDict it was given); "
            f"got {type(out).__name__} without it."
        )
    value = out.get(key)
    if value.numel() != shape.numel():
        raise ValueError(
            f"{source} wrote {key!r} of shape {list(value.shape)}; expected {list(shape)} "
            "(one value per env, as stored)."
        )
    check_finite(str(key), value, f"{source} wrote them and nothing was stored; fix the network's outputs.")
    return value.reshape(shape)
