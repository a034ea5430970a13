"""This project's ChatML chat template for Qwen-family tokenizers.

Properties the rest of :mod:`rl_data.tokenization` relies on (and the tests pin):

* **Prefix-stable**: rendering ``messages[:k]`` is a prefix of rendering ``messages[:k + 1]``.
  There is no Qwen3-style ``<think>`` stripping of history and every tool result is its own
  ``user`` block, so earlier turns never change when a turn is appended.
* **One block per message**: every message renders to exactly one block that ends with
  ``<|im_end|>\\n``. With ``tools`` and no leading system message, one extra system block
  (the tool list) comes first.
* ``add_generation_prompt`` appends ``<|im_start|>assistant\\n`` and nothing else.
* Assistant content, tool calls and the closing ``<|im_end|>`` sit inside
  ``{% generation %}`` so ``apply_chat_template(..., return_assistant_tokens_mask=True)``
  marks exactly the tokens the model must produce.

Content is a string or a list of ``{"type": "text", "text": ...}`` parts (concatenated).
Assistant ``tool_calls`` (OpenAI ``{"function": {"name", "arguments"}}`` or flat
``{"name", "arguments"}``; arguments a dict or a JSON string) render as
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``; a ``tool`` message renders as
a ``user`` block holding ``<tool_response>\\n...\\n</tool_response>``.

:func:`render_chatml` is the same template as plain Python string building (no Jinja), for
the hot path; tests pin it equal to the Jinja render.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

CHATML_TEMPLATE = r"""{#- rl_data ChatML template: prefix-stable, one block per message. -#}
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('only text content parts are supported, found type ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- text_of(messages[0].content) + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nThese functions are available. Their JSON signatures are listed inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call functions, write one JSON object per call, each inside its own <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not (loop.first and tools) -%}
            {{- '<|im_start|>system\n' + text_of(message.content) + '<|im_end|>\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + text_of(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- generation -%}
            {%- set body = text_of(message.content) if message.content is defined else '' -%}
            {{- body -}}
            {%- if message.tool_calls is defined -%}
                {%- for tool_call in message.tool_calls -%}
                    {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                    {%- if body or not loop.first -%}
                        {{- '\n' -}}
                    {%- endif -%}
                    {{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' -}}
                    {%- if call.arguments is string -%}
                        {{- call.arguments -}}
                    {%- else -%}
                        {{- call.arguments | tojson -}}
                    {%- endif -%}
                    {{- '}\n</tool_call>' -}}
                {%- endfor -%}
            {%- endif -%}
            {{- '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>user\n<tool_response>\n' + text_of(message.content) + '\n</tool_response><|im_end|>\n' -}}
    {%- else -%}
        {{- raise_exception('unknown role ' ~ message.role ~ '; expected system, user, assistant or tool') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# What ``add_generation_prompt=True`` appends, and the text every message block ends with.
GENERATION_PROMPT = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>\n"
TURN_START = "<|im_start|>"

_TOOLS_INTRO = (
    "# Tools\n\nThese functions are available. Their JSON signatures are listed inside <tools></tools>:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nTo call functions, write one JSON object per call, each inside its own <tool_call></tool_call> "
    'tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>'
    "<|im_end|>\n"
)


class _Unsupported(Exception):
    """Input the plain renderer does not model exactly (the caller renders it with Jinja)."""


def render_chatml(
    messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None, add_generation_prompt: bool = False
) -> str | None:
    """:data:`CHATML_TEMPLATE` rendered without Jinja, or None for input it does not model.

    Models what :func:`rl_data.tokenization.validation.validate_messages` accepts: str or
    text-part content, assistant ``tool_calls`` with dict or str arguments, dict tools.
    Anything else (``tool_calls: None``, a call without arguments, callable tools) returns
    None, so the caller renders with Jinja and gets the template's exact output or error.
    """
    try:
        if tools and not all(isinstance(tool, Mapping) for tool in tools):
            raise _Unsupported(tools)
        parts = [_tools_block(messages, tools)] if tools else []
        for index, message in enumerate(messages):
            parts.append(_message_block(message, skip_system=index == 0 and bool(tools)))
    except _Unsupported:
        return None
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def _tools_block(messages: Sequence[Mapping], tools: Sequence[Mapping]) -> str:
    system = _text_of(messages[0]["content"]) + "\n\n" if messages[0].get("role") == "system" else ""
    listing = "".join("\n" + _tojson(tool) for tool in tools)
    return "<|im_start|>system\n" + system + _TOOLS_INTRO + listing + _TOOLS_OUTRO


def _message_block(message: Mapping, skip_system: bool) -> str:
    role = message.get("role")
    if role == "system":
        return "" if skip_system else "<|im_start|>system\n" + _text_of(message["content"]) + TURN_END
    if role == "user":
        return "<|im_start|>user\n" + _text_of(message["content"]) + TURN_END
    if role == "tool":
        return "<|im_start|>user\n<tool_response>\n" + _text_of(message["content"]) + "\n</tool_response>" + TURN_END
    if role != "assistant":
        raise _Unsupported(role)
    body = _text_of(message["content"]) if "content" in message else ""
    tool_calls = message.get("tool_calls", [])
    if not isinstance(tool_calls, list):
        raise _Unsupported(tool_calls)
    calls = "".join(_tool_call(call, first=not body and index == 0) for index, call in enumerate(tool_calls))
    return GENERATION_PROMPT + body + calls + TURN_END


def _tool_call(tool_call: object, first: bool) -> str:
    call = tool_call.get("function", tool_call) if isinstance(tool_call, Mapping) else None
    if not isinstance(call, Mapping) or "name" not in call or "arguments" not in call:
        raise _Unsupported(tool_call)
    arguments = call["arguments"]
    arguments_text = arguments if isinstance(arguments, str) else _tojson(arguments)
    head = "" if first else "\n"
    return head + '<tool_call>\n{"name": ' + _tojson(call["name"]) + ', "arguments": ' + arguments_text + "}\n</tool_call>"


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list) or not all(
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        raise _Unsupported(content)
    return "".join(part["text"] for part in content)


def _tojson(value: object) -> str:
    """transformers' ``tojson`` filter: ``json.dumps`` without ASCII escaping."""
    return json.dumps(value, ensure_ascii=False)
