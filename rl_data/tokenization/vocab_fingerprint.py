"""``vocab_fingerprint``: the sha256 of a tokenizer's vocabulary, cached in memory and on disk.

The fingerprint identifies a tokenizer by content (token -> id), not by where it was loaded
from, so the same tokenizer at another path restores a checkpoint. Computing it serialises
the whole vocabulary (~0.45 CPU-s for Qwen's 151k tokens, in every rank actor's start-up), so
it is also kept on disk under ``<rl_data cache>/vocab_fingerprints/``, keyed by what fully
determines the vocabulary of a tokenizer loaded from a folder: the sha256 of its
``tokenizer.json`` (the base vocabulary), every added token with its id (including tokens
added after loading) and the vocabulary size. A tokenizer not loaded from a folder with a
``tokenizer.json`` is always fingerprinted in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

_IN_MEMORY: "weakref.WeakKeyDictionary[Any, tuple[int, str]]" = weakref.WeakKeyDictionary()
_CACHE_FOLDER = "vocab_fingerprints"


def vocab_fingerprint(tokenizer: Any) -> str:
    """sha256 hex of the tokenizer's vocabulary (sorted ``token -> id`` pairs as JSON)."""
    size = len(tokenizer)
    try:
        known_size, digest = _IN_MEMORY[tokenizer]
        if known_size == size:  # tokens added since: fingerprint again
            return digest
    except (KeyError, TypeError):
        pass
    cache_file = _cache_file(tokenizer)
    digest = _read(cache_file) if cache_file is not None else None
    if digest is None:
        digest = full_vocab_fingerprint(tokenizer)
        if cache_file is not None:
            _write(cache_file, digest)
    try:
        _IN_MEMORY[tokenizer] = (size, digest)
    except TypeError:  # not weak-referenceable: looked up again next time
        pass
    return digest


def full_vocab_fingerprint(tokenizer: Any) -> str:
    """The fingerprint computed from the vocabulary itself (no cache)."""
    canonical = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _cache_file(tokenizer: Any) -> Path | None:
    from rl_data.tokenization.tokenizer import cache_root

    vocabulary_file = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "tokenizer.json"
    try:
        if not vocabulary_file.is_file():
            return None
        added = sorted((str(token), int(index)) for token, index in tokenizer.get_added_vocab().items())
        key = hashlib.sha256()
        key.update(hashlib.sha256(vocabulary_file.read_bytes()).digest())
        key.update(json.dumps([added, len(tokenizer)], ensure_ascii=False).encode("utf-8"))
    except (OSError, AttributeError, TypeError, ValueError):
        return None
    return cache_root() / _CACHE_FOLDER / key.hexdigest()


def _read(path: Path) -> str | None:
    try:
        digest = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None


def _write(path: Path, digest: str) -> None:
    """Atomically (a reader sees the whole digest or no file); a read-only cache is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=".fingerprint-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(digest)
        os.replace(staging, path)
    except OSError:
        pass
