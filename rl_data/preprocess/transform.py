"""The per-row stage of the job: raw row -> stable key + encoded sample, or a quarantine record.

:func:`transform_batch` is the Ray Data ``map_batches`` function (pure per row, so it runs on
any number of workers and its output does not depend on how rows are batched). Each output row
has ``file, row, key, accepted, kind, payload, media, num_tokens, reason, message, raw``; accepted
rows carry the encoded sample JSON (``payload``), its media members (``media``: ``[{name, data}]``,
loaded here by :func:`~rl_data.preprocess.media.resolve_media`, so media bytes travel in Ray Data
blocks) and its token length, rejected rows the reason code, the explanation and the raw row cut
to ``raw_chars`` characters.

Any exception while transforming a row quarantines that row: :class:`RowRejected` with its own
reason, a control token in the text (the tokenizer's special tokens) as ``control_text`` under
``control_text="reject"``, anything unexpected (a tokenizer ``TypeError``, a ``RecursionError``,
a bug in a user adapter's output) as ``transform_error`` naming the exception. The job's
failed-rows budget (``writer``) turns a systematic failure into one fatal error.

``content_hash`` (accepted rows) is a 64-bit digest of the canonical sample without its
``source`` plus its media bytes: equal hashes are duplicate rows, which the writer counts.

Token lengths count text only: media parts are measured as empty text, so the placeholder
tokens a multimodal processor inserts (their number depends on the loader's processor and
``TaskDataSpec`` media settings) are not included, and ``max_tokens`` bounds the text of a row.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa

from rl_data.energon.sample_format import SAMPLE_MEMBER, encode_sample
from rl_data.preprocess.adapters import Adapter
from rl_data.preprocess.media import resolve_media
from rl_data.preprocess.validation import RowRejected, conversations_of, parse_row, text_view, validate_sample
from rl_data.task_registry import get_task, sample_schemas
from rl_data.tokenization.tokenizer import load_tokenizer
from rl_data.tokenization.validation import ControlTextError

OUTPUT_SCHEMA = pa.schema([
    ("file", pa.string()), ("row", pa.int64()), ("key", pa.string()), ("accepted", pa.bool_()),
    ("kind", pa.string()), ("payload", pa.large_binary()),
    ("media", pa.list_(pa.struct([("name", pa.string()), ("data", pa.large_binary())]))), ("num_tokens", pa.int64()),
    ("reason", pa.string()), ("message", pa.string()), ("raw", pa.large_string()), ("content_hash", pa.int64()),
])


def sample_key(file: str, row: int) -> str:
    """``<16 hex of sha256(file)>-<row>``: WebDataset-safe, stable, unique per (file, row).

    Distinct files get distinct prefixes (the job checks this), so keys never collide.
    """
    return f"{file_key_prefix(file)}-{row:09d}"


def file_key_prefix(file: str) -> str:
    """The key prefix of one input file name."""
    return hashlib.sha256(file.encode("utf-8")).hexdigest()[:16]


def token_length(sample: dict[str, Any], tokenizer: Any, control_text: str = "reject") -> int:
    """Tokens of the longest conversation of ``sample``, as the loader formats its text (media
    parts count as empty text, see the module docstring)."""
    from rl_data.tokenization.chat import get_formatted_message_log

    return max(
        sum(len(turn["token_ids"]) for turn in get_formatted_message_log(
            [text_view(m) for m in messages], tokenizer, tools=sample.get("tools"), control_text=control_text))
        for messages in conversations_of(sample)
    )


def content_hash(sample: dict[str, Any], media: dict[str, bytes]) -> int:
    """A signed 64-bit digest of the sample's canonical JSON (without ``source``) and its media."""
    digest = hashlib.sha256(json.dumps({k: v for k, v in sample.items() if k != "source"}, ensure_ascii=False,
                                       sort_keys=True, separators=(",", ":")).encode("utf-8"))
    for name, data in sorted(media.items()):
        digest.update(b"\0" + name.encode("utf-8") + b"\0" + data)
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


def transform_batch(
    batch: pa.Table, *, adapter: Adapter, tokenizer: str, max_tokens: int | None, raw_chars: int,
    folders: dict[str, str], control_text: str = "reject", task: str | None = None,
) -> pa.Table:
    """Adapt, validate, load media, measure and encode every row of a ``readers.ROW_SCHEMA`` batch.

    ``folders`` maps each input file name to its folder (path or URI), where relative media
    paths of its rows start. With ``task``, a row the adapter turns into another kind than the
    task stores is rejected (``adapter_error``).
    """
    tok = load_tokenizer(tokenizer)
    kind = get_task(task).schema.kind if task is not None else None
    columns: dict[str, list] = {name: [] for name in OUTPUT_SCHEMA.names}
    rows = zip(batch["file"].to_pylist(), batch["row"].to_pylist(), batch["raw"].to_pylist(),
               batch["utf8_error"].to_pylist())
    for file, row, raw, utf8_error in rows:
        out = {"file": file, "row": row, "key": sample_key(file, row), "accepted": False, "kind": "",
               "payload": b"", "media": [], "num_tokens": -1, "reason": "", "message": "", "raw": "",
               "content_hash": 0}
        try:
            out.update(_transform_row(raw, utf8_error, file, row, tok, max_tokens, folders[file], adapter, control_text,
                                      kind))
        except RowRejected as rejected:
            out.update(reason=rejected.reason, message=rejected.message, raw=raw[:raw_chars])
        except Exception as error:  # noqa: BLE001 - one bad row must not end the job
            out.update(reason="transform_error", message=_describe(error), raw=raw[:raw_chars])
        for name, value in out.items():
            columns[name].append(value)
    return pa.Table.from_pydict(columns, schema=OUTPUT_SCHEMA)


def _transform_row(raw, utf8_error, file, row, tok, max_tokens, folder, adapter, control_text, kind) -> dict[str, Any]:
    if utf8_error:
        raise RowRejected("invalid_utf8", utf8_error)
    sample = _adapt(adapter, parse_row(raw))
    if kind is not None and sample["kind"] != kind:
        raise RowRejected("adapter_error", f"the adapter wrote a {sample['kind']!r} sample but the task stores "
                                           f"{kind!r} samples; choose an adapter of the task (--adapter)")
    validate_sample(sample, media=True)
    num_tokens = _measure(sample, tok, control_text)
    if max_tokens is not None and num_tokens > max_tokens:
        raise RowRejected("too_long", f"{num_tokens} tokens > max_tokens={max_tokens}")
    sample, media = resolve_media(sample, folder)
    sample["source"] = {"file": file, "row": row}
    members = encode_sample(sample, media)
    return {"accepted": True, "kind": sample["kind"], "num_tokens": num_tokens, "payload": members.pop(SAMPLE_MEMBER),
            "media": [{"name": name, "data": data} for name, data in sorted(members.items())],
            "content_hash": content_hash(sample, members)}


def _describe(error: BaseException) -> str:
    """``"TypeError: message"`` on one line, cut to 300 characters."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def _adapt(adapt: Any, row: dict[str, Any]) -> dict[str, Any]:
    try:
        sample = adapt(row)
    except RowRejected:
        raise
    except Exception as error:  # a user adapter's bug is reported per row, not fatal
        raise RowRejected("adapter_error", f"{type(error).__name__}: {error}") from None
    kinds = sorted(sample_schemas())
    if not isinstance(sample, dict) or sample.get("kind") not in kinds:
        raise RowRejected("adapter_error", f"adapter returned {sample!r:.80}; expected a dict with a 'kind' of {kinds}")
    return sample


def _measure(sample: dict[str, Any], tok: Any, control_text: str) -> int:
    try:
        return token_length(sample, tok, control_text)
    except ControlTextError as error:
        raise RowRejected("control_text", str(error)) from None
    except ValueError as error:  # the chat formatting's own checks
        raise RowRejected("invalid_message", f"cannot format the conversation: {error}") from None
