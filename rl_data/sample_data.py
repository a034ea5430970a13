"""Real chat data that ships in a package: the chitchat dataset (MIT, 7,168 conversations).

Each conversation is a list of turns by two speakers; a turn is one or more short
messages. The first speaker becomes ``user``, the other ``assistant``; consecutive turns of
the same speaker are joined with a newline, so roles alternate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def chitchat_conversations(limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield ``{"id": str, "messages": [{"role", "content"}, ...]}`` in the dataset's order.

    Conversations that do not contain both a user and an assistant turn are skipped.
    """
    import chitchat_dataset

    produced = 0
    for conversation_id, conversation in chitchat_dataset.Dataset().items():
        if limit is not None and produced >= limit:
            return
        messages = _to_messages(conversation["messages"])
        if len({m["role"] for m in messages}) < 2:
            continue
        yield {"id": conversation_id, "messages": messages}
        produced += 1


def _to_messages(turns: list[list[dict[str, Any]]]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    first_sender = None
    for turn in turns:
        text = "\n".join(m["text"].strip() for m in turn if m.get("text", "").strip())
        if not text:
            continue
        sender = turn[0]["sender"]
        first_sender = first_sender or sender
        role = "user" if sender == first_sender else "assistant"
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + text
        else:
            messages.append({"role": role, "content": text})
    return messages
