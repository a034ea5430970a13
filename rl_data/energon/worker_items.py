"""How an item crosses from an Energon worker process to the loader's process.

torch's ``DataLoader`` pickles a worker's item with ``ForkingPickler``, where torch sends every
tensor through shared memory: the worker creates a shared-memory segment per tensor storage and
the loader's process fetches its file descriptor over a new authenticated socket connection, a
fixed cost per tensor. A ``BatchedDataDict`` already pools its small tensors into one buffer
per dtype, so a text batch still crossed as 4-5 segments. Measured with
``benchmarks/worker_items.py`` (real batches of the benchmark workload, 2 cores, CPU ms per
batch, torch's way / this one): the worker 2.1 / 0.74 unpacked and 2.8 / 1.4 packed, the
loader's receiving thread 0.95 / 0.60 and 1.37 / 1.02.

Here tensors of at most :data:`INLINE_MAX_BYTES` travel as bytes inside the message; larger ones
(image patches) keep torch's shared memory, which copies them once.
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor  # registers torch's reducers too

from rl_data.batched_data_dict import tensor_from_bytes, tensor_to_bytes

#: Largest tensor (bytes of its elements) sent inside the message rather than shared memory.
INLINE_MAX_BYTES = 1 << 20


def dumps_item(item: Any) -> bytes:
    """``item`` pickled for another process on this machine (see the module docstring)."""
    buffer = io.BytesIO()
    _ItemPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(item)
    return buffer.getvalue()


def loads_item(data: bytes) -> Any:
    """The item :func:`dumps_item` pickled."""
    return pickle.loads(data)


class _ItemPickler(ForkingPickler):
    """``ForkingPickler`` (torch's reducers) with small CPU tensors pickled as their bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table[torch.Tensor] = _reduce_tensor


def _reduce_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    if (
        tensor.device.type != "cpu"
        or tensor.layout != torch.strided
        or tensor.requires_grad
        or tensor.is_quantized
        or tensor.numel() * tensor.element_size() > INLINE_MAX_BYTES
    ):
        return reduce_tensor(tensor)
    return tensor_from_bytes, (tensor_to_bytes(tensor),)
