"""The canonical sample stored in an rl_data WebDataset shard.

Every sample is one tar member ``<key>.json`` holding UTF-8 JSON:

- SFT: ``{"kind": "sft", "messages": [{"role", "content", ...}, ...], "source": {...}}``
- preference: ``{"kind": "preference", "context": [...], "chosen": [...], "rejected": [...],
  "source": {...}}`` (``chosen``/``rejected`` are the completions that follow ``context``)

Optional keys: ``tools`` (tool schemas), ``task_name``. ``source`` records where the row came
from (``{"file": ..., "row": ...}``) and never affects encoding. Media files of multimodal
samples are further members of the same sample (``<key>.<name>.<ext>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Member (WebDataset field) that holds the sample JSON.
SAMPLE_MEMBER = "json"
SAMPLE_KINDS = ("sft", "preference")


def encode_sample(sample: Mapping[str, Any]) -> dict[str, bytes]:
    """Return the tar members of one sample (canonical, byte-stable JSON)."""
    kind = sample.get("kind")
    if kind not in SAMPLE_KINDS:
        raise ValueError(f"sample kind {kind!r} is not one of {SAMPLE_KINDS}; set sample['kind']")
    payload = json.dumps(sample, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return {SAMPLE_MEMBER: payload.encode("utf-8")}


def decode_sample(members: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the sample JSON from a raw (crude) WebDataset sample's members."""
    if SAMPLE_MEMBER not in members:
        found = sorted(k for k in members if not k.startswith("__"))
        raise ValueError(f"sample has no {SAMPLE_MEMBER!r} member (found members {found})")
    raw = members[SAMPLE_MEMBER]
    sample = json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
    if not isinstance(sample, dict) or sample.get("kind") not in SAMPLE_KINDS:
        kind = sample.get("kind") if isinstance(sample, dict) else type(sample).__name__
        raise ValueError(f"sample JSON kind {kind!r} is not one of {SAMPLE_KINDS}")
    return sample
