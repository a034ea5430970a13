"""How well a packing uses its bins, for one call (``packing_metrics``) or many (``PackingTotals``).

Definitions follow NeMo-RL's ``nemo_rl.data.packing.metrics``. Utilisation and waste count
real tokens (padding is waste); the theoretical minimum number of bins counts padded costs,
because padding is what a packer must place.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rl_data.packing.algorithms import padded_length


@dataclass(frozen=True)
class PackingMetrics:
    """Metrics of one packing.

    ``bin_balance`` is ``1 - stdev(bin utilisation) / mean(bin utilisation)`` (sample stdev;
    1.0 for a single bin); ``bin_efficiency`` is ``theoretical_min_bins / num_bins``.
    """

    num_sequences: int
    num_bins: int
    total_tokens: int
    total_padded_tokens: int
    total_capacity: int
    total_waste: int
    utilization: float
    waste_ratio: float
    bin_balance: float
    theoretical_min_bins: int
    bin_efficiency: float

    def as_dict(self) -> dict[str, int | float]:
        """Plain dict for logging."""
        return asdict(self)


def packing_metrics(
    sequence_lengths: Sequence[int],
    bins: Sequence[Sequence[int]],
    bin_capacity: int,
    sequence_length_pad_multiple: int = 1,
) -> PackingMetrics:
    """Metrics of ``bins`` (indices into ``sequence_lengths``) with ``bin_capacity`` per bin."""
    if bin_capacity < 1:
        raise ValueError(f"bin_capacity must be >= 1, got {bin_capacity}")
    total_tokens = sum(sequence_lengths)
    total_padded = sum(padded_length(n, sequence_length_pad_multiple) for n in sequence_lengths)
    theoretical_min_bins = -(-total_padded // bin_capacity)
    if not bins:
        return PackingMetrics(
            num_sequences=len(sequence_lengths),
            num_bins=0,
            total_tokens=total_tokens,
            total_padded_tokens=total_padded,
            total_capacity=0,
            total_waste=0,
            utilization=0.0,
            waste_ratio=0.0,
            bin_balance=0.0,
            theoretical_min_bins=theoretical_min_bins,
            bin_efficiency=0.0,
        )
    total_capacity = len(bins) * bin_capacity
    utilization = total_tokens / total_capacity
    bin_utilizations = [
        sum(sequence_lengths[i] for i in contents) / bin_capacity for contents in bins
    ]
    if len(bins) > 1 and utilization > 0:
        bin_balance = 1.0 - statistics.stdev(bin_utilizations) / utilization
    else:
        bin_balance = 1.0
    return PackingMetrics(
        num_sequences=len(sequence_lengths),
        num_bins=len(bins),
        total_tokens=total_tokens,
        total_padded_tokens=total_padded,
        total_capacity=total_capacity,
        total_waste=total_capacity - total_tokens,
        utilization=utilization,
        waste_ratio=(total_capacity - total_tokens) / total_capacity,
        bin_balance=bin_balance,
        theoretical_min_bins=theoretical_min_bins,
        bin_efficiency=theoretical_min_bins / len(bins),
    )


@dataclass
class PackingTotals:
    """Running totals over many packings (e.g. every pack call of a loader)."""

    packings: int = 0
    num_sequences: int = 0
    num_bins: int = 0
    total_tokens: int = 0
    total_capacity: int = 0
    theoretical_min_bins: int = 0
    min_utilization: float = 1.0
    max_utilization: float = 0.0

    def add(self, metrics: PackingMetrics) -> None:
        """Add one packing's metrics."""
        self.packings += 1
        self.num_sequences += metrics.num_sequences
        self.num_bins += metrics.num_bins
        self.total_tokens += metrics.total_tokens
        self.total_capacity += metrics.total_capacity
        self.theoretical_min_bins += metrics.theoretical_min_bins
        self.min_utilization = min(self.min_utilization, metrics.utilization)
        self.max_utilization = max(self.max_utilization, metrics.utilization)

    def as_dict(self) -> dict[str, int | float]:
        """Totals plus overall utilisation, waste ratio and bin efficiency, for logging."""
        capacity = self.total_capacity
        return {
            **asdict(self),
            "utilization": self.total_tokens / capacity if capacity else 0.0,
            "waste_ratio": (capacity - self.total_tokens) / capacity if capacity else 0.0,
            "bin_efficiency": self.theoretical_min_bins / self.num_bins if self.num_bins else 0.0,
        }
