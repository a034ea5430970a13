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
from pathlib import Path
from typing import Any

from rl_data.tokenization.tokenizer_cache import (
    PerTokenizer,
    cache_entry,
    read_entry,
    tokenizer_file_digest,
    write_entry,
)

_IN_MEMORY: PerTokenizer[str] = PerTokenizer()
_CACHE_FOLDER = "vocab_fingerprints"


def vocab_fingerprint(tokenizer: Any) -> str:
    """sha256 hex of the tokenizer's vocabulary (sorted ``token -> id`` pairs as JSON)."""
    return _IN_MEMORY.get(tokenizer, len(tokenizer), lambda: _cached_or_full(tokenizer))  # tokens added: again


def _cached_or_full(tokenizer: Any) -> str:
    cache_file = _cache_file(tokenizer)
    digest = _read(cache_file) if cache_file is not None else None
    if digest is None:
        digest = full_vocab_fingerprint(tokenizer)
        if cache_file is not None:
            write_entry(cache_file, digest)
    return digest


def full_vocab_fingerprint(tokenizer: Any) -> str:
    """The fingerprint computed from the vocabulary itself (no cache)."""
    canonical = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _cache_file(tokenizer: Any) -> Path | None:
    file_digest = tokenizer_file_digest(tokenizer)
    if file_digest is None:
        return None
    try:
        added = sorted((str(token), int(index)) for token, index in tokenizer.get_added_vocab().items())
        key = hashlib.sha256(file_digest)
        key.update(json.dumps([added, len(tokenizer)], ensure_ascii=False).encode("utf-8"))
    except (AttributeError, TypeError, ValueError):
        return None
    return cache_entry(_CACHE_FOLDER, key.hexdigest())


def _read(path: Path) -> str | None:
    digest = read_entry(path)
    return digest if digest is not None and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None
