"""Helpers for the preprocessing tests: realistic raw rows, a user adapter, reading shards back."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

GSM8K_ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Write rows as JSON lines (a ``str`` row is written verbatim, to make malformed lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
    return path


def read_shards(root: Path) -> dict[str, dict[str, Any]]:
    """``{key: sample JSON}`` of every shard of a produced dataset, in shard order."""
    samples: dict[str, dict[str, Any]] = {}
    for shard in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, extension = member.name.partition(".")
                assert extension == "json", member.name
                assert key not in samples, f"duplicate key {key}"
                samples[key] = json.load(io.BytesIO(tar.extractfile(member).read()))
    return samples


def read_quarantine(root: Path) -> list[dict[str, Any]]:
    """The quarantine records of a produced dataset."""
    return [json.loads(line) for line in (root / "quarantine.jsonl").read_text().splitlines()]


def title_case_adapter(row: dict[str, Any]) -> dict[str, Any]:
    """A user adapter for the import-path test: ``{"q", "a"}`` rows, assistant text title-cased."""
    return {"kind": "sft", "messages": [{"role": "user", "content": row["q"]},
                                        {"role": "assistant", "content": row["a"].title()}]}
