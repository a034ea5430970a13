"""Token ids of a text's prefix without encoding the rest, for Qwen2-style BPE tokenizers.

A *safe cut* of a text is an index ``c`` where ``text[c - 1]`` is an ASCII letter,
``text[c]`` an ASCII non-letter, and no added token's occurrence spans ``c``. For a tokenizer
that :func:`cuts_are_exact` accepts, ``encode(text) == encode(text[:c]) + encode(text[c:])``
at every safe cut, so the ids of a prefix ending at a safe cut are the first ids of the text:

* added tokens are matched verbatim on the raw text before anything else, and none spans ``c``;
* NFC cannot compose across ``c``: an ASCII character never combines with the one before it;
* the Qwen2 split regex has no lookbehind, and the piece holding ``text[c - 1]`` (a letter run,
  or a contraction such as ``'s``) ends at ``c`` with the same decision at the end of the text
  as before an ASCII non-letter (no letter follows, and the ``(?!\\S)`` lookahead is only tried
  after whitespace); no earlier piece looks past the letter at ``c - 1``;
* byte-level BPE without dropout encodes each piece on its own.

The truncation rule (:mod:`rl_data.tokenization.truncation`) keeps 4 tokens per message of a
sample reaching ``max_seq_length``; with this, an over-long conversation is encoded only until
the limit is reached plus a short prefix of every message (see
:func:`~rl_data.tokenization.chat.get_truncated_formatted_message_log`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Qwen2 / Qwen2.5 / Qwen3 pre-tokenization: the split regex, then byte-level mapping only.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}
_EXACT_NORMALIZERS = (None, {"type": "NFC"})
# An ASCII letter followed by an ASCII non-letter: the cut is after the letter.
_LETTER_THEN_ASCII_NON_LETTER = re.compile(r"[A-Za-z](?=[\x00-\x40\x5b-\x60\x7b-\x7f])")


@dataclass(frozen=True)
class AddedTokens:
    """The added tokens' texts, and every two-character string inside one (a cut between such a
    pair is checked against the tokens; any other cut is outside them all)."""

    texts: tuple[str, ...]
    pairs: frozenset[str]

    @classmethod
    def of(cls, texts: tuple[str, ...]) -> AddedTokens:
        return cls(texts, frozenset(text[i : i + 2] for text in texts for i in range(len(text) - 1)))

    def span(self, text: str, cut: int) -> bool:
        """Whether an occurrence of an added token starts before ``cut`` and ends after it."""
        if text[cut - 1 : cut + 1] not in self.pairs:
            return False
        for token in self.texts:
            found = text.find(token, max(cut - len(token) + 1, 0), cut + len(token) - 1)
            if 0 <= found < cut:
                return True
        return False


def cuts_are_exact(tokenizer: Any) -> AddedTokens | None:
    """The added tokens when safe cuts split ``tokenizer``'s encoding exactly, else None.

    Requires the Rust backend with the Qwen2 pre-tokenizer, an NFC (or no) normalizer, a BPE
    model without dropout, no truncation or padding, special tokens not split, and every added
    token matched verbatim (no strip, word or normalisation options). Checked on every call
    (~30 us): a tokenizer changed after loading is judged as it is now.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast") or getattr(tokenizer, "split_special_tokens", False):
        return None
    if backend.truncation is not None or backend.padding is not None or backend.encode_special_tokens:
        return None
    if type(backend.model).__name__ != "BPE" or backend.model.dropout is not None:
        return None
    if _state(backend.pre_tokenizer) != _QWEN2_PRE_TOKENIZER or _state(backend.normalizer) not in _EXACT_NORMALIZERS:
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(token.lstrip or token.rstrip or token.single_word or token.normalized for token in added):
        return None
    return AddedTokens.of(tuple(token.content for token in added))


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def safe_cut(text: str, start: int, added_tokens: AddedTokens) -> int | None:
    """The first safe cut of ``text`` at index ``start`` or later (None: there is none)."""
    for match in _LETTER_THEN_ASCII_NON_LETTER.finditer(text, max(start - 1, 0)):
        if not added_tokens.span(text, match.end()):
            return match.end()
    return None


# Encode steps of an over-long candidate, each ending at a safe cut: first 3 characters per
# token of the limit (English runs ~4 characters per token), then a quarter character per token
# (~1/16 of the limit in tokens: the overshoot past the limit; a call costs ~40 us).
FIRST_STEP_CHARS_PER_TOKEN = 3
STEP_CHARS_PER_TOKEN = 0.25
# A turn's prefix for its stub: the first safe cut after this many characters (the ChatML
# header ``<|im_start|>assistant\n`` is 22 characters and 3 tokens; a stub keeps at most 4).
STUB_PREFIX_CHARS = 24

def encode_until(encode: Callable[[str], list[int]], text: str, limit: int, added_tokens: AddedTokens) -> tuple[list[int], int]:
    """``(ids, end)``: the ids of ``text[:end]``, where ``end`` is ``len(text)`` or the first safe
    cut of the steps by which ``limit`` ids were reached.

    Encodes in steps ending at safe cuts (:func:`safe_cut`), so the ids of the steps joined are
    the ids of the text they cover; a text of at most ``FIRST_STEP_CHARS_PER_TOKEN * limit``
    characters is encoded in one call.
    """
    ids: list[int] = []
    start, stop = 0, FIRST_STEP_CHARS_PER_TOKEN * limit
    while True:
        cut = safe_cut(text, stop, added_tokens) if stop < len(text) else None
        end = len(text) if cut is None else cut
        ids += encode(text[start:end])
        if end == len(text) or len(ids) >= limit:
            return ids, end
        start, stop = end, end + max(1, int(STEP_CHARS_PER_TOKEN * limit))


def stub_prefixes(texts: list[str], added_tokens: AddedTokens) -> list[str]:
    """Each text up to its first safe cut after ``STUB_PREFIX_CHARS`` characters (whole without one):
    its ids are the first ids of the text."""
    prefixes = []
    for text in texts:
        cut = safe_cut(text, STUB_PREFIX_CHARS, added_tokens)
        prefixes.append(text if cut is None else text[:cut])
    return prefixes
