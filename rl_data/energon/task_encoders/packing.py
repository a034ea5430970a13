"""Pack building for the SFT task encoders (no Energon import; torch and rl_data.packing only).

Three steps, each a pure function:

* :func:`select_packs` chooses which samples go together: samples are grouped by adapter
  fingerprint (samples tokenised differently are never packed together) and each group is
  packed by an ``rl_data.packing`` algorithm.
* :func:`build_pack` lays one pack out: loss masks on the chosen roles, ``token_mask`` = mask x
  the source's ``loss_multiplier``, the first token of every source masked (no loss crosses a
  document boundary) and every source followed by a ``role="padding"`` message up to its
  padded length.
* :func:`collate_packs` stacks packs into one ``BatchedDataDict`` row per pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.interfaces import LLMMessageLogType
from rl_data.packed_tensor import PackedTensor
from rl_data.packing.algorithms import SequencePacker
from rl_data.packing.layout import cu_seqlens_for
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log

PADDING_ROLE = "padding"
TRAINED_ROLES = ("assistant",)


def select_packs(
    lengths: Sequence[int], fingerprints: Sequence[str], packer: SequencePacker
) -> list[list[int]]:
    """Bins of sample indices; only samples with the same fingerprint share a bin.

    Groups are packed in order of their first sample, bins keep the packer's order.
    """
    if len(lengths) != len(fingerprints):
        raise ValueError(
            f"got {len(lengths)} lengths but {len(fingerprints)} fingerprints; need one per sample"
        )
    groups: dict[str, list[int]] = {}
    for index, fingerprint in enumerate(fingerprints):
        groups.setdefault(fingerprint, []).append(index)
    packs: list[list[int]] = []
    for members in groups.values():
        for bin_ in packer.pack([lengths[i] for i in members]):
            packs.append([members[i] for i in bin_])
    return packs


def build_pack(
    message_logs: Sequence[LLMMessageLogType],
    loss_multipliers: Sequence[float],
    *,
    pad_multiple: int,
    pad_token_id: int,
    only_unmask_final: bool,
) -> dict[str, Any]:
    """Lay out one pack of sources.

    Returns ``message_log`` (the sources' messages with loss masks, each source followed by
    a padding message), ``input_ids`` (int64) and ``token_mask`` (float32) of the pack's
    padded length, ``cu_seqlens`` / ``cu_seqlens_padded`` (int32, ``[n_sources + 1]``) and
    ``zero_loss_sources`` (sources with ``loss_multiplier`` 0: cut to stubs by truncation).
    """
    if not message_logs:
        raise ValueError("cannot build a pack without sources")
    logs = [[dict(message) for message in log] for log in message_logs]  # never mutate inputs
    add_loss_mask_to_message_log(
        logs, roles_to_train_on=list(TRAINED_ROLES), only_unmask_final=only_unmask_final
    )
    lengths = [sum(len(m["token_ids"]) for m in log) for log in logs]
    cu_seqlens, cu_seqlens_padded = cu_seqlens_for(lengths, pad_multiple)
    pack_log: LLMMessageLogType = []
    ids: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    for i, (log, multiplier) in enumerate(zip(logs, loss_multipliers)):
        pad = int(cu_seqlens_padded[i + 1] - cu_seqlens_padded[i]) - lengths[i]
        padding = {
            "role": PADDING_ROLE,
            "content": "",
            "token_ids": torch.full((pad,), pad_token_id, dtype=torch.long),
            "token_loss_mask": torch.zeros(pad, dtype=torch.long),
        }
        pack_log.extend(log)
        pack_log.append(padding)
        source_mask = torch.cat([m["token_loss_mask"] for m in log]).to(torch.float32) * multiplier
        if lengths[i]:
            source_mask[0] = 0.0
        ids.extend(m["token_ids"].to(torch.long) for m in log)
        ids.append(padding["token_ids"])
        masks.extend((source_mask, padding["token_loss_mask"].to(torch.float32)))
    return {
        "message_log": pack_log,
        "input_ids": torch.cat(ids),
        "token_mask": torch.cat(masks),
        "cu_seqlens": cu_seqlens,
        "cu_seqlens_padded": cu_seqlens_padded,
        "zero_loss_sources": sum(1 for multiplier in loss_multipliers if multiplier == 0.0),
    }


def collate_packs(
    packs: Sequence[dict[str, Any]],
    *,
    pad_token_id: int,
    capacity: int,
    source_ids: Sequence[list[str]] | None,
) -> BatchedDataDict:
    """One row per pack, right-padded to the longest pack.

    Keys: ``input_ids [n, L]``, ``input_lengths`` (int32, the pack's padded length),
    ``token_mask``, ``sample_mask`` (float, 1 when a pack has any trained token),
    ``cu_seqlens`` and ``cu_seqlens_padded`` (``PackedTensor`` of int32, one per pack),
    ``packing_metrics`` (one dict per pack) and, unless ``source_ids`` is None, ``source_ids``.
    """
    lengths = [int(p["input_ids"].numel()) for p in packs]
    width = max(lengths)
    input_ids = torch.full((len(packs), width), pad_token_id, dtype=torch.long)
    token_mask = torch.zeros((len(packs), width), dtype=torch.float32)
    for row, (pack, length) in enumerate(zip(packs, lengths)):
        input_ids[row, :length] = pack["input_ids"]
        token_mask[row, :length] = pack["token_mask"]
    batch = BatchedDataDict(
        input_ids=input_ids,
        input_lengths=torch.tensor(lengths, dtype=torch.int32),
        token_mask=token_mask,
        sample_mask=token_mask.any(dim=1).to(torch.float32),
        cu_seqlens=PackedTensor([p["cu_seqlens"] for p in packs], dim_to_pack=0),
        cu_seqlens_padded=PackedTensor([p["cu_seqlens_padded"] for p in packs], dim_to_pack=0),
        packing_metrics=[pack_metrics(p, capacity) for p in packs],
    )
    if source_ids is not None:
        batch["source_ids"] = [list(ids) for ids in source_ids]
    return batch


def pack_metrics(pack: dict[str, Any], capacity: int) -> dict[str, int | float]:
    """Sources (and those without loss), real tokens, padded tokens and utilisation of a pack."""
    tokens = int(pack["cu_seqlens"][-1])
    return {
        "num_sequences": int(pack["cu_seqlens"].numel() - 1),
        "zero_loss_sequences": int(pack.get("zero_loss_sources", 0)),
        "tokens": tokens,
        "padded_tokens": int(pack["cu_seqlens_padded"][-1]),
        "capacity": capacity,
        "utilization": tokens / capacity,
    }
