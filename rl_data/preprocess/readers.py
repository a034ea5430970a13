"""Find the input files and stream their rows, with source file and row number, through Ray Data.

Inputs are local paths, directories, globs or any URI pyarrow's filesystems understand
(``s3://``, ``gs://``, ``hdfs://``, ...; globs on URIs go through fsspec). Every row comes out
as ``{"file": <name relative to the input root>, "row": <0-based index in the file>, "raw":
<the row as JSON text>}``; rows are *not* parsed here, so a malformed line becomes a quarantined
row later instead of failing the read. ``row`` is the 0-based line index for JSONL (blank
lines are skipped but counted), the 0-based element index for a JSON array and the 0-based
row index for Parquet.

One read task per file streams blocks of at most ``rows_per_block`` rows and about
``block_bytes`` of row text (bounded memory for JSONL and Parquet of any size, also with media
bytes inline; a JSON array file is parsed whole, so use JSONL for huge files). Parquet
``binary`` values become ``{"__bytes__": <base64>, "size": n}`` so media bytes survive the JSON
row text (see ``preprocess.media``). Read
tasks run wherever Ray schedules them: on a cluster, inputs must be readable from every node.

Text is decoded as strict UTF-8; a leading UTF-8 byte order mark is dropped. A JSONL line that
is not valid UTF-8 still becomes a row (its text with U+FFFD replacements) whose ``utf8_error``
names the first bad byte and its byte offset in the file, so the row is quarantined as
``invalid_utf8`` instead of being accepted with altered text.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import glob as globlib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

InputFormat = Literal["jsonl", "json", "parquet"]
_EXTENSIONS: dict[str, InputFormat] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet",
}
_GLOB_CHARS = set("*?[")
ROW_SCHEMA = pa.schema([
    ("file", pa.string()), ("row", pa.int64()), ("raw", pa.large_string()), ("utf8_error", pa.string()),
])
_BOM = b"\xef\xbb\xbf"
#: Default cut of a read block by size: rows carrying media bytes make big blocks otherwise.
BLOCK_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input file: where to open it, its stable name (relative to the input root), its format."""

    uri: str
    name: str
    format: InputFormat


def resolve_inputs(patterns: Sequence[str], input_format: InputFormat | Literal["auto"] = "auto") -> list[InputFile]:
    """Expand paths, directories and globs into a sorted, duplicate-free list of input files.

    Names are relative to the deepest folder common to all files (just the file name for one
    file), so the same inputs get the same names wherever they are mounted.
    """
    uris: list[str] = []
    for pattern in patterns:
        found = _expand(pattern)
        if not found:
            raise FileNotFoundError(f"input {pattern!r} matches no file; check the path or glob")
        uris.extend(found)
    uris = sorted(set(uris))
    root = _common_folder(uris)
    files = []
    for uri in uris:
        name = uri[len(root):].lstrip("/") if root else uri
        files.append(InputFile(uri=uri, name=name, format=_format_of(uri, input_format)))
    return files


def stream_file_rows(
    file: InputFile, rows_per_block: int = 1024, block_bytes: int = BLOCK_BYTES
) -> Iterator[pa.Table]:
    """Yield ``ROW_SCHEMA`` tables of ``file``'s rows in file order, each of at most
    ``rows_per_block`` rows and cut once its row text reaches ``block_bytes`` characters."""
    fs, path = pafs.FileSystem.from_uri(file.uri)
    rows: list[tuple[int, str, str]] = []
    size = 0
    for row, raw, utf8_error in _raw_rows(fs, path, file.format):
        rows.append((row, raw, utf8_error))
        size += len(raw)
        if len(rows) == rows_per_block or size >= block_bytes:
            yield _table(file.name, rows)
            rows, size = [], 0
    if rows:
        yield _table(file.name, rows)


def read_rows_batch(batch: dict[str, Any], rows_per_block: int, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """Ray Data ``map_batches`` generator: one batch of ``InputFile`` fields -> row tables."""
    for uri, name, fmt in zip(batch["uri"], batch["name"], batch["format"]):
        file = InputFile(uri=str(uri), name=str(name), format=str(fmt))
        yield from stream_file_rows(file, rows_per_block, block_bytes)


def file_folder(file: InputFile) -> str:
    """The folder (path or URI) holding ``file``: where its rows' relative media paths start."""
    return (file.uri.rsplit("/", 1)[0] or "/") if "/" in file.uri else "."


def peek_rows(files: Sequence[InputFile], limit: int) -> list[tuple[InputFile, int, str]]:
    """The first ``limit`` raw rows across ``files`` (for schema detection), without Ray."""
    found: list[tuple[InputFile, int, str]] = []
    for file in files:
        for table in stream_file_rows(file, rows_per_block=limit):
            for row, raw in zip(table["row"].to_pylist(), table["raw"].to_pylist()):
                found.append((file, row, raw))
                if len(found) >= limit:
                    return found
    return found


def file_identity(file: InputFile) -> dict[str, Any]:
    """``{path, name, size, mtime_ns, sha256}`` of an input file (streams the whole file)."""
    fs, path = pafs.FileSystem.from_uri(file.uri)
    info = fs.get_file_info(path)
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return {"path": file.uri, "name": file.name, "size": info.size, "mtime_ns": info.mtime_ns,
            "sha256": digest.hexdigest()}


def _expand(pattern: str) -> list[str]:
    is_uri = "://" in pattern
    if not is_uri:
        pattern = os.path.abspath(os.path.expanduser(pattern))
    if _GLOB_CHARS & set(pattern):
        if not is_uri:
            return [p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p)]
        import fsspec

        fs, _, paths = fsspec.get_fs_token_paths(pattern)
        protocol = pattern.split("://", 1)[0]
        return [f"{protocol}://{p}" for p in paths if fs.isfile(p)]
    fs, path = pafs.FileSystem.from_uri(pattern)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [pattern]
    if info.type == pafs.FileType.Directory:
        selector = pafs.FileSelector(path, recursive=True)
        prefix = pattern[: len(pattern) - len(path)] if is_uri else ""
        return [prefix + i.path for i in fs.get_file_info(selector)
                if i.type == pafs.FileType.File and os.path.splitext(i.path)[1].lower() in _EXTENSIONS]
    return []


def _common_folder(uris: Sequence[str]) -> str:
    if len(uris) == 1:
        return uris[0].rsplit("/", 1)[0] + "/" if "/" in uris[0] else ""
    folder = os.path.commonprefix(list(uris))
    return folder[: folder.rfind("/") + 1]


def _format_of(uri: str, input_format: str) -> InputFormat:
    if input_format != "auto":
        return input_format  # type: ignore[return-value]
    extension = os.path.splitext(uri)[1].lower()
    if extension not in _EXTENSIONS:
        raise ValueError(
            f"cannot tell the format of {uri!r} from its extension {extension!r}; expected one of "
            f"{sorted(_EXTENSIONS)} or pass input_format='jsonl'|'json'|'parquet'"
        )
    return _EXTENSIONS[extension]


def _raw_rows(fs: pafs.FileSystem, path: str, fmt: str) -> Iterator[tuple[int, str, str]]:
    """``(row, raw text, utf8_error)`` of every row; ``utf8_error`` is "" for valid text."""
    if fmt == "parquet":
        with fs.open_input_file(path) as f:
            row = 0
            for record_batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
                for record in record_batch.to_pylist():
                    yield row, json.dumps(record, ensure_ascii=False, default=_json_default), ""
                    row += 1
        return
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            data = stream.read()
            if data.removeprefix(_BOM).lstrip()[:1] == b"[":
                yield from _json_array_rows(path, data)
                return
            lines = _offset_lines(data.splitlines(keepends=True))  # a .json file holding JSON lines
        else:
            lines = _offset_lines(_lines(stream))
        for row, (offset, line) in enumerate(lines):
            if row == 0 and line.startswith(_BOM):
                line, offset = line[len(_BOM):], offset + len(_BOM)
            text, utf8_error = _decode_line(line, offset, row)
            if text.strip():
                yield row, text.strip(), utf8_error


def _decode_line(line: bytes, offset: int, row: int) -> tuple[str, str]:
    try:
        return line.decode("utf-8"), ""
    except UnicodeDecodeError as error:
        return line.decode("utf-8", errors="replace"), (
            f"invalid UTF-8 byte 0x{line[error.start]:02x} at byte offset {offset + error.start} of the file "
            f"(byte {error.start} of line {row + 1}); re-encode the file as UTF-8 or fix the line"
        )


def _json_array_rows(path: str, data: bytes) -> Iterator[tuple[int, str, str]]:
    """The elements of a JSON array file; with invalid UTF-8, the elements holding it get ``utf8_error``."""
    utf8_error = ""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        utf8_error = (f"invalid UTF-8 in this element (the file's first invalid byte 0x{data[error.start]:02x} "
                      f"is at byte offset {error.start}); re-encode the file as UTF-8 or fix the element")
        text = data.removeprefix(_BOM).decode("utf-8", errors="surrogateescape")
    try:
        records = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(
            f"{path} looks like a JSON array but does not parse ({error}); fix the "
            "file or convert it to JSON lines (one object per line)"
        ) from None
    for row, record in enumerate(records):
        raw = json.dumps(record, ensure_ascii=False)
        if utf8_error and _ESCAPED_BYTE.search(raw):
            yield row, raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), utf8_error
            continue
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape: keep it escaped
            raw = json.dumps(record)
        yield row, raw, ""


#: A byte that is not UTF-8, as ``surrogateescape`` decodes it.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def _lines(stream: Any) -> Iterator[bytes]:
    """The lines of a byte stream, each with its ``\\n``."""
    pending = b""
    while block := stream.read(1 << 20):
        pending += block
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line + b"\n"
    if pending:
        yield pending


def _offset_lines(lines: Iterator[bytes] | list[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(byte offset of the line in the file, line without its end of line)``."""
    offset = 0
    for line in lines:
        yield offset, line.rstrip(b"\r\n")
        offset += len(line)


def _json_default(value: Any) -> Any:
    """Parquet values JSON cannot hold: bytes stay visibly non-text (full base64, media may use
    them), dates become ISO strings."""
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode(), "size": len(value)}
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    raise TypeError(f"cannot represent {type(value).__name__} from Parquet as JSON")


def _table(name: str, rows: list[tuple[int, str, str]]) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array([name] * len(rows), pa.string()), pa.array([r for r, _, _ in rows], pa.int64()),
         pa.array([raw for _, raw, _ in rows], pa.large_string()), pa.array([e for _, _, e in rows], pa.string())],
        schema=ROW_SCHEMA,
    )
