"""Token layout of one pack: where each source starts, with and without its padding.

``cu_seqlens`` are the cumulative real lengths (what attention kernels use to keep sources
apart); ``cu_seqlens_padded`` are the cumulative lengths after padding every source to the
pad multiple, i.e. where each source really sits in the packed ``input_ids`` row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_data.packing.algorithms import padded_length

__all__ = ["cu_seqlens_for", "padded_length"]


def cu_seqlens_for(
    lengths: Sequence[int], pad_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cu_seqlens, cu_seqlens_padded)``, int32 of shape ``[len(lengths) + 1]``.

    Sources of length 5 and 3 with ``pad_multiple=4`` give ``[0, 5, 8]`` and ``[0, 8, 12]``.
    """
    padded = [padded_length(length, pad_multiple) for length in lengths]
    cu_seqlens = torch.zeros(len(padded) + 1, dtype=torch.int32)
    cu_seqlens_padded = torch.zeros(len(padded) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
    cu_seqlens_padded[1:] = torch.tensor(padded, dtype=torch.int64).cumsum(0)
    return cu_seqlens, cu_seqlens_padded
