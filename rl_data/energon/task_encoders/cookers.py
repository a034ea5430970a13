"""Cookers: raw (crude) WebDataset samples -> canonical, validated chat samples.

A cooker runs inside Energon's pipeline (after the shuffle buffer, before ``encode_sample``)
and must be ``@stateless`` so a restored loader can rebuild in-flight samples. Decoding
happens here, not in Energon's decoder (the task encoders set ``decoder = None``), so an
invalid sample fails in a stage that knows its dataset, shard and index, and the loader's
error handler can name it.
"""

from __future__ import annotations

from typing import Any, Optional

from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from rl_data.energon.sample_format import decode_sample
from rl_data.task_registry import tasks_for_kind
from rl_data.tokenization.validation import validate_messages


def decode_record(raw: dict[str, Any], kind: str, *, reader: str) -> tuple[Any, dict[str, Any]]:
    """The sample key and decoded JSON record, which must be of ``kind`` (``ValueError`` if not)."""
    record = decode_sample(raw)
    key = raw.get("__key__")
    if record["kind"] != kind:

        raise ValueError(
            f"sample {key!r} is a {record['kind']!r} sample; {reader} reads only kind {kind!r} "
            f"(tasks that read {record['kind']!r} samples: {tasks_for_kind(record['kind'])})"
        )
    return key, record


def sft_messages(key: Any, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's non-empty ``messages`` list (``ValueError`` naming the sample otherwise)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"sample {key!r} has no messages (found {messages!r}); an SFT sample needs a "
            "non-empty 'messages' list"
        )
    return messages


@edataclass
class ChatSample(Sample):
    """One canonical SFT conversation, as stored in the dataset."""

    #: OpenAI-style messages (``role``, ``content``, optional ``tool_calls`` ...).
    messages: list[dict[str, Any]]
    #: Tool schemas offered to the model, or None.
    tools: Optional[list[dict[str, Any]]]
    #: Where the row came from (``{"file": ..., "row": ...}``); never affects encoding.
    source: dict[str, Any]
    #: Optional task name of the row.
    task_name: Optional[str]


class ChatCooker:
    """Cooks the canonical ``json`` member of a crude sample into a :class:`ChatSample`."""

    #: Bump when the cooked output for the same input changes (part of the loader identity).
    COMPONENT_VERSION = 1

    @staticmethod
    @stateless
    def cook(raw: dict[str, Any]) -> ChatSample:
        """Decode and validate one crude sample.

        Raises ``ValueError`` (or ``json.JSONDecodeError``) for invalid JSON, a non-SFT
        sample, empty messages or an unknown role, so the loader's error handler logs and
        skips it.
        """
        key, record = decode_record(raw, "sft", reader="the chat SFT cooker")
        messages = sft_messages(key, record)
        validate_messages(messages)
        return ChatSample(
            **basic_sample_keys(raw),
            messages=messages,
            tools=record.get("tools"),
            source=record.get("source") or {},
            task_name=record.get("task_name"),
        )
