"""Weighted mixtures of datasets: their members, their identity, and the record of what they gave.

A loader's source is a mixture when it lists ``mixture`` members (name, dataset, weight) or
names an Energon metadataset YAML whose split is a ``blend`` of datasets with weights. Energon
blends the members sample by sample with its own seeded generator, so the stream is
deterministic and restores exactly (the member datasets' positions and the generator are in
Energon's state; the weights are not, which is what makes re-weighting possible).

* :func:`mixture_members` describes every member for the loader identity (path, weight and the
  dataset's own ``index_uuid``), keyed by name, so a changed weight is one
  ``mixture.<name>.weight old -> new`` line;
* :class:`MixtureRecord` is what the loader state keeps for a mixture: batches delivered,
  samples delivered per member (from the batches' ``source_datasets`` column) and the history
  of weights (``[{"batches": n, "weights": {...}}]``: the weights in force from batch n on).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Mapping

#: A restore-difference line that only changes one member's weight.
_WEIGHT_LINE = re.compile(r"^mixture\.([A-Za-z0-9_.-]+)\.weight \S+ -> \S+$")


def _index_uuid(path: str) -> str | None:
    from megatron.energon.epathlib import EPath

    uuid_file = EPath(path) / ".nv-meta" / "index.uuid"
    return uuid_file.read_text().strip() if uuid_file.is_file() else None


def _absolute(path: str, base: str | None) -> str:
    from megatron.energon.epathlib import EPath

    if base is None or str(path).startswith("/") or "://" in str(path):
        return str(EPath(path))
    return str(EPath(base).parent / path)


def mixture_members(source: Any) -> dict[str, dict[str, Any]] | None:
    """``name -> {"path", "weight", "index_uuid"}`` of a mixture source; None for one dataset.

    A metadataset YAML that is not a flat ``blend`` (nested metadatasets, joins, epochized
    blends) is described by the sha256 of its text as the single member ``"metadataset"``.
    """
    if source.mixture is not None:
        return {
            m.name: {"path": _absolute(m.path, None), "weight": float(m.weight), "index_uuid": _index_uuid(m.path)}
            for m in source.mixture
        }
    if not source.is_mixture:
        return None
    return _metadataset_members(str(source.path), source.split)


def _metadataset_members(path: str, split: str) -> dict[str, dict[str, Any]]:
    import yaml
    from megatron.energon.epathlib import EPath

    text = EPath(path).read_text()
    config = yaml.safe_load(text)
    blend = (config.get("splits") or {}).get(split, {}).get("blend") if isinstance(config, dict) else None
    flat = isinstance(blend, list) and all(
        isinstance(m, dict) and set(m) <= {"path", "weight", "split_part", "subflavors"} and "path" in m for m in blend
    )
    if not flat:
        return {"metadataset": {"path": str(EPath(path)), "sha256": hashlib.sha256(text.encode()).hexdigest()}}
    members: dict[str, dict[str, Any]] = {}
    for entry in blend:
        member_path = _absolute(entry["path"], path)
        name = PurePosixPath(member_path).name or "member"
        while name in members:
            name += "_"
        members[name] = {"path": member_path, "weight": float(entry.get("weight", 1.0)), "index_uuid": _index_uuid(member_path)}
    return members


def member_names_by_path(members: Mapping[str, Mapping[str, Any]] | None) -> dict[str, str] | None:
    """``dataset path -> member name`` (what a sample's ``SourceInfo.dataset_path`` maps to)."""
    if not members or any("weight" not in m for m in members.values()):
        return None  # one dataset, or a metadataset described by its text only
    return {str(m["path"]): name for name, m in members.items()}


def weight_change_lines(lines: list[str]) -> list[str]:
    """The restore-difference lines that only change a member's weight."""
    return [line for line in lines if _WEIGHT_LINE.match(line)]


def weights_of(members: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    return {name: float(m["weight"]) for name, m in members.items() if "weight" in m}


@dataclass
class MixtureRecord:
    """Batches and per-member samples delivered, and the weights in force over time (plain JSON)."""

    batches: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    KEYS = ("batches", "counts", "history")

    @classmethod
    def start(cls, weights: Mapping[str, float]) -> "MixtureRecord":
        return cls(0, {name: 0 for name in weights}, [{"batches": 0, "weights": dict(weights)}])

    def count(self, source_datasets: Any) -> None:
        """Count one batch's ``source_datasets`` column (a name per row, or a list per pack)."""
        self.batches += 1
        for item in source_datasets or ():
            for name in item if isinstance(item, list) else [item]:
                self.counts[name] = self.counts.get(name, 0) + 1

    def reweighted(self, weights: Mapping[str, float]) -> "MixtureRecord":
        """The same record with ``weights`` in force from the next batch on."""
        entry = {"batches": self.batches, "weights": dict(weights)}
        return MixtureRecord(self.batches, dict(self.counts), [*self.history, entry])

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "counts": dict(self.counts), "history": [dict(h) for h in self.history]}

    @classmethod
    def from_json(cls, value: Any) -> "MixtureRecord":
        if not isinstance(value, dict) or set(value) != set(cls.KEYS):
            raise ValueError(
                f"loader state mixture record must be a mapping with keys {sorted(cls.KEYS)}, found "
                f"{value!r:.120}; this state was not saved by this rl_data version"
            )
        return cls(int(value["batches"]), {str(k): int(v) for k, v in value["counts"].items()}, list(value["history"]))
