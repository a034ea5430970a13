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
"""

from __future__ import annotations

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
