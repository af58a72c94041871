"""Train MAPPO on a VMAS scenario with ``torchrl_ext``'s multi-agent rollout buffer and GAE.

Run from the repository root::

    python examples/mappo_vmas/train.py                                   # the full run
    python examples/mappo_vmas/train.py experiment=mappo_vmas_smoke      # a few seconds
    python examples/mappo_vmas/train.py env.n_agents=2 optim.epochs=8    # any key
    python examples/mappo_vmas/train.py model.recurrent=true              # GRU actor, chunked minibatches
    python examples/mappo_vmas/train.py model.critic_layout=FP            # per-agent critic input

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

Critic layouts (``model.critic_layout``), HARL's EP and FP in keys::

    EP  "state"              [N, A * obs]        all agents' observations, one per env;
                                                  one value per env, broadcast to the agents
    FP  ("agents", "state")  [N, A, obs + A * obs] own observation + the global state;
                                                  one value per agent

Recurrent actor (``model.recurrent=true``): a GRU shared by all agents, its
hidden state stored per step under ``("agents", "rnn_state")``
``[N, A, 1, H]`` (``InitTracker`` marks episode starts in ``"is_init"``). The
buffer cuts the rollout into ``[k, L]`` chunks and the update reruns the GRU
over each chunk from the stored state at its first step, restarting from the
(zero) stored state wherever ``is_init`` is set inside the chunk.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from torch import nn

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
# Critic inputs: HARL's EP share_obs (one per env) and FP share_obs (one per agent).
STATE_EP = "state"
STATE_FP = (GROUP, "state")
# Recurrent actor: the GRU's input hidden state of each step, and its output features.
RNN_STATE = (GROUP, "rnn_state")
RNN_OUT = (GROUP, "rnn_out")
IS_INIT = "is_init"  # team-level like "done": VMAS resets all agents of an env together
CRITIC_LAYOUTS = ("EP", "FP")

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


def _critic_state_key(model_cfg: DictConfig) -> Any | None:
    """The critic's input key: ``"state"`` (EP), ``("agents", "state")`` (FP), or ``None`` (IPPO)."""
    if not bool(model_cfg.centralised_critic):
        return None  # IPPO: the critic reads each agent's own observation
    return STATE_EP if str(model_cfg.critic_layout) == "EP" else STATE_FP


def _make_critic_state_transform(layout: str) -> Any:
    """A transform writing the critic input of ``layout`` next to the agents' observations.

    It acts on reset and step outputs alike, so the state sits at the root and
    under ``"next"`` of every step; the rollout storage then carries it into
    slot ``t + 1`` like the observation, and the critic can value all
    ``T + 1`` slots from stored data.
    """
    from torchrl.data import Unbounded
    from torchrl.envs import Transform

    class CriticState(Transform):
        """Builds ``"state"`` (EP) or ``("agents", "state")`` (FP) from ``("agents", "observation")``."""

        def __init__(self) -> None:
            super().__init__(in_keys=[OBS], out_keys=[STATE_EP if layout == "EP" else STATE_FP])

        def _call(self, next_tensordict: Any) -> Any:
            obs = next_tensordict.get(OBS)  # [..., A, obs]
            joint = obs.flatten(-2, -1)  # [..., A * obs]: every agent's observation
            if layout == "EP":
                next_tensordict.set(STATE_EP, joint)
            else:
                shared = joint.unsqueeze(-2).expand(*obs.shape[:-1], joint.shape[-1])
                next_tensordict.set(STATE_FP, torch.cat([obs, shared], dim=-1))
            return next_tensordict

        def _reset(self, tensordict: Any, tensordict_reset: Any) -> Any:
            return self._call(tensordict_reset)

        def transform_observation_spec(self, observation_spec: Any) -> Any:
            obs_spec = observation_spec[OBS]  # [N, A, obs]
            *batch, agents, dim = obs_spec.shape
            if layout == "EP":
                observation_spec[STATE_EP] = Unbounded(
                    shape=(*batch, agents * dim), dtype=obs_spec.dtype, device=obs_spec.device
                )
            else:
                observation_spec[STATE_FP] = Unbounded(
                    shape=(*batch, agents, dim + agents * dim), dtype=obs_spec.dtype,
                    device=obs_spec.device,
                )
            return observation_spec

    return CriticState()


def make_env(env_cfg: DictConfig, model_cfg: DictConfig | None = None) -> Any:
    """Instantiate the VMAS env from its group config and add what the models read.

    ``RewardSum`` keeps the running per-agent return in
    ``("next", "agents", "episode_reward")``; it is reset by the team-level
    ``done``, which VMAS raises for every agent at once. With ``model_cfg``,
    the critic's EP/FP state is added and, for a recurrent actor,
    ``InitTracker`` (``"is_init"``, the reset marker TorchRL's recurrent
    modules need) and a primer that zeroes ``("agents", "rnn_state")`` at
    every (partial) reset.
    """
    from torchrl.data import Unbounded
    from torchrl.envs import InitTracker, RewardSum, TensorDictPrimer, TransformedEnv

    if not bool(env_cfg.get("continuous_actions", True)):
        raise ValueError("env.continuous_actions must be true: the actor is a TanhNormal policy.")
    env = hydra.utils.instantiate(env_cfg)
    if getattr(env, "group_map", {}).keys() != {GROUP}:
        raise ValueError(
            f"this example expects one agent group named {GROUP!r}; the env has groups "
            f"{sorted(getattr(env, 'group_map', {}))}. VMAS scenarios with heterogeneous "
            "agents are not supported here."
        )
    env = TransformedEnv(env, RewardSum(in_keys=[env.reward_key], out_keys=[EPISODE_REWARD]))
    if model_cfg is None:
        return env
    n_agents = int(env.n_agents)
    if _critic_state_key(model_cfg) is not None:
        env.append_transform(_make_critic_state_transform(str(model_cfg.critic_layout)))
    if bool(model_cfg.recurrent):
        env.append_transform(InitTracker(init_key=IS_INIT))
        hidden = int(model_cfg.rnn_hidden_size)
        # [N, A, num_layers=1, H]: the layout GRUModule reads once agents are folded into its batch.
        spec = Unbounded(shape=(*env.batch_size, n_agents, 1, hidden), device=env.device)
        env.append_transform(TensorDictPrimer({RNN_STATE: spec}, expand_specs=False))
    return env


def _make_agent_gru(obs_dim: int, hidden_size: int, device: str) -> Any:
    """A GRU over each agent's observation, shared by all agents, as a TensorDict module.

    TorchRL's :class:`~torchrl.modules.GRUModule` expects time as the *last*
    batch dim of what it is given. The rollout minibatches are ``[k, L]`` at
    the root with the agents after time (``("agents", ...)`` is ``[k, L,
    A]``), so in recurrent mode the agents' entries are moved to ``[k, A, L]``
    and every (chunk, agent) pair becomes one sequence of the shared GRU. The
    team-level ``"is_init"`` is broadcast to the agents, so each agent's
    sequence restarts where the env reset.
    """
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModuleBase
    from torchrl.modules import GRUModule

    class AgentGRU(TensorDictModuleBase):
        """Reads ``("agents", "observation")``, ``("agents", "rnn_state")``, ``"is_init"``;
        writes ``("agents", "rnn_out")`` and ``("next", "agents", "rnn_state")``."""

        def __init__(self) -> None:
            super().__init__()
            self.gru = GRUModule(
                input_size=obs_dim,
                hidden_size=hidden_size,
                num_layers=1,
                in_keys=["observation", "rnn_state", IS_INIT],
                out_keys=["rnn_out", ("next", "rnn_state")],
                device=device,
            )
            self.in_keys = [OBS, RNN_STATE, IS_INIT]
            self.out_keys = [RNN_OUT, ("next", *RNN_STATE)]

        def forward(self, tensordict: Any) -> Any:
            obs = tensordict.get(OBS)
            # [..., A] from the observation: a gathered minibatch's "agents"
            # sub-TensorDict may not carry the agent dim in its batch size.
            lead = obs.shape[:-1]
            is_init = tensordict.get(IS_INIT)  # [..., 1], one flag per env
            per_agent = TensorDict(
                {
                    "observation": obs,
                    "rnn_state": tensordict.get(RNN_STATE),
                    IS_INIT: is_init.unsqueeze(-2).expand(*lead, 1),
                },
                batch_size=lead,
            )
            # A root [k, L] minibatch: time must be last for GRUModule. A
            # collector step ([N], or [] for one env) has no time dim and
            # GRUModule takes it as single steps.
            over_time = self.gru.recurrent_mode and tensordict.batch_dims >= 1
            if over_time:
                if tensordict.batch_dims == 1:  # one sequence [L]: add the batch dim
                    per_agent = per_agent.unsqueeze(0)
                per_agent = per_agent.transpose(-1, -2)  # [k, A, L]
            out = self.gru(per_agent)
            if over_time:
                out = out.transpose(-1, -2)
                if tensordict.batch_dims == 1:
                    out = out.squeeze(0)
            tensordict.set(RNN_OUT, out.get("rnn_out"))
            tensordict.set(("next", *RNN_STATE), out.get(("next", "rnn_state")))
            return tensordict

    return AgentGRU()


def make_modules(env: Any, model_cfg: DictConfig, device: str) -> tuple[Any, Any]:
    """Return ``(actor, critic)``: a shared decentralised actor and a (centralised) critic.

    Actor: a :class:`~torchrl.modules.MultiAgentMLP` on each agent's own
    observation or, with ``model.recurrent``, a GRU shared by all agents
    followed by that MLP on the GRU's features. Critic by
    ``model.critic_layout`` (with ``model.centralised_critic``):

    * ``EP``: an MLP on the env-level ``"state"`` (all observations
      concatenated) gives one value per env, broadcast to every agent. This is
      what the earlier shared centralised ``MultiAgentMLP`` computed, with the
      same network and initialisation, made explicit as a stored key.
    * ``FP``: a ``MultiAgentMLP`` (decentralised over its input) on
      ``("agents", "state")``: one value per agent from its own FP input.
    * ``model.centralised_critic=false``: IPPO, a ``MultiAgentMLP`` on each
      agent's own observation.

    The value key is ``("agents", "state_value")`` ``[..., A, 1]`` in all
    cases, so the GAE and loss code is the same.
    """
    from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.modules import MLP, MultiAgentMLP, ProbabilisticActor, TanhNormal, ValueOperator

    n_agents = int(env.n_agents)
    obs_dim = env.observation_spec[OBS].shape[-1]
    action_spec = env.full_action_spec_unbatched[ACTION]
    act_dim = action_spec.shape[-1]
    share = bool(model_cfg.share_params)
    depth, cells = int(model_cfg.depth), int(model_cfg.num_cells)
    if depth < 0 or cells < 1:
        raise ValueError(f"model.depth must be >= 0 and model.num_cells >= 1, got {depth}, {cells}.")
    recurrent = bool(model_cfg.recurrent)

    gru = None
    head_inputs, head_in_key = obs_dim, OBS
    if recurrent:
        hidden = int(model_cfg.rnn_hidden_size)
        gru = _make_agent_gru(obs_dim, hidden, device)
        head_inputs, head_in_key = hidden, RNN_OUT
    actor_net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=head_inputs,
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
    head = TensorDictModule(actor_net, in_keys=[head_in_key], out_keys=[(GROUP, "loc"), (GROUP, "scale")])
    actor = ProbabilisticActor(
        module=head if gru is None else TensorDictSequential(gru, head),
        spec=env.full_action_spec_unbatched,
        in_keys=[(GROUP, "loc"), (GROUP, "scale")],
        out_keys=[ACTION],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=True,
        log_prob_key=LOG_PROB,
    )

    state_key = _critic_state_key(model_cfg)
    if state_key == STATE_EP:
        # One value per env from the joint observation, broadcast over the
        # agent dim so the per-agent GAE code is unchanged.
        critic_net = nn.Sequential(
            MLP(
                in_features=n_agents * obs_dim,
                out_features=1,
                depth=depth,
                num_cells=cells,
                activation_class=nn.Tanh,
                device=device,
            ),
            _BroadcastToAgents(n_agents),
        )
    else:
        critic_net = MultiAgentMLP(
            n_agent_inputs=env.observation_spec[state_key or OBS].shape[-1],
            n_agent_outputs=1,
            n_agents=n_agents,
            centralised=False,  # FP inputs already hold the global state; IPPO has none
            share_params=share,
            depth=depth,
            num_cells=cells,
            activation_class=nn.Tanh,
            device=device,
        )
    critic = ValueOperator(critic_net, in_keys=[state_key or OBS], out_keys=[VALUE])

    # One forward pass on the env's fake data fails here, not deep in the
    # collector, if keys or sizes disagree with the specs.
    with torch.no_grad():
        td = env.fake_tensordict()
        actor(td)
        critic(td)
    return actor, critic


class _BroadcastToAgents(nn.Module):
    """``[..., 1]`` -> ``[..., A, 1]``: the EP critic's one value per env, seen by every agent."""

    def __init__(self, n_agents: int) -> None:
        super().__init__()
        self.n_agents = n_agents

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value.unsqueeze(-2).expand(*value.shape[:-1], self.n_agents, value.shape[-1])


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
    layout = str(cfg.model.critic_layout)
    if layout not in CRITIC_LAYOUTS:
        raise ValueError(
            f"model.critic_layout must be one of {CRITIC_LAYOUTS} (EP: one env-level 'state'; FP: "
            f"per-agent ('agents', 'state')), got {layout!r}."
        )
    recurrent = bool(cfg.model.recurrent)
    if recurrent != bool(cfg.buffer.use_recurrent_policy):
        raise ValueError(
            f"model.recurrent={recurrent} but buffer.use_recurrent_policy="
            f"{bool(cfg.buffer.use_recurrent_policy)}: the GRU needs the chunked sampler (and a "
            "feed-forward actor single steps); keep them equal."
        )
    if recurrent:
        chunk = int(cfg.buffer.data_chunk_length)
        if chunk < 1 or rollout_length % chunk:
            raise ValueError(
                f"buffer.data_chunk_length={chunk} must divide collector.rollout_length="
                f"{rollout_length}: chunks never cross envs or rollouts."
            )
        if int(cfg.model.rnn_hidden_size) < 1:
            raise ValueError(f"model.rnn_hidden_size must be >= 1, got {cfg.model.rnn_hidden_size}.")
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
        derived entries, for inspection), the trained ``actor`` and ``critic``,
        and the paths ``output_dir``,
        ``csv_path``, ``png_path``.
    """
    from torchrl.collectors import Collector
    from torchrl.modules import set_recurrent_mode
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

    env = make_env(cfg.env, cfg.model)
    actor, critic = make_modules(env, cfg.model, device)
    recurrent = bool(cfg.model.recurrent)
    critic_in = _critic_state_key(cfg.model) or OBS
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        # make_env already added InitTracker and the rnn_state primer for the
        # GRU (nested under "agents", which the automatic registration does
        # not do); this also silences torchrl's FutureWarning.
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
                storage.set_derived(VALUE, critic(rollout.select(critic_in))[VALUE])
                storage.fill_next(VALUE)
                steps = rollout[:rollout_length]
                gae(steps, time_dim=0)
                for key in (ADVANTAGE, VALUE_TARGET):
                    storage.set_derived(key, steps.get(key))  # [T, ...]: the steps' rows

            sums = dict.fromkeys(loss_keys, 0.0)
            updates = 0
            for _ in range(epochs):
                # One epoch of [B] steps, or of [k, L] chunks with the recurrent
                # actor, agents inside each step.
                for batch in rb:
                    # Recurrent mode: the GRU runs along each chunk from the
                    # stored ("agents", "rnn_state") at its first step and
                    # restarts from the stored (zero) state where "is_init" is set.
                    with set_recurrent_mode(recurrent):
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
    variant = f"{'GRU' if recurrent else 'MLP'} actor, {cfg.model.critic_layout} critic"
    if not bool(cfg.model.centralised_critic):
        variant = f"{'GRU' if recurrent else 'MLP'} actor, IPPO critic"
    save_learning_curve(
        rows, png_path, f"MAPPO on VMAS {scenario} ({int(env.n_agents)} agents; {variant})"
    )
    return {
        "final_return": rows[-1]["episode_return"] if rows else float("nan"),
        "frames": frames,
        "elapsed_s": time.perf_counter() - start,
        "rows": rows,
        "last_batch": last_batch,
        "actor": actor,
        "critic": critic,
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
