"""Demo files: pytorchrl's ``.npz`` demo format, and episodes of Minari datasets.

A demo file holds ``Observation`` (``[L, ...]``, the observation at which ``Action[k]`` was
taken), ``Action`` (``[L, ...]``), ``Reward`` (``[L]`` or ``[L, 1]``) and ``FrameSkip`` (an
int). Files are written atomically (temporary file, fsync, rename), so an interrupted save
leaves the previous file intact.

Differences from pytorchrl:
    * Loading errors are raised as ``ValueError`` naming the file, the key and the fix
      (pytorchrl catches every exception and only prints "Failed to load").
    * :func:`save_top_demos` removes ``reward_demo_{rank}.npz`` files of a previous save whose
      rank is now beyond the saved ones (pytorchrl leaves them, and reloads them later).
    * Arrays keep their dtypes (pytorchrl casts to float32 on save).
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from torchrl_ext._checks import check_int
from torchrl_ext.demos._demo import DEMO_KEYS, demo_tensors
from torchrl_ext.io.state_files import atomic_write

if TYPE_CHECKING:
    from torchrl_ext.demos.store import DemoStore

__all__ = ["save_demo", "load_demo", "load_demo_dir", "save_top_demos", "load_minari_demos", "DemoDirPoller"]

FILE_KEYS = ("Observation", "Action", "Reward", "FrameSkip")
_RANKED = re.compile(r"reward_demo_(\d+)\.npz")


def _check_frame_skip(frame_skip: Any) -> int:
    if isinstance(frame_skip, np.integer):  # as read from a demo file
        frame_skip = int(frame_skip)
    return check_int("frame_skip", frame_skip, minimum=0)  # 0: pytorchrl's default, no skip


def save_demo(path: str | Path, demo: Any, frame_skip: int) -> Path:
    """Writes ``demo`` (observation/action/reward) as a pytorchrl demo ``.npz`` file.

    Args:
        path: Target file; written as given (use a ``.npz`` suffix for :func:`load_demo_dir`).
        demo: Dict or TensorDict with ``observation``, ``action`` and ``reward``.
        frame_skip: Frame skip of the env the demo was recorded in.

    Returns:
        The path written.

    Examples:
        >>> import tempfile, torch
        >>> path = Path(tempfile.mkdtemp()) / "demo.npz"
        >>> _ = save_demo(path, {"observation": torch.zeros(3, 2), "action": torch.ones(3),
        ...                      "reward": torch.tensor([0.0, 0.0, 1.0])}, frame_skip=4)
        >>> demo = load_demo(path, frame_skip=4)
        >>> demo["reward"].flatten(), demo["frame_skip"]
        (tensor([0., 0., 1.]), 4)
    """
    path = Path(path).absolute()
    obs, act, rew = demo_tensors(demo, where=f"demo for {path}", device="cpu")
    arrays = dict(zip(FILE_KEYS, (obs.numpy(), act.numpy(), rew.numpy(),
                                  np.array(_check_frame_skip(frame_skip)))))
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:  # a handle: np.savez would append ".npz" to a name
            np.savez(handle, **arrays)

    atomic_write(path, write)
    return path


def load_demo(path: str | Path, frame_skip: int | None = None) -> dict[str, Any]:
    """Reads a demo ``.npz`` file into ``{"observation", "action", "reward", "frame_skip"}``.

    The reward comes back as ``[L, 1]``; the other arrays keep their shapes and dtypes.

    Args:
        path: The ``.npz`` file.
        frame_skip: If given, the file's ``FrameSkip`` must equal it.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The file is not an npz archive, misses a key, has arrays of different
            lengths, or its ``FrameSkip`` differs from ``frame_skip``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demo file {path} does not exist.")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(
            f"{path} is not a readable .npz demo file ({exc}); write demos with save_demo()."
        ) from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds a single array, not an .npz archive with keys {FILE_KEYS}.")
    with data:
        missing = [key for key in FILE_KEYS if key not in data.files]
        if missing:
            raise ValueError(
                f"{path} has no key(s) {missing} (found {sorted(data.files)}); a demo file needs "
                f"{list(FILE_KEYS)}, e.g. written by torchrl_ext.demos.save_demo()."
            )
        arrays = {key: data[key] for key in FILE_KEYS}
    file_skip = arrays["FrameSkip"]
    if file_skip.size != 1 or not np.issubdtype(file_skip.dtype, np.number) or (
        float(file_skip.reshape(())) != int(file_skip.reshape(()))
    ):
        raise ValueError(
            f"{path}: key 'FrameSkip' must be one integer, got {file_skip!r}; re-save the demo "
            "with save_demo(path, demo, frame_skip=<int>)."
        )
    file_skip = int(file_skip.reshape(()))
    if frame_skip is not None and file_skip != _check_frame_skip(frame_skip):
        raise ValueError(
            f"{path}: key 'FrameSkip' is {file_skip} but frame_skip={frame_skip} was requested; "
            "use demos recorded with the env's frame skip, or pass frame_skip=None."
        )
    lengths = {key: arrays[key].shape[0] if arrays[key].ndim else None for key in FILE_KEYS[:3]}
    reward = arrays["Reward"]
    if len(set(lengths.values())) != 1 or None in lengths.values() or lengths["Action"] == 0 or (
        reward.size != reward.shape[0]
    ):
        raise ValueError(
            f"{path}: keys 'Observation', 'Action' and 'Reward' must have the same number of "
            f"rows L >= 1 (Reward [L] or [L, 1]), got shapes "
            f"{ {key: arrays[key].shape for key in FILE_KEYS[:3]} }; re-record the demo with one "
            "row per step."
        )
    demo = {name: arrays[key] for name, key in zip(DEMO_KEYS, FILE_KEYS)}  # FrameSkip left out
    tensors = demo_tensors(demo, where=str(path), device="cpu")
    return {**dict(zip(DEMO_KEYS, tensors)), "frame_skip": file_skip}


def load_demo_dir(directory: str | Path, frame_skip: int | None = None) -> list[dict[str, Any]]:
    """Loads every ``*.npz`` file of ``directory`` in sorted name order (see :func:`load_demo`).

    Raises:
        FileNotFoundError: ``directory`` is not a directory.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"demo directory {directory} does not exist.")
    return [load_demo(path, frame_skip) for path in sorted(directory.glob("*.npz"))]


class DemoDirPoller:
    """Feeds the new ``*.npz`` files of a folder to a store as supplementary demos, each once.

    pytorchrl's PPO+D watches a supplementary-demo folder during training (demos recorded by
    a human, or by another run, while this one learns). Call :meth:`poll` between updates:
    it loads the files that appeared since the last call, in name order, and hands them to
    :meth:`DemoStore.add_supplementary_demos` (which keeps those reaching the store's reward
    threshold). Files written by :func:`save_demo` appear atomically, so a poll never reads
    a half-written file. The folder may not exist yet; it is polled again next time.

    Args:
        store: the :class:`~torchrl_ext.demos.DemoStore` to feed.
        directory: the watched folder.
        frame_skip: if given, every file's ``FrameSkip`` must equal it.

    Examples:
        >>> import tempfile, torch
        >>> from torchrl_ext.demos import DemoDirPoller, DemoStore, save_demo
        >>> folder = tempfile.mkdtemp()
        >>> store = DemoStore(rho=0.1, phi=0.0, initial_reward_threshold=0.5)
        >>> poller = DemoDirPoller(store, folder, frame_skip=1)
        >>> poller.poll()
        []
        >>> demo = {"observation": torch.zeros(3, 2), "action": torch.zeros(3, 1),
        ...         "reward": torch.tensor([0.0, 0.0, 1.0])}
        >>> _ = save_demo(f"{folder}/human_0.npz", demo, frame_skip=1)
        >>> len(poller.poll()), len(store.reward_demos), poller.poll()
        (1, 1, [])
    """

    def __init__(self, store: DemoStore, directory: str | Path, frame_skip: int | None = None) -> None:
        self.store, self.directory = store, Path(directory)
        self.frame_skip = None if frame_skip is None else _check_frame_skip(frame_skip)
        self.seen: set[str] = set()

    def poll(self) -> list[str]:
        """Loads the files not seen before; returns the ids of the demos the store kept."""
        if not self.directory.is_dir():
            return []
        new = [path for path in sorted(self.directory.glob("*.npz")) if path.name not in self.seen]
        demos = [load_demo(path, self.frame_skip) for path in new]  # a bad file raises before any is added
        self.seen.update(path.name for path in new)
        return self.store.add_supplementary_demos(demos) if demos else []


def save_top_demos(store: DemoStore, directory: str | Path, frame_skip: int) -> list[Path]:
    """Saves the best ``store.num_demos_to_save`` agent reward demos as ``reward_demo_{rank}.npz``.

    Non-human reward demos are ranked by total reward, highest first (among ties the newest
    first, as pytorchrl's reversed ``argsort``), from rank 1. Files ``reward_demo_{k}.npz``
    with ``k`` beyond the saved ranks, left by an earlier save, are removed. Value demos are
    never saved.

    Returns:
        The files written, by rank.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    agent = [demo for demo in store.reward_demos if not demo["human"]]
    ranked = sorted(reversed(agent), key=lambda demo: -demo["total_reward"])[: store.num_demos_to_save]
    written = [
        save_demo(directory / f"reward_demo_{rank}.npz", demo, frame_skip)
        for rank, demo in enumerate(ranked, start=1)
    ]
    for path in directory.glob("reward_demo_*.npz"):
        match = _RANKED.fullmatch(path.name)
        if match and int(match.group(1)) > len(ranked):
            path.unlink()
    return written


def load_minari_demos(
    dataset_id_or_dataset: Any,
    *,
    episode_indices: Iterable[int] | None = None,
    max_episodes: int | None = None,
    download: bool = False,
) -> list[dict[str, Any]]:
    """Converts Minari episodes into demos ``{"observation", "action", "reward", "id"}``.

    Minari stores ``L + 1`` observations per episode (the last one follows the final action);
    the demo keeps the ``L`` at which an action was taken. ``minari`` is only imported when a
    dataset id is given.

    Args:
        dataset_id_or_dataset: A Minari dataset id, or any object with ``iterate_episodes()``
            yielding episodes with ``observations``, ``actions`` and ``rewards`` arrays.
        episode_indices: Episodes to convert (default: all).
        max_episodes: Stop after this many episodes.
        download: Passed to ``minari.load_dataset`` for a dataset id.

    Raises:
        ImportError: A dataset id is given and minari is not installed.
        ValueError: An episode's arrays have inconsistent lengths or dict observations.
    """
    dataset = dataset_id_or_dataset
    if isinstance(dataset, str):
        try:
            import minari
        except ImportError as exc:
            raise ImportError(
                "load_minari_demos() needs the optional package minari to load a dataset id: "
                "pip install minari"
            ) from exc
        dataset = minari.load_dataset(dataset, download=download)
    selection = {} if episode_indices is None else {"episode_indices": list(episode_indices)}
    demos = []
    for k, episode in enumerate(dataset.iterate_episodes(**selection)):
        if max_episodes is not None and k >= max_episodes:
            break
        episode_id = getattr(episode, "id", k)
        name = f"minari episode {episode_id}"
        obs, act = episode.observations, np.asarray(episode.actions)
        if isinstance(obs, dict):
            raise ValueError(
                f"{name} has dict observations (keys {sorted(obs)}); flatten them first, "
                "e.g. with gymnasium.spaces.flatten, then build the demos yourself."
            )
        obs = np.asarray(obs)
        if obs.ndim and act.ndim and obs.shape[0] == act.shape[0] + 1:
            obs = obs[:-1]
        demo = {"observation": obs, "action": act, "reward": np.asarray(episode.rewards)}
        tensors = demo_tensors(demo, where=name, device="cpu")
        demos.append({**dict(zip(DEMO_KEYS, tensors)), "id": f"minari-{episode_id}"})
    return demos
