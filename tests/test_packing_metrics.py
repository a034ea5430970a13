"""Packing metrics: exact values on pinned packings, and running totals."""

from __future__ import annotations

import dataclasses

import pytest

from rl_data.packing.metrics import PackingTotals, packing_metrics


def test_pinned_packing_with_padding():
    # tokens per bin 8, 12, 16 of 16 -> utilisations 0.5, 0.75, 1.0 (sample stdev 0.25)
    metrics = packing_metrics([5, 3, 9, 3, 16], [[0, 1], [2, 3], [4]], 16, 4)
    assert metrics.as_dict() == {
        "num_sequences": 5,
        "num_bins": 3,
        "total_tokens": 36,
        "total_padded_tokens": 44,
        "total_capacity": 48,
        "total_waste": 12,
        "utilization": 0.75,
        "waste_ratio": 0.25,
        "bin_balance": 1 - 0.25 / 0.75,
        "theoretical_min_bins": 3,
        "bin_efficiency": 1.0,
    }


def test_theoretical_minimum_counts_padded_costs():
    # six sequences of 5 tokens are 30 tokens (2 bins of 16) but cost 6 x 8 = 48 (3 bins)
    metrics = packing_metrics([5] * 6, [[0], [1, 2], [3], [4, 5]], 16, 4)
    assert metrics.theoretical_min_bins == 3
    assert metrics.bin_efficiency == 0.75
    assert metrics.utilization == 30 / 64
    assert metrics.waste_ratio == 34 / 64


def test_single_bin_is_balanced_and_no_bins_give_zeros():
    assert packing_metrics([3, 4], [[0, 1]], 8).bin_balance == 1.0
    empty = packing_metrics([], [], 8)
    assert empty.as_dict() == {
        "num_sequences": 0,
        "num_bins": 0,
        "total_tokens": 0,
        "total_padded_tokens": 0,
        "total_capacity": 0,
        "total_waste": 0,
        "utilization": 0.0,
        "waste_ratio": 0.0,
        "bin_balance": 0.0,
        "theoretical_min_bins": 0,
        "bin_efficiency": 0.0,
    }


def test_metrics_are_frozen():
    metrics = packing_metrics([3], [[0]], 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.num_bins = 2


def test_invalid_capacity():
    with pytest.raises(ValueError, match=r"^bin_capacity must be >= 1, got 0$"):
        packing_metrics([3], [[0]], 0)


def test_totals_accumulate_across_packings():
    totals = PackingTotals()
    totals.add(packing_metrics([5, 3, 9, 3, 16], [[0, 1], [2, 3], [4]], 16, 4))  # 36 / 48
    totals.add(packing_metrics([4, 4], [[0], [1]], 16))  # 8 / 32, theoretical 1 bin
    assert totals.as_dict() == {
        "packings": 2,
        "num_sequences": 7,
        "num_bins": 5,
        "total_tokens": 44,
        "total_capacity": 80,
        "theoretical_min_bins": 4,
        "min_utilization": 0.25,
        "max_utilization": 0.75,
        "utilization": 44 / 80,
        "waste_ratio": 36 / 80,
        "bin_efficiency": 4 / 5,
    }


def test_empty_totals():
    assert PackingTotals().as_dict()["utilization"] == 0.0
