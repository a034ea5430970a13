"""Media in raw rows: load the files or bytes content parts point to and turn them into members.

A content part of type ``image``, ``video`` or ``audio`` takes its media from exactly one of:

1. **a path**: ``{"type": "image", "image": "photos/cat.jpg"}`` -- relative to the folder of the
   input file holding the row, absolute, or a URI pyarrow's filesystems open (``s3://...``); a
   video is an ``.mp4`` path or a list of frame image paths. The extension gives the format.
2. **bytes in the part**: ``{"type": "image", "image_bytes": "<base64>"}`` (``video_bytes``,
   ``audio_bytes``; a video may give a list of frame images). JSON rows hold base64 text; a
   Parquet ``binary`` field is taken as is. The format is recognised from the bytes' signature
   (jpg, png, webp, mp4, wav, flac).
3. **the row's media column** (TRL / HF datasets style): a part with neither, e.g.
   ``{"type": "image"}``, takes the next item of the row's ``images`` (``videos``, ``audios``)
   list. An item is a path, Parquet binary, or an HF datasets struct ``{"bytes", "path"}``.
   Every item must be taken by exactly one part.

:func:`resolve_media` loads them, names them ``<type>-<n>.<ext>`` (frames
``video-<n>-f<i>.<ext>``), rewrites each part to reference its member
(``{"type": "image", "image": "image-0.jpg"}``, see :mod:`rl_data.energon.sample_format`) and
decodes every member once, so a row whose media the loader could not read is quarantined here.
Problems are :class:`RowRejected` with ``missing_media``, ``unreferenced_media``, ``bad_media``,
``media_type_mismatch`` or ``invalid_media_part``.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Mapping
from typing import Any

from rl_data.energon.sample_format import MEDIA_EXTENSIONS, check_media_members, is_media_part
from rl_data.preprocess.validation import RowRejected
from rl_data.task_registry import schema_for_kind

#: Part type -> the row column whose items parts without a source take, in order.
MEDIA_COLUMNS = {"image": "images", "video": "videos", "audio": "audios"}


def resolve_media(sample: dict[str, Any], folder: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The sample with media parts rewritten to member names (media columns removed) and its members.

    ``folder`` is the folder (path or URI) relative media paths start from. A sample without
    media parts or columns comes back unchanged with no members.
    """
    resolver = _Resolver(folder, {t: _column(sample, name) for t, name in MEDIA_COLUMNS.items()})
    sample = {k: v for k, v in sample.items() if k not in MEDIA_COLUMNS.values()}
    for list_name in schema_for_kind(sample["kind"]).message_lists:
        if isinstance(sample.get(list_name), list):
            sample[list_name] = [resolver.message(m, f"{list_name}[{i}]") for i, m in enumerate(sample[list_name])]
    for part_type, items in resolver.columns.items():
        if items:
            raise RowRejected(
                "unreferenced_media",
                f"{len(items)} item(s) of the row's {MEDIA_COLUMNS[part_type]!r} column are not taken by "
                f"any {part_type} part; add a {{'type': '{part_type}'}} part per item or remove the items",
            )
    try:
        check_media_members(sample, resolver.members)
    except ValueError as error:
        raise RowRejected("invalid_media_part", str(error)) from None
    return sample, resolver.members


def check_part_decodable(part: Mapping[str, Any], members: dict[str, bytes], where: str) -> None:
    """``RowRejected`` ``bad_media`` unless every member of one rewritten media part decodes."""
    from rl_data.energon.multimodal.task_encoders.media import check_media_decodable

    try:
        check_media_decodable({"kind": "sft", "messages": [{"role": "user", "content": [part]}]}, members)
    except ValueError as error:
        raise RowRejected("bad_media", f"{where}: {error}") from None


def sniff_extension(data: bytes) -> str | None:
    """The media format of ``data`` from its leading signature, or None when unknown."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return "webp" if data[8:12] == b"WEBP" else "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[4:8] == b"ftyp":
        return "mp4"
    return None


def _column(sample: Mapping[str, Any], name: str) -> list[Any]:
    items = sample.get(name)
    if items is None:
        return []
    if not isinstance(items, list):
        raise RowRejected("invalid_media_part", f"media column {name!r} must be a list, found {type(items).__name__}")
    return list(items)


class _Resolver:
    """Loads the media parts of one sample in order, numbering members per part type."""

    def __init__(self, folder: str, columns: dict[str, list[Any]]):
        self.folder = folder
        self.columns = columns
        self.members: dict[str, bytes] = {}
        self.counts = dict.fromkeys(MEDIA_COLUMNS, 0)

    def message(self, message: Any, where: str) -> Any:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list) or not any(is_media_part(p) for p in content):
            return message
        parts = [self.part(p, f"{where} content part {i}") if is_media_part(p) else p for i, p in enumerate(content)]
        return {**message, "content": parts}

    def part(self, part: Mapping[str, Any], where: str) -> dict[str, Any]:
        part_type = part["type"]
        bytes_key = f"{part_type}_bytes"
        kind, value = self._source(part, where)
        number = self.counts[part_type]
        self.counts[part_type] += 1
        if part_type == "video" and isinstance(value, list):
            if not value:
                raise RowRejected("invalid_media_part", f"{where}: video frame list is empty")
            frames = [_load(kind, f, "video_frame", f"{where} frame {i}", self.folder) for i, f in enumerate(value)]
            loaded = {f"video-{number}-f{i}.{ext}": data for i, (ext, data) in enumerate(frames)}
            reference: Any = list(loaded)
        else:
            extension, data = _load(kind, value, part_type, where, self.folder)
            reference = f"{part_type}-{number}.{extension}"
            loaded = {reference: data}
        kept = {k: v for k, v in part.items() if k != bytes_key and v is not None}
        rewritten = {**kept, part_type: reference}
        label = value if kind == "path" and isinstance(value, str) else "frames" if isinstance(value, list) else kind
        check_part_decodable(rewritten, loaded, f"{where} ({label})")
        self.members.update(loaded)
        return rewritten

    def _source(self, part: Mapping[str, Any], where: str) -> tuple[str, Any]:
        """``("path", path or frame paths)`` or ``("bytes", data or frames)`` of one part."""
        part_type = part["type"]
        bytes_key = f"{part_type}_bytes"
        path, data = part.get(part_type), part.get(bytes_key)
        if path is not None and data is not None:
            raise RowRejected(
                "invalid_media_part", f"{where}: give either {part_type!r} (a path) or {bytes_key!r}, not both"
            )
        if path is not None:
            return "path", path
        if data is not None:
            return "bytes", data
        if not self.columns[part_type]:
            raise RowRejected(
                "missing_media",
                f"{where}: {part_type} part has no {part_type!r} path nor {bytes_key!r}, and the row's "
                f"{MEDIA_COLUMNS[part_type]!r} column has no item left for it",
            )
        return _column_item(self.columns[part_type].pop(0), where)


def _column_item(item: Any, where: str) -> tuple[str, Any]:
    """A media column item as ``("path", ...)`` or ``("bytes", ...)``."""
    if isinstance(item, (str, list)):
        return "path", item
    if isinstance(item, Mapping) and "__bytes__" in item:
        return "bytes", item
    if isinstance(item, Mapping) and (item.get("bytes") is not None or item.get("path") is not None):
        return ("bytes", item["bytes"]) if item.get("bytes") is not None else ("path", item["path"])
    raise RowRejected(
        "invalid_media_part",
        f"{where}: media column item {item!r:.80} is not a path, binary, or a {{'bytes', 'path'}} struct",
    )


def _load(kind: str, value: Any, part_type: str, where: str, folder: str) -> tuple[str, bytes]:
    """``(extension, bytes)`` of one media file given by path or bytes; checks the format suits ``part_type``."""
    allowed = MEDIA_EXTENSIONS["image" if part_type == "video_frame" else part_type]
    what = "video frame" if part_type == "video_frame" else part_type
    if kind == "path":
        if not isinstance(value, str) or not value:
            raise RowRejected(
                "invalid_media_part", f"{where}: {what} path must be a non-empty string, found {value!r:.80}"
            )
        extension = posixpath.splitext(value)[1].lstrip(".").lower()
        _check_extension(extension, allowed, what, f"{where} ({value})")
        return extension, _read(value, folder, where)
    data = _bytes_of(value, where)
    extension = sniff_extension(data)
    if extension is None:
        raise RowRejected(
            "bad_media",
            f"{where}: cannot tell the format of the {what} bytes (starting {data[:12]!r}); "
            f"expected one of {list(allowed)}",
        )
    _check_extension(extension, allowed, what, f"{where} (bytes)")
    return extension, data


def _check_extension(extension: str, allowed: tuple[str, ...], what: str, where: str) -> None:
    if extension not in allowed:
        raise RowRejected(
            "media_type_mismatch",
            f"{where}: a {what} must be one of {list(allowed)}, found {extension or 'no extension'!r}",
        )


def _bytes_of(value: Any, where: str) -> bytes:
    if isinstance(value, Mapping) and "__bytes__" in value:  # a Parquet binary value (see readers)
        value = value["__bytes__"]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise RowRejected(
            "invalid_media_part", f"{where}: media bytes must be base64 text, found {type(value).__name__}"
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise RowRejected("bad_media", f"{where}: media bytes are not valid base64: {error}") from None


def _read(path: str, folder: str, where: str) -> bytes:
    import pyarrow.fs as pafs

    uri = path if "://" in path else posixpath.join(folder, path)
    try:
        fs, fs_path = pafs.FileSystem.from_uri(uri)
        with fs.open_input_stream(fs_path) as stream:
            return stream.read()
    except (OSError, ValueError) as error:  # missing file, no permission, unknown scheme
        raise RowRejected("missing_media", f"{where}: cannot read {uri}: {error}") from None
