"""The per-row stage of the job: raw row -> stable key + encoded sample, or a quarantine record.

:func:`transform_batch` is the Ray Data ``map_batches`` function (pure per row, so it runs on
any number of workers and its output does not depend on how rows are batched). Each output row
has ``file, row, key, accepted, kind, payload, media, num_tokens, reason, message, raw``; accepted
rows carry the encoded sample JSON (``payload``), its media members (``media``: ``[{name, data}]``,
loaded here by :func:`~rl_data.preprocess.media.resolve_media`, so media bytes travel in Ray Data
blocks) and its token length, rejected rows the reason code, the explanation and the raw row cut
to ``raw_chars`` characters.

Token lengths count text only: media parts are measured as empty text, so the placeholder
tokens a multimodal processor inserts (their number depends on the loader's processor and
``TaskDataSpec`` media settings) are not included, and ``max_tokens`` bounds the text of a row.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

import pyarrow as pa

from rl_data.energon.sample_format import SAMPLE_MEMBER, encode_sample
from rl_data.preprocess.adapters import Adapter
from rl_data.preprocess.media import resolve_media
from rl_data.preprocess.validation import RowRejected, conversations_of, parse_row, text_view, validate_sample

OUTPUT_SCHEMA = pa.schema([
    ("file", pa.string()), ("row", pa.int64()), ("key", pa.string()), ("accepted", pa.bool_()),
    ("kind", pa.string()), ("payload", pa.large_binary()),
    ("media", pa.list_(pa.struct([("name", pa.string()), ("data", pa.large_binary())]))), ("num_tokens", pa.int64()),
    ("reason", pa.string()), ("message", pa.string()), ("raw", pa.large_string()),
])


def sample_key(file: str, row: int) -> str:
    """``<16 hex of sha256(file)>-<row>``: WebDataset-safe, stable, unique per (file, row).

    Distinct files get distinct prefixes (the job checks this), so keys never collide.
    """
    return f"{file_key_prefix(file)}-{row:09d}"


def file_key_prefix(file: str) -> str:
    """The key prefix of one input file name."""
    return hashlib.sha256(file.encode("utf-8")).hexdigest()[:16]


@lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Any:
    """``"qwen3"`` (the project tokenizer, built offline) or a local tokenizer folder; cached per process."""
    if name == "qwen3":
        from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

        return load_qwen3_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def token_length(sample: dict[str, Any], tokenizer: Any) -> int:
    """Tokens of the longest conversation of ``sample``, as the loader formats its text (media
    parts count as empty text, see the module docstring)."""
    from rl_data.tokenization.chat import get_formatted_message_log

    return max(
        sum(len(turn["token_ids"]) for turn in get_formatted_message_log(
            [text_view(m) for m in messages], tokenizer, tools=sample.get("tools")))
        for messages in conversations_of(sample)
    )


def transform_batch(
    batch: pa.Table, *, adapter: Adapter, tokenizer: str, max_tokens: int | None, raw_chars: int,
    folders: dict[str, str],
) -> pa.Table:
    """Adapt, validate, load media, measure and encode every row of a ``readers.ROW_SCHEMA`` batch.

    ``folders`` maps each input file name to its folder (path or URI), where relative media
    paths of its rows start.
    """
    tok = load_tokenizer(tokenizer)
    columns: dict[str, list] = {name: [] for name in OUTPUT_SCHEMA.names}
    for file, row, raw in zip(batch["file"].to_pylist(), batch["row"].to_pylist(), batch["raw"].to_pylist()):
        out = {"file": file, "row": row, "key": sample_key(file, row), "accepted": False, "kind": "",
               "payload": b"", "media": [], "num_tokens": -1, "reason": "", "message": "", "raw": ""}
        try:
            sample = _adapt(adapter, parse_row(raw))
            validate_sample(sample, media=True)
            out["num_tokens"] = _measure(sample, tok)
            if max_tokens is not None and out["num_tokens"] > max_tokens:
                raise RowRejected("too_long", f"{out['num_tokens']} tokens > max_tokens={max_tokens}")
            sample, media = resolve_media(sample, folders[file])
            sample["source"] = {"file": file, "row": row}
            members = encode_sample(sample, media)
            out.update(accepted=True, kind=sample["kind"], payload=members.pop(SAMPLE_MEMBER),
                       media=[{"name": name, "data": data} for name, data in sorted(members.items())])
        except RowRejected as rejected:
            out.update(reason=rejected.reason, message=rejected.message, raw=raw[:raw_chars])
        for name, value in out.items():
            columns[name].append(value)
    return pa.Table.from_pydict(columns, schema=OUTPUT_SCHEMA)


def _adapt(adapt: Any, row: dict[str, Any]) -> dict[str, Any]:
    try:
        sample = adapt(row)
    except RowRejected:
        raise
    except Exception as error:  # a user adapter's bug is reported per row, not fatal
        raise RowRejected("adapter_error", f"{type(error).__name__}: {error}") from None
    if not isinstance(sample, dict) or sample.get("kind") not in ("sft", "preference"):
        raise RowRejected(
            "adapter_error", f"adapter returned {sample!r:.80}; expected a dict with kind 'sft' or 'preference'"
        )
    return sample


def _measure(sample: dict[str, Any], tok: Any) -> int:
    try:
        return token_length(sample, tok)
    except ValueError as error:  # the chat formatting's own checks
        raise RowRejected("invalid_message", f"cannot format the conversation: {error}") from None
