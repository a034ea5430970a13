"""The same per-sample work for every contender, and one training-batch shape to count.

Ray Data and torchdata run :func:`encode_line` (JSON decode, validation, the project's chat
formatting and truncation: exactly what the Energon cooker and ``ChatSFTTaskEncoder`` do) and
then :func:`collate_unpacked` or :func:`collate_packed` (loss masks, padding, or the project's
packing algorithm and pack layout). The rl_data contenders deliver the task encoder's batches
(unpacked ones already padded by the rank, ``batch_format="tensors"``, the default);
:func:`training_batch` turns an unpacked one that carries message logs into the same padded
tensors, on the consumer, so every consumer ends with ``input_ids``, ``token_mask``, ``sample_mask`` and
the counts ``num_samples`` / ``num_tokens`` (non-pad tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.packing import build_pack, collate_packs, select_packs
from rl_data.packing.algorithms import SequencePacker
from rl_data.tokenization.flatten import sft_batch_tensors
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.truncation import truncate_message_log
from rl_data.tokenization.validation import validate_messages

TRAINED_ROLES = ["assistant"]


def encode_line(line: bytes | str, adapter: ProcessorAdapter) -> dict[str, Any]:
    """One JSON line -> ``{"id", "message_log", "length", "loss_multiplier"}``."""
    record = json.loads(line)
    messages = record["messages"]
    validate_messages(messages)
    message_log = adapter.format(messages, record.get("tools"))
    message_log, length, multiplier = truncate_message_log(message_log, adapter.max_sequence_length)
    return {
        "id": f"conv-{record['source']['row']:06d}",
        "message_log": message_log,
        "length": length,
        "loss_multiplier": multiplier,
    }


def collate_unpacked(samples: Sequence[Mapping[str, Any]], adapter: ProcessorAdapter, pad_multiple: int) -> dict[str, Any]:
    """Encoded samples -> padded training tensors (NeMo-RL's SFT batch)."""
    logs = [[dict(m) for m in s["message_log"]] for s in samples]
    add_loss_mask_to_message_log(logs, roles_to_train_on=TRAINED_ROLES)
    batch = sft_batch_tensors(logs, [s["loss_multiplier"] for s in samples], adapter.pad_token_id, pad_multiple)
    return _finish(dict(batch), [s["id"] for s in samples], int(batch["input_lengths"].sum()))


def packs_of(
    samples: Sequence[Mapping[str, Any]], adapter: ProcessorAdapter, packer: SequencePacker, pad_multiple: int
) -> list[tuple[dict[str, Any], list[str]]]:
    """Encoded samples (one packing buffer) -> ``(pack layout, source ids)`` per pack, with the project's packer."""
    bins = select_packs([s["length"] for s in samples], [adapter.fingerprint] * len(samples), packer)
    return [
        (
            build_pack(
                [samples[i]["message_log"] for i in bin_],
                [samples[i]["loss_multiplier"] for i in bin_],
                pad_multiple=pad_multiple,
                pad_token_id=adapter.pad_token_id,
                only_unmask_final=False,
            ),
            [samples[i]["id"] for i in bin_],
        )
        for bin_ in bins
    ]


def collate_packed(
    samples: Sequence[Mapping[str, Any]], adapter: ProcessorAdapter, packer: SequencePacker, pad_multiple: int
) -> dict[str, Any]:
    """Encoded samples (one packing buffer) -> one row per pack."""
    packs = packs_of(samples, adapter, packer, pad_multiple)
    batch = collate_packs(
        [pack for pack, _ in packs], pad_token_id=adapter.pad_token_id, capacity=adapter.max_sequence_length, source_ids=None
    )
    ids = [key for _, keys in packs for key in keys]
    tokens = sum(int(pack["cu_seqlens"][-1]) for pack, _ in packs)
    return _finish({k: batch[k] for k in ("input_ids", "token_mask", "sample_mask", "input_lengths")}, ids, tokens)


def training_batch(batch: Any, adapter: ProcessorAdapter, pad_multiple: int) -> dict[str, Any]:
    """Any contender's batch -> the common training batch (idempotent)."""
    if "num_tokens" in batch:
        return batch
    if "message_log" in batch:  # an unpacked rl_data batch
        samples = [
            {"id": key, "message_log": log, "loss_multiplier": float(m)}
            for key, log, m in zip(batch["source_ids"], batch["message_log"], batch["loss_multiplier"])
        ]
        return collate_unpacked(samples, adapter, pad_multiple)
    if "cu_seqlens" not in batch:  # an unpacked rl_data batch already padded by the rank (batch_format "tensors")
        tensors = {k: batch[k] for k in ("input_ids", "token_mask", "sample_mask", "input_lengths")}
        return _finish(tensors, list(batch["source_ids"]), int(batch["input_lengths"].sum()))
    ids = [key for keys in batch["source_ids"] for key in keys]
    tokens = sum(int(t[-1]) for t in batch["cu_seqlens"].tensors)
    return _finish({k: batch[k] for k in ("input_ids", "token_mask", "sample_mask", "input_lengths")}, ids, tokens)


def _finish(tensors: dict[str, Any], ids: list[str], tokens: int) -> dict[str, Any]:
    return {**tensors, "ids": ids, "num_samples": len(ids), "num_tokens": tokens}


def merge_step(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The batches of one step (one per rank) counted as one step."""
    return {
        "ids": [i for b in batches for i in b["ids"]],
        "num_samples": sum(b["num_samples"] for b in batches),
        "num_tokens": sum(b["num_tokens"] for b in batches),
        "input_ids": [b["input_ids"] for b in batches],
    }


def touch(batch: Mapping[str, Any]) -> int:
    """Read the token tensor(s) once, as a trainer copying them to the GPU would; return their elements."""
    tensors = batch["input_ids"] if isinstance(batch["input_ids"], list) else [batch["input_ids"]]
    for tensor in tensors:
        torch.as_tensor(tensor).sum()
    return sum(torch.as_tensor(t).numel() for t in tensors)
