"""``MergeSpec``: how the batches of one task merge across logical shards (pad values, left-padded columns)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MergeSpec:
    """Pad values of padded columns (default 0) and the columns padded on the left."""

    pad_values: Mapping[str, int | float] = field(default_factory=dict)
    left_padded: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pad_values": dict(self.pad_values), "left_padded": list(self.left_padded)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "MergeSpec":
        return cls(dict(value.get("pad_values", {})), tuple(value.get("left_padded", ())))
