"""DQN on gymnasium ``CartPole-v1`` learning from ALF-style trajectory windows.

Run from the repository root::

    python examples/alf_trajectory/train.py
    python examples/alf_trajectory/train.py experiment=alf_trajectory_smoke   # a few seconds
    python examples/alf_trajectory/train.py loss.batch_length=2 loss.lmbda=0  # one-step DQN

The config is ``conf/alf_trajectory.yaml``; it picks ``conf/buffer/alf_trajectory.yaml``
(:func:`torchrl_ext.presets.alf_replay_buffer`) and ``conf/env/cartpole.yaml``.

The replay buffer keeps one ring per environment, as ALF's ``ReplayBuffer`` does: every
collected batch ``[num_envs, steps]`` is written with ``env_ids``, and a sample is
``[batch_size, batch_length]``, windows of ``batch_length`` consecutive steps of one env
(ALF's ``get_batch(batch_size, batch_length)``). The Q-learning targets are computed
along each window, as ALF's ``TDLoss`` does: TD(lambda) returns whose trace is cut at
every episode end inside the window, that bootstrap from the target network's value of
the next observation (the double-DQN choice of action by default), and that end with a
plain bootstrap at the window's last step. ``lmbda=1`` gives the n-step return to the
end of the window (up to ``batch_length`` steps), ``lmbda=0`` one-step Q-learning.

Hydra writes ``metrics.csv`` (one row per collected batch after the warm-up) and
``learning_curve.png`` into its run directory. :func:`train` is a plain function of the
config, driven by the tests through Hydra's compose API.
"""
from __future__ import annotations

import copy
import functools
import math
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from tensordict import TensorDictBase
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration",
    "frames",
    "episode_return",
    "episodes_finished",
    "loss",
    "q_mean",
    "target_mean",
    "windows_with_end",
    "epsilon",
    "updates",
    "elapsed_s",
)

# What the rings keep of each collected step: enough for a Q-learning target, no more.
STORED_KEYS: tuple[Any, ...] = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
)


def make_env(env_cfg: DictConfig, num_envs: int, seed: int) -> Any:
    """``num_envs`` copies of ``env_cfg`` stepped in turn in this process, seeded from ``seed``.

    A ``SerialEnv`` rather than a ``ParallelEnv``: a CartPole step is far cheaper than
    the inter-process round trip a worker process would add to it. ``RewardSum`` sits
    outside the ``SerialEnv`` (one transform call per batched step) and gives the episode
    returns that the logging reads at episode ends.
    """
    from torchrl.envs import RewardSum, SerialEnv, TransformedEnv

    env = TransformedEnv(SerialEnv(num_envs, functools.partial(instantiate, env_cfg)), RewardSum())
    env.set_seed(seed)
    return env


def make_qnet(obs_dim: int, n_actions: int, hidden_sizes: list[int]) -> nn.Module:
    """An MLP from observations to one Q-value per action."""
    from torchrl.modules import MLP

    return MLP(in_features=obs_dim, out_features=n_actions, num_cells=list(hidden_sizes),
               activation_class=nn.ReLU)


def window_targets(
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    next_q_target: torch.Tensor,
    gamma: float,
    lmbda: float,
    next_q_online: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""TD(lambda) Q-learning targets along windows of consecutive steps.

    With :math:`\bar V_t = (1 - \mathrm{term}_t)\, Q_{\mathrm{target}}(s'_t, a^*_t)`
    (:math:`a^*_t` the greedy action of ``next_q_online`` if given, double DQN, else of
    ``next_q_target``)::

        G_t = r_t + gamma * V_t                                      at an episode end or t = T - 1
        G_t = r_t + gamma * ((1 - lmbda) * V_t + lmbda * G_{t+1})    otherwise

    so no return crosses an episode end inside the window, a truncated episode still
    bootstraps from its last next observation, and the last step of the window
    bootstraps from the target network. ``lmbda=1`` is the n-step return to the window's
    end, ``lmbda=0`` the one-step target. This is the lambda-return of ALF's ``TDLoss``,
    with its per-step ``discount`` expressed through TorchRL's done and terminated flags.

    Args:
        reward: ``[B, T, 1]`` rewards ``r_t``.
        done: ``[B, T, 1]`` bool, the episode ended after step ``t`` (terminated or truncated).
        terminated: ``[B, T, 1]`` bool, the episode ended in a terminal state: no bootstrap.
        next_q_target: ``[B, T, A]`` target-network Q-values of the next observations.
        gamma: discount.
        lmbda: trace parameter in ``[0, 1]``.
        next_q_online: ``[B, T, A]`` online-network Q-values of the next observations, to
            pick the bootstrap action (double DQN); ``None`` takes the target's max.

    Returns:
        ``[B, T]`` targets, without autograd history.
    """
    from torchrl_ext.value.functional import td_lambda_return_estimate

    if next_q_online is None:
        next_value = next_q_target.max(dim=-1, keepdim=True).values
    else:
        best = next_q_online.argmax(dim=-1, keepdim=True)
        next_value = next_q_target.gather(-1, best)
    returns = td_lambda_return_estimate(
        gamma, lmbda, next_value, reward.to(next_value.dtype), done, terminated, time_dim=-2
    )
    return returns.squeeze(-1)


def window_loss(
    window: TensorDictBase,
    qnet: nn.Module,
    target_qnet: nn.Module,
    gamma: float,
    lmbda: float,
    double_dqn: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Huber loss of ``Q(s_t, a_t)`` against :func:`window_targets` on every step of ``window``.

    Args:
        window: a ``[B, T]`` sample of the ALF buffer (the keys of :data:`STORED_KEYS`).
        qnet, target_qnet: online and target Q-networks.
        gamma, lmbda, double_dqn: as in :func:`window_targets`.

    Returns:
        The scalar loss and diagnostics (``q_mean``, ``target_mean``, ``windows_with_end``).
    """
    nxt = window["next"]
    q = qnet(window["observation"])
    q_taken = (q * window["action"].to(q.dtype)).sum(-1)  # one-hot actions from GymEnv
    with torch.no_grad():
        next_obs = nxt["observation"]
        targets = window_targets(
            nxt["reward"], nxt["done"], nxt["terminated"], target_qnet(next_obs),
            gamma, lmbda, next_q_online=qnet(next_obs) if double_dqn else None,
        )
    loss = nn.functional.smooth_l1_loss(q_taken, targets)
    stats = {
        "q_mean": float(q_taken.detach().mean()),
        "target_mean": float(targets.mean()),
        # How often the episode-end handling matters: windows with a done before their last step.
        "windows_with_end": float(nxt["done"][:, :-1].any(dim=1).float().mean()),
    }
    return loss, stats


def evaluate(policy: nn.Module, env_cfg: DictConfig, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` greedy episodes on a fresh single env.

    Under ``ExplorationType.DETERMINISTIC`` the policy's ``EGreedyModule`` passes the
    greedy action through untouched, so the collecting policy itself is evaluated.
    """
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    env = TransformedEnv(instantiate(env_cfg), RewardSum())
    env.set_seed(seed)
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            # CartPole-v1 truncates at 500 steps, well inside max_steps.
            rollout = env.rollout(max_steps=100_000, policy=policy, break_when_any_done=True)
            returns.append(float(rollout["next", "episode_reward"][-1]))
    env.close()
    return sum(returns) / len(returns)


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train DQN from ALF-style windows as described by ``cfg``; write metrics and the curve.

    Args:
        cfg: the composed config (``conf/alf_trajectory.yaml``).
        output_dir: where ``metrics.csv`` and ``learning_curve.png`` go (default: the cwd).

    Returns:
        A dict with ``final_return`` (the ``episode_return`` of the last row),
        ``eval_return`` (greedy episodes after training, ``nan`` if ``eval.episodes=0``),
        ``reached_at`` (frames when ``logging.target`` was first reached, or ``None``),
        ``frames``, ``elapsed_s``, ``rows`` and the paths ``output_dir``, ``csv_path``
        and ``png_path``.
    """
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.modules import EGreedyModule, QValueModule
    from tqdm import tqdm

    seed = int(cfg.seed)
    torch.manual_seed(seed)
    torch.set_num_threads(int(cfg.threads))
    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png

    num_envs = int(cfg.collector.num_envs)
    frames_per_batch = num_envs * int(cfg.collector.steps_per_env)
    total_frames = -(-int(cfg.collector.total_frames) // frames_per_batch) * frames_per_batch
    learning_starts = int(cfg.collector.learning_starts)
    gamma, lmbda = float(cfg.loss.gamma), float(cfg.loss.lmbda)
    double_dqn = bool(cfg.loss.double_dqn)
    target_every = int(cfg.loss.target_update_interval)
    updates_per_batch = int(cfg.optim.updates_per_batch)
    max_grad_norm = float(cfg.optim.max_grad_norm)

    env = make_env(cfg.env, num_envs, seed)
    action_spec = env.full_action_spec_unbatched["action"]
    obs_dim = env.observation_spec["observation"].shape[-1]
    qnet = make_qnet(obs_dim, action_spec.shape[-1], list(cfg.model.hidden_sizes))
    target_qnet = copy.deepcopy(qnet).requires_grad_(False)
    egreedy = EGreedyModule(
        action_spec,
        eps_init=float(cfg.exploration.eps_init),
        eps_end=float(cfg.exploration.eps_end),
        annealing_num_steps=int(cfg.exploration.annealing_frames),
    )
    policy = TensorDictSequential(
        TensorDictModule(qnet, in_keys=["observation"], out_keys=["action_value"]),
        QValueModule(spec=action_spec),
        egreedy,
    )
    optim = torch.optim.Adam(qnet.parameters(), lr=float(cfg.optim.lr))

    # A generator cannot be written in YAML; passed here, the window draws follow `seed`.
    rb = instantiate(cfg.buffer, generator=torch.Generator().manual_seed(seed))
    env_ids = torch.arange(num_envs)
    collector = Collector(
        env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
        auto_register_policy_transforms=False,  # feed-forward policy: no InitTracker needed
    )

    target = float(cfg.logging.target)
    metrics = MetricsLog(csv_path, CSV_COLUMNS, target=("episode_return", target))
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    start = time.perf_counter()
    frames = updates = 0
    episode_return = float("nan")
    with metrics:
        for iteration, data in enumerate(collector):
            frames += data.numel()
            pbar.update(data.numel())
            egreedy.step(data.numel())
            # data is [num_envs, steps]: row e is the next `steps` steps of env e, appended
            # to ring e (ALF's add_batch(batch, env_ids), one call for all the steps).
            rb.extend(data.select(*STORED_KEYS), env_ids=env_ids)
            done = data["next", "done"].squeeze(-1)
            finished = data["next", "episode_reward"].squeeze(-1)[done]
            if finished.numel():
                episode_return = float(finished.mean())
            elif math.isnan(episode_return):
                # Nothing finished yet: the running returns, a lower bound, keep the column finite.
                episode_return = float(data["next", "episode_reward"][:, -1].mean())
            if frames < learning_starts:
                continue  # warm-up: fill the rings with (mostly) random play

            sums = {"loss": 0.0, "q_mean": 0.0, "target_mean": 0.0, "windows_with_end": 0.0}
            for _ in range(updates_per_batch):
                window = rb.sample()  # [batch_size, batch_length]
                loss, stats = window_loss(window, qnet, target_qnet, gamma, lmbda, double_dqn)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(qnet.parameters(), max_grad_norm)
                optim.step()
                updates += 1
                if updates % target_every == 0:
                    target_qnet.load_state_dict(qnet.state_dict())
                sums["loss"] += float(loss.detach())
                for key, value in stats.items():
                    sums[key] += value
            # The collector holds the same qnet object: nothing to copy, kept for other devices.
            collector.update_policy_weights_()
            metrics.write({
                "iteration": iteration,
                "frames": frames,
                "episode_return": episode_return,
                "episodes_finished": int(finished.numel()),
                **{key: value / max(updates_per_batch, 1) for key, value in sums.items()},
                "epsilon": float(egreedy.eps),
                "updates": updates,
                "elapsed_s": round(time.perf_counter() - start, 2),
            })
            pbar.set_postfix(ret=f"{episode_return:.1f}", eps=f"{float(egreedy.eps):.2f}",
                             refresh=False)
    pbar.close()
    collector.shutdown()  # closes env too

    episodes = int(cfg.eval.episodes)
    # A different seed, so the greedy episodes start from states training did not see.
    eval_return = (evaluate(policy, cfg.env, episodes, seed + 10_000) if episodes > 0
                   else float("nan"))
    rows = metrics.rows
    title = (f"DQN on {cfg.env.env_name}, windows of {int(cfg.loss.batch_length)} steps, "
             f"lambda {lmbda:g}")
    save_learning_curve(rows, png_path, title, target=target)
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=eval_return)


@hydra.main(config_path="../../conf", config_name="alf_trajectory", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print the summary."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("alf_trajectory", result, target=float(cfg.logging.target)))


if __name__ == "__main__":
    main()
