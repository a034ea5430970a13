"""batch_to_device / fetch_batch: zero-copy on CPU, private copies on request, nested values moved."""

from __future__ import annotations

import pytest
import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.distributed.transfer import batch_to_device, default_device, fetch_batch
from rl_data.packed_tensor import PackedTensor


def _batch() -> BatchedDataDict:
    return BatchedDataDict(
        input_ids=torch.arange(2 * 70_000, dtype=torch.long).reshape(2, 70_000),  # ~1 MB: object store
        loss_multiplier=torch.tensor([1.0, 0.0], dtype=torch.bfloat16),
        message_log=[[{"role": "user", "token_ids": torch.tensor([1, 2])}], [{"role": "user", "token_ids": torch.tensor([3])}]],
        cu_seqlens=PackedTensor([torch.tensor([0, 4], dtype=torch.int32), None], dim_to_pack=0),
        source_ids=["a", "b"],
    )


def test_fetched_batch_stays_zero_copy_on_cpu_unless_writable(ray_session):
    ray = ray_session
    ref = ray.put(_batch())
    fetched = ray.get(ref, timeout=30)
    moved = fetch_batch(ref, "cpu", timeout=30)
    assert default_device() == torch.device("cpu")  # no CUDA on this machine
    assert torch.equal(moved["input_ids"], _batch()["input_ids"])
    assert moved["loss_multiplier"].dtype == torch.bfloat16
    # Zero-copy: the moved tensor is the fetched tensor's (object store) memory.
    assert moved["input_ids"].data_ptr() == batch_to_device(fetched, "cpu")["input_ids"].data_ptr() == fetched["input_ids"].data_ptr()

    private = batch_to_device(fetched, writable=True)
    assert private["input_ids"].data_ptr() != fetched["input_ids"].data_ptr()
    private["input_ids"][0, 0] = -1  # a private copy can be written
    assert fetched["input_ids"][0, 0] == 0


def test_nested_values_are_moved_and_kept_as_they_are():
    moved = batch_to_device(_batch(), torch.device("meta"))
    assert isinstance(moved, BatchedDataDict)
    assert moved["input_ids"].device.type == "meta"
    assert moved["message_log"][0][0]["token_ids"].device.type == "meta"
    assert moved["message_log"][0][0]["role"] == "user"
    assert isinstance(moved["cu_seqlens"], PackedTensor) and moved["cu_seqlens"].tensors[1] is None
    assert moved["cu_seqlens"].tensors[0].device.type == "meta" and moved["cu_seqlens"].dim_to_pack == 0
    assert moved["source_ids"] == ["a", "b"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_go_through_pinned_memory():
    moved = batch_to_device(_batch(), "cuda")
    torch.cuda.synchronize()
    assert moved["input_ids"].is_cuda and torch.equal(moved["input_ids"].cpu(), _batch()["input_ids"])
