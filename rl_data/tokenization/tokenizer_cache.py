"""Facts about a tokenizer, computed once: per tokenizer object in memory, per ``tokenizer.json`` on disk.

:class:`PerTokenizer` keeps a value per tokenizer object (held weakly) and version (what the
value depends on that can change after loading: its size, its special tokens). Some facts cost
a rank actor's start-up a large share of a second to compute (the vocabulary fingerprint,
whether tiktoken encodes like the tokenizer, tiktoken's byte-level ranks), yet depend only on
the tokenizer's files. They are kept under ``<rl_data cache>/<kind>/<key>``, where the key
starts from the sha256 of the ``tokenizer.json`` of the folder the tokenizer was loaded from
(computed once per process and file version). A tokenizer not loaded from such a folder has no
key: its facts are computed every time. Entries are ASCII text (a digest, a verdict, or the
~2.5 MB of base64 ranks), written atomically; an unreadable or read-only cache is skipped,
never fatal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


class PerTokenizer(Generic[T]):
    """One value per tokenizer object and version, computed on first use (a tokenizer that is not
    weak-referenceable gets it computed every time)."""

    def __init__(self) -> None:
        self._values: weakref.WeakKeyDictionary[Any, tuple[Hashable, T]] = weakref.WeakKeyDictionary()

    def get(self, tokenizer: Any, version: Hashable, compute: Callable[[], T]) -> T:
        try:
            cached_version, value = self._values[tokenizer]
            if cached_version == version:
                return value
        except (KeyError, TypeError):
            pass
        value = compute()
        with contextlib.suppress(TypeError):
            self._values[tokenizer] = (version, value)
        return value


def tokenizer_file_digest(tokenizer: Any) -> bytes | None:
    """sha256 of the ``tokenizer.json`` in the folder ``tokenizer`` was loaded from, or None."""
    vocabulary_file = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "tokenizer.json"
    try:
        stat = vocabulary_file.stat()
        version = (str(vocabulary_file), stat.st_size, stat.st_mtime_ns)
        if version not in _FILE_DIGESTS:
            _FILE_DIGESTS[version] = hashlib.sha256(vocabulary_file.read_bytes()).digest()
    except (OSError, TypeError, ValueError):
        return None
    return _FILE_DIGESTS[version]


def cache_entry(kind: str, key: str) -> Path:
    """Where the fact ``kind`` of the tokenizer keyed ``key`` is kept."""
    from rl_data.tokenization.tokenizer import cache_root

    return cache_root() / kind / key


def read_entry(path: Path) -> str | None:
    """The entry's text, or None when it is missing or unreadable."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def write_entry(path: Path, text: str) -> None:
    """Atomically (a reader sees the whole entry or no file); a read-only or full cache is
    skipped, and a failed write leaves no partial file behind."""
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=".entry-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(text)
        os.replace(staging, path)
    except OSError:
        if staging is not None:
            with contextlib.suppress(OSError):
                os.unlink(staging)
