"""Whole-folder atomic saves: a multi-file checkpoint is replaced all at once or not at all.

``rb.dumps(path)`` writes several files (storage, sampler, writer, RNG,
metadata, ...). Replacing them one by one in place would let a crash leave a
mix of two saves. :func:`atomic_save_dir` instead writes the new checkpoint
into a hidden sibling folder and swaps folders with renames; the buffers of
:mod:`torchrl_ext.replay_buffers` save and load through it.

For a checkpoint folder ``ckpt/buffer``, a save (1) recovers any interrupted save (below)
and deletes a leftover ``ckpt/.buffer.new``, (2) writes the new checkpoint into
``.buffer.new`` and fsyncs its files, then writes and fsyncs the marker file ``.complete``,
(3) moves the committed checkpoint aside, ``buffer`` -> ``.buffer.old``, (4) renames
``.buffer.new`` -> ``buffer`` and (5) deletes ``.buffer.old``; the parent folder is fsynced
after each rename.

Recovery rule (:func:`committed_dir`, used by every load): if ``buffer``
exists it is the checkpoint (a crash before step 3 left the old one, after
step 4 the new one). Otherwise a crash fell between steps 3 and 4: the new
checkpoint is complete, so ``.buffer.new`` is loaded (roll forward), or
``.buffer.old`` if ``.buffer.new`` has no ``.complete`` marker. Loads never
rename or delete anything; the next save finishes the rename. So a load after
a crash at any point gives exactly the old or exactly the new checkpoint.
Two processes saving to the same folder at once are not supported.

The ``.complete`` marker is also the checkpoint's manifest (the size and SHA-256 of every
file), which every buffer load checks with :func:`verify_checkpoint` before anything in
memory changes; folders saved before manifests existed (an empty marker) load unverified.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from torchrl_ext.io.state_files import fsync_dir, fsync_file

__all__ = ["atomic_save_dir", "committed_dir", "verify_checkpoint", "COMPLETE_MARKER"]

COMPLETE_MARKER = ".complete"


def _siblings(path: Path) -> tuple[Path, Path]:
    return path.with_name(f".{path.name}.new"), path.with_name(f".{path.name}.old")


def committed_dir(path: str | Path) -> Path:
    """The folder holding the last committed checkpoint saved at ``path`` (see the recovery rule).

    Raises:
        FileNotFoundError: nothing was ever committed at ``path``.
    """
    path = Path(path).absolute()
    if path.is_dir():
        return path
    new, old = _siblings(path)
    if (new / COMPLETE_MARKER).is_file():
        return new
    if old.is_dir():
        return old
    raise FileNotFoundError(
        f"no checkpoint at {path} (nor an interrupted save of one in {new.name} / {old.name}); "
        f"pass the folder given to dumps(path)."
    )


def atomic_save_dir(path: str | Path, write: Callable[[Path], None]) -> None:
    """Calls ``write(folder)`` on a fresh hidden folder, then swaps it in as ``path`` atomically.

    Examples:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> atomic_save_dir(root / "ckpt", lambda d: (d / "a.txt").write_text("1"))
        >>> atomic_save_dir(root / "ckpt", lambda d: (d / "a.txt").write_text("2"))
        >>> (committed_dir(root / "ckpt") / "a.txt").read_text(), sorted(p.name for p in root.iterdir())
        ('2', ['ckpt'])
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; dumps(path) needs a folder path (it creates it).")
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    new, old = _siblings(path)
    _recover(path)
    shutil.rmtree(new, ignore_errors=True)  # an incomplete earlier save
    new.mkdir()
    try:
        write(new)
        _fsync_tree(new)
        manifest = {name: {"bytes": file.stat().st_size, "sha256": _file_sha256(file)}
                    for name, file in sorted(_files(new).items())}
        marker = new / COMPLETE_MARKER
        marker.write_bytes(json.dumps({"files": manifest}, indent=1, sort_keys=True).encode())
        fsync_file(marker)
        fsync_dir(new)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    if path.is_dir():
        os.replace(path, old)
        fsync_dir(parent)
    os.replace(new, path)
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


def _recover(path: Path) -> None:
    """Finishes a swap that was interrupted between its two renames, and drops stale siblings."""
    if not path.is_dir():
        try:
            source = committed_dir(path)
        except FileNotFoundError:
            return
        os.replace(source, path)
        fsync_dir(path.parent)
    shutil.rmtree(_siblings(path)[1], ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for root, dirs, files in os.walk(folder):
        for name in files:
            fsync_file(os.path.join(root, name))
        for name in dirs:
            fsync_dir(Path(root) / name)


def verify_checkpoint(folder: str | Path) -> None:
    """Checks every file of a checkpoint folder against the manifest in its ``.complete`` marker.

    Raises:
        ValueError: a file is missing, not in the manifest, of another size or with other
            bytes (the message names it), or the manifest itself is damaged.
    """
    folder = Path(folder)
    marker = folder / COMPLETE_MARKER
    text = marker.read_bytes() if marker.is_file() else b""
    if not text:
        return  # saved before manifests, or by TorchRL's own dumps: nothing to check against
    try:
        recorded = json.loads(text.decode("utf-8"))["files"]
        if not isinstance(recorded, dict):
            raise TypeError("files must map names to entries")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{marker} (the checkpoint's manifest) is damaged ({err!r}); save again.") from err
    present = _files(folder)
    missing, added = sorted(recorded.keys() - present.keys()), sorted(present.keys() - recorded.keys())
    if missing:
        raise ValueError(f"{folder / missing[0]} is missing from the checkpoint (its manifest lists it); "
                         "restore the whole folder from the same save.")
    if added:
        raise ValueError(f"{folder / added[0]} is not part of the checkpoint saved in {folder} (its "
                         "manifest does not list it); remove it or restore the folder from the save.")
    for name in sorted(recorded):
        entry, path = recorded[name], present[name]
        if not isinstance(entry, dict) or entry.get("bytes") != path.stat().st_size:
            raise ValueError(f"{path} has {path.stat().st_size} bytes, its manifest records "
                             f"{entry.get('bytes') if isinstance(entry, dict) else entry!r}: the file is "
                             "truncated or damaged. Restore the folder from the same save.")
        if entry.get("sha256") != _file_sha256(path):
            raise ValueError(f"{path} does not match the SHA-256 its manifest records: the file is "
                             "damaged. Restore the folder from the same save.")


def _files(folder: Path) -> dict[str, Path]:
    """Every file under ``folder`` but the marker, by path relative to ``folder`` (``/``-separated)."""
    paths = (Path(root) / name for root, _, names in os.walk(folder) for name in names)
    return {path.relative_to(folder).as_posix(): path for path in paths if path != folder / COMPLETE_MARKER}


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
