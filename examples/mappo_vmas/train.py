"""Train MAPPO on a VMAS scenario with ``torchrl_ext``'s multi-agent rollout buffer and GAE.

Run from the repository root::

    python examples/mappo_vmas/train.py                                   # the full run
    python examples/mappo_vmas/train.py experiment=mappo_vmas_smoke      # a few seconds
    python examples/mappo_vmas/train.py env.n_agents=2 optim.epochs=8    # any key

The config is ``conf/mappo_vmas.yaml`` (buffer ``harl_rollout``, value ``gae``,
env ``vmas_navigation``). Hydra's run directory (``outputs/<date>/<time>``)
receives the resolved config, ``metrics.csv`` (one row per collected batch)
and ``learning_curve.png``.

Data layout. VMAS puts everything that differs between agents in the
``"agents"`` group, whose batch is ``[..., n_agents]``; the episode flags are
team-level::

    ("agents", "observation")  [N, n_agents, obs]    root and under "next"
    ("agents", "action")       [N, n_agents, act]
    ("next", "agents", "reward")  [N, n_agents, 1]
    "done", "terminated"       [N, 1]                root and under "next"

The collector's ``[N, T]`` batch goes into the ``harl_rollout_buffer``'s
:class:`~torchrl_ext.storages.RolloutStorage` as ``T`` consecutive steps
(``[T + 1, N]``, agents kept inside each step). The centralised critic values
all ``T + 1`` slots at once, :meth:`~torchrl_ext.storages.RolloutStorage.fill_next`
shifts them into ``("next", "agents", "state_value")`` and
:class:`torchrl_ext.value.GAE` broadcasts the team ``done`` over the agent dim
of the per-agent values and rewards.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, run_dir, save_learning_curve, summary_line  # noqa: E402

log = logging.getLogger(__name__)

GROUP = "agents"
OBS = (GROUP, "observation")
ACTION = (GROUP, "action")
LOG_PROB = (GROUP, "action_log_prob")
REWARD = (GROUP, "reward")
EPISODE_REWARD = (GROUP, "episode_reward")
VALUE = (GROUP, "state_value")
ADVANTAGE = (GROUP, "advantage")
VALUE_TARGET = (GROUP, "value_target")

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration",
    "frames",
    "episode_return",
    "episodes_finished",
    "step_reward",
    "loss_objective",
    "loss_critic",
    "loss_entropy",
    "entropy",
    "value_target_mean",
    "elapsed_s",
)


def make_env(env_cfg: DictConfig) -> Any:
    """Instantiate the VMAS env from its group config and add a per-agent episode return.

    ``RewardSum`` keeps the running per-agent return in
    ``("next", "agents", "episode_reward")``; it is reset by the team-level
    ``done``, which VMAS raises for every agent at once.
    """
    from torchrl.envs import RewardSum, TransformedEnv

    if not bool(env_cfg.get("continuous_actions", True)):
        raise ValueError("env.continuous_actions must be true: the actor is a TanhNormal policy.")
    env = hydra.utils.instantiate(env_cfg)
    if getattr(env, "group_map", {}).keys() != {GROUP}:
        raise ValueError(
            f"this example expects one agent group named {GROUP!r}; the env has groups "
            f"{sorted(getattr(env, 'group_map', {}))}. VMAS scenarios with heterogeneous "
            "agents are not supported here."
        )
    return TransformedEnv(env, RewardSum(in_keys=[env.reward_key], out_keys=[EPISODE_REWARD]))


def make_modules(env: Any, model_cfg: DictConfig, device: str) -> tuple[Any, Any]:
    """Return ``(actor, critic)``: a shared decentralised actor and a centralised critic.

    Both are :class:`~torchrl.modules.MultiAgentMLP`. The actor sees each
    agent's own observation (``centralised=False``), the critic the
    concatenation of all of them (``centralised=True``, MAPPO; ``false`` gives
    IPPO), and both write one output per agent.
    """
    import torch
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal, ValueOperator

    n_agents = int(env.n_agents)
    obs_dim = env.observation_spec[OBS].shape[-1]
    action_spec = env.full_action_spec_unbatched[ACTION]
    act_dim = action_spec.shape[-1]
    share = bool(model_cfg.share_params)
    depth, cells = int(model_cfg.depth), int(model_cfg.num_cells)
    if depth < 0 or cells < 1:
        raise ValueError(f"model.depth must be >= 0 and model.num_cells >= 1, got {depth}, {cells}.")

    actor_net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=obs_dim,
            n_agent_outputs=2 * act_dim,  # loc and scale
            n_agents=n_agents,
            centralised=False,
            share_params=share,
            depth=depth,
            num_cells=cells,
            activation_class=nn.Tanh,
            device=device,
        ),
        NormalParamExtractor(),
    )
    actor = ProbabilisticActor(
        module=TensorDictModule(actor_net, in_keys=[OBS], out_keys=[(GROUP, "loc"), (GROUP, "scale")]),
        spec=env.full_action_spec_unbatched,
        in_keys=[(GROUP, "loc"), (GROUP, "scale")],
        out_keys=[ACTION],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=True,
        log_prob_key=LOG_PROB,
    )
    critic_net = MultiAgentMLP(
        n_agent_inputs=obs_dim,
        n_agent_outputs=1,
        n_agents=n_agents,
        centralised=bool(model_cfg.centralised_critic),
        share_params=share,
        depth=depth,
        num_cells=cells,
        activation_class=nn.Tanh,
        device=device,
    )
    critic = ValueOperator(critic_net, in_keys=[OBS], out_keys=[VALUE])

    # One forward pass on the env's fake data fails here, not deep in the
    # collector, if keys or sizes disagree with the specs.
    with torch.no_grad():
        td = env.fake_tensordict()
        actor(td)
        critic(td)
    return actor, critic


def _episode_return(data: Any) -> tuple[float, int]:
    """Mean per-agent return of the episodes that ended in ``data``, and their count.

    ``done`` is team-level ``[N, T, 1]``, the returns per agent ``[N, T, A,
    1]``: the mask is broadcast over agents, so each finished episode counts
    once per agent. When no episode ended in the batch (rollouts shorter than
    an episode), the running return at the batch's last step is reported so
    the column stays finite.
    """
    done = data["next", "done"]
    ep_ret = data["next", *EPISODE_REWARD]
    mask = done.unsqueeze(-2).expand_as(ep_ret)
    finished = ep_ret[mask]
    if finished.numel() > 0:
        return finished.float().mean().item(), int(done.sum().item())
    return ep_ret[:, -1].float().mean().item(), 0


def _check_config(cfg: DictConfig) -> tuple[int, int, int]:
    """Validate the sizes that must agree; return ``(T, num_envs, frames_per_batch)``."""
    rollout_length = int(cfg.buffer.episode_length)
    num_envs = int(cfg.env.num_envs)
    if rollout_length < 1 or num_envs < 1:
        raise ValueError(
            f"buffer.episode_length and env.num_envs must be positive, got {rollout_length} and "
            f"{num_envs}."
        )
    frames_per_batch = rollout_length * num_envs
    total_frames = int(cfg.collector.total_frames)
    if total_frames < frames_per_batch:
        raise ValueError(
            f"collector.total_frames={total_frames} is less than one batch of env.num_envs * "
            f"collector.rollout_length = {num_envs} * {rollout_length} = {frames_per_batch} frames."
        )
    if int(cfg.optim.epochs) < 1:
        raise ValueError(f"optim.epochs must be >= 1, got {cfg.optim.epochs}.")
    return rollout_length, num_envs, frames_per_batch


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train MAPPO as described by ``cfg`` and write metrics and a plot to ``output_dir``.

    Args:
        cfg: the composed ``conf/mappo_vmas.yaml``.
        output_dir: where ``metrics.csv`` and ``learning_curve.png`` go
            (default: the current working directory).

    Returns:
        ``final_return`` (episode return of the last batch), ``frames`` (env
        steps; each holds one step of every agent), ``elapsed_s``, ``rows``
        (the CSV rows), ``last_batch`` (the last rollout ``[T + 1, N]`` with its
        derived entries, for inspection) and the paths ``output_dir``,
        ``csv_path``, ``png_path``.
    """
    import torch
    from torchrl.collectors import Collector
    from torchrl.objectives import ClipPPOLoss
    from tqdm import tqdm

    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png

    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    device = str(cfg.collector.device)
    rollout_length, num_envs, frames_per_batch = _check_config(cfg)
    iterations = -(-int(cfg.collector.total_frames) // frames_per_batch)
    total_frames = iterations * frames_per_batch
    if total_frames != int(cfg.collector.total_frames):
        log.info(
            "collector.total_frames=%d is not a multiple of env.num_envs * rollout_length = %d; "
            "collecting %d frames", int(cfg.collector.total_frames), frames_per_batch, total_frames,
        )

    env = make_env(cfg.env)
    actor, critic = make_modules(env, cfg.model, device)
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        # Feed-forward policy: no InitTracker needed (silences torchrl's FutureWarning).
        auto_register_policy_transforms=False,
    )

    rb = hydra.utils.instantiate(cfg.buffer)
    storage = rb.storage
    if storage.num_steps != rollout_length:
        raise ValueError(
            f"the buffer holds {storage.num_steps} steps per env but batches have {rollout_length}."
        )
    # Values are precomputed on the rollout (value_network=None); the team
    # done/terminated [.., 1] are broadcast over the agents' dim (-2) of the
    # per-agent values and rewards, and average_gae standardises per agent.
    gae = hydra.utils.instantiate(cfg.value)(value_network=None, agent_dim=-2)
    gae.set_keys(
        value=VALUE, reward=REWARD, done="done", terminated="terminated",
        advantage=ADVANTAGE, value_target=VALUE_TARGET,
    )
    loss_module = ClipPPOLoss(
        actor_network=actor,
        critic_network=critic,
        clip_epsilon=float(cfg.loss.clip_epsilon),
        entropy_bonus=True,  # keeps the "entropy" diagnostic even at coef 0
        entropy_coeff=float(cfg.loss.entropy_coef),
        critic_coeff=float(cfg.loss.critic_coef),
        loss_critic_type=str(cfg.loss.loss_critic_type),
        # GAE already standardised the advantages per agent over the whole
        # rollout; re-standardising each minibatch would mix agents.
        normalize_advantage=False,
    )
    loss_module.set_keys(
        action=ACTION, sample_log_prob=LOG_PROB, value=VALUE, advantage=ADVANTAGE,
        value_target=VALUE_TARGET, reward=REWARD, done="done", terminated="terminated",
    )
    optim = torch.optim.Adam(loss_module.parameters(), lr=float(cfg.optim.lr))
    epochs, max_grad_norm = int(cfg.optim.epochs), float(cfg.optim.max_grad_norm)

    loss_keys = ("loss_objective", "loss_critic", "loss_entropy", "entropy")
    pbar = tqdm(total=total_frames, unit="frame", disable=not bool(cfg.logging.progress))
    frames = 0
    start = time.perf_counter()
    with MetricsLog(csv_path, CSV_COLUMNS) as metrics:
        for iteration, data in enumerate(collector):
            frames += data.numel()
            episode_return, episodes_finished = _episode_return(data)

            storage.insert_steps(data)  # [N, T] -> slots 0..T-1, next obs into slot T
            rollout = storage.data  # [T + 1, N]
            with torch.no_grad():
                # One critic pass over all T + 1 slots: slot T bootstraps step
                # T - 1. Where an env reset inside the batch, slot t + 1 holds
                # the reset observation, but VMAS flags its time limit as
                # `terminated` too, so those next values are masked out by GAE.
                storage.set_derived(VALUE, critic(rollout.select(OBS))[VALUE])
                storage.fill_next(VALUE)
                steps = rollout[:rollout_length]
                gae(steps, time_dim=0)
                for key in (ADVANTAGE, VALUE_TARGET):
                    computed = steps.get(key)
                    storage.set_derived(key, torch.cat([computed, torch.zeros_like(computed[:1])]))

            sums = dict.fromkeys(loss_keys, 0.0)
            updates = 0
            for _ in range(epochs):
                for batch in rb:  # one epoch of [B] minibatches, agents inside each step
                    losses = loss_module(batch)
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
                    optim.step()
                    updates += 1
                    for k in loss_keys:
                        sums[k] += losses[k].detach().item()
            last_batch = rollout.clone()
            storage.after_update()
            collector.update_policy_weights_()

            row = {
                "iteration": iteration,
                "frames": frames,
                "episode_return": episode_return,
                "episodes_finished": episodes_finished,
                "step_reward": data["next", *REWARD].mean().item(),
                **{k: v / max(updates, 1) for k, v in sums.items()},
                "value_target_mean": last_batch[:rollout_length][VALUE_TARGET].mean().item(),
                "elapsed_s": time.perf_counter() - start,
            }
            metrics.write(row)
            pbar.set_postfix(ret=f"{episode_return:.2f}", refresh=False)
            pbar.update(data.numel())
    pbar.close()
    collector.shutdown()
    if not env.is_closed:
        env.close()

    rows = metrics.rows
    scenario = str(cfg.env.get("scenario", "vmas"))
    save_learning_curve(rows, png_path, f"MAPPO on VMAS {scenario} ({int(env.n_agents)} agents)")
    return {
        "final_return": rows[-1]["episode_return"] if rows else float("nan"),
        "frames": frames,
        "elapsed_s": time.perf_counter() - start,
        "rows": rows,
        "last_batch": last_batch,
        "output_dir": out,
        "csv_path": csv_path,
        "png_path": png_path,
    }


@hydra.main(config_path="../../conf", config_name="mappo_vmas", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print the summary."""
    result = train(cfg, output_dir=run_dir())
    print(summary_line("mappo_vmas", result))


if __name__ == "__main__":
    main()
