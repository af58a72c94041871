"""IMPALA-style V-trace on gymnasium ``CartPole-v1``: TorchRL envs and collector, torchrl_ext's buffer.

Run from the repository root::

    python examples/impala_vtrace/train.py
    python examples/impala_vtrace/train.py experiment=impala_vtrace_smoke   # a few seconds
    python examples/impala_vtrace/train.py vtrace.actor_lag=8 vtrace.refresh=false

The config is ``conf/impala_vtrace.yaml``; it picks ``conf/buffer/vtrace_on_policy.yaml``
and ``conf/env/cartpole.yaml``.

The rollouts are collected by a *behaviour* copy of the actor and critic that
is ``vtrace.actor_lag`` learner updates old, as IMPALA's actors are. Each
rollout ``[N, T]`` is written step by step into a
:class:`~torchrl_ext.replay_buffers.VTraceReplayBuffer` (``T`` = the buffer's
``num_steps``). Before the targets are computed, the buffer's ``refresh`` hook
(:func:`make_refresh`) evaluates the *current* actor's log-probabilities of the
stored actions and the current critic's values; V-trace weighs the TD errors
with the clipped ratios ``pi / mu`` of current to behaviour policy. The loss is
IMPALA's: policy gradient with the V-trace advantage, squared error to the
V-trace target ``vs`` and an entropy bonus.

Hydra writes ``metrics.csv`` (one row per rollout) and ``learning_curve.png``
into its run directory. :func:`train` is a plain function of the config,
driven by the tests through Hydra's compose API.
"""
from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, greedy_return, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

log = logging.getLogger(__name__)

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration",
    "frames",
    "episode_return",
    "episodes_finished",
    "loss_policy",
    "loss_value",
    "loss_entropy",
    "entropy",
    "ratio_mean",
    "ratio_max",
    "rho_mean",
    "value_target_mean",
    "elapsed_s",
)


def make_env(create_env_fn: Callable[[], Any], num_envs: int, seed: int) -> Any:
    """``num_envs`` envs of ``create_env_fn`` stepped in turn in this process, seeded ``seed, seed + 1, ...``.

    ``create_env_fn`` is the env group's config instantiated with ``_partial_=True``
    (``functools.partial(GymEnv, env_name=..., device=...)``).

    ``StepCounter`` and ``RewardSum`` sit outside the ``SerialEnv``: one
    transform call per batched step instead of one per env, which halves the
    collection time on CartPole.
    """
    from torchrl.envs import Compose, RewardSum, SerialEnv, StepCounter, TransformedEnv

    env = TransformedEnv(
        SerialEnv(num_envs, create_env_fn),
        Compose(StepCounter(), RewardSum()),
    )
    env.set_seed(seed)
    return env


def make_modules(env: Any, hidden_sizes: list[int]) -> tuple[Any, Any]:
    """``(actor, critic)``: a one-hot categorical policy and a ``state_value`` network, no shared weights."""
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator

    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["action"]
    cells = list(hidden_sizes)
    policy_net = MLP(in_features=obs_dim, out_features=action_spec.shape[-1], num_cells=cells,
                     activation_class=nn.Tanh)
    value_net = MLP(in_features=obs_dim, out_features=1, num_cells=cells, activation_class=nn.Tanh)
    # Orthogonal init, small policy head: the initial policy is nearly uniform.
    for net, head_gain in ((policy_net, 0.01), (value_net, 1.0)):
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            nn.init.orthogonal_(layer.weight, gain=head_gain if i == len(linears) - 1 else math.sqrt(2.0))
            nn.init.zeros_(layer.bias)
    actor = ProbabilisticActor(
        module=TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = ValueOperator(value_net, in_keys=["observation"])
    with torch.no_grad():  # fail here, not in the collector, if keys or sizes disagree
        td = env.fake_tensordict()
        actor(td)
        critic(td)
    return actor, critic


class ActorLag:
    """Keeps the behaviour modules ``lag`` learner updates behind the learner's.

    ``behaviour`` is a deep copy of ``learner`` (here actor and critic) that the
    collector runs. After every optimiser step :meth:`step` snapshots the
    learner's weights and loads the one from ``lag`` steps ago into
    ``behaviour`` (in place, so the collector sees it). Until ``lag`` updates
    have happened the behaviour keeps the initial weights; ``lag=0`` collects
    with the current weights (on-policy).
    """

    def __init__(self, learner: Any, lag: int) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ValueError(f"actor_lag must be a non-negative int, got {lag!r}.")
        self.learner = learner
        self.behaviour = copy.deepcopy(learner)
        self.behaviour.requires_grad_(False)
        self._snapshots: deque[dict[str, Any]] = deque([self._snapshot()], maxlen=lag + 1)

    def _snapshot(self) -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in self.learner.state_dict().items()}

    def step(self) -> None:
        self._snapshots.append(self._snapshot())
        self.behaviour.load_state_dict(self._snapshots[0])


def buffer_steps(data: Any) -> Any:
    """The entries of a collected batch ``[N, T]`` that the buffer needs, under its key names.

    TorchRL 0.14's ``ProbabilisticActor`` writes ``"action_log_prob"`` shaped
    ``[N, T]``; the buffer reads it under the same key, shaped like the values,
    ``[N, T, 1]``.
    """
    from tensordict import TensorDict

    return TensorDict(
        {
            "observation": data["observation"],
            "action": data["action"],
            "action_log_prob": data["action_log_prob"].unsqueeze(-1),
            "state_value": data["state_value"],
            "next": {key: data["next", key] for key in ("observation", "reward", "done", "terminated")},
        },
        batch_size=data.batch_size,
    )


def make_refresh(actor: Any, critic: Any, rho_thresh: float, stats: dict[str, float] | None = None
                 ) -> Callable[[Any], Any]:
    """The buffer's ``refresh`` hook: current log-probs of the stored actions and current values.

    It receives the filled steps ``[T, N]`` with the behaviour policy's
    ``"action_log_prob"``; if ``stats`` is given, it records the mean and
    largest importance ratio ``pi / mu`` and the mean clipped ratio
    ``min(rho_thresh, pi / mu)`` that weighs the TD errors, before
    overwriting the behaviour log-probs.
    """
    import torch

    def refresh(steps: Any) -> Any:
        with torch.no_grad():
            log_pi = actor.get_dist(steps).log_prob(steps["action"]).unsqueeze(-1)
            if stats is not None:
                ratio = (log_pi - steps["action_log_prob"]).exp()
                stats["ratio_mean"] = ratio.mean().item()
                stats["ratio_max"] = ratio.max().item()
                stats["rho_mean"] = ratio.clamp(max=rho_thresh).mean().item()
            steps.set("action_log_prob", log_pi)
            critic(steps)  # overwrites "state_value"
        return steps

    return refresh


def compute_vtrace(rb: Any, data: Any, actor: Any, critic: Any, refresh: bool = True) -> dict[str, float]:
    """Insert a rollout ``[N, T]`` step by step and compute the V-trace targets; returns ratio stats.

    With ``refresh=False`` the behaviour log-probs and values stored at
    collection are used as if they were the current ones: the ratio is 1 and
    nothing corrects for the lag (the ablation of ``vtrace.refresh=false``).
    The bootstrap after the last step comes from the current critic either way.
    """
    import torch

    steps = buffer_steps(data)
    for t in range(steps.shape[1]):
        rb.insert(steps[:, t])
    stats = {"ratio_mean": 1.0, "ratio_max": 1.0, "rho_mean": 1.0}
    hook = make_refresh(actor, critic, rb.rho_thresh, stats) if refresh else None
    # The critic bootstraps the last slot and truncated steps; no graph is needed.
    with torch.no_grad():
        rb.compute_returns(value_network=critic, refresh=hook)
    return stats


def _episode_return(data: Any) -> tuple[float, int]:
    """Mean return of the episodes that ended in ``data`` and how many there were.

    When none ended, the mean running return of the episodes in progress at
    the end of the batch (a lower bound), so the column is always finite.
    """
    finished = data["next", "episode_reward"][data["next", "done"]]
    if finished.numel() > 0:
        return finished.float().mean().item(), int(finished.numel())
    return data["next", "episode_reward"][:, -1].float().mean().item(), 0


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train as described by ``cfg``; write ``metrics.csv`` and ``learning_curve.png`` to ``output_dir``.

    Returns:
        A dict with ``final_return`` (the last rollout's ``episode_return``),
        ``eval_return`` (``nan`` if disabled), ``reached_at`` (frames when
        ``logging.target`` was first reached, or ``None``), ``frames``, ``elapsed_s``,
        ``rows`` and the paths ``output_dir``, ``csv_path`` and ``png_path``.
    """
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import RewardSum, TransformedEnv
    from tqdm import tqdm

    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png

    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    num_envs, rollout_length = int(cfg.collector.num_envs), int(cfg.collector.rollout_length)
    env_seed = int(cfg.collector.env_seed)
    if int(cfg.buffer.num_steps) != rollout_length:
        # compute_vtrace fills exactly rollout_length slots; a longer buffer would compute
        # targets over stale slots, a shorter one would overflow.
        raise ValueError(f"buffer.num_steps={cfg.buffer.num_steps} must equal "
                         f"collector.rollout_length={rollout_length}.")
    frames_per_batch = num_envs * rollout_length
    total_frames = -(-int(cfg.collector.total_frames) // frames_per_batch) * frames_per_batch
    if total_frames != int(cfg.collector.total_frames):
        log.info("collecting %d frames (a multiple of num_envs * rollout_length)", total_frames)

    env = make_env(instantiate(cfg.env, _partial_=True), num_envs, env_seed)
    actor, critic = make_modules(env, list(cfg.model.hidden_sizes))
    lag = ActorLag(TensorDictSequential(actor, critic), int(cfg.vtrace.actor_lag))
    collector = Collector(
        env, lag.behaviour,  # the lagged actor and critic act; their weights change in place
        frames_per_batch=frames_per_batch, total_frames=total_frames,
        auto_register_policy_transforms=False,  # feed-forward policy: no InitTracker needed
    )
    # A generator cannot be written in YAML; passed here, the minibatch order follows `seed`.
    rb = instantiate(cfg.buffer, generator=torch.Generator().manual_seed(int(cfg.seed)))
    params = list(actor.parameters()) + list(critic.parameters())
    optim = torch.optim.Adam(params, lr=float(cfg.optim.lr), eps=1e-5)
    entropy_coef, value_coef = float(cfg.loss.entropy_coef), float(cfg.loss.value_coef)
    max_grad_norm = float(cfg.optim.max_grad_norm)

    eval_env = None
    if int(cfg.eval.episodes) > 0:
        # A different seed so evaluation starts from unseen initial states.
        eval_env = TransformedEnv(instantiate(cfg.env), RewardSum())
        eval_env.set_seed(env_seed + 10_000)

    target = float(cfg.logging.target)
    metrics = MetricsLog(csv_path, CSV_COLUMNS, target=("episode_return", target))
    loss_keys = ("loss_policy", "loss_value", "loss_entropy", "entropy")
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    frames, start = 0, time.perf_counter()
    with metrics:
        for iteration, data in enumerate(collector):
            frames += data.numel()
            episode_return, episodes_finished = _episode_return(data)
            stats = compute_vtrace(rb, data, actor, critic, refresh=bool(cfg.vtrace.refresh))
            value_target_mean = rb.storage.data["value_target"][:rollout_length].mean().item()

            sums, updates = dict.fromkeys(loss_keys, 0.0), 0
            # The buffer's num_mini_batch (linked to optim.num_mini_batch) sets the split.
            for batch in rb.generate_batches(num_epochs=int(cfg.optim.epochs)):
                dist = actor.get_dist(batch)
                log_pi = dist.log_prob(batch["action"]).unsqueeze(-1)
                entropy = dist.entropy().unsqueeze(-1).mean()
                value = critic(batch.select("observation"))["state_value"]
                losses = {
                    "loss_policy": -(log_pi * batch["advantage"]).mean(),
                    "loss_value": 0.5 * (value - batch["value_target"]).pow(2).mean(),
                    "loss_entropy": -entropy_coef * entropy,
                    "entropy": entropy.detach(),
                }
                total = losses["loss_policy"] + value_coef * losses["loss_value"] + losses["loss_entropy"]
                optim.zero_grad(set_to_none=True)
                total.backward()
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
                optim.step()
                lag.step()  # the behaviour weights now trail by actor_lag updates
                updates += 1
                for k in loss_keys:
                    sums[k] += losses[k].detach().item()
            rb.after_update()

            metrics.write({
                "iteration": iteration,
                "frames": frames,
                "episode_return": episode_return,
                "episodes_finished": episodes_finished,
                **{k: v / max(updates, 1) for k, v in sums.items()},
                **stats,
                "value_target_mean": value_target_mean,
                "elapsed_s": time.perf_counter() - start,
            })
            # refresh=False: update() redraws once, with the new postfix.
            pbar.set_postfix(ret=f"{episode_return:.1f}", refresh=False)
            pbar.update(data.numel())
    pbar.close()
    collector.shutdown()  # also closes the training env

    eval_return = float("nan")
    if eval_env is not None:
        eval_return = greedy_return(actor, eval_env, int(cfg.eval.episodes))
        eval_env.close()

    rows = metrics.rows
    title = f"V-trace (actor lag {int(cfg.vtrace.actor_lag)}) on {cfg.env.env_name}"
    save_learning_curve(rows, png_path, title, target=target)
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=eval_return)


@hydra.main(config_path="../../conf", config_name="impala_vtrace", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print the summary."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("impala_vtrace", result, target=float(cfg.logging.target)))


if __name__ == "__main__":
    main()
