"""Train PPO on gymnasium ``CartPole-v1`` with TorchRL and torchrl_ext's rollout buffer and GAE.

Run from the repository root::

    python examples/ppo_cartpole/train.py
    python examples/ppo_cartpole/train.py experiment=ppo_cartpole_smoke
    python examples/ppo_cartpole/train.py buffer=torchrl_lazy collector.total_frames=4096

The config is ``conf/ppo_cartpole.yaml``, which composes ``conf/buffer/rollout.yaml``
(``RolloutStorage`` + ``FeedForwardMinibatchSampler``), ``conf/value/gae_lambda.yaml``
and ``conf/env/cartpole.yaml``. Hydra creates a run directory
(``outputs/<date>/<time>`` relative to the current working directory) that
receives the resolved config, ``metrics.csv`` (one row per collected batch) and
``learning_curve.png``.

The training loop lives in :func:`train`, a plain function of the config, so it
can be driven from tests or notebooks through Hydra's compose API without the
``@hydra.main`` machinery.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import hydra
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
    "loss_objective",
    "loss_critic",
    "loss_entropy",
    "entropy",
    "advantage_mean",
    "advantage_std",
    "lr",
    "elapsed_s",
)


def make_env(env_cfg: DictConfig, seed: int) -> Any:
    """Build the seeded TorchRL environment from its config (``conf/env``).

    ``RewardSum`` accumulates the undiscounted return into ``("next",
    "episode_reward")``, which the logging reads when an episode ends;
    ``StepCounter`` adds ``step_count`` so collected batches show where each
    episode is, which is what one looks at first when returns look wrong.
    """
    from hydra.utils import instantiate
    from torchrl.envs import Compose, RewardSum, StepCounter, TransformedEnv

    env = TransformedEnv(instantiate(env_cfg), Compose(StepCounter(), RewardSum()))
    env.set_seed(seed)
    return env


def make_modules(env: Any, hidden_sizes: list[int], device: str) -> tuple[Any, Any]:
    """Return ``(actor, critic)`` for a discrete-action env with flat observations.

    The actor outputs logits of a one-hot categorical distribution (GymEnv
    one-hot encodes discrete actions by default), the critic a scalar
    ``state_value``. The two networks share no weights: on CartPole this is
    simpler to tune than a shared trunk and costs nothing.
    """
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator

    obs_dim = env.observation_spec["observation"].shape[-1]
    n_actions = env.action_spec.shape[-1]
    cells = list(hidden_sizes)

    policy_net = MLP(
        in_features=obs_dim,
        out_features=n_actions,
        num_cells=cells,
        activation_class=nn.Tanh,
        device=device,
    )
    value_net = MLP(
        in_features=obs_dim,
        out_features=1,
        num_cells=cells,
        activation_class=nn.Tanh,
        device=device,
    )
    # Orthogonal init with a small policy-head gain keeps the initial policy
    # close to uniform, the usual PPO recipe; it noticeably speeds up CartPole.
    for net, head_gain in ((policy_net, 0.01), (value_net, 1.0)):
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            gain = head_gain if i == len(linears) - 1 else math.sqrt(2.0)
            nn.init.orthogonal_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)

    actor = ProbabilisticActor(
        module=TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        spec=env.action_spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = ValueOperator(value_net, in_keys=["observation"])

    # One forward pass on the env's own fake data fails here, not deep in the
    # collector, if the modules' keys or sizes disagree with the specs.
    with torch.no_grad():
        td = env.fake_tensordict()
        actor(td)
        critic(td)
    return actor, critic


def _episode_return(data: Any) -> tuple[float, int]:
    """Mean return of episodes that ended in ``data`` and how many there were.

    When no episode ended in the batch (small batches, or a good policy whose
    episodes span several batches) the running return of the episode in
    progress at the end of the batch is reported instead, so the column is
    always finite; it is a lower bound of that episode's final return.
    """
    done = data["next", "done"]
    ep_ret = data["next", "episode_reward"]
    finished = ep_ret[done]
    if finished.numel() > 0:
        return finished.float().mean().item(), int(finished.numel())
    return ep_ret[..., -1, :].float().mean().item(), 0


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train PPO as described by ``cfg`` and write metrics and a plot to ``output_dir``.

    Args:
        cfg: the composed config (``conf/ppo_cartpole.yaml`` and its groups).
        output_dir: where ``metrics.csv`` and ``learning_curve.png`` go.
            Defaults to the current working directory.

    Returns:
        A dict with ``final_return`` (mean return of episodes finished in the
        last batch), ``eval_return`` (greedy evaluation, ``nan`` if disabled),
        ``reached_at`` (first frame count whose batch reached
        ``target_return``, or ``None``), ``frames``, ``elapsed_s``, ``rows``
        (the CSV rows) and the paths ``output_dir``, ``csv_path`` and ``png_path``.
    """
    import torch
    from hydra.utils import instantiate
    from torchrl.collectors import Collector
    from torchrl.objectives import ClipPPOLoss
    from tqdm import tqdm

    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / cfg.logging.csv
    png_path = out / cfg.logging.png

    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    device = str(cfg.collector.device)
    frames_per_batch = int(cfg.collector.frames_per_batch)
    total_frames = int(cfg.collector.total_frames)
    if total_frames % frames_per_batch:
        # The collector would round up too (with a warning); doing it here
        # keeps the learning-rate schedule and the progress bar consistent.
        rounded = -(-total_frames // frames_per_batch) * frames_per_batch
        log.info(
            "collector.total_frames=%d is not a multiple of frames_per_batch=%d; "
            "collecting %d frames", total_frames, frames_per_batch, rounded,
        )
        total_frames = rounded
    seed = int(cfg.seed)

    env = make_env(cfg.env, seed)
    actor, critic = make_modules(env, list(cfg.model.hidden_sizes), device)
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        # The policy is feed-forward; opting out silences torchrl 0.14's
        # FutureWarning about auto-appending an InitTracker it doesn't need.
        auto_register_policy_transforms=False,
    )
    # conf/value: torchrl_ext.value.GAE by default (partial: the critic is ours).
    adv_module = instantiate(cfg.value)(value_network=critic)
    loss_module = ClipPPOLoss(
        actor_network=actor,
        critic_network=critic,
        clip_epsilon=float(cfg.loss.clip_epsilon),
        entropy_bonus=True,  # keeps the "entropy" diagnostic even at coef 0
        entropy_coeff=float(cfg.loss.entropy_coef),
        critic_coeff=float(cfg.loss.critic_coef),
        loss_critic_type=str(cfg.loss.loss_critic_type),
        normalize_advantage=bool(cfg.loss.normalize_advantage),
    )
    # conf/buffer: a RolloutStorage read one epoch at a time by the minibatch
    # sampler (or TorchRL's LazyTensorStorage + SamplerWithoutReplacement).
    buffer = instantiate(cfg.buffer)
    epochs = int(cfg.optim.epochs)
    minibatches_per_epoch = -(-frames_per_batch // int(cfg.optim.minibatch_size))
    total_updates = (total_frames // frames_per_batch) * epochs * minibatches_per_epoch

    lr = float(cfg.optim.lr)
    optim = torch.optim.Adam(loss_module.parameters(), lr=lr, eps=1e-5)
    max_grad_norm = float(cfg.optim.max_grad_norm)
    anneal_lr = bool(cfg.optim.anneal_lr)

    eval_env = None
    if int(cfg.eval.episodes) > 0:
        # A different seed so evaluation starts from unseen initial states.
        eval_env = make_env(cfg.env, seed + 10_000)

    loss_keys = ("loss_objective", "loss_critic", "loss_entropy", "entropy")
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    target = float(cfg.target_return)
    frames = updates = 0
    start = time.perf_counter()

    with MetricsLog(csv_path, CSV_COLUMNS, target=("episode_return", target)) as metrics:
        for iteration, data in enumerate(collector):
            frames += data.numel()
            episode_return, episodes_finished = _episode_return(data)

            # Advantages are computed once per batch with the pre-update
            # critic, as in TorchRL's PPO examples; the loss then skips GAE
            # because "advantage" is already present in each minibatch.
            with torch.no_grad():
                data = adv_module(data)
            # With average_gae the "advantage" entry is standardised, so
            # log the raw GAE (value_target - state_value) to keep the
            # column informative about the scale of the learning signal.
            adv = data["value_target"] - data["state_value"]
            buffer.empty()
            buffer.extend(data)

            sums = dict.fromkeys(loss_keys, 0.0)
            n_steps = 0
            for _ in range(epochs):
                for batch in buffer:  # one epoch: every step once
                    if anneal_lr:
                        for group in optim.param_groups:
                            group["lr"] = lr * max(0.0, 1.0 - updates / total_updates)
                    losses = loss_module(batch)
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
                    optim.step()
                    updates += 1
                    n_steps += 1
                    for k in loss_keys:
                        sums[k] += losses[k].detach().item()
            # A no-op when the collector shares the module with us, a real
            # copy if it holds its own (e.g. another device); cheap either way.
            collector.update_policy_weights_()

            metrics.write({
                "iteration": iteration,
                "frames": frames,
                "episode_return": episode_return,
                "episodes_finished": episodes_finished,
                **{k: v / max(n_steps, 1) for k, v in sums.items()},
                "advantage_mean": adv.mean().item(),
                "advantage_std": adv.std().item(),
                "lr": optim.param_groups[0]["lr"],
                "elapsed_s": time.perf_counter() - start,
            })
            # refresh=False: update() redraws once, with the new postfix.
            pbar.set_postfix(ret=f"{episode_return:.1f}", refresh=False)
            pbar.update(data.numel())
    pbar.close()
    collector.shutdown()

    eval_return = float("nan")
    if eval_env is not None:
        eval_return = greedy_return(actor, eval_env, int(cfg.eval.episodes))
        eval_env.close()
    env.close()

    rows = metrics.rows
    save_learning_curve(rows, png_path, f"PPO on {cfg.env.env_name}", target=target)
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=eval_return)


@hydra.main(config_path="../../conf", config_name="ppo_cartpole", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print one summary line."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("ppo_cartpole", result, target=float(cfg.target_return)))


if __name__ == "__main__":
    main()
