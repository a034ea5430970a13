"""Atomic, checksummed checkpoint files that load with ``torch.load(weights_only=True)``.

A checkpoint file is ``torch.save`` of ``{"format", "format_version", "sha256", "content"}``
where ``content`` holds only dicts with str keys, lists, tuples, str, non-empty bytes, int, float,
bool, None and tensors, and ``sha256`` is :func:`content_digest` of it. Files are written to a temporary file
in the target directory, fsynced and renamed over the target (then the directory is fsynced),
so a reader sees the old file or the new one, never a torn one. A truncated, altered or
malformed file (any key or type of the record other than expected) is refused with
:class:`CheckpointFileError`; a missing file is a ``FileNotFoundError``, never a silent fresh
start. The checksum detects accidental damage only: anyone can recompute it, so it is no
protection against tampering (loading runs no code either way: ``weights_only=True``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHECKPOINT_FILENAME = "rl_data_state.pt"
FILE_FORMAT = "rl_data.checkpoint"
FILE_FORMAT_VERSION = 1
#: The keys of a checkpoint file's record and their types.
_RECORD_TYPES = {"format": str, "format_version": int, "sha256": str, "content": dict}


class CheckpointFileError(ValueError):
    """A checkpoint file exists but is truncated, altered or not an rl_data checkpoint."""


def checkpoint_path(directory: str | os.PathLike) -> Path:
    """The checkpoint file inside a checkpoint directory."""
    return Path(directory) / CHECKPOINT_FILENAME


class _ByteCounter:
    """A write-only file that counts the bytes written to it."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        written = memoryview(data).nbytes
        self.size += written
        return written


def pickled_size(content: Any) -> int:
    """The bytes of ``content`` pickled (about what a checkpoint of it weighs), without keeping them."""
    counter = _ByteCounter()
    pickle.Pickler(counter, protocol=pickle.HIGHEST_PROTOCOL).dump(content)
    return counter.size


def content_digest(content: Any) -> str:
    """sha256 hex over a canonical byte stream of ``content`` (types and values)."""
    import torch  # here, not at module level: the coordinator process starts without torch

    digest = hashlib.sha256()
    _feed(digest, content, "content", torch)
    return digest.hexdigest()


def save_checkpoint_file(path: str | os.PathLike, content: Mapping[str, Any]) -> Path:
    """Atomically write ``content`` with its checksum to ``path``; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": FILE_FORMAT,
        "format_version": FILE_FORMAT_VERSION,
        "sha256": content_digest(content),
        "content": dict(content),
    }
    import torch

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)
    return path


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read and verify a file written by :func:`save_checkpoint_file`; return its content."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no rl_data checkpoint file at {path}: expected the file written by "
            "save_checkpoint; pass the directory of an existing checkpoint, or do not load a "
            "checkpoint to start from the beginning of the data"
        )
    size = path.stat().st_size
    import torch

    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointFileError(
            f"checkpoint file {path} ({size} bytes) cannot be read, it is truncated or "
            f"corrupt ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            "restore from another checkpoint"
        ) from error
    return _verified_content(path, record)


def _verified_content(path: Path, record: Any) -> dict[str, Any]:
    """The content of a loaded record, after checking its structure and its checksum."""
    if not isinstance(record, dict) or record.get("format") != FILE_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise CheckpointFileError(
            f"{path} is not an rl_data checkpoint: format {found!r}, expected {FILE_FORMAT!r}"
        )
    if record.get("format_version") != FILE_FORMAT_VERSION:
        raise CheckpointFileError(
            f"{path} has checkpoint file format version {record.get('format_version')!r}; this "
            f"version of rl_data reads version {FILE_FORMAT_VERSION}"
        )
    if set(record) != set(_RECORD_TYPES):
        raise CheckpointFileError(
            f"checkpoint file {path} is damaged: its record has keys "
            f"{sorted(record, key=repr)}, expected {sorted(_RECORD_TYPES)}; restore from "
            "another checkpoint"
        )
    for key, expected in _RECORD_TYPES.items():
        if type(record[key]) is not expected:
            raise CheckpointFileError(
                f"checkpoint file {path} is damaged: its record's {key!r} is of type "
                f"{type(record[key]).__name__}, expected {expected.__name__}; restore from "
                "another checkpoint"
            )
    try:
        actual = content_digest(record["content"])
    except TypeError as error:
        raise CheckpointFileError(
            f"checkpoint file {path} is damaged: {error}; restore from another checkpoint"
        ) from None
    if actual != record["sha256"]:
        raise CheckpointFileError(
            f"checkpoint file {path} fails its checksum (stored sha256 {record['sha256']}, "
            f"content hashes to {actual}); the file was altered or damaged, restore from "
            "another checkpoint"
        )
    return record["content"]


def _feed(digest: Any, value: Any, where: str, torch: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{value.dtype}{tuple(value.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"D{len(value)};".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, str(k))):
            if not isinstance(key, str):
                raise TypeError(f"checkpoint key {key!r} at {where} is not a str")
            _feed(digest, key, where, torch)
            _feed(digest, value[key], f"{where}.{key}", torch)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for i, item in enumerate(value):
            _feed(digest, item, f"{where}[{i}]", torch)
    elif isinstance(value, bytes):
        if not value:
            raise TypeError(
                f"checkpoint value at {where} is empty bytes, which torch.load(weights_only=True) cannot read back; "
                "store None (or non-empty bytes) there"
            )
        digest.update(f"B{len(value)};".encode() + value)
    elif isinstance(value, str):
        encoded = value.encode()
        digest.update(f"S{len(encoded)};".encode() + encoded)
    elif value is None or isinstance(value, (bool, int, float)):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(
            f"checkpoint value at {where} is a {type(value).__name__}; checkpoints hold only "
            "dicts, lists, tuples, str, bytes, int, float, bool, None and tensors"
        )


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
