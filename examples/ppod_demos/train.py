"""PPO+Demonstrations on a sparse-reward gymnasium gridworld, with one scripted demo.

Run from the repository root::

    python examples/ppod_demos/train.py
    python examples/ppod_demos/train.py experiment=ppod_demos_smoke   # a few seconds
    python examples/ppod_demos/train.py demos.rho=0 demos.phi=0       # plain PPO, no demos

The config is ``conf/ppod_demos.yaml``; it picks ``conf/buffer/on_policy_gae.yaml``. The env
is this script's own :class:`SparseGrid`, configured under ``env:`` in the primary config
(no env group: it is not a gymnasium id that a ``_target_`` config could build).

The task (:class:`SparseGrid`): an agent starts in the bottom-left corner of a ``size x size``
grid and gets reward 1 only on reaching the top-right corner (then the episode terminates);
episodes are truncated after ``max_steps``. A random walk almost never gets there.

A scripted controller (right, then up) records one successful episode, which is saved with
:func:`torchrl_ext.demos.save_demo` and loaded back as an initial (human) demo of a
:class:`~torchrl_ext.demos.DemoStore`. A :class:`~torchrl_ext.demos.DemoMixer` replaces env
episodes by demo replays (``rho``/``phi``) in the steps fed to a
:class:`~torchrl_ext.replay_buffers.OnPolicyReplayBuffer`; PPO's clipped loss is written out
below (demo actions carry log-prob 0).

Hydra creates a run directory receiving ``metrics.csv`` (one row per rollout),
``learning_curve.png``, ``demos/`` (the generated demo) and ``top_demos/`` (the best agent
reward demos, :func:`~torchrl_ext.demos.save_top_demos`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import hydra
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

CSV_COLUMNS: tuple[str, ...] = (
    "iteration",
    "frames",
    "env_episodes",
    "env_success_rate",
    "env_return",
    "demo_episodes",
    "supplementary_added",
    "rho",
    "phi",
    "reward_demos",
    "value_demos",
    "reward_threshold",
    "loss_policy",
    "loss_value",
    "entropy",
    "elapsed_s",
)

# Actions: 0 right, 1 up, 2 left, 3 down.
MOVES = ((1, 0), (0, 1), (-1, 0), (0, -1))


class SparseGrid(gym.Env):
    """``size x size`` grid; start ``(0, 0)``, reward 1 and termination at ``(size-1, size-1)``.

    Observation: ``[x, y] / (size - 1)`` (float32). Truncated after ``max_steps`` steps.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 10, max_steps: int = 50) -> None:
        self.size, self.max_steps = int(size), int(max_steps)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self._pos = np.zeros(2, np.int64)
        self._t = 0

    def _obs(self) -> np.ndarray:
        return (self._pos / (self.size - 1)).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._pos[:] = 0
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        dx, dy = MOVES[int(action)]
        self._pos = np.clip(self._pos + (dx, dy), 0, self.size - 1)
        self._t += 1
        goal = bool((self._pos == self.size - 1).all())
        return self._obs(), float(goal), goal, (not goal) and self._t >= self.max_steps, {}


def scripted_demo(size: int, max_steps: int) -> dict[str, np.ndarray]:
    """One successful episode of the right-then-up controller (one-hot actions, as GymWrapper's)."""
    env = SparseGrid(size, max_steps)
    obs, _ = env.reset()
    observations, actions, rewards = [], [], []
    done = False
    while not done:
        action = 0 if env._pos[0] < size - 1 else 1
        observations.append(obs)
        actions.append(np.eye(4, dtype=np.int64)[action])
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        done = terminated or truncated
    if sum(rewards) <= 0:
        raise RuntimeError(f"the scripted controller misses the goal within max_steps={max_steps}.")
    return {"observation": np.stack(observations), "action": np.stack(actions),
            "reward": np.array(rewards, np.float32)}


def make_env(cfg: DictConfig) -> Any:
    """``N`` gridworlds in a TorchRL ``SerialEnv`` (batch ``[N]``, one-hot actions)."""
    from torchrl.envs import GymWrapper, SerialEnv

    size, max_steps = int(cfg.env.size), int(cfg.env.max_steps)
    env = SerialEnv(int(cfg.env.num_envs), lambda: GymWrapper(SparseGrid(size, max_steps)))
    env.set_seed(int(cfg.env.seed))
    return env


def make_modules(hidden: list[int]) -> tuple[Any, Any]:
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator

    policy_net = MLP(in_features=2, out_features=4, num_cells=list(hidden), activation_class=nn.Tanh)
    value_net = MLP(in_features=2, out_features=1, num_cells=list(hidden), activation_class=nn.Tanh)
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
    )
    return actor, ValueOperator(value_net, in_keys=["observation"])


def evaluate(actor: Any, cfg: DictConfig, episodes: int) -> float:
    """Success rate of greedy episodes (deterministic env: one episode tells it all)."""
    import torch

    env = SparseGrid(int(cfg.env.size), int(cfg.env.max_steps))
    net = actor.module[0].module  # the logits MLP
    wins = 0
    for _ in range(episodes):
        obs, _ = env.reset()
        done, reward = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        wins += reward > 0
    return wins / episodes


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Train PPO+D as described by ``cfg``; writes metrics, plot and demos to ``output_dir``.

    Returns ``final_success`` (success rate of the env episodes of the last rollouts, see
    ``logging.final_window``), ``eval_success`` (greedy; ``nan`` if disabled),
    ``reached_at`` (frames when a rollout's success rate first reached
    ``logging.target``, or ``None``), ``frames``, ``elapsed_s``, ``rows`` and the paths
    ``output_dir``, ``csv_path``, ``png_path``. ``final_return`` and ``eval_return``
    repeat ``final_success`` and ``eval_success`` for :func:`summary_line`: the only
    reward is 1 at the goal, so an episode's return is whether it succeeded.
    """
    import torch
    from tensordict import TensorDict
    from tqdm import tqdm

    from torchrl_ext.demos import DemoDirPoller, DemoMixer, DemoStore, load_demo_dir, save_demo, save_top_demos

    out = Path(output_dir) if output_dir is not None else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / cfg.logging.csv, out / cfg.logging.png
    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    num_envs, steps = int(cfg.env.num_envs), int(cfg.collector.rollout_length)
    if int(cfg.buffer.num_steps) != steps:
        # compute_returns runs over the buffer's num_steps slots; each rollout fills
        # exactly rollout_length of them.
        raise ValueError(f"buffer.num_steps={cfg.buffer.num_steps} must equal "
                         f"collector.rollout_length={steps}.")
    iterations = -(-int(cfg.collector.total_frames) // (num_envs * steps))

    store = DemoStore(
        rho=float(cfg.demos.rho), phi=float(cfg.demos.phi), alpha=float(cfg.demos.alpha),
        capacity=int(cfg.demos.capacity), num_demos_to_save=int(cfg.demos.num_demos_to_save),
        initial_reward_threshold=cfg.demos.initial_reward_threshold,
        generator=torch.Generator().manual_seed(int(cfg.seed)),
    )
    if bool(cfg.demos.generate):
        demo_dir = out / "demos"
        save_demo(demo_dir / "scripted_0.npz",
                  scripted_demo(int(cfg.env.size), int(cfg.env.max_steps)), frame_skip=1)
        store.add_initial_demos(load_demo_dir(demo_dir, frame_skip=1), human=True)
    if cfg.demos.initial_dir:
        store.add_initial_demos(load_demo_dir(cfg.demos.initial_dir, frame_skip=1), human=True)

    env = make_env(cfg)
    actor, critic = make_modules(list(cfg.model.hidden_sizes))
    mixer = DemoMixer(store, num_envs)
    # pytorchrl's supplementary folder: demos dropped there during training join the store.
    poller = DemoDirPoller(store, cfg.demos.supplementary_dir, frame_skip=1) if cfg.demos.supplementary_dir else None
    # A generator cannot be written in YAML; passed here, the minibatch order follows `seed`.
    rb = instantiate(cfg.buffer, generator=torch.Generator().manual_seed(int(cfg.seed)))
    params = list(actor.parameters()) + list(critic.parameters())
    optim = torch.optim.Adam(params, lr=float(cfg.optim.lr), eps=1e-5)
    clip, ent_coef = float(cfg.loss.clip_epsilon), float(cfg.loss.entropy_coef)

    def reset_fn(mask: torch.Tensor) -> Any:
        return env.reset(TensorDict({"_reset": mask.unsqueeze(-1)}, [num_envs]))

    target = float(cfg.logging.target)
    metrics = MetricsLog(csv_path, CSV_COLUMNS, target=("env_success_rate", target))
    pbar = tqdm(total=iterations * num_envs * steps, unit="frame",
                disable=not bool(cfg.logging.progress))
    frames, start = 0, time.perf_counter()
    td = mixer.reset(env.reset())
    with metrics:
        for iteration in range(iterations):
            with torch.no_grad():
                for _ in range(steps):
                    td = critic(actor(td))
                    step = mixer.process(env.step(td))
                    rb.insert(step.exclude("logits"))
                    td = mixer.next_observation(step, reset_fn)
                rb.compute_returns(value_network=critic)
            frames += num_envs * steps
            sums, updates = {"loss_policy": 0.0, "loss_value": 0.0, "entropy": 0.0}, 0
            # The buffer's num_mini_batch (linked to optim.num_mini_batch) sets the split.
            for batch in rb.generate_batches(num_epochs=int(cfg.optim.epochs)):
                dist = actor.get_dist(batch)
                log_pi = dist.log_prob(batch["action"])
                ratio = (log_pi - batch["action_log_prob"]).exp()
                adv = batch["advantage"].reshape(ratio.shape)
                loss_policy = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
                value = critic(batch.select("observation"))["state_value"]
                loss_value = 0.5 * (value - batch["value_target"]).pow(2).mean()
                entropy = dist.entropy().mean()
                loss = loss_policy + float(cfg.loss.value_coef) * loss_value - ent_coef * entropy
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, float(cfg.optim.max_grad_norm))
                optim.step()
                updates += 1
                for key, val in (("loss_policy", loss_policy), ("loss_value", loss_value),
                                 ("entropy", entropy)):
                    sums[key] += val.item()
            rb.after_update()
            if cfg.demos.save_dir and (iteration + 1) % int(cfg.demos.save_every) == 0:
                save_top_demos(store, out / cfg.demos.save_dir, frame_skip=1)

            added = poller.poll() if poller and iteration % int(cfg.demos.poll_every) == 0 else []
            finished = mixer.pop_finished()
            real = [e for e in finished if e["source"] == "env"]
            row = {
                "iteration": iteration,
                "frames": frames,
                "env_episodes": len(real),
                "env_success_rate": sum(e["total_reward"] > 0 for e in real) / max(len(real), 1),
                "env_return": sum(e["total_reward"] for e in real) / max(len(real), 1),
                "demo_episodes": len(finished) - len(real),
                "supplementary_added": len(added),
                "rho": store.rho,
                "phi": store.phi,
                "reward_demos": len(store.reward_demos),
                "value_demos": len(store.value_demos),
                "reward_threshold": store.reward_threshold,
                **{k: v / max(updates, 1) for k, v in sums.items()},
                "elapsed_s": time.perf_counter() - start,
            }
            metrics.write(row)
            # refresh=False: update() redraws once, with the new postfix.
            pbar.set_postfix(success=f"{row['env_success_rate']:.2f}", rho=f"{store.rho:.2f}",
                             demos=row["reward_demos"], refresh=False)
            pbar.update(num_envs * steps)
    pbar.close()
    env.close()
    if cfg.demos.save_dir:
        save_top_demos(store, out / cfg.demos.save_dir, frame_skip=1)
    eval_success = float("nan")
    if int(cfg.eval.episodes) > 0:
        eval_success = evaluate(actor, cfg, int(cfg.eval.episodes))
    rows = metrics.rows
    save_learning_curve(rows, png_path, f"PPO+D on SparseGrid {cfg.env.size}x{cfg.env.size}",
                        y="env_success_rate", target=target)
    window = rows[-int(cfg.logging.final_window):]
    episodes = sum(r["env_episodes"] for r in window)
    final = sum(r["env_success_rate"] * r["env_episodes"] for r in window) / max(episodes, 1)
    # The "return" of the summary line is the success rate over the final window.
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=out, png_path=png_path, eval_return=eval_success,
                      final_return=final, final_success=final, eval_success=eval_success)


@hydra.main(config_path="../../conf", config_name="ppod_demos", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run :func:`train` in Hydra's run directory and print the summary."""
    result = train(cfg, output_dir=run_dir())
    # "return" is the success rate here: the only reward is 1 at the goal.
    print(summary_line("ppod_demos", result, target=float(cfg.logging.target)))


if __name__ == "__main__":
    main()
