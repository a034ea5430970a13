"""Sequence packing: algorithms and metrics (pure Python; ``layout`` adds torch tensors)."""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "BalancedGreedyKnapsackPacker": "rl_data.packing.algorithms",
        "ConcatenativePacker": "rl_data.packing.algorithms",
        "FirstFitDecreasingPacker": "rl_data.packing.algorithms",
        "FirstFitShufflePacker": "rl_data.packing.algorithms",
        "GreedyKnapsackPacker": "rl_data.packing.algorithms",
        "ModifiedFirstFitDecreasingPacker": "rl_data.packing.algorithms",
        "PackingAlgorithm": "rl_data.packing.algorithms",
        "PackingMetrics": "rl_data.packing.metrics",
        "PackingTotals": "rl_data.packing.metrics",
        "SequencePacker": "rl_data.packing.algorithms",
        "get_packer": "rl_data.packing.algorithms",
        "packing_algorithm": "rl_data.packing.algorithms",
        "packing_metrics": "rl_data.packing.metrics",
        "padded_length": "rl_data.packing.algorithms",
    },
)
