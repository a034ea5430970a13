"""The benchmark workload: >= 20,000 realistic multi-turn conversations, on disk twice.

Conversations: the 4,017 real chitchat conversations (``rl_data.sample_data``), then
*resampled* ones until ``num_conversations``: each takes its number of turns from a real
conversation drawn at random and fills every turn with the text of a real turn of the same
role drawn at random (``random.Random(seed)``, so the set is deterministic). Turn counts and
turn lengths therefore follow the real distributions (mean ~34 turns, ~880 tokens per
conversation with a long tail); only which turns sit together is synthetic.

Written once per settings into a cache folder, as the same canonical sample JSON:

* an Energon dataset (tar shards, split ``train`` = everything) for the rl_data contenders;
* JSONL files with the same lines, for Ray Data and torchdata (the formats they read).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.settings import BenchSettings
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.sample_data import chitchat_conversations

_LAYOUT_VERSION = 1


@dataclass(frozen=True)
class Workload:
    """Where the workload lives and how it was made."""

    energon_path: str
    jsonl_paths: tuple[str, ...]
    num_conversations: int
    num_real: int

    def describe(self) -> dict[str, Any]:
        return {
            "num_conversations": self.num_conversations,
            "num_real_chitchat": self.num_real,
            "num_resampled": self.num_conversations - self.num_real,
            "energon_shards": len(self.jsonl_paths),
            "generator": "real chitchat + resampled real turns (turn counts from real conversations)",
        }


def sample_key(row: int) -> str:
    """The Energon key of row ``row``; Ray Data and torchdata derive the same id from ``source.row``."""
    return f"conv-{row:06d}"


def conversations(num_conversations: int, seed: int) -> Iterator[dict[str, Any]]:
    """Real conversations first, then resampled ones (see the module docstring)."""
    real = list(chitchat_conversations())
    for conversation in real[:num_conversations]:
        yield {"messages": conversation["messages"], "origin": "chitchat"}
    turns_by_role: dict[str, list[str]] = {}
    for conversation in real:
        for message in conversation["messages"]:
            turns_by_role.setdefault(message["role"], []).append(message["content"])
    rng = random.Random(seed)
    for _ in range(max(0, num_conversations - len(real))):
        template = rng.choice(real)["messages"]
        yield {
            "messages": [
                {"role": m["role"], "content": rng.choice(turns_by_role[m["role"]])} for m in template
            ],
            "origin": "resampled",
        }


def sample_json(row: int, conversation: dict[str, Any]) -> dict[str, bytes]:
    """The tar members of one canonical SFT sample."""
    return encode_sample(
        {
            "kind": "sft",
            "messages": conversation["messages"],
            "source": {"file": conversation["origin"], "row": row},
        }
    )


def prepare_workload(settings: BenchSettings, cache_dir: str | Path) -> Workload:
    """Write (or reuse) the workload for ``settings`` under ``cache_dir``."""
    recipe = {
        "version": _LAYOUT_VERSION,
        "num_conversations": settings.num_conversations,
        "samples_per_shard": settings.samples_per_shard,
        "seed": settings.seed,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) / f"workload-{digest}"
    done = root / "workload.json"
    if not done.exists():
        _write(root, settings)
        done.write_text(json.dumps(recipe))
    jsonl_paths = tuple(sorted(str(p) for p in (root / "jsonl").glob("*.jsonl")))
    num_real = min(settings.num_conversations, sum(1 for _ in chitchat_conversations()))
    return Workload(str(root / "energon"), jsonl_paths, settings.num_conversations, num_real)


def _write(root: Path, settings: BenchSettings) -> None:
    samples = [
        (sample_key(row), sample_json(row, conversation))
        for row, conversation in enumerate(conversations(settings.num_conversations, settings.seed))
    ]
    write_energon_dataset(
        root / "energon", samples, samples_per_shard=settings.samples_per_shard, splits={"train": 1.0}
    )
    jsonl = root / "jsonl"
    jsonl.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, len(samples), settings.samples_per_shard)):
        lines = [members["json"] + b"\n" for _, members in samples[start : start + settings.samples_per_shard]]
        (jsonl / f"part-{shard:05d}.jsonl").write_bytes(b"".join(lines))
