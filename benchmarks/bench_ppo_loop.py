"""TorchRL's PPO loop with stock components against the same loop with the README's swap.

Usage::

    python benchmarks/bench_ppo_loop.py            # full run: TorchRL's MuJoCo PPO sizes
    python benchmarks/bench_ppo_loop.py --quick    # smoke run: fewer epochs and repetitions
    python benchmarks/bench_ppo_loop.py --json benchmarks/results/bench_ppo_loop.json

The loop is the one of TorchRL's ``sota-implementations/ppo/ppo_mujoco.py`` for one collected
batch: ``num_epochs`` times, compute the advantage of the whole batch with ``GAE`` under
``torch.no_grad()``, ``extend`` the buffer with the flattened batch, then draw
``frames_per_batch / mini_batch_size`` minibatches with ``SamplerWithoutReplacement`` and take
one ``ClipPPOLoss`` step on each (Adam, gradient clipping 0.5). The collected batch is
synthetic (observations of 17 features, actions of 6, as HalfCheetah; episode ends with
probability 0.01), so collection is not timed; the networks are TorchRL's config (two hidden
layers of 64, tanh). Hyper-parameters: ``frames_per_batch=2048``, ``mini_batch_size=64``,
``num_epochs=10``, ``gamma=0.99``, ``lmbda=0.95``.

* **stock**: ``ReplayBuffer(storage=LazyTensorStorage(2048), sampler=SamplerWithoutReplacement(),
  batch_size=64)`` and ``torchrl.objectives.value.GAE``.
* **torchrl_ext**: the README's row, nothing else changed:
  ``storage=FastTensorStorage(2048)`` and ``torchrl_ext.value.GAE`` (same arguments).

One call = one collected batch's update (all epochs). The two variants run interleaved in one
process from the same parameters and the same random state, so they draw the same minibatches:
the check compares their losses after one call. Each call also records the time spent in the
buffer and value steps (advantage, extend, sample), printed as a share of the update.
"""
from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE as TorchRLGAE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    Check, Impl, apply_quick, environment_line, environment_meta, loadavg, make_parser, quiet_before_case,
    report_checks, run_interleaved, target_row, utc_now, write_results,
)

from torchrl_ext.storages import FastTensorStorage  # noqa: E402
from torchrl_ext.value import GAE  # noqa: E402

OBS, ACT, HIDDEN = 17, 6, 64
FRAMES, MINI_BATCH, GAMMA, LMBDA = 2048, 64, 0.99, 0.95


def networks(seed: int = 0) -> tuple[ProbabilisticActor, ValueOperator]:
    torch.manual_seed(seed)

    def mlp(out: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(OBS, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                                   torch.nn.Tanh(), torch.nn.Linear(HIDDEN, out))

    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(mlp(2 * ACT), NormalParamExtractor()),
                         in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)
    critic = ValueOperator(mlp(1), in_keys=["observation"])
    return actor, critic


def collected_batch(envs: int = 1, seed: int = 1) -> TensorDict:
    """A [envs, FRAMES // envs] batch as a collector returns it, with the actor's outputs."""
    g = torch.Generator().manual_seed(seed)
    steps = FRAMES // envs
    done = torch.rand(envs, steps, 1, generator=g) < 0.01
    batch = TensorDict({
        "observation": torch.randn(envs, steps, OBS, generator=g),
        "action": torch.rand(envs, steps, ACT, generator=g) * 1.8 - 0.9,
        "action_log_prob": torch.randn(envs, steps, generator=g) - 5.0,
        "loc": torch.randn(envs, steps, ACT, generator=g) * 0.1,
        "scale": torch.rand(envs, steps, ACT, generator=g) + 0.5,
        "next": {"observation": torch.randn(envs, steps, OBS, generator=g),
                 "reward": torch.randn(envs, steps, 1, generator=g), "done": done, "terminated": done.clone()},
    }, [envs, steps])
    return batch


class Variant:
    """One PPO learner: its networks, loss, optimiser, advantage module and buffer."""

    def __init__(self, name: str, storage_cls: type, gae_cls: type, epochs: int) -> None:
        self.name, self.epochs = name, epochs
        actor, critic = networks()
        self.loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0, critic_coeff=0.5,
                                normalize_advantage=True)
        self.advantage = gae_cls(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=False)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=3e-4)
        self.buffer = ReplayBuffer(storage=storage_cls(FRAMES), sampler=SamplerWithoutReplacement(),
                                   batch_size=MINI_BATCH)
        self.data = collected_batch()
        self.buffer_seconds: list[float] = []
        self.initial = copy.deepcopy(self.loss.state_dict())

    def update(self) -> torch.Tensor:
        """All epochs on the collected batch; returns the last minibatch's total loss."""
        in_buffer = 0.0
        total = torch.zeros(())
        for _ in range(self.epochs):
            t0 = time.perf_counter()
            with torch.no_grad():
                data = self.advantage(self.data.clone(False))
            self.buffer.extend(data.reshape(-1))
            in_buffer += time.perf_counter() - t0
            for _ in range(FRAMES // MINI_BATCH):
                t0 = time.perf_counter()
                batch = self.buffer.sample()
                in_buffer += time.perf_counter() - t0
                out = self.loss(batch)
                total = out["loss_objective"] + out["loss_critic"]
                self.optim.zero_grad()
                total.backward()
                torch.nn.utils.clip_grad_norm_(self.loss.parameters(), 0.5)
                self.optim.step()
        self.buffer_seconds.append(in_buffer)
        return total.detach()

    def reset(self) -> None:
        self.loss.load_state_dict(self.initial)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=3e-4)


def main() -> int:
    ap = make_parser(__doc__, "fewer epochs and repetitions (a smoke run)", min_rep_default=1.0)
    ap.add_argument("--epochs", type=int, default=10, help="PPO epochs per collected batch (TorchRL: 10)")
    args = ap.parse_args()
    apply_quick(args, reps=3, min_rep=0.2, max_wait=5.0)
    if args.quick:
        args.epochs = min(args.epochs, 2)
    torch.set_num_threads(args.threads)
    started, load_start = utc_now(), loadavg()
    print(f"# PPO loop: stock TorchRL components vs the README's swap\n\n{environment_line(started, load_start, args)}\n")
    stock = Variant("stock", LazyTensorStorage, TorchRLGAE, args.epochs)
    ours = Variant("torchrl_ext", FastTensorStorage, GAE, args.epochs)

    losses = []
    for variant in (stock, ours):  # the same start and random state: the same minibatches
        torch.manual_seed(7)
        losses.append(variant.update())
        variant.reset()
    checks = [Check("same losses after one update", bool(torch.allclose(losses[0], losses[1], rtol=1e-4, atol=1e-5)),
                    f"stock {float(losses[0]):.6f}, torchrl_ext {float(losses[1]):.6f}")]
    report_checks(checks)

    _, bg = quiet_before_case(args)
    impls = [Impl("stock", "stock TorchRL", stock.update), Impl("torchrl_ext", "README swap", ours.update)]
    for variant in (stock, ours):
        variant.buffer_seconds.clear()
    run_interleaved(impls, args.reps, args.min_rep_seconds, warmup=1)
    rows = {impl.name: {"median_ms": statistics.median(impl.per_rep) * 1e3,
                        "per_rep_ms": [t * 1e3 for t in impl.per_rep]} for impl in impls}
    print("| variant | update (ms) | buffer + value (ms) | share of the update |\n|---|--:|--:|--:|")
    for variant in (stock, ours):
        update_ms = rows[variant.name]["median_ms"]
        buffer_ms = statistics.median(variant.buffer_seconds) * 1e3
        rows[variant.name]["buffer_value_ms"] = buffer_ms
        print(f"| {variant.name} | {update_ms:,.1f} | {buffer_ms:,.1f} | {buffer_ms / update_ms:.0%} |")
    print("\n| case | what | ratio | paired | target | result | bg |\n|---|---|--:|--:|--:|---|--:|")
    entry = target_row(f"ppo_loop_E{args.epochs}", "PPO update, README swap vs stock", rows, "torchrl_ext",
                       "stock", 1.0, bg, all(c.ok for c in checks))
    buffer_ratio = rows["stock"]["buffer_value_ms"] / rows["torchrl_ext"]["buffer_value_ms"]
    print(f"\nbuffer + value steps: {buffer_ratio:.2f}x stock")
    if args.json:
        case = {"title": f"PPO update ({args.epochs} epochs of {FRAMES // MINI_BATCH} minibatches)",
                "impls": rows, "bg_load": bg, "buffer_value_ratio": buffer_ratio}
        write_results(args.json, {"meta": environment_meta(started, load_start, loadavg(), args),
                                  "cases": {entry["case"]: case}, "targets": [entry]}, checks)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
