"""Every row of ``docs/errors.md``: the bad input raises the documented error and changes nothing.

The rows live here (one :func:`row` per case) and the table in
``docs/errors.md`` is rendered from them; :func:`test_doc_table_matches_rows`
fails when the two differ. Regenerate the table with::

    .venv/bin/python tests/test_errors.py

Each case builds a component (with valid data stored first where it keeps
state), returns a snapshot function and the bad call; the test snapshots,
runs the call under ``pytest.raises(error, match=...)`` and checks that a new
snapshot equals the old one. Rows whose state column is ``-`` (functional
code, constructors) have no state to check.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tensordict import TensorDict, is_tensor_collection
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.data import RandomSampler
from torchrl.modules import ProbabilisticActor

from torchrl_ext.config_files import instantiate_from_config
from torchrl_ext.demos import DemoStore
from torchrl_ext.io import SafetensorsCheckpointer
from torchrl_ext.io.checkpoint_pair import CheckpointPair, write_pair
from torchrl_ext.presets import alf_replay_buffer, harl_off_policy_buffer, l2r_ppo_buffer, velora_replay_buffer
from torchrl_ext.replay_buffers import (
    EnvRingReplayBuffer,
    PrioritizedReplayBuffer,
    PriorityEntryError,
    TensorDictReplayBuffer,
)
from torchrl_ext.replay_buffers.on_policy import OnPolicyReplayBuffer, VTraceReplayBuffer
from torchrl_ext.samplers import (
    NStepSampler,
    PrioritizedSampler,
    PrioritizedTrajectorySampler,
    TrajectorySampler,
)
from torchrl_ext.samplers.prioritized_nstep import PrioritizedNStepSampler
from torchrl_ext.segment_tree import SumSegmentTree
from torchrl_ext.storages import (
    DedupEnvRingStorage, EnvRingStorage, EpisodicEnvRingStorage, FastTensorStorage, RolloutStorage,
    StorageLayoutError,
)
from torchrl_ext.value import GAE, IntrinsicRewardNormalizer, TDLambda, ValueNorm, VTrace
from torchrl_ext.value import functional as F

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
BEGIN = "<!-- rows: generated from tests/test_errors.py, regenerate with `python tests/test_errors.py` -->"
END = "<!-- end of rows -->"

Snapshot = Callable[[], Any]
Built = tuple["Snapshot | None", Callable[[], Any]]


@dataclass(frozen=True)
class Row:
    """One bad input: where, what, the error it raises and the fix its message suggests."""

    id: str
    component: str
    bad_input: str
    error: type[BaseException]
    match: str
    fix: str
    state: str
    build: Callable[[Path], Built]

    def cells(self) -> list[str]:
        return [self.id, self.component, self.bad_input, f"`{self.error.__name__}`",
                f"`{self.match}`", self.fix, self.state]


ROWS: list[Row] = []


def row(id: str, component: str, bad_input: str, error: type[BaseException], match: str, fix: str,
        state: str = "-") -> Callable[[Callable[[Path], Built]], Callable[[Path], Built]]:
    """Registers the decorated case builder as a row of the table."""
    def register(build: Callable[[Path], Built]) -> Callable[[Path], Built]:
        ROWS.append(Row(id, component, bad_input, error, match, fix, state, build))
        return build
    return register


# ---------------------------------------------------------------------------- snapshots
def freeze(obj: Any) -> Any:
    """A deep copy of ``obj`` with tensors cloned and TensorDicts turned into dicts."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if is_tensor_collection(obj):
        leaves = {str(k): freeze(v) for k, v in obj.items(include_nested=True, leaves_only=True)}
        return {"batch_size": list(obj.batch_size), **leaves}
    if isinstance(obj, Mapping):
        return {str(k): freeze(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [freeze(v) for v in obj]
    return copy.deepcopy(obj)


def assert_same(before: Any, after: Any, where: str = "state") -> None:
    """Exact equality of two :func:`freeze` results (NaN equals NaN: unwritten rows may hold it)."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor), where
        torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys(), where
        for key in before:
            assert_same(before[key], after[key], f"{where}[{key!r}]")
    elif isinstance(before, list):
        assert isinstance(after, list) and len(before) == len(after), where
        for i, (a, b) in enumerate(zip(before, after)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert before == after, f"{where}: {before!r} != {after!r}"


def buffer_state(rb: Any) -> Snapshot:
    """Length, storage, writer cursor and sampler state of a replay buffer."""
    return lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict(),
                           "writer": rb.writer.state_dict(), "sampler": rb.sampler.state_dict()})


# ---------------------------------------------------------------------------- builders
def rows(start: int, n: int, dim: int = 2, dtype: torch.dtype = torch.float32) -> TensorDict:
    """``n`` transitions with ``obs`` = row number (``dim`` features) and a nested next obs."""
    obs = torch.arange(start, start + n, dtype=dtype).unsqueeze(1).expand(n, dim).clone()
    return TensorDict({"obs": obs, "next": {"obs": obs + 1}}, [n])


def fast_buffer(strict: bool = False, **kwargs: Any) -> TensorDictReplayBuffer:
    """Capacity 8 holding 5 rows."""
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8, strict=strict), **kwargs)
    rb.extend(rows(0, 5))
    return rb


def ring_buffer(sampler: Any = None) -> EnvRingReplayBuffer:
    """3 envs x max_length 4, 3 steps each: x = 10 * env + t."""
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4, sampler=sampler or TrajectorySampler(2))
    for t in range(3):
        rb.extend(TensorDict({"x": torch.tensor([0.0, 10.0, 20.0]) + t}, [3]))
    return rb


def prioritized_buffer() -> PrioritizedReplayBuffer:
    """4 rows with priorities 1, 2, 3, 4."""
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(8))
    rb.extend(rows(0, 4))
    rb.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    return rb


def checkpointed(tmp: Path) -> TensorDictReplayBuffer:
    """A buffer of 5 rows saved under ``tmp/good`` (prefix ``p_``)."""
    rb = fast_buffer(checkpointer=SafetensorsCheckpointer("p_"))
    rb.storage.dumps(tmp / "good")
    return rb


def flip_bit(path: Path, offset: int) -> None:
    """Flips one bit of the byte at ``offset`` of ``path`` (negative offsets count from the end)."""
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x10
    path.write_bytes(bytes(data))


def assert_refused(snapshot: Snapshot, call: Callable[[], Any], errors: Any = (ValueError, TypeError)) -> None:
    """``call()`` raises one of ``errors`` and ``snapshot()`` is the same after it as before."""
    before = snapshot()
    with pytest.raises(errors):
        call()
    assert_same(before, snapshot(), "state after a refused call")


@contextlib.contextmanager
def damaged_checkpoint(save: Callable[[Path], Any], where: str) -> Iterator[Path]:
    """A temporary folder holding what ``save(folder)`` wrote, with one bit flipped in the middle
    of its smallest (``where="first"``) or largest (``"largest"``) file (``.complete`` aside)."""
    with tempfile.TemporaryDirectory() as path:
        folder = Path(path)
        save(folder)
        files = sorted((p for p in folder.rglob("*") if p.is_file() and p.name != ".complete"),
                       key=lambda p: (p.stat().st_size, p.as_posix()))
        target = files[0] if where == "first" else files[-1]
        flip_bit(target, target.stat().st_size // 2)
        yield folder


def copy_of_good(tmp: Path, name: str) -> Path:
    folder = tmp / name
    shutil.copytree(tmp / "good", folder)
    return folder


def on_policy_step(n: int) -> TensorDict:
    flag = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict({"observation": torch.zeros(n, 1), "state_value": torch.zeros(n, 1),
                       "next": {"observation": torch.zeros(n, 1), "reward": torch.ones(n, 1),
                                "done": flag, "terminated": flag}}, [n])


def on_policy_buffer() -> OnPolicyReplayBuffer:
    """3 steps of 2 envs inserted, returns computed."""
    rb = OnPolicyReplayBuffer(3, gamma=0.5, gae_lambda=0.9)
    for _ in range(3):
        rb.insert(on_policy_step(2))
    rb.compute_returns()
    return rb


def on_policy_state(rb: OnPolicyReplayBuffer) -> Snapshot:
    return lambda: freeze({"storage": rb.storage.state_dict(), "gamma": rb.gamma,
                           "gae_lambda": rb.gae_lambda})


def rollout_storage() -> RolloutStorage:
    """num_steps 4, one step of 3 envs inserted."""
    rollout = RolloutStorage(4)
    rollout.insert(TensorDict({"obs": torch.zeros(3, 1), "next": {"obs": torch.ones(3, 1),
                                                                   "reward": torch.ones(3, 1)}}, [3]))
    return rollout


def harl_fp_step(num_agents: int, extra: dict[str, torch.Tensor] | None = None,
                 flag_shape: tuple[int, ...] | None = None) -> TensorDict:
    """One HARL FP insert over 2 threads: per-agent obs, reward and done."""
    flag_shape = flag_shape or (2, num_agents, 1)
    nxt = {"reward": torch.ones(flag_shape), "done": torch.zeros(flag_shape, dtype=torch.bool),
           **(extra or {})}
    return TensorDict({"agents": {"obs": torch.zeros(2, num_agents, 1)},
                       "next": {"agents": {"obs": torch.zeros(2, num_agents, 1), **nxt}}}, [2])


def gae_args(**overrides: Any) -> dict[str, Any]:
    args = dict(gamma=0.9, lmbda=0.95, state_value=torch.zeros(5, 1), next_state_value=torch.zeros(5, 1),
                reward=torch.ones(5, 1), done=torch.zeros(5, 1, dtype=torch.bool))
    return {**args, **overrides}


def vtrace_args(**overrides: Any) -> dict[str, Any]:
    zeros = torch.zeros(5, 1)
    args = dict(gamma=0.9, log_pi=zeros, log_mu=zeros, state_value=zeros, next_state_value=zeros,
                reward=zeros, done=torch.zeros(5, 1, dtype=torch.bool))
    return {**args, **overrides}


def estimator_input(value_shape: tuple[int, ...] = (2, 5, 1), with_value: bool = True) -> TensorDict:
    flag = torch.zeros(2, 5, 1, dtype=torch.bool)
    data = {"next": {"reward": torch.ones(2, 5, 1), "done": flag, "terminated": flag}}
    if with_value:
        data["state_value"] = torch.zeros(value_shape)
        data["next"]["state_value"] = torch.zeros(value_shape)
    return TensorDict(data, [2, 5])


def pure(call: Callable[[], Any]) -> Built:
    """A case without state."""
    return None, call


# ============================================================================ rows
# ---- FastTensorStorage (through TensorDictReplayBuffer and directly)
FAST = "len, storage, writer cursor"


@row("fast-dtype", "`FastTensorStorage` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` with `obs` float64 after float32 rows", StorageLayoutError,
     r"key 'obs': stored dtype is torch\.float32, got torch\.float64",
     "convert the data, e.g. `tensor.to(torch.float32)`", FAST)
def _(tmp: Path) -> Built:
    rb = fast_buffer()
    return buffer_state(rb), lambda: rb.extend(rows(5, 2, dtype=torch.float64))


@row("fast-set-dtype", "`FastTensorStorage`",
     "`FastTensorStorage(10).set(torch.arange(3, 5), td)` with a float64 `obs` after float32 rows",
     StorageLayoutError, r"key 'obs': stored dtype is torch\.float32, got torch\.float64",
     "convert the data, e.g. `tensor.to(torch.float32)`", "storage")
def _(tmp: Path) -> Built:
    storage = FastTensorStorage(10)
    storage.set(torch.arange(3), rows(0, 3))
    return (lambda: freeze(storage.state_dict()),
            lambda: storage.set(torch.arange(3, 5), rows(3, 2, dtype=torch.float64)))


@row("fast-shape", "`FastTensorStorage` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` with `obs` of 3 features after 2", StorageLayoutError,
     r"key 'obs': stored items have shape \[2\], got \[3\]",
     "per-item shapes must not change after the first write", FAST)
def _(tmp: Path) -> Built:
    rb = fast_buffer()
    return buffer_state(rb), lambda: rb.extend(rows(5, 2, dim=3))


@row("fast-missing-key", "`FastTensorStorage(strict=True)` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` without the stored `('next', 'obs')`", StorageLayoutError,
     r"data keys differ from the stored keys \(missing: \[.\('next', 'obs'\).\], extra: \[\]\)",
     "write the same keys every time, e.g. `data.select(*stored_keys)`", FAST)
def _(tmp: Path) -> Built:
    rb = fast_buffer(strict=True)
    return buffer_state(rb), lambda: rb.extend(rows(5, 2).exclude(("next", "obs")))


@row("fast-dtype-2d", "`FastTensorStorage(ndim=2)` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` of `[3, 2]` steps with `obs` float64 after float32 ones", StorageLayoutError,
     r"key 'obs': stored dtype is torch\.float32, got torch\.float64",
     "convert the data, e.g. `tensor.to(torch.float32)`", FAST)
def _(tmp: Path) -> Built:
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(12, ndim=2), dim_extend=1)
    rb.extend(TensorDict({"obs": torch.zeros(3, 2, 2)}, [3, 2]))
    return buffer_state(rb), lambda: rb.extend(TensorDict({"obs": torch.zeros(3, 2, 2, dtype=torch.float64)}, [3, 2]))


@row("fast-extra-key", "`FastTensorStorage(strict=True)` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` with a new key `extra`", StorageLayoutError,
     r"data keys differ from the stored keys \(missing: \[\], extra: \['extra'\]\)",
     "write the same keys every time, or build the storage from a sample that has all of them", FAST)
def _(tmp: Path) -> Built:
    rb = fast_buffer(strict=True)
    return buffer_state(rb), lambda: rb.extend(rows(5, 2).set("extra", torch.zeros(2)))


@row("fast-batch-too-big", "`FastTensorStorage(strict=True)` in `TensorDictReplayBuffer`",
     "`rb.extend(td)` with 9 rows into capacity 8", StorageLayoutError,
     r"cannot write a batch of 9 items into a storage of capacity 8",
     "extend in chunks of at most 8, or keep the newest: `data[-8:]`", FAST)
def _(tmp: Path) -> Built:
    rb = fast_buffer(strict=True)
    return buffer_state(rb), lambda: rb.extend(rows(5, 9))


@row("sample-info-shape", "`TensorDictReplayBuffer` with a custom sampler",
     "a sampler whose `info` entry has 3 values for a sample of 2", ValueError,
     r"sampler info 'weight' has shape \[3\], which does not lead with the sample's batch size \[2\]",
     "return one info value per sampled item (or a scalar, which is broadcast)", FAST)
def _(tmp: Path) -> Built:
    class BadInfoSampler(RandomSampler):
        def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
            index, info = super().sample(storage, batch_size)
            return index, {**info, "weight": torch.ones(batch_size + 1)}

    rb = fast_buffer(sampler=BadInfoSampler())
    return buffer_state(rb), lambda: rb.sample(2)


@row("fast-capacity", "`FastTensorStorage`", "`FastTensorStorage(0)`", ValueError,
     r"max_size must be an int >= 1, got max_size=0", "give a capacity of at least one item")
def _(tmp: Path) -> Built:
    return pure(lambda: FastTensorStorage(0))


@row("fast-get-out-of-range", "`FastTensorStorage`",
     "`storage.get(torch.tensor([1, 7]))` with 5 rows stored", IndexError,
     r"index 7 is out of range for a storage holding 5 items; read indices in \[0, 4\]",
     "read indices below `len(storage)` (negative ones count from the end)", "storage")
def _(tmp: Path) -> Built:
    rb = fast_buffer()
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.get(torch.tensor([1, 7]))


@row("fast-sample-empty", "`TensorDictReplayBuffer`", "`rb.sample(4)` before any `extend`",
     RuntimeError, r"Cannot sample from an empty storage", "extend the buffer first", "len")
def _(tmp: Path) -> Built:
    rb = TensorDictReplayBuffer(storage=FastTensorStorage(8))
    return (lambda: len(rb)), lambda: rb.sample(4)


# ---- SafetensorsCheckpointer: loading a bad pair into a buffer that holds data
CKPT = "storage of the loading buffer"


@row("ckpt-truncated", "`SafetensorsCheckpointer.loads`",
     "`p_state.safetensors` cut to its first 100 bytes", ValueError,
     r"p_state\.safetensors is not a readable safetensors file",
     "restore the file from the same save (or save again)", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    folder = copy_of_good(tmp, "truncated")
    state = folder / "p_state.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(folder)


@row("ckpt-checksum", "`SafetensorsCheckpointer.loads`",
     "`p_metadata.json` edited by hand (`size` 5 -> 3): its SHA-256 no longer matches the one in the state",
     ValueError,
     r"p_metadata\.json does not belong to .*p_state\.safetensors .*the two files come from different saves",
     "restore both files from the same save, or save again", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    folder = copy_of_good(tmp, "edited")
    meta = folder / "p_metadata.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "size": 3}))
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(folder)


@row("ckpt-flipped-bit", "`SafetensorsCheckpointer.loads`",
     "one bit of a stored value flipped in `p_state.safetensors`", ValueError,
     r"p_state\.safetensors: the tensors do not match the checksum recorded with them; the file is damaged",
     "restore the file from a backup, or save again", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    folder = copy_of_good(tmp, "flipped")
    flip_bit(folder / "p_state.safetensors", -1)
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(folder)


@row("buffer-ckpt-damaged", "`TensorDictReplayBuffer.loads`",
     "a checkpoint folder whose storage file has one flipped bit", ValueError,
     r"does not match the SHA-256 its manifest records: the file is damaged",
     "restore the folder from the same save", "len, storage, writer cursor, sampler")
def _(tmp: Path) -> Built:
    rb = fast_buffer()
    fast_buffer().dumps(tmp / "buffer")
    target = max((p for p in (tmp / "buffer" / "storage").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    flip_bit(target, target.stat().st_size // 2)
    return buffer_state(rb), lambda: rb.loads(tmp / "buffer")


@row("ckpt-invalid-json", "`SafetensorsCheckpointer.loads`",
     "a pair whose metadata text is `{not json` (checksum consistent)", ValueError,
     r"p_metadata\.json is not valid JSON", "restore it from a backup", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    write_pair(CheckpointPair(tmp / "bad", "p_"), {"obs": torch.zeros(8, 2)}, "{not json")
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(tmp / "bad")


@row("ckpt-edited-position", "`SafetensorsCheckpointer.loads`",
     "a pair without checksum (another writer) whose JSON says `position: 9` for capacity 8", ValueError,
     r"need capacity >= 1, 0 <= size <= capacity and 0 <= position < capacity, got capacity=8, size=5, position=9",
     "fix the JSON fields (the file was edited or comes from another writer)", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    folder = tmp / "unverified"
    folder.mkdir()
    tensors = {".".join((k,) if isinstance(k, str) else k): v.contiguous()
               for k, v in rb.storage._storage.items(include_nested=True, leaves_only=True)}
    save_file(tensors, folder / "p_state.safetensors")  # no checksum in the header
    meta = json.loads((tmp / "good" / "p_metadata.json").read_text())
    (folder / "p_metadata.json").write_text(json.dumps({**meta, "position": 9}))
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(folder)


@row("ckpt-capacity", "`SafetensorsCheckpointer.loads`",
     "a checkpoint of a capacity-6 buffer loaded into capacity 8", ValueError,
     r"holds a buffer of capacity 6 but the storage has max_size=8; build the storage with max_size=6",
     "build the storage with `max_size=6`", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    other = TensorDictReplayBuffer(storage=FastTensorStorage(6), checkpointer=SafetensorsCheckpointer("p_"))
    other.extend(rows(0, 3))
    other.storage.dumps(tmp / "six")
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(tmp / "six")


@row("ckpt-layout", "`SafetensorsCheckpointer.loads`",
     "a checkpoint with other keys / item shapes loaded into an initialised storage", ValueError,
     r"does not fit the initialised storage: .*Load into a fresh storage",
     "load into a fresh storage (e.g. a new buffer)", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    other = TensorDictReplayBuffer(storage=FastTensorStorage(8), checkpointer=SafetensorsCheckpointer("p_"))
    other.extend(TensorDict({"obs": torch.zeros(3, 4)}, [3]))
    other.storage.dumps(tmp / "other")
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(tmp / "other")


@row("ckpt-missing-metadata", "`SafetensorsCheckpointer.loads`", "`p_metadata.json` deleted",
     FileNotFoundError, r"p_metadata\.json not found",
     "check the folder and prefix (the message lists the prefixes found there)", CKPT)
def _(tmp: Path) -> Built:
    rb = checkpointed(tmp)
    folder = copy_of_good(tmp, "no_meta")
    (folder / "p_metadata.json").unlink()
    return lambda: freeze(rb.storage.state_dict()), lambda: rb.storage.loads(folder)


@row("ckpt-prefix", "`SafetensorsCheckpointer`", "`SafetensorsCheckpointer('run/v1_')`", ValueError,
     r"prefix='run/v1_' contains a path separator",
     "put folders in the path argument, e.g. `save('ckpt/run1', prefix='buffer_')`")
def _(tmp: Path) -> Built:
    return pure(lambda: SafetensorsCheckpointer("run/v1_"))


# ---- EnvRingReplayBuffer / EnvRingStorage / EnvRingWriter
RING = "storage (data, positions, sizes), write count, sampler"


def _ring_write(env_ids: Any = None, data: TensorDict | None = None) -> Built:
    """``rb.extend(data, env_ids=...)`` on :func:`ring_buffer` (2 float rows by default)."""
    rb = ring_buffer()
    data = TensorDict({"x": torch.tensor([1.0, 2.0])}, [2]) if data is None else data
    if env_ids is None:
        return buffer_state(rb), lambda: rb.extend(data)
    return buffer_state(rb), lambda: rb.extend(data, env_ids=env_ids)


@row("ring-flat-prioritized", "`EnvRingReplayBuffer`", "`sampler=PrioritizedSampler(8, 0.7, 0.5)`", TypeError,
     r"PrioritizedSampler keeps a priority per row of a tensor storage, got an EnvRingStorage; for per-env "
     r"rings use PrioritizedTrajectorySampler", "use `PrioritizedTrajectorySampler` on rings")
def _(tmp: Path) -> Built:
    return pure(lambda: EnvRingReplayBuffer(num_envs=2, max_length=4, sampler=PrioritizedSampler(8, 0.7, 0.5)))


@row("ring-load-other-sampler", "`alf_replay_buffer(prioritized_sampling=True).load_state_dict`",
     "the state of a uniform-sampling `alf_replay_buffer`", ValueError,
     r"state_dict\['_sampler'\] cannot be loaded into this buffer's PrioritizedTrajectorySampler "
     r"\(ValueError: state_dict lacks \['initialized'.*\]: it is damaged or of another sampler.*\); "
     r"the buffer is unchanged", "build the buffer as the saved one was built",
     "len, storage, writer cursor")
def _(tmp: Path) -> Built:
    rb = alf_replay_buffer(3, 6, prioritized_sampling=True)
    other = alf_replay_buffer(3, 6)
    other.extend(TensorDict({"x": torch.ones(3)}, [3]))
    return (lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict(), "writer": rb.writer.state_dict()}),
            lambda: rb.load_state_dict(other.state_dict()))


@row("episodic-load-plain-ring", "`EpisodicEnvRingStorage.load_state_dict`", "an `EnvRingStorage` state",
     ValueError, r"the checkpoint has no episode index \('episodes'\), which this EpisodicEnvRingStorage needs",
     "build the storage as the saved one was built", "storage")
def _(tmp: Path) -> Built:
    storage = EpisodicEnvRingStorage(2, 6)
    storage.set((torch.tensor([0, 1]), torch.tensor([0, 0])),
                TensorDict({"step_type": torch.zeros(2, dtype=torch.int32), "x": torch.ones(2)}, [2]))
    other = EnvRingStorage(2, 6)
    for t in range(3):
        other.set((torch.tensor([0, 1]), torch.tensor([t, t])), TensorDict({"x": torch.ones(2)}, [2]))
    return (lambda: freeze(storage.state_dict())), lambda: storage.load_state_dict(other.state_dict())


@row("ring-duplicate-env-ids", "`EnvRingReplayBuffer.extend`", "`env_ids=[0, 0]`", ValueError,
     r"env ids must be distinct within one write, got \[0\] more than once",
     "write repeated envs in separate calls (or as `[N, T]` steps)", RING)
def _(tmp: Path) -> Built:
    return _ring_write([0, 0])


@row("ring-env-id-too-large", "`EnvRingReplayBuffer.extend`", "`env_ids=[0, 3]` with `num_envs=3`",
     ValueError, r"env id 3 is out of range; env ids must lie in \[0, 2\]",
     "use env ids in `[0, num_envs - 1]`", RING)
def _(tmp: Path) -> Built:
    return _ring_write([0, 3])


@row("ring-env-id-negative", "`EnvRingReplayBuffer.extend`", "`env_ids=[-1, 0]`", ValueError,
     r"env id -1 is out of range; env ids must lie in \[0, 2\]", "use env ids in `[0, num_envs - 1]`",
     RING)
def _(tmp: Path) -> Built:
    return _ring_write([-1, 0])


@row("ring-float-env-ids", "`EnvRingReplayBuffer.extend`", "`td['env_id'] = torch.tensor([0.0, 1.0])`",
     TypeError, r"must hold integer env ids, got dtype=torch\.float32", "pass integer env ids", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"x": torch.zeros(2), "env_id": torch.tensor([0.0, 1.0])}, [2])
    return buffer_state(rb), lambda: rb.extend(data)


@row("ring-rows-without-env-ids", "`EnvRingReplayBuffer.extend`",
     "2 rows without `env_id` entry or `env_ids=` and `num_envs=3`", ValueError,
     r"data has no 'env_id' entry and 2 rows, but the storage has num_envs=3",
     "give `data['env_id']`, or write all envs in order", RING)
def _(tmp: Path) -> Built:
    return _ring_write()


@row("ring-dtype", "`EnvRingReplayBuffer.extend`", "`x` int64 after float32 steps", StorageLayoutError,
     r"key 'x': stored dtype is torch\.float32, got torch\.int64",
     "convert the data, e.g. `tensor.to(torch.float32)`", RING)
def _(tmp: Path) -> Built:
    return _ring_write(data=TensorDict({"x": torch.tensor([1, 2, 3])}, [3]))


@row("ring-shape", "`EnvRingReplayBuffer.extend`", "`x` of per-step shape `[2]` after scalars",
     StorageLayoutError, r"key 'x': stored items have shape \[\], got \[2\]",
     "per-item shapes must not change after the first write", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"x": torch.zeros(3, 2)}, [3])
    return buffer_state(rb), lambda: rb.extend(data)


@row("ring-missing-key", "`EnvRingReplayBuffer.extend`", "steps with `y` instead of the stored `x`",
     StorageLayoutError, r"data keys differ from the stored keys \(missing: \['x'\], extra: \['y'\]\)",
     "write the same keys every time", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"y": torch.zeros(3)}, [3])
    return buffer_state(rb), lambda: rb.extend(data)


@row("ring-extra-key", "`EnvRingReplayBuffer.extend`", "steps with `x` and a new `y`", StorageLayoutError,
     r"data keys differ from the stored keys \(missing: \[\], extra: \['y'\]\)",
     "write the same keys every time", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"x": torch.zeros(3), "y": torch.zeros(3)}, [3])
    return buffer_state(rb), lambda: rb.extend(data)


@row("ring-too-many-steps", "`EnvRingReplayBuffer.extend`", "`[3, 5]` steps into rings of `max_length=4`",
     ValueError, r"data holds 5 steps per env but each ring keeps max_length=4",
     "write at most `max_length` steps at a time", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"x": torch.zeros(3, 5)}, [3, 5])
    return buffer_state(rb), lambda: rb.extend(data)


@row("ring-too-many-steps-blocking", "`EnvRingReplayBuffer.extend`",
     "`[3, 5]` steps into rings of `max_length=4`, `blocking=True`",
     ValueError, r"data holds 5 steps per env but each ring keeps max_length=4",
     "write at most `max_length` steps at a time (it never waits: no ring can make that much room)", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    data = TensorDict({"x": torch.zeros(3, 5)}, [3, 5])
    return buffer_state(rb), lambda: rb.extend(data, blocking=True)


@row("episodic-step-type", "`EnvRingReplayBuffer` + `EpisodicEnvRingStorage`",
     "steps whose `step_type` is 7", ValueError,
     r"'step_type' must hold ALF's StepType values 0 \(FIRST\), 1 \(MID\) or 2 \(LAST\), got values in \[7, 7\]",
     "write ALF step types (or bools: episode starts)", RING)
def _(tmp: Path) -> Built:
    rb = EnvRingReplayBuffer(storage=EpisodicEnvRingStorage(2, 4), sampler=TrajectorySampler(1))
    steps = TensorDict({"x": torch.zeros(2), "step_type": torch.zeros(2, dtype=torch.int32)}, [2])
    rb.extend(steps)
    bad = steps.clone().set("step_type", torch.full((2,), 7, dtype=torch.int32))
    return buffer_state(rb), lambda: rb.extend(bad)


@row("ring-read-env-out-of-range", "`EnvRingStorage.read`", "`read(torch.tensor([3]), torch.tensor([0]))`",
     ValueError, r"env_ids must lie in \[0, 2\], got values in \[3, 3\]", "read env ids in `[0, num_envs - 1]`",
     RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.storage.read(torch.tensor([3]), torch.tensor([0]))


@row("ring-read-not-stored", "`EnvRingStorage.read`", "`read(torch.tensor([0]), torch.tensor([7]))`",
     ValueError, r"position 7 of env 0 is not stored; env 0 holds positions \[0, 2\]",
     "query stored positions only", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.storage.read(torch.tensor([0]), torch.tensor([7]))


@row("ring-read-shapes", "`EnvRingStorage.read`", "`read(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))`",
     ValueError, r"env_ids of shape \(2,\) and positions of shape \(3,\) do not broadcast together",
     "pass one position per env id (or a single one)", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.storage.read(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))


@row("ring-get-shapes", "`EnvRingStorage.get` / `set`", "`storage[torch.tensor([0, 1]), torch.tensor([0, 1, 2])]`",
     ValueError, r"index\[0\] of shape \(2,\) and index\[1\] of shape \(3,\) do not broadcast together",
     "pass one position per env id (or a single one)", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.storage[torch.tensor([0, 1]), torch.tensor([0, 1, 2])]


@row("ring-dequeue-too-many", "`EnvRingReplayBuffer.dequeue`", "`dequeue(4)` when every env holds 3 steps",
     ValueError, r"cannot dequeue n=4 steps: env 0 holds only 3", "dequeue fewer, or wait for more data",
     RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.dequeue(4)


@row("ring-sample-empty", "`EnvRingReplayBuffer` + `TrajectorySampler`", "`rb.sample(2)` before any write",
     RuntimeError, r"Cannot sample from an empty storage", "write data first", RING)
def _(tmp: Path) -> Built:
    rb = EnvRingReplayBuffer(num_envs=3, max_length=4, sampler=TrajectorySampler(2))
    return buffer_state(rb), lambda: rb.sample(2)


@row("traj-window-too-long", "`TrajectorySampler`",
     "`batch_length=4` when every env holds 3 steps", ValueError,
     r"no env holds a window of batch_length=4 after ignoring 0 earliest steps \(steps per env: \[3, 3, 3\]\)",
     "sample shorter windows or add more data", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer(TrajectorySampler(4))
    return buffer_state(rb), lambda: rb.sample(2)


@row("traj-batch-size", "`TrajectorySampler`", "`rb.sample(0)`", ValueError,
     r"batch_size must be an int >= 1, got batch_size=0", "pass `batch_size >= 1`", RING)
def _(tmp: Path) -> Built:
    rb = ring_buffer()
    return buffer_state(rb), lambda: rb.sample(0)


@row("traj-batch-length", "`TrajectorySampler`", "`sampler.batch_length = 0`", ValueError,
     r"batch_length must be an int >= 1, got batch_length=0", "use `batch_length >= 1`",
     "sampler's `batch_length`")
def _(tmp: Path) -> Built:
    sampler = TrajectorySampler(2)
    return (lambda: sampler.batch_length), lambda: setattr(sampler, "batch_length", 0)


@row("alf-missing-step-type", "`alf_replay_buffer` (`EpisodicEnvRingStorage`)",
     "`rb.extend(td)` without `step_type` when `keep_episodic_info=True`", ValueError,
     r"EpisodicEnvRingStorage needs 'step_type' in every written batch",
     "add `step_type`, or pass the key that holds it to the constructor", "len, storage")
def _(tmp: Path) -> Built:
    rb = alf_replay_buffer(1, 4, keep_episodic_info=True, batch_size=1)
    return (lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict()}),
            lambda: rb.extend(TensorDict({"obs": torch.zeros(1, 2)}, [1])))


# ---- priorities
PRIO = "len, storage, sampler (sum/min trees, max priority)"


def _prio_update(index: torch.Tensor, priority: torch.Tensor) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: rb.update_priority(index, priority)


@row("prio-nan", "`PrioritizedReplayBuffer.update_priority`", "`priority=[1.0, nan]`", ValueError,
     r"priority must be finite and >= 0, got values in \[nan, nan\]",
     "use e.g. `td_error.abs()` and replace NaN/inf before updating", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 1]), torch.tensor([1.0, math.nan]))


@row("prio-negative", "`PrioritizedReplayBuffer.update_priority`", "`priority=[1.0, -1.0]`", ValueError,
     r"priority must be finite and >= 0, got values in \[-1\.0, 1\.0\]",
     "use e.g. `td_error.abs()`", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 1]), torch.tensor([1.0, -1.0]))


@row("prio-inf", "`PrioritizedReplayBuffer.update_priority`", "`priority=[1.0, inf]`", ValueError,
     r"priority must be finite and >= 0, got values in \[1\.0, inf\]", "replace inf before updating", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 1]), torch.tensor([1.0, math.inf]))


@row("prio-index-out-of-range", "`PrioritizedReplayBuffer.update_priority`",
     "`index=[0, 9]` with `max_capacity=8`", ValueError,
     r"index 9 is out of range for a sampler of max_capacity 8; indices must lie in \[0, 7\]",
     "use indices in `[0, 7]` (or -1 to skip an entry)", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 9]), torch.tensor([1.0, 1.0]))


@row("prio-index-not-stored", "`PrioritizedReplayBuffer.update_priority`",
     "`index=[0, 6]` with 4 rows stored (capacity 8)", ValueError,
     r"index 6 is not stored: the storage holds 4 items, so priorities can be written for indices in \[0, 3\]",
     "write back priorities of stored items only (not of a batch sampled before `empty()` or a load)", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 6]), torch.tensor([1.0, 1.0]))


@row("prio-extend-nan", "`PrioritizedReplayBuffer.extend`", "a batch whose `td_error` holds NaN",
     PriorityEntryError, r"Failed to update priority of extended data: priority must be finite and >= 0.*"
     r"Nothing was stored", "fix the priority entry, or `extend(..., update_priority=False)`", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    data = rows(10, 2).set("td_error", torch.tensor([1.0, math.nan]))
    return buffer_state(rb), lambda: rb.extend(data)


@row("prio-alpha-inf", "`PrioritizedSampler`", "`rb.sampler.alpha = math.inf`", ValueError,
     r"alpha must be a finite number, got alpha=inf", "use a finite alpha >= 0", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: setattr(rb.sampler, "alpha", math.inf)


@row("prio-eps-inf", "`PrioritizedSampler`", "`PrioritizedSampler(8, 0.6, 0.4, eps=math.inf)`", ValueError,
     r"eps must be a finite number, got eps=inf", "use a finite eps >= 0")
def _(tmp: Path) -> Built:
    return pure(lambda: PrioritizedSampler(8, 0.6, 0.4, eps=math.inf))


@row("prio-float-index", "`PrioritizedReplayBuffer.update_priority`", "`index=torch.tensor([0.0])`",
     TypeError, r"index must hold integers, got dtype=torch\.float32", "pass the sampled integer index", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0.0]), torch.tensor([1.0]))


@row("prio-length-mismatch", "`PrioritizedReplayBuffer.update_priority`", "3 indices, 2 priorities",
     ValueError, r"priority of shape \(2,\) does not match 3 indices",
     "pass `[3]`, `[3, ...]` (reduced) or a scalar", PRIO)
def _(tmp: Path) -> Built:
    return _prio_update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 1.0]))


@row("prio-sample-empty", "`PrioritizedReplayBuffer`", "`rb.sample(2)` before any `extend`", RuntimeError,
     r"Cannot sample from an empty storage\. Extend the buffer before calling sample\(\)",
     "extend the buffer first", "len, sampler")
def _(tmp: Path) -> Built:
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=FastTensorStorage(8))
    return (lambda: freeze({"len": len(rb), "sampler": rb.sampler.state_dict()})), lambda: rb.sample(2)


@row("prio-batch-size", "`PrioritizedReplayBuffer`", "`rb.sample(0)`", ValueError,
     r"batch_size must be an int >= 1, got batch_size=0", "pass `batch_size >= 1`", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: rb.sample(0)


@row("prio-beta", "`PrioritizedSampler`", "`rb.sampler.beta = -1.0`", ValueError,
     r"beta must be >= 0\.0, got beta=-1\.0", "use a beta >= 0", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: setattr(rb.sampler, "beta", -1.0)


@row("prio-overflow", "`PrioritizedReplayBuffer.update_priority`", "`priority=[1e20]` with `alpha=2`",
     ValueError, r"priority=1e\+20 with alpha=2 and eps=1e-08 gives \(priority \+ eps\) \*\* alpha above "
     r"3\.403e\+38, the largest torch\.float32 value the trees hold; nothing was written",
     "scale the priorities down, lower alpha or use `dtype=torch.float64`", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    rb.sampler.alpha = 2.0
    return buffer_state(rb), lambda: rb.update_priority(torch.tensor([0]), torch.tensor([1e20]))


@row("prio-alpha-overflow", "`PrioritizedSampler`", "`rb.sampler.alpha = 70.0` over priorities up to 4",
     ValueError, r"the stored priority 4 with alpha=70 .* alpha and the priorities were kept",
     "lower alpha, or use `dtype=torch.float64`", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: setattr(rb.sampler, "alpha", 70.0)


@row("prio-alpha", "`PrioritizedSampler`", "`rb.sampler.alpha = -1.0`", ValueError,
     r"alpha must be >= 0\.0, got alpha=-1\.0", "use alpha >= 0", PRIO)
def _(tmp: Path) -> Built:
    rb = prioritized_buffer()
    return buffer_state(rb), lambda: setattr(rb.sampler, "alpha", -1.0)


@row("ptraj-nan", "`PrioritizedTrajectorySampler.update_window_priority`", "priorities `[1.0, nan]`",
     ValueError, r"priorities must be finite and >= 0, got values in \[nan, nan\]",
     "replace NaN/inf before updating", "storage, sampler tree leaves")
def _(tmp: Path) -> Built:
    sampler = PrioritizedTrajectorySampler(batch_length=1)
    rb = ring_buffer(sampler)
    rb.sample(1)
    return (lambda: freeze({"storage": rb.storage.state_dict(), "leaves": sampler._tree.leaves}),
            lambda: sampler.update_window_priority([0, 0], [0, 1], [1.0, math.nan]))


@row("tree-index-out-of-range", "`SumSegmentTree.__setitem__`", "`tree[torch.tensor([5])] = 1.0` on capacity 4",
     ValueError, r"index 5 is out of range for a tree of capacity 4; indices must lie in \[0, 3\]",
     "use indices in `[0, capacity - 1]`", "tree `state_dict()`")
def _(tmp: Path) -> Built:
    tree = SumSegmentTree(4)
    tree[torch.tensor([0, 1])] = torch.tensor([1.0, 2.0])
    return (lambda: freeze(tree.state_dict()),
            lambda: tree.__setitem__(torch.tensor([5]), torch.tensor([1.0])))


@row("tree-nan", "`SumSegmentTree.__setitem__`", "`tree[torch.tensor([2])] = nan`", ValueError,
     r"a SumSegmentTree holds finite values >= 0, got values in \[nan, nan\]",
     "replace NaN/inf and negative values before writing", "tree `state_dict()`")
def _(tmp: Path) -> Built:
    tree = SumSegmentTree(4)
    tree[torch.tensor([0, 1])] = torch.tensor([1.0, 2.0])
    return (lambda: freeze(tree.state_dict()),
            lambda: tree.__setitem__(torch.tensor([2]), torch.tensor([math.nan])))


# ---- batch larger than the stored data
@row("harl-batch-too-big", "`harl_off_policy_buffer` (`NStepSampler`)",
     "`rb.sample()` with `batch_size=8` and 2 stored transitions", ValueError,
     r"NStepSampler needs at least batch_size=8 stored transitions, the buffer holds 2",
     "collect more first (a warm-up) or sample fewer", RING)
def _(tmp: Path) -> Built:
    rb = harl_off_policy_buffer(20, 2, batch_size=8, n_step=2)
    flag = torch.zeros(2, 1, dtype=torch.bool)
    rb.extend(TensorDict({"state": torch.zeros(2, 1), "next": {
        "state": torch.zeros(2, 1), "reward": torch.zeros(2, 1), "done": flag}}, [2]))
    return buffer_state(rb), lambda: rb.sample()


@row("velora-batch-too-big", "`velora_replay_buffer`", "`rb.sample()` with `batch_size=5` and 2 stored rows",
     ValueError, r"sample: only 2 transitions stored, batch_size=5",
     "add more (or warm the buffer) before sampling", "len, storage")
def _(tmp: Path) -> Built:
    rb = velora_replay_buffer(10, 3, 2, 4, batch_size=5)
    rb.add_multi(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2),
                 torch.zeros(2, 4))
    return (lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict()})), lambda: rb.sample()


@row("velora-state-dim", "`velora_replay_buffer`", "`rb.add(state)` with 4 values for `state_dim=3`",
     ValueError, r"add: state has 4 values \(shape \[4\]\); expected 3 \(state_dim",
     "pass `state_dim` values per state", "len, storage")
def _(tmp: Path) -> Built:
    rb = velora_replay_buffer(10, 3, 2, 4, batch_size=5)
    rb.add([0.0] * 3, [0, 0], 0, [0] * 3, False, [0] * 4)
    return ((lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict()})),
            lambda: rb.add([0.0] * 4, [0, 0], 0, [0] * 3, False, [0] * 4))


@row("minibatch-too-many", "`OnPolicyReplayBuffer.generate_batches`",
     "`num_mini_batch=7` over a rollout of 3 steps x 2 envs", ValueError,
     r"num_mini_batch=7 is larger than the 6 steps of the rollout; use at most 6 minibatches",
     "use at most 6 minibatches", "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = on_policy_buffer()
    return on_policy_state(rb), lambda: list(rb.generate_batches(num_mini_batch=7))


# ---- agent counts (HARL FP layouts, per-agent keys)
@row("fp-agent-count", "`harl_off_policy_buffer(state_type='FP')`",
     "`rb.extend(td)` with 2 agents after steps of 3 agents", StorageLayoutError,
     r"key \('agents', 'obs'\): stored items have shape \[3, 1\], got \[2, 1\]",
     "per-item shapes (here: the agent count) must not change after the first write", RING)
def _(tmp: Path) -> Built:
    rb = harl_off_policy_buffer(20, 2, batch_size=2, n_step=2, state_type="FP")
    rb.extend(harl_fp_step(3))
    return buffer_state(rb), lambda: rb.extend(harl_fp_step(2))


@row("fp-per-agent-key", "`NStepSampler(agent_group='agents')`",
     "`('next', 'agents', 'x')` of per-step shape `[2]` with 3 agents", ValueError,
     r"\('next', 'agents', 'x'\) has per-step shape \(2,\); entries under \('next', 'agents'\) need the agent dim first \(3 agents\)",
     "store per-agent entries `[num_agents, ...]`", RING)
def _(tmp: Path) -> Built:
    rb = harl_off_policy_buffer(20, 2, batch_size=2, n_step=2, state_type="FP")
    for _ in range(2):
        rb.extend(harl_fp_step(3, extra={"x": torch.zeros(2, 2)}))
    return buffer_state(rb), lambda: rb.sample()


@row("fp-team-done", "`NStepSampler(agent_group='agents')`",
     "team-level `('next', 'agents', 'done')` of shape `[1]` per step", ValueError,
     r"\('next', 'agents', 'done'\) must hold one flag per agent, \[\.\.\., num_agents, 1\]",
     "store one flag per agent, `[num_agents, 1]` (or use `state_type='EP'`)", RING)
def _(tmp: Path) -> Built:
    rb = harl_off_policy_buffer(20, 2, batch_size=2, n_step=2, state_type="FP")
    rb.extend(harl_fp_step(3, flag_shape=(2, 1)))
    return buffer_state(rb), lambda: rb.sample()


@row("gae-agent-rank", "`GAE` estimator", "values `[B, T, 3, 2, 1]` with team reward/done `[B, T, 1]`",
     ValueError, r"reward/done/terminated must have the value's shape \(per-agent\) or one dim fewer",
     "give per-agent signals, or team-level ones with one dim fewer than the value",
     "input TensorDict")
def _(tmp: Path) -> Built:
    td = estimator_input(value_shape=(2, 5, 3, 2, 1))
    return (lambda: freeze(td)), lambda: GAE(gamma=0.9, lmbda=0.9, value_network=None)(td)


@row("gae-reward-feature-dim", "`GAE` estimator", "values `[B, T, 1]` with `('next', 'reward')` of shape `[B, T]`",
     ValueError, r"\('next', 'reward'\) of shape \(2, 5\) fits neither .* it lacks the trailing feature dim: pass it "
     r"with \.unsqueeze\(-1\)", "give the reward its feature dim, `reward.unsqueeze(-1)`", "input TensorDict")
def _(tmp: Path) -> Built:
    td = estimator_input()
    td["next", "reward"] = torch.ones(2, 5)
    return (lambda: freeze(td)), lambda: GAE(gamma=0.9, lmbda=0.9, value_network=None)(td)


@row("tdlambda-next-value-type", "`TDLambda.value_estimate`", "`next_value=1.0`", TypeError,
     r"next_value must be a tensor shaped like the values, got float", "pass a tensor, or None to evaluate them",
     "input TensorDict")
def _(tmp: Path) -> Built:
    td = estimator_input()
    return (lambda: freeze(td)), lambda: TDLambda(gamma=0.9, lmbda=0.7, value_network=None).value_estimate(td, next_value=1.0)


# ---- value functional core, estimators, on-policy buffers, n-step samplers
@row("gae-gamma", "`functional.generalized_advantage_estimate`", "`gamma=1.5`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=1\.5", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(gamma=1.5)))


@row("gae-gamma-nan", "`functional.generalized_advantage_estimate`", "`gamma=nan`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=nan", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(gamma=math.nan)))


@row("gae-gamma-type", "`functional.generalized_advantage_estimate`", "`gamma='0.9'`", TypeError,
     r"gamma must be a real number or a tensor of them, got '0\.9'", "pass a float or a real tensor")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(gamma="0.9")))


@row("gae-gamma-tensor", "`functional.generalized_advantage_estimate`", "`gamma=torch.full((5, 1), 1.5)`",
     ValueError, r"gamma must be a number in \[0, 1\], got values in \[1\.5, 1\.5\]", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(gamma=torch.full((5, 1), 1.5))))


@row("gae-lambda", "`functional.generalized_advantage_estimate`", "`lmbda=-0.1`", ValueError,
     r"lmbda must be a number in \[0, 1\], got lmbda=-0\.1", "use lmbda in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(lmbda=-0.1)))


@row("gae-shape", "`functional.generalized_advantage_estimate`", "`reward` of shape `(4, 1)`, the rest `(5, 1)`",
     ValueError, r"must share one shape \[\*B, T, \*F\]; got state_value=\(5, 1\), next_state_value=\(5, 1\), reward=\(4, 1\)",
     "give every input the same `[*B, T, *F]` shape")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(reward=torch.ones(4, 1))))


@row("gae-done-dtype", "`functional.generalized_advantage_estimate`", "float `done`", TypeError,
     r"done must be a boolean tensor, got dtype=torch\.float32",
     "convert it first, e.g. `done.bool()` or `(done != 0)`")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(done=torch.zeros(5, 1))))


@row("gae-time-dim", "`functional.generalized_advantage_estimate`", "`time_dim=5` for 2-dim inputs",
     ValueError, r"time_dim=5 is out of range for tensors with 2 dims; use a value in \[-2, 1\]",
     "use a time dim in [-2, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.generalized_advantage_estimate(**gae_args(), time_dim=5))


@row("td-lambda", "`functional.td_lambda_return_estimate`", "`lmbda=2.0`", ValueError,
     r"lmbda must be a number in \[0, 1\], got lmbda=2\.0", "use lmbda in [0, 1]")
def _(tmp: Path) -> Built:
    zeros = torch.zeros(5, 1)
    return pure(lambda: F.td_lambda_return_estimate(0.9, 2.0, zeros, zeros, zeros.bool()))


@row("cumsum-gamma", "`functional.discounted_cumsum`", "`gamma=1.01`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=1\.01", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: F.discounted_cumsum(torch.zeros(3, 1), 1.01, torch.zeros(3, 1, dtype=torch.bool)))


@row("vtrace-rho", "`functional.vtrace_advantage_estimate`", "`rho_thresh=0.0`", ValueError,
     r"rho_thresh must be > 0\.0, got rho_thresh=0\.0; e\.g\. 1\.0, the IMPALA default",
     "use a positive clipping threshold (1.0 is the IMPALA default)")
def _(tmp: Path) -> Built:
    return pure(lambda: F.vtrace_advantage_estimate(**vtrace_args(), rho_thresh=0.0))


@row("vtrace-c", "`functional.vtrace_advantage_estimate`", "`c_thresh=-1.0`", ValueError,
     r"c_thresh must be > 0\.0, got c_thresh=-1\.0; e\.g\. 1\.0, the IMPALA default",
     "use a positive clipping threshold (1.0 is the IMPALA default)")
def _(tmp: Path) -> Built:
    return pure(lambda: F.vtrace_advantage_estimate(**vtrace_args(), c_thresh=-1.0))


@row("vtrace-shape", "`functional.vtrace_advantage_estimate`", "`log_pi` of shape `(5,)`, the rest `(5, 1)`",
     ValueError, r"log_pi=\(5,\)", "give every input the same `[*B, T, *F]` shape")
def _(tmp: Path) -> Built:
    return pure(lambda: F.vtrace_advantage_estimate(**vtrace_args(log_pi=torch.zeros(5))))


@row("est-gae-gamma", "`GAE` estimator", "`GAE(gamma=1.5, lmbda=0.9, value_network=None)`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=1\.5", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: GAE(gamma=1.5, lmbda=0.9, value_network=None))


@row("est-gae-lambda", "`GAE` estimator", "`GAE(gamma=0.9, lmbda=1.5, value_network=None)`", ValueError,
     r"lmbda must be a number in \[0, 1\], got lmbda=1\.5", "use lmbda in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: GAE(gamma=0.9, lmbda=1.5, value_network=None))


@row("est-vtrace-rho", "`VTrace` estimator", "`VTrace(..., rho_thresh=-1.0)`", ValueError,
     r"rho_thresh must be > 0\.0, got rho_thresh=-1\.0", "use a positive clipping threshold")
def _(tmp: Path) -> Built:
    return pure(lambda: VTrace(gamma=0.9, value_network=None, actor_network=None, rho_thresh=-1.0))


@row("est-vtrace-action", "`VTrace` estimator", "input without the stored `action`", ValueError,
     r"the batch holds no stored action under 'action'",
     "store the collector's action under the actor's sample key", "input TensorDict")
def _(tmp: Path) -> Built:
    td = estimator_input()
    td["observation"] = torch.zeros(2, 5, 3)
    td["action_log_prob"] = torch.zeros(2, 5, 1)
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
                         in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal)
    est = VTrace(gamma=0.9, value_network=None, actor_network=actor)
    est.set_keys(sample_log_prob="action_log_prob")
    return (lambda: freeze(td)), lambda: est(td)


@row("est-missing-value", "`GAE` estimator", "input without `state_value` and no value network", ValueError,
     r"The tensor with key state_value is missing and no value network was given",
     "pass `value_network=` or write the values first", "input TensorDict")
def _(tmp: Path) -> Built:
    td = estimator_input(with_value=False)
    return (lambda: freeze(td)), lambda: GAE(gamma=0.9, lmbda=0.9, value_network=None)(td)


@row("onpolicy-gamma", "`OnPolicyReplayBuffer`", "`OnPolicyReplayBuffer(3, gamma=1.5)`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=1\.5", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: OnPolicyReplayBuffer(3, gamma=1.5))


@row("onpolicy-update-lambda", "`OnPolicyReplayBuffer.update_storage_parameter`", "`('gae_lambda', 1.5)`",
     ValueError, r"gae_lambda must be a number in \[0, 1\], got gae_lambda=1\.5", "use gae_lambda in [0, 1]",
     "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = on_policy_buffer()
    return on_policy_state(rb), lambda: rb.update_storage_parameter("gae_lambda", 1.5)


@row("onpolicy-unknown-parameter", "`OnPolicyReplayBuffer.update_storage_parameter`", "`('gamma_int', 0.5)`",
     ValueError, r"has no parameter 'gamma_int'; it can update gamma, gae_lambda",
     "use one of the listed names", "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = on_policy_buffer()
    return on_policy_state(rb), lambda: rb.update_storage_parameter("gamma_int", 0.5)


@row("vtrace-buffer-clip", "`VTraceReplayBuffer`", "`VTraceReplayBuffer(3, c_thresh=0)`", ValueError,
     r"c_thresh must be > 0\.0, got c_thresh=0\.0", "use a positive clip value")
def _(tmp: Path) -> Built:
    return pure(lambda: VTraceReplayBuffer(3, c_thresh=0))


@row("onpolicy-env-count", "`OnPolicyReplayBuffer.insert`", "a step of 3 envs after steps of 2", ValueError,
     r"step has batch size \[3\] but the rollout holds \[2\] envs per step",
     "insert steps of the same envs", "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = OnPolicyReplayBuffer(3)
    rb.insert(on_policy_step(2))
    return on_policy_state(rb), lambda: rb.insert(on_policy_step(3))


@row("onpolicy-empty", "`OnPolicyReplayBuffer.compute_returns`", "called before any `insert`", RuntimeError,
     r"the rollout is empty: insert steps before compute_returns\(\)", "insert steps first",
     "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = OnPolicyReplayBuffer(3)
    return on_policy_state(rb), lambda: rb.compute_returns()


@row("onpolicy-critic-shape", "`OnPolicyReplayBuffer.compute_returns`",
     "`value_network` writing `state_value` of shape `[2, 3]` for 2 envs", ValueError,
     r"value_network wrote 'state_value' of shape \[2, 3\]; expected \[2, 1\]",
     "return one value per env, shaped as stored", "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = on_policy_buffer()
    critic = lambda td: td.set("state_value", torch.zeros(*td.shape, 3))  # noqa: E731
    return on_policy_state(rb), lambda: rb.compute_returns(critic)


@row("onpolicy-critic-nan", "`OnPolicyReplayBuffer.compute_returns`", "`value_network` writing NaN values",
     ValueError,
     r"state_value. holds 2 NaN or infinite value\(s\) of 2; value_network wrote them and nothing was stored",
     "fix the critic (its outputs are NaN or infinite)", "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = on_policy_buffer()
    critic = lambda td: td.set("state_value", torch.full((*td.shape, 1), math.nan))  # noqa: E731
    return on_policy_state(rb), lambda: rb.compute_returns(critic)


@row("onpolicy-derived-key", "`OnPolicyReplayBuffer.compute_returns`",
     "steps inserted with a `value_target` entry", ValueError,
     r"'value_target' is written by inserted steps; store derived results under another key",
     "leave the estimator's outputs out of the steps (or set `keys=` to other names)",
     "rollout data, gamma, gae_lambda")
def _(tmp: Path) -> Built:
    rb = OnPolicyReplayBuffer(3)
    for _ in range(3):
        rb.insert(on_policy_step(2).set("value_target", torch.zeros(2, 1)))
    critic = lambda td: td.set("state_value", torch.ones(*td.shape, 1))  # noqa: E731
    return on_policy_state(rb), lambda: rb.compute_returns(critic)


@row("rollout-carry-str", "`RolloutStorage`", "`RolloutStorage(4, carry_keys='hidden')`", TypeError,
     r"carry_keys must be a list of keys, got carry_keys='hidden'; pass \['hidden'\]",
     "pass a list of keys")
def _(tmp: Path) -> Built:
    return pure(lambda: RolloutStorage(4, carry_keys="hidden"))


@row("nstep-gamma", "`NStepSampler`", "`NStepSampler(3, gamma=1.5)`", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=1\.5", "use gamma in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: NStepSampler(3, gamma=1.5))


@row("nstep-n", "`NStepSampler`", "`NStepSampler(0)`", ValueError,
     r"n_step must be an int >= 1, got n_step=0", "use n_step >= 1")
def _(tmp: Path) -> Built:
    return pure(lambda: NStepSampler(0))


@row("pnstep-gamma", "`PrioritizedNStepSampler`", "`sampler.gamma = -0.5` on a sampler in use", ValueError,
     r"gamma must be a number in \[0, 1\], got gamma=-0\.5", "use gamma in [0, 1]",
     "sampler `state_dict()`, n_step, gamma")
def _(tmp: Path) -> Built:
    sampler = PrioritizedNStepSampler(8, 0.6, 0.4, n_step=2, gamma=0.9)
    return ((lambda: freeze({"state": sampler.state_dict(), "n": sampler.n_step, "gamma": sampler.gamma})),
            lambda: setattr(sampler, "gamma", -0.5))


# ---- RolloutStorage
ROLLOUT = "rollout `state_dict()` (data, step)"


@row("rollout-missing-key", "`RolloutStorage.insert`", "a step without `('next', 'reward')`", ValueError,
     r"step keys differ from the rollout's \(missing: \[.\('next', 'reward'\).\], extra: \[\]\)",
     "insert the same entries at every step", ROLLOUT)
def _(tmp: Path) -> Built:
    rollout = rollout_storage()
    step = TensorDict({"obs": torch.zeros(3, 1), "next": {"obs": torch.ones(3, 1)}}, [3])
    return (lambda: freeze(rollout.state_dict())), lambda: rollout.insert(step)


@row("rollout-shape", "`RolloutStorage.insert`", "`('next', 'reward')` of per-env shape `[2]` after `[1]`",
     ValueError, r"key \('next', 'reward'\): the rollout's steps have item shape \[1\], got \[2\]",
     "insert the same per-env shapes at every step", ROLLOUT)
def _(tmp: Path) -> Built:
    rollout = rollout_storage()
    step = TensorDict({"obs": torch.full((3, 1), 7.0), "next": {"obs": torch.ones(3, 1),
                                                              "reward": torch.ones(3, 2)}}, [3])
    return (lambda: freeze(rollout.state_dict())), lambda: rollout.insert(step)


@row("rollout-full", "`RolloutStorage.insert_steps`", "4 steps into a rollout of `num_steps=4` holding 1",
     RuntimeError, r"the rollout holds 1 of num_steps=4 steps and cannot take 4 more; call after_update\(\)",
     "call `after_update()` (or `empty()`) first", ROLLOUT)
def _(tmp: Path) -> Built:
    rollout = rollout_storage()
    batch = TensorDict({"obs": torch.zeros(3, 4, 1), "next": {"obs": torch.ones(3, 4, 1),
                                                            "reward": torch.ones(3, 4, 1)}}, [3, 4])
    return (lambda: freeze(rollout.state_dict())), lambda: rollout.insert_steps(batch)


@row("l2r-lambda", "`l2r_ppo_buffer`", "`l2r_ppo_buffer(1, 1, 10, 2, lam=1.5)`", ValueError,
     r"lam must be a number in \[0, 1\], got lam=1\.5", "use lam in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: l2r_ppo_buffer(1, 1, 10, 2, lam=1.5))


@row("l2r-missing-reward", "`l2r_ppo_buffer.store`", "a step without `('next', 'reward')`", ValueError,
     r"step has no \('next', 'reward'\); store the reward under reward_key",
     "store the reward under `reward_key` and V(s) under `value_key`", "buffer `state_dict()`")
def _(tmp: Path) -> Built:
    rb = l2r_ppo_buffer(1, 1, 10, 2)
    return (lambda: freeze(rb.state_dict())), lambda: rb.store(TensorDict({"state_value": torch.zeros(1)}, []))


@row("l2r-reward-shape", "`l2r_ppo_buffer.store`", "rewards `[n]` with values `[n, 1]`", ValueError,
     r"step\[\('next', 'reward'\)\] has shape \[3\] but step\['state_value'\] has shape \[3, 1\]",
     "store one reward per value, e.g. both `[n, 1]`", "buffer `state_dict()`")
def _(tmp: Path) -> Built:
    rb = l2r_ppo_buffer(1, 1, 10, 2)
    steps = TensorDict({"observation": torch.zeros(3, 1), "state_value": torch.zeros(3, 1),
                        "next": {"reward": torch.ones(3)}}, [3])
    return (lambda: freeze(rb.state_dict())), lambda: rb.store(steps)


@row("intrinsic-mode-set", "`IntrinsicRewardNormalizer`", "`norm.mode = 'forward'` after construction",
     AttributeError, r"mode is fixed when the normalizer is built \(got mode='forward'\)",
     "build a new `IntrinsicRewardNormalizer(gamma, mode='forward')`", "normaliser `state_dict()`, mode")
def _(tmp: Path) -> Built:
    norm = IntrinsicRewardNormalizer(0.99)
    norm(torch.rand(4, 2, generator=torch.Generator().manual_seed(0)))

    def set_mode() -> None:
        norm.mode = "forward"
    return (lambda: freeze({"state": norm.state_dict(), "mode": norm.mode})), set_mode


@row("value-norm-shape", "`ValueNorm.update`", "`ValueNorm(3).update(torch.zeros(5, 2))`", ValueError,
     r".x. has shape \(5, 2\) but its trailing shape must equal \(3,\)",
     "reshape `x` or build the normaliser with a matching shape", "normaliser `state_dict()`")
def _(tmp: Path) -> Built:
    norm = ValueNorm(3)
    norm.update(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    return (lambda: freeze(norm.state_dict())), lambda: norm.update(torch.zeros(5, 2))


@row("value-norm-nan", "`ValueNorm.update`", "a batch holding one NaN", ValueError,
     r".x. holds 1 NaN or infinite value\(s\) of 6; the running statistics were left unchanged",
     "drop them first, e.g. `x[torch.isfinite(x)]`", "normaliser `state_dict()`")
def _(tmp: Path) -> Built:
    norm = ValueNorm(3)
    norm.update(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    bad = torch.zeros(2, 3)
    bad[1, 2] = math.nan
    return (lambda: freeze(norm.state_dict())), lambda: norm.update(bad)


@row("value-norm-overflow", "`ValueNorm.update`", "`ValueNorm(1, dtype=torch.float16).update(x)`, x near 300",
     ValueError, r".x. \(largest .x. = 310\) has a mean square that overflows the state dtype torch\.float16; "
     r"the running statistics were left unchanged",
     "build it with a wider dtype, or scale the values down", "normaliser `state_dict()`")
def _(tmp: Path) -> Built:
    norm = ValueNorm(1, dtype=torch.float16)
    norm.update(torch.tensor([[1.0], [3.0]]))
    return (lambda: freeze(norm.state_dict())), lambda: norm.update(torch.tensor([[300.0], [310.0]]))


@row("l2r-last-val", "`l2r_ppo_buffer.finish_path`", "`finish_path(float('nan'))`", ValueError,
     r"last_val. holds 1 NaN or infinite value\(s\) of 1; the path is still open",
     "pass 0 at a terminal state, else a finite V(s_T)",
     "len, storage, open path")
def _(tmp: Path) -> Built:
    rb = l2r_ppo_buffer(1, 1, 10, 2)
    rb.store(TensorDict({"observation": torch.zeros(1), "state_value": torch.ones(1),
                         "next": {"reward": torch.ones(1)}}, []))
    return (lambda: freeze({"len": len(rb), "storage": rb.storage.state_dict(), "path": rb._path_length,
                            "finished": rb._finished})), lambda: rb.finish_path(math.nan)


@row("demo-track-layout", "`DemoStore.track`", "an observation of shape `(5,)` for an episode of `(2,)`",
     ValueError, r"observation. of env 0 has shape \(5,\) and dtype torch\.float32, but its running "
     r"episode has \(2,\)", "pass the same layout every step, or `discard_running(env)`", "store state")
def _(tmp: Path) -> Built:
    store = DemoStore()
    store.track(0, torch.zeros(2), torch.zeros(1), torch.tensor(1.0), torch.tensor(0.5), torch.tensor(False))
    return (lambda: freeze(store.state_dict())), lambda: store.track(
        0, torch.zeros(5), torch.zeros(1), torch.tensor(1.0), torch.tensor(0.5), torch.tensor(True))


@row("demo-alpha", "`DemoStore`", "`DemoStore(alpha=0.0)`", ValueError,
     r"alpha must be > 0\.0, got alpha=0\.0; the default is 10", "use a positive alpha (10 by default)")
def _(tmp: Path) -> Built:
    return pure(lambda: DemoStore(alpha=0.0))


@row("demo-rho-type", "`DemoStore`", "`DemoStore(rho='0.1')`", TypeError,
     r"rho must be a real number, got '0\.1'", "pass a float in [0, 1]")
def _(tmp: Path) -> Built:
    return pure(lambda: DemoStore(rho="0.1"))


@row("dedup-stack-shift", "`DedupEnvRingStorage`", "a `('next', obs)` stack that is not `obs` shifted by one frame",
     ValueError, r"\('next', 'pixels'\) is not 'pixels' shifted by one frame along stack_dim=0",
     "write stacks that slide one frame per step, or use `EnvRingStorage`", "len, storage, writer")
def _(tmp: Path) -> Built:
    rb = EnvRingReplayBuffer(storage=DedupEnvRingStorage(1, 4, obs_key="pixels", num_stack=2))
    rb.extend(TensorDict({"pixels": torch.zeros(1, 2, 3), "next": {"pixels": torch.zeros(1, 2, 3),
                                                                  "done": torch.tensor([False])}}, [1]))
    bad = TensorDict({"pixels": torch.zeros(1, 2, 3), "next": {"pixels": torch.ones(1, 2, 3),
                                                               "done": torch.tensor([False])}}, [1])
    return buffer_state(rb), lambda: rb.extend(bad)


# ---- configs
@row("config-unknown-key", "`instantiate_from_config`", "`({'gama': 0.9}, name='ext_l2r_ppo')`", ValueError,
     r"L2RPPOBufferConfig: bad entry 'gama': Key 'gama' not in 'L2RPPOBufferConfig'\. Valid keys: act_dim",
     "use one of the valid keys listed (here `gamma`)")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config({"gama": 0.9}, name="ext_l2r_ppo"))


@row("config-bad-value", "`instantiate_from_config`", "`({'size': 'big'}, name='ext_l2r_ppo')`", ValueError,
     r"L2RPPOBufferConfig: bad entry 'size': .*Valid keys", "give `size` an int")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config({"size": "big"}, name="ext_l2r_ppo"))


@row("config-missing-required", "`instantiate_from_config`", "`({'obs_dim': 3, 'act_dim': 2}, name='ext_l2r_ppo')`",
     ValueError, r"L2RPPOBufferConfig: missing required 'size', 'batch_size'\. Valid keys: ",
     "give every required key (l2r's schema requires them)")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config({"obs_dim": 3, "act_dim": 2}, name="ext_l2r_ppo"))


@row("config-unknown-name", "`instantiate_from_config`", "`({}, name='ext_nope')`", ValueError,
     r"config name 'ext_nope' is not a registered config; known: ", "use one of the known names listed")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config({}, name="ext_nope"))


@row("config-target", "`instantiate_from_config`", "`({'_target_': 'os.system'}, name='ext_l2r_ppo')`",
     ValueError, r"'_target_' is fixed by L2RPPOBufferConfig; remove it from the config",
     "remove `_target_` from the config")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config({"_target_": "os.system"}, name="ext_l2r_ppo"))


@row("config-missing-file", "`instantiate_from_config`", "a YAML path that does not exist", ValueError,
     r"config file .*missing\.yaml' does not exist", "pass a YAML file path or a dict")
def _(tmp: Path) -> Built:
    return pure(lambda: instantiate_from_config(tmp / "missing.yaml"))


# ============================================================================ table
HEADER = ["id", "component", "bad input", "exception", "message (regex)", "suggested fix", "state checked"]


def render_table(rows_: list[Row] = ROWS) -> str:
    """The markdown table of ``rows_``."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows_]
    return "\n".join(lines)


def doc_table(text: str) -> str:
    """The generated part of ``docs/errors.md``."""
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:stop].strip()


def write_doc() -> None:
    """Replaces the table in ``docs/errors.md`` by :func:`render_table`."""
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + render_table() + "\n" + text[stop:])


# ============================================================================ tests
def test_rows_are_well_formed():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)) and len(ids) >= 45
    for r in ROWS:
        for cell in r.cells():
            assert "|" not in cell and "\n" not in cell, (r.id, cell)
        assert "`" not in r.match, r.id
        re.compile(r.match)


def test_doc_table_matches_rows():
    assert doc_table(DOC.read_text()) == render_table(), (
        "docs/errors.md is out of date: run `.venv/bin/python tests/test_errors.py`")


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_raises_and_changes_nothing(r: Row, tmp_path: Path) -> None:
    snapshot, call = r.build(tmp_path)
    assert (snapshot is None) == (r.state == "-"), "the state column must say what is checked"
    before = None if snapshot is None else snapshot()
    with pytest.raises(r.error, match=r.match) as info:
        call()
    assert type(info.value) is r.error  # exactly the documented type, not a subclass
    if snapshot is not None:
        assert_same(before, snapshot())


if __name__ == "__main__":
    write_doc()
    print(f"wrote {len(ROWS)} rows to {DOC}", file=sys.stderr)
