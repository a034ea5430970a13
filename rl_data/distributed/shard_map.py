"""Which logical data shards feed which data-parallel rank (pure; no Ray, no torch).

The data stream is cut into G logical shards (one rank actor each, G fixed for a run); the
trainer has D data-parallel ranks, D dividing G. DP rank d receives the batches of shards
d, d+D, d+2D, ... of every step, merged in that order. The global batch of a step (all G shard
batches) is therefore the same set of samples for every admissible D, so a checkpoint (one
state per shard) saved at one D restores at any other.
"""

from __future__ import annotations


def check_shard_layout(logical_shards: int, dp: int) -> None:
    """Raise ``ValueError`` unless ``dp`` divides ``logical_shards`` (both >= 1)."""
    if logical_shards < 1 or dp < 1:
        raise ValueError(f"logical shards ({logical_shards}) and dp ({dp}) must be >= 1")
    if logical_shards % dp:
        divisors = [d for d in range(1, logical_shards + 1) if logical_shards % d == 0]
        raise ValueError(
            f"parallel_layout.dp={dp} does not divide the {logical_shards} logical data shards "
            f"(logical_world_size); with {logical_shards} shards dp may be one of {divisors}, or "
            "choose a logical_world_size that is a multiple of every dp you want to run at"
        )


def shards_of_dp_rank(dp_rank: int, logical_shards: int, dp: int) -> list[int]:
    """The shards whose batches DP rank ``dp_rank`` of ``dp`` receives, in merge order."""
    check_shard_layout(logical_shards, dp)
    if not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank must be in [0, {dp}), got {dp_rank}")
    return list(range(dp_rank, logical_shards, dp))


def shard_assignment(logical_shards: int, dp: int) -> list[list[int]]:
    """``[d] -> shards of DP rank d`` for every DP rank."""
    return [shards_of_dp_rank(d, logical_shards, dp) for d in range(dp)]
