"""The canonical sample stored in an rl_data WebDataset shard.

Every sample has one tar member ``<key>.json`` holding UTF-8 JSON:

- ``kind``: the stored sample kind of a registered task (:mod:`rl_data.tasks`), which owns
  the other fields: e.g. SFT ``{"kind": "sft", "messages": [...]}``, preference ``{"kind":
  "preference", "context": [...], "chosen": [...], "rejected": [...]}``, RL prompts ``{"kind":
  "rl_prompt", "messages": [...], "extra_env_info": {...}, "task_name": ...}``;
- ``source``: where the row came from (``{"file": ..., "row": ...}``).

Optional keys: ``tools`` (tool schemas), ``task_name``. ``source`` never affects encoding.

**Media.** A multimodal sample stores each media file as a further member of the same sample,
``<key>.<name>.<ext>`` (``name``: letters, digits, ``_``, ``-``). Energon splits a tar member
name at the first dot of its file name, so the crude sample exposes it under ``"<name>.<ext>"``
next to ``"json"``. Message content parts reference members by that name:
``{"type": "image", "image": "photo-0.jpg"}`` (jpg/jpeg/png/webp),
``{"type": "video", "video": "clip-0.mp4"}`` or a frame sequence
``{"type": "video", "video": ["clip-0-f0.jpg", "clip-0-f1.jpg", ...]}``, and
``{"type": "audio", "audio": "speech-0.wav"}`` (wav/flac). Every referenced member must exist,
every member must be referenced exactly once, and the extension must suit the part type
(:func:`check_media_members`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rl_data.task_registry import find_schema, sample_schemas, schema_for_kind

#: Member (WebDataset field) that holds the sample JSON.
SAMPLE_MEMBER = "json"
#: Content part type -> allowed member extensions (video frames use the image extensions).
MEDIA_EXTENSIONS: dict[str, tuple[str, ...]] = {
    "image": ("jpg", "jpeg", "png", "webp"),
    "video": ("mp4",),
    "audio": ("wav", "flac"),
}
_MEMBER_PATTERN = re.compile(r"^[A-Za-z0-9_\-]+\.[A-Za-z0-9]+$")


def encode_sample(sample: Mapping[str, Any], media: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    """Return the tar members of one sample: its canonical, byte-stable JSON plus its media.

    ``media`` maps member names (``"<name>.<ext>"``) to bytes; they must match the sample's
    media references exactly (see :func:`check_media_members`).
    """
    schema_for_kind(sample.get("kind"))
    media = dict(media or {})
    check_media_members(sample, media)
    payload = json.dumps(sample, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return {SAMPLE_MEMBER: payload.encode("utf-8"), **media}


def decode_sample(members: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the sample JSON from a raw (crude) WebDataset sample's members."""
    if SAMPLE_MEMBER not in members:
        found = sorted(k for k in members if not k.startswith("__"))
        raise ValueError(f"sample has no {SAMPLE_MEMBER!r} member (found members {found})")
    raw = members[SAMPLE_MEMBER]
    sample = json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
    if not isinstance(sample, dict) or find_schema(sample.get("kind")) is None:
        kind = sample.get("kind") if isinstance(sample, dict) else type(sample).__name__
        raise ValueError(f"sample JSON kind {kind!r} is not one of {sorted(sample_schemas())}")
    return sample


def media_members(members: Mapping[str, Any]) -> dict[str, bytes]:
    """The media members of a crude sample (every member except the JSON and ``__meta__`` keys)."""
    return {k: v for k, v in members.items() if k != SAMPLE_MEMBER and not k.startswith("__")}


def media_extension(member: str) -> str:
    """The lower-cased extension of a member name (``"a.JPG"`` -> ``"jpg"``)."""
    return member.rsplit(".", 1)[-1].lower()


def is_media_part(part: Any) -> bool:
    """Whether a content part is a media reference (type image, video or audio)."""
    return isinstance(part, Mapping) and part.get("type") in MEDIA_EXTENSIONS


def media_references(sample: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(part type, member)`` for every media reference, in message and part order.

    A frame-sequence video contributes one ``("video_frame", member)`` per frame. Raises
    ``ValueError`` for a malformed media part.
    """
    references: list[tuple[str, str]] = []
    for messages in _message_lists(sample):
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list):
                continue
            for part_index, part in enumerate(content):
                if is_media_part(part):
                    where = f"message {index} content part {part_index}"
                    references.extend(_part_members(part, where))
    return references


def check_media_members(sample: Mapping[str, Any], member_names: Iterable[str]) -> None:
    """Raise ``ValueError`` unless media references and members match one to one.

    Checks: valid member names, extensions that suit the part type, every referenced member
    present, no member referenced twice, no member left unreferenced.
    """
    names = sorted(member_names)
    for name in names:
        if name == SAMPLE_MEMBER or not _MEMBER_PATTERN.match(name):
            raise ValueError(
                f"media member name {name!r} is invalid; expected '<name>.<ext>' with a name of "
                "letters, digits, '_' or '-' (not 'json')"
            )
    seen: set[str] = set()
    for part_type, member in media_references(sample):
        allowed = MEDIA_EXTENSIONS["image" if part_type == "video_frame" else part_type]
        if media_extension(member) not in allowed:
            raise ValueError(f"{part_type} member {member!r} has extension not in {allowed}")
        if member in seen:
            raise ValueError(f"media member {member!r} is referenced more than once; store one member per reference")
        if member not in names:
            raise ValueError(f"{part_type} member {member!r} is referenced but missing (sample members: {names})")
        seen.add(member)
    unreferenced = [name for name in names if name not in seen]
    if unreferenced:
        raise ValueError(f"media members {unreferenced} are not referenced by any content part; remove them")


def _message_lists(sample: Mapping[str, Any]) -> list[list[Any]]:
    schema = find_schema(sample.get("kind"))
    keys = schema.message_lists if schema is not None else ()
    return [sample[k] for k in keys if isinstance(sample.get(k), list)]


def _part_members(part: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    part_type = part["type"]
    value = part.get(part_type)
    if isinstance(value, str) and value:
        return [(part_type, value)]
    if part_type == "video" and isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return [("video_frame", frame) for frame in value]
    expected = "a member name or a non-empty list of frame member names" if part_type == "video" else "a member name"
    raise ValueError(f"{where}: {part_type} part needs {part_type!r} = {expected}, found {value!r:.80}")
