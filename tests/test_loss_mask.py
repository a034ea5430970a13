"""Token loss masks per role, and only the final message."""

from __future__ import annotations

import torch

from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log


def make_log(*roles_and_lengths):
    return [{"role": role, "content": role, "token_ids": torch.arange(length)} for role, length in roles_and_lengths]


def masks(log):
    return [m["token_loss_mask"].tolist() for m in log]


def test_assistant_tokens_are_trained_by_default():
    logs = [make_log(("system", 2), ("user", 3), ("assistant", 2), ("tool", 1), ("assistant", 1)), make_log(("user", 1))]
    add_loss_mask_to_message_log(logs)
    assert masks(logs[0]) == [[0, 0], [0, 0, 0], [1, 1], [0], [1]]
    assert masks(logs[1]) == [[0]]
    for message in logs[0]:
        assert message["token_loss_mask"].dtype == message["token_ids"].dtype
        assert message["token_loss_mask"].shape == message["token_ids"].shape


def test_roles_to_train_on_are_case_insensitive_and_configurable():
    log = make_log(("user", 2), ("assistant", 1), ("tool", 2))
    add_loss_mask_to_message_log([log], roles_to_train_on=["User", "TOOL"])
    assert masks(log) == [[1, 1], [0], [1, 1]]


def test_only_unmask_final_trains_the_last_message_whatever_its_role():
    ends_on_user = make_log(("assistant", 2), ("user", 3))
    ends_on_assistant = make_log(("user", 1), ("assistant", 2), ("assistant", 2))
    add_loss_mask_to_message_log([ends_on_user, ends_on_assistant], only_unmask_final=True)
    assert masks(ends_on_user) == [[0, 0], [1, 1, 1]]
    assert masks(ends_on_assistant) == [[0], [0, 0], [1, 1]]


def test_masks_replace_existing_ones_and_handle_empty_messages():
    log = make_log(("user", 0), ("assistant", 2))
    log[1]["token_loss_mask"] = torch.tensor([0, 0])
    add_loss_mask_to_message_log([log])
    assert masks(log) == [[], [1, 1]]
    assert log[0]["token_loss_mask"].dtype == torch.long


def test_real_conversation_mask_covers_exactly_the_assistant_turns(tokenizer, chat_conversations):
    messages = chat_conversations[0]["messages"][:4]
    log = get_formatted_message_log(messages, tokenizer)
    add_loss_mask_to_message_log([log])
    trained = torch.cat([m["token_ids"][m["token_loss_mask"].bool()] for m in log])
    assert tokenizer.decode(trained) == (
        "<|im_start|>assistant\nwhats up MD\nim doing good\nhow are you doing?<|im_end|>\n"
        "<|im_start|>assistant\noh wow haha\nso you still feel tired huh?<|im_end|>"
    )
