"""Turn a batch fetched from the object store into device tensors (for training actors).

``BatchedDataDict`` pickles its tensors as raw numpy buffers, so ``ray.get`` returns tensors
that are zero-copy, read-only views of the node's object store. On CUDA every tensor is
copied through pinned memory with ``non_blocking=True`` (the copies are ordered on the current
stream, so kernels launched afterwards see the data). On CPU tensors stay zero-copy views
unless ``writable=True`` asks for private copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

import torch

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.packed_tensor import PackedTensor

Device = Union[str, torch.device]


def default_device() -> torch.device:
    """The current CUDA device when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def batch_to_device(batch: Mapping[str, Any], device: Optional[Device] = None, *, writable: bool = False) -> BatchedDataDict:
    """A ``BatchedDataDict`` with every tensor (also inside lists, dicts and PackedTensors) on ``device``."""
    target = torch.device(device) if device is not None else default_device()
    return BatchedDataDict({key: _move(value, target, writable) for key, value in batch.items()})


def fetch_batch(ref: Any, device: Optional[Device] = None, *, timeout: Optional[float] = None, writable: bool = False) -> BatchedDataDict:
    """``ray.get`` a batch ref (with a timeout) and move it to ``device``."""
    import ray

    return batch_to_device(ray.get(ref, timeout=timeout), device, writable=writable)


def _move(value: Any, device: torch.device, writable: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return _tensor_to(value, device, writable)
    if isinstance(value, PackedTensor):
        rows = [None if t is None else _tensor_to(t, device, writable) for t in value.tensors]
        return PackedTensor(rows, value.dim_to_pack)
    if isinstance(value, list):
        return [_move(item, device, writable) for item in value]
    if isinstance(value, tuple):
        return tuple(_move(item, device, writable) for item in value)
    if isinstance(value, dict):
        return {k: _move(v, device, writable) for k, v in value.items()}
    return value


def _tensor_to(tensor: torch.Tensor, device: torch.device, writable: bool) -> torch.Tensor:
    if device.type == "cuda":
        source = tensor if tensor.is_cuda or tensor.is_pinned() else tensor.pin_memory()
        return source.to(device, non_blocking=True)
    moved = tensor.to(device)
    return moved.clone() if writable and moved.data_ptr() == tensor.data_ptr() else moved
