"""Token layout of a pack: padded lengths and cumulative sequence boundaries."""

from __future__ import annotations

import pytest
import torch

from rl_data.packing.layout import cu_seqlens_for, padded_length


def test_pinned_example_from_issue():
    cu_seqlens, cu_seqlens_padded = cu_seqlens_for([5, 3], pad_multiple=4)
    assert cu_seqlens.dtype == cu_seqlens_padded.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 5, 8]
    assert cu_seqlens_padded.tolist() == [0, 8, 12]


def test_without_padding_both_boundaries_agree():
    cu_seqlens, cu_seqlens_padded = cu_seqlens_for([7, 1, 4])
    assert cu_seqlens.tolist() == cu_seqlens_padded.tolist() == [0, 7, 8, 12]


def test_no_sources():
    cu_seqlens, cu_seqlens_padded = cu_seqlens_for([], pad_multiple=8)
    assert cu_seqlens.tolist() == cu_seqlens_padded.tolist() == [0]
    assert cu_seqlens.dtype == torch.int32


@pytest.mark.parametrize(
    ("length", "multiple", "expected"),
    [(0, 4, 0), (1, 4, 4), (4, 4, 4), (5, 4, 8), (7, 1, 7), (65, 64, 128)],
)
def test_padded_length(length, multiple, expected):
    assert padded_length(length, multiple) == expected


@pytest.mark.parametrize(
    ("length", "multiple", "message"),
    [(3, 0, "pad multiple must be >= 1, got 0"), (-1, 4, "sequence length must be >= 0, got -1")],
)
def test_padded_length_errors(length, multiple, message):
    with pytest.raises(ValueError) as error:
        padded_length(length, multiple)
    assert str(error.value) == message
