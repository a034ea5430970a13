"""Padded training tensors made where the data is made (``task_encoders.collate``), and the
loader's ``batch_format`` option that selects them."""

from __future__ import annotations

import copy

import pytest
import torch
from energon_fixtures import make_loader

from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.collate import padded_sft_tensors
from rl_data.tokenization.flatten import sft_batch_tensors
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.truncation import truncate_message_log


def _trainer_side(logs, multipliers, pad_token_id, pad_multiple, only_unmask_final):
    """What a trainer computes from message logs (the reference)."""
    logs = copy.deepcopy(logs)
    add_loss_mask_to_message_log(logs, roles_to_train_on=("assistant",), only_unmask_final=only_unmask_final)
    return sft_batch_tensors(logs, multipliers, pad_token_id, pad_multiple)


@pytest.mark.parametrize("only_unmask_final", [False, True])
@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_padded_tensors_equal_the_trainer_side_flattening(tokenizer, chat_conversations, only_unmask_final, pad_multiple):
    adapter = ProcessorAdapter(tokenizer, 256)
    logs, multipliers = [], []
    for conversation in chat_conversations[:12]:
        log, _, multiplier = truncate_message_log(adapter.format(conversation["messages"]), 256)
        logs.append(log)
        multipliers.append(multiplier)
    assert 0.0 in multipliers and 1.0 in multipliers  # some conversations were cut to stubs
    made = padded_sft_tensors(
        logs, multipliers, pad_token_id=adapter.pad_token_id, pad_multiple=pad_multiple, only_unmask_final=only_unmask_final
    )
    expected = _trainer_side(logs, multipliers, adapter.pad_token_id, pad_multiple, only_unmask_final)
    assert sorted(made) == sorted(expected) == ["input_ids", "input_lengths", "sample_mask", "token_mask"]
    for key in expected:
        assert made[key].dtype == expected[key].dtype, key
        assert torch.equal(made[key], expected[key]), key
    assert made["input_ids"].shape[1] % pad_multiple == 0
    assert int(made["token_mask"].sum()) > 0


def test_padded_tensors_refuse_a_multiplier_count_that_does_not_match():
    log = [{"role": "user", "token_ids": torch.tensor([1, 2])}]
    with pytest.raises(ValueError, match="got 2 loss_multipliers for 1 message logs"):
        padded_sft_tensors([log], [1.0, 1.0], pad_token_id=0)


#: A train loader of batches of 4, padded to multiples of 8, in loops of 3 batches.
LOADER = {"energon": {"shuffle_buffer_size": 8, "max_samples_per_sequence": 4}, "source": {"virtual_epoch_length": 3},
          "sequence_length_pad_multiple": 8, "placement_fingerprint": "test"}
MESSAGE_LOGS = {"batch_format": "message_log"}


def test_loader_ships_padded_tensors_by_default_and_message_logs_on_request(energon_dataset, tokenizer):
    tensors = list(make_loader(energon_dataset, tokenizer, **LOADER))
    logs = list(make_loader(energon_dataset, tokenizer, **LOADER, data_config=MESSAGE_LOGS))
    assert len(tensors) == len(logs) == 3
    for padded, logged in zip(tensors, logs):
        assert "message_log" not in padded and "message_log" in logged
        assert padded["source_ids"] == logged["source_ids"]
        assert torch.equal(padded["loss_multiplier"], logged["loss_multiplier"])
        expected = _trainer_side(logged["message_log"], logged["loss_multiplier"].tolist(), tokenizer.pad_token_id, 8, False)
        for key in expected:
            assert torch.equal(padded[key], expected[key]), key


def test_a_state_restores_across_batch_formats(energon_dataset, tokenizer):
    """The batch form is not part of the loader identity: switching it keeps the stream."""
    reference = [b["source_ids"] for b in make_loader(energon_dataset, tokenizer, **LOADER)]
    first = make_loader(energon_dataset, tokenizer, **LOADER, data_config=MESSAGE_LOGS)
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    restored = make_loader(energon_dataset, tokenizer, **LOADER)
    restored.load_state_dict(state)
    assert [b["source_ids"] for b in restored][:2] == reference[1:3]


def test_tasks_with_their_own_batch_form_refuse_tensors(energon_dataset, tokenizer):
    from rl_data.energon.task_encoders.preference import PreferenceTaskEncoder

    adapter = ProcessorAdapter(tokenizer, 64)
    with pytest.raises(ValueError, match="batch_format 'tensors' is not available for PreferenceTaskEncoder"):
        PreferenceTaskEncoder(adapter=adapter, max_sequence_length=64, batch_format="tensors")
