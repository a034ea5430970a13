"""``text_encoder``: a tokenizer's ``encode`` through tiktoken where tiktoken gives the same ids.

``tokenizer(text, add_special_tokens=False)["input_ids"]`` runs the Rust backend's whole
pipeline and builds an ``Encoding`` per call: ~0.65 M tokens per CPU-second here. tiktoken
encodes the same pieces with the same ranks at ~4 M: a loader's CPU per sample falls by more
than half. It is used for a tokenizer only when the two algorithms line up:

* the backend's pipeline is the Qwen2 one that :func:`~rl_data.tokenization.prefix_encoding.cuts_are_exact`
  accepts (the Qwen2 split regex then the byte-level mapping, NFC or no normaliser, BPE without
  dropout, no truncation or padding, special tokens not split, added tokens matched verbatim);
  tiktoken is given the same regex, and the two regex engines classify every code point alike
  (checked on all of them);
* the BPE model looks a piece up whole before merging (``ignore_merges``, as tiktoken does),
  has no byte fallback and no subword prefix or suffix;
* its merges are *every* split of every token into two tokens, listed in the order of the
  merged token's id: then the pair BPE merges first (listed first) makes the token of the
  lowest rank, the pair tiktoken merges. This is what transformers' ``TikTokenConverter``
  writes (this project's Qwen3 tokenizer); checked once per ``tokenizer.json`` (~2 CPU-s) and
  the verdict kept on disk (:mod:`~rl_data.tokenization.tokenizer_cache`);
* no added token is a prefix of another (tiktoken matches them first-listed, the backend
  longest);
* per text: the text is NFC (the backend normalises the pieces between added tokens, tiktoken
  nothing) and holds no lone surrogate; otherwise that text goes to the backend.

One case is left where the two could differ: two *overlapping* pairs of one step that make the
same token (``aa|a|aa``: tiktoken merges the left pair, BPE the one listed first). No input
tried reaches it (every code point, every real conversation, runs of every vocabulary piece,
property tests). As a guard, the first 16 texts a process encodes and every 1,024th after are
also encoded by the backend: on a difference the tokenizer falls back to the backend for good
and an error is logged with the text.

Everything else goes to the backend's ``encode_batch_fast`` when that returns the tokenizer's
own ids, else to the tokenizer call. Checked per :func:`text_encoder` call: truncation,
padding, special-token splitting and the number of tokens (tokens added since are registered
again). Replacing a backend component (normaliser, pre-tokenizer, model) after the first call
is not seen: load a new tokenizer instead. ``RL_DATA_TIKTOKEN=0`` turns the tiktoken path off.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy

from rl_data.tokenization.prefix_encoding import QWEN2_SPLIT_REGEX, cuts_are_exact
from rl_data.tokenization.tokenizer_cache import (
    PerTokenizer,
    cache_entry,
    read_entry,
    tokenizer_file_digest,
    write_entry,
)


@dataclass(frozen=True)
class TextEncoder:
    """``encode(text)`` -> token ids, as ``tokenizer(text, add_special_tokens=False)["input_ids"]``."""

    #: ``"tiktoken"``, ``"backend"`` (the Rust backend's ``encode_batch_fast``) or ``"tokenizer"`` (its call).
    kind: Literal["tiktoken", "backend", "tokenizer"]
    encode: Callable[[str], list[int]]


_TIKTOKEN: PerTokenizer[TextEncoder | None] = PerTokenizer()
_CACHE_FOLDER = "tiktoken_equivalence"
_VERDICT_VERSION = b"merges-complete-and-ordered-v1"
_RANKS_FOLDER, _RANKS_VERSION = "tiktoken_ranks", b"byte-level-ranks-v1"
_SWITCH = "RL_DATA_TIKTOKEN"
#: Texts checked against the backend: the first ``_CHECK_FIRST`` of a process, then every ``_CHECK_EVERY``-th.
_CHECK_FIRST, _CHECK_EVERY = 16, 1024
_logger = logging.getLogger(__name__)


def text_encoder(tokenizer: Any) -> TextEncoder:
    """The fastest encode of ``tokenizer`` that returns its own ids (see the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    split_special = bool(getattr(tokenizer, "split_special_tokens", False))
    if (
        backend is None
        or not hasattr(backend, "encode_batch_fast")
        or backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != split_special
    ):
        return TextEncoder("tokenizer", lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
    if not split_special and os.environ.get(_SWITCH, "1") != "0":
        fast = _tiktoken_encoder(tokenizer)
        if fast is not None:
            return fast
    return TextEncoder("backend", _backend_encode(backend))


def _backend_encode(backend: Any) -> Callable[[str], list[int]]:
    return lambda text: backend.encode_batch_fast([text], add_special_tokens=False)[0].ids


def _tiktoken_encoder(tokenizer: Any) -> TextEncoder | None:
    """The tiktoken encode of ``tokenizer`` (None where it may differ), cached per tokenizer and size."""
    try:
        size = len(tokenizer)
    except TypeError:  # a tokenizer-like object without a size: not a tokenizer this module knows
        return None
    return _TIKTOKEN.get(tokenizer, size, lambda: _build(tokenizer))  # holds the backend, not the tokenizer


def _build(tokenizer: Any) -> TextEncoder | None:
    """tiktoken's encode over the tokenizer's ranks and added tokens, falling back to the
    backend per text (not NFC, lone surrogates); None where the conditions do not hold."""
    added = cuts_are_exact(tokenizer)
    backend = tokenizer.backend_tokenizer
    if added is None or not _model_options_match(backend.model):
        return None
    texts = sorted(added.texts)
    if any(not text or later.startswith(text) for text, later in zip(texts, texts[1:])):
        return None
    if not merges_match_ranks(tokenizer):
        return None
    ranks = _byte_level_ranks_of(tokenizer)
    if ranks is None or len(set(ranks.values())) != len(ranks):
        return None
    try:
        import tiktoken

        specials = {token.content: token_id for token_id, token in backend.get_added_tokens_decoder().items()}
        encoding = tiktoken.Encoding("rl_data", pat_str=QWEN2_SPLIT_REGEX, mergeable_ranks=ranks, special_tokens=specials)
        core_encode = encoding._core_bpe.encode  # Encoding.encode would replace lone surrogates silently
    except (ImportError, AttributeError, ValueError):
        return None
    allowed = frozenset(specials)
    fallback = _backend_encode(backend)
    normalises = backend.normalizer is not None  # cuts_are_exact admits NFC or none
    is_normalized = unicodedata.is_normalized
    counter = itertools.count()
    differed = False

    def encode(text: str) -> list[int]:
        nonlocal differed
        if differed or (normalises and not is_normalized("NFC", text)):
            return fallback(text)
        try:
            ids = core_encode(text, allowed)
        except UnicodeEncodeError:  # a lone surrogate: the backend decides (it refuses one)
            return fallback(text)
        index = next(counter)
        if index < _CHECK_FIRST or index % _CHECK_EVERY == 0:
            expected = fallback(text)
            if ids != expected:
                differed = True
                _logger.error(
                    "tiktoken encoded a text unlike the tokenizer (%d ids against %d); this tokenizer is "
                    "encoded by its own backend from now on. Please report the text: %r",
                    len(ids), len(expected), text[:2000],
                )
                return expected
        return ids

    return TextEncoder("tiktoken", encode)


def _model_options_match(model: Any) -> bool:
    return (
        type(model).__name__ == "BPE"
        and getattr(model, "ignore_merges", False) is True
        and getattr(model, "byte_fallback", True) is False
        and not getattr(model, "continuing_subword_prefix", "x")
        and not getattr(model, "end_of_word_suffix", "x")
    )


def _byte_level_ranks_of(tokenizer: Any) -> dict[bytes, int] | None:
    """:func:`byte_level_ranks` of the tokenizer's vocabulary, kept on disk per ``tokenizer.json``:
    reading the entry takes ~0.07 s, asking the backend for its vocabulary and mapping it ~0.19 s,
    paid by every process that builds the encoder."""
    backend = tokenizer.backend_tokenizer
    file_digest = tokenizer_file_digest(tokenizer)
    entry = None
    if file_digest is not None:
        entry = cache_entry(_RANKS_FOLDER, hashlib.sha256(file_digest + _RANKS_VERSION).hexdigest())
        ranks = ranks_from_entry(read_entry(entry))
        if ranks is not None and len(ranks) == backend.get_vocab_size(with_added_tokens=False):
            return ranks
    ranks = byte_level_ranks(backend.get_vocab(with_added_tokens=False))
    if entry is not None and ranks is not None:
        write_entry(entry, ranks_entry(ranks))
    return ranks


def ranks_entry(ranks: dict[bytes, int]) -> str:
    """``ranks`` as a cache entry: the token ids (int32), the tokens' lengths (uint16) and their
    bytes, each base64, with the sha256 of the three."""
    tokens = list(ranks)
    parts = [
        numpy.fromiter(ranks.values(), dtype=numpy.int32, count=len(ranks)).tobytes(),
        numpy.fromiter(map(len, tokens), dtype=numpy.uint16, count=len(tokens)).tobytes(),
        b"".join(tokens),
    ]
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    return " ".join([digest, *(base64.b64encode(part).decode("ascii") for part in parts)])


def ranks_from_entry(text: str | None) -> dict[bytes, int] | None:
    """The ranks :func:`ranks_entry` wrote, or None for a missing, damaged or foreign entry."""
    try:
        digest, *encoded = (text or "").split(" ")
        ids, lengths, joined = (base64.b64decode(part, validate=True) for part in encoded)
    except ValueError:
        return None
    if hashlib.sha256(ids + lengths + joined).hexdigest() != digest or len(ids) % 4 or len(ids) != 2 * len(lengths):
        return None
    ends = numpy.cumsum(numpy.frombuffer(lengths, dtype=numpy.uint16), dtype=numpy.int64)
    if len(ends) == 0 or ends[-1] != len(joined):
        return None
    ends = ends.tolist()
    tokens = [joined[start:end] for start, end in zip([0, *ends[:-1]], ends)]
    ranks = dict(zip(tokens, numpy.frombuffer(ids, dtype=numpy.int32).tolist()))
    return ranks if len(ranks) == len(tokens) else None


def merges_match_ranks(tokenizer: Any) -> bool:
    """Whether the BPE merges are every split of every token, in the merged tokens' id order
    (cached on disk per ``tokenizer.json``)."""
    file_digest = tokenizer_file_digest(tokenizer)
    entry = None
    if file_digest is not None:
        entry = cache_entry(_CACHE_FOLDER, hashlib.sha256(file_digest + _VERDICT_VERSION).hexdigest())
        verdict = read_entry(entry)
        if verdict in ("0", "1"):
            return verdict == "1"
    state = json.loads(tokenizer.backend_tokenizer.model.__getstate__())
    matches = merges_are_complete_and_ordered(state.get("vocab", {}), state.get("merges", []))
    if entry is not None:
        write_entry(entry, "1" if matches else "0")
    return matches


def merges_are_complete_and_ordered(vocab: dict[str, int], merges: list) -> bool:
    """Pure check of a BPE model: each merge's result is a token, results' ids never decrease
    along the list, and every split of a token into two tokens is a merge."""
    listed, last_rank = set(), -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(left + right)
        if rank is None or rank < last_rank:
            return False
        last_rank = rank
        listed.add((left, right))
    for token in vocab:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab and (left, right) not in listed:
                return False
    return True


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level mapping, reversed: the character standing for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[chr(byte)] = byte
        else:
            characters[chr(256 + extra)] = byte
            extra += 1
    return characters


_TO_LATIN1 = str.maketrans({character: chr(byte) for character, byte in _byte_level_alphabet().items()})
_ALPHABET = frozenset(_byte_level_alphabet())


def byte_level_ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """The byte-level vocabulary as tiktoken ranks (token bytes -> id), or None when a token is
    not byte-level text or a byte has no token of its own."""
    ranks = {}
    for token, token_id in vocab.items():
        if not _ALPHABET.issuperset(token):
            return None
        ranks[token.translate(_TO_LATIN1).encode("latin-1")] = token_id
    if any(bytes([byte]) not in ranks for byte in range(256)):
        return None
    return ranks
