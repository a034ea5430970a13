"""Checks on OpenAI-style chat messages before they reach the chat template.

Every problem is a ``ValueError`` whose message starts with ``message <index> (<role>):`` (or
``message <index>:`` when the role itself is the problem) and says what was expected, so a bad
row in a large dataset can be found and fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHAT_ROLES = ("system", "user", "assistant", "tool")
_ROLES_TEXT = "one of 'system', 'user', 'assistant', 'tool'"
_CONTENT_TEXT = "a str or a list of {'type': 'text', 'text': str} parts"


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
