"""Train SAC with n-step returns on gymnasium ``Pendulum-v1``: TorchRL's loss, torchrl_ext's buffer.

Run from the repository root::

    python examples/sac_nstep/train.py
    python examples/sac_nstep/train.py experiment=sac_nstep_smoke       # a few seconds
    python examples/sac_nstep/train.py buffer.sampler.n_step=1 collector.total_frames=5000

The config is ``conf/sac_nstep.yaml``; it picks ``conf/buffer/nstep_ring.yaml`` and
``conf/env/pendulum.yaml``. The replay buffer is an
:class:`~torchrl_ext.replay_buffers.EnvRingReplayBuffer` sampled by
:class:`~torchrl_ext.samplers.NStepSampler`: every sampled transition sums up to
``n_step`` discounted rewards of the same episode and carries ``steps_to_next_obs``,
which TorchRL's TD(0) estimator inside ``SACLoss`` turns into
``gamma ** steps_to_next_obs``. The chain stops at episode ends with the done flags of
the step it stops at, so no target bootstraps past a termination (TorchRL's
``MultiStepTransform`` does).

Hydra writes ``metrics.csv`` (one row per collected batch after the warm-up) and
``learning_curve.png`` into its run directory. :func:`train` is a plain function of the
config, driven by the tests through Hydra's compose API.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration", "frames", "episode_return", "loss_actor", "loss_qvalue", "loss_alpha",
    "alpha", "mean_steps_to_next_obs", "elapsed_s",
)


def make_env(env_cfg: DictConfig, seed: int) -> Any:
    """The env of ``env_cfg`` with ``RewardSum``, which the logging reads at episode ends."""
    from torchrl.envs import RewardSum, TransformedEnv

    env = TransformedEnv(instantiate(env_cfg), RewardSum())
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
    """Train n-step SAC as described by ``cfg``; write metrics and the curve to ``output_dir``.

    Returns:
        A dict with ``final_return`` (the latest finished episode's return at the last
        batch), ``eval_return`` (one greedy episode of ``eval.max_steps`` steps),
        ``reached_at`` (frames when ``logging.target`` was first reached, or ``None``),
        ``frames``, ``elapsed_s``, ``rows`` and the paths ``output_dir``, ``csv_path``
        and ``png_path``.
    """
    import torch
    from torchrl.collectors import Collector
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.objectives import SACLoss, SoftUpdate
    from tqdm import tqdm

    torch.manual_seed(int(cfg.seed))
    torch.set_num_threads(int(cfg.threads))
    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png
    frames_per_batch = int(cfg.collector.frames_per_batch)
    total_frames = int(cfg.collector.total_frames)
    init_random_frames = int(cfg.collector.init_random_frames)

    env = make_env(cfg.env, int(cfg.seed))
    actor, qvalue = make_modules(env, list(cfg.model.hidden_sizes))
    with torch.no_grad():  # materialise the lazy layers
        td = env.reset()
        actor(td)
        qvalue(actor(td))
    loss = SACLoss(actor_network=actor, qvalue_network=qvalue, num_qvalue_nets=2)
    loss.make_value_estimator(gamma=float(cfg.loss.gamma))
    target_update = SoftUpdate(loss, eps=float(cfg.loss.target_update_eps))
    optim = torch.optim.Adam(loss.parameters(), lr=float(cfg.optim.lr))

    # A generator cannot be written in YAML; passed here, the sampling order follows `seed`.
    rb = instantiate(cfg.buffer, generator=torch.Generator().manual_seed(int(cfg.seed)))
    collector = Collector(
        env, actor, frames_per_batch=frames_per_batch,
        total_frames=total_frames, init_random_frames=init_random_frames,
        auto_register_policy_transforms=False,  # feed-forward policy: no InitTracker needed
    )
    target = float(cfg.logging.target)
    metrics = MetricsLog(csv_path, CSV_COLUMNS, target=("episode_return", target))
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    start, episode_return = time.perf_counter(), float("nan")
    frames = 0
    with metrics:
        for iteration, data in enumerate(collector):
            # One env: the batch is one stream of consecutive steps, written as [1, T].
            rb.extend(data.exclude("collector").unsqueeze(0), env_ids=torch.tensor([0]))
            done = data["next", "done"].squeeze(-1)
            if bool(done.any()):
                episode_return = float(data["next", "episode_reward"][done].mean())
            frames = (iteration + 1) * frames_per_batch
            if frames <= init_random_frames:
                pbar.update(data.numel())
                continue  # warm-up: random actions only
            for _ in range(int(cfg.optim.updates_per_batch)):
                batch = rb.sample()
                losses = loss(batch)
                total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
                optim.zero_grad()
                total.backward()
                optim.step()
                target_update.step()
            collector.update_policy_weights_()
            metrics.write({
                "iteration": iteration, "frames": frames, "episode_return": episode_return,
                **{key: float(losses[key].detach())
                   for key in ("loss_actor", "loss_qvalue", "loss_alpha", "alpha")},
                "mean_steps_to_next_obs": float(batch["steps_to_next_obs"].float().mean()),
                "elapsed_s": round(time.perf_counter() - start, 2),
            })
            # refresh=False: update() redraws once, with the new postfix.
            pbar.set_postfix(ret=f"{episode_return:.1f}", refresh=False)
            pbar.update(data.numel())
    pbar.close()
    collector.shutdown()
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        rollout = env.rollout(int(cfg.eval.max_steps), actor)
    env.close()

    rows = metrics.rows
    title = f"SAC, {int(cfg.buffer.sampler.n_step)}-step, on {cfg.env.env_name}"
    save_learning_curve(rows, png_path, title, target=target)
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=float(rollout["next", "reward"].sum()))


@hydra.main(config_path="../../conf", config_name="sac_nstep", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print the summary."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("sac_nstep", result, target=float(cfg.logging.target)))


if __name__ == "__main__":
    main()
