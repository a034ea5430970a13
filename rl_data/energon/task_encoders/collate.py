"""Unpacked SFT batches as training-ready padded tensors (pure; torch only).

:func:`padded_sft_tensors` gives, from the encoded message logs of one batch, exactly what
``add_loss_mask_to_message_log`` followed by ``sft_batch_tensors`` gives on the trainer
(tested against it), but without per-message tensors: one concatenation per sample and one
fill per row. Rank actors call it inside the task encoder's ``batch`` (in the Energon
workers when there are any), so the trainer receives four contiguous tensors and does no
per-sample work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.interfaces import LLMMessageLogType

TRAINED_ROLES = ("assistant",)


def padded_sft_tensors(
    message_logs: Sequence[LLMMessageLogType],
    loss_multipliers: Sequence[float],
    *,
    pad_token_id: int,
    pad_multiple: int = 1,
    only_unmask_final: bool = False,
    roles_to_train_on: Sequence[str] = TRAINED_ROLES,
) -> BatchedDataDict:
    """``input_ids`` [B, L] (right-padded with ``pad_token_id``, L a multiple of
    ``pad_multiple``), ``input_lengths`` (int32 [B]), ``token_mask`` [B, L] (1 on the tokens of
    trained roles, or of each log's last message with ``only_unmask_final``; rows of samples
    with ``loss_multiplier`` 0 are all 0; same dtype as the token ids) and ``sample_mask``
    (float32 [B], the loss multipliers)."""
    if len(loss_multipliers) != len(message_logs):
        raise ValueError(
            f"got {len(loss_multipliers)} loss_multipliers for {len(message_logs)} message logs; "
            "expected one per message log"
        )
    trained = {role.lower() for role in roles_to_train_on}
    rows, masks = [], []
    for log, multiplier in zip(message_logs, loss_multipliers):
        ids = [message["token_ids"] for message in log]
        rows.append(torch.cat(ids) if ids else torch.empty(0, dtype=torch.long))
        last = len(log) - 1
        flags = [
            multiplier != 0 and (index == last if only_unmask_final else message["role"] in trained)
            for index, message in enumerate(log)
        ]
        masks.append((flags, [int(t.numel()) for t in ids]))
    lengths = [int(row.numel()) for row in rows]
    longest = max(lengths, default=0)
    width = -(-longest // pad_multiple) * pad_multiple
    dtype = rows[0].dtype if rows else torch.long
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=dtype)
    token_mask = torch.zeros((len(rows), width), dtype=dtype)
    for index, (row, (flags, sizes)) in enumerate(zip(rows, masks)):
        input_ids[index, : row.numel()] = row
        start = 0
        for flag, size in zip(flags, sizes):
            if flag:
                token_mask[index, start : start + size] = 1
            start += size
    return BatchedDataDict(
        input_ids=input_ids,
        input_lengths=torch.tensor(lengths, dtype=torch.int32),
        token_mask=token_mask,
        sample_mask=torch.tensor(list(loss_multipliers), dtype=torch.float32),
    )
