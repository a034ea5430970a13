"""Distributed runtime: rank actors per logical DP rank (a rank pool), coordinator, checkpoints, transfer.

Importing it does not import torch (the coordinator process starts faster without it); the
torch-based ``batch_to_device`` and ``fetch_batch`` load on first use.
"""

from typing import Any

from rl_data.distributed.checkpoint_files import (
    CheckpointFileError,
    checkpoint_path,
    load_checkpoint_file,
    save_checkpoint_file,
)
from rl_data.distributed.client import (
    CoordinatorClient,
    CoordinatorNotFoundError,
    attach,
    get_coordinator,
    wait_until_name_is_free,
)
from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.distributed.coordinator import (
    DataCoordinator,
    RankFailedError,
    RankTimeoutError,
    RestoreIncompleteError,
    start_data_coordinator,
)
from rl_data.distributed.placement import (
    RankPlacement,
    adopt_placement_group,
    create_rank_placement,
    placement_fingerprint,
    placement_layout,
)
from rl_data.distributed.rank_actor import DataExhaustedError, RankActor
from rl_data.distributed.rank_pool import RankPool
from rl_data.distributed.step_prefetcher import StepPrefetcher

__all__ = [
    "CheckpointFileError",
    "CoordinatorClient",
    "CoordinatorNotFoundError",
    "DataCoordinator",
    "DataExhaustedError",
    "LoaderSpec",
    "ParallelLayout",
    "RankActor",
    "RankFailedError",
    "RankPlacement",
    "RankPool",
    "RankTimeoutError",
    "RestoreIncompleteError",
    "RuntimeConfig",
    "StepPrefetcher",
    "adopt_placement_group",
    "attach",
    "batch_to_device",
    "checkpoint_path",
    "create_rank_placement",
    "fetch_batch",
    "get_coordinator",
    "load_checkpoint_file",
    "placement_fingerprint",
    "placement_layout",
    "save_checkpoint_file",
    "start_data_coordinator",
    "wait_until_name_is_free",
]


def __getattr__(name: str) -> Any:
    if name in ("batch_to_device", "fetch_batch"):
        from rl_data.distributed import transfer

        return getattr(transfer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
