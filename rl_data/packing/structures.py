"""Data structures that keep the packers O(n log n): first-fit bins and a sorted size pool."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

_CLOSED = -1  # tree value of a slot with no bin, or of a bin that holds its maximum count


class FirstFitBins:
    """Bins filled first-fit: each item goes to the lowest-numbered bin with room for it.

    A segment tree over bin slots holds the largest remaining room in every subtree, so the
    first bin with room is found in O(log n) instead of scanning all bins.
    """

    def __init__(self, max_bins: int, capacity: int, max_items: int) -> None:
        self._leaves = 1
        while self._leaves < max_bins:
            self._leaves *= 2
        self._tree = [_CLOSED] * (2 * self._leaves)
        self._capacity = capacity
        self._max_items = max_items
        self._room: list[int] = []
        self.bins: list[list[int]] = []

    def place(self, cost: int, index: int) -> None:
        """Put item ``index`` of ``cost`` (``<= capacity``) into the first bin with room."""
        tree = self._tree
        if tree[1] >= cost:
            node = 1
            while node < self._leaves:
                node = 2 * node if tree[2 * node] >= cost else 2 * node + 1
            slot = node - self._leaves
        else:
            slot = len(self.bins)
            self.bins.append([])
            self._room.append(self._capacity)
        self.bins[slot].append(index)
        self._room[slot] -= cost
        is_open = len(self.bins[slot]) < self._max_items
        self._set(slot, self._room[slot] if is_open else _CLOSED)

    def _set(self, slot: int, value: int) -> None:
        tree = self._tree
        node = slot + self._leaves
        tree[node] = value
        node //= 2
        while node:
            best = max(tree[2 * node], tree[2 * node + 1])
            if tree[node] == best:
                return
            tree[node] = best
            node //= 2


class SizePool:
    """Items kept sorted by cost; removes the smallest, or the largest that fits a room.

    Among equal costs the item with the lowest index is taken first.
    """

    def __init__(self, costs: Sequence[int], indices: Iterable[int]) -> None:
        ordered = sorted(indices, key=lambda i: (costs[i], -i))
        self._costs = [costs[i] for i in ordered]
        self._indices = ordered

    def __len__(self) -> int:
        return len(self._indices)

    def indices(self) -> list[int]:
        """Indices still in the pool, by increasing cost."""
        return list(self._indices)

    def two_smallest(self) -> int:
        """Sum of the two smallest costs (the pool must hold at least two items)."""
        return self._costs[0] + self._costs[1]

    def take_smallest(self) -> int:
        """Remove and return the index of the smallest item."""
        return self._take(bisect_right(self._costs, self._costs[0]) - 1)

    def take_largest_fitting(self, room: int) -> int | None:
        """Remove and return the index of the largest item with cost ``<= room``, or None."""
        position = bisect_right(self._costs, room) - 1
        return None if position < 0 else self._take(position)

    def _take(self, position: int) -> int:
        del self._costs[position]
        return self._indices.pop(position)
