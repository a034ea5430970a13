"""Elastic layouts: G = 8 logical data shards read at several data-parallel sizes.

Builds one job's runtime configuration at DP 8, 4, 2 (with TP 2) and 1 (with TP 8) and
prints which shards each DP rank receives every step; then a DP size that does not
divide G, refused when the configuration is built. No Ray: nothing starts.
"""

import re

from rl_data import ParallelLayout, RuntimeConfig

SHARDS = 8  # G: fixed for the life of the data stream (a checkpoint holds 8 states)

layouts = [
    ParallelLayout(dp=8),
    ParallelLayout(dp=4),
    ParallelLayout(dp=2, tp=2),
    ParallelLayout(dp=1, tp=8),
]
for layout in layouts:
    config = RuntimeConfig(parallel_layout=layout, logical_world_size=SHARDS)
    dp = config.parallel_layout.dp
    # DP rank d receives shards d, d + D, d + 2D, ...
    shards = {rank: list(range(rank, config.world_size, dp)) for rank in range(dp)}
    print(f"dp={dp} tp={layout.tp}: " + "  ".join(f"{r} <- {s}" for r, s in shards.items()))

try:
    RuntimeConfig(parallel_layout=ParallelLayout(dp=3), logical_world_size=SHARDS)
except ValueError as error:
    reason = re.search(r"parallel_layout\.dp=3 does not divide.*?run at", str(error))
    print("refused:", reason.group())
