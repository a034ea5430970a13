"""Shard -> DP-rank mapping and merging shard batches (pure: no Ray)."""

from __future__ import annotations

import pytest
import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.distributed.shard_map import check_shard_layout, shard_assignment, shards_of_dp_rank
from rl_data.distributed.shard_merge import MergeSpec, merge_shard_batches
from rl_data.packed_tensor import PackedTensor


def test_dp_rank_d_gets_shards_d_d_plus_dp_and_so_on():
    assert shard_assignment(8, 1) == [list(range(8))]
    assert shard_assignment(8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert shard_assignment(8, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert shard_assignment(8, 8) == [[s] for s in range(8)]
    for dp in (1, 2, 4, 8):  # every shard exactly once, for every admissible DP size
        assert sorted(s for shards in shard_assignment(8, dp) for s in shards) == list(range(8))


def test_a_dp_size_that_does_not_divide_the_shards_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"dp=3 does not divide the 8 logical data shards .* one of \[1, 2, 4, 8\]"):
        check_shard_layout(8, 3)
    with pytest.raises(ValueError, match=r"dp_rank must be in \[0, 2\), got 2"):
        shards_of_dp_rank(2, 8, 2)


def _sft(ids: list[str], length: int) -> BatchedDataDict:
    return BatchedDataDict(
        message_log=[[{"role": "user", "token_ids": torch.arange(3)}] for _ in ids],
        loss_multiplier=torch.ones(len(ids)),
        input_ids=torch.full((len(ids), length), 7, dtype=torch.long),
        token_mask=torch.ones((len(ids), length)),
        cu_seqlens=PackedTensor([torch.tensor([0, length], dtype=torch.int32) for _ in ids], dim_to_pack=0),
        source_ids=list(ids),
    )


def test_merge_keeps_row_order_and_pads_on_the_right_with_the_column_pad_value():
    merged = merge_shard_batches(MergeSpec(pad_values={"input_ids": 0}), [_sft(["a", "b"], 3), _sft(["c"], 5)])
    assert merged["source_ids"] == ["a", "b", "c"] and len(merged["message_log"]) == 3
    assert merged["input_ids"].tolist() == [[7, 7, 7, 0, 0], [7, 7, 7, 0, 0], [7, 7, 7, 7, 7]]
    assert merged["token_mask"][:2, 3:].sum() == 0 and merged["loss_multiplier"].tolist() == [1, 1, 1]
    assert isinstance(merged["cu_seqlens"], PackedTensor) and len(merged["cu_seqlens"]) == 3


def test_left_padded_columns_are_padded_on_the_left():
    def prompts(rows: list[list[int]]) -> BatchedDataDict:
        width = max(map(len, rows))
        ids = torch.tensor([[9] * (width - len(r)) + r for r in rows])
        return BatchedDataDict(input_ids=ids, input_lengths=torch.tensor([len(r) for r in rows]), idx=torch.arange(len(rows)))

    spec = MergeSpec(pad_values={"input_ids": 9}, left_padded=("input_ids",))
    merged = merge_shard_batches(spec, [prompts([[1, 2], [3]]), prompts([[4, 5, 6, 7]])])
    assert merged["input_ids"].tolist() == [[9, 9, 1, 2], [9, 9, 9, 3], [4, 5, 6, 7]]
    assert merged["input_lengths"].tolist() == [2, 1, 4]
    assert MergeSpec.from_json(spec.to_json()) == spec


def test_one_batch_is_handed_through_unchanged():
    batch = _sft(["a"], 2)
    assert merge_shard_batches(MergeSpec(), [batch]) is batch
