"""One PPO epoch of chunked-recurrent minibatches: torchrl_ext vs a HARL-style numpy generator and TorchRL.

Usage::

    python benchmarks/bench_minibatch.py                 # full run (about 1-2 min on a quiet machine; ~1 GB peak RSS)
    python benchmarks/bench_minibatch.py --quick         # smoke run: same sizes, 3 short repetitions (~20 s)
    python benchmarks/bench_minibatch.py --only nmb1 --json benchmarks/results/bench_minibatch.json
    python benchmarks/bench_minibatch.py --profile 25    # also print cProfile's top 25 of torchrl_ext's epoch

Everything runs in one process. The rollout of issue 6: T=400 steps x N=32 envs, 4 agents kept
inside each step under ``"agents"`` (nested batch ``[T, N, 4]``), per agent per step:
``observation`` f32[64], ``rnn_state`` f32[1, 64] (R=1, H=64), ``action`` f32[1],
``action_log_prob`` f32[1], ``mask`` f32[1], ``active_mask`` f32[1], ``advantage`` f32[1]
(532 B per agent-step, 27.2 MB per rollout). Chunks of L=10 steps: 32 x 40 = 1,280 chunks.
One call = one epoch: every minibatch of the epoch, every field of each minibatch materialised
as a torch tensor. Two cases: ``num_mini_batch`` = 1 (HARL's default ``actor_num_mini_batch``
for recurrent MAPPO: the target case) and 4.

* torchrl_ext: ``torchrl_ext.replay_buffers.TensorDictReplayBuffer(storage=S,
  sampler=ChunkedRecurrentMinibatchSampler(num_mini_batch, data_chunk_length=10), batch_size=1)``,
  ``for batch in rb`` ([k, 10] minibatches, k = 1280 / num_mini_batch), with S =
  ``RolloutStorage(400)`` filled by 400 ``insert`` calls, and S = ``LazyTensorStorage(12800, ndim=2)``
  extended with the ``[400, 32]`` rollout (``dim_extend=0``).
* HARL numpy: ``recurrent_generator_actor`` written here from the spec (harl_alf.md A.2, the
  structure of HARL's ``OnPolicyActorBuffer``): per agent one buffer of separate numpy arrays
  (``obs`` (T+1, N, 64), ``rnn_states`` (T+1, N, 1, 64), ``actions`` (T, N, 1), ...), and per
  epoch per agent: ``torch.randperm(chunks)``, ``_sa_cast`` of every field (transpose to
  thread-major + reshape: one copy per field per epoch, as HARL does at each generator call),
  per minibatch a Python loop over its chunks appending slices, ``np.stack(axis=1)`` to
  (L, mbs, ...) and the time-major ``_flatten``; the trainer side converts every array with
  ``check()`` (``torch.from_numpy``) and ``.to(float32)``. HARL's MAPPO keeps one buffer per
  agent, so one epoch runs the generator 4 times (each agent's actor consumes its own
  generator, the non-shared-parameter path: no concatenation across agents).
* TorchRL: ``torchrl.data.TensorDictReplayBuffer(storage=LazyTensorStorage(12800),
  sampler=SliceSamplerWithoutReplacement(slice_len=10, traj_key="traj", strict_length=True),
  batch_size=k * 10)`` over the same data stored env-major (row ``n * T + t``), ``for batch in rb``.
  Two layouts: ``traj`` = env (32 trajectories of 400 steps: the sampler draws one slice per
  trajectory per epoch, so an "epoch" covers only 32 chunks) and ``traj`` = chunk (1,280
  trajectories of 10 steps: every chunk once per epoch, the apples-to-apples peer).
* reference: the physical gather only: ``randperm`` of the chunks, then per minibatch one
  ``index_select`` per field from the stored ``[T * N, 4, ...]`` tensors into ``[k, 10, 4, ...]``.

The timing method is the other scripts' (see _harness.py): warm-up, k calls per repetition,
repetitions interleaved round-robin with the GC off, torch at 1 thread, background load measured
and waited out before each case. After each case, a diagnostic table times the pieces of
torchrl_ext's path (and a cProfile of its epoch is printed when a target fails, or with --profile).

Checks (exit code 1 if one fails): for torchrl_ext (both storages) and the HARL peer, every
step of every agent appears exactly once per epoch, chunks are 10 consecutive steps of one env
starting at a multiple of 10, and every field equals the source; torchrl_ext's minibatches equal
the HARL peer's (all fields, each agent) when the same chunk permutation is injected
(``sampler.set_permutation(perm)``; [k, L] batch-first transposed to HARL's time-major L * k rows,
and ``rnn_state[:, 0]`` against HARL's chunk-start state); TorchRL's slices are consecutive
steps of one env equal to the source, and the chunk layout covers every step once per epoch.
A missed speed target is reported as FAIL, not an error.
"""
from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SliceSamplerWithoutReplacement
from torchrl.data import TensorDictReplayBuffer as TorchRLTensorDictReplayBuffer

from _harness import write_results
from _harness import (selected, Impl, proc_status, profile, diagnose, BgLoad, Check, apply_quick, bg_note, environment_line, environment_meta, loadavg,
                      make_parser, quiet_before_case, report_checks, run_interleaved, target_row, utc_now)
from torchrl_ext.replay_buffers import TensorDictReplayBuffer
from torchrl_ext.samplers import ChunkedRecurrentMinibatchSampler
from torchrl_ext.storages import RolloutStorage

T, N, A = 400, 32, 4  # episode_length, n_rollout_threads, agents
OBS, R, H = 64, 1, 64  # obs dim, recurrent_n, hidden size
L = 10  # data_chunk_length
CHUNKS = T * N // L  # 1280
NUM_MINI_BATCHES = (1, 4)  # 1 = HARL's default actor_num_mini_batch (the target case)
# torchrl_ext leaf (under "agents") -> (per-agent shape, HARL buffer array, HARL yield name)
FIELDS: dict[str, tuple[tuple[int, ...], str, str]] = {
    "observation": ((OBS,), "obs", "obs"),
    "rnn_state": ((R, H), "rnn_states", "rnn_states"),
    "action": ((1,), "actions", "actions"),
    "mask": ((1,), "masks", "masks"),
    "active_mask": ((1,), "active_masks", "active_masks"),
    "action_log_prob": ((1,), "action_log_probs", "old_action_log_probs"),
    "advantage": ((1,), "advantages", "adv_targ"),
}
KEYS = [("agents", name) for name in FIELDS]
HARL_YIELD = ["obs", "rnn_states", "actions", "masks", "active_masks", "old_action_log_probs", "adv_targ"]
AGENT_STEP_BYTES = sum(int(np.prod(s)) * 4 for s, _, _ in FIELDS.values())  # 532 B
ROLLOUT_BYTES = T * N * A * AGENT_STEP_BYTES
MiB = 2**20

# Implementation keys (tables, targets, JSON).
EXT_ROLLOUT, EXT_LAZY = "torchrl_ext RolloutStorage", "torchrl_ext LazyTensorStorage ndim=2"
HARL = "HARL numpy"
SLICE_CHUNK, SLICE_ENV = "torchrl SliceSamplerWoR traj=chunk", "torchrl SliceSamplerWoR traj=env"
REF = "ref index_select"
PER_STEP = " (per covered step)"


def case_key(nmb: int) -> str:
    return f"nmb{nmb}"


# (case key, implementation, baseline, minimum ratio baseline time / implementation time; None = information)
TARGETS: list[tuple[str, str, str, float | None]] = []
for _nmb in NUM_MINI_BATCHES:
    for _ext in (EXT_ROLLOUT, EXT_LAZY):
        TARGETS += [(case_key(_nmb), _ext, HARL, 5.0), (case_key(_nmb), _ext, SLICE_CHUNK, 1.0)]
    TARGETS += [(case_key(_nmb), EXT_ROLLOUT + PER_STEP, SLICE_ENV + PER_STEP, None),
                (case_key(_nmb), EXT_ROLLOUT, REF, None)]


# ---------------------------------------------------------------- the rollout
def make_source(seed: int = 0) -> dict[str, torch.Tensor]:
    """field -> [T, N, A, *shape] f32. observation[..., 0] is the step id (t * N + n) * A + a (exact in f32)."""
    g = torch.Generator().manual_seed(seed)
    src = {name: torch.randn(T, N, A, *shape, generator=g) for name, (shape, _, _) in FIELDS.items()}
    src["observation"][..., 0] = torch.arange(T * N * A, dtype=torch.float32).view(T, N, A)
    src["mask"] = (torch.rand(T, N, 1, 1, generator=g) > 0.02).float().expand(T, N, A, 1).contiguous()
    src["active_mask"] = (torch.rand(T, N, A, 1, generator=g) > 0.05).float()
    return src


def step_td(src: dict[str, torch.Tensor], t: int) -> TensorDict:
    return TensorDict({"agents": TensorDict({k: v[t] for k, v in src.items()}, [N, A])}, [N])


def rollout_td(src: dict[str, torch.Tensor]) -> TensorDict:
    return TensorDict({"agents": TensorDict(dict(src), [T, N, A])}, [T, N])


def build_ext_rollout(src: dict[str, torch.Tensor], nmb: int) -> tuple[TensorDictReplayBuffer, Any]:
    storage = RolloutStorage(T)
    for t in range(T):
        storage.insert(step_td(src, t))
    sampler = ChunkedRecurrentMinibatchSampler(nmb, data_chunk_length=L)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=1), sampler


def build_ext_lazy(src: dict[str, torch.Tensor], nmb: int) -> tuple[TensorDictReplayBuffer, Any]:
    sampler = ChunkedRecurrentMinibatchSampler(nmb, data_chunk_length=L)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(T * N, ndim=2), sampler=sampler, batch_size=1,
                                dim_extend=0)
    rb.extend(rollout_td(src))
    return rb, sampler


def build_slice(src: dict[str, torch.Tensor], nmb: int, traj: str) -> TorchRLTensorDictReplayBuffer:
    """Env-major rows n * T + t; traj = env (32 trajectories) or chunk (1280 trajectories of L)."""
    flat = {k: v.transpose(0, 1).reshape(N * T, A, *v.shape[3:]) for k, v in src.items()}
    rows = torch.arange(N * T)
    traj_id = rows // T if traj == "env" else rows // L
    rb = TorchRLTensorDictReplayBuffer(
        storage=LazyTensorStorage(N * T),
        sampler=SliceSamplerWithoutReplacement(slice_len=L, traj_key="traj", strict_length=True),
        batch_size=CHUNKS // nmb * L,
    )
    rb.extend(TensorDict({"agents": TensorDict(flat, [N * T, A]), "traj": traj_id}, [N * T]))
    return rb


# ---------------------------------------------------------------- HARL's generator, from the spec
class HarlActorBuffer:
    """One agent's OnPolicyActorBuffer arrays (harl_alf.md A.2), filled with the rollout of agent ``a``."""

    def __init__(self, src: dict[str, torch.Tensor], a: int) -> None:
        def slots(name: str, init: float) -> np.ndarray:  # (T + 1, N, ...): slot T stays at its init value
            x = src[name][:, :, a].numpy()
            out = np.full((T + 1, *x.shape[1:]), init, dtype=np.float32)
            out[:T] = x
            return out

        self.obs = slots("observation", 0.0)
        self.rnn_states = slots("rnn_state", 0.0)
        self.masks = slots("mask", 1.0)
        self.active_masks = slots("active_mask", 1.0)
        self.actions = src["action"][:, :, a].numpy().copy()
        self.action_log_probs = src["action_log_prob"][:, :, a].numpy().copy()
        self.available_actions = None  # continuous actions
        self.factor = None  # MAPPO: no HAPPO factor
        self.advantages = src["advantage"][:, :, a].numpy().copy()  # computed by the trainer, passed in


def _sa_cast(x: np.ndarray) -> np.ndarray:
    return x.transpose(1, 0, 2).reshape(-1, *x.shape[2:])


def _flatten(t: int, n: int, x: np.ndarray) -> np.ndarray:
    return x.reshape(t * n, *x.shape[2:])


def recurrent_generator_actor(buf: HarlActorBuffer, advantages: np.ndarray, actor_num_mini_batch: int,
                              data_chunk_length: int, perm: np.ndarray | None = None):
    """HARL's recurrent_generator_actor (A.2); ``perm`` replaces torch.randperm for the checks."""
    episode_length, n_rollout_threads = buf.actions.shape[0:2]
    batch_size = n_rollout_threads * episode_length
    data_chunks = batch_size // data_chunk_length
    mini_batch_size = data_chunks // actor_num_mini_batch
    assert episode_length % data_chunk_length == 0
    assert data_chunks >= 2
    rand = torch.randperm(data_chunks).numpy() if perm is None else perm
    sampler = [rand[i * mini_batch_size:(i + 1) * mini_batch_size] for i in range(actor_num_mini_batch)]
    # (T + 1, N, ...) -> (T, N, ...) -> (N, T, ...) -> (N * T, ...): thread-major
    obs = _sa_cast(buf.obs[:-1])
    actions = _sa_cast(buf.actions)
    action_log_probs = _sa_cast(buf.action_log_probs)
    advantages = _sa_cast(advantages)
    masks = _sa_cast(buf.masks[:-1])
    active_masks = _sa_cast(buf.active_masks[:-1])
    rnn_states = buf.rnn_states[:-1].transpose(1, 0, 2, 3).reshape(-1, *buf.rnn_states.shape[2:])
    for indices in sampler:
        obs_batch, rnn_states_batch, actions_batch = [], [], []
        masks_batch, active_masks_batch, old_action_log_probs_batch, adv_targ = [], [], [], []
        for index in indices:
            ind = index * data_chunk_length
            obs_batch.append(obs[ind:ind + data_chunk_length])
            actions_batch.append(actions[ind:ind + data_chunk_length])
            masks_batch.append(masks[ind:ind + data_chunk_length])
            active_masks_batch.append(active_masks[ind:ind + data_chunk_length])
            old_action_log_probs_batch.append(action_log_probs[ind:ind + data_chunk_length])
            adv_targ.append(advantages[ind:ind + data_chunk_length])
            rnn_states_batch.append(rnn_states[ind])  # only the state at the chunk start
        lc, mbs = data_chunk_length, mini_batch_size
        # (data_chunk_length, mini_batch_size, *dim)
        obs_batch = np.stack(obs_batch, axis=1)
        actions_batch = np.stack(actions_batch, axis=1)
        masks_batch = np.stack(masks_batch, axis=1)
        active_masks_batch = np.stack(active_masks_batch, axis=1)
        old_action_log_probs_batch = np.stack(old_action_log_probs_batch, axis=1)
        adv_targ = np.stack(adv_targ, axis=1)
        rnn_states_batch = np.stack(rnn_states_batch).reshape(mbs, *buf.rnn_states.shape[2:])
        # time-major (data_chunk_length * mini_batch_size, *dim)
        obs_batch = _flatten(lc, mbs, obs_batch)
        actions_batch = _flatten(lc, mbs, actions_batch)
        masks_batch = _flatten(lc, mbs, masks_batch)
        active_masks_batch = _flatten(lc, mbs, active_masks_batch)
        old_action_log_probs_batch = _flatten(lc, mbs, old_action_log_probs_batch)
        adv_targ = _flatten(lc, mbs, adv_targ)
        yield (obs_batch, rnn_states_batch, actions_batch, masks_batch, active_masks_batch,
               old_action_log_probs_batch, adv_targ, None)


def check_np(x: Any) -> Any:
    """HARL's ``check``: numpy -> torch."""
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def harl_epoch(bufs: list[HarlActorBuffer], nmb: int, perms: list[np.ndarray] | None = None,
               keep: bool = False) -> list[list[list[torch.Tensor]]]:
    """One epoch of every agent's actor: its generator, each array check()-ed and .to(float32)."""
    out: list[list[list[torch.Tensor]]] = []
    for a, buf in enumerate(bufs):
        per_agent = []
        for sample in recurrent_generator_actor(buf, buf.advantages, nmb, L, None if perms is None else perms[a]):
            batch = [check_np(x).to(dtype=torch.float32) for x in sample if x is not None]
            if keep:
                per_agent.append(batch)
        out.append(per_agent)
    return out


# ---------------------------------------------------------------- epochs
def buffer_epoch(rb: Any) -> Callable[[], Any]:
    """One epoch of ``for batch in rb``; every field fetched from each minibatch."""
    def op() -> int:
        n = 0
        for batch in rb:
            for key in KEYS:
                batch.get(key)
            n += 1
        return n
    return op


def ref_epoch(stored: dict[str, torch.Tensor], nmb: int) -> Callable[[], Any]:
    """randperm of the chunks, then per minibatch one index_select per field ([T * N, A, ...] time-major rows)."""
    offsets = torch.arange(L) * N

    def op() -> None:
        for units in torch.tensor_split(torch.randperm(CHUNKS), nmb):
            rows = ((units % (T // L)) * L * N + units // (T // L)).unsqueeze(1) + offsets  # [k, L]: t * N + n
            flat = rows.reshape(-1)
            for v in stored.values():
                v.index_select(0, flat).view(*rows.shape, *v.shape[1:])
    return op


# ---------------------------------------------------------------- checks
def decode(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """observation[..., 0] -> (t, n, a)."""
    i = ids.round().long()
    return i // (N * A), (i // A) % N, i % A


def check_ext_epoch(name: str, rb: Any, src: dict[str, torch.Tensor], nmb: int) -> list[Check]:
    batches = list(rb)
    k = CHUNKS // nmb
    sizes_ok = len(batches) == nmb and all(tuple(b.batch_size) == (k, L) for b in batches)
    ids = torch.cat([b["agents", "observation"][..., 0] for b in batches])  # [chunks, L, A]
    t, n, a = decode(ids)
    once = bool(torch.equal(ids.reshape(-1).round().long().sort().values, torch.arange(T * N * A)))
    agents_ok = bool((a == torch.arange(A)).all())
    one_env = bool((n == n[:, :1]).all())
    consecutive = bool((t.diff(dim=1) == 1).all()) and bool((t[:, 0] % L == 0).all())
    tt, nn = t[..., 0], n[..., 0]
    bad = [key for key in FIELDS
           if not torch.equal(torch.cat([b["agents", key] for b in batches]), src[key][tt, nn])]
    return [
        Check(f"{name} nmb={nmb}: one epoch covers every step once", sizes_ok and once and agents_ok,
              f"{len(batches)} minibatches of {[list(b.batch_size) for b in batches][:2]}{'...' if nmb > 2 else ''}; "
              f"{ids.numel():,} agent-steps, each of the {T * N * A:,} exactly once: {once}"),
        Check(f"{name} nmb={nmb}: chunks", one_env and consecutive,
              f"one env per chunk: {one_env}; {L} consecutive steps from a multiple of {L}: {consecutive}"),
        Check(f"{name} nmb={nmb}: data == source", not bad,
              "all 7 fields equal the rollout at the decoded (t, n)" if not bad else f"differs: {bad}"),
    ]


def check_harl_epoch(bufs: list[HarlActorBuffer], src: dict[str, torch.Tensor], nmb: int) -> list[Check]:
    out = harl_epoch(bufs, nmb, keep=True)
    mbs = CHUNKS // nmb
    once = chunks_ok = True
    bad: set[str] = set()
    for a, per_agent in enumerate(out):
        ids = torch.cat([b[0][:, 0].view(L, mbs).T for b in per_agent])  # [chunks, L]
        t, n, aa = decode(ids)
        once &= bool(torch.equal(ids.reshape(-1).round().long().sort().values, torch.arange(T * N) * A + a))
        chunks_ok &= bool((n == n[:, :1]).all()) and bool((t.diff(dim=1) == 1).all()) and bool((t[:, 0] % L == 0).all())
        tt, nn = t, n
        for i, name in enumerate(HARL_YIELD):
            key = next(k for k, v in FIELDS.items() if v[2] == name)
            if name == "rnn_states":
                got = torch.cat([b[i] for b in per_agent])
                want = src[key][tt[:, 0], nn[:, 0], a]
            else:
                got = torch.cat([b[i].view(L, mbs, *b[i].shape[1:]).transpose(0, 1) for b in per_agent])
                want = src[key][tt, nn, a]
            if not torch.equal(got, want):
                bad.add(name)
    counts = [len(p) for p in out]
    return [
        Check(f"{HARL} nmb={nmb}: one epoch covers every step once", once and counts == [nmb] * A,
              f"{A} agents x {counts[0]} minibatches of {mbs} chunks (L*mbs = {L * mbs} rows); every step of every "
              f"agent exactly once: {once}"),
        Check(f"{HARL} nmb={nmb}: chunks", chunks_ok,
              f"one env per chunk, {L} consecutive steps from a multiple of {L}"),
        Check(f"{HARL} nmb={nmb}: data == source", not bad,
              "all 7 yields equal the rollout (rnn_states = state at the chunk start)" if not bad
              else f"differs: {sorted(bad)}"),
    ]


def check_same_permutation(name: str, rb: Any, sampler: Any, bufs: list[HarlActorBuffer], nmb: int,
                           seed: int) -> Check:
    """Inject one chunk permutation into torchrl_ext and into every agent's HARL generator; compare all."""
    perm = torch.randperm(CHUNKS, generator=torch.Generator().manual_seed(seed))
    sampler.set_permutation(perm)
    ours = list(rb)
    theirs = harl_epoch(bufs, nmb, perms=[perm.numpy()] * A, keep=True)
    bad: set[str] = set()
    for i, batch in enumerate(ours):
        for a in range(A):
            for j, yname in enumerate(HARL_YIELD):
                key = next(k for k, v in FIELDS.items() if v[2] == yname)
                x = batch["agents", key][:, :, a]  # [k, L, ...]
                got = x[:, 0] if yname == "rnn_states" else x.transpose(0, 1).reshape(-1, *x.shape[2:])
                want = theirs[a][i][j]
                if got.shape != want.shape or not torch.equal(got, want):
                    bad.add(yname)
    ok = len(ours) == nmb and not bad
    return Check(f"{name} nmb={nmb}: == {HARL} with the same permutation", ok,
                 f"{len(ours)} minibatches x {A} agents x 7 fields; [k, L] transposed to time-major L*k rows, "
                 f"rnn_state[:, 0] vs HARL's chunk-start states" if ok else f"differs: {sorted(bad)}")


def check_slice_epoch(name: str, rb: TorchRLTensorDictReplayBuffer, src: dict[str, torch.Tensor],
                      full: bool) -> tuple[Check, dict[str, int]]:
    batches = list(rb)
    sizes = [b.batch_size[0] for b in batches]
    steps = sum(sizes)
    slices = torch.cat([b["agents", "observation"][:, :, 0].reshape(-1, L, A) for b in batches])
    t, n, a = decode(slices)
    ok = all(s % L == 0 for s in sizes) and bool((a == torch.arange(A)).all())
    ok &= bool((n == n[:, :1]).all()) and bool((t.diff(dim=1) == 1).all())
    bad = [key for key in FIELDS if not torch.equal(
        torch.cat([b["agents", key].reshape(-1, L, *b["agents", key].shape[1:]) for b in batches]),
        src[key][t[..., 0], n[..., 0]])]
    ok &= not bad
    flat_ids = slices.reshape(-1).round().long()
    unique = flat_ids.unique().numel() == flat_ids.numel()
    covers = unique and flat_ids.numel() == T * N * A
    if full:
        ok &= covers and bool((t[:, 0] % L == 0).all())
    detail = (f"{len(batches)} minibatch(es) of {sorted(set(sizes))} steps, {steps:,} steps in the epoch "
              f"({steps / (T * N):.1%} of the rollout), no step twice: {unique}; slices of {L} consecutive steps "
              f"of one env equal to the source: {not bad}"
              + (f"; every step once: {covers}" if full else ""))
    return Check(f"{name}: one epoch", ok, detail), {"minibatches": len(batches), "steps": steps}


# ---------------------------------------------------------------- reporting
def report_case(title: str, impls: list[Impl], baseline: str, bg: float, waited: float, pre: float,
                args: argparse.Namespace, coverage: dict[str, int]) -> dict[str, Any]:
    base = statistics.median(next(i for i in impls if i.name == baseline).per_rep)
    print(f"## {title}\n\n{bg_note(bg, waited, pre, args)}. Speed = `{baseline}` median / this median "
          f"(>1 = faster). steps = env-steps (of all {A} agents) returned per epoch.\n")
    print("| implementation | median ms/epoch | min | max | steps/epoch | us per step | speed vs HARL | k |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for impl in impls:
        med = statistics.median(impl.per_rep)
        steps = coverage.get(impl.name, T * N)
        rows[impl.name] = {"label": impl.label, "median_ms": med * 1e3, "min_ms": min(impl.per_rep) * 1e3,
                           "max_ms": max(impl.per_rep) * 1e3, "steps_per_epoch": steps, "k": impl.k,
                           "per_rep_ms": [s * 1e3 for s in impl.per_rep], "speed_vs_baseline": base / med}
        print(f"| {impl.label} | {med * 1e3:,.2f} | {min(impl.per_rep) * 1e3:,.2f} | {max(impl.per_rep) * 1e3:,.2f} | "
              f"{steps:,} | {med / steps * 1e6:.3f} | {base / med:.2f}x | {impl.k} |")
    print()
    for name in (EXT_ROLLOUT, SLICE_ENV):  # per covered step, for the SliceSampler(traj=env) comparison
        r = rows[name]
        steps = r["steps_per_epoch"]
        rows[name + PER_STEP] = {"median_ms": r["median_ms"] / steps,
                                 "per_rep_ms": [x / steps for x in r["per_rep_ms"]]}
    return rows


def report_targets(results: dict[str, dict[str, Any]], checks_ok: bool) -> list[dict[str, Any]]:
    print("## Targets\n\nratio = baseline median time per epoch / torchrl_ext median time per epoch (same run); "
          "paired = range over repetitions of (baseline rep time / torchrl_ext rep time), same round-robin round. "
          f"`{SLICE_CHUNK}` covers the same data as one epoch of chunks (apples-to-apples); "
          f"`{SLICE_ENV}` covers only one slice per env per epoch, so it is compared per covered step "
          "(information only).\n")
    print("| case | comparison | measured | paired min-max | target | result | bg load |\n"
          "|---|---|---:|---:|---:|:-:|---:|")
    out = []
    for key, impl, baseline, target in TARGETS:
        if key not in results:
            continue
        rows, bg = results[key]["impls"], results[key]["bg_load"]
        out.append(target_row(key, f"{impl} vs {baseline}", rows, impl, baseline, target, bg, checks_ok))
    print()
    return out





# ---------------------------------------------------------------- main
def main() -> int:
    ap = make_parser(__doc__, "smoke run: same sizes, 3 reps of >= 0.05 s, wait <= 5 s", min_rep_default=0.4)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print cProfile's top N functions of torchrl_ext's epoch (always done when a "
                         "target fails, top 25)")
    a = ap.parse_args()
    apply_quick(a, reps=3, min_rep=0.05, max_wait=5.0)
    torch.set_num_threads(a.threads)
    gc.freeze()  # objects from the imports: every gc.collect() (untimed) would walk them
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    extra = {"tensordict": version("tensordict"), "numpy": np.__version__}
    started, load_start, wall0 = utc_now(), loadavg(), time.perf_counter()
    print("# torchrl_ext chunked-recurrent minibatch epoch benchmark\n\n"
          f"{environment_line(started, load_start, a, extra)}\n")
    notes = [f"Rollout: T={T} x N={N} envs x {A} agents; per agent-step observation f32[{OBS}], rnn_state "
             f"f32[{R}, {H}], action, action_log_prob, mask, active_mask, advantage f32[1] ({AGENT_STEP_BYTES} B; "
             f"{ROLLOUT_BYTES / MiB:.1f} MiB per rollout). Chunks of L={L}: {CHUNKS:,} per epoch. "
             f"HARL peer: {A} per-agent buffers, generator run once per agent per epoch (non-shared actors)."]
    if a.quick:
        notes.append("**--quick**: 3 repetitions of >= 0.05 s: a smoke run, not a measurement.")
    for note in notes:
        print(note + "\n")

    src = make_source()
    results: dict[str, dict[str, Any]] = {}
    all_checks: list[Check] = []
    diagnostics: dict[str, list[dict[str, Any]]] = {}
    coverage_all: dict[str, dict[str, dict[str, int]]] = {}
    diag_reps, diag_rep_s = (3, 0.05) if a.quick else (5, 0.2)
    t0 = time.perf_counter()
    bufs = [HarlActorBuffer(src, i) for i in range(A)]
    stored = {k: v.reshape(T * N, A, *v.shape[3:]).clone() for k, v in src.items()}  # time-major rows for the ref
    print(f"Built the {A} HARL buffers in {time.perf_counter() - t0:.1f} s.\n")

    def run_case(nmb: int) -> None:
        """Builds, checks, times and diagnoses one num_mini_batch case; its buffers die with it."""
        key = case_key(nmb)
        t0 = time.perf_counter()
        ext_r, smp_r = build_ext_rollout(src, nmb)
        ext_l, smp_l = build_ext_lazy(src, nmb)
        slice_chunk, slice_env = build_slice(src, nmb, "chunk"), build_slice(src, nmb, "env")
        print(f"### num_mini_batch = {nmb}\n\nFilled RolloutStorage ({T} inserts), LazyTensorStorage ndim=2 and the "
              f"two TorchRL buffers in {time.perf_counter() - t0:.1f} s.\n")
        # Checks before timing (they also warm every path up).
        checks: list[Check] = []
        for name, rb, smp in ((EXT_ROLLOUT, ext_r, smp_r), (EXT_LAZY, ext_l, smp_l)):
            checks += check_ext_epoch(name, rb, src, nmb)
            checks.append(check_same_permutation(name, rb, smp, bufs, nmb, seed=nmb))
        checks += check_harl_epoch(bufs, src, nmb)
        coverage: dict[str, int] = {}
        for name, rb, full in ((SLICE_CHUNK, slice_chunk, True), (SLICE_ENV, slice_env, False)):
            c, cov = check_slice_epoch(name, rb, src, full)
            checks.append(c)
            coverage[name] = cov["steps"]
            coverage_all.setdefault(key, {})[name] = cov
        report_checks(checks)
        all_checks.extend(checks)

        k = CHUNKS // nmb
        impls = [
            Impl(HARL, f"HARL numpy `recurrent_generator_actor` x {A} agent buffers + `check()` (from the spec)",
                 lambda: harl_epoch(bufs, nmb)),
            Impl(SLICE_CHUNK, f"torchrl `SliceSamplerWithoutReplacement(slice_len={L}, traj_key=\"traj\")`, "
                              f"traj = chunk ({CHUNKS:,} x {L} steps), batch_size={k * L}", buffer_epoch(slice_chunk)),
            Impl(SLICE_ENV, f"the same with traj = env ({N} x {T} steps): one slice per env per epoch",
                 buffer_epoch(slice_env)),
            Impl(EXT_ROLLOUT, f"torchrl_ext `ChunkedRecurrentMinibatchSampler({nmb}, data_chunk_length={L})` on "
                              f"`RolloutStorage({T})` -> [{k}, {L}]", buffer_epoch(ext_r)),
            Impl(EXT_LAZY, f"the same on `LazyTensorStorage({T * N}, ndim=2)`", buffer_epoch(ext_l)),
            Impl(REF, "reference: randperm + one `index_select` per field per minibatch", ref_epoch(stored, nmb)),
        ]
        waited, pre = quiet_before_case(a)
        meter = BgLoad()
        run_interleaved(impls, a.reps, a.min_rep_seconds)
        bg = meter.cores()
        rows = report_case(f"One epoch, num_mini_batch = {nmb} ({nmb} x [{k}, {L}] minibatches)", impls, HARL,
                           bg, waited, pre, a, coverage)
        results[key] = {"num_mini_batch": nmb, "bg_load": bg, "waited_s": waited, "impls": rows,
                        "coverage": coverage_all.get(key, {})}

        # Where torchrl_ext's time goes: pieces of one minibatch (RolloutStorage).
        storage = ext_r.storage
        index, _ = smp_r.sample(storage, 1)
        smp_r._empty()
        adv_leaves = [storage.data.get(key)[:T] for key in KEYS]
        flat_leaves = [storage.data.get(key).flatten(0, 1) for key in KEYS]  # [(T + 1) * N, A, ...] views
        flat = (index[0] * N + index[1]).reshape(-1)
        for adv, fl in zip(adv_leaves, flat_leaves):  # the two gathers agree
            assert torch.equal(adv[index], fl.index_select(0, flat).view(*index[0].shape, *fl.shape[1:]))
        pieces = [
            (f"torchrl_ext epoch on RolloutStorage ({nmb} x rb.sample())", buffer_epoch(ext_r)),
            ("  rb.sample() (one minibatch, end to end)", lambda: ext_r.sample()),
            ("    ChunkedRecurrentMinibatchSampler.sample (index only)", lambda: smp_r.sample(storage, 1)),
            ("    RolloutStorage.get((time, thread)) (fixed index)", lambda: storage.get(index)),
            ("      the 7 leaves indexed as leaf[:T][time, thread] (TensorDict's advanced indexing)",
             lambda: [leaf[index] for leaf in adv_leaves]),
            ("      the 7 leaves as index_select of the flat rows time * N + thread (same values)",
             lambda: [leaf.index_select(0, flat) for leaf in flat_leaves]),
            ("    torch.stack of the (time, thread) index into [k, L, 2]", lambda: torch.stack(index, -1)),
            ("  reference index_select epoch", ref_epoch(stored, nmb)),
        ]
        diagnostics[key] = diagnose(f"num_mini_batch = {nmb}", pieces, diag_reps, diag_rep_s, a, unit="ms")
        case_targets = [t for t in TARGETS if t[0] == key and t[3] is not None]
        failed = any(rows[b]["median_ms"] / rows[i]["median_ms"] < tgt for _, i, b, tgt in case_targets)
        if a.profile or failed:
            smp_r._empty()  # start the profiled epochs at an epoch boundary
            profile(f"torchrl_ext epoch on RolloutStorage, num_mini_batch={nmb}", buffer_epoch(ext_r),
                    max(5, 40 // nmb), a.profile or 25)

    for nmb in NUM_MINI_BATCHES:
        if selected(a, case_key(nmb)):
            run_case(nmb)
            gc.collect()

    checks_ok = all(c.ok for c in all_checks)
    targets = report_targets(results, checks_ok)
    load_end, peak, wall = loadavg(), proc_status("VmHWM"), time.perf_counter() - wall0
    print(f"Peak RSS (VmHWM) {peak / MiB:,.0f} MiB. Wall time {wall:.0f} s.\n")
    print(f"loadavg at end `{load_end}`. Checks: {'all passed' if checks_ok else 'FAILED (see the check tables)'}.")
    if a.json:
        meta = environment_meta(started, load_start, load_end, a, extra)
        meta.update(T=T, N=N, agents=A, obs=OBS, R=R, H=H, chunk=L, quick=a.quick, wall_s=wall, peak_rss=peak,
                    notes=notes)
        payload = {"meta": meta, "cases": results, "diagnostics": diagnostics, "targets": targets}
        write_results(a.json, payload, all_checks)
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
