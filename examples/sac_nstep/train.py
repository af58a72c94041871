"""Train SAC with n-step returns on gymnasium ``Pendulum-v1``: TorchRL's loss, torchrl_ext's buffer.

Run from the repository root::

    python examples/sac_nstep/train.py
    python examples/sac_nstep/train.py buffer.n_step=1 collector.total_frames=5000

The replay buffer is an :class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer`
sampled by :class:`~torchrl_ext.samplers.NStepSampler`: every sampled
transition sums up to ``n_step`` discounted rewards of the same episode and
carries ``steps_to_next_obs``, which TorchRL's TD(0) estimator inside
``SACLoss`` turns into ``gamma ** steps_to_next_obs``. The chain stops at
episode ends with the done flags of the step it stops at, so no target
bootstraps past a termination (TorchRL's ``MultiStepTransform`` does).

Hydra writes ``metrics.csv`` (one row per collected batch) into its run
directory. :func:`train` is a plain function of the config, driven by the
tests through Hydra's compose API.
"""
from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

log = logging.getLogger(__name__)

CSV_COLUMNS: tuple[str, ...] = (
    "iteration", "frames", "episode_return", "loss_actor", "loss_qvalue", "loss_alpha",
    "alpha", "mean_steps_to_next_obs", "elapsed_s",
)


def make_env(name: str, seed: int) -> Any:
    from torchrl.envs import GymEnv, RewardSum, TransformedEnv

    env = TransformedEnv(GymEnv(name), RewardSum())
    env.set_seed(seed)
    return env


def make_modules(env: Any, hidden: list[int]) -> tuple[Any, Any]:
    """A tanh-normal actor and a Q(s, a) network, as TorchRL's SAC examples build them."""
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator

    action_spec = env.action_spec_unbatched if hasattr(env, "action_spec_unbatched") else env.action_spec
    act_dim = action_spec.shape[-1]
    backbone = nn.Sequential(MLP(out_features=2 * act_dim, num_cells=hidden), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(backbone, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=False,
    )
    qvalue = ValueOperator(MLP(out_features=1, num_cells=hidden), in_keys=["observation", "action"])
    return actor, qvalue


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    import torch
    from torchrl.collectors import Collector
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.objectives import SACLoss, SoftUpdate

    from torchrl_ext.replay_buffers import EnvRingReplayBuffer
    from torchrl_ext.samplers import NStepSampler

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out = Path(output_dir or ".")
    out.mkdir(parents=True, exist_ok=True)

    env = make_env(cfg.env.name, cfg.seed)
    actor, qvalue = make_modules(env, list(cfg.model.hidden_sizes))
    with torch.no_grad():  # materialise the lazy layers
        td = env.reset()
        actor(td)
        qvalue(actor(td))
    loss = SACLoss(actor_network=actor, qvalue_network=qvalue, num_qvalue_nets=2)
    loss.make_value_estimator(gamma=cfg.loss.gamma)
    target_update = SoftUpdate(loss, eps=cfg.loss.target_update_eps)
    optim = torch.optim.Adam(loss.parameters(), lr=cfg.optim.lr)

    rb = EnvRingReplayBuffer(
        num_envs=1, max_length=cfg.buffer.size,
        sampler=NStepSampler(cfg.buffer.n_step, gamma=cfg.loss.gamma),
        batch_size=cfg.optim.batch_size,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    collector = Collector(
        env, actor, frames_per_batch=cfg.collector.frames_per_batch,
        total_frames=cfg.collector.total_frames, init_random_frames=cfg.collector.init_random_frames,
        auto_register_policy_transforms=False,  # feed-forward policy: no InitTracker needed
    )
    rows, start, episode_return = [], time.time(), float("nan")
    with (out / cfg.logging.csv).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for iteration, data in enumerate(collector):
            # One env: the batch is one stream of consecutive steps, written as [1, T].
            rb.extend(data.exclude("collector").unsqueeze(0), env_ids=torch.tensor([0]))
            done = data["next", "done"].squeeze(-1)
            if bool(done.any()):
                episode_return = float(data["next", "episode_reward"][done].mean())
            frames = (iteration + 1) * cfg.collector.frames_per_batch
            if frames <= cfg.collector.init_random_frames:
                continue  # warm-up: random actions only
            for _ in range(cfg.optim.updates_per_batch):
                batch = rb.sample()
                losses = loss(batch)
                total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
                optim.zero_grad()
                total.backward()
                optim.step()
                target_update.step()
            collector.update_policy_weights_()
            row = {
                "iteration": iteration, "frames": frames, "episode_return": episode_return,
                **{key: float(losses[key].detach())
                   for key in ("loss_actor", "loss_qvalue", "loss_alpha", "alpha")},
                "mean_steps_to_next_obs": float(batch["steps_to_next_obs"].float().mean()),
                "elapsed_s": round(time.time() - start, 2),
            }
            writer.writerow(row)
            rows.append(row)
            log.info("frames %d  return %.1f", frames, episode_return)
    collector.shutdown()
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        rollout = env.rollout(200, actor)
    return {"csv_path": str(out / cfg.logging.csv), "rows": rows,
            "eval_return": float(rollout["next", "reward"].sum())}


@hydra.main(config_path=".", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    result = train(cfg, output_dir=HydraConfig.get().runtime.output_dir)
    log.info("evaluation return %.1f (metrics in %s)", result["eval_return"], result["csv_path"])


if __name__ == "__main__":
    main()
