"""Sequence packing: assign variable-length sequences to fixed-capacity bins.

Every packer maps a list of sequence lengths to bins of indices into that list. The cost of
a sequence is its length rounded up to ``sequence_length_pad_multiple`` (what it occupies in
a pack once padded); a bin's costs never exceed ``bin_capacity``, a bin never holds more than
``max_sequences_per_bin`` sequences, and every index appears in exactly one bin. Packers are
stateless: the same lengths (and seed) always give the same bins, so a packer can sit inside
a checkpointed data loader. Ties between equal costs go to the earlier index.

Algorithms follow NeMo-RL (``nemo_rl.data.packing.algorithms``) and Megatron-LM's knapsacks
(``examples/multimodal/data_loading/knapsacks.py``), with O(n log n) data structures.
"""

from __future__ import annotations

import enum
import heapq
import operator
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from rl_data.packing.structures import FirstFitBins, SizePool


class PackingAlgorithm(str, enum.Enum):
    """Names of the supported packing algorithms (``get_packer`` accepts any case)."""

    CONCATENATIVE = "concatenative"
    FIRST_FIT_DECREASING = "first_fit_decreasing"
    FIRST_FIT_SHUFFLE = "first_fit_shuffle"
    MODIFIED_FIRST_FIT_DECREASING = "modified_first_fit_decreasing"
    GREEDY_KNAPSACK = "greedy_knapsack"
    BALANCED_GREEDY_KNAPSACK = "balanced_greedy_knapsack"


def padded_length(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (e.g. 5 with multiple 4 -> 8)."""
    if multiple < 1:
        raise ValueError(f"pad multiple must be >= 1, got {multiple}")
    if length < 0:
        raise ValueError(f"sequence length must be >= 0, got {length}")
    return -(-length // multiple) * multiple


class SequencePacker(ABC):
    """Packs sequence lengths into bins of at most ``bin_capacity`` padded tokens."""

    def __init__(
        self,
        bin_capacity: int,
        *,
        max_sequences_per_bin: int | None = None,
        sequence_length_pad_multiple: int = 1,
    ) -> None:
        if bin_capacity < 1:
            raise ValueError(f"bin_capacity must be >= 1, got {bin_capacity}")
        if max_sequences_per_bin is not None and max_sequences_per_bin < 1:
            raise ValueError(
                "max_sequences_per_bin must be >= 1 or None (no limit), "
                f"got {max_sequences_per_bin}"
            )
        if sequence_length_pad_multiple < 1:
            raise ValueError(
                f"sequence_length_pad_multiple must be >= 1, got {sequence_length_pad_multiple}"
            )
        self.bin_capacity = bin_capacity
        self.max_sequences_per_bin = max_sequences_per_bin
        self.sequence_length_pad_multiple = sequence_length_pad_multiple

    @property
    def _max_items(self) -> int:
        return self.max_sequences_per_bin or 1 << 62

    def costs(self, sequence_lengths: Sequence[int]) -> list[int]:
        """Padded cost of every sequence; raises ``ValueError`` for one that cannot fit a bin."""
        multiple, capacity = self.sequence_length_pad_multiple, self.bin_capacity
        costs = []
        for index, raw_length in enumerate(sequence_lengths):
            length = operator.index(raw_length)
            if length < 0:
                raise ValueError(f"sequence {index} has negative length {length}; expected >= 0")
            cost = padded_length(length, multiple)
            if cost > capacity:
                raise ValueError(
                    f"sequence {index} has length {length} (cost {cost} after rounding up to a "
                    f"multiple of {multiple}), which exceeds bin_capacity {capacity}; raise "
                    f"bin_capacity to at least {cost}, or truncate sequences to at most "
                    f"{capacity // multiple * multiple} tokens"
                )
            costs.append(cost)
        return costs

    def pack(self, sequence_lengths: Sequence[int]) -> list[list[int]]:
        """Bins of indices into ``sequence_lengths``; every index appears exactly once."""
        return self._pack_costs(self.costs(sequence_lengths))

    @abstractmethod
    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        """Pack already validated costs (each ``<= bin_capacity``)."""

    def _first_fit(self, costs: list[int], order: Iterable[int]) -> list[list[int]]:
        bins = FirstFitBins(len(costs), self.bin_capacity, self._max_items)
        for index in order:
            bins.place(costs[index], index)
        return bins.bins


class ConcatenativePacker(SequencePacker):
    """Keeps input order; starts a new bin when the next sequence does not fit."""

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        bins: list[list[int]] = []
        current: list[int] = []
        used = 0
        for index, cost in enumerate(costs):
            if current and (used + cost > self.bin_capacity or len(current) >= self._max_items):
                bins.append(current)
                current, used = [], 0
            current.append(index)
            used += cost
        if current:
            bins.append(current)
        return bins


class FirstFitDecreasingPacker(SequencePacker):
    """Longest first, each into the first (lowest-numbered) bin with room."""

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        return self._first_fit(costs, sorted(range(len(costs)), key=lambda i: -costs[i]))


class FirstFitShufflePacker(SequencePacker):
    """Random order (``random.Random(seed)``, fresh per call), each into the first bin with room.

    ``seed=None`` draws fresh entropy on every call, so bins are not reproducible.
    """

    def __init__(
        self,
        bin_capacity: int,
        *,
        max_sequences_per_bin: int | None = None,
        sequence_length_pad_multiple: int = 1,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            bin_capacity,
            max_sequences_per_bin=max_sequences_per_bin,
            sequence_length_pad_multiple=sequence_length_pad_multiple,
        )
        self.seed = seed

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        order = list(range(len(costs)))
        random.Random(self.seed).shuffle(order)
        return self._first_fit(costs, order)


class ModifiedFirstFitDecreasingPacker(SequencePacker):
    """Johnson & Garey (1985) MFFD with sizes classed by capacity C.

    Large (> C/2) items each open a bin, in decreasing order. Forward over those bins, add
    the largest medium (C/3, C/2] item that fits. Backward over bins without a medium item,
    add the smallest small (C/6, C/3] item plus the largest small item that still fits, when
    the two smallest fit. Forward again, repeatedly add the largest remaining item that
    fits. First-fit decreasing packs whatever is left into new bins.
    """

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        capacity, max_items = self.bin_capacity, self._max_items
        large, medium, small, rest = [], [], [], []
        for index, cost in enumerate(costs):
            if 2 * cost > capacity:
                large.append(index)
            elif 3 * cost > capacity:
                medium.append(index)
            elif 6 * cost > capacity:
                small.append(index)
            else:
                rest.append(index)
        large.sort(key=lambda i: -costs[i])
        bins = [[index] for index in large]
        room = [capacity - costs[index] for index in large]

        medium_pool = SizePool(costs, medium)
        if max_items >= 2:
            for b in range(len(bins)):
                item = medium_pool.take_largest_fitting(room[b])
                if item is not None:
                    bins[b].append(item)
                    room[b] -= costs[item]

        # A bin holding a medium item has room < C/6, so the two-smallest test skips it.
        small_pool = SizePool(costs, small)
        if max_items >= 3:
            for b in reversed(range(len(bins))):
                if len(small_pool) < 2 or small_pool.two_smallest() > room[b]:
                    continue
                first = small_pool.take_smallest()
                second = small_pool.take_largest_fitting(room[b] - costs[first])
                bins[b] += [first, second]
                room[b] -= costs[first] + costs[second]

        leftover = SizePool(costs, medium_pool.indices() + small_pool.indices() + rest)
        for b in range(len(bins)):
            while len(bins[b]) < max_items:
                item = leftover.take_largest_fitting(room[b])
                if item is None:
                    break
                bins[b].append(item)
                room[b] -= costs[item]

        order = sorted(leftover.indices(), key=lambda i: (-costs[i], i))
        return bins + self._first_fit(costs, order)


class GreedyKnapsackPacker(SequencePacker):
    """Megatron-LM ``greedy_knapsack``: fill one bin at a time, always with the largest
    remaining sequence that still fits, then open the next bin.

    With the same tie-breaking this yields exactly the bins of first-fit decreasing (each FFD
    bin also takes, in decreasing order, every remaining sequence that still fits it).
    """

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        pool = SizePool(costs, range(len(costs)))
        bins = []
        while len(pool):
            current: list[int] = []
            room = self.bin_capacity
            while len(current) < self._max_items:
                item = pool.take_largest_fitting(room)
                if item is None:
                    break
                current.append(item)
                room -= costs[item]
            bins.append(current)
        return bins


class BalancedGreedyKnapsackPacker(SequencePacker):
    """Megatron-LM ``balanced_greedy_knapsack``: longest first, each into the emptiest bin.

    Starts with ``ceil(total cost / capacity) + balanced_knapsack_delta`` empty bins and opens
    another when a sequence does not fit the emptiest one; unused bins are dropped. Megatron's
    default delta is 20, which spreads small buffers thinly; the default here is 0.
    """

    def __init__(
        self,
        bin_capacity: int,
        *,
        max_sequences_per_bin: int | None = None,
        sequence_length_pad_multiple: int = 1,
        balanced_knapsack_delta: int = 0,
    ) -> None:
        super().__init__(
            bin_capacity,
            max_sequences_per_bin=max_sequences_per_bin,
            sequence_length_pad_multiple=sequence_length_pad_multiple,
        )
        if balanced_knapsack_delta < 0:
            raise ValueError(f"balanced_knapsack_delta must be >= 0, got {balanced_knapsack_delta}")
        self.balanced_knapsack_delta = balanced_knapsack_delta

    def _pack_costs(self, costs: list[int]) -> list[list[int]]:
        capacity, max_items = self.bin_capacity, self._max_items
        start_count = -(-sum(costs) // capacity) + self.balanced_knapsack_delta
        bins: list[list[int]] = [[] for _ in range(start_count)]
        emptiest = [(0, b) for b in range(start_count)]  # (fill, bin) heap of bins with room
        for index in sorted(range(len(costs)), key=lambda i: -costs[i]):
            cost = costs[index]
            if emptiest and emptiest[0][0] + cost <= capacity:
                fill, b = heapq.heappop(emptiest)
            else:
                fill, b = 0, len(bins)
                bins.append([])
            bins[b].append(index)
            if len(bins[b]) < max_items:
                heapq.heappush(emptiest, (fill + cost, b))
        return [contents for contents in bins if contents]


_PACKERS: dict[PackingAlgorithm, type[SequencePacker]] = {
    PackingAlgorithm.CONCATENATIVE: ConcatenativePacker,
    PackingAlgorithm.FIRST_FIT_DECREASING: FirstFitDecreasingPacker,
    PackingAlgorithm.FIRST_FIT_SHUFFLE: FirstFitShufflePacker,
    PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING: ModifiedFirstFitDecreasingPacker,
    PackingAlgorithm.GREEDY_KNAPSACK: GreedyKnapsackPacker,
    PackingAlgorithm.BALANCED_GREEDY_KNAPSACK: BalancedGreedyKnapsackPacker,
}


def packing_algorithm(name: str | PackingAlgorithm) -> PackingAlgorithm:
    """The algorithm called ``name`` (case-insensitive); ``ValueError`` listing valid names."""
    if isinstance(name, PackingAlgorithm):
        return name
    try:
        return PackingAlgorithm(str(name).strip().lower())
    except ValueError:
        valid = ", ".join(algorithm.value for algorithm in PackingAlgorithm)
        raise ValueError(
            f"unknown packing algorithm {name!r}; expected one of: {valid}"
        ) from None


def get_packer(
    algorithm: str | PackingAlgorithm,
    bin_capacity: int,
    *,
    max_sequences_per_bin: int | None = None,
    sequence_length_pad_multiple: int = 1,
    seed: int | None = None,
) -> SequencePacker:
    """A packer for ``algorithm``; ``seed`` is used by ``first_fit_shuffle`` only."""
    packer_class = _PACKERS[packing_algorithm(algorithm)]
    options = {
        "max_sequences_per_bin": max_sequences_per_bin,
        "sequence_length_pad_multiple": sequence_length_pad_multiple,
    }
    if packer_class is FirstFitShufflePacker:
        return FirstFitShufflePacker(bin_capacity, seed=seed, **options)
    return packer_class(bin_capacity, **options)
