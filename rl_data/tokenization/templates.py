"""Three chat-template families, applicable to any tokenizer (tests and benchmarks use the Qwen one).

* ``"chatml"``: this project's ChatML template (:data:`~rl_data.tokenization.chat_template.CHATML_TEMPLATE`),
  modelled on Qwen2.5's ``<|im_start|>role\\n...<|im_end|>\\n`` blocks without Qwen3's ``<think>``
  handling; no BOS, EOS ``<|im_end|>``; tools in a leading system block, ``<tool_call>`` JSON.
* ``"llama3"``: modelled on Llama 3 / 3.1 Instruct: ``<|begin_of_text|>`` (BOS, written by the
  template), then ``<|start_header_id|>role<|end_header_id|>\\n\\n`` + trimmed content +
  ``<|eot_id|>`` (EOS) per message; ``add_generation_prompt`` appends the assistant header.
  Tools as in Llama 3.1's JSON tool calling: the tool list in a system block, a call as
  ``{"name": ..., "parameters": ...}``, a tool result as an ``ipython`` message.
* ``"inst"``: modelled on Mistral-7B-Instruct v0.1 / Llama 2 chat: ``<s>`` (BOS, written by
  the template), ``[INST] user [/INST]``, `` assistant</s>`` (EOS); a leading system message is
  folded into the first user turn (``[INST] system\\n\\nuser [/INST]``). No tool format: tools,
  tool calls and tool messages are refused, as is a system message anywhere but first.

Each family's assistant output sits inside ``{% generation %}`` (for
``return_assistant_tokens_mask``). All three render turn by turn, so
:func:`~rl_data.tokenization.chat.formatting_path` picks the linear path for each.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from rl_data.tokenization.chat_template import CHATML_TEMPLATE

_TEXT_OF = r"""{%- macro text_of(content) -%}
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
"""

LLAMA3_TEMPLATE = (
    r"""{#- rl_data Llama-3-style header template: BOS, one header block per message. -#}
"""
    + _TEXT_OF
    + r"""{{- bos_token -}}
{%- if tools -%}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- text_of(messages[0].content) | trim + '\n\n' -}}
    {%- endif -%}
    {{- 'You can call these functions. To call one, answer with a JSON object {"name": <function name>, "parameters": <arguments as a JSON object>}.' -}}
    {%- for tool in tools -%}
        {{- '\n\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '<|eot_id|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not (loop.first and tools) -%}
            {{- '<|start_header_id|>system<|end_header_id|>\n\n' + text_of(message.content) | trim + '<|eot_id|>' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|start_header_id|>user<|end_header_id|>\n\n' + text_of(message.content) | trim + '<|eot_id|>' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- generation -%}
            {%- set body = text_of(message.content) | trim if message.content is defined else '' -%}
            {{- body -}}
            {%- if message.tool_calls is defined -%}
                {%- for tool_call in message.tool_calls -%}
                    {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                    {%- if body or not loop.first -%}
                        {{- '\n' -}}
                    {%- endif -%}
                    {{- '{"name": ' + (call.name | tojson) + ', "parameters": ' -}}
                    {%- if call.arguments is string -%}
                        {{- call.arguments -}}
                    {%- else -%}
                        {{- call.arguments | tojson -}}
                    {%- endif -%}
                    {{- '}' -}}
                {%- endfor -%}
            {%- endif -%}
            {{- '<|eot_id|>' -}}
        {%- endgeneration -%}
    {%- elif message.role == 'tool' -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + text_of(message.content) | trim + '<|eot_id|>' -}}
    {%- else -%}
        {{- raise_exception('unknown role ' ~ message.role ~ '; expected system, user, assistant or tool') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""
)

INST_TEMPLATE = (
    r"""{#- rl_data [INST] template: BOS, system folded into the first user turn, no tools. -#}
"""
    + _TEXT_OF
    + r"""{%- if tools -%}
    {{- raise_exception('the [INST] template has no tool format; use the chatml or llama3 family for tools') -}}
{%- endif -%}
{%- if messages[0].role == 'system' and messages | length > 1 and messages[1].role != 'user' -%}
    {{- raise_exception('a leading system message must be followed by a user message (it is folded into it)') -}}
{%- endif -%}
{{- bos_token -}}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}
            {{- raise_exception('a system message is only supported as the first message of the [INST] template') -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '[INST] ' -}}
        {%- if loop.index0 == 1 and messages[0].role == 'system' -%}
            {{- text_of(messages[0].content) + '\n\n' -}}
        {%- endif -%}
        {{- text_of(message.content) + ' [/INST]' -}}
    {%- elif message.role == 'assistant' and not message.tool_calls -%}
        {{- ' ' -}}
        {%- generation -%}
            {{- text_of(message.content) + eos_token -}}
        {%- endgeneration -%}
    {%- else -%}
        {{- raise_exception('the [INST] template has no tool format (found a ' ~ message.role ~ ' message with tool data)') -}}
    {%- endif -%}
{%- endfor -%}
"""
)


@dataclass(frozen=True)
class TemplateFamily:
    """A chat template with the special tokens it writes, and the BOS/EOS it implies."""

    name: str
    template: str
    special_tokens: tuple[str, ...]
    bos_token: str | None
    eos_token: str


TEMPLATE_FAMILIES: dict[str, TemplateFamily] = {
    "chatml": TemplateFamily("chatml", CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>"), None, "<|im_end|>"),
    "llama3": TemplateFamily(
        "llama3",
        LLAMA3_TEMPLATE,
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    "inst": TemplateFamily("inst", INST_TEMPLATE, ("<s>", "</s>", "[INST]", "[/INST]"), "<s>", "</s>"),
}


def tokenizer_with_template(tokenizer: Any, family: str) -> Any:
    """A deep copy of ``tokenizer`` with the family's chat template, BOS and EOS.

    The family's special tokens that are not special added tokens of the tokenizer yet are added
    (verbatim, ``special=True``) to the copy; ``tokenizer`` itself is left untouched. A token new
    to the vocabulary gets an id past it (a model then needs its embeddings resized); one the
    vocabulary already holds as ordinary text (Qwen's ``<s>``) keeps its id and becomes special.
    """
    if family not in TEMPLATE_FAMILIES:
        raise ValueError(f"unknown chat template family {family!r}; expected one of {sorted(TEMPLATE_FAMILIES)}")
    from tokenizers import AddedToken

    spec = TEMPLATE_FAMILIES[family]
    result = copy.deepcopy(tokenizer)
    special = {added.content for added in result.added_tokens_decoder.values() if added.special}
    missing = [token for token in spec.special_tokens if token not in special]
    if missing:
        result.add_tokens([AddedToken(token, special=True, normalized=False) for token in missing], special_tokens=True)
    result.chat_template = spec.template
    result.bos_token = spec.bos_token
    result.eos_token = spec.eos_token
    return result
