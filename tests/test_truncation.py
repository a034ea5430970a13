"""The over-length rule: min(4, max_seq_length // n_messages) tokens per message, loss multiplier 0."""

from __future__ import annotations

import pytest
import torch

from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.truncation import message_log_length, truncate_message_log


def make_log(*lengths):
    log = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}", "token_ids": torch.arange(10 * i, 10 * i + n)}
           for i, n in enumerate(lengths)]  # fmt: skip
    add_loss_mask_to_message_log([log])
    return log


def test_length_is_the_token_total():
    assert message_log_length(make_log(3, 0, 5)) == 8


def test_shorter_than_the_limit_is_unchanged():
    log = make_log(3, 5)
    assert truncate_message_log(log, 9) == (log, 8, 1.0)
    assert truncate_message_log(log, 9)[0] is log


def test_reaching_the_limit_keeps_four_tokens_per_message_and_zeroes_the_multiplier():
    log = make_log(6, 7, 5)
    truncated, length, multiplier = truncate_message_log(log, 18)  # 18 >= 18 -> truncate
    assert (length, multiplier) == (12, 0.0)
    assert [m["token_ids"].tolist() for m in truncated] == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]
    assert [m["token_loss_mask"].tolist() for m in truncated] == [[0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert [(m["role"], m["content"]) for m in truncated] == [("user", "m0"), ("assistant", "m1"), ("user", "m2")]
    assert [len(m["token_ids"]) for m in log] == [6, 7, 5]  # the input log is not modified


def test_small_limits_keep_max_seq_length_over_n_messages_tokens():
    log = make_log(6, 1, 9, 4, 3)  # 5 messages, 23 tokens
    truncated, length, multiplier = truncate_message_log(log, 12)  # keep min(4, 12 // 5) = 2
    assert [m["token_ids"].tolist() for m in truncated] == [[0, 1], [10], [20, 21], [30, 31], [40, 41]]
    assert (length, multiplier) == (9, 0.0)
    truncated, length, _ = truncate_message_log(log, 4)  # keep min(4, 4 // 5) = 0
    assert [len(m["token_ids"]) for m in truncated] == [0, 0, 0, 0, 0]
    assert length == 0


def test_messages_without_a_loss_mask_are_cut_too():
    log = [{"role": "user", "content": "x", "token_ids": torch.arange(9)}]
    truncated, length, multiplier = truncate_message_log(log, 5)
    assert truncated == [{"role": "user", "content": "x", "token_ids": truncated[0]["token_ids"]}]
    assert truncated[0]["token_ids"].tolist() == [0, 1, 2, 3]
    assert (length, multiplier) == (4, 0.0)


def test_non_positive_limit_is_refused():
    with pytest.raises(ValueError, match="max_seq_length must be a positive number of tokens, got 0"):
        truncate_message_log(make_log(1), 0)


def test_real_long_conversation(tokenizer, chat_conversations):
    log = get_formatted_message_log(chat_conversations[0]["messages"], tokenizer)
    full = message_log_length(log)
    assert (len(log), full) == (35, 776)
    truncated, length, multiplier = truncate_message_log(log, 512)
    assert (length, multiplier) == (35 * 4, 0.0)
    assert truncated[1]["token_ids"].tolist() == log[1]["token_ids"][:4].tolist() == [151644, 77091, 198, 1312]
    assert truncate_message_log(log, full + 1)[1:] == (full, 1.0)
