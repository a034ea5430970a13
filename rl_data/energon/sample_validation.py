"""Checks of a stored sample's content, with reason codes: every rejected row says which rule it
broke and where (the rules every task schema builds on; preprocess quarantines what they refuse).

A problem is raised as :class:`RowRejected` ``(reason, message)``; ``reason`` is one of
:data:`REASONS` or a code a task schema adds (:func:`known_reasons`). Message checks build on
:func:`rl_data.tokenization.validate_messages` (the loader's own rules); the checks before it only
give the common problems their own codes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl_data.energon.sample_format import is_media_part
from rl_data.fingerprint import brief
from rl_data.task_registry import sample_schemas, schema_for_kind
from rl_data.tokenization.validation import CHAT_ROLES, validate_messages

#: Reason code -> what it means. Summaries and ``dataset_info.json`` count rows per code.
REASONS: dict[str, str] = {
    "invalid_utf8": "the row's bytes are not valid UTF-8 (the message gives the byte offset in the file)",
    "invalid_json": "the row is not valid JSON, not a JSON object, or nested too deeply to parse",
    "invalid_unicode": "a string holds a lone UTF-16 surrogate (e.g. \\ud800), which is not text",
    "missing_field": "a field the schema needs is missing or has the wrong shape (e.g. a message without content)",
    "invalid_role": "a message has a missing or unknown role",
    "non_text_content": "a message content is not text or media parts (number, dict, bytes, image_url part, ...)",
    "empty_content": "a message content is empty or whitespace only",
    "no_assistant_turn": "the conversation has no assistant turn to train on",
    "invalid_message": "the message list breaks another chat rule (tool calls, ...)",
    "too_long": "the tokenized conversation is longer than max_tokens",
    "adapter_error": "the schema adapter raised an unexpected exception",
    "missing_media": "a media file a content part points to does not exist or cannot be read",
    "unreferenced_media": "an item of the row's media column is not taken by any content part",
    "bad_media": "media bytes cannot be decoded (truncated, corrupt, unknown format, bad base64)",
    "media_type_mismatch": "a media file's format does not suit its part type (e.g. a .wav as an image)",
    "invalid_media_part": "a media content part is malformed (two sources, wrong value type, ...)",
    "control_text": "message text holds a control token of the tokenizer (e.g. <|im_end|>); see --control-text",
    "transform_error": "an unexpected exception while transforming the row (the message names it)",
}
#: Reasons that filter rows by the job's own limits; the failed-rows budget does not count them.
FILTER_REASONS = frozenset({"too_long"})


class RowRejected(ValueError):
    """A row that cannot become a sample; ``reason`` is a key of :data:`REASONS`."""

    def __init__(self, reason: str, message: str):
        if reason not in REASONS and reason not in known_reasons():
            raise ValueError(f"unknown rejection reason {reason!r}; expected one of {sorted(known_reasons())}")
        super().__init__(message)
        self.reason = reason
        self.message = message


def validate_sample(sample: Mapping[str, Any], *, media: bool = False) -> None:
    """Raise :class:`RowRejected` for the first problem of an adapted sample of any task's kind.

    The sample's ``kind`` selects its task schema (:func:`rl_data.task_registry.schema_for_kind`). With
    ``media``, image/video/audio content parts are allowed (their sources are checked by
    preprocess); otherwise they are ``non_text_content``.
    """
    try:
        schema = schema_for_kind(sample.get("kind"))
    except ValueError as error:
        raise RowRejected("adapter_error", str(error)) from None
    schema.validate(sample, media)


def conversations_of(sample: Mapping[str, Any]) -> list[list[dict]]:
    """The conversations a sample is measured by (its task schema's; e.g. context + chosen / + rejected)."""
    return schema_for_kind(sample["kind"]).conversations(sample)


def known_reasons() -> dict[str, str]:
    """:data:`REASONS` plus the reason codes every registered task schema adds."""
    reasons = dict(REASONS)
    for schema in sample_schemas().values():
        reasons.update(schema.reasons)
    return reasons


def validate_conversation(messages: Any, *, where: str = "", media: bool = False, require_assistant: bool = True) -> None:
    """Raise :class:`RowRejected` for the first problem of one message list.

    Checks shape, roles, content type and emptiness, the chat rules of
    :func:`rl_data.tokenization.validate_messages` and, with ``require_assistant``, that there is an
    assistant turn to train on. ``where`` prefixes every message (e.g. ``"chosen: "``).
    """
    if not isinstance(messages, list) or not messages:
        raise RowRejected("missing_field", f"{where}messages must be a non-empty list, found {brief(messages)}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RowRejected("invalid_message", (
                f"{where}message {index} is a {type(message).__name__} ({brief(message)}); "
                "expected a dict with 'role' and 'content'"))
        if message.get("role") not in CHAT_ROLES:
            raise RowRejected(
                "invalid_role", f"{where}message {index}: role {message.get('role')!r} is not one of {list(CHAT_ROLES)}"
            )
        content = message.get("content")
        label = f"{where}message {index} ({message['role']})"
        if content is None and message.get("tool_calls"):
            continue
        if content is None:
            state = "is null" if "content" in message else "is missing"
            raise RowRejected("missing_field", f"{label}: 'content' {state}; expected text or content parts")
        if not _is_text(content, media):
            raise RowRejected("non_text_content", f"{label}: content must be text, found {brief(content)}")
        if not _text_of(content).strip() and not (media and any(is_media_part(p) for p in content)):
            raise RowRejected("empty_content", f"{label}: content is empty")
    try:
        validate_messages([text_view(message) for message in messages] if media else messages)
    except ValueError as error:
        raise RowRejected("invalid_message", f"{where}{error}") from None
    if require_assistant and not any(message["role"] == "assistant" for message in messages):
        roles = [message["role"] for message in messages]
        raise RowRejected("no_assistant_turn", f"{where}conversation has no assistant turn (roles {roles})")


def text_view(message: Any) -> Any:
    """The message with every media part replaced by an empty text part (text rules, token counts)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list) or not any(is_media_part(p) for p in content):
        return message
    return {**message, "content": [{"type": "text", "text": ""} if is_media_part(p) else p for p in content]}


def _is_text(content: Any, media: bool) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str))
        or (media and is_media_part(part))
        for part in content
    )


def _text_of(content: str | Sequence[Mapping[str, str]]) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p.get("type") == "text")


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None
