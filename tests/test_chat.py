"""Chat messages -> message_log: the prefix-render definition, the single-render fast path, the rules."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_data.interfaces import TaskDataSpec
from rl_data.tokenization import chat
from rl_data.tokenization.chat import (
    apply_task_data_spec,
    get_formatted_message_log,
    get_formatted_message_log_reference,
    validate_messages,
)
from rl_data.tokenization.chat_template import CHATML_TEMPLATE, GENERATION_PROMPT, render_chatml
from rl_data.tokenization.validation import ControlTextError

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]  # fmt: skip


def tool_call(call_id, name="lookup", arguments=None):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments or {"word": "x"}}}


SYNTHETIC = {
    "multilingual": [
        {"role": "user", "content": "翻訳してください：東京は日本の首都です。"},
        {"role": "assistant", "content": "Tokyo is the capital of Japan. 日本語も話せます。"},
        {"role": "user", "content": "والآن بالعربية من فضلك"},
        {"role": "assistant", "content": "طوكيو هي عاصمة اليابان."},
        {"role": "user", "content": "और हिंदी में?"},
        {"role": "assistant", "content": "टोक्यो जापान की राजधानी है।"},
    ],
    "emoji": [
        {"role": "user", "content": "🙂🙃 👩‍👩‍👧‍👦 🇯🇵🇮🇳 ✨"},
        {"role": "assistant", "content": "🔥" * 7 + " café / cafe\u0301"},
    ],
    "code_and_whitespace": [
        {"role": "user", "content": "\nFix:\n```python\ndef f(x):\n\treturn x**2  \n```\n\n"},
        {"role": "assistant", "content": "  ```python\ndef f(x):\n    return x ** 2\n```\n"},
        {"role": "user", "content": "   "},
        {"role": "assistant", "content": "\n"},
    ],
    "empty_turns": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "still there?"},
        {"role": "assistant", "content": ""},
    ],
    "system_prompt": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hi."},
        {"role": "system", "content": "A mid-conversation system note."},
        {"role": "user", "content": "Bye"},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Define 'moot' and 'mute'."},
        {"role": "assistant", "content": "Looking both up.",
         "tool_calls": [tool_call("c1", arguments={"word": "moot"}), tool_call("c2", arguments='{"word": "mute"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "moot: open to debate"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "mute: silent"}]},
        {"role": "assistant", "content": "Moot: debatable. Mute: silent."},
    ],
    "tool_call_without_content": [
        {"role": "user", "content": "Define 'x'."},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "x: a letter"},
    ],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Part one, "}, {"type": "text", "text": "part two."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Both parts read."}]},
    ],
    "delimiters_inside_content": [
        {"role": "user", "content": "Explain <|im_end|>\n<|im_start|>assistant\nthis markup"},
        {"role": "assistant", "content": "It is ChatML: <|im_start|>role ... <|im_end|>\n"},
    ],
    "consecutive_users_ending_on_user": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "three"},
        {"role": "user", "content": "four"},
    ],
    "single_user_message": [{"role": "user", "content": "Only a prompt."}],
    "single_assistant_message": [{"role": "assistant", "content": "Only an answer."}],
}


def assert_same_message_logs(actual, expected):
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype == torch.long
                assert got[key].tolist() == value.tolist(), key
            else:
                assert got[key] == value, key


def whole_render_ids(messages, tokenizer, tools=None):
    """Tokens of the whole rendered conversation, with the last-turn rule (no trailing newline, EOS)."""
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False).rstrip("\n")
    if not rendered.endswith(tokenizer.eos_token):
        rendered += tokenizer.eos_token
    return rendered, tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_exact_message_log_of_a_short_conversation(tokenizer):
    messages = [{"role": "user", "content": "Hello assistant"}, {"role": "assistant", "content": "Hello user"}]
    log = get_formatted_message_log(messages, tokenizer)
    assert [m["role"] for m in log] == ["user", "assistant"]
    assert [m["content"] for m in log] == [
        "<|im_start|>user\nHello assistant<|im_end|>\n",
        "<|im_start|>assistant\nHello user<|im_end|>",
    ]
    assert [m["token_ids"].tolist() for m in log] == [
        [151644, 872, 198, 9707, 17847, 151645, 198],
        [151644, 77091, 198, 9707, 1196, 151645],
    ]
    assert messages == [{"role": "user", "content": "Hello assistant"}, {"role": "assistant", "content": "Hello user"}]


def test_single_render_equals_prefix_renders_on_1000_real_conversations(tokenizer, chat_conversations):
    for index, conversation in enumerate(chat_conversations[:1000]):
        messages = conversation["messages"][:8]
        generation_prompt = index % 2 == 1
        assert_same_message_logs(
            get_formatted_message_log(messages, tokenizer, add_generation_prompt=generation_prompt),
            get_formatted_message_log_reference(messages, tokenizer, add_generation_prompt=generation_prompt),
        )


def test_single_render_equals_prefix_renders_on_full_length_real_conversations(tokenizer, chat_conversations):
    for conversation in chat_conversations[1000:1030]:
        messages = conversation["messages"]
        assert_same_message_logs(
            get_formatted_message_log(messages, tokenizer), get_formatted_message_log_reference(messages, tokenizer)
        )


def test_turns_concatenate_to_the_whole_render_on_1000_full_real_conversations(
    tokenizer, chat_conversations, monkeypatch
):
    def no_fallback(*args):
        raise AssertionError("the single-render path should handle every real conversation")

    assert chat.formatting_path(tokenizer).kind == "linear"  # decided (by probing) before the patch
    monkeypatch.setattr(chat, "_chunks_from_prefix_renders", no_fallback)
    conversations = [c["messages"] for c in chat_conversations[:1000]]
    logs = [get_formatted_message_log(messages, tokenizer) for messages in conversations]
    rendered = [tokenizer.apply_chat_template(m, tokenize=False).rstrip("\n") for m in conversations]
    assert all(text.endswith(tokenizer.eos_token) for text in rendered)
    whole_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    for log, text, ids in zip(logs, rendered, whole_ids):
        assert "".join(m["content"] for m in log) == text
        assert torch.cat([m["token_ids"] for m in log]).tolist() == ids


def test_plain_renderer_equals_the_jinja_render_on_1000_real_conversations(tokenizer, chat_conversations):
    for index, conversation in enumerate(chat_conversations[:1000]):
        messages = conversation["messages"]
        options = {"tools": TOOLS if index % 3 == 0 else None, "add_generation_prompt": index % 2 == 1}
        assert render_chatml(messages, **options) == tokenizer.apply_chat_template(messages, tokenize=False, **options)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_plain_renderer_equals_the_jinja_render_on_synthetic_conversations(tokenizer, name):
    for tools in (None, TOOLS, []):
        for generation_prompt in (False, True):
            expected = tokenizer.apply_chat_template(
                SYNTHETIC[name], tools=tools, add_generation_prompt=generation_prompt, tokenize=False
            )
            assert render_chatml(SYNTHETIC[name], tools, generation_prompt) == expected


def test_plain_renderer_leaves_what_it_does_not_model_to_jinja(tokenizer):
    unsupported = [
        [{"role": "assistant", "content": "x", "tool_calls": None}],
        [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
        [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}],
        [{"role": "bot", "content": "x"}],
    ]
    assert [render_chatml(messages) for messages in unsupported] == [None, None, None, None]
    assert render_chatml([{"role": "user", "content": "x"}], tools=[len]) is None


def test_real_conversations_are_tokenized_in_one_call_split_at_turn_starts(tokenizer, chat_conversations, monkeypatch):
    monkeypatch.setenv("RL_DATA_TIKTOKEN", "0")  # the backend path (tiktoken's: tests/test_fast_encode.py)
    calls = []

    class CountingBackend:
        def __getattr__(self, name):
            return getattr(tokenizer.backend_tokenizer, name)

        def encode_batch_fast(self, texts, **kwargs):
            calls.extend(texts)
            return tokenizer.backend_tokenizer.encode_batch_fast(texts, **kwargs)

    class CountingTokenizer:
        backend_tokenizer = CountingBackend()

        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text, **kwargs):
            calls.append(text)
            return tokenizer(text, **kwargs)

    for conversation in chat_conversations[:200]:
        calls.clear()
        log = get_formatted_message_log(conversation["messages"], CountingTokenizer())
        assert calls == ["".join(m["content"] for m in log)]
        assert torch.cat([m["token_ids"] for m in log]).tolist() == tokenizer(calls[0], add_special_tokens=False)["input_ids"]
        assert [len(m["token_ids"]) for m in log] == [len(tokenizer(m["content"])["input_ids"]) for m in log]


def test_the_rust_backend_is_called_directly_only_when_it_encodes_like_the_tokenizer(tokenizer, chat_conversations):
    conversations = [c["messages"] for c in chat_conversations[:50]]
    direct = [get_formatted_message_log(messages, tokenizer) for messages in conversations]
    truncating = copy.deepcopy(tokenizer)
    truncating.backend_tokenizer.enable_truncation(max_length=8)  # the backend alone would cut every text
    through_call = [get_formatted_message_log(messages, truncating) for messages in conversations]
    for first, second in zip(direct, through_call):
        assert_same_message_logs(first, second)
    assert max(sum(len(m["token_ids"]) for m in log) for log in direct) > 8


def test_turns_after_a_mid_conversation_generation_prompt_are_encoded_apart(tokenizer):
    # "assistant\n" + "\n\nHi": in one text the newlines merge into one token across the turn boundary
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\n\nHi"}]
    log = get_formatted_message_log(messages, tokenizer, add_generation_prompt=True)
    assert [m["content"] for m in log] == ["<|im_start|>user\nQ<|im_end|>\n" + GENERATION_PROMPT, "\n\nHi<|im_end|>"]
    assert_same_message_logs(log, get_formatted_message_log_reference(messages, tokenizer, add_generation_prompt=True))
    joined = tokenizer("".join(m["content"] for m in log), add_special_tokens=False)["input_ids"]
    assert torch.cat([m["token_ids"] for m in log]).tolist() != joined


def _encode_whole_and_split(chunks, tokenizer):
    """Each chunk's ids from one call on the joined text (None where the turn cuts are not provable)."""
    cuts = chat._turn_cuts(chunks, tokenizer)
    return None if cuts is None else chat._split_at_turns(chat.text_encoder(tokenizer).encode("".join(chunks)), cuts)


def test_a_tokenizer_without_the_special_turn_start_is_encoded_per_turn(tokenizer):
    messages = SYNTHETIC["system_prompt"]
    split = _encode_whole_and_split(["<|im_start|>a", "<|im_start|>b"], tokenizer)
    assert [ids.tolist() for ids in split] == [[151644, 64], [151644, 65]]
    # a boundary right after a special token is cut there too; one touching none is not provable
    split = _encode_whole_and_split(["a<|im_end|>", "b<|im_end|>", "<|im_start|>c"], tokenizer)
    assert [ids.tolist() for ids in split] == [[64, 151645], [65, 151645], [151644, 66]]
    assert _encode_whole_and_split(["a<|im_end|>\n", "b"], tokenizer) is None
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = CHATML_TEMPLATE
    plain.convert_tokens_to_ids = lambda token: None
    assert _encode_whole_and_split(["<|im_start|>a", "<|im_start|>b"], plain) is None
    assert_same_message_logs(
        get_formatted_message_log(messages, plain), get_formatted_message_log_reference(messages, tokenizer)
    )


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
def test_synthetic_conversations_match_the_definition_and_the_whole_render(tokenizer, name, tools):
    messages = SYNTHETIC[name]
    original = copy.deepcopy(messages)
    control = "plain_text" if name == "delimiters_inside_content" else "reject"
    for generation_prompt in (False, True):
        options = {"add_generation_prompt": generation_prompt, "tools": tools, "control_text": control}
        fast = get_formatted_message_log(messages, tokenizer, **options)
        reference = get_formatted_message_log_reference(messages, tokenizer, **options)
        assert_same_message_logs(fast, reference)
    if control == "plain_text":  # the whole render would encode the content's delimiters as control tokens
        with pytest.raises(ControlTextError):
            get_formatted_message_log(messages, tokenizer, tools=tools)
        assert messages == original
        return
    log = get_formatted_message_log(messages, tokenizer, tools=tools)
    rendered, ids = whole_render_ids(messages, tokenizer, tools)
    assert "".join(m["content"] for m in log) == rendered
    assert torch.cat([m["token_ids"] for m in log]).tolist() == ids
    assert messages == original


def test_delimiters_inside_content_fall_back_to_prefix_renders(tokenizer, monkeypatch):
    messages = SYNTHETIC["delimiters_inside_content"] + [{"role": "user", "content": "And now?"}]
    chat.formatting_path(tokenizer)
    calls = []
    real = chat._chunks_from_prefix_renders
    monkeypatch.setattr(chat, "_chunks_from_prefix_renders", lambda *a: calls.append(1) or real(*a))
    get_formatted_message_log(messages, tokenizer, control_text="plain_text")
    assert calls == []  # the content's delimiters are hidden while the template renders
    # a tokenizer without these control tokens sees a turn end in a middle turn: only the reference is exact
    monkeypatch.setattr(chat, "find_control_text", lambda *a: None)
    get_formatted_message_log(messages, tokenizer)
    assert calls == [1]
    # two turns need no turn end: the first ends where the render of the first message ends
    get_formatted_message_log(messages[:2], tokenizer)
    get_formatted_message_log(SYNTHETIC["multilingual"], tokenizer)
    assert calls == [1]
    # a middle string ending with the beginning of a turn end could complete one with the template's text
    straddling = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "ends with <|im_"}, messages[2]]
    log = get_formatted_message_log(straddling, tokenizer)
    assert calls == [1, 1]
    assert_same_message_logs(log, get_formatted_message_log_reference(straddling, tokenizer))


def test_prefix_renders_of_the_chatml_template_need_no_jinja(tokenizer, monkeypatch):
    # a long chat with an emoticon ending a middle turn (">_<", the beginning of "<|im_end|>")
    # takes the prefix renders: one per message, ~10x faster without Jinja, the same text
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + (">_<" if i == 5 else "ok")}
        for i in range(40)
    ]
    reference = get_formatted_message_log_reference(messages, tokenizer, add_generation_prompt=True)
    chat.formatting_path(tokenizer)
    jinja_renders = []
    real = chat._render
    monkeypatch.setattr(chat, "_render", lambda *a: jinja_renders.append(1) or real(*a))
    prefix_renders = []
    real_prefix = chat._chunks_from_prefix_renders
    monkeypatch.setattr(chat, "_chunks_from_prefix_renders", lambda *a: prefix_renders.append(1) or real_prefix(*a))
    log = get_formatted_message_log(messages, tokenizer, add_generation_prompt=True)
    assert prefix_renders == [1] and jinja_renders == []
    assert_same_message_logs(log, reference)


_PIECES = ["a", "Z", " ", "\n", "\n\n", "é", "e\u0301", "日本", "🙂", "{", "}", "'s", "123",
           "<|im_end|>", "<|im_start|>", "<|im_end|>\n", "<tool_call>", "<think>", "<|endoftext|>"]  # fmt: skip
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)
_MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _TEXT}),
    min_size=1,
    max_size=6,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=_MESSAGES, generation_prompt=st.booleans(), with_tools=st.booleans())
def test_single_render_equals_prefix_renders_on_generated_conversations(
    tokenizer, messages, generation_prompt, with_tools
):
    options = {"add_generation_prompt": generation_prompt, "tools": TOOLS if with_tools else None,
               "control_text": "plain_text"}
    assert_same_message_logs(
        get_formatted_message_log(messages, tokenizer, **options),
        get_formatted_message_log_reference(messages, tokenizer, **options),
    )


def test_generation_prompt_only_after_user_and_tool_turns(tokenizer):
    log = get_formatted_message_log(SYNTHETIC["tool_calls"], tokenizer, add_generation_prompt=True)
    assert [m["content"].endswith(GENERATION_PROMPT) for m in log[:-1]] == [False, True, False, True, True]
    assert log[3]["content"] == "<|im_start|>user\n<tool_response>\nmoot: open to debate\n</tool_response><|im_end|>\n" + GENERATION_PROMPT
    # the next turn starts where the previous render differs: after the shared "<|im_start|>"
    assert log[4]["content"].startswith("user\n<tool_response>\nmute")
    assert log[5]["content"] == "Moot: debatable. Mute: silent.<|im_end|>"


def test_last_turn_loses_trailing_newlines_and_gets_eos_once_but_a_generation_prompt_stays_whole(tokenizer):
    prompt_only = [{"role": "user", "content": "Q?"}]
    with_eos = get_formatted_message_log(prompt_only, tokenizer, add_generation_prompt=True)
    assert with_eos[-1]["content"] == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n<|im_end|>"
    without_eos = get_formatted_message_log(prompt_only, tokenizer, add_generation_prompt=True, add_eos_token=False)
    assert without_eos[-1]["content"] == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    assert without_eos[-1]["token_ids"].tolist() == [151644, 872, 198, 48, 30, 151645, 198, 151644, 77091, 198]
    reference = get_formatted_message_log_reference(prompt_only, tokenizer, add_generation_prompt=True, add_eos_token=False)
    assert reference[-1]["content"] == without_eos[-1]["content"]
    answered = get_formatted_message_log(prompt_only + [{"role": "assistant", "content": "A."}], tokenizer)
    assert answered[-1]["content"] == "<|im_start|>assistant\nA.<|im_end|>"
    assert answered[-1]["token_ids"].tolist()[-1] == tokenizer.eos_token_id
    assert (answered[-1]["token_ids"] == tokenizer.eos_token_id).sum() == 1


def test_bos_is_added_to_the_first_turn_only_when_missing(tokenizer):
    with_bos = copy.deepcopy(tokenizer)
    with_bos.bos_token = "<|endoftext|>"
    messages = SYNTHETIC["system_prompt"]
    log = get_formatted_message_log(messages, with_bos)
    assert log[0]["content"] == "<|endoftext|><|im_start|>system\nYou are terse.<|im_end|>\n"
    assert log[0]["token_ids"].tolist()[:2] == [151643, 151644]
    assert [m["token_ids"].tolist().count(151643) for m in log] == [1, 0, 0, 0, 0]
    assert get_formatted_message_log(messages, with_bos, add_bos_token=False)[0]["content"].startswith("<|im_start|>")
    with_bos.chat_template = "{{- bos_token }}" + CHATML_TEMPLATE  # the template writes BOS itself
    assert get_formatted_message_log(messages, with_bos)[0]["content"].count("<|endoftext|>") == 1
    no_bos = get_formatted_message_log(messages, tokenizer)  # Qwen has no BOS: nothing is added
    assert no_bos[0]["content"] == "<|im_start|>system\nYou are terse.<|im_end|>\n"


def test_other_templates_follow_the_prefix_definition(tokenizer):
    other = copy.deepcopy(tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    log = get_formatted_message_log(SYNTHETIC["emoji"], other)
    assert [m["content"] for m in log] == ["[user] 🙂🙃 👩‍👩‍👧‍👦 🇯🇵🇮🇳 ✨\n", "[assistant] " + "🔥" * 7 + " café / cafe\u0301<|im_end|>"]


def test_task_prompt_formats_the_first_user_turn_and_system_prompt_is_prepended(tokenizer, tmp_path):
    (tmp_path / "prompt.txt").write_text("Question: {}\nAnswer briefly.", encoding="utf-8")
    (tmp_path / "system.txt").write_text("You are a quiz bot. ✅", encoding="utf-8")
    spec = TaskDataSpec(task_name="quiz", prompt_file=tmp_path / "prompt.txt", system_prompt_file=tmp_path / "system.txt")
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]
    log = get_formatted_message_log(messages, tokenizer, spec)
    assert [m["content"] for m in log] == [
        "<|im_start|>system\nYou are a quiz bot. ✅<|im_end|>\n",
        "<|im_start|>user\nQuestion: 2+2?\nAnswer briefly.<|im_end|>\n",
        "<|im_start|>assistant\n4<|im_end|>\n",
        "<|im_start|>user\n3+3?<|im_end|>",
    ]
    assert_same_message_logs(log, get_formatted_message_log_reference(messages, tokenizer, spec))
    with_system = [{"role": "system", "content": "Own system."}] + [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert apply_task_data_spec(with_system, spec) == [
        {"role": "system", "content": "Own system."},
        {"role": "user", "content": [{"type": "text", "text": "Question: a\nAnswer briefly."},
                                     {"type": "text", "text": "b"}]},  # the prompt once, on the first text part
    ]  # fmt: skip
    assert with_system[1]["content"][0]["text"] == "a"


def test_a_prompt_that_cannot_be_formatted_is_a_clear_error(tokenizer, tmp_path):
    (tmp_path / "prompt.txt").write_text("Return JSON {\"answer\": {}}", encoding="utf-8")
    spec = TaskDataSpec(prompt_file=tmp_path / "prompt.txt")
    with pytest.raises(ValueError) as error:
        get_formatted_message_log([{"role": "user", "content": "x"}], tokenizer, spec)
    assert str(error.value) == (
        "task_data_spec.prompt 'Return JSON {\"answer\": {}}' cannot be applied with str.format "
        "(KeyError('\"answer\"')); expected exactly one '{}' placeholder, with literal braces written as '{{' and '}}'"
    )


BAD_INPUTS = [
    ([], "conversation is empty: expected at least one message"),
    ("hello", "conversation must be a list of message dicts, found str"),
    ([{"role": "user", "content": "hi"}, "oops"], "message 1: expected a dict with 'role' and 'content', found str"),
    ([{"content": "hi"}], "message 0: missing key 'role'; expected one of 'system', 'user', 'assistant', 'tool'"),
    ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "hey"}],
     "message 1: unknown role 'bot'; expected one of 'system', 'user', 'assistant', 'tool'"),
    ([{"role": "user"}],
     "message 0 (user): missing key 'content'; expected a str or a list of {'type': 'text', 'text': str} parts"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": 42}],
     "message 1 (assistant): content must be a str or a list of {'type': 'text', 'text': str} parts, found int"),
    ([{"role": "user", "content": None}],
     "message 0 (user): content must be a str or a list of {'type': 'text', 'text': str} parts, found NoneType"),
    ([{"role": "user", "content": {"text": "hi"}}],
     "message 0 (user): content must be a str or a list of {'type': 'text', 'text': str} parts, found dict"),
    ([{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "image": "x.png"}]}],
     "message 0 (user): content part 1 has unknown type 'image'; expected 'text' (only text parts are supported)"),
    ([{"role": "user", "content": ["plain string part"]}],
     "message 0 (user): content part 0 must be a dict like {'type': 'text', 'text': str}, found str"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}],
     "message 0 (user): content part 0 needs a str 'text', found int"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}],
     "message 1 (tool): no earlier assistant message made a tool call; "
     "expected a tool message to answer an earlier assistant 'tool_calls' entry"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [tool_call("c1")]},
      {"role": "tool", "tool_call_id": "c9", "content": "42"}],
     "message 2 (tool): tool_call_id 'c9' was not issued by an earlier assistant tool call; expected one of ['c1']"),
    ([{"role": "user", "content": "hi", "tool_calls": [tool_call("c1")]}],
     "message 0 (user): only assistant messages may carry 'tool_calls'"),
    ([{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}],
     "message 0 (assistant): 'tool_calls' must be a list of dicts, found {'name': 'f'}"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
     "message 0 (assistant): tool call 0 has no function name; "
     "expected {'function': {'name': str, 'arguments': dict or JSON str}}"),
    ([{"role": "assistant", "content": "", "tool_calls": [tool_call("c1"), tool_call("c2", arguments=[1])]}],
     "message 0 (assistant): tool call 1 arguments must be a dict or a JSON string, found list"),
]  # fmt: skip


@pytest.mark.parametrize(("messages", "message"), BAD_INPUTS, ids=[m[:40] for _, m in BAD_INPUTS])
def test_bad_input_is_a_value_error_naming_index_and_expectation(tokenizer, messages, message):
    with pytest.raises(ValueError) as error:
        validate_messages(messages)
    assert str(error.value) == message
    for encode in (get_formatted_message_log, get_formatted_message_log_reference):
        with pytest.raises(ValueError) as error:
            encode(messages, tokenizer)
        assert str(error.value) == message


def test_a_tool_answer_without_id_is_accepted_after_a_tool_call():
    validate_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"name": "lookup", "arguments": {}}]},
        {"role": "tool", "content": "result"},
    ])  # fmt: skip
