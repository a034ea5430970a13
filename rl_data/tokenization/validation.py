"""Checks on OpenAI-style chat messages before they reach the chat template.

Every problem is a ``ValueError`` whose message starts with ``message <index> (<role>):`` (or
``message <index>:`` when the role itself is the problem) and says what was expected, so a bad
row in a large dataset can be found and fixed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from rl_data.tokenization.tokenizer_cache import PerTokenizer

CHAT_ROLES = ("system", "user", "assistant", "tool")
_ROLES_TEXT = "one of 'system', 'user', 'assistant', 'tool'"
_CONTENT_TEXT = "a str or a list of {'type': 'text', 'text': str} parts"
# Roles whose plain-text messages (str content, no tool calls) need no check beyond that.
_PLAIN_TEXT_ROLES = ("system", "user", "assistant")  # a tuple: an unhashable role must not raise here


def validate_messages(messages: Any) -> None:
    """Raise ``ValueError`` naming the message index and the expectation for the first bad message.

    Checks: a non-empty list of dicts; ``role`` present and one of system/user/assistant/tool;
    ``content`` present and a str or a list of text parts (an assistant message with
    ``tool_calls`` may omit it or set it to None); only assistants carry ``tool_calls``, each
    with a function name and dict-or-JSON-string arguments; a ``tool`` message answers a tool
    call made by an earlier assistant message (its ``tool_call_id``, when given, must be one
    of the ids issued so far).
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"conversation must be a list of message dicts, found {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError("conversation is empty: expected at least one message")
    issued_call_ids: list[str] = []
    calls_made = 0
    for index, message in enumerate(messages):
        if (
            type(message) is dict
            and message.get("role") in _PLAIN_TEXT_ROLES
            and type(message.get("content")) is str
            and message.get("tool_calls") is None
        ):
            continue  # the common case, ~5x faster than the checks below (which it passes)
        role = _check_role(index, message)
        where = f"message {index} ({role})"
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise ValueError(f"{where}: only assistant messages may carry 'tool_calls'")
            issued_call_ids.extend(_check_tool_calls(where, tool_calls))
            calls_made += len(tool_calls)
        content_optional = role == "assistant" and bool(tool_calls)
        if "content" not in message and not content_optional:
            raise ValueError(f"{where}: missing key 'content'; expected {_CONTENT_TEXT}")
        content = message.get("content")
        if not (content is None and content_optional):
            _check_content(where, content)
        if role == "tool":
            _check_tool_answer(where, message, issued_call_ids, calls_made)


def _check_role(index: int, message: Any) -> str:
    if not isinstance(message, Mapping):
        raise ValueError(
            f"message {index}: expected a dict with 'role' and 'content', found {type(message).__name__}"
        )
    if "role" not in message:
        raise ValueError(f"message {index}: missing key 'role'; expected {_ROLES_TEXT}")
    role = message["role"]
    if role not in CHAT_ROLES:
        raise ValueError(f"message {index}: unknown role {role!r}; expected {_ROLES_TEXT}")
    return role


def _check_content(where: str, content: Any) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be {_CONTENT_TEXT}, found {type(content).__name__}")
    for part_index, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ValueError(
                f"{where}: content part {part_index} must be a dict like {{'type': 'text', 'text': str}}, "
                f"found {type(part).__name__}"
            )
        if part.get("type") != "text":
            raise ValueError(
                f"{where}: content part {part_index} has unknown type {part.get('type')!r}; "
                "expected 'text' (only text parts are supported)"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(
                f"{where}: content part {part_index} needs a str 'text', found {type(part.get('text')).__name__}"
            )


def _check_tool_calls(where: str, tool_calls: Any) -> list[str]:
    """Validate an assistant's tool calls and return the ids they issue."""
    if not isinstance(tool_calls, list) or not all(isinstance(call, Mapping) for call in tool_calls):
        raise ValueError(f"{where}: 'tool_calls' must be a list of dicts, found {tool_calls!r:.80}")
    call_ids = []
    for call_index, call in enumerate(tool_calls):
        function = call.get("function", call)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"{where}: tool call {call_index} has no function name; "
                "expected {'function': {'name': str, 'arguments': dict or JSON str}}"
            )
        arguments = function.get("arguments", {})
        if not isinstance(arguments, (Mapping, str)):
            raise ValueError(
                f"{where}: tool call {call_index} arguments must be a dict or a JSON string, "
                f"found {type(arguments).__name__}"
            )
        if call.get("id") is not None:
            call_ids.append(call["id"])
    return call_ids


def _check_tool_answer(where: str, message: Mapping, issued_call_ids: list[str], calls_made: int) -> None:
    if calls_made == 0:
        raise ValueError(
            f"{where}: no earlier assistant message made a tool call; "
            "expected a tool message to answer an earlier assistant 'tool_calls' entry"
        )
    call_id = message.get("tool_call_id")
    if call_id is not None and call_id not in issued_call_ids:
        raise ValueError(
            f"{where}: tool_call_id {call_id!r} was not issued by an earlier assistant tool call; "
            f"expected one of {issued_call_ids}"
        )


#: What to do with message text that contains a control token of the tokenizer (see
#: :func:`find_control_text`): ``"reject"`` the conversation, or encode it as ``"plain_text"``.
CONTROL_TEXT_POLICIES = ("reject", "plain_text")


class ControlTextError(ValueError):
    """Message text holds a control token of the tokenizer: encoded as is it would forge structure."""


class TrustedText(str):
    """Text the pipeline itself puts into messages (a processor's media placeholder), whose
    control tokens are meant: never checked or hidden. Data decoded from JSON is a plain ``str``."""


_PATTERNS: PerTokenizer[re.Pattern[str] | None] = PerTokenizer()


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's control text: the content of every special token (added tokens marked
    ``special`` and ``all_special_tokens``), longest first.

    These are exactly the tokens ``split_special_tokens=True`` encodes as plain text; the
    tokenizer's non-special added tokens (Qwen's ``<think>``, ``<tool_call>``, ...) are content
    markup a model writes itself and are not control text.
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tokens = {added.content for added in decoder.values() if added.special}
    tokens.update(getattr(tokenizer, "all_special_tokens", ()) or ())
    return tuple(sorted((t for t in tokens if t), key=lambda t: (-len(t), t)))


def control_text_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex matching any control token of ``tokenizer`` (None when it has none).

    Cached per tokenizer object until its size or special tokens change.
    """
    try:
        size = len(tokenizer)
    except TypeError:  # a wrapper without len(): its added tokens decide
        size = len(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    version = (size, tuple(getattr(tokenizer, "all_special_tokens", ()) or ()))

    def compile_pattern() -> re.Pattern[str] | None:
        tokens = control_tokens(tokenizer)
        return _compile_alternatives(tokens) if tokens else None

    return _PATTERNS.get(tokenizer, version, compile_pattern)


def find_control_text(
    messages: Sequence[Mapping[str, Any]], tools: Any, tokenizer: Any
) -> tuple[str, str] | None:
    """``(where, token)`` of the first control token inside message or tool text, else None.

    Every string of the messages (content, text parts, tool calls, any other field a template
    may render) and of ``tools`` is searched, including dict keys.
    """
    pattern = control_text_pattern(tokenizer)
    if pattern is None or not _may_contain(pattern, messages, tools):
        return None
    for index, message in enumerate(messages):
        role = message.get("role", "?") if isinstance(message, Mapping) else "?"
        found = _search(pattern, message, "")
        if found is not None:
            return f"message {index} ({role}) {found[0].lstrip('.') or 'text'}", found[1]
    found = _search(pattern, tools, "") if tools else None
    return (f"tools{found[0]}", found[1]) if found is not None else None


def control_text_error(where: str, token: str) -> ControlTextError:
    """The error for control text found at ``where`` (what, why, and the two ways out)."""
    return ControlTextError(
        f"{where} contains the tokenizer control token {token!r}; encoded as is it becomes a special "
        "token id (e.g. a forged turn). Remove it from the data, or set control_text='plain_text' "
        "to encode such text as plain text"
    )


@lru_cache(maxsize=64)
def _compile_alternatives(tokens: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(token) for token in tokens))


def _may_contain(pattern: re.Pattern[str], messages: Sequence[Any], tools: Any) -> bool:
    """A one-search prefilter: False only when no string of the messages can hold a match.

    For the common shape (messages whose keys and values are all strings, no tools) the
    strings are joined with NUL, which no control token contains, so a token cannot span two
    of them; any other shape goes to the walk.
    """
    if tools or "\0" in pattern.pattern:
        return True
    join = "\0".join
    try:
        text = join(map(join, messages)) + "\0" + join([join(message.values()) for message in messages])
    except (TypeError, AttributeError):
        return True
    return pattern.search(text) is not None


def _search(pattern: re.Pattern[str], value: Any, path: str) -> tuple[str, str] | None:
    if isinstance(value, TrustedText):
        return None
    if isinstance(value, str):
        match = pattern.search(value)
        return (path, match.group()) if match else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key!r}]"
            found = _search(pattern, key, where) or _search(pattern, item, where)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _search(pattern, item, f"{path}[{index}]")
            if found is not None:
                return found
    return None
