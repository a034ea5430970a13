"""``BatchedDataDict``: a dict whose values share a leading batch dimension.

Values are torch tensors (rows along dim 0), ``PackedTensor`` (one entry per row) or lists
(one item per row). Every row operation (slice, select, chunk, shard, repeat) applies to all
values alike. Pickling (and therefore Ray's object store) sends tensors as raw uint8 numpy
buffers, which pickle protocol 5 / Ray move out of band, so a receiver gets its tensors
without copying them; dtypes (including bfloat16) and shapes are restored exactly. This holds
for tensors anywhere in the values (PackedTensors, ``message_log`` token ids and media nested
in lists and dicts); they arrive on the CPU. Tensors under 64 KB travel concatenated, one
buffer per dtype, and arrive as views of it: a 16-conversation message-log batch (~570
tensors) pickles and unpickles in ~2.5 ms instead of ~15 ms.
Tensors received through Ray alias the shared object store: ``clone()`` before writing into
them in place.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import threading
import warnings
from collections import UserDict
from collections.abc import Mapping, Sequence
from copy import deepcopy
from multiprocessing.reduction import ForkingPickler
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory tensor reducers)
from typing_extensions import Self

from rl_data.packed_tensor import PackedTensor, RowIndices, normalize_row_indices

DictT = TypeVar("DictT", bound=Mapping[str, Any])
Device = str | torch.device


class BatchedDataDict(UserDict, Generic[DictT]):
    """Tensors, PackedTensors and lists that all have the same number of rows."""

    # Model inputs returned by ``get_multimodal_dict`` although they are plain tensors
    # (gemma3's ``token_type_ids`` marks where image tokens sit in the sequence).
    ADDITIONAL_OPTIONAL_KEY_TENSORS = ("token_type_ids",)

    @classmethod
    def from_batches(
        cls,
        batches: Sequence[Mapping[str, Any]],
        pad_value_dict: dict[str, int | float] | None = None,
    ) -> Self:
        """Stack batches row-wise into one.

        Lists are concatenated, 1-D tensors concatenated, tensors with 2 or more dims
        right-padded along dim 1 to the longest one (pad value ``pad_value_dict[key]``,
        default 0) and concatenated, PackedTensors joined row-wise. Every batch must have
        the same keys and, per key, the same kind of value, dtype and trailing dims.
        """
        if not batches:
            raise ValueError("from_batches needs at least one batch, got an empty sequence")
        pad_value_dict = pad_value_dict or {}
        keys = list(batches[0])
        for i, batch in enumerate(batches[1:], start=1):
            if set(batch) != set(keys):
                missing = sorted(set(keys) - set(batch))
                extra = sorted(set(batch) - set(keys))
                raise ValueError(
                    f"batch {i} has different keys than batch 0: missing {missing}, extra "
                    f"{extra}; every batch must have the same keys"
                )
        stacked = cls()
        for key in keys:
            stacked[key] = _stack_values(key, [b[key] for b in batches], pad_value_dict.get(key, 0))
        return stacked

    @property
    def size(self) -> int:
        """Number of rows (0 when empty); raises ``ValueError`` if values disagree."""
        sizes = {key: _num_rows(key, value) for key, value in self.data.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"values disagree on the batch size: {sizes}; every tensor (dim 0), "
                "PackedTensor and list must have the same number of rows"
            )
        return next(iter(sizes.values()), 0)

    def slice(self, start: int, end: int) -> SlicedDataDict:
        """Rows ``[start, end)``; tensors are views of this batch's tensors."""
        size = self.size
        if not 0 <= start <= end <= size:
            raise IndexError(
                f"slice [{start}, {end}) is outside the batch of {size} rows; "
                "need 0 <= start <= end <= size"
            )
        sliced = SlicedDataDict()
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                sliced[key] = value[start:end]
            else:
                sliced[key] = _take_rows(key, value, range(start, end))
        return sliced

    def select_indices(self, indices: RowIndices) -> Self:
        """The given rows in the given order (ints, negative/repeated allowed, or a bool mask)."""
        return self._take(normalize_row_indices(indices, self.size), type(self))

    def chunk(self, rank: int, chunks: int) -> SlicedDataDict:
        """The ``rank``-th of ``chunks`` equal contiguous parts: [A A B B C C], 1, 3 -> [B B]."""
        size = self.size
        if chunks <= 0 or size % chunks:
            raise ValueError(
                f"cannot split {size} rows into {chunks} equal chunks; chunks must be a "
                f"positive divisor of the batch size"
            )
        if not 0 <= rank < chunks:
            raise ValueError(f"rank {rank} is out of range for {chunks} chunks (0..{chunks - 1})")
        n = size // chunks
        return self._take(list(range(rank * n, (rank + 1) * n)), SlicedDataDict)

    def shard_by_batch_size(
        self, shards: int, batch_size: int | None = None
    ) -> list[SlicedDataDict]:
        """Split into ``shards`` parts, keeping each ``batch_size`` block spread over all shards.

        The batch is cut into consecutive blocks of ``batch_size`` rows (default: the whole
        batch); each block is cut into ``shards`` equal contiguous pieces and shard ``i``
        gets piece ``i`` of every block, in block order. With rows [A A B B C C D D],
        ``shards=2, batch_size=4`` gives [A A C C] and [B B D D].
        """
        size = self.size
        batch_size = size if batch_size is None else batch_size
        if shards <= 0:
            raise ValueError(f"shards must be positive, got {shards}")
        if batch_size <= 0 or size % batch_size:
            raise ValueError(
                f"batch size {size} is not a multiple of batch_size={batch_size}; pass a "
                "batch_size that divides the number of rows (or None for all rows)"
            )
        if batch_size % shards:
            raise ValueError(
                f"batch_size {batch_size} is not a multiple of shards={shards}; each "
                "block must split into equal shards"
            )
        piece = batch_size // shards
        result = []
        for shard in range(shards):
            rows = [
                block + shard * piece + j
                for block in range(0, size, batch_size)
                for j in range(piece)
            ]
            result.append(self._take(rows, SlicedDataDict))
        return result

    def repeat_interleave(self, num_repeats: int) -> Self:
        """A new batch with each row repeated ``num_repeats`` times: [a, b] -> [a, a, b, b].

        List items are deep-copied so repeats do not alias mutable objects.
        """
        if isinstance(num_repeats, bool) or not isinstance(num_repeats, int) or num_repeats < 1:
            raise ValueError(f"num_repeats must be a positive int, got {num_repeats!r}")
        repeated = type(self)()
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                repeated[key] = value.repeat_interleave(num_repeats, dim=0)
            elif isinstance(value, list):
                repeated[key] = [deepcopy(item) for item in value for _ in range(num_repeats)]
            else:
                rows = [i for i in range(_num_rows(key, value)) for _ in range(num_repeats)]
                repeated[key] = _take_rows(key, value, rows)
        return repeated

    def to(self, device: Device) -> Self:
        """Move tensors and PackedTensors to ``device`` in place and return ``self``."""
        for key, value in self.data.items():
            if isinstance(value, (torch.Tensor, PackedTensor)):
                self.data[key] = value.to(device)
        return self

    def get_multimodal_dict(
        self, as_tensors: bool = False, device: Device | None = None
    ) -> dict[str, Any]:
        """The multimodal model inputs: PackedTensor values and ``ADDITIONAL_OPTIONAL_KEY_TENSORS``.

        With ``as_tensors`` PackedTensors are packed with ``as_tensor(device)``; plain tensors
        are moved to ``device`` when one is given.
        """
        result: dict[str, Any] = {}
        for key, value in self.data.items():
            if isinstance(value, PackedTensor):
                result[key] = value.as_tensor(device) if as_tensors else value
            elif key in self.ADDITIONAL_OPTIONAL_KEY_TENSORS:
                movable = device is not None and isinstance(value, torch.Tensor)
                result[key] = value.to(device) if movable else value
        return result

    def _take(self, rows: list[int], out_cls: type) -> Any:
        taken = out_cls()
        for key, value in self.data.items():
            taken[key] = _take_rows(key, value, rows)
        return taken

    def __reduce__(self):
        return _rebuild_batched_data_dict, (type(self), _encode_batched_data_dict(self.data))


class SlicedDataDict(BatchedDataDict):
    """A BatchedDataDict cut from a larger one (by slice, chunk and shard_by_batch_size)."""


class PooledList(list):
    """A list whose tensors pickle as a BatchedDataDict's do (pooled, one buffer per dtype).

    For many small tensors inside arbitrary items (e.g. the prompts a feed hands out, each with
    a message log): pickled one by one, each costs ~0.2 ms. Unpickles as a plain ``list``.
    """

    def __reduce__(self):
        return _rebuild_pooled_list, (_encode_batched_data_dict({"items": list(self)}),)


def _rebuild_pooled_list(encoded: "_Encoded") -> list:
    return _rebuild_batched_data_dict(BatchedDataDict, encoded)["items"]


def _num_rows(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        if value.ndim == 0:
            raise ValueError(f"value for key {key!r} is a 0-d tensor; it has no batch dimension")
        return value.shape[0]
    if isinstance(value, (list, PackedTensor)):
        return len(value)
    raise TypeError(
        f"value for key {key!r} is a {type(value).__name__}; BatchedDataDict holds torch "
        "tensors, PackedTensors and lists"
    )


def _take_rows(key: str, value: Any, rows: Sequence[int]) -> Any:
    _num_rows(key, value)  # type check with a clear message
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(list(rows), dtype=torch.long, device=value.device)]
    if isinstance(value, PackedTensor):
        return value.slice(list(rows))
    return [value[i] for i in rows]


def _stack_values(key: str, values: list[Any], pad_value: int | float) -> Any:
    first = values[0]
    kinds = {type(v).__name__ for v in values}
    if isinstance(first, list) and all(isinstance(v, list) for v in values):
        return [item for v in values for item in v]
    if isinstance(first, PackedTensor) and all(isinstance(v, PackedTensor) for v in values):
        return PackedTensor.concat(values)
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise TypeError(
            f"cannot stack key {key!r}: found values of types {sorted(kinds)}; each key must "
            "hold tensors, PackedTensors or lists in every batch"
        )
    dtypes = {v.dtype for v in values}
    if len(dtypes) > 1:
        raise ValueError(
            f"cannot stack key {key!r}: tensors have different dtypes {sorted(map(str, dtypes))}; "
            "cast them to one dtype first"
        )
    shapes = [tuple(v.shape) for v in values]
    ndims = {len(s) for s in shapes}
    if ndims == {1}:
        return torch.cat(values)
    if len(ndims) > 1 or 0 in ndims or len({s[2:] for s in shapes}) > 1:
        raise ValueError(
            f"cannot stack key {key!r}: tensor shapes {shapes} differ in rank or in dims after "
            "dim 1; only dim 0 (rows) and dim 1 (padded on the right) may differ"
        )
    max_len = max(s[1] for s in shapes)
    out = torch.full(
        (sum(s[0] for s in shapes), max_len, *shapes[0][2:]),
        pad_value,
        dtype=first.dtype,
        device=first.device,
    )
    row = 0
    for v in values:
        out[row : row + v.shape[0], : v.shape[1]] = v
        row += v.shape[0]
    return out


#: Tensors smaller than this travel in one shared buffer per dtype: a 16-conversation
#: message-log batch holds ~570 token-id tensors, and one out-of-band buffer each made
#: pickling plus Ray's put/get cost ~25 ms per batch.
POOLED_TENSOR_MAX_BYTES = 1 << 16


class TensorBytes(NamedTuple):
    """A tensor as a flat uint8 numpy array plus what is needed to view it back."""

    data: np.ndarray
    dtype: torch.dtype
    shape: tuple[int, ...]


class _Encoded(NamedTuple):
    """A pickled BatchedDataDict: its values pickled with tensors replaced by references.

    ``structure`` is one in-band pickle (lists, dicts, strings: no per-object work for Ray's
    pickler); ``large`` holds tensors of at least ``POOLED_TENSOR_MAX_BYTES`` and ``pools`` one
    concatenation of the smaller ones per dtype (with each one's element count), as raw buffers
    that pickle protocol 5 / Ray move out of band.
    """

    structure: bytes
    large: list[TensorBytes]
    pools: dict[torch.dtype, tuple[TensorBytes, list[int]]]


def tensor_to_bytes(t: torch.Tensor) -> TensorBytes:
    """``t``'s values as a flat uint8 array (a conjugate or negative view is resolved first)."""
    flat = t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return TensorBytes(flat.view(torch.uint8).numpy(), t.dtype, tuple(t.shape))


def tensor_from_bytes(b: TensorBytes | torch.Tensor) -> torch.Tensor:
    """The tensor :func:`tensor_to_bytes` took apart (a tensor is returned as it is)."""
    if isinstance(b, torch.Tensor):  # sent by torch's multiprocessing pickler (shared memory)
        return b
    with warnings.catch_warnings():
        # Arrays read from Ray's object store are flagged read-only; the tensor views them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(b.data)
    return flat.view(b.dtype).reshape(b.shape)


class _TensorCollectingPickler(pickle.Pickler):
    """Pickles everything but tensors, which it collects and replaces by references.

    Tensors are found through a per-pickler ``dispatch_table`` entry, so the C pickler calls
    back into Python only for tensors (a ``persistent_id`` hook is called for every object).
    """

    def __init__(self, file: io.BytesIO, keep_tensors: bool = False) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = {**copyreg.dispatch_table, torch.Tensor: self._reduce_tensor}
        self.keep_tensors = keep_tensors
        self.large: list[TensorBytes | torch.Tensor] = []
        self.pools: dict[torch.dtype, list[torch.Tensor]] = {}

    def _reduce_tensor(self, t: torch.Tensor) -> tuple:
        if t.nbytes >= POOLED_TENSOR_MAX_BYTES:
            self.large.append(t.detach() if self.keep_tensors else tensor_to_bytes(t))
            return _large_tensor, (len(self.large) - 1,)
        pool = self.pools.setdefault(t.dtype, [])
        if t.ndim == 1 and t.is_cpu and not t.requires_grad:
            pool.append(t)
        else:
            pool.append(t.detach().cpu().reshape(-1))
        return _pooled_tensor, (t.dtype, len(pool) - 1, tuple(t.shape))


#: The buffers of the BatchedDataDict being unpickled on this thread (see ``_rebuild_batched_data_dict``).
_unpickling = threading.local()


def _large_tensor(index: int) -> torch.Tensor:
    return tensor_from_bytes(_unpickling.encoded.large[index])


def _pooled_tensor(dtype: torch.dtype, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    flat = _unpickling.pools[dtype][index]
    return flat if len(shape) == 1 else flat.view(shape)


def _encode_batched_data_dict(data: Mapping[str, Any], keep_tensors: bool = False) -> _Encoded:
    """``keep_tensors``: the large tensors and the pools stay torch tensors (for torch's
    multiprocessing pickler, which moves them through shared memory), else raw buffers."""
    stream = io.BytesIO()
    pickler = _TensorCollectingPickler(stream, keep_tensors)
    pickler.dump(dict(data))
    as_buffer = (lambda t: t) if keep_tensors else tensor_to_bytes
    pools = {
        dtype: (as_buffer(torch.cat(parts)), [part.numel() for part in parts])
        for dtype, parts in pickler.pools.items()
    }
    return _Encoded(stream.getvalue(), pickler.large, pools)


def _reduce_for_worker_processes(batch: BatchedDataDict) -> tuple:
    """How torch's ``ForkingPickler`` (DataLoader / Energon workers -> their loader) sends a
    batch: tensors stay tensors, so torch moves them through shared memory instead of copying
    them into the pickle (a 58 MB image batch: 197 ms in band, 32 ms this way)."""
    return _rebuild_batched_data_dict, (type(batch), _encode_batched_data_dict(batch.data, keep_tensors=True))


def _rebuild_batched_data_dict(cls: type, encoded: _Encoded) -> BatchedDataDict:
    outer = getattr(_unpickling, "encoded", None), getattr(_unpickling, "pools", None)
    _unpickling.encoded = encoded
    _unpickling.pools = {dtype: torch.split(tensor_from_bytes(data), sizes) for dtype, (data, sizes) in encoded.pools.items()}
    try:
        return cls(pickle.loads(encoded.structure))
    finally:  # a BatchedDataDict nested in another one is rebuilt while its parent unpickles
        _unpickling.encoded, _unpickling.pools = outer


for _cls in (BatchedDataDict, SlicedDataDict):
    ForkingPickler.register(_cls, _reduce_for_worker_processes)
