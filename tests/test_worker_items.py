"""How an item crosses from an Energon worker process to the loader's process."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.worker_checkpoints import WithCheckpoint
from rl_data.energon.worker_items import INLINE_MAX_BYTES, dumps_item, loads_item
from rl_data.packed_tensor import PackedTensor


def _tensors_of_every_kind() -> dict[str, torch.Tensor]:
    grid = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "int64": torch.arange(10),
        "bfloat16": torch.linspace(-2, 2, 7, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "uint8_3d": torch.randint(0, 255, (2, 3, 4), dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 5, dtype=torch.int32),
        "transposed": grid.t(),
        "strided_view": grid[:, ::2],
        "conjugated": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "negated_view": torch._neg_view(torch.tensor([1.0, -2.0])),
    }


def _assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg())


def test_every_kind_of_small_tensor_round_trips_with_its_dtype_shape_and_values():
    tensors = _tensors_of_every_kind()
    restored = loads_item(dumps_item(tensors))
    assert restored.keys() == tensors.keys()
    for key, tensor in tensors.items():
        _assert_same(restored[key], tensor)
    restored["int64"].add_(1)  # the tensors own writable memory


def test_a_batch_with_packed_columns_round_trips():
    batch = BatchedDataDict(
        {
            "input_ids": torch.arange(32).reshape(2, 16),
            "cu_seqlens": PackedTensor([torch.tensor([0, 5, 16], dtype=torch.int32), torch.tensor([0, 16], dtype=torch.int32)], dim_to_pack=0),
            "source_ids": [["a", "b"], ["c"]],
        }
    )
    restored = loads_item(dumps_item(batch))
    assert type(restored) is BatchedDataDict
    _assert_same(restored["input_ids"], batch["input_ids"])
    for got, expected in zip(restored["cu_seqlens"].tensors, batch["cu_seqlens"].tensors):
        _assert_same(got, expected)
    assert restored["source_ids"] == batch["source_ids"]


def _send_from_a_worker(item, to_receiver, to_worker):
    to_receiver.put(WithCheckpoint(item, (3, {"state": 1})))
    to_worker.get(timeout=60)  # keep the process (and its shared memory) until the receiver has it


@pytest.mark.timeout(120)
def test_small_tensors_arrive_in_the_message_and_large_ones_through_shared_memory():
    small = torch.arange(INLINE_MAX_BYTES // 8)  # exactly the limit
    large = torch.zeros(INLINE_MAX_BYTES // 4 + 1, dtype=torch.float32)  # 4 bytes over it
    context = multiprocessing.get_context("fork")  # as a DataLoader worker starts
    to_receiver, to_worker = context.Queue(), context.Queue()
    worker = context.Process(target=_send_from_a_worker, args=(BatchedDataDict({"small": small, "large": large}), to_receiver, to_worker))
    worker.start()
    try:
        received = to_receiver.get(timeout=60)
        assert received.checkpoint == (3, {"state": 1})
        batch = received.item
        assert torch.equal(batch["small"], small) and torch.equal(batch["large"], large)
        assert not batch["small"].is_shared()
        assert batch["large"].is_shared()
    finally:
        to_worker.put(None)
        worker.join(timeout=60)
        if worker.is_alive():
            worker.kill()
