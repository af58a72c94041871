"""Ray: collector actors feeding one prioritized per-env buffer, a learner writing priorities back.

Run from the repository root::

    python examples/distributed_ray/train.py                                  # local Ray, 2 CPUs
    python examples/distributed_ray/train.py experiment=distributed_ray_smoke  # a few seconds
    python examples/distributed_ray/train.py ray.address=auto                 # an existing cluster

The config is ``conf/distributed_ray.yaml``; its ``buffer`` is ``conf/buffer/alf.yaml``
(:func:`torchrl_ext.presets.alf_replay_buffer`) with ``prioritized_sampling: true``.
:func:`torchrl_ext.distributed.ray_replay_buffer` builds that config node inside a Ray
actor. ``collector.num_actors`` collector actors each own a disjoint set of env ids and
step gymnasium ``CartPole-v1`` with a random policy, pushing ``[envs, steps]`` batches
with ``extend(batch, env_ids=...)`` through a buffer client. This process is the
learner: between collect calls it samples ``[batch_size, batch_length]`` windows,
takes a TD(0) step on a small value network (policy evaluation of the random policy,
weighted by the sampler's importance weights) and writes ``|TD error|`` back as the
windows' priorities (``update_tensordict_priority``), while the collectors keep writing.

Hydra writes ``metrics.csv`` (one row per finished collect call) and
``learning_curve.png`` into its run directory. :func:`train` is a plain function of the
config, driven by the tests through Hydra's compose API.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from tensordict import TensorDict
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import MetricsLog, run_dir, run_result, save_learning_curve, summary_line  # noqa: E402

# Column order of metrics.csv; the smoke test checks against this tuple.
CSV_COLUMNS: tuple[str, ...] = (
    "iteration",
    "frames",
    "episode_return",
    "episodes_finished",
    "buffer_size",
    "updates",
    "td_abs",
    "value_loss",
    "value_start",
    "elapsed_s",
)


class Collector:
    """A Ray actor stepping gymnasium ``CartPole-v1`` envs with a random policy.

    Args:
        buffer: a client of the shared buffer (``rb.client()``).
        env_ids: the buffer envs this actor owns (disjoint from other actors').
        steps_per_call: steps per env per :meth:`collect`.
        seed: env and policy seed.

    Shape contract:
        each :meth:`collect` writes one ``[len(env_ids), steps_per_call]`` batch with
        ``obs``/``next_obs`` ``[..., 4]`` float32, ``action`` int64, ``reward``
        float32 and ``terminated``/``done`` bool.
    """

    def __init__(self, buffer: Any, env_ids: list[int], steps_per_call: int, seed: int) -> None:
        import gymnasium as gym

        torch.set_num_threads(1)
        self.buffer, self.env_ids, self.steps = buffer, torch.tensor(env_ids), steps_per_call
        self.envs = [gym.make("CartPole-v1") for _ in env_ids]
        self.obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(seed + 1000 + i)
        self.returns = [0.0] * len(env_ids)

    def collect(self) -> dict[str, Any]:
        """Steps every env ``steps_per_call`` times, writes the batch; returns frames and episode returns."""
        n, t = len(self.envs), self.steps
        obs = torch.zeros(n, t, 4)
        next_obs = torch.zeros(n, t, 4)
        action = torch.zeros(n, t, dtype=torch.long)
        reward = torch.zeros(n, t)
        terminated = torch.zeros(n, t, dtype=torch.bool)
        done = torch.zeros(n, t, dtype=torch.bool)
        finished = []
        for i, env in enumerate(self.envs):
            for step in range(t):
                a = int(env.action_space.sample())
                o2, r, term, trunc, _ = env.step(a)
                obs[i, step], next_obs[i, step] = torch.as_tensor(self.obs[i]), torch.as_tensor(o2)
                action[i, step], reward[i, step] = a, float(r)
                terminated[i, step], done[i, step] = term, term or trunc
                self.returns[i] += float(r)
                if term or trunc:
                    finished.append(self.returns[i])
                    self.returns[i] = 0.0
                    o2, _ = env.reset()
                self.obs[i] = o2
        batch = TensorDict(
            {"obs": obs, "next_obs": next_obs, "action": action, "reward": reward,
             "terminated": terminated, "done": done},
            batch_size=[n, t],
        )
        self.buffer.extend(batch, env_ids=self.env_ids)
        return {"frames": n * t, "returns": finished}


def td_step(
    value: nn.Module, optim: torch.optim.Optimizer, batch: TensorDict, gamma: float, beta: float
) -> tuple[torch.Tensor, float]:
    """One TD(0) step on ``[B, T]`` windows; returns the ``[B, T]`` |TD error| and the loss."""
    v = value(batch["obs"]).squeeze(-1)
    with torch.no_grad():
        v_next = value(batch["next_obs"]).squeeze(-1)
        target = batch["reward"] + gamma * (~batch["terminated"]).float() * v_next
    td = target - v
    # ALF's weights are p / mean(p); PER's correction is (p / mean(p)) ** -beta, normalised.
    weight = batch["priority_weight"].clamp_min(1e-12).pow(-beta)
    weight = weight / weight.max()
    loss = (weight * td.pow(2)).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
    return td.detach().abs(), loss.item()


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the example; returns what :func:`_common.run_result` gives plus ``updates``."""
    import ray

    from torchrl_ext.distributed import ray_replay_buffer

    output_dir = Path(output_dir) if output_dir is not None else Path.cwd()
    torch.manual_seed(int(cfg.seed))
    torch.set_num_threads(int(cfg.threads))
    actors_n, envs_n = int(cfg.collector.num_actors), int(cfg.collector.num_envs)
    if envs_n % actors_n:
        raise ValueError(
            f"collector.num_envs={envs_n} must be a multiple of collector.num_actors={actors_n} "
            "(each actor owns the same number of envs)."
        )
    per_actor = envs_n // actors_n
    if Collector.__module__ != "__main__":  # loaded by path (tests): ship the class by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[Collector.__module__])
    started = not ray.is_initialized()
    if started:
        init = {"address": cfg.ray.address, "include_dashboard": False, "log_to_driver": False}
        if cfg.ray.address is None:
            init["num_cpus"] = int(cfg.ray.num_cpus)
        ray.init(**init)
    rb = ray_replay_buffer(cfg.buffer)
    remote_collector = ray.remote(**dict(cfg.ray.collector_options))(Collector)
    actors = [
        remote_collector.remote(rb.client(), list(range(k * per_actor, (k + 1) * per_actor)),
                                int(cfg.collector.steps_per_call), int(cfg.seed) + 100 * k)
        for k in range(actors_n)
    ]
    value = nn.Sequential(nn.Linear(4, int(cfg.learner.hidden_size)), nn.Tanh(),
                          nn.Linear(int(cfg.learner.hidden_size), 1))
    optim = torch.optim.Adam(value.parameters(), lr=float(cfg.learner.lr))
    gamma, beta = float(cfg.learner.gamma), float(cfg.learner.beta)
    start_state = torch.zeros(1, 4)  # CartPole starts near the origin

    call_frames = per_actor * int(cfg.collector.steps_per_call)
    total = int(cfg.collector.total_frames)
    calls_left = math.ceil(total / call_frames)
    png_path = output_dir / cfg.logging.png
    frames = updates = iteration = 0
    returns: list[float] = []
    start = time.perf_counter()
    progress = None
    if cfg.logging.progress:
        from tqdm import tqdm

        progress = tqdm(total=calls_left * call_frames, unit="frames")
    try:
        with MetricsLog(output_dir / cfg.logging.csv, CSV_COLUMNS) as metrics:
            pending = {}
            for actor in actors:
                if calls_left:
                    pending[actor.collect.remote()] = actor
                    calls_left -= 1
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                actor = pending.pop(ref)
                stats = ray.get(ref)
                if calls_left:  # keep the actor busy while the learner trains
                    pending[actor.collect.remote()] = actor
                    calls_left -= 1
                frames += stats["frames"]
                returns.extend(stats["returns"])
                iteration += 1
                td_abs = loss = float("nan")
                if frames >= int(cfg.collector.learning_starts):
                    tds, losses = [], []
                    for _ in range(int(cfg.learner.updates_per_call)):
                        batch = rb.sample()
                        td, step_loss = td_step(value, optim, batch, gamma, beta)
                        batch.set("td_error", td)
                        rb.update_tensordict_priority(batch.select("index", "td_error"))
                        tds.append(float(td.mean()))
                        losses.append(step_loss)
                        updates += 1
                    td_abs, loss = sum(tds) / len(tds), sum(losses) / len(losses)
                recent = returns[-20:]
                with torch.no_grad():
                    v0 = float(value(start_state))
                metrics.write({
                    "iteration": iteration,
                    "frames": frames,
                    "episode_return": sum(recent) / len(recent) if recent else float("nan"),
                    "episodes_finished": len(returns),
                    "buffer_size": len(rb),
                    "updates": updates,
                    "td_abs": td_abs,
                    "value_loss": loss,
                    "value_start": v0,
                    "elapsed_s": round(time.perf_counter() - start, 3),
                })
                if progress is not None:
                    progress.update(stats["frames"])
            save_learning_curve(metrics.rows, png_path, "Ray collectors, random policy on CartPole-v1")
    finally:
        if progress is not None:
            progress.close()
        for actor in actors:
            ray.kill(actor)
        rb.close()
        if started:
            ray.shutdown()
    return run_result(metrics, frames=frames, elapsed_s=time.perf_counter() - start,
                      output_dir=output_dir, png_path=png_path, updates=updates)


@hydra.main(config_path="../../conf", config_name="distributed_ray", version_base="1.3")
def main(cfg: DictConfig) -> None:
    result = train(cfg, output_dir=run_dir())
    print(summary_line("distributed_ray", result))


if __name__ == "__main__":
    main()
