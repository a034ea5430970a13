"""Sequence packing: algorithms and metrics (pure Python; ``layout`` adds torch tensors)."""

from rl_data.packing.algorithms import (
    BalancedGreedyKnapsackPacker,
    ConcatenativePacker,
    FirstFitDecreasingPacker,
    FirstFitShufflePacker,
    GreedyKnapsackPacker,
    ModifiedFirstFitDecreasingPacker,
    PackingAlgorithm,
    SequencePacker,
    get_packer,
    packing_algorithm,
    padded_length,
)
from rl_data.packing.metrics import PackingMetrics, PackingTotals, packing_metrics

__all__ = [
    "BalancedGreedyKnapsackPacker",
    "ConcatenativePacker",
    "FirstFitDecreasingPacker",
    "FirstFitShufflePacker",
    "GreedyKnapsackPacker",
    "ModifiedFirstFitDecreasingPacker",
    "PackingAlgorithm",
    "PackingMetrics",
    "PackingTotals",
    "SequencePacker",
    "get_packer",
    "packing_algorithm",
    "packing_metrics",
    "padded_length",
]
