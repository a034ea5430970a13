"""Pack building and packed batches of the SFT task encoders, with exact tensors."""

from __future__ import annotations

import pytest
import torch
from megatron.energon.task_encoder.base import get_stateless

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.task_encoders import ChatSFTTaskEncoder, EncodedSFTSample, ProcessorAdapter
from rl_data.energon.task_encoders.packing import build_pack, collate_packs, select_packs
from rl_data.packed_tensor import PackedTensor
from rl_data.packing.algorithms import get_packer

PAD = 99


def _msg(role: str, ids: list[int]) -> dict:
    return {"role": role, "content": f"<{role}>", "token_ids": torch.tensor(ids, dtype=torch.long)}


def _source_a() -> list[dict]:
    return [_msg("user", [1, 2]), _msg("assistant", [3, 4, 5])]


def _source_b() -> list[dict]:
    return [_msg("assistant", [6, 7, 8])]


def test_pack_of_lengths_5_and_3_with_pad_multiple_4_has_the_pinned_layout():
    pack = build_pack(
        [_source_a(), _source_b()], [1.0, 1.0], pad_multiple=4, pad_token_id=PAD, only_unmask_final=False
    )
    assert pack["cu_seqlens"].tolist() == [0, 5, 8]
    assert pack["cu_seqlens_padded"].tolist() == [0, 8, 12]
    assert pack["cu_seqlens"].dtype == pack["cu_seqlens_padded"].dtype == torch.int32
    assert pack["input_ids"].tolist() == [1, 2, 3, 4, 5, PAD, PAD, PAD, 6, 7, 8, PAD]
    # Source B starts with an assistant token: masked, so no loss crosses the boundary.
    assert pack["token_mask"].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0]
    assert pack["token_mask"].dtype == torch.float32
    roles = [m["role"] for m in pack["message_log"]]
    assert roles == ["user", "assistant", "padding", "assistant", "padding"]
    paddings = [m for m in pack["message_log"] if m["role"] == "padding"]
    assert [m["token_ids"].tolist() for m in paddings] == [[PAD, PAD, PAD], [PAD]]
    assert [m["token_loss_mask"].tolist() for m in paddings] == [[0, 0, 0], [0]]
    assert [m["token_loss_mask"].tolist() for m in pack["message_log"][:2]] == [[0, 0], [1, 1, 1]]


def test_pack_multiplies_masks_by_loss_multiplier_and_does_not_mutate_inputs():
    source_a, source_b = _source_a(), _source_b()
    pack = build_pack(
        [source_a, source_b], [0.0, 1.0], pad_multiple=1, pad_token_id=PAD, only_unmask_final=False
    )
    assert pack["token_mask"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert pack["cu_seqlens"].tolist() == pack["cu_seqlens_padded"].tolist() == [0, 5, 8]
    assert [m["token_ids"].numel() for m in pack["message_log"] if m["role"] == "padding"] == [0, 0]
    assert all("token_loss_mask" not in m for m in source_a + source_b)


@pytest.mark.parametrize(
    ("only_unmask_final", "expected"),
    [(False, [0, 0, 1, 1, 0, 1, 1, 0]), (True, [0, 0, 0, 0, 0, 1, 1, 0])],
)
def test_pack_only_unmask_final_trains_on_the_last_assistant_turn_only(only_unmask_final, expected):
    source = [_msg("user", [1, 2]), _msg("assistant", [3, 4]), _msg("user", [5]), _msg("assistant", [6, 7])]
    pack = build_pack([source], [1.0], pad_multiple=4, pad_token_id=PAD, only_unmask_final=only_unmask_final)
    assert pack["token_mask"].tolist() == expected


def test_collate_packs_right_pads_rows_and_derives_sample_mask():
    full = build_pack([_source_a(), _source_b()], [1.0, 1.0], pad_multiple=4, pad_token_id=PAD, only_unmask_final=False)
    untrained = build_pack([_source_b()], [0.0], pad_multiple=4, pad_token_id=PAD, only_unmask_final=False)
    batch = collate_packs([full, untrained], pad_token_id=PAD, capacity=16, source_ids=[["a", "b"], ["c"]])
    assert isinstance(batch, BatchedDataDict)
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4, 5, PAD, PAD, PAD, 6, 7, 8, PAD],
        [6, 7, 8, PAD] + [PAD] * 8,
    ]
    assert batch["input_lengths"].tolist() == [12, 4]
    assert batch["input_lengths"].dtype == torch.int32
    assert batch["token_mask"][1].tolist() == [0.0] * 12
    assert batch["sample_mask"].tolist() == [1.0, 0.0]
    assert batch["sample_mask"].dtype == torch.float32
    assert isinstance(batch["cu_seqlens"], PackedTensor)
    assert [t.tolist() for t in batch["cu_seqlens"].tensors] == [[0, 5, 8], [0, 3]]
    assert [t.tolist() for t in batch["cu_seqlens_padded"].tensors] == [[0, 8, 12], [0, 4]]
    assert batch["source_ids"] == [["a", "b"], ["c"]]
    assert batch["packing_metrics"] == [
        {"num_sequences": 2, "zero_loss_sequences": 0, "tokens": 8, "padded_tokens": 12, "capacity": 16, "utilization": 0.5},
        {"num_sequences": 1, "zero_loss_sequences": 1, "tokens": 3, "padded_tokens": 4, "capacity": 16, "utilization": 3 / 16},
    ]
    assert batch.size == 2
    assert "source_ids" not in collate_packs([full], pad_token_id=PAD, capacity=16, source_ids=None)


def test_select_packs_never_mixes_fingerprints():
    packer = get_packer("first_fit_decreasing", 8, sequence_length_pad_multiple=4)
    assert packer.pack([3, 3, 3, 3]) == [[0, 1], [2, 3]]  # what mixing would give
    assert select_packs([3, 3, 3, 3], ["a", "b", "a", "b"], packer) == [[0, 2], [1, 3]]
    assert select_packs([5, 3, 3, 2, 7], ["x"] * 5, packer) == packer.pack([5, 3, 3, 2, 7])
    with pytest.raises(ValueError, match="got 2 lengths but 1 fingerprints"):
        select_packs([1, 2], ["a"], packer)


# -- the encoder's packing hooks ---------------------------------------------------------


@pytest.fixture(scope="module")
def packing_encoder(tokenizer):
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=16)
    return ChatSFTTaskEncoder(
        adapter=adapter,
        max_sequence_length=16,
        packing_algorithm="first_fit_decreasing",
        max_sequences_per_bin=None,
        sequence_length_pad_multiple=4,
    )


def _encoded(key: str, log: list[dict], fingerprint: str, multiplier: float = 1.0) -> EncodedSFTSample:
    return EncodedSFTSample(
        __key__=key,
        __restore_key__=(),
        message_log=log,
        length=sum(len(m["token_ids"]) for m in log),
        loss_multiplier=multiplier,
        adapter_fingerprint=fingerprint,
    )


def test_select_samples_to_pack_groups_by_adapter_fingerprint(packing_encoder):
    fp = packing_encoder.adapter.fingerprint
    samples = [
        _encoded("s0", _source_b(), fp),
        _encoded("s1", _source_b(), "other-tokenizer"),
        _encoded("s2", _source_b(), fp),
        _encoded("s3", _source_b(), "other-tokenizer"),
    ]
    packs = packing_encoder.select_samples_to_pack(samples)
    assert [[s.__key__ for s in pack] for pack in packs] == [["s0", "s2"], ["s1", "s3"]]


def test_pack_selected_samples_and_batch_give_the_pinned_packed_batch(packing_encoder):
    fp = packing_encoder.adapter.fingerprint
    pad = packing_encoder.adapter.pad_token_id
    assert pad == 151643  # Qwen's <|endoftext|>
    pack = packing_encoder.pack_selected_samples(
        [_encoded("a", _source_a(), fp), _encoded("b", _source_b(), fp)]
    )
    assert pack.source_ids == ["a", "b"]
    assert pack.cu_seqlens.tolist() == [0, 5, 8]
    batch = packing_encoder.batch([pack])
    assert set(batch) == {
        "input_ids", "input_lengths", "token_mask", "sample_mask",
        "cu_seqlens", "cu_seqlens_padded", "packing_metrics", "source_ids",
    }
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, pad, pad, pad, 6, 7, 8, pad]]
    assert batch["token_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0]]
    assert batch["source_ids"] == [["a", "b"]]


def test_packing_stages_are_stateless_except_selection(packing_encoder):
    assert get_stateless(packing_encoder.pack_selected_samples)
    assert get_stateless(packing_encoder.encode_sample)
    assert get_stateless(packing_encoder.batch)
    assert get_stateless(packing_encoder.encode_batch)
    assert get_stateless(packing_encoder.cooker.cook)


def test_packing_requires_max_length_divisible_by_pad_multiple(tokenizer):
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=18)
    with pytest.raises(ValueError, match="18 is not a multiple of sequence_length_pad_multiple 4"):
        ChatSFTTaskEncoder(
            adapter=adapter, max_sequence_length=18, packing_algorithm="concatenative",
            sequence_length_pad_multiple=4,
        )


def test_unpacked_encoder_refuses_packs_with_a_clear_error(tokenizer, packing_encoder):
    unpacked = ChatSFTTaskEncoder(
        adapter=ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=16), max_sequence_length=16
    )
    pack = packing_encoder.pack_selected_samples([_encoded("a", _source_a(), "fp")])
    with pytest.raises(TypeError, match="expects EncodedSFTSample .packing_algorithm set: False"):
        unpacked.batch([pack])
    with pytest.raises(RuntimeError, match="no packing_algorithm"):
        unpacked.select_samples_to_pack([_encoded("a", _source_a(), "fp")])
