"""Chat messages -> ``message_log``: per-turn slices of the chat-template text and their token ids.

Definition (NeMo-RL's ``get_formatted_message_log``): turn ``i`` is what rendering the template
over ``messages[:i + 1]`` adds to the render of ``messages[:i]`` (both renders with the
generation prompt when their last turn is a user/tool turn and ``add_generation_prompt``),
measured from the first character where the two renders differ. The first turn gets the
tokenizer's BOS when it has one and the turn does not start with it; the last turn loses its
trailing newlines and gets EOS when it does not already end with it.

**Two paths.** :func:`get_formatted_message_log_reference` computes exactly that, one render
per prefix (quadratic in turns). :func:`get_formatted_message_log` takes the path
:func:`formatting_path` decides once per chat template (logged once, with the template's
sha256 and the reason):

* ``"linear"``: render the conversation once and cut the text at the turn ends. Taken when
  the template renders turn by turn, which is checked by probing it on synthetic
  conversations (system prompts, tool calls, mid-conversation system turns, ``<think>``
  reasoning in assistant turns, generation prompt on and off) against the prefix-render
  definition; the probe also learns the text each role's turn ends with (``<|im_end|>\n``, ``<|eot_id|>``, `` [/INST]``, ...). The first
  turn ends where the render of ``messages[:1]`` ends (one more render of one message), so
  preambles such as a tool list are handled. A conversation whose strings contain a turn end
  (or end with the start of one), or with a mid-conversation role the probe did not see, is
  rendered per prefix. The project ChatML template is rendered in plain Python
  (:func:`~rl_data.tokenization.chat_template.render_chatml`), others with Jinja.
* ``"prefix"``: the reference computation, for templates that re-render earlier turns when a
  turn is added (Qwen3's stripping of earlier ``<think>`` blocks, a turn count in the first
  message) or whose render the probe could not split.

Either path tokenizes the whole text in one call and cuts the ids at the turn boundaries when
each boundary touches a special token of the tokenizer (the turn starts with one or the
previous turn ends with one): an added special token is cut out of the text before
pre-tokenization, so the ids on either side of it are exactly the ids of the pieces encoded
apart. Other boundaries (after a mid-conversation generation prompt) are encoded turn by turn.
Tests prove both paths identical to the reference on real and synthetic conversations, on
three template families (:mod:`rl_data.tokenization.templates`).

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

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from rl_data.tokenization.chat_template import CHATML_TEMPLATE, render_chatml
from rl_data.tokenization.fast_encode import text_encoder
from rl_data.tokenization.prefix_encoding import (
    FIRST_STEP_CHARS_PER_TOKEN,
    cuts_are_exact,
    encode_until,
    stub_prefixes,
)
from rl_data.tokenization.tokenizer_cache import PerTokenizer
from rl_data.tokenization.truncation import MAX_TOKENS_KEPT_PER_MESSAGE, message_log_length, truncate_message_log
from rl_data.tokenization.validation import (
    CONTROL_TEXT_POLICIES,
    TrustedText,
    control_text_error,
    control_text_pattern,
    control_tokens,
    find_control_text,
    validate_messages,
)

if TYPE_CHECKING:
    from rl_data.interfaces import LLMMessageLogType, TaskDataSpec, TokenizerType

__all__ = [
    "FormattingPath",
    "apply_task_data_spec",
    "formatting_path",
    "get_formatted_message_log",
    "get_formatted_message_log_reference",
    "get_truncated_formatted_message_log",
    "validate_messages",
]

# Turns after which ``add_generation_prompt`` appends the assistant header.
GENERATION_PROMPT_ROLES = ("user", "tool")
_logger = logging.getLogger(__name__)


def apply_task_data_spec(messages: Sequence[dict], task_data_spec: TaskDataSpec | None) -> list[dict]:
    """Copy ``messages``, format the first user turn with ``spec.prompt`` and prepend ``spec.system_prompt``.

    ``prompt`` is applied with ``str.format`` to the first user turn's text: its string content,
    or its first text part that is not processor placeholder text (``TrustedText`` media
    placeholders stay as they are); a first user turn without text is refused (``ValueError``).
    ``system_prompt`` becomes a leading system message unless one is already there.
    """
    conversation = [dict(message) for message in messages]
    prompt = getattr(task_data_spec, "prompt", None)
    system_prompt = getattr(task_data_spec, "system_prompt", None)
    if prompt:
        first_user = next((i for i, m in enumerate(conversation) if m["role"] == "user"), None)
        if first_user is not None:
            conversation[first_user]["content"] = _format_prompt(prompt, conversation[first_user]["content"], first_user)
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
    flags = (add_bos_token, add_eos_token, add_generation_prompt)
    conversation, chunks, masked = _formatted_chunks(messages, tokenizer, task_data_spec, flags, tools, control_text)
    if masked is not None:
        return masked
    return [_turn(m, chunk, ids) for m, chunk, ids in zip(conversation, chunks, _turn_ids(chunks, tokenizer))]


def get_truncated_formatted_message_log(
    messages: Sequence[dict],
    tokenizer: TokenizerType,
    max_seq_length: int,
    task_data_spec: TaskDataSpec | None = None,
    *,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    control_text: str = "reject",
) -> tuple[LLMMessageLogType, int, float]:
    """``truncate_message_log(get_formatted_message_log(...), max_seq_length)``, encoding less.

    A conversation that reaches ``max_seq_length`` keeps only the first few tokens of each
    message (:func:`~rl_data.tokenization.truncation.truncate_message_log`). With a tokenizer
    whose encoding splits exactly at safe cuts (:mod:`rl_data.tokenization.prefix_encoding`),
    the text is encoded in steps until the limit is reached; the stubs of turns past that point
    come from a short prefix of each. The ~3 % of the benchmark's conversations that reach 4,096
    tokens hold ~22 % of its tokens. Same message log, length and loss multiplier (tested
    against the composition).
    """
    if max_seq_length <= 0:
        raise ValueError(f"max_seq_length must be a positive number of tokens, got {max_seq_length}")
    flags = (add_bos_token, add_eos_token, add_generation_prompt)
    conversation, chunks, masked = _formatted_chunks(messages, tokenizer, task_data_spec, flags, tools, control_text)
    if masked is not None:
        return truncate_message_log(masked, max_seq_length)
    token_ids, is_stub = _turn_ids_within(chunks, tokenizer, max_seq_length)
    message_log = [_turn(m, chunk, ids) for m, chunk, ids in zip(conversation, chunks, token_ids)]
    if is_stub:
        return message_log, message_log_length(message_log), 0.0
    return truncate_message_log(message_log, max_seq_length)


def _formatted_chunks(messages, tokenizer, task_data_spec, flags, tools, control_text):
    """``(conversation, chunks, None)``: the turns' texts; or ``(conversation, None, message_log)``
    when the data's control text was encoded as plain text."""
    add_bos_token, add_eos_token, add_generation_prompt = flags
    conversation = _prepare(messages, task_data_spec)
    mask = _control_text_mask(conversation, tools, tokenizer, control_text)
    path = formatting_path(tokenizer)
    if mask is not None:
        return conversation, None, _plain_text_message_log(conversation, tokenizer, mask, tools, flags, path)
    chunks = _chunks_from_single_render(conversation, tokenizer, path, add_generation_prompt, tools)
    if chunks is None:
        chunks = _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools, _render_fast)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token,
                            _wants_generation_prompt(conversation[-1], add_generation_prompt))
    return conversation, chunks, None


def _turn_ids(chunks: list[str], tokenizer) -> list[torch.Tensor]:
    """Each chunk's ids: one call on the joined text where the turn cuts are provable, else one per chunk."""
    cuts = _turn_cuts(chunks, tokenizer)
    token_ids = None if cuts is None else _split_at_turns(text_encoder(tokenizer).encode("".join(chunks)), cuts)
    if token_ids is None:
        token_ids = [torch.tensor(ids, dtype=torch.long) for ids in tokenizer(chunks, add_special_tokens=False)["input_ids"]]
    return token_ids


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
            conversation, tokenizer, mask, tools, (add_bos_token, add_eos_token, add_generation_prompt), None
        )
    chunks = _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token,
                            _wants_generation_prompt(conversation[-1], add_generation_prompt))
    message_log = []
    for message, chunk in zip(conversation, chunks):
        ids = tokenizer(text=chunk, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        message_log.append(_turn(message, chunk, ids.to(torch.long)))
    return message_log


def _prepare(messages: Sequence[dict], task_data_spec: TaskDataSpec | None) -> list[dict]:
    validate_messages(messages)
    return apply_task_data_spec(messages, task_data_spec)


def _format_prompt(prompt: str, content: str | list[dict], index: int) -> str | list[dict]:
    try:
        if isinstance(content, str):
            return prompt.format(content)
        for part_index, part in enumerate(content):
            text = part.get("text") if part.get("type") == "text" else None
            if isinstance(text, str) and not isinstance(text, TrustedText):
                return [*content[:part_index], {**part, "text": prompt.format(text)}, *content[part_index + 1:]]
    except (IndexError, KeyError, ValueError) as error:
        raise ValueError(
            f"task_data_spec.prompt {prompt!r:.80} cannot be applied with str.format ({error!r}); "
            "expected exactly one '{}' placeholder, with literal braces written as '{{' and '}}'"
        ) from error
    raise ValueError(
        f"message {index} (the first user turn) has no text for the task prompt to format "
        f"(content {content!r:.80}); give it a text part or drop the prompt"
    )


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


def _chunks_from_prefix_renders(conversation, tokenizer, add_generation_prompt, tools, render=_render) -> list[str]:
    """One render per prefix (``render``: :func:`_render`, the definition, or :func:`_render_fast`:
    a 182-message chat formats ~10x faster without Jinja, the same text)."""
    chunks, previous = [], ""
    for index, message in enumerate(conversation):
        generation_prompt = _wants_generation_prompt(message, add_generation_prompt)
        rendered = render(tokenizer, conversation[: index + 1], generation_prompt, tools)
        chunks.append(rendered[_common_prefix_length(previous, rendered) :])
        previous = rendered
    return chunks


@dataclass(frozen=True)
class FormattingPath:
    """How :func:`get_formatted_message_log` splits conversations for one chat template."""

    #: ``"linear"``: one render cut at the turn ends; ``"prefix"``: one render per prefix
    kind: Literal["linear", "prefix"]
    #: why this path, in words (logged once per template)
    reason: str
    #: sha256 hex of the chat template (of its canonical JSON when it is not one string)
    template_sha256: str | None
    #: ``(role, text)``: every turn of ``role`` after the first ends with ``text`` (linear only)
    turn_ends: tuple[tuple[str, str], ...] = ()
    #: what ``add_generation_prompt`` appends to a render (linear only)
    generation_prompt: str = ""


_PATHS: dict[tuple, FormattingPath] = {}


def formatting_path(tokenizer: TokenizerType) -> FormattingPath:
    """The path the tokenizer's chat template takes, decided by probing it (see the module docstring).

    Pure in the template and the special tokens the template sees; cached per such pair, and
    logged once when first decided (info for linear, warning for prefix).
    """
    template = getattr(tokenizer, "chat_template", None)
    special = getattr(tokenizer, "special_tokens_map", None) or {}
    key = (template if isinstance(template, str) else _canonical(template), _canonical(special))
    path = _PATHS.get(key)
    if path is None:
        path = _PATHS[key] = _probe_template(tokenizer, _template_sha256(template))
        log = _logger.info if path.kind == "linear" else _logger.warning
        log("chat template sha256 %s: %s formatting path: %s", path.template_sha256, path.kind, path.reason)
    return path


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _template_sha256(template: Any) -> str | None:
    if template is None:
        return None
    text = template if isinstance(template, str) else _canonical(template)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _probe_call(index: int) -> dict:
    return {"id": f"probe_call_{index}", "type": "function",
            "function": {"name": "probe_lookup", "arguments": {"query": f"probe query {index}"}}}  # fmt: skip


_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe_lookup", "description": "Look a query up.",
                 "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]  # fmt: skip
# (name, messages, tools): every role sits mid-conversation at least twice, after different text
_PROBES: tuple[tuple[str, list[dict], list[dict] | None], ...] = (
    ("alternating turns", [
        {"role": "user", "content": "Alpha question 1"}, {"role": "assistant", "content": "Bravo answer 2"},
        {"role": "user", "content": "Charlie question 3?"}, {"role": "assistant", "content": "Delta answer 4."},
        {"role": "user", "content": "Echo question 5!"}], None),
    ("system prompt", [
        {"role": "system", "content": "Foxtrot system 6"}, {"role": "user", "content": "Golf question 7"},
        {"role": "assistant", "content": "Hotel answer 8"}, {"role": "user", "content": "India question 9"},
        {"role": "assistant", "content": "Juliet answer 0"}], None),
    ("mid-conversation system turns", [
        {"role": "user", "content": "Kilo question 1"}, {"role": "assistant", "content": "Lima answer 2"},
        {"role": "system", "content": "Mike note 3"}, {"role": "user", "content": "November question 4"},
        {"role": "system", "content": "Oscar note 5!"}, {"role": "assistant", "content": "Papa answer 6"}], None),
    ("reasoning in assistant turns", [
        {"role": "user", "content": "Quebec question 7"},
        {"role": "assistant", "content": "<think>\nRomeo reasoning 8\n</think>\n\nSierra answer 9"},
        {"role": "user", "content": "Tango question 1"},
        {"role": "assistant", "content": "<think>\nUniform reasoning 2\n</think>\n\nVictor answer 3!"},
        {"role": "user", "content": "Whiskey question 4"}], None),
    ("tool calls", [
        {"role": "system", "content": "Quebec system 7"}, {"role": "user", "content": "Romeo question 8"},
        {"role": "assistant", "content": "Sierra looks up 9.", "tool_calls": [_probe_call(1), _probe_call(2)]},
        {"role": "tool", "tool_call_id": "probe_call_1", "content": "Tango result 1"},
        {"role": "tool", "tool_call_id": "probe_call_2", "content": "Uniform result 2?"},
        {"role": "assistant", "content": "Victor answer 3"}, {"role": "user", "content": "Whiskey question 4"}],
     _PROBE_TOOLS),
    ("tool call without content", [
        {"role": "user", "content": "Xray question 5"},
        {"role": "assistant", "content": None, "tool_calls": [_probe_call(3)]},
        {"role": "tool", "tool_call_id": "probe_call_3", "content": "Yankee result 6"},
        {"role": "assistant", "content": "Zulu answer 7"}, {"role": "user", "content": "Alpha question 8"},
        {"role": "assistant", "content": "Bravo answer 9"}], _PROBE_TOOLS),
)  # fmt: skip


def _probe_template(tokenizer, sha256: str | None) -> FormattingPath:
    """Decide the path: prefix-stable renders, a constant generation prompt, learnable turn ends,
    and the linear split equal to the prefix renders on every probe the template accepts."""

    def prefix(reason: str) -> FormattingPath:
        return FormattingPath("prefix", reason, sha256)

    accepted = []
    for name, messages, tools in _PROBES:
        try:
            renders = [_render(tokenizer, messages[: k + 1], False, tools) for k in range(len(messages))]
            prompted = [_render(tokenizer, messages[: k + 1], True, tools) for k in range(len(messages))]
        except Exception:  # noqa: BLE001 - a shape this template does not take (e.g. tools) is not probed
            continue
        accepted.append((name, messages, tools, renders, prompted))
    if not accepted:
        return prefix("the template renders none of the probe conversations")
    generation_prompts, chunks_by_role = set(), {}
    for name, messages, _, renders, prompted in accepted:
        for k in range(1, len(messages)):
            if not renders[k].startswith(renders[k - 1]):
                differ = _common_prefix_length(renders[k - 1], renders[k])
                return prefix(
                    f"the template re-renders earlier turns: on probe {name!r} the render of messages[:{k}] is not "
                    f"a prefix of the render of messages[:{k + 1}] (they differ from character {differ})"
                )
            chunks_by_role.setdefault(messages[k]["role"], []).append(renders[k][len(renders[k - 1]) :])
        for render, with_prompt in zip(renders, prompted):
            if not with_prompt.startswith(render):
                return prefix(f"add_generation_prompt changes the text before the prompt on probe {name!r}")
            generation_prompts.add(with_prompt[len(render) :])
    if len(generation_prompts) != 1:
        return prefix(
            f"add_generation_prompt appends different texts after different turns: {sorted(generation_prompts)}"
        )
    learned = {role: _turn_end(chunks) for role, chunks in chunks_by_role.items()}
    turn_ends = tuple(sorted((role, end) for role, end in learned.items() if end is not None))
    candidate = FormattingPath("linear", "", sha256, turn_ends, generation_prompts.pop())
    for name, messages, tools, _, _ in accepted:
        for generation_prompt in (False, True):
            linear = _chunks_from_single_render(messages, tokenizer, candidate, generation_prompt, tools)
            if linear != _chunks_from_prefix_renders(messages, tokenizer, generation_prompt, tools):
                return prefix(
                    f"cutting one render at the turn ends {dict(turn_ends)} does not give the prefix renders on probe "
                    f"{name!r} (add_generation_prompt={generation_prompt})"
                )
    names = ", ".join(repr(name) for name, *_ in accepted)
    reason = (
        f"the template renders turn by turn: on the probes {names}, one render cut at the turn ends "
        f"{dict(turn_ends)} gives the prefix renders"
    )
    return FormattingPath("linear", reason, sha256, turn_ends, candidate.generation_prompt)


def _turn_end(chunks: list[str]) -> str | None:
    """The longest common suffix of a role's mid-conversation turns ("" when all are empty), or
    None when non-empty turns share none (the turn end is not fixed text)."""
    if not any(chunks):
        return ""
    end = chunks[0]
    for chunk in chunks[1:]:
        while not chunk.endswith(end):
            end = end[1:]
    return end or None


def _render_fast(tokenizer, conversation: list[dict], generation_prompt: bool, tools) -> str:
    """:func:`_render`, without Jinja for :data:`CHATML_TEMPLATE` (``render_chatml`` gives the
    template's output, or None for input it does not model)."""
    if getattr(tokenizer, "chat_template", None) == CHATML_TEMPLATE:
        rendered = render_chatml(conversation, tools, generation_prompt)
        if rendered is not None:
            return rendered
    return _render(tokenizer, conversation, generation_prompt, tools)


def _render_once(tokenizer, conversation: list[dict], tools) -> str:
    return _render_fast(tokenizer, conversation, False, tools)


def _chunks_from_single_render(
    conversation, tokenizer, path: FormattingPath | None, add_generation_prompt, tools
) -> list[str] | None:
    """The prefix-render chunks from one render cut at the turn ends, or None where not provably equal.

    On the linear path the render of ``messages[:i + 1]`` is ``full[:ends[i]]`` (plus the
    generation prompt when requested): ``ends[0]`` is the length of the render of the first
    message, ``ends[i]`` the end of the first occurrence of the turn end of ``messages[i]``'s
    role after ``ends[i - 1]``. No string of the data may contain a turn end, or end with its
    beginning, so every occurrence found is the template's own.
    """
    if path is None or path.kind != "linear":
        return None
    ends_by_role = dict(path.turn_ends)
    middle = [message["role"] for message in conversation[1:-1]]
    if any(role not in ends_by_role for role in middle):
        return None
    turn_ends = tuple(sorted({ends_by_role[role] for role in middle} - {""}))
    if turn_ends and _turn_end_pattern(turn_ends).search(_data_text(conversation, tools)):
        return None
    full = _render_once(tokenizer, conversation, tools)
    first = _render_once(tokenizer, conversation[:1], tools) if len(conversation) > 1 else full
    if not full.startswith(first):
        return None
    ends = [len(first)]
    for role in middle:
        found = full.find(ends_by_role[role], ends[-1])
        if found < 0:
            return None
        ends.append(found + len(ends_by_role[role]))
    if len(conversation) > 1:
        ends.append(len(full))
    chunks, start, previous_prompt = [], 0, ""
    for message, end in zip(conversation, ends):
        prompt = path.generation_prompt if _wants_generation_prompt(message, add_generation_prompt) else ""
        text = full[start:end] + prompt
        chunks.append(text[_common_prefix_length(previous_prompt, text) :])
        start, previous_prompt = end, prompt
    return chunks


@lru_cache(maxsize=64)
def _turn_end_pattern(turn_ends: tuple[str, ...]) -> re.Pattern[str]:
    """Matches a turn end inside a string, or a string (NUL-terminated) ending with a turn end's beginning."""
    whole = [re.escape(end) for end in turn_ends]
    beginnings = {re.escape(end[:size]) + "\\0" for end in turn_ends for size in range(1, len(end))}
    return re.compile("|".join(whole + sorted(beginnings)))


def _data_text(conversation: list[dict], tools) -> str:
    """Every string of the conversation and tools, each followed by NUL (keys and values)."""
    if not tools:
        join = "\0".join
        try:
            values = join([join(message.values()) for message in conversation])
            return join(map(join, conversation)) + "\0" + values + "\0"
        except TypeError:  # non-string values (tool calls, content parts): walk them
            pass
    return "".join(text + "\0" for text in _strings([conversation, tools]))


@dataclass(frozen=True)
class _TurnCuts:
    """Where the joined turns' ids split: ``(special token count before the cut, 0 before it / 1 after it)``
    per boundary, and how many special tokens the text holds."""

    cuts: list[tuple[int, int]]
    special_count: int
    special_ids: torch.Tensor


def _turn_cuts(chunks: list[str], tokenizer) -> _TurnCuts | None:
    """The boundaries of ``chunks`` as positions among their special tokens, or None where not provable.

    Valid when every boundary touches a special token matched verbatim (the next chunk starts
    with one or the previous ends with one): the tokenizer cuts such tokens out before
    pre-tokenization, so each chunk encodes alone to its ids within the joined text.
    """
    specials = _verbatim_specials(tokenizer)
    if specials is None:
        return None
    pattern, special_ids = specials
    spans = [match.span() for match in pattern.finditer("".join(chunks))]
    starting = {start: index for index, (start, _) in enumerate(spans)}
    ending = {end: index for index, (_, end) in enumerate(spans)}
    cuts, offset = [], 0
    for chunk in chunks[:-1]:
        offset += len(chunk)
        if offset in starting:
            cuts.append((starting[offset], 0))  # right before the special token the next chunk starts with
        elif offset in ending:
            cuts.append((ending[offset], 1))  # right after the special token this chunk ends with
        else:
            return None
    return _TurnCuts(cuts, len(spans), special_ids)


def _split_at_turns(ids: list[int], turn_cuts: _TurnCuts) -> list[torch.Tensor] | None:
    """The joined text's ``ids`` cut per chunk, locating each cut's special token among the ids
    (None when the ids do not hold exactly the text's special tokens)."""
    ids = torch.from_numpy(np.fromiter(ids, dtype=np.int64, count=len(ids)))  # ~4x torch.tensor(list)
    positions = torch.isin(ids, turn_cuts.special_ids).nonzero().flatten().tolist()
    if len(positions) != turn_cuts.special_count:
        return None
    bounds = [0] + [positions[count] + after for count, after in turn_cuts.cuts] + [len(ids)]
    return list(ids.split([end - begin for begin, end in zip(bounds, bounds[1:])]))


def _turn_ids_within(chunks: list[str], tokenizer, max_seq_length: int) -> tuple[list[torch.Tensor], bool]:
    """``(ids per chunk, False)``, or ``(the truncation rule's stubs per chunk, True)`` when the
    text reaches ``max_seq_length`` before its end (found by encoding up to safe cuts)."""
    text = "".join(chunks)
    cuts = _turn_cuts(chunks, tokenizer) if len(text) > FIRST_STEP_CHARS_PER_TOKEN * max_seq_length else None
    added_tokens = None if cuts is None else cuts_are_exact(tokenizer)
    if added_tokens is None:
        return _turn_ids(chunks, tokenizer), False
    ids, end = encode_until(text_encoder(tokenizer).encode, text, max_seq_length, added_tokens)
    if end == len(text):
        token_ids = _split_at_turns(ids, cuts)
        return (_turn_ids(chunks, tokenizer) if token_ids is None else token_ids), False
    keep = min(MAX_TOKENS_KEPT_PER_MESSAGE, max_seq_length // len(chunks))
    stubs = _stubs_from_encoded_head(chunks, tokenizer, ids, end, keep)
    rest = [index for index, stub in enumerate(stubs) if stub is None]
    for index, stub in zip(rest, _stubs_from_prefixes([chunks[i] for i in rest], tokenizer, keep, added_tokens)):
        stubs[index] = stub
    return stubs, True


def _stubs_from_encoded_head(chunks: list[str], tokenizer, ids: list[int], end: int, keep: int) -> list[torch.Tensor | None]:
    """The first ``keep`` ids of each chunk starting in ``text[:end]`` (whose ids are ``ids``), where
    the head holds them; None for the others."""
    head, offset = [], 0
    for chunk in chunks:
        if offset >= end:
            break
        head.append(chunk[: end - offset])
        offset += len(chunk)
    cuts = _turn_cuts(head, tokenizer)
    head_ids = None if cuts is None else _split_at_turns(ids, cuts)
    stubs: list[torch.Tensor | None] = [None] * len(chunks)
    for index, (part, part_ids) in enumerate(zip(head, head_ids or ())):
        if len(part) == len(chunks[index]) or len(part_ids) >= keep:  # whole, or holding its first ids
            stubs[index] = part_ids[:keep]
    return stubs


def _stubs_from_prefixes(chunks: list[str], tokenizer, keep: int, added_tokens) -> list[torch.Tensor]:
    """The first ``keep`` ids of each chunk, encoding it up to a safe cut after a few characters."""
    if not chunks:
        return []
    encode = text_encoder(tokenizer).encode
    prefixes = stub_prefixes(chunks, added_tokens)
    prefix_cuts = _turn_cuts(prefixes, tokenizer)  # one call when the prefixes still meet at special tokens
    firsts = None if prefix_cuts is None else _split_at_turns(encode("".join(prefixes)), prefix_cuts)
    if firsts is None:
        firsts = [torch.tensor(encode(prefix), dtype=torch.long) for prefix in prefixes]
    stubs = []
    for chunk, prefix, first in zip(chunks, prefixes, firsts):
        if len(first) < keep and len(prefix) < len(chunk):  # the prefix was too short: the whole turn
            first = torch.tensor(encode(chunk), dtype=torch.long)
        stubs.append(first[:keep])
    return stubs


_SPECIALS: PerTokenizer[tuple[re.Pattern[str], torch.Tensor] | None] = PerTokenizer()


def _verbatim_specials(tokenizer) -> tuple[re.Pattern[str], torch.Tensor] | None:
    """(pattern of the special tokens, their ids) when every one is an added special token
    matched verbatim (no strip or normalisation options), else None. Cached per tokenizer
    until its special tokens change."""
    pattern = control_text_pattern(tokenizer)

    def specials() -> tuple[re.Pattern[str], torch.Tensor] | None:
        if pattern is None:
            return None
        ids = [_special_token_id(tokenizer, token) for token in control_tokens(tokenizer)]
        return None if None in ids else (pattern, torch.tensor(ids, dtype=torch.long))

    return _SPECIALS.get(tokenizer, pattern, specials)


def _special_token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` when it is a special added token matched verbatim, else None."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    added = tokenizer.added_tokens_decoder.get(token_id) if isinstance(token_id, int) else None
    if added is None or added.content != token or not added.special:
        return None
    if added.lstrip or added.rstrip or added.single_word or added.normalized:
        return None
    return token_id


def _apply_bos_eos(
    chunks: list[str], tokenizer, add_bos_token: bool, add_eos_token: bool, ends_with_generation_prompt: bool
) -> list[str]:
    """BOS once at the start; the last turn's trailing newlines cut and EOS once at its end.

    A last turn that ends with the generation prompt keeps it whole (``<|im_start|>assistant\n``:
    the model continues after the newline).
    """
    chunks = list(chunks)
    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    if add_bos_token and bos is not None and not chunks[0].startswith(bos):
        chunks[0] = bos + chunks[0]
    if not ends_with_generation_prompt:
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


def _plain_text_message_log(conversation, tokenizer, mask: _ControlTextMask, tools, flags, path):
    """The message log with the data's control text encoded as plain text (see the module docstring);
    ``path`` None renders per prefix."""
    add_bos_token, add_eos_token, add_generation_prompt = flags
    hidden, hidden_tools = mask.hide(conversation), mask.hide(tools) if tools else None
    chunks = _chunks_from_single_render(hidden, tokenizer, path, add_generation_prompt, hidden_tools)
    if chunks is None:
        chunks = _chunks_from_prefix_renders(hidden, tokenizer, add_generation_prompt, hidden_tools, _render_fast)
    chunks = _apply_bos_eos(chunks, tokenizer, add_bos_token, add_eos_token,
                            _wants_generation_prompt(conversation[-1], add_generation_prompt))
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
