"""``PackedTensor``: one tensor (or ``None``) per batch row, packed along one dimension on demand.

Multimodal inputs (image patches, audio features, ...) have a different size per sample, so a
batch keeps them as a list of per-row tensors and only concatenates them along
``dim_to_pack`` when a model needs one tensor (``as_tensor``). Rows are what ``len``,
``slice`` and ``concat`` count; a ``None`` row is a sample without that modality.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

RowIndices = Sequence[int] | torch.Tensor


def normalize_row_indices(indices: RowIndices, num_rows: int) -> list[int]:
    """Turn a list/range of ints or a 1-D int/bool tensor into validated non-negative row ids."""
    if isinstance(indices, torch.Tensor):
        if indices.ndim != 1:
            raise ValueError(f"row indices must be a 1-D tensor, got shape {tuple(indices.shape)}")
        if indices.dtype == torch.bool:
            if indices.numel() != num_rows:
                raise ValueError(
                    f"boolean row mask has {indices.numel()} entries, expected {num_rows} "
                    "(one per row)"
                )
            return indices.nonzero().flatten().tolist()
        if indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"row indices must be integers, got a {indices.dtype} tensor")
        indices = indices.tolist()
    rows = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"row indices must be ints, got {i!r} ({type(i).__name__})")
        if not -num_rows <= i < num_rows:
            raise IndexError(f"row index {i} is out of range for {num_rows} rows")
        rows.append(i % num_rows)
    return rows


class PackedTensor:
    """A list of per-row tensors (``None`` = empty row) that concatenate along ``dim_to_pack``."""

    def __init__(
        self,
        tensors: torch.Tensor | Sequence[torch.Tensor | None],
        dim_to_pack: int,
    ) -> None:
        if isinstance(dim_to_pack, bool) or not isinstance(dim_to_pack, int):
            raise TypeError(f"dim_to_pack must be an int, got {dim_to_pack!r}")
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        elif not isinstance(tensors, (list, tuple)):
            raise TypeError(
                "PackedTensor takes a tensor or a list of tensors/None, "
                f"got {type(tensors).__name__}"
            )
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"PackedTensor row {i} is a {type(t).__name__}; expected a torch.Tensor or None"
                )
        self.tensors: list[torch.Tensor | None] = list(tensors)
        self.dim_to_pack = dim_to_pack

    def __len__(self) -> int:
        """Number of rows (samples), counting ``None`` rows."""
        return len(self.tensors)

    def __repr__(self) -> str:
        shapes = [None if t is None else tuple(t.shape) for t in self.tensors]
        return f"PackedTensor(rows={len(self)}, dim_to_pack={self.dim_to_pack}, shapes={shapes})"

    def as_tensor(self, device: str | torch.device | None = None) -> torch.Tensor | None:
        """Concatenate the non-``None`` rows along ``dim_to_pack`` (``None`` if there are none).

        Does not modify the rows; with ``device`` the result is placed there.
        """
        rows = [t for t in self.tensors if t is not None]
        if not rows:
            return None
        if device is not None:
            rows = [t.to(device) for t in rows]
        return torch.cat(rows, dim=self.dim_to_pack)

    def to(self, device: str | torch.device) -> PackedTensor:
        """Move every row to ``device`` in place and return ``self``."""
        self.tensors = [None if t is None else t.to(device) for t in self.tensors]
        return self

    def slice(self, indices: RowIndices) -> PackedTensor:
        """A new PackedTensor with the given rows, in the given order (rows are shared, not copied).

        ``indices`` is a sequence of ints (negative allowed, repeats allowed) or a 1-D int or
        bool tensor.
        """
        rows = normalize_row_indices(indices, len(self))
        return PackedTensor([self.tensors[i] for i in rows], self.dim_to_pack)

    def equal(self, other: object) -> bool:
        """True when ``other`` is a PackedTensor with the same dim, row count, dtypes and values."""
        if not isinstance(other, PackedTensor):
            return False
        if self.dim_to_pack != other.dim_to_pack or len(self) != len(other):
            return False
        for a, b in zip(self.tensors, other.tensors, strict=True):
            if a is None or b is None:
                if a is not b:
                    return False
            elif a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                return False
        return True

    @staticmethod
    def _common_dim(packed: Sequence[PackedTensor], method: str) -> int:
        if not packed:
            raise ValueError(f"PackedTensor.{method} needs at least one PackedTensor, got none")
        dims = [p.dim_to_pack for p in packed]
        if len(set(dims)) != 1:
            raise ValueError(
                f"PackedTensor.{method}: all inputs must share dim_to_pack, got {dims}"
            )
        return dims[0]

    @classmethod
    def concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """Join the rows of several PackedTensors into one (row count = sum of row counts)."""
        dim = cls._common_dim(from_packed_tensors, "concat")
        return cls([t for p in from_packed_tensors for t in p.tensors], dim)

    @classmethod
    def flattened_concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """One row per input, each input packed with ``as_tensor``.

        ``len`` and ``slice`` then count inputs, while ``as_tensor`` equals ``concat``'s.
        """
        dim = cls._common_dim(from_packed_tensors, "flattened_concat")
        return cls([p.as_tensor() for p in from_packed_tensors], dim)
