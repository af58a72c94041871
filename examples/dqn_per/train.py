"""Train DQN on gymnasium ``CartPole-v1`` with prioritized n-step replay.

Run from the repository root::

    python examples/dqn_per/train.py
    python examples/dqn_per/train.py experiment=dqn_per_smoke           # a few seconds
    python examples/dqn_per/train.py buffer.sampler.n_step=1 buffer.sampler.alpha=0

The replay buffer (``conf/buffer/prioritized_nstep.yaml``) is torchrl_ext's
``TensorDictReplayBuffer`` over a ``FastTensorStorage(max_size, ndim=2)`` that
receives the collector's ``[num_envs, T]`` batches as they come, sampled by
:class:`~torchrl_ext.samplers.PrioritizedNStepSampler`: each transition starts
at a step drawn by priority and sums up to ``n_step`` discounted rewards of the
same episode. The double-DQN target is computed here from what the sampler
attaches: ``("next", "reward")`` is already the discounted n-step sum and
``nstep_discount = gamma ** steps_to_next_obs`` discounts the bootstrap, cut
at termination (``("next", "terminated")`` of the chain's last step). Each
transition's Huber loss is weighed by its ``priority_weight`` and the absolute
TD errors go back to the buffer as the new priorities of the sampled starts.
(TorchRL's ``DQNLoss`` with its TD(0) estimator computes the same target from
``steps_to_next_obs``; the few lines here cost a third of its time per update,
which on a small CPU is most of the training time.)

Hydra writes the composed config, ``metrics.csv`` (one row per collected
batch after the warm-up) and ``learning_curve.png`` into its run directory.
:func:`train` is a plain function of the config, driven by the tests through
Hydra's compose API.
"""
from __future__ import annotations

import copy
import logging
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, greedy_return, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

log = logging.getLogger(__name__)

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration", "frames", "episode_return", "episodes", "loss", "epsilon", "beta",
    "mean_priority_weight", "mean_td_error", "mean_steps_to_next_obs", "elapsed_s",
)


def make_env(cfg: DictConfig, seed: int, num_envs: int) -> Any:
    """``conf/env`` with ``num_envs`` copies stepped together in one process, plus ``RewardSum``.

    A ``SerialEnv`` makes the collector yield the ``[num_envs, T]`` batches the
    storage keeps. ``GymEnv(..., num_envs=n)`` would give the same layout through
    gymnasium's vector env, but with gymnasium >= 1.0 its autoreset shows up as a
    zeroed ``("next", "observation")`` at every episode end and one extra step
    from the terminal observation to the reset one with reward 0 and no done
    flag: transitions that are not in the MDP and that n-step chains would read.
    """
    from functools import partial

    from hydra.utils import instantiate
    from torchrl.envs import RewardSum, SerialEnv, TransformedEnv

    make_one = partial(instantiate, cfg.env)
    base = SerialEnv(num_envs, make_one) if num_envs > 1 else make_one()
    env = TransformedEnv(base, RewardSum())
    env.set_seed(seed)
    return env


def make_policy(env: Any, cfg: DictConfig) -> tuple[Any, Any, Any, Any]:
    """``(q_net, q_actor, explore_policy, egreedy)``: the Q-network, the greedy actor
    around it and that actor followed by epsilon-greedy exploration."""
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import MLP, EGreedyModule, QValueActor

    action_spec = env.action_spec_unbatched if hasattr(env, "action_spec_unbatched") else env.action_spec
    obs_dim = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=obs_dim, out_features=action_spec.shape[-1],
              num_cells=list(cfg.model.hidden_sizes), activation_class=torch.nn.ReLU)
    q_actor = QValueActor(net, in_keys=["observation"], spec=action_spec)
    egreedy = EGreedyModule(
        spec=action_spec,
        eps_init=float(cfg.exploration.eps_init),
        eps_end=float(cfg.exploration.eps_end),
        annealing_num_steps=int(cfg.exploration.annealing_frames),
    )
    return net, q_actor, TensorDictSequential(q_actor, egreedy), egreedy


def dqn_loss(q_net: Any, target_net: Any, batch: Any, *, double_dqn: bool, loss_function: str) -> tuple[Any, Any]:
    """Importance-weighted n-step (double) DQN loss and the absolute TD errors ``[B]``.

    The target is ``R + nstep_discount * (1 - terminated) * Q_target(s', a')``
    where ``R`` (``("next", "reward")``) is the sampler's discounted sum over the
    chain, ``s'`` the observation after its last step and ``a'`` the online
    network's greedy action (double DQN) or the target network's.
    """
    import torch
    import torch.nn.functional as F

    action = batch["action"].float()  # one-hot
    q_taken = (q_net(batch["observation"]) * action).sum(-1)
    with torch.no_grad():
        next_obs = batch["next", "observation"]
        next_q = target_net(next_obs)
        chooser = q_net(next_obs) if double_dqn else next_q
        bootstrap = next_q.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
        alive = (~batch["next", "terminated"]).squeeze(-1).float()
        target = batch["next", "reward"].squeeze(-1) + batch["nstep_discount"].squeeze(-1) * alive * bootstrap
    if loss_function == "smooth_l1":
        per_sample = F.smooth_l1_loss(q_taken, target, reduction="none")
    elif loss_function == "l2":
        per_sample = F.mse_loss(q_taken, target, reduction="none")
    else:
        raise ValueError(f"loss.loss_function must be 'smooth_l1' or 'l2', got {loss_function!r}.")
    loss = (batch["priority_weight"] * per_sample).mean()
    return loss, (q_taken - target).detach().abs()


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train DQN as described by ``cfg``; write ``metrics.csv`` and ``learning_curve.png``.

    Args:
        cfg: the composed ``conf/dqn_per.yaml``.
        output_dir: where the outputs go. Defaults to the current working directory.

    Returns:
        ``final_return`` (mean of the last finished episodes), ``eval_return``
        (greedy, ``nan`` when ``eval.episodes=0``), ``reached_at`` (frames when
        ``logging.target`` was first reached, or ``None``), ``frames``,
        ``elapsed_s``, ``rows`` and the paths ``output_dir``, ``csv_path``, ``png_path``.
    """
    import torch
    from hydra.utils import instantiate
    from torchrl.collectors import Collector
    from tqdm import tqdm

    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png
    torch.manual_seed(int(cfg.seed))
    torch.set_num_threads(int(cfg.threads))

    num_envs = int(cfg.collector.num_envs)
    frames_per_batch = int(cfg.collector.frames_per_batch)
    if frames_per_batch % num_envs:
        raise ValueError(
            f"collector.frames_per_batch={frames_per_batch} must be a multiple of "
            f"collector.num_envs={num_envs} (each batch is [num_envs, T])."
        )
    total_frames = -(-int(cfg.collector.total_frames) // frames_per_batch) * frames_per_batch
    init_random_frames = int(cfg.collector.init_random_frames)

    env = make_env(cfg, int(cfg.seed), num_envs)
    q_net, q_actor, explore_policy, egreedy = make_policy(env, cfg)
    with torch.no_grad():  # one pass on fake data: a key or size mismatch fails here
        explore_policy(env.fake_tensordict())

    target_net = copy.deepcopy(q_net).requires_grad_(False)
    target_interval = int(cfg.loss.target_update_interval)
    double_dqn, loss_function = bool(cfg.loss.double_dqn), str(cfg.loss.loss_function)
    optim = torch.optim.Adam(q_net.parameters(), lr=float(cfg.optim.lr))
    max_grad_norm = float(cfg.optim.max_grad_norm)

    rb = instantiate(cfg.buffer, generator=torch.Generator().manual_seed(int(cfg.seed)))
    sampler = rb.sampler
    beta_init, beta_end = float(sampler.beta), float(cfg.per.beta_end)

    collector = Collector(
        env, explore_policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
        init_random_frames=init_random_frames,
        auto_register_policy_transforms=False,  # feed-forward policy: no InitTracker needed
    )
    updates_per_batch = int(cfg.optim.updates_per_batch)
    learn_frames = max(total_frames - init_random_frames, 1)
    recent_returns: deque[float] = deque(maxlen=int(cfg.logging.return_window))
    eval_env = make_env(cfg, int(cfg.seed) + 10_000, 1) if int(cfg.eval.episodes) > 0 else None

    frames, updates, start = 0, 0, time.perf_counter()
    target = float(cfg.logging.target)
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    with MetricsLog(csv_path, CSV_COLUMNS, target=("episode_return", target)) as metrics:
        for iteration, data in enumerate(collector):
            frames += data.numel()
            pbar.update(data.numel())
            done = data["next", "done"]
            recent_returns.extend(data["next", "episode_reward"][done].tolist())
            # [num_envs, T] as collected: the storage keeps each env's steps in its column.
            rb.extend(data.exclude("collector"))
            egreedy.step(data.numel())
            if frames <= init_random_frames:
                continue  # warm-up: random actions only, no updates
            # PER's usual schedule: beta grows linearly to beta_end, removing the
            # sampling bias fully by the end of training.
            progress = min((frames - init_random_frames) / learn_frames, 1.0)
            sampler.beta = beta_init + (beta_end - beta_init) * progress
            sums = dict.fromkeys(("loss", "weight", "td", "steps"), 0.0)
            for _ in range(updates_per_batch):
                batch = rb.sample()
                loss, td_error = dqn_loss(q_net, target_net, batch, double_dqn=double_dqn,
                                          loss_function=loss_function)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(q_net.parameters(), max_grad_norm)
                optim.step()
                updates += 1
                if updates % target_interval == 0:
                    target_net.load_state_dict(q_net.state_dict())
                # New priorities of the sampled starts: PER's |delta|.
                batch["td_error"] = td_error
                rb.update_tensordict_priority(batch)
                sums["loss"] += loss.item()
                sums["weight"] += batch["priority_weight"].mean().item()
                sums["td"] += td_error.mean().item()
                sums["steps"] += batch["steps_to_next_obs"].float().mean().item()
            collector.update_policy_weights_()
            episode_return = (
                sum(recent_returns) / len(recent_returns) if recent_returns
                # No episode has ended yet: the longest running one is a lower bound.
                else float(data["next", "episode_reward"][..., -1, :].max())
            )
            metrics.write({
                "iteration": iteration, "frames": frames, "episode_return": episode_return,
                "episodes": int(done.sum()), "loss": sums["loss"] / updates_per_batch,
                "epsilon": float(egreedy.eps), "beta": sampler.beta,
                "mean_priority_weight": sums["weight"] / updates_per_batch,
                "mean_td_error": sums["td"] / updates_per_batch,
                "mean_steps_to_next_obs": sums["steps"] / updates_per_batch,
                "elapsed_s": round(time.perf_counter() - start, 2),
            })
            pbar.set_postfix(ret=f"{episode_return:.1f}", eps=f"{float(egreedy.eps):.2f}", refresh=False)
    pbar.close()
    collector.shutdown()
    eval_return = float("nan")
    if eval_env is not None:
        eval_return = greedy_return(q_actor, eval_env, int(cfg.eval.episodes), max_steps=1000)
        eval_env.close()
    env.close(raise_if_closed=False)  # the collector may have closed it already

    rows = metrics.rows
    save_learning_curve(rows, png_path, f"DQN + prioritized {sampler.n_step}-step replay, "
                        f"{cfg.env.env_name}", target=target)
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=eval_return)


@hydra.main(config_path="../../conf", config_name="dqn_per", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: train in Hydra's run directory and print the summary line."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("dqn_per", result, target=float(cfg.logging.target)))


if __name__ == "__main__":
    main()
