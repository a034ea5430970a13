"""Merging the batches of several logical shards into one DP rank's batch (pure; torch only).

Rows keep their order: the shards' batches are concatenated in the order given (see
:mod:`rl_data.distributed.shard_map`), each batch's rows in their own order. Lists are
concatenated, 1-D tensors concatenated, ``PackedTensor`` columns joined row-wise, and padded
2-D tensors padded to the longest with the column's pad value: on the right, or on the left
for the columns a task pads on the left (RL prompts' ``input_ids`` for generation engines).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.merge_spec import MergeSpec


def merge_shard_batches(spec: MergeSpec, batches: Sequence[Mapping[str, Any]]) -> BatchedDataDict:
    """One batch holding every row of ``batches``, in order (see the module doc)."""
    if len(batches) == 1:
        return batches[0] if isinstance(batches[0], BatchedDataDict) else BatchedDataDict(batches[0])
    batches = [_left_aligned(spec, batch, batches) for batch in batches]
    return BatchedDataDict.from_batches(batches, pad_value_dict=dict(spec.pad_values))


def _left_aligned(spec: MergeSpec, batch: Mapping[str, Any], batches: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """``batch`` with its left-padded columns padded on the left to the longest of ``batches``."""
    out = dict(batch)
    for key in spec.left_padded:
        value = batch.get(key)
        if not isinstance(value, torch.Tensor) or value.ndim < 2:
            continue
        width = max(int(b[key].shape[1]) for b in batches)
        missing = width - int(value.shape[1])
        if missing:
            pad = torch.full((value.shape[0], missing, *value.shape[2:]), spec.pad_values.get(key, 0), dtype=value.dtype)
            out[key] = torch.cat([pad, value], dim=1)
    return out
