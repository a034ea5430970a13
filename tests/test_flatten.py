"""Flat messages and padded batches (NeMo-RL semantics), and the SFT batch tensors."""

from __future__ import annotations

import pytest
import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization.flatten import (
    batched_message_log_to_flat_message,
    message_log_to_flat_messages,
    sft_batch_tensors,
)
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.truncation import truncate_message_log


def two_conversations():
    return [
        [
            {"role": "user", "content": "What is 2+2?", "token_ids": torch.tensor([1, 2, 3, 4, 5])},
            {"role": "assistant", "content": "4", "token_ids": torch.tensor([6, 7])},
        ],
        [
            {"role": "user", "content": "Solve x+10=15", "token_ids": torch.tensor([1, 8, 9, 10, 11, 12])},
            {"role": "assistant", "content": "x=5", "token_ids": torch.tensor([13, 14, 15])},
        ],
    ]


def test_flat_messages_concatenate_tensors_and_list_the_rest():
    flat = message_log_to_flat_messages(two_conversations()[0])
    assert flat["role"] == ["user", "assistant"]
    assert flat["content"] == ["What is 2+2?", "4"]
    assert torch.equal(flat["token_ids"], torch.tensor([1, 2, 3, 4, 5, 6, 7]))
    assert message_log_to_flat_messages([]) == {}


def test_flat_messages_refuse_tensors_of_different_rank():
    log = [{"role": "user", "x": torch.zeros(2)}, {"role": "assistant", "x": torch.zeros(2, 3)}]
    with pytest.raises(ValueError) as error:
        message_log_to_flat_messages(log)
    assert str(error.value) == (
        "tensors for key 'x' must have the same number of dims to be concatenated, found shapes [(2,), (2, 3)]"
    )


def test_batch_matches_nemo_rl_example():
    batch, input_lengths = batched_message_log_to_flat_message(two_conversations(), {"token_ids": 0})
    assert isinstance(batch, BatchedDataDict)
    assert batch["token_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 0, 0], [1, 8, 9, 10, 11, 12, 13, 14, 15]]
    assert batch["content"] == [["What is 2+2?", "4"], ["Solve x+10=15", "x=5"]]
    assert batch["role"] == [["user", "assistant"], ["user", "assistant"]]
    assert input_lengths.dtype == torch.int32
    assert input_lengths.tolist() == [7, 9]


def test_batch_length_is_rounded_up_to_the_multiple_with_per_key_pad_values():
    logs = two_conversations()
    add_loss_mask_to_message_log(logs)
    batch, input_lengths = batched_message_log_to_flat_message(
        logs, {"token_ids": -1}, make_sequence_length_divisible_by=4
    )
    assert batch["token_ids"].tolist() == [
        [1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1, -1],
        [1, 8, 9, 10, 11, 12, 13, 14, 15, -1, -1, -1],
    ]
    assert batch["token_loss_mask"].tolist() == [
        [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
    ]
    assert input_lengths.tolist() == [7, 9]
    exact, _ = batched_message_log_to_flat_message(logs, make_sequence_length_divisible_by=9)
    assert exact["token_ids"].shape == (2, 9)


def test_a_key_missing_from_one_sample_gets_an_all_padding_row():
    logs = two_conversations()
    logs[1][1]["logprobs"] = torch.tensor([0.5, 0.25, 0.125])
    batch, input_lengths = batched_message_log_to_flat_message(logs, {"logprobs": -9})
    assert batch["logprobs"].tolist() == [[-9.0] * 9, [0.5, 0.25, 0.125, -9, -9, -9, -9, -9, -9]]
    assert batch["logprobs"].dtype == torch.float32
    assert input_lengths.tolist() == [7, 9]


def test_inconsistent_dtypes_across_samples_are_refused():
    logs = two_conversations()
    logs[1][0]["token_ids"] = logs[1][0]["token_ids"].to(torch.int32)
    logs[1][1]["token_ids"] = logs[1][1]["token_ids"].to(torch.int32)
    with pytest.raises(ValueError, match=r"key 'token_ids': expected one dtype across samples"):
        batched_message_log_to_flat_message(logs)


def test_empty_batch_and_bad_multiple():
    batch, input_lengths = batched_message_log_to_flat_message([])
    assert dict(batch) == {}
    assert input_lengths.dtype == torch.int32 and input_lengths.numel() == 0
    with pytest.raises(ValueError, match="make_sequence_length_divisible_by must be >= 1, got 0"):
        batched_message_log_to_flat_message(two_conversations(), make_sequence_length_divisible_by=0)


def test_sft_batch_tensors_exact():
    logs = two_conversations()
    add_loss_mask_to_message_log(logs)
    batch = sft_batch_tensors(logs, [1.0, 0.0], pad_token_id=99, make_sequence_length_divisible_by=8)
    assert set(batch) == {"input_ids", "input_lengths", "token_mask", "sample_mask"}
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4, 5, 6, 7] + [99] * 9,
        [1, 8, 9, 10, 11, 12, 13, 14, 15] + [99] * 7,
    ]
    assert batch["input_lengths"].tolist() == [7, 9] and batch["input_lengths"].dtype == torch.int32
    assert batch["token_mask"].tolist() == [[0, 0, 0, 0, 0, 1, 1] + [0] * 9, [0] * 16]
    assert batch["sample_mask"].tolist() == [1.0, 0.0] and batch["sample_mask"].dtype == torch.float32


def test_sft_batch_tensors_checks_its_inputs():
    logs = two_conversations()
    with pytest.raises(ValueError) as error:
        sft_batch_tensors(logs, [1.0, 1.0], pad_token_id=0)
    assert str(error.value) == (
        "sample 0, message 0 has no 'token_loss_mask'; call add_loss_mask_to_message_log on the logs first"
    )
    add_loss_mask_to_message_log(logs)
    with pytest.raises(ValueError) as error:
        sft_batch_tensors(logs, [1.0], pad_token_id=0)
    assert str(error.value) == "got 1 loss_multipliers for 2 message logs; expected one per message log"


def test_real_conversations_end_to_end(tokenizer, chat_conversations):
    logs, multipliers = [], []
    for conversation in chat_conversations[:6]:
        log = get_formatted_message_log(conversation["messages"], tokenizer)
        add_loss_mask_to_message_log([log])
        log, _, multiplier = truncate_message_log(log, 400)
        logs.append(log)
        multipliers.append(multiplier)
    batch = sft_batch_tensors(logs, multipliers, tokenizer.pad_token_id, make_sequence_length_divisible_by=64)
    assert batch["input_ids"].shape[1] % 64 == 0
    for row, (log, multiplier) in enumerate(zip(logs, multipliers)):
        ids = torch.cat([m["token_ids"] for m in log])
        mask = torch.cat([m["token_loss_mask"] for m in log])
        length = len(ids)
        assert batch["input_lengths"][row] == length
        assert torch.equal(batch["input_ids"][row, :length], ids)
        assert (batch["input_ids"][row, length:] == tokenizer.pad_token_id).all()
        assert torch.equal(batch["token_mask"][row, :length], mask * int(multiplier != 0))
        assert not batch["token_mask"][row, length:].any()
        assert batch["sample_mask"][row] == multiplier
    assert 0.0 in multipliers and 1.0 in multipliers
