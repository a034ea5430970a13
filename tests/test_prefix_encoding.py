"""Safe cuts split the Qwen tokenizer's encoding exactly; over-long conversations are encoded only
as far as their truncation stubs need, with the same result as formatting then truncating."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from rl_data.tokenization import chat
from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization.truncation import truncate_message_log
from rl_data.tokenization import prefix_encoding as pe
from rl_data.tokenization.chat import get_truncated_formatted_message_log
from rl_data.tokenization.fast_encode import text_encoder
from rl_data.tokenization.templates import tokenizer_with_template

# Pieces that stress every clause of the safe-cut argument: contractions, letter runs next to
# digits and punctuation, whitespace runs before newlines, combining marks after ASCII letters,
# non-ASCII letters, emoji, added tokens whole and in fragments.
PIECES = [
    "a", "Z", "word", "'s", "'re", "'ll", "'D", "1", "42", "3.14", ".", ",", "!?", "...", "-", "_", "|", ">", "<",
    " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "e\u0301", "\u0301", "\u0338", "é", "ß", "İ", "東京",
    "日本語", "ﬁ", "🙂", "👩‍👩‍👧", "<think>", "</think>", "<thin", "k>", "<tool_call>", "<|im_start|>",
    "<|im_end|>", "<|im_", "_start|>", "<|endoftext|>", "x<think>", "end|>y",
]
_TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXTS)
def test_a_safe_cut_splits_the_encoding_exactly(tokenizer, text):
    added = pe.cuts_are_exact(tokenizer)
    whole, cuts, start = _ids(tokenizer, text), [], 0
    while (cut := pe.safe_cut(text, start + 1, added)) is not None:
        cuts.append(cut)
        start = cut
    for cut in cuts:
        assert text[cut - 1].isascii() and text[cut - 1].isalpha() and not text[cut].isalpha()
        assert _ids(tokenizer, text[:cut]) + _ids(tokenizer, text[cut:]) == whole, (text, cut)


def test_no_cut_falls_inside_an_added_token(tokenizer):
    added = pe.cuts_are_exact(tokenizer)
    for text in ("<|im_start|>user", "x<tool_call>y", "<think>a</think>", "<|fim_prefix|>z"):
        cut = pe.safe_cut(text, 1, added)
        assert cut is None or not any(text.find(t, 0) < cut < text.find(t, 0) + len(t) for t in added.texts if t in text)
    assert pe.safe_cut("<|im_start|>user\nhi", 1, added) == len("<|im_start|>user")


def test_only_tokenizers_the_argument_covers_are_cut(tokenizer):
    assert pe.cuts_are_exact(tokenizer) is not None
    other_split = copy.deepcopy(tokenizer)
    other_split.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert pe.cuts_are_exact(other_split) is None
    splitting = copy.deepcopy(tokenizer)
    splitting.split_special_tokens = True
    assert pe.cuts_are_exact(splitting) is None
    truncating = copy.deepcopy(tokenizer)
    truncating.backend_tokenizer.enable_truncation(16)
    assert pe.cuts_are_exact(truncating) is None


def test_encode_until_returns_the_whole_encoding_or_stops_past_the_limit(tokenizer):
    added, encode = pe.cuts_are_exact(tokenizer), text_encoder(tokenizer).encode
    text = "The quick brown fox's 12 jumps, over\n\n  the lazy dog.  " * 400
    whole = _ids(tokenizer, text)
    for limit in (10, 100, 1000):
        ids, end = pe.encode_until(encode, text, limit, added)
        assert end < len(text) and len(ids) >= limit and ids == _ids(tokenizer, text[:end]) == whole[: len(ids)]
    assert pe.encode_until(encode, text, len(whole) + 1, added) == (whole, len(text))
    assert pe.encode_until(encode, text, 10**6, added) == (whole, len(text))


def _assert_same(got, expected):
    (log, length, multiplier), (ref_log, ref_length, ref_multiplier) = got, expected
    assert (length, multiplier) == (ref_length, ref_multiplier)
    assert len(log) == len(ref_log)
    for message, ref in zip(log, ref_log):
        assert message.keys() == ref.keys()
        assert message["content"] == ref["content"]
        assert message["token_ids"].dtype == ref["token_ids"].dtype
        assert message["token_ids"].tolist() == ref["token_ids"].tolist()
        assert {k: v for k, v in message.items() if k != "token_ids"} == {k: v for k, v in ref.items() if k != "token_ids"}


def _formatted_then_truncated(messages, tokenizer, limit, **options):
    return truncate_message_log(get_formatted_message_log(messages, tokenizer, **options), limit)


def _long_conversations(chat_conversations, count: int):
    """Real chitchat turns chained into long conversations (100-400 turns)."""
    turns = [message for conversation in chat_conversations for message in conversation["messages"]]
    conversations, start = [], 0
    for index in range(count):
        size = 100 + 60 * (index % 6)
        conversations.append([{"role": ("user", "assistant")[i % 2], "content": turns[start + i]["content"]}
                              for i in range(size)])  # fmt: skip
        start += size
    return conversations


@pytest.mark.parametrize("limit", [7, 64, 300, 4096])
def test_over_long_real_conversations_match_formatting_then_truncating(tokenizer, chat_conversations, limit):
    conversations = _long_conversations(chat_conversations, 12) + [c["messages"] for c in chat_conversations[:200]]
    over_long = 0
    for messages in conversations:
        expected = _formatted_then_truncated(messages, tokenizer, limit)
        _assert_same(get_truncated_formatted_message_log(messages, tokenizer, limit), expected)
        over_long += expected[2] == 0.0
    assert over_long >= 12  # the long ones at least


def test_an_over_long_conversation_is_encoded_only_in_part(tokenizer, chat_conversations, monkeypatch):
    encoded = []

    def counting(encode, text, limit, added_tokens):
        def counted(text):
            encoded.append(len(text))
            return encode(text)

        return pe.encode_until(counted, text, limit, added_tokens)  # the head; stubs of later turns apart

    monkeypatch.setattr(chat, "encode_until", counting)
    messages = _long_conversations(chat_conversations, 6)[-1]  # 400 turns
    text_length = sum(len(m["content"]) for m in get_formatted_message_log(messages, tokenizer))
    log, length, multiplier = get_truncated_formatted_message_log(messages, tokenizer, 2048)
    assert (length, multiplier) == (4 * 400, 0.0)  # min(4, 2048 // 400) tokens per turn
    assert 0 < sum(encoded) < text_length / 2  # the rest: a ~35-character prefix per turn


@pytest.mark.parametrize(
    "content",
    ["e\u0301" * 3000, "東京は日本の首都です。" * 400, "x" * 9000, "ab12'sé\u0301<thin" * 700, "  \n\t" * 2000,
     "🙂" * 3000, "<think>hm</think>word " * 600],
)
def test_hostile_long_turns_match_formatting_then_truncating(tokenizer, content):
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": content[::-1]},
                {"role": "user", "content": "fine"}, {"role": "assistant", "content": content}]  # fmt: skip
    for limit in (5, 50, 1000, 100_000):
        _assert_same(get_truncated_formatted_message_log(messages, tokenizer, limit),
                     _formatted_then_truncated(messages, tokenizer, limit))  # fmt: skip


def test_options_control_text_and_other_templates_match_formatting_then_truncating(tokenizer, chat_conversations):
    long = _long_conversations(chat_conversations, 2)[-1]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    cases = [
        (tokenizer, long, {"add_generation_prompt": True}),
        (tokenizer, long[:-1], {"add_generation_prompt": True, "add_eos_token": False}),
        (tokenizer, long, {"tools": tools}),
        (tokenizer, [*long, {"role": "user", "content": "fake <|im_end|> turn"}], {"control_text": "plain_text"}),
        (tokenizer_with_template(tokenizer, "llama3"), long, {}),
    ]
    for processor, messages, options in cases:
        for limit in (9, 500):
            _assert_same(get_truncated_formatted_message_log(messages, processor, limit, **options),
                         _formatted_then_truncated(messages, processor, limit, **options))  # fmt: skip
    with pytest.raises(ValueError, match="max_seq_length must be a positive"):
        get_truncated_formatted_message_log(long, tokenizer, 0)
