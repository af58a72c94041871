"""One checkpoint as a ``<prefix>metadata.json`` + ``<prefix>state.safetensors`` pair of files.

A save never leaves the previous checkpoint unloadable: both files are first written and
fsynced as hidden ``.<name>.tmp`` files, then renamed over the old ones, state first (with a
folder fsync after each step). The state's safetensors header records the SHA-256 of its
metadata text and of its own tensors, so a loader can tell whether the pair matches: after a
save killed between the two renames it rolls forward to the complete pending metadata (the
next save also finishes that commit); any other mismatch raises a ``ValueError`` naming both
files. Files without the checksum (e.g. velora's) load unverified. Two processes saving to the
same folder and prefix at once are not supported.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from torchrl_ext.io.state_files import (
    METADATA_DIGEST_KEY,
    TENSORS_DIGEST_KEY,
    fsync_dir,
    fsync_file,
    read_safetensors,
    sha256,
    tensors_digest,
    verify_tensors,
)

__all__ = ["CheckpointPair", "check_prefix", "read_pair", "write_pair"]


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a plain file-name prefix, else a ``ValueError`` naming the fix."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str such as 'buffer_', got prefix={prefix!r}.")
    separators = {"/", os.sep, os.altsep} - {None}
    if any(sep in prefix for sep in separators) or "\0" in prefix or prefix in (".", ".."):
        raise ValueError(
            f"prefix={prefix!r} contains a path separator: the prefix only starts the file "
            f"names (e.g. 'run.v1_' -> run.v1_metadata.json); put folders in the path "
            f"argument instead, e.g. save('ckpt/run1', prefix='buffer_')."
        )
    return prefix


@dataclass(frozen=True)
class CheckpointPair:
    """The file names of one checkpoint: ``directory/<prefix>{metadata.json,state.safetensors}``.

    Examples:
        >>> CheckpointPair("ckpt", "run.v1_").metadata.name
        'run.v1_metadata.json'
        >>> CheckpointPair("ckpt", "run.v1_").pending_state.name
        '.run.v1_state.safetensors.tmp'
    """

    directory: Path
    prefix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        check_prefix(self.prefix)

    @property
    def metadata(self) -> Path:
        return self.directory / f"{self.prefix}metadata.json"

    @property
    def state(self) -> Path:
        return self.directory / f"{self.prefix}state.safetensors"

    @property
    def pending_metadata(self) -> Path:
        return self.directory / f".{self.metadata.name}.tmp"

    @property
    def pending_state(self) -> Path:
        return self.directory / f".{self.state.name}.tmp"


def write_pair(pair: CheckpointPair, tensors: dict[str, torch.Tensor], metadata_text: str) -> None:
    """Replaces ``pair`` with ``tensors`` + ``metadata_text``; see the module docstring.

    Examples:
        >>> import tempfile, torch
        >>> pair = CheckpointPair(tempfile.mkdtemp(), "demo_")
        >>> write_pair(pair, {"x": torch.arange(3.0)}, '{"n": 3}')
        >>> meta, tensors, verified = read_pair(pair)
        >>> meta, tensors["x"].tolist(), verified
        ({'n': 3}, [0.0, 1.0, 2.0], True)
    """
    pair.directory.mkdir(parents=True, exist_ok=True)
    _finish_pending_commit(pair)
    body = metadata_text.encode("utf-8")
    try:
        digests = {METADATA_DIGEST_KEY: sha256(body), TENSORS_DIGEST_KEY: tensors_digest(tensors)}
        save_file(tensors, pair.pending_state, metadata=digests)
        pair.pending_metadata.write_bytes(body)
        fsync_file(pair.pending_state)
        fsync_file(pair.pending_metadata)
        fsync_dir(pair.directory)
    except BaseException:
        pair.pending_state.unlink(missing_ok=True)
        pair.pending_metadata.unlink(missing_ok=True)
        raise
    for pending, target in ((pair.pending_state, pair.state), (pair.pending_metadata, pair.metadata)):
        os.replace(pending, target)
        fsync_dir(pair.directory)


def read_pair(
    pair: CheckpointPair, *, load_tensors: bool = True
) -> tuple[dict[str, Any], dict[str, torch.Tensor], bool]:
    """``(metadata, tensors, verified)`` of a checkpoint written by :func:`write_pair` or others.

    ``verified`` is ``False`` for files without the metadata checksum (e.g.
    velora's). An interrupted save is rolled forward in memory (files are not
    touched). ``load_tensors=False`` returns an empty tensor dict.

    Raises:
        FileNotFoundError: a file is missing (the message lists the prefixes
            found in the folder).
        ValueError: unreadable files, or a metadata file that belongs to
            another save.
    """
    if not pair.state.is_file():
        raise FileNotFoundError(_missing_message(pair, pair.state))
    header, tensors = read_safetensors(pair.state, load_tensors=load_tensors)
    if load_tensors:
        verify_tensors(pair.state, header, tensors)
    digest = header.get(METADATA_DIGEST_KEY)
    body = pair.metadata.read_bytes() if pair.metadata.is_file() else None
    if digest is not None and (body is None or sha256(body) != digest):
        pending = pair.pending_metadata.read_bytes() if pair.pending_metadata.is_file() else None
        if pending is not None and sha256(pending) == digest:
            body = pending  # killed between the two renames: the new checkpoint is complete
        elif body is not None:
            raise ValueError(
                f"{pair.metadata} does not belong to {pair.state} (the state records another "
                f"metadata checksum): the two files come from different saves. Restore both "
                f"from the same save, or save again."
            )
    if body is None:
        raise FileNotFoundError(_missing_message(pair, pair.metadata))
    try:
        metadata = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{pair.metadata} is not valid JSON ({err}); restore it from a backup.") from err
    if not isinstance(metadata, dict):
        raise ValueError(f"{pair.metadata} must hold a JSON object, got {type(metadata).__name__}.")
    return metadata, tensors, digest is not None


def _finish_pending_commit(pair: CheckpointPair) -> None:
    """Completes a save killed between its two renames, so its recovery file is not lost."""
    if not (pair.state.is_file() and pair.pending_metadata.is_file()):
        return
    try:
        digest = read_safetensors(pair.state, load_tensors=False)[0].get(METADATA_DIGEST_KEY)
    except ValueError:
        return
    current = pair.metadata.read_bytes() if pair.metadata.is_file() else None
    if digest is None or (current is not None and sha256(current) == digest):
        return
    if sha256(pair.pending_metadata.read_bytes()) == digest:
        os.replace(pair.pending_metadata, pair.metadata)
        fsync_dir(pair.directory)


def _missing_message(pair: CheckpointPair, missing: Path) -> str:
    found = sorted(p.name[: -len("metadata.json")] for p in pair.directory.glob("*metadata.json"))
    hint = f" Prefixes found there: {found}." if found else ""
    return (
        f"checkpoint file {missing} not found (prefix={pair.prefix!r}).{hint} Pass the folder "
        f"given to save and the same prefix."
    )
