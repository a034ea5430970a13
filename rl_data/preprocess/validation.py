"""Row validation with reason codes: every rejected row says which rule it broke and where.

A raw row is parsed here (:func:`parse_row`: JSON object, valid text); the sample an adapter makes
of it is checked by the rules of :mod:`rl_data.energon.sample_validation` (re-exported here: the
reason codes, :class:`RowRejected`, :func:`validate_sample`, :func:`validate_conversation`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rl_data.energon.sample_validation import (
    FILTER_REASONS,
    REASONS,
    RowRejected,
    conversations_of,
    known_reasons,
    text_view,
    validate_conversation,
    validate_sample,
)

__all__ = [
    "FILTER_REASONS",
    "REASONS",
    "RowRejected",
    "conversations_of",
    "known_reasons",
    "parse_row",
    "text_view",
    "validate_conversation",
    "validate_sample",
]


def parse_row(raw: str) -> dict[str, Any]:
    """The JSON object of one raw row, or :class:`RowRejected` ``invalid_json``."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as error:
        raise RowRejected("invalid_json", f"row is not valid JSON: {error}") from None
    except RecursionError:
        raise RowRejected("invalid_json", "row is nested too deeply to parse (arrays/objects inside each "
                          "other beyond Python's recursion limit)") from None
    if not isinstance(row, dict):
        raise RowRejected("invalid_json", f"row must be a JSON object, found {type(row).__name__}")
    if _SURROGATE_ESCAPE.search(raw):
        _refuse_lone_surrogates(row, "row")
    return row


#: A JSON ``\\uXXXX`` escape of a UTF-16 surrogate (pairs are fine; a lone one is not text).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value: Any, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise RowRejected("invalid_unicode", (
                f"{where}: lone UTF-16 surrogate U+{ord(value[error.start]):04X} at character {error.start}; "
                "only a high+low pair (\\ud83d\\ude00) is a character: fix or drop the escape")) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key, where)
            _refuse_lone_surrogates(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{where}[{index}]")
