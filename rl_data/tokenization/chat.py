"""Chat messages -> ``message_log``: per-turn slices of the chat-template text and their token ids.

Definition (NeMo-RL's ``get_formatted_message_log``): turn ``i`` is what rendering the template
over ``messages[:i + 1]`` adds to the render of ``messages[:i]`` (both renders with the
generation prompt when their last turn is a user/tool turn and ``add_generation_prompt``),
measured from the first character where the two renders differ. The first turn gets the
tokenizer's BOS when it has one and the turn does not start with it; the last turn loses its
trailing newlines and gets EOS when it does not already end with it.

:func:`get_formatted_message_log_reference` computes exactly that, one render per prefix
(quadratic in turns). :func:`get_formatted_message_log` renders once (with
:func:`~rl_data.tokenization.chat_template.render_chatml`, the template as plain Python) and
splits the text at the turn ends, which is valid for this project's prefix-stable ChatML
template (see :mod:`rl_data.tokenization.chat_template`); for any other template, or when a
message's text contains the template's turn delimiter, it falls back to the reference.

It also tokenizes the whole text in one call and splits the ids where each turn starts with
``<|im_start|>``: an added special token is cut out of the text before pre-tokenization, so
the ids on either side of it are exactly the ids of the pieces encoded apart. Where a turn
does not start with it (after a mid-conversation generation prompt), each turn is encoded
apart. Tests prove both paths identical to the reference on thousands of real and synthetic
conversations.

**Control text.** Message or tool text holding a control token of the tokenizer (any special
token, e.g. ``<|im_end|>``; see :func:`~rl_data.tokenization.validation.control_tokens`) would
encode to that token's id, so data could forge turns. ``control_text="reject"`` (default)
raises :class:`~rl_data.tokenization.validation.ControlTextError`; ``"plain_text"`` encodes
such text as ordinary text: the control tokens in the data are hidden behind markers while the
template renders, the render is cut at the template's own control tokens (their ids), and
every piece between them is encoded with ``split_special_tokens`` after the markers are put
back, so no special id comes from the data. Conversations without control text never take
that path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rl_data.tokenization.chat_template import (
    CHATML_TEMPLATE,
    GENERATION_PROMPT,
    TURN_END,
    TURN_START,
    render_chatml,
)
from rl_data.tokenization.validation import (
    CONTROL_TEXT_POLICIES,
    TrustedText,
    control_text_error,
    control_text_pattern,
    find_control_text,
    validate_messages,
)

if TYPE_CHECKING:
    from rl_data.interfaces import LLMMessageLogType, TaskDataSpec, TokenizerType

__all__ = [
    "apply_task_data_spec",
    "get_formatted_message_log",
    "get_formatted_message_log_reference",
    "validate_messages",
]

# Turns after which ``add_generation_prompt`` appends the assistant header.
GENERATION_PROMPT_ROLES = ("user", "tool")
_TURN_END_PATTERN = re.compile(re.escape(TURN_END))


def apply_task_data_spec(messages: Sequence[dict], task_data_spec: TaskDataSpec | None) -> list[dict]:
    """Copy ``messages``, format the first user turn with ``spec.prompt`` and prepend ``spec.system_prompt``.

    ``prompt`` is applied with ``str.format`` to the text (each text part of list content);
    ``system_prompt`` becomes a leading system message unless one is already there.
    """
    conversation = [dict(message) for message in messages]
    prompt = getattr(task_data_spec, "prompt", None)
    system_prompt = getattr(task_data_spec, "system_prompt", None)
    if prompt:
        first_user = next((i for i, m in enumerate(conversation) if m["role"] == "user"), None)
        if first_user is not None:
            conversation[first_user]["content"] = _format_prompt(prompt, conversation[first_user]["content"])
    if system_prompt and conversation[0]["role"] != "system":
        conversation.insert(0, {"role": "system", "content": system_prompt})
    return conversation


def get_formatted_message_log(
    messages: Sequence[dict],
    tokenizer: TokenizerType,
    task_data_spec: TaskDataSpec | None = None,
    *,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    control_text: str = "reject",
) -> LLMMessageLogType:
    """Validate, template and tokenize ``messages`` into a message log, rendering the template once.

    Each returned message is a copy of the input message (after ``task_data_spec``) whose
    ``content`` is this turn's slice of the templated text and ``token_ids`` its 1-D int64 ids
    (usually views of one tensor per conversation: ``clone()`` one before resizing it).
    Raises ``ValueError`` for malformed messages (see :func:`validate_messages`) and its
    subclass ``ControlTextError`` for control text under ``control_text="reject"``.
    """
    conversation = _prepare(messages, task_data_spec)
    mask = _control_text_mask(conversation, tools, tokenizer, control_text)
    if mask is not None:
        return _plain_text_message_log(
            conversation, tokenizer, mask, tools, (add_bos_token, add_eos_token, add_generation_prompt), True
        )
    chunks = _chunks_from_single_render(conversation, tokenizer, add_generation_prompt, tools)
    if chunks is None:
        chunks = _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token)
    token_ids = _encode_whole_and_split(chunks, tokenizer)
    if token_ids is None:
        token_ids = [torch.tensor(ids, dtype=torch.long) for ids in tokenizer(chunks, add_special_tokens=False)["input_ids"]]
    return [_turn(message, chunk, ids) for message, chunk, ids in zip(conversation, chunks, token_ids)]


def get_formatted_message_log_reference(
    messages: Sequence[dict],
    tokenizer: TokenizerType,
    task_data_spec: TaskDataSpec | None = None,
    *,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    control_text: str = "reject",
) -> LLMMessageLogType:
    """The definition, computed literally: one template render per prefix, one tokenizer call per turn."""
    conversation = _prepare(messages, task_data_spec)
    mask = _control_text_mask(conversation, tools, tokenizer, control_text)
    if mask is not None:
        return _plain_text_message_log(
            conversation, tokenizer, mask, tools, (add_bos_token, add_eos_token, add_generation_prompt), False
        )
    chunks = _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token)
    message_log = []
    for message, chunk in zip(conversation, chunks):
        ids = tokenizer(text=chunk, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        message_log.append(_turn(message, chunk, ids.to(torch.long)))
    return message_log


def _prepare(messages: Sequence[dict], task_data_spec: TaskDataSpec | None) -> list[dict]:
    validate_messages(messages)
    return apply_task_data_spec(messages, task_data_spec)


def _format_prompt(prompt: str, content: str | list[dict]) -> str | list[dict]:
    try:
        if isinstance(content, str):
            return prompt.format(content)
        return [{**part, "text": prompt.format(part["text"])} if part["type"] == "text" else part for part in content]
    except (IndexError, KeyError, ValueError) as error:
        raise ValueError(
            f"task_data_spec.prompt {prompt!r:.80} cannot be applied with str.format ({error!r}); "
            "expected exactly one '{}' placeholder, with literal braces written as '{{' and '}}'"
        ) from error


def _render(tokenizer: TokenizerType, conversation: list[dict], generation_prompt: bool, tools) -> str:
    return tokenizer.apply_chat_template(
        conversation, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )


def _wants_generation_prompt(message: dict, add_generation_prompt: bool) -> bool:
    return add_generation_prompt and message["role"] in GENERATION_PROMPT_ROLES


def _common_prefix_length(first: str, second: str) -> int:
    """Index of the first character where the strings differ (NeMo-RL's ``get_first_index_that_differs``)."""
    if second.startswith(first):
        return len(first)
    known_equal, upper = 0, min(len(first), len(second))
    while known_equal < upper:  # binary search on slice equality, compared in C
        middle = (known_equal + upper + 1) // 2
        if first[:middle] == second[:middle]:
            known_equal = middle
        else:
            upper = middle - 1
    return known_equal


def _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools) -> list[str]:
    chunks, previous = [], ""
    for index, message in enumerate(conversation):
        generation_prompt = _wants_generation_prompt(message, add_generation_prompt)
        rendered = _render(tokenizer, conversation[: index + 1], generation_prompt, tools)
        chunks.append(rendered[_common_prefix_length(previous, rendered) :])
        previous = rendered
    return chunks


def _chunks_from_single_render(conversation, tokenizer, add_generation_prompt, tools) -> list[str] | None:
    """The prefix-render chunks computed from one render, or None where that is not provably equal.

    With the project template, the render of ``messages[:i + 1]`` is ``full[:ends[i]]`` plus the
    generation prompt when requested, where ``ends[i]`` is the end of the i-th turn delimiter
    (after the optional tool-list block). Each chunk then follows from the previous turn's
    generation prompt and this turn's text alone.
    """
    if getattr(tokenizer, "chat_template", None) != CHATML_TEMPLATE:
        return None
    full = render_chatml(conversation, tools)
    if full is None:
        full = _render(tokenizer, conversation, False, tools)
    header_blocks = 1 if tools and conversation[0]["role"] != "system" else 0
    ends = [match.end() for match in _TURN_END_PATTERN.finditer(full)]
    if len(ends) != len(conversation) + header_blocks:
        return None  # a message contains the delimiter itself: only the reference is exact
    chunks, start, previous_prompt = [], 0, ""
    for message, end in zip(conversation, ends[header_blocks:]):
        prompt = GENERATION_PROMPT if _wants_generation_prompt(message, add_generation_prompt) else ""
        text = full[start:end] + prompt
        chunks.append(text[_common_prefix_length(previous_prompt, text) :])
        start, previous_prompt = end, prompt
    return chunks


def _encode_whole_and_split(chunks: list[str], tokenizer) -> list[torch.Tensor] | None:
    """Each chunk's ids from one tokenizer call on the joined text, or None where not provably equal.

    Valid when every chunk after the first starts with ``<|im_start|>`` and that is an added
    special token the tokenizer cuts out before pre-tokenization (no strip options): each
    boundary then sits right before such a token. Chunk ``i`` starts at the
    ``n``-th ``<|im_start|>`` id, ``n`` counting the occurrences in the chunks before it.
    """
    if not all(chunk.startswith(TURN_START) for chunk in chunks[1:]):
        return None
    start_id = _special_token_id(tokenizer, TURN_START)
    if start_id is None:
        return None
    ids = torch.tensor(_encode_text(tokenizer, "".join(chunks)), dtype=torch.long)
    positions = (ids == start_id).nonzero().flatten().tolist()
    bounds, seen = [0], 0
    for chunk in chunks[:-1]:
        seen += chunk.count(TURN_START)
        if seen >= len(positions):
            return None
        bounds.append(positions[seen])
    if seen + chunks[-1].count(TURN_START) != len(positions):
        return None
    bounds.append(len(ids))
    return list(ids.split([end - begin for begin, end in zip(bounds, bounds[1:])]))


def _encode_text(tokenizer, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False)["input_ids"]``, from the Rust backend when equal.

    With no truncation or padding configured on the backend (``tokenizer(...)`` sets none for
    such a call), the backend's offset-free ``encode_batch_fast`` returns the same ids without
    transformers' per-call work (~25 % of a conversation's encode time here).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and hasattr(backend, "encode_batch_fast")
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _special_token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` when it is a special added token matched verbatim, else None."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    added = tokenizer.added_tokens_decoder.get(token_id) if isinstance(token_id, int) else None
    if added is None or added.content != token or not added.special:
        return None
    if added.lstrip or added.rstrip or added.single_word or added.normalized:
        return None
    return token_id


def _apply_bos_eos(chunks: list[str], tokenizer, add_bos_token: bool, add_eos_token: bool) -> list[str]:
    chunks = list(chunks)
    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    if add_bos_token and bos is not None and not chunks[0].startswith(bos):
        chunks[0] = bos + chunks[0]
    chunks[-1] = chunks[-1].rstrip("\n")
    if add_eos_token and eos is not None and not chunks[-1].endswith(eos):
        chunks[-1] += eos
    return chunks


@dataclass(frozen=True)
class _ControlTextMask:
    """Hides the data's control tokens behind ``<marker><index><marker>`` while the template renders.

    ``marker`` is a private-use character that occurs in no string of the conversation, so
    every marker in the render comes from the data and every control token from the template.
    """

    tokens: tuple[str, ...]
    pieces: re.Pattern[str]  # splits a render at control tokens, keeping them
    marker: str

    def hide(self, value: Any) -> Any:
        if isinstance(value, TrustedText):
            return value
        if isinstance(value, str):
            return self.pieces.sub(lambda m: f"{self.marker}{self.tokens.index(m.group())}{self.marker}", value)
        if isinstance(value, dict):
            return {self.hide(key): self.hide(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(item) for item in value]
        return value

    def restore(self, text: str) -> str:
        return re.sub(f"{self.marker}(\\d+){self.marker}", lambda m: self.tokens[int(m.group(1))], text)


def _control_text_mask(conversation, tools, tokenizer, control_text: str) -> _ControlTextMask | None:
    """None when the data holds no control text; raise under ``"reject"``; else the mask."""
    if control_text not in CONTROL_TEXT_POLICIES:
        raise ValueError(f"control_text must be one of {CONTROL_TEXT_POLICIES}, found {control_text!r}")
    found = find_control_text(conversation, tools, tokenizer)
    if found is None:
        return None
    if control_text == "reject":
        raise control_text_error(*found)
    pattern = control_text_pattern(tokenizer)
    text = "".join(_strings([conversation, tools]))
    marker = next(chr(code) for code in range(0xE000, 0xF900) if chr(code) not in text)
    tokens = tuple(sorted(set(pattern.findall(text))))
    return _ControlTextMask(tokens, re.compile(f"({pattern.pattern})"), marker)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _plain_text_message_log(conversation, tokenizer, mask: _ControlTextMask, tools, flags, single_render: bool):
    """The message log with the data's control text encoded as plain text (see the module docstring)."""
    add_bos_token, add_eos_token, add_generation_prompt = flags
    hidden, hidden_tools = mask.hide(conversation), mask.hide(tools) if tools else None
    chunks = _chunks_from_single_render(hidden, tokenizer, add_generation_prompt, hidden_tools) if single_render else None
    if chunks is None:
        chunks = _chunks_from_prefix_renders(hidden, tokenizer, add_generation_prompt, hidden_tools)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token)
    pieces = [mask.pieces.split(chunk) for chunk in chunks]  # text, template control token, text, ...
    texts = [mask.restore(text) for chunk_pieces in pieces for text in chunk_pieces[::2]]
    encoded = iter(_encode_plain_text(tokenizer, texts))
    token_ids = []
    for chunk_pieces in pieces:
        ids: list[int] = []
        for index, piece in enumerate(chunk_pieces):
            ids.extend(next(encoded) if index % 2 == 0 else [tokenizer.convert_tokens_to_ids(piece)])
        token_ids.append(torch.tensor(ids, dtype=torch.long))
    return [_turn(message, mask.restore(chunk), ids) for message, chunk, ids in zip(conversation, chunks, token_ids)]


def _encode_plain_text(tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of ``texts`` with special tokens encoded as plain text (``split_special_tokens``).

    transformers leaves the Rust backend's ``encode_special_tokens`` switched on after such a
    call; it is put back so later calls encode as before.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    saved = getattr(backend, "encode_special_tokens", None)
    try:
        return tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"] if texts else []
    finally:
        if saved is not None:
            backend.encode_special_tokens = saved


def _turn(message: dict, chunk: str, token_ids: torch.Tensor) -> dict[str, Any]:
    return {**message, "content": chunk, "token_ids": token_ids}
