"""Fingerprints and readable diffs of plain-JSON descriptions (identities, layouts, configs).

Pure functions, used wherever a saved description is compared with the current one before a
restore: :func:`fingerprint` hashes it, :func:`differences` lists what changed as one
``path old -> new`` line per change, :func:`brief` keeps a value short enough for such a line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

_BRIEF_LIMIT = 80


def fingerprint(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value`` (which must be plain JSON)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def brief(value: Any) -> str:
    """``repr(value)``, cut to 77 characters + ``...`` when longer than 80."""
    text = repr(value)
    return text if len(text) <= _BRIEF_LIMIT else text[: _BRIEF_LIMIT - 3] + "..."


def differences(saved: Any, current: Any, path: str = "") -> list[str]:
    """The entries that changed from ``saved`` to ``current``, as ``key old -> new`` lines.

    Mappings are walked over the sorted union of their keys with dotted paths; a key only in
    ``current`` gives ``"<path> added <value>"``, one only in ``saved`` gives
    ``"<path> removed <value>"``. Equal values (same type, same value) give ``[]``.
    """
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        lines: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            child = f"{path}.{key}" if path else str(key)
            if key not in current:
                lines.append(f"{child} removed {brief(saved[key])}")
            elif key not in saved:
                lines.append(f"{child} added {brief(current[key])}")
            else:
                lines.extend(differences(saved[key], current[key], child))
        return lines
    if type(saved) is type(current) and saved == current:
        return []
    return [f"{path or '<identity>'} {brief(saved)} -> {brief(current)}"]
