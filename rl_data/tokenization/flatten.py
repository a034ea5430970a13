"""Message logs -> flat per-sample tensors -> right-padded batch tensors (as in NeMo-RL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.interfaces import FlatMessagesType, LLMMessageLogType


def message_log_to_flat_messages(message_log: LLMMessageLogType) -> FlatMessagesType:
    """Concatenate each tensor key over the messages and list every other key's values.

    ``{"role": [...], "content": [...], "token_ids": cat(token_ids), ...}``; a key missing from
    some messages only collects the messages that have it. Tensors of one key must have the
    same number of dims.
    """
    values_by_key: dict[str, list[Any]] = {}
    for message in message_log:
        for key, value in message.items():
            values_by_key.setdefault(key, []).append(value)
    flat: dict[str, Any] = {}
    for key, values in values_by_key.items():
        if isinstance(values[0], torch.Tensor):
            ranks = {value.dim() for value in values}
            if len(ranks) > 1:
                raise ValueError(
                    f"tensors for key {key!r} must have the same number of dims to be concatenated, "
                    f"found shapes {[tuple(value.shape) for value in values]}"
                )
            flat[key] = torch.cat(values)
        else:
            flat[key] = values
    return flat


def batched_message_log_to_flat_message(
    message_log_batch: Sequence[LLMMessageLogType],
    pad_value_dict: dict[str, int] | None = None,
    make_sequence_length_divisible_by: int = 1,
) -> tuple[BatchedDataDict, torch.Tensor]:
    """Flatten every log and stack them: tensors right-padded to a common length, others listed.

    The common length is the longest flat sequence rounded up to a multiple of
    ``make_sequence_length_divisible_by``; tensor key ``k`` is padded with
    ``pad_value_dict[k]`` (default 0), and a log without key ``k`` gets an all-padding row.
    Returns the batch and ``input_lengths`` (int32, each log's longest tensor before padding).
    """
    if make_sequence_length_divisible_by < 1:
        raise ValueError(
            f"make_sequence_length_divisible_by must be >= 1, got {make_sequence_length_divisible_by}"
        )
    if not message_log_batch:
        return BatchedDataDict(), torch.empty(0, dtype=torch.int32)
    flats = [message_log_to_flat_messages(message_log) for message_log in message_log_batch]
    pad_value_dict = pad_value_dict or {}
    input_lengths = torch.tensor(
        [max((v.size(0) for v in flat.values() if isinstance(v, torch.Tensor)), default=0) for flat in flats],
        dtype=torch.int32,
    )
    multiple = make_sequence_length_divisible_by
    padded_length = -(-int(input_lengths.max()) // multiple) * multiple
    batch = BatchedDataDict()
    for key in dict.fromkeys(key for flat in flats for key in flat):
        values = [flat.get(key) for flat in flats]
        tensors = [value for value in values if isinstance(value, torch.Tensor)]
        if not tensors:
            batch[key] = values
            continue
        _check_consistent(key, tensors)
        padded = torch.full(
            (len(values), padded_length, *tensors[0].shape[1:]),
            pad_value_dict.get(key, 0),
            dtype=tensors[0].dtype,
            device=tensors[0].device,
        )
        for row, value in enumerate(values):
            if value is not None:
                padded[row, : value.size(0)] = value
        batch[key] = padded
    return batch, input_lengths


def sft_batch_tensors(
    message_logs: Sequence[LLMMessageLogType],
    loss_multipliers: Sequence[float],
    pad_token_id: int,
    make_sequence_length_divisible_by: int = 1,
) -> BatchedDataDict:
    """The SFT training batch: ``input_ids``, ``input_lengths``, ``token_mask``, ``sample_mask``.

    ``input_ids`` [B, L] is padded with ``pad_token_id``; ``sample_mask`` is the float32
    ``loss_multiplier`` per sample (NeMo-RL's ``sample_mask = loss_multiplier``);
    ``token_mask`` is the flattened ``token_loss_mask`` with the rows of samples whose
    loss_multiplier is 0 zeroed, so it alone tells which tokens are trained. Every message
    needs a ``token_loss_mask`` (see ``add_loss_mask_to_message_log``).
    """
    if len(loss_multipliers) != len(message_logs):
        raise ValueError(
            f"got {len(loss_multipliers)} loss_multipliers for {len(message_logs)} message logs; "
            "expected one per message log"
        )
    for sample, message_log in enumerate(message_logs):
        for index, message in enumerate(message_log):
            if "token_loss_mask" not in message:
                raise ValueError(
                    f"sample {sample}, message {index} has no 'token_loss_mask'; "
                    "call add_loss_mask_to_message_log on the logs first"
                )
    flat, input_lengths = batched_message_log_to_flat_message(
        message_logs,
        pad_value_dict={"token_ids": pad_token_id},
        make_sequence_length_divisible_by=make_sequence_length_divisible_by,
    )
    sample_mask = torch.tensor(list(loss_multipliers), dtype=torch.float32)
    token_loss_mask = flat["token_loss_mask"]
    token_mask = token_loss_mask * (sample_mask != 0).to(token_loss_mask.dtype).unsqueeze(1)
    return BatchedDataDict(
        input_ids=flat["token_ids"],
        input_lengths=input_lengths,
        token_mask=token_mask,
        sample_mask=sample_mask,
    )


def _check_consistent(key: str, tensors: list[torch.Tensor]) -> None:
    if len({tensor.dtype for tensor in tensors}) > 1:
        raise ValueError(f"key {key!r}: expected one dtype across samples, found {[t.dtype for t in tensors]}")
    if len({tensor.device for tensor in tensors}) > 1:
        raise ValueError(f"key {key!r}: expected one device across samples, found {[t.device for t in tensors]}")
    if len({tuple(tensor.shape[1:]) for tensor in tensors}) > 1:
        raise ValueError(
            f"key {key!r}: expected the same trailing dims across samples, found {[tuple(t.shape) for t in tensors]}"
        )
